//! A read-only follower of a session file (`FileStore::follow`): takes no lock, refuses
//! appends, and grows as the owner (in any process) appends whole records.
//!
//! Growth is detected by polling the file's size on a private thread, every [`POLL`] while
//! the follower is open (a timed condvar wait, never a spin; closing wakes it at once). Only
//! complete records whose checksum and envelope verify and whose seq is the log's next one are
//! adopted; an incomplete last record (a write in progress, or a torn tail) stays invisible
//! and is read again once the file grows. The follower stops, closing its log so tails end,
//! when the file is cut back below what it has shown (a failed write the owner undid), its
//! name no longer points to the file it reads (the session was deleted and perhaps created
//! again, or repaired), or the bytes it has shown changed (the same file overwritten in place
//! with another session, as `cp` does): it compares its header line and the last record it
//! adopted with the file before adopting anything more, so two sessions are never spliced.
//!
//! A follower of a file a crash left before the session's first sync (`format::unborn`) has
//! shown nothing and has no header line yet: it waits for one, written when the session is
//! opened again, and then reads the records after it as any follower does.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value};

use super::{format, sys};
use crate::event_log::log::{intern, TypeNames};
use crate::event_log::{Backend, Event, FlushCallback, LogError, SessionLog, WeakSessionLog};

/// How often the size of a followed file is looked at.
pub(super) const POLL: Duration = Duration::from_millis(20);

/// What a follower starts from: the file it read, where that read's good prefix ends, and the
/// header and events of that prefix.
pub(super) struct Setup {
    pub id: String,
    pub path: PathBuf,
    pub file: File,
    pub offset: u64,
    pub header: Map<String, Value>,
    pub events: Vec<Event>,
    /// The header line as read (with its newline); empty for an unborn file.
    pub header_line: Vec<u8>,
    /// Where the last line of the good prefix starts, and that line (the header line when
    /// there are no events).
    pub last_line: (u64, Vec<u8>),
}

struct Shared {
    id: String,
    /// In a forked child the follower thread does not exist (forks.rs).
    origin: super::forks::Origin,
    closed: Mutex<bool>,
    wake: Condvar,
    log: OnceLock<WeakSessionLog>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, bool> {
    shared.closed.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The backend of a follower's `SessionLog`.
struct Follower {
    shared: Arc<Shared>,
}

/// Starts following: the returned log holds `setup.events` and grows with the file.
pub(super) fn start(setup: Setup) -> Result<SessionLog, LogError> {
    let shared = Arc::new(Shared {
        id: setup.id.clone(),
        origin: super::forks::Origin::here(),
        closed: Mutex::new(false),
        wake: Condvar::new(),
        log: OnceLock::new(),
    });
    let next = setup.events.len() as u64;
    let log = SessionLog::from_parts(setup.id, setup.header, setup.events, Box::new(Follower { shared: Arc::clone(&shared) }));
    let _ = shared.log.set(log.downgrade());
    let watch = Watch {
        shared,
        path: setup.path,
        file: setup.file,
        offset: setup.offset,
        seen: None,
        next,
        types: TypeNames::default(),
        header_line: setup.header_line,
        last_line: setup.last_line,
    };
    std::thread::Builder::new()
        .name("kerman-follow".into())
        .spawn(move || watch.run())
        .map_err(|e| LogError::io("starting the session follower thread", e))?;
    Ok(log)
}

struct Watch {
    shared: Arc<Shared>,
    path: PathBuf,
    file: File,
    /// Where the first record not yet adopted starts.
    offset: u64,
    /// The file's size and modification time at the last look: a read happens only when they
    /// change (the time too, so a tail cut back and regrown to the same size is read again).
    seen: Option<(u64, i64, i64)>,
    /// The next seq.
    next: u64,
    types: TypeNames,
    /// The bytes shown so far that must not change: the header line (empty until an unborn
    /// file gets one), and the last line adopted (at its offset).
    header_line: Vec<u8>,
    last_line: (u64, Vec<u8>),
}

enum Step {
    Wait,
    Stop,
}

impl Watch {
    fn run(mut self) {
        loop {
            {
                let closed = lock(&self.shared);
                if *closed {
                    return;
                }
                let (closed, _) = self.shared.wake.wait_timeout(closed, POLL).unwrap_or_else(PoisonError::into_inner);
                if *closed {
                    return;
                }
            }
            let Some(log) = self.shared.log.get().and_then(WeakSessionLog::upgrade) else { return };
            if let Step::Stop = self.look(&log) {
                // Ends the tails; `close` finds the token free (this thread holds none).
                let _ = log.close();
                return;
            }
        }
    }

    /// Reads what the file gained since the last look and adopts its complete records.
    fn look(&mut self, log: &SessionLog) -> Step {
        let Ok(meta) = self.file.metadata() else { return Step::Wait };
        let len = meta.len();
        if len < self.offset {
            return Step::Stop;
        }
        match (sys::key_at(&self.path), sys::key_of_file(&self.file)) {
            (Ok(named), Ok(ours)) if named == ours => {}
            _ => return Step::Stop,
        }
        let (secs, nanos) = sys::modified(&meta);
        let key = Some((len, secs, nanos));
        if key == self.seen {
            return Step::Wait;
        }
        self.seen = key;
        if self.header_line.is_empty() {
            match self.born(len) {
                Some(Step::Stop) => return Step::Stop,
                Some(Step::Wait) => return Step::Wait,
                None => {}
            }
        }
        // More than the address space holds (a 32-bit target only): stop rather than read a
        // truncated count of bytes as if it were all that grew.
        let Ok(grown) = usize::try_from(len - self.offset) else { return Step::Stop };
        let mut bytes = vec![0u8; grown];
        if sys::read_exact_at(&self.file, &mut bytes, self.offset).is_err() {
            // Cut back between the size and the read: the next look decides.
            self.seen = None;
            return Step::Wait;
        }
        // Checked after the read: an in-place rewrite that reached the bytes just read has
        // rewritten these earlier ones first.
        if !self.unchanged() {
            return Step::Stop;
        }
        let events = self.parse(&bytes);
        if !events.is_empty() && log.adopt(events).is_err() {
            return Step::Stop;
        }
        Step::Wait
    }

    /// For an unborn file: whether its header line has been written (`None`: go on reading the
    /// records after it), is still to come (`Wait`), or is not a header of this session that
    /// starts it anew (`Stop`: a damaged or foreign header, or a shared fork's).
    fn born(&mut self, len: u64) -> Option<Step> {
        let Ok(size) = usize::try_from(len) else { return Some(Step::Stop) };
        let mut bytes = vec![0u8; size];
        if sys::read_exact_at(&self.file, &mut bytes, 0).is_err() {
            self.seen = None;
            return Some(Step::Wait);
        }
        if format::unborn(&bytes) {
            return Some(Step::Wait);
        }
        match format::scan(&bytes, &self.path, &self.shared.id) {
            Ok(scan) if scan.parent.is_none() => {}
            _ => return Some(Step::Stop),
        }
        let end = bytes.iter().position(|&b| b == b'\n').map_or(bytes.len(), |i| i + 1);
        self.header_line = bytes[..end].to_vec();
        self.last_line = (0, self.header_line.clone());
        self.offset = end as u64;
        None
    }

    /// Whether the header line and the last adopted line are still what was shown.
    fn unchanged(&self) -> bool {
        let same = |at: u64, expected: &[u8]| {
            let mut now = vec![0u8; expected.len()];
            sys::read_exact_at(&self.file, &mut now, at).is_ok() && now == expected
        };
        same(0, &self.header_line) && same(self.last_line.0, &self.last_line.1)
    }

    /// The complete, verified records at the start of `bytes` that continue the log; moves
    /// `offset` past them. Stops at the first line that does not (it is read again later).
    fn parse(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut events = Vec::new();
        let mut pos = 0;
        while let Some(i) = bytes[pos..].iter().position(|&b| b == b'\n') {
            let line = &bytes[pos..pos + i];
            let types = &mut self.types;
            let parsed = format::unframe(line).and_then(|json| Event::from_json(json, &mut |k: &str| intern(types, k)));
            match parsed {
                Ok(event) if event.seq == self.next => {
                    self.next += 1;
                    events.push(event);
                    self.last_line = (self.offset + pos as u64, bytes[pos..=(pos + i)].to_vec());
                    pos += i + 1;
                }
                _ => break,
            }
        }
        self.offset += pos as u64;
        events
    }
}

impl Backend for Follower {
    fn enqueue(&self, _event: &Event) -> Result<(), LogError> {
        Err(LogError::ReadOnly { id: self.shared.id.clone() })
    }

    /// Nothing is ever written here, so everything "appended" is as durable as it gets.
    fn flush(&self, done: FlushCallback) {
        done(Ok(()));
    }

    /// Stops following; the file is untouched.
    fn close(&self, _events: Vec<Event>) -> Result<(), LogError> {
        if self.shared.origin.forked() {
            // The thread (and whatever it held at the fork) is the parent's: wait for nothing.
            return Ok(());
        }
        *lock(&self.shared) = true;
        self.shared.wake.notify_all();
        // Waits out an adoption being published on the follower thread (its observers and
        // tail wake-ups may call into Python): after `close` returns nothing more is called.
        // A thread already holding the token (an observer closing its own log) has nothing to
        // wait for; from the log's drop the weak handle no longer upgrades.
        if let Some(log) = self.shared.log.get().and_then(WeakSessionLog::upgrade) {
            drop(log.publishing());
        }
        Ok(())
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        if self.shared.origin.forked() {
            return;
        }
        *lock(&self.shared) = true;
        self.shared.wake.notify_all();
    }
}
