//! `FileStore`: one JSON-lines file per session (format versions 1 and 2, see docs/format.md).
//!
//! A session file is owned by one open log at a time through an exclusive advisory lock held
//! on its descriptor for as long as the log is open. Readers (`read`, `follow`) take no lock:
//! the file only ever grows by whole checksummed records, so a reader sees a consistent prefix
//! and leaves an incomplete last record for later. Each open log has a writer thread (see
//! `writer.rs`) so appends never wait for the disk.

mod follow;
mod forks;
mod format;
mod fsio;
mod names;
mod repair;
mod salvage;
mod shared;
// The platform's file-system calls, behind one set of functions.
#[cfg_attr(unix, path = "sys_unix.rs")]
#[cfg_attr(windows, path = "sys_windows.rs")]
mod sys;
mod writer;

use std::fmt;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{check_id, new_header, resolve_id, run_open_hook, OpenHook};
use super::{Event, LogError, SessionLog, Store};
use writer::{FileBackend, WriterSetup};

/// When appended events reach the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Every batch is written and `fdatasync`ed as soon as it is pending (group commit).
    Strict,
    /// Write-behind in a fixed 50 ms window from the first pending event, then `fdatasync`; a
    /// flush barrier cuts the window short. (The loop adds barriers before model requests and
    /// tool bodies; for the file itself this is the same as `Batch`.)
    #[default]
    Checkpoint,
    /// The same 50 ms write-behind window; barriers only when someone asks.
    Batch,
    /// Written as soon as pending, never synced (tests, throwaway sessions).
    None,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Strict => "strict",
            Durability::Checkpoint => "checkpoint",
            Durability::Batch => "batch",
            Durability::None => "none",
        }
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "strict" => Ok(Durability::Strict),
            "checkpoint" => Ok(Durability::Checkpoint),
            "batch" => Ok(Durability::Batch),
            "none" => Ok(Durability::None),
            _ => Err(format!("unknown durability {s:?}: expected \"strict\", \"checkpoint\", \"batch\" or \"none\"")),
        }
    }
}

/// Where the fault hook is consulted, on the writer thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPoint {
    /// Before a batch is written.
    Write,
    /// Before a batch is synced, and before the sync of a session created and never synced
    /// when a barrier with nothing pending, or `close`, asks for it (then `seqs` is empty).
    Sync,
    /// After the file, before its directory is synced, at the first sync of a session `create`
    /// made (its name becomes durable with its first durable record).
    SyncDirectory,
    /// Before the file is cut back to its durable length after a failed write or sync.
    CutBack,
}

/// What the writer is about to do when it consults the fault hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSite {
    pub point: FaultPoint,
    /// The seqs of the events in the batch (empty for a sync with nothing pending).
    pub seqs: std::ops::Range<u64>,
    /// The batch's length in bytes (0 for a sync with nothing pending).
    pub bytes: usize,
}

/// An injected I/O failure.
#[derive(Debug)]
pub enum Fault {
    /// The operation fails with this error without touching the file.
    Fail(std::io::Error),
    /// At a write: the first `bytes` bytes of the batch reach the file (at most all but one: a
    /// short write), then the write fails with `error`. Elsewhere the same as `Fail`.
    Short { bytes: usize, error: std::io::Error },
}

impl Fault {
    /// The error the failing operation reports.
    pub fn into_error(self) -> std::io::Error {
        match self {
            Fault::Fail(error) | Fault::Short { error, .. } => error,
        }
    }
}

/// A testing seam: returns the fault to inject at a site, or `None` to carry on. Called on the
/// writer thread, with no lock held; it must not block for long.
pub type FaultHook = Arc<dyn Fn(&FaultSite) -> Option<Fault> + Send + Sync>;

/// What `open` had to do to a session file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes of a torn tail cut off the end of the file.
    pub truncated_bytes: u64,
    /// The line where the torn tail began.
    pub truncated_at_line: Option<u64>,
    /// Events the store's open hook appended (the loop's crash closers, when the log ended
    /// inside an open turn).
    pub closers: usize,
    /// The file held only what a crash of the machine leaves of a session created but never
    /// synced (part of its header, or nothing: `truncated_bytes` says how much): its header
    /// was written again, and the session is empty.
    pub recreated: bool,
}

pub use repair::{DamagedSnapshot, RepairReport};
pub use salvage::{Dropped, Lost, DAMAGED, REPAIRED};

/// A verified, read-only view of a session file.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The header record without its `type` key (as `SessionLog::header` shows it).
    pub header: Map<String, Value>,
    pub events: Vec<Event>,
    pub path: PathBuf,
    /// Bytes of a torn tail that `open` would cut off (left in place here).
    pub torn_tail_bytes: u64,
    pub size_bytes: u64,
}

/// A store of session files in one directory.
#[derive(Clone)]
pub struct FileStore {
    root: PathBuf,
    durability: Durability,
    fault: Option<FaultHook>,
    on_open: Option<OpenHook>,
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStore").field("root", &self.root).field("durability", &self.durability).finish_non_exhaustive()
    }
}

impl FileStore {
    /// A store in `root`, created if missing.
    pub fn new(root: impl Into<PathBuf>, durability: Durability) -> Result<Self, LogError> {
        let root = root.into();
        // Private: the names in it are session ids. Only directories created here get 0700
        // (the umask can only narrow it; on Windows the inherited ACL); an existing folder
        // keeps the mode it was given.
        sys::create_dir(&root).map_err(|e| LogError::io(format!("creating store directory {}", root.display()), e))?;
        Ok(FileStore { root, durability, fault: None, on_open: None })
    }

    /// Testing seam: consults `fault` before every write and sync of the logs this store opens
    /// from now on, to inject I/O errors. Not meant for production use.
    #[must_use]
    pub fn with_fault(mut self, fault: FaultHook) -> Self {
        self.fault = Some(fault);
        self
    }

    /// Runs `hook` on every log `open` hands out from now on (see [`OpenHook`]).
    #[must_use]
    pub fn with_open_hook(mut self, hook: OpenHook) -> Self {
        self.on_open = Some(hook);
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The file that holds (or would hold) session `id`.
    pub fn path_of(&self, id: &str) -> Result<PathBuf, LogError> {
        check_id(id)?;
        Ok(self.root.join(names::file_name(id)?))
    }

    fn start(
        &self,
        id: String,
        header: Map<String, Value>,
        events: Vec<Event>,
        (file, hold): (fs::File, fsio::Hold),
        len: u64,
    ) -> Result<SessionLog, LogError> {
        let backend = self.backend(&id, events.len() as u64, (file, hold), len, None)?;
        Ok(SessionLog::from_parts(id, header, events, Box::new(backend)))
    }

    /// The writer of session `id`'s locked file, holding `events` events in `len` bytes;
    /// `unsynced`: the directory, when neither the file nor its name is durable yet.
    fn backend(
        &self,
        id: &str,
        events: u64,
        (file, hold): (fs::File, fsio::Hold),
        len: u64,
        unsynced: Option<sys::Dir>,
    ) -> Result<FileBackend, LogError> {
        FileBackend::start(WriterSetup {
            id: id.to_string(),
            len,
            events,
            durability: self.durability,
            fault: self.fault.clone(),
            hold,
            file,
            unsynced,
        })
    }

    /// [`Store::open`], also telling what recovery did (for warnings).
    pub fn open_with_report(&self, id: &str) -> Result<(SessionLog, Recovery), LogError> {
        let path = self.path_of(id)?;
        let file = fsio::open_locked(&path, id)?;
        // Registered at once, so a fork from another thread during the scan leaves no lock
        // behind in the child (forks.rs); dropped before the file on every error path.
        let hold = fsio::Hold::new(&file);
        let bytes = fsio::read_all(&file, &path)?;
        if format::unborn(&bytes) {
            return self.recreate(id, (file, hold), bytes.len() as u64);
        }
        let mut scan = format::scan(&bytes, &path, id)?;
        if let Some(err) = scan.corruption(&path) {
            return Err(err);
        }
        self.inherit(id, &mut scan)?;
        let mut recovery = Recovery::default();
        if let Some(invalid) = &scan.invalid {
            fsio::truncate(&file, scan.good_len, &path)?;
            recovery.truncated_bytes = scan.bad_bytes();
            recovery.truncated_at_line = Some(invalid.line);
        }
        let log = self.start(id.to_string(), scan.header, scan.events, (file, hold), scan.good_len)?;
        recovery.closers = run_open_hook(self.on_open.as_ref(), &log)?;
        Ok((log, recovery))
    }

    /// `open` of a file that holds what a crash left of a session created but never synced
    /// (`format::unborn`): the session is created again in its place, empty, under the same
    /// lock, and made durable as a new one is (at its first sync).
    fn recreate(&self, id: &str, (file, hold): (fs::File, fsio::Hold), len: u64) -> Result<(SessionLog, Recovery), LogError> {
        let path = self.path_of(id)?;
        let header = new_header(id);
        let line = format::header_line(&header);
        sys::write_all_at(&file, &line, 0)
            .and_then(|()| file.set_len(line.len() as u64))
            .map_err(|e| LogError::io(format!("writing the header of {} again", path.display()), e))?;
        let dir = sys::open_dir(&self.root).map_err(|e| LogError::io(format!("opening directory {}", self.root.display()), e))?;
        let backend = self.backend(id, 0, (file, hold), line.len() as u64, Some(dir))?;
        let log = SessionLog::from_parts(id.to_string(), header, Vec::new(), Box::new(backend));
        let recovery = Recovery {
            truncated_bytes: len,
            truncated_at_line: Some(1),
            recreated: true,
            closers: run_open_hook(self.on_open.as_ref(), &log)?,
        };
        Ok((log, recovery))
    }

    /// Verifies and reads session `id` without changing its file (a torn tail is reported, not
    /// cut off; no closers are added). Takes no lock, so it reads a session another log (in
    /// any process) has open as committed so far; a record being written is not yet seen.
    pub fn read(&self, id: &str) -> Result<Snapshot, LogError> {
        let path = self.path_of(id)?;
        let file = fsio::open_reader(&path, id)?;
        let bytes = fsio::read_all(&file, &path)?;
        if format::unborn(&bytes) {
            // What `open` would make of it: an empty session (the header it would write).
            let size = bytes.len() as u64;
            return Ok(Snapshot { header: new_header(id), events: Vec::new(), path, torn_tail_bytes: size, size_bytes: size });
        }
        let mut scan = format::scan(&bytes, &path, id)?;
        if let Some(err) = scan.corruption(&path) {
            return Err(err);
        }
        self.inherit(id, &mut scan)?;
        Ok(Snapshot { torn_tail_bytes: scan.bad_bytes(), size_bytes: scan.total_len, header: scan.header, events: scan.events, path })
    }

    /// A read-only follower of session `id`: every record committed so far, then each record
    /// its owner (in any process) writes, as the file grows. Takes no lock and never writes;
    /// appends fail with `LogError::ReadOnly`; `close` stops following. Corruption is refused
    /// as by `read`; a torn or incomplete last record is simply not visible yet.
    ///
    /// A file a crash left before the session's first sync (`format::unborn`) is followed as
    /// the empty session `read` shows (the header `open` would write): it grows once the
    /// session is opened, its header written again, and appended to.
    pub fn follow(&self, id: &str) -> Result<SessionLog, LogError> {
        let path = self.path_of(id)?;
        let file = fsio::open_reader(&path, id)?;
        let bytes = fsio::read_all(&file, &path)?;
        if format::unborn(&bytes) {
            let (id, header) = (id.to_string(), new_header(id));
            let unborn = follow::Setup {
                id,
                path,
                file,
                offset: 0,
                header,
                events: Vec::new(),
                header_line: Vec::new(),
                last_line: (0, Vec::new()),
            };
            return follow::start(unborn);
        }
        let mut scan = format::scan(&bytes, &path, id)?;
        if let Some(err) = scan.corruption(&path) {
            return Err(err);
        }
        self.inherit(id, &mut scan)?;
        // The good prefix is whole lines, the header first (the scan verified it).
        let good = &bytes[..at(scan.good_len)];
        let header_end = good.iter().position(|&b| b == b'\n').map_or(good.len(), |i| i + 1);
        let last_start = good[..good.len().saturating_sub(1)].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        follow::start(follow::Setup {
            id: id.to_string(),
            path,
            file,
            offset: scan.good_len,
            header: scan.header,
            events: scan.events,
            header_line: good[..header_end].to_vec(),
            last_line: (last_start as u64, good[last_start..].to_vec()),
        })
    }
}

impl Store for FileStore {
    fn create(&self, id: Option<&str>) -> Result<SessionLog, LogError> {
        let id = resolve_id(id)?;
        let name = names::file_name(&id)?;
        if self.root.join(&name).symlink_metadata().is_ok() {
            return Err(LogError::Exists { id });
        }
        let header = new_header(&id);
        let line = format::header_line(&header);
        // The writer starts before the name exists (`create_locked`): nothing that can fail is
        // left once the session is visible. Nothing is synced yet: the writer syncs the header
        // with the first batch it makes durable, then the directory (docs/format.md
        // "Creation"), so a durable run pays for one sync less and a session nobody writes to
        // for none until it is closed.
        let start = |file: fs::File, dir: Option<sys::Dir>| {
            let hold = fsio::Hold::new(&file);
            self.backend(&id, 0, (file, hold), line.len() as u64, dir)
        };
        let Some(backend) = fsio::create_locked(&self.root, &name, &names::encode(&id), &line, fsio::Durable::Later, start)? else {
            return Err(LogError::Exists { id });
        };
        Ok(SessionLog::from_parts(id, header, Vec::new(), Box::new(backend)))
    }

    fn open(&self, id: &str) -> Result<SessionLog, LogError> {
        self.open_with_report(id).map(|(log, _)| log)
    }

    /// Every session, sorted, exactly the ids `exists` answers true for (an empty session is
    /// listed); foreign, hidden, temporary and backup files are ignored. Files are not opened,
    /// so sessions open elsewhere and unreadable files are listed too (`open` says why).
    fn list(&self) -> Result<Vec<String>, LogError> {
        let entries = fs::read_dir(&self.root).map_err(|e| LogError::io(format!("listing {}", self.root.display()), e))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io(format!("listing {}", self.root.display()), e))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(names::id_of_file_name) else { continue };
            // Whatever `exists` answers true for (any entry under a session's name) is listed.
            ids.push(id);
        }
        ids.sort();
        Ok(ids)
    }

    fn exists(&self, id: &str) -> Result<bool, LogError> {
        let path = self.path_of(id)?;
        match path.symlink_metadata() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(LogError::io(format!("inspecting {}", path.display()), e)),
        }
    }

    /// Removes a session nobody has open, unless forks read their first events through it
    /// (`HasForks`, naming them: delete them first). Looks at every session's header for that.
    fn delete(&self, id: &str) -> Result<(), LogError> {
        let path = self.path_of(id)?;
        let _forks = self.forks_lock()?;
        let file = fsio::open_locked(&path, id)?;
        let forks = self.forks_of(id, &file, &path)?;
        if !forks.is_empty() {
            return Err(LogError::HasForks { id: id.into(), forks });
        }
        fs::remove_file(&path).map_err(|e| LogError::io(format!("removing {}", path.display()), e))?;
        fsio::sync_dir(&self.root)?;
        drop(file);
        Ok(())
    }

    /// Writes the child as a file holding its header alone, sharing the parent's records
    /// (format version 2: `shared.rs`), in time independent of the parent's length.
    fn fork(&self, id: &str, at_seq: u64, new_id: Option<&str>) -> Result<String, LogError> {
        self.fork_shared(id, at_seq, new_id)
    }
}

/// The record reader without a file around it, for fuzz targets and micro-benchmarks.
/// Not a stable API.
#[doc(hidden)]
pub mod raw {
    use std::path::Path;

    use super::format;
    use crate::event_log::{Event, LogError};

    /// What [`scan`] found: the events before the first invalid record, the byte length of
    /// the good prefix, and the error `open` would raise if the damage is not a torn tail.
    pub struct Scanned {
        pub events: Vec<Event>,
        pub good_len: u64,
        pub corruption: Option<LogError>,
    }

    /// Verifies a whole session file's bytes (header first) exactly as `FileStore::open` does.
    pub fn scan(bytes: &[u8], id: &str) -> Result<Scanned, LogError> {
        let path = Path::new("<memory>");
        let scan = format::scan(bytes, path, id)?;
        let corruption = scan.corruption(path);
        Ok(Scanned { events: scan.events, good_len: scan.good_len, corruption })
    }

    /// Checks one line's framing and CRC-32C (without its newline); returns the JSON text.
    pub fn unframe(line: &[u8]) -> Result<&str, String> {
        format::unframe(line)
    }

    /// The file `FileStore::repair` would write for a corrupt file's bytes (at time 0, naming
    /// the backup `b` and the quarantine `q`), with the number of records it kept; `None` if
    /// the file is not corrupt.
    pub fn repair(bytes: &[u8], id: &str) -> Result<Option<(Vec<u8>, u64)>, LogError> {
        let path = Path::new("<memory>");
        if format::scan(bytes, path, id)?.corruption(path).is_none() {
            return Ok(None);
        }
        let s = super::salvage::salvage(bytes, path, id)?;
        let kept = s.kept.len() as u64;
        Ok(Some((super::salvage::rebuild(bytes, &s, 0, "b", Some("q")), kept)))
    }
}

/// A byte offset a scan took from a buffer in memory, as an index into that buffer: it fits
/// `usize` because the buffer's length does (the reports keep offsets as `u64`, as files do).
pub(super) fn at(offset: u64) -> usize {
    usize::try_from(offset).expect("an offset into a buffer in memory fits usize")
}
