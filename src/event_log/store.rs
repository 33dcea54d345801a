//! The `Store` trait: where sessions live, by id.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::log::{now_ms, SessionLog};
use super::LogError;

/// What a store runs on a log it opens, before handing it out: the loop installs its crash
/// closers here (storage knows nothing of turns), and tests may install any check. Returns how
/// many events it appended (a file store reports them in its `Recovery`). An error fails the
/// open; a store with no hook hands logs out as they are stored.
pub type OpenHook = Arc<dyn Fn(&SessionLog) -> Result<usize, LogError> + Send + Sync>;

/// Runs `hook` (if any) on a freshly opened log.
pub(crate) fn run_open_hook(hook: Option<&OpenHook>, log: &SessionLog) -> Result<usize, LogError> {
    hook.map_or(Ok(0), |hook| hook(log))
}

/// The newest session file format version this build reads and writes (docs/format.md):
/// sessions are written in version [`PLAIN_VERSION`], forks that share their parent's records
/// in version 2; every version from 1 up to this one is read.
pub const FORMAT_VERSION: u64 = 2;

/// The version of a session that is not a shared fork (the header every store writes for
/// `create`): version 1 readers read it.
pub const PLAIN_VERSION: u64 = 1;

/// A place sessions live. Contract:
/// * `create` makes a new, empty session owned by the returned log (minting a UUIDv7 id when
///   `None`); an existing id is `Exists`.
/// * `open` hands out the one owning log of an existing session: it verifies what is stored,
///   repairs a torn tail, and runs the store's [`OpenHook`] (the loop's crash closers) if set.
///   A session another handle owns is `Locked` (`LockedHere` when the store can tell that it is
///   a log of this very process).
/// * `list` names every created session, sorted, and agrees with `exists` (an empty session
///   is listed); `delete` removes a session nobody owns and no fork reads its first events
///   from (`HasForks`, naming them: every store keeps this rule, the memory store too).
/// * What a store keeps: an event appended to one of its logs is kept exactly (type, data,
///   envelope, byte for byte after a reopen), or refused by the append itself — before its seq
///   is assigned, with a `LogError` naming the problem, leaving the log and the events queued
///   before it untouched. A store never accepts an event and then fails at write or commit time
///   because of what it holds. Memory and file stores keep every lossless-JSON value, NUL in
///   types, keys and texts included (the file escapes it as `\u0000`); a store whose medium
///   cannot (PostgreSQL `text`/`jsonb` and NUL) checks at append time, in its backend's
///   `enqueue` (an error there refuses the append: nothing is committed, no seq is taken).
/// * `fork` makes a new session (minting a UUIDv7 id when `None`; an existing id is `Exists`)
///   whose events are the parent's events `0..=at_seq`, exactly as the parent's log reads them
///   (type, seq, time, data, envelope), and whose header names the parent and the cut
///   ([`FORKED_FROM`]). The parent is not changed, and the two go their own ways. The file and
///   PostgreSQL stores share the parent's records (the child reads events `0..=at_seq` through
///   the parent, so a fork costs the same whatever the parent's length, and the parent cannot
///   be deleted before it); the memory store copies. The parent may be open (its committed
///   events are read). A cut past the parent's last event is `InvalidFork`. Returns the id.
///   Nothing of the loop is done here: a cut inside a turn is closed by the loop's crash
///   closers when the child is first opened, like any session that ended mid-turn.
/// * File stores store only regular files: a session name that is anything else (a link, a
///   FIFO, a device, a directory) is listed, but refused by every operation that would read or
///   write it.
pub trait Store: Send + Sync {
    fn create(&self, id: Option<&str>) -> Result<SessionLog, LogError>;
    fn open(&self, id: &str) -> Result<SessionLog, LogError>;
    fn list(&self) -> Result<Vec<String>, LogError>;
    fn exists(&self, id: &str) -> Result<bool, LogError>;
    fn delete(&self, id: &str) -> Result<(), LogError>;
    fn fork(&self, id: &str, at_seq: u64, new_id: Option<&str>) -> Result<String, LogError>;
}

/// The header key a forked session's header names its parent and cut under:
/// `"forkedFrom": {"id": <parent id>, "seq": <the cut, the last inherited seq>}`.
pub const FORKED_FROM: &str = "forkedFrom";

/// The events a fork at `at_seq` inherits of `events` (a parent's committed events), or
/// `InvalidFork` naming the cut and the parent's length.
pub(crate) fn fork_prefix(parent: &str, events: &[super::Event], at_seq: u64) -> Result<Vec<super::Event>, LogError> {
    match usize::try_from(at_seq).ok().filter(|&at| at < events.len()) {
        Some(at) => Ok(events[..=at].to_vec()),
        None => Err(fork_beyond(parent, at_seq, events.len() as u64)),
    }
}

/// The error for a cut at `at_seq` of a parent holding `len` events.
pub(crate) fn fork_beyond(parent: &str, at_seq: u64, len: u64) -> LogError {
    let has = match len {
        0 => "has no events".to_string(),
        n => format!("ends at seq {}", n - 1),
    };
    LogError::InvalidFork(format!("at_seq {at_seq} is past the end of session {parent:?}, which {has}"))
}

/// The header of a session forked from `parent` at `at_seq`: a new header plus [`FORKED_FROM`].
pub(crate) fn fork_header(id: &str, parent: &str, at_seq: u64) -> Map<String, Value> {
    let mut header = new_header(id);
    let mut from = Map::new();
    from.insert("id".into(), Value::String(parent.into()));
    from.insert("seq".into(), Value::from(at_seq));
    header.insert(FORKED_FROM.into(), Value::Object(from));
    header
}

/// A session id for `create`: the given one (checked) or a fresh UUIDv7.
pub(crate) fn resolve_id(id: Option<&str>) -> Result<String, LogError> {
    match id {
        None => Ok(crate::message::new_id()),
        Some(id) => check_id(id).map(|()| id.to_string()),
    }
}

/// Session ids are any non-empty string without NUL; stores encode them safely.
pub(crate) fn check_id(id: &str) -> Result<(), LogError> {
    if id.is_empty() {
        return Err(LogError::InvalidId("a session id must be a non-empty string".into()));
    }
    if id.contains('\0') {
        return Err(LogError::InvalidId(format!("{id:?} contains NUL")));
    }
    Ok(())
}

/// The header of a new session: `{version, id, createdAt}`.
pub(crate) fn new_header(id: &str) -> Map<String, Value> {
    let mut header = Map::new();
    header.insert("version".into(), Value::from(PLAIN_VERSION));
    header.insert("id".into(), Value::String(id.into()));
    header.insert("createdAt".into(), Value::from(now_ms()));
    header
}
