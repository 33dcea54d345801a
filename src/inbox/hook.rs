//! Insertion hooks: what every new message passes before its splice is planned.
//!
//! A hook sees each message an insertion brings (append, prepend, splice, replace, a tool's
//! contexts, input another process staged) before the inbox takes any lock or writes
//! anything, and returns the message to insert in its place (the same one, or a rewrite with
//! the same id) or a [`Refusal`]. One refusal refuses the whole mutation: nothing of it is
//! logged and the lists stay as they were. Messages the log already holds (a requeue, a
//! replay) are not passed again: the hook ran when they were first inserted.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::Target;
use crate::message::Message;

/// Looks at each message before it is inserted (see the module docs).
pub trait InsertHook: Send + Sync {
    /// Whether there is anything to run: an idle hook costs an insertion this one call.
    fn active(&self) -> bool {
        true
    }

    /// The message to insert instead of `message` (the same `Arc` to keep it as it is).
    fn admit(&self, target: Target, message: Arc<Message>) -> Result<Arc<Message>, Refusal>;

    /// `message`, which another process staged, was refused and dropped from the staging
    /// table (nobody is there to be told): a host may log it.
    fn dropped(&self, _message: &Arc<Message>, _refusal: Refusal) {}
}

/// Why a hook refused a message. `cause` carries the host's own error back to it (the
/// binding's Python exception), so the caller sees what the hook raised.
pub struct Refusal {
    pub detail: String,
    pub cause: Option<Box<dyn Any + Send + Sync>>,
}

impl Refusal {
    pub fn new(detail: impl Into<String>) -> Refusal {
        Refusal { detail: detail.into(), cause: None }
    }
}

impl fmt::Debug for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusal").field("detail", &self.detail).field("cause", &self.cause.is_some()).finish()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// What an insertion did: the messages it removed and the ones it inserted (as the hook left
/// them).
#[derive(Debug, Default)]
pub struct Spliced {
    pub removed: Vec<Arc<Message>>,
    pub inserted: Vec<Arc<Message>>,
}
