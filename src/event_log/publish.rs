//! The publish token: serialises commit-and-notify per log and detects reentrant appends.
//!
//! Observers run after commit while the token is held, so every observer sees events in seq
//! order. The owning thread is recorded: an append from that same thread (an observer appending
//! to its own log) is refused instead of deadlocking. Other threads wait, through
//! [`crate::blocking::wait`], so an embedding runtime can release its global lock.
//!
//! The token is one atomic word naming its holder, so the uncontended take and release (every
//! append of a single-threaded program) are one compare-exchange and one store, with no mutex
//! and no `thread::current()` (an `Arc` clone and drop). The mutex and condvar serve only
//! threads that have to wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

#[derive(Default)]
pub(crate) struct PublishLock {
    /// The holder's [`mark`], or 0 when free.
    owner: AtomicUsize,
    /// Threads blocked in `acquire`; a release takes the mutex to wake one only if there are
    /// any (no futex call on the uncontended path).
    waiting: AtomicUsize,
    sleep: Mutex<()>,
    released: Condvar,
}

/// Proof that this thread holds the publish token; releases it on drop.
pub(crate) struct PublishToken<'a> {
    lock: &'a PublishLock,
}

thread_local! {
    static MARK: u8 = const { 0 };
}

/// A non-zero word naming the calling thread among live threads: the address of its own
/// thread-local. (A token is released before its thread ends, so a reused address never
/// names a holder.)
fn mark() -> usize {
    MARK.with(|m| std::ptr::from_ref::<u8>(m) as usize)
}

fn relock<'a, T>(r: Result<MutexGuard<'a, T>, PoisonError<MutexGuard<'a, T>>>) -> MutexGuard<'a, T> {
    r.unwrap_or_else(PoisonError::into_inner)
}

impl PublishLock {
    /// Whether no thread holds the token (a plain load: a hint that a holder may change the
    /// moment after, so callers act on it only under a lock every holder also takes).
    pub(crate) fn is_free(&self) -> bool {
        self.owner.load(Ordering::Acquire) == 0
    }

    /// Threads blocked in `acquire`.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Takes the token, or returns `None` if this thread already holds it (reentrancy).
    pub(crate) fn acquire(&self) -> Option<PublishToken<'_>> {
        let me = mark();
        match self.owner.compare_exchange(0, me, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) => return Some(PublishToken { lock: self }),
            // Only this thread ever stores its own mark, so seeing it means it holds the token.
            Err(holder) if holder == me => return None,
            Err(_) => {}
        }
        // The token is taken inside the wait and the mutex released before the wait returns:
        // the hook then re-takes the embedding's global lock (the GIL), and a thread holding
        // that lock may be blocked on this mutex, so it must not be held across that.
        crate::blocking::wait(|| {
            let mut guard = relock(self.sleep.lock());
            // Counted before the retry, under the mutex: a release that empties `owner` after
            // this retry fails sees the count and notifies, which cannot happen before this
            // thread waits (it needs the mutex), so the wake-up is not lost.
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while self.owner.compare_exchange(0, me, Ordering::SeqCst, Ordering::Relaxed).is_err() {
                guard = relock(self.released.wait(guard));
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        });
        Some(PublishToken { lock: self })
    }
}

impl Drop for PublishToken<'_> {
    fn drop(&mut self) {
        self.lock.owner.store(0, Ordering::SeqCst);
        if self.lock.waiting.load(Ordering::SeqCst) > 0 {
            let _guard = relock(self.lock.sleep.lock());
            self.lock.released.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn same_thread_is_refused_other_threads_wait() {
        let lock = Arc::new(PublishLock::default());
        let token = lock.acquire().unwrap();
        assert!(lock.acquire().is_none());
        let other = Arc::clone(&lock);
        let handle = thread::spawn(move || other.acquire().is_some());
        drop(token);
        assert!(handle.join().unwrap());
        assert!(lock.acquire().is_some());
    }

    #[test]
    fn one_holder_at_a_time_under_contention() {
        let lock = Arc::new(PublishLock::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (lock, inside) = (Arc::clone(&lock), Arc::clone(&inside));
                thread::spawn(move || {
                    for _ in 0..20_000 {
                        let token = lock.acquire().unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                        thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(token);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert!(lock.acquire().is_some());
    }
}
