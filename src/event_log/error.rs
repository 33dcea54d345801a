//! Errors of the session log and its stores.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong appending to, reading or storing a session log.
#[derive(Debug)]
#[non_exhaustive]
pub enum LogError {
    /// Event data that is not lossless JSON.
    NotJson { event_type: String, detail: String },
    /// An append from inside an observer of the same log.
    Reentrant,
    /// A type the Inbox or the AgentLoop owns, appended through the public API.
    ReservedType(String),
    /// A type string that is empty or otherwise unusable.
    InvalidType(String),
    /// A record that breaks the envelope rules (surface markers, seq continuity).
    InvalidEvent(String),
    /// An invalid record followed by valid ones: committed data is damaged.
    Corrupt { path: PathBuf, line: u64, seq: u64, detail: String },
    /// A header written in a format version this build does not read.
    UnsupportedFormat { path: PathBuf, found: u64, supported: u64 },
    /// Another owner holds the session.
    Locked { id: String },
    /// An owning log of this very process still holds the session (it was not closed).
    LockedHere { id: String },
    /// No session `id` in the store.
    NotFound { id: String },
    /// A session `id` already exists (create of a taken id).
    Exists { id: String },
    /// The log was closed; nothing more can be appended.
    Closed { id: String },
    /// A write or fsync failed; the log is poisoned until reopened.
    Write { detail: String },
    /// A session id that is empty or unusable.
    InvalidId(String),
    /// The session's lease moved on (another owner opened it with a newer epoch): this
    /// handle's appends are fenced out. Reopen to continue.
    LeaseLost { id: String, epoch: i64, current: i64 },
    /// An append to a read-only log (a PostgreSQL follower, `PostgresStore.follow`).
    ReadOnly { id: String },
    /// A database (PostgreSQL store) failure, with what was being done.
    Database { context: String, detail: String },
    /// A log used in a forked child of the process that opened it (its writer thread is the
    /// parent's): open the session again in the child instead.
    Forked { id: String, owner: u32, pid: u32 },
    /// Any other I/O failure, with what was being done.
    Io { context: String, source: std::io::Error },
    /// A value this store cannot keep (NUL in a PostgreSQL text column), refused before it
    /// is accepted; says what and names it (see `storable.rs`).
    Unstorable(String),
    /// A fork that cannot be made as asked (a cut beyond the parent's last event), saying why.
    InvalidFork(String),
    /// A session that forks share records of (they read their first events from it) cannot
    /// be deleted before them; names them, sorted.
    HasForks { id: String, forks: Vec<String> },
    /// A fork that reads its first events through its parent cannot: the parent is gone, was
    /// replaced, or now ends before the cut (`detail` says which).
    BrokenFork { id: String, parent: String, seq: u64, detail: String },
}

impl LogError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LogError::Io { context: context.into(), source }
    }
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::NotJson { event_type, detail } => {
                write!(f, "session event \"{event_type}\" carries non-JSON-serializable data: {detail}")
            }
            LogError::Reentrant => {
                write!(f, "session append cannot reenter while another append is being published")
            }
            LogError::ReservedType(t) => write!(
                f,
                "event type \"{t}\" is owned by the Inbox and the AgentLoop and cannot be appended directly"
            ),
            LogError::InvalidType(t) => write!(f, "invalid event type {t:?}: expected a non-empty string"),
            LogError::InvalidEvent(detail) => write!(f, "invalid event: {detail}"),
            LogError::Corrupt { path, line, seq, detail } => write!(
                f,
                "corrupt session log {}: invalid record at line {line} (seq {seq}) followed by valid records: {detail}",
                path.display()
            ),
            LogError::UnsupportedFormat { path, found, supported } => {
                let why = if found > supported {
                    "it was written by a newer kerman; upgrade kerman to open it"
                } else {
                    "this build ships no upgrade path for it"
                };
                let reads = match supported {
                    1 => "only version 1".to_string(),
                    2 => "versions 1 and 2".to_string(),
                    n => format!("versions 1 to {n}"),
                };
                write!(f, "session log {} uses format version {found}, but this kerman reads {reads}: {why}", path.display())
            }
            LogError::Locked { id } => {
                write!(f, "session \"{id}\" is locked: another process or handle has it open")
            }
            LogError::LockedHere { id } => write!(
                f,
                "session \"{id}\" is locked by a session log still open in this process: close that log first"
            ),
            LogError::NotFound { id } => write!(f, "session \"{id}\" not found"),
            LogError::Exists { id } => write!(f, "session \"{id}\" already exists"),
            LogError::Closed { id } => write!(f, "session \"{id}\" is closed"),
            LogError::Write { detail } => write!(f, "session log write failed: {detail}"),
            LogError::InvalidId(detail) => write!(f, "invalid session id: {detail}"),
            LogError::LeaseLost { id, epoch, current } => write!(
                f,
                "session \"{id}\": lease lost (this handle holds epoch {epoch}, the session is at epoch {current}); another owner took it over"
            ),
            LogError::ReadOnly { id } => {
                write!(f, "session \"{id}\" is followed read-only here (store.follow); open it to append")
            }
            LogError::Database { context, detail } => write!(f, "{context}: {detail}"),
            LogError::Forked { id, owner, pid } => write!(
                f,
                "session \"{id}\" was opened by process {owner}; this process ({pid}) is a fork of it and cannot use that log: open the session again here (once its owner has closed it)"
            ),
            LogError::Io { context, source } => write!(f, "{context}: {source}"),
            LogError::Unstorable(detail) => write!(f, "cannot store this: {detail}"),
            LogError::InvalidFork(detail) => write!(f, "cannot fork: {detail}"),
            LogError::HasForks { id, forks } => {
                let names: Vec<String> = forks.iter().map(|f| format!("{f:?}")).collect();
                let (n, them) = if forks.len() == 1 { ("fork", "it") } else { ("forks", "them") };
                write!(
                    f,
                    "session {id:?} cannot be deleted: its {n} {} read their first events from it; delete {them} first",
                    names.join(", ")
                )
            }
            LogError::BrokenFork { id, parent, seq, detail } => write!(
                f,
                "session {id:?} is a fork of session {parent:?} at seq {seq} and reads events 0-{seq} from it, but {detail}"
            ),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
