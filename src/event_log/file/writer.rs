//! The writer thread behind a file-backed log.
//!
//! Appending threads only serialise records into a shared buffer (`enqueue` runs under the
//! log's state lock and must never wait for the disk). One thread per open log takes the whole
//! buffer at a time and writes it with one `write` (group commit), then syncs it as the
//! [`Durability`] asks. Flush barriers are acknowledged only after that, never before `write`.
//!
//! A session `create` made is not durable yet (neither its header nor its name): the first
//! sync the writer makes (at its first durable batch, a flush barrier, or `close`) syncs the
//! file and then the directory, and only then acknowledges anything. Every later batch is
//! synced when written, so `close` syncs nothing more (an earlier failure still surfaces there:
//! the backend is poisoned).
//!
//! A failed write or sync poisons the backend: the file is cut back to its last durable size,
//! every pending and later barrier fails, and every later `enqueue` refuses the append, until
//! the session is reopened (and so re-verified from disk).
//!
//! **Write-through** ([`Backend::set_write_through`]): `enqueue` itself writes each record
//! to the file (the OS's page cache) before it returns, under the shared lock, so a killed
//! process loses nothing it appended; the writer then only syncs, on the same schedule (the
//! window, a barrier, `close`). It costs a `pwrite` per append on the appending thread, which
//! is why it is a choice per log: a caller that goes on to act on what it appended without
//! waiting for a barrier (`KermanDurability`'s `sync="effects"`) wants it; the agent loop, which
//! waits at its checkpoints, does not.

use std::fmt::Write as _;
use std::fs::File;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::super::{Backend, Event, FlushCallback, LogError};
use super::{forks, format, fsio, sys, Durability, Fault, FaultHook, FaultPoint, FaultSite};

/// The batch window of `Checkpoint` and `Batch`, measured from the first pending event.
pub(super) const WINDOW: Duration = Duration::from_millis(50);

/// Everything a writer needs to take over a verified, locked session file.
pub(super) struct WriterSetup {
    pub id: String,
    /// The file's entry among the sessions this process holds, released after the lock and
    /// (declared before `file`) dropped before the file is closed.
    pub hold: fsio::Hold,
    pub file: File,
    /// The file's length, all of it durable and verified.
    pub len: u64,
    /// The number of events in the file (the next seq).
    pub events: u64,
    pub durability: Durability,
    pub fault: Option<FaultHook>,
    /// For a session just created: its directory, held open, to sync after the file at the
    /// first sync (until then neither the header nor the name is durable).
    pub unsynced: Option<sys::Dir>,
}

struct State {
    /// Framed records not yet handed to the disk.
    pending: Vec<u8>,
    /// Events enqueued so far (the next seq).
    enqueued: u64,
    /// Events handed to the OS, or in the batch the writer is writing.
    handed: u64,
    /// The file's length with everything handed to the OS (or being written by the writer):
    /// where the next batch or write-through record goes.
    file_len: u64,
    /// The length that is durable (what a failure cuts the file back to).
    durable_len: u64,
    /// The writer is writing a batch (outside the lock).
    writing: bool,
    /// The session file, for `enqueue` to write through; `None` once the writer stopped.
    file: Option<Arc<File>>,
    write_through: bool,
    /// A write-through `enqueue` failed: the writer cuts the file back and fails the barriers.
    cut_back: bool,
    /// Events as durable as the mode promises.
    durable: u64,
    /// When the oldest pending record arrived (the batch window is fixed from there).
    window_start: Option<Instant>,
    flush_requested: bool,
    /// The writer is waiting for records, so the next one must wake it.
    idle: bool,
    closing: bool,
    /// The thread has exited; nothing more will become durable.
    stopped: bool,
    poisoned: Option<String>,
    /// The session's creation is not durable yet and the mode syncs: even a barrier with no
    /// event pending must wait for the writer (it syncs the file and the directory).
    unborn: bool,
    /// Flush barriers: (events that must be durable, callback).
    waiters: Vec<(u64, FlushCallback)>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer (it is the only thread that waits on it).
    wake: Condvar,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a flush callback so that a panicking one cannot take the writer down with it.
fn call(done: FlushCallback, result: Result<(), LogError>) {
    let _ = catch_unwind(AssertUnwindSafe(move || done(result)));
}

/// The [`Backend`] of a file-backed log.
pub(super) struct FileBackend {
    id: String,
    shared: Arc<Shared>,
    fault: Option<FaultHook>,
    thread: Mutex<Option<JoinHandle<Result<(), LogError>>>>,
    durability: Durability,
    /// The process (and fork generation) that started the writer: in a forked child the
    /// writer thread does not exist, so nothing may wait for it (forks.rs).
    origin: forks::Origin,
}

impl FileBackend {
    pub(super) fn start(setup: WriterSetup) -> Result<FileBackend, LogError> {
        let file = Arc::new(setup.file);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: Vec::new(),
                enqueued: setup.events,
                handed: setup.events,
                file_len: setup.len,
                durable_len: setup.len,
                writing: false,
                file: Some(Arc::clone(&file)),
                write_through: false,
                cut_back: false,
                durable: setup.events,
                window_start: None,
                flush_requested: false,
                idle: false,
                closing: false,
                stopped: false,
                poisoned: None,
                unborn: setup.unsynced.is_some() && setup.durability != Durability::None,
                waiters: Vec::new(),
            }),
            wake: Condvar::new(),
        });
        let origin = forks::Origin::here();
        let writer = Writer {
            shared: Arc::clone(&shared),
            hold: setup.hold,
            file,
            durability: setup.durability,
            fault: setup.fault.clone(),
            durable_len: setup.len,
            written: setup.events,
            batch: Vec::new(),
            // `none` never syncs, so owes no directory sync either.
            unsynced: setup.unsynced.filter(|_| setup.durability != Durability::None),
        };
        let thread = std::thread::Builder::new()
            .name("kerman-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| LogError::io("starting the session writer thread", e))?;
        Ok(FileBackend { id: setup.id, shared, fault: setup.fault, thread: Mutex::new(Some(thread)), durability: setup.durability, origin })
    }

    /// Turns write-through on or off (see the module's documentation;
    /// [`Backend::set_write_through`]). Turning it on needs
    /// nothing waiting to be written (before the first append, or after a flush): records the
    /// writer holds would otherwise reach the file after later ones written through.
    fn turn_write_through(&self, on: bool) -> Result<(), LogError> {
        self.check_origin()?;
        let mut st = lock(&self.shared);
        if on && !st.write_through && (!st.pending.is_empty() || st.writing) {
            return Err(LogError::InvalidEvent(format!(
                "session '{}': write-through can be turned on only while no append is waiting to be written (flush first)",
                self.id
            )));
        }
        st.write_through = on;
        Ok(())
    }

    /// `enqueue`'s write-through: the record written at the file's end, under the lock. A
    /// failure poisons the backend and leaves the cut-back and the barriers to the writer.
    fn write_through_locked(&self, st: &mut State, crc: u32, json: &str) -> Result<(), LogError> {
        let Some(file) = st.file.clone() else {
            return Err(LogError::Closed { id: self.id.clone() });
        };
        st.pending.clear();
        format::push_framed(&mut st.pending, crc, json);
        let seqs = st.enqueued..st.enqueued + 1;
        let site = FaultSite { point: FaultPoint::Write, seqs, bytes: st.pending.len() };
        let outcome = match self.fault.as_ref().and_then(|fault| fault(&site)) {
            None => sys::write_all_at(&file, &st.pending, st.file_len).map_err(|e| format!("write failed: {e}")),
            Some(Fault::Short { bytes, error }) => {
                let part = bytes.min(st.pending.len().saturating_sub(1));
                let _ = sys::write_all_at(&file, &st.pending[..part], st.file_len);
                Err(format!("write failed: {error}"))
            }
            Some(Fault::Fail(e)) => Err(format!("write failed: {e}")),
        };
        let len = st.pending.len() as u64;
        st.pending.clear();
        if let Err(detail) = outcome {
            st.poisoned = Some(detail.clone());
            st.cut_back = true;
            self.shared.wake.notify_one();
            return Err(LogError::Write { detail });
        }
        st.file_len += len;
        st.enqueued += 1;
        st.handed = st.enqueued;
        if self.durability == Durability::None {
            // Written is all `none` promises.
            st.durable = st.enqueued;
            st.durable_len = st.file_len;
        } else if st.window_start.is_none() {
            st.window_start = Some(Instant::now());
            if st.idle {
                st.idle = false;
                self.shared.wake.notify_one();
            }
        }
        Ok(())
    }

    /// Stops the writer after it has drained, and waits for it unless called from the writer
    /// itself (a flush callback dropping the last handle of its log).
    fn stop(&self) -> Result<(), LogError> {
        if self.origin.forked() {
            // A forked child's copy: the writer thread is the parent's, and the shared state
            // may have been locked at the fork. Its handle must not be joined (or detached).
            if let Some(handle) = self.thread.try_lock().ok().and_then(|mut t| t.take()) {
                std::mem::forget(handle);
            }
            return Ok(());
        }
        {
            let mut st = lock(&self.shared);
            st.closing = true;
        }
        self.shared.wake.notify_one();
        let handle = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        let Some(handle) = handle else { return Ok(()) };
        if handle.thread().id() == std::thread::current().id() {
            // The writer finishes draining and releases the file once the callback returns.
            return Ok(());
        }
        match crate::blocking::wait(|| handle.join()) {
            Ok(result) => result,
            Err(_) => Err(LogError::Write { detail: "the session writer thread panicked".into() }),
        }
    }
}

impl FileBackend {
    fn check_origin(&self) -> Result<(), LogError> {
        match self.origin.forked() {
            false => Ok(()),
            true => Err(LogError::Forked { id: self.id.clone(), owner: self.origin.pid, pid: std::process::id() }),
        }
    }
}

impl Backend for FileBackend {
    fn checkpoints(&self) -> bool {
        matches!(self.durability, Durability::Checkpoint | Durability::Strict)
    }

    fn enqueue(&self, event: &Event) -> Result<(), LogError> {
        self.check_origin()?;
        // Serialise before taking the lock the writer shares.
        let json = event.to_json();
        let crc = crc32c::crc32c(json.as_bytes());
        let mut st = lock(&self.shared);
        if let Some(detail) = &st.poisoned {
            return Err(LogError::Write { detail: detail.clone() });
        }
        if st.closing {
            return Err(LogError::Closed { id: self.id.clone() });
        }
        if event.seq != st.enqueued {
            return Err(LogError::InvalidEvent(format!("seq {} enqueued where {} was expected", event.seq, st.enqueued)));
        }
        if st.write_through {
            return self.write_through_locked(&mut st, crc, &json);
        }
        let was_empty = st.pending.is_empty();
        format::push_framed(&mut st.pending, crc, &json);
        st.enqueued += 1;
        if was_empty {
            st.window_start = Some(Instant::now());
            if st.idle {
                // Only an idle writer needs a wake-up; a busy one looks again when done.
                st.idle = false;
                drop(st);
                self.shared.wake.notify_one();
            }
        }
        Ok(())
    }

    fn flush(&self, done: FlushCallback) {
        if let Err(e) = self.check_origin() {
            return done(Err(e));
        }
        let mut st = lock(&self.shared);
        let result = if let Some(detail) = &st.poisoned {
            Err(LogError::Write { detail: detail.clone() })
        } else if st.durable >= st.enqueued && !st.unborn {
            Ok(())
        } else if st.stopped {
            Err(LogError::Write { detail: "the session file was closed before the flush completed".into() })
        } else {
            let target = st.enqueued;
            st.waiters.push((target, done));
            st.flush_requested = true;
            drop(st);
            self.shared.wake.notify_one();
            return;
        };
        drop(st);
        done(result);
    }

    fn close(&self, _events: Vec<Event>) -> Result<(), LogError> {
        self.stop()
    }

    fn set_write_through(&self, on: bool) -> Result<bool, LogError> {
        self.turn_write_through(on).map(|()| true)
    }

    fn write_through(&self) -> bool {
        lock(&self.shared).write_through
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        // `SessionLog` closes its backend, but a backend dropped some other way must not leave
        // its thread (and the session lock) behind.
        let _ = self.stop();
    }
}

/// What the writer takes at a time: a batch to write (possibly empty: a sync of what
/// write-through appends wrote), or the cut-back a failed write-through append left.
struct Batch {
    /// The events the batch makes durable.
    seqs: Range<u64>,
    /// Where `Writer::batch` goes, and the file's length after it.
    offset: u64,
    end: u64,
    /// A write-through append failed with this.
    failed: Option<String>,
}

struct Writer {
    shared: Arc<Shared>,
    /// Declared before `file`: dropped first (see `WriterSetup::hold`).
    hold: fsio::Hold,
    file: Arc<File>,
    durability: Durability,
    fault: Option<FaultHook>,
    /// The file length that is durable; everything beyond it goes on failure.
    durable_len: u64,
    /// The events within `durable_len` (the first seq of the next batch).
    written: u64,
    /// The batch being written (swapped with the pending buffer to reuse both allocations).
    batch: Vec<u8>,
    /// The directory to sync after the file at the first sync (see [`WriterSetup::unsynced`]).
    unsynced: Option<sys::Dir>,
}

impl Writer {
    fn run(mut self) -> Result<(), LogError> {
        while let Some(batch) = self.next_batch() {
            let outcome = match batch.failed.clone() {
                Some(detail) => Err(detail),
                None => self.write_batch(&batch),
            };
            self.finish(&batch, outcome);
            self.batch.clear();
        }
        self.shutdown()
    }

    /// Asks the fault hook (if any) about the operation at `point` on the events `seqs`.
    fn injected(&self, point: FaultPoint, seqs: &Range<u64>) -> Option<Fault> {
        let fault = self.fault.as_ref()?;
        let bytes = if seqs.is_empty() { 0 } else { self.batch.len() };
        fault(&FaultSite { point, seqs: seqs.clone(), bytes })
    }

    /// Waits until a batch is due and takes it (its records into `self.batch`); `None` once
    /// closing with nothing left (or poisoned).
    fn next_batch(&mut self) -> Option<Batch> {
        let mut st = lock(&self.shared);
        loop {
            if st.poisoned.is_some() {
                if st.cut_back {
                    st.cut_back = false;
                    let (seqs, at) = (self.written..st.enqueued, st.file_len);
                    return Some(Batch { seqs, offset: at, end: at, failed: st.poisoned.clone() });
                }
                if st.closing {
                    return None;
                }
                st = self.shared.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Records written through but not synced yet (never under `none`: written is
            // durable there).
            let unsynced = st.handed > st.durable;
            if !st.pending.is_empty() || unsynced {
                let windowed = matches!(self.durability, Durability::Checkpoint | Durability::Batch);
                let deadline = match st.window_start {
                    Some(start) if windowed && !st.flush_requested && !st.closing => Some(start + WINDOW),
                    _ => None,
                };
                let now = Instant::now();
                if let Some(deadline) = deadline.filter(|d| *d > now) {
                    st = self.shared.wake.wait_timeout(st, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
                    continue;
                }
                std::mem::swap(&mut st.pending, &mut self.batch);
                st.window_start = None;
                st.flush_requested = false;
                let offset = st.file_len;
                st.file_len += self.batch.len() as u64;
                st.handed = st.enqueued;
                st.writing = !self.batch.is_empty();
                return Some(Batch { seqs: self.written..st.enqueued, offset, end: st.file_len, failed: None });
            }
            if st.closing {
                return None;
            }
            if st.flush_requested && st.unborn {
                // A barrier on a creation not yet durable: an empty batch, synced.
                st.flush_requested = false;
                let at = st.file_len;
                return Some(Batch { seqs: self.written..st.enqueued, offset: at, end: at, failed: None });
            }
            st.flush_requested = false;
            st.idle = true;
            st = self.shared.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.idle = false;
        }
    }

    fn write_batch(&mut self, batch: &Batch) -> Result<(), String> {
        let seqs = &batch.seqs;
        if self.batch.is_empty() {
            return match self.durability {
                Durability::None => Ok(()),
                _ => self.sync(seqs),
            };
        }
        match self.injected(FaultPoint::Write, seqs) {
            None => {}
            Some(Fault::Short { bytes, error }) => {
                // Part of the batch reaches the file before the error, so the cleanup has
                // partial bytes to cut off.
                let part = bytes.min(self.batch.len().saturating_sub(1));
                let _ = sys::write_all_at(&self.file, &self.batch[..part], batch.offset);
                return Err(format!("write failed: {error}"));
            }
            Some(Fault::Fail(e)) => return Err(format!("write failed: {e}")),
        }
        sys::write_all_at(&self.file, &self.batch, batch.offset).map_err(|e| format!("write failed: {e}"))?;
        if self.durability != Durability::None {
            self.sync(seqs)?;
        }
        Ok(())
    }

    /// Syncs the file and, the first time after `create`, then the directory: the header, the
    /// name and everything written so far become durable together (one fault point).
    fn sync(&mut self, seqs: &Range<u64>) -> Result<(), String> {
        if let Some(fault) = self.injected(FaultPoint::Sync, seqs) {
            return Err(format!("fsync failed: {}", fault.into_error()));
        }
        self.file.sync_data().map_err(|e| format!("fsync failed: {e}"))?;
        if let Some(dir) = &self.unsynced {
            if let Some(fault) = self.injected(FaultPoint::SyncDirectory, seqs) {
                return Err(format!("fsync of the session's directory failed: {}", fault.into_error()));
            }
            sys::sync_open_dir(dir).map_err(|e| format!("fsync of the session's directory failed: {e}"))?;
            self.unsynced = None;
        }
        Ok(())
    }

    fn finish(&mut self, batch: &Batch, outcome: Result<(), String>) {
        let (ready, result) = match outcome {
            Ok(()) => {
                let upto = batch.seqs.end;
                self.written = upto;
                self.durable_len = batch.end;
                let mut st = lock(&self.shared);
                st.writing = false;
                // Write-through appends after the batch was taken stay beyond it.
                st.durable = st.durable.max(upto);
                st.durable_len = st.durable_len.max(batch.end);
                st.unborn = self.unsynced.is_some();
                let (ready, waiting) = std::mem::take(&mut st.waiters).into_iter().partition(|(target, _)| *target <= upto);
                st.waiters = waiting;
                (ready, Ok(()))
            }
            Err(mut detail) => {
                // Cut the file back before anyone hears of the failure, so no partial record
                // survives for a later open to mistake for a torn tail of durable data.
                let cut = match self.injected(FaultPoint::CutBack, &batch.seqs) {
                    Some(fault) => Err(fault.into_error()),
                    None => self.file.set_len(self.durable_len).and_then(|()| self.file.sync_data()),
                };
                if let Err(e) = cut {
                    let _ = write!(detail, "; cutting the file back to {} bytes also failed: {e}", self.durable_len);
                }
                let mut st = lock(&self.shared);
                st.writing = false;
                st.poisoned = Some(detail.clone());
                st.pending.clear();
                (std::mem::take(&mut st.waiters), Err(detail))
            }
        };
        for (_, done) in ready {
            call(done, result.clone().map_err(|detail| LogError::Write { detail }));
        }
    }

    /// The creation's sync if none was made yet (every batch was synced when written, so
    /// nothing else is left to sync), then the lock goes with the file. An earlier failure
    /// surfaces here too.
    fn shutdown(mut self) -> Result<(), LogError> {
        let poisoned = lock(&self.shared).poisoned.clone();
        let mut result = match poisoned {
            Some(detail) => Err(LogError::Write { detail }),
            None => Ok(()),
        };
        if result.is_ok() && self.unsynced.is_some() {
            if let Err(detail) = self.sync(&(self.written..self.written)) {
                result = Err(LogError::Write { detail: format!("final {detail}") });
            }
        }
        // No append writes through any more (`closing` refuses them): the file goes with the
        // writer's handle.
        let through = lock(&self.shared).file.take();
        drop(through);
        sys::unlock(&self.file);
        drop(self.hold);
        drop(self.file);
        let leftover = {
            let mut st = lock(&self.shared);
            st.stopped = true;
            std::mem::take(&mut st.waiters)
        };
        for (_, done) in leftover {
            call(done, Err(LogError::Write { detail: "the session file was closed before the flush completed".into() }));
        }
        result
    }
}
