//! Forking a session with the loop's rules on top of the store's fork (docs/context.md,
//! "Forks"): storage gives the child the parent's events up to the cut (shared or copied) and
//! knows nothing of inboxes or turns; what the child's queue holds at the cut, and closing a turn the cut left open, are
//! the loop's to write.

use std::str::FromStr;

use crate::event_log::{LogError, Store};
use crate::inbox::{Inbox, InboxError};

/// What a fork does with the messages queued in the parent's inbox at the cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForkInbox {
    /// The child's queue is the parent's at the cut (folded from the inherited splices).
    #[default]
    Inherit,
    /// The child starts with an empty queue: one logged splice clears it, in the child.
    Drop,
}

impl FromStr for ForkInbox {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "inherit" => Ok(ForkInbox::Inherit),
            "drop" => Ok(ForkInbox::Drop),
            _ => Err(format!("unknown inbox policy {s:?}: expected \"inherit\" or \"drop\"")),
        }
    }
}

/// Forks session `id` of `store` at `at_seq` (see `Store::fork`) and, with
/// [`ForkInbox::Drop`], opens the child once to clear its queue (the store's open hook, the
/// crash closers, closes a turn the cut left open first). A child that fails half-way is
/// deleted again, so a failed fork leaves nothing behind. Returns the child's id.
pub fn fork_session(store: &dyn Store, id: &str, at_seq: u64, new_id: Option<&str>, inbox: ForkInbox) -> Result<String, InboxError> {
    let child = store.fork(id, at_seq, new_id)?;
    if inbox == ForkInbox::Drop {
        if let Err(e) = drop_queue(store, &child) {
            let _ = store.delete(&child);
            return Err(e);
        }
    }
    Ok(child)
}

fn drop_queue(store: &dyn Store, child: &str) -> Result<(), InboxError> {
    let log = store.open(child)?;
    let cleared = Inbox::new(log.clone(), None).and_then(|inbox| {
        let cleared = if inbox.is_empty() { Ok(Vec::new()) } else { inbox.clear() };
        inbox.close();
        cleared
    });
    let flushed = log.flush_blocking();
    let closed = log.close();
    cleared?;
    flushed.and(closed).map_err(|e: LogError| e.into())
}
