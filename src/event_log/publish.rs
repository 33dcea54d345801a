//! The publish token: serialises commit-and-notify per log and detects reentrant appends.
//!
//! Observers run after commit while the token is held, so every observer sees events in seq
//! order. The owning thread is recorded: an append from that same thread (an observer appending
//! to its own log) is refused instead of deadlocking. Other threads wait, through
//! [`crate::blocking::wait`], so an embedding runtime can release its global lock.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

#[derive(Default)]
pub(crate) struct PublishLock {
    state: Mutex<Owner>,
    released: Condvar,
}

#[derive(Default)]
struct Owner {
    thread: Option<ThreadId>,
    /// Threads blocked in `acquire`; a release wakes one only if there are any (no futex
    /// call on the uncontended path, which is every append of a single-threaded program).
    waiting: usize,
}

/// Proof that this thread holds the publish token; releases it on drop.
pub(crate) struct PublishToken<'a> {
    lock: &'a PublishLock,
}

fn relock<'a, T>(r: Result<MutexGuard<'a, T>, PoisonError<MutexGuard<'a, T>>>) -> MutexGuard<'a, T> {
    r.unwrap_or_else(PoisonError::into_inner)
}

impl PublishLock {
    /// Takes the token, or returns `None` if this thread already holds it (reentrancy).
    pub(crate) fn acquire(&self) -> Option<PublishToken<'_>> {
        let me = thread::current().id();
        {
            let mut state = relock(self.state.lock());
            if state.thread == Some(me) {
                return None;
            }
            if state.thread.is_none() {
                state.thread = Some(me);
                return Some(PublishToken { lock: self });
            }
            state.waiting += 1;
        }
        // The token is taken inside the wait and the mutex released before the wait returns:
        // the hook then re-takes the embedding's global lock (the GIL), and a thread holding
        // that lock may be blocked on this mutex, so it must not be held across that.
        crate::blocking::wait(|| {
            let mut state = relock(self.state.lock());
            while state.thread.is_some() {
                state = relock(self.released.wait(state));
            }
            state.waiting -= 1;
            state.thread = Some(me);
        });
        Some(PublishToken { lock: self })
    }
}

impl Drop for PublishToken<'_> {
    fn drop(&mut self) {
        let mut state = relock(self.lock.state.lock());
        state.thread = None;
        if state.waiting > 0 {
            drop(state);
            self.lock.released.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
}
