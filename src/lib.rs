//! Kerman: a durable agent loop built on one append-only session log.
//!
//! The model in one screen:
//!
//! * A [`SessionLog`](event_log::SessionLog) is an append-only list of [`Event`](event_log::Event)s.
//!   Appends are synchronous: validate, assign `seq = len`, commit, then notify observers. A
//!   [`Store`](event_log::Store) gives logs identity and (for [`FileStore`](event_log::FileStore))
//!   durability through a writer thread, so the appending thread never blocks on I/O.
//! * An [`Inbox`](inbox::Inbox) is a projection of the log's `agent/inbox/spliced` events: two
//!   lists (`next-turn`, `next-step`) of user messages. Every mutation appends one normalised
//!   splice before the lists change, so replaying the log rebuilds the inbox exactly.
//! * [`projection`] holds pure folds over the same events, for UIs and reconnects.
//!
//! Everything here is plain Rust. The Python binding lives in `src/python/` behind the
//! `python` feature and is the only code that touches pyo3.

pub mod agent_loop;
pub mod blocking;
pub mod event_log;
mod ids;
pub mod inbox;
pub mod json;
pub mod message;
pub mod projection;
pub mod waterfall;

#[cfg(feature = "python")]
mod python;

pub use event_log::{Event, FileStore, LogError, MemoryStore, SessionLog, Store};
pub use inbox::{Inbox, InboxError, ProjectionError, Target};
pub use message::{Message, MessageError, MessageKind};
pub use projection::{consumed_work, ConsumedWork, InboxProjection};
