//! Kerman: a durable agent loop built on one append-only session log.
//!
//! # Layout
//!
//! Layer order: json, ids, blocking → message → event_log → inbox → agent_loop → otel → python
//!
//! Each layer uses only the layers before it (modules separated by commas share a layer and do
//! not use each other); `tests/python/architecture/test_layers.py` reads every `crate::` path
//! under `src/` and fails on an arrow against this line.
//!
//! * [`json`] holds compact and canonical JSON text; `ids` mints UUIDv7 ids; [`blocking`] is
//!   how core waits release the host's lock (the GIL) while they block.
//! * [`message`] — immutable message values (user, assistant, tool result) and their JSON.
//! * [`event_log`] — the session log: events, the append path, observers, and the stores (memory,
//!   [`file`](event_log::file), PostgreSQL behind the `postgres` feature, whose connection thread
//!   and its reconnects are `event_log/postgres/worker/`) with their recovery. Storage knows no
//!   loop: a store runs an [`OpenHook`](event_log::OpenHook) on each log it opens, which whoever
//!   builds the loop sets (the loop's crash closers, [`agent_loop::crash_closers`]).
//! * [`inbox`] — the two lists of queued user input, a projection of the log's splices;
//!   [`inbox::projection`] folds the same events for UIs and reconnects.
//! * [`agent_loop`] — the agent loop as a sans-IO turn machine (`resume(input) -> effect`): the
//!   turn and step rules, the one writer of every loop event (crash closers included), the typed
//!   failures and abort causes, the tool plan, the derived history, the recovery folds
//!   (`consumed_work`) and the waterfall cursor of its hook dispatch ([`agent_loop::waterfall`]).
//! * [`otel`] — OpenTelemetry spans folded from a session's log (the loop's events read back)
//!   and encoded as OTLP, protobuf or JSON, for `kerman.otel`'s native exporter.
//! * `python/` — the binding (the `python` feature), the only code that touches pyo3: one file
//!   or folder per core module (`python/inbox/`: the `Inbox` class, its cache of the queued
//!   Python objects, its callbacks and the projection's binding); `python/runtime/`, what every
//!   class runs on (asyncio completions and their doorbell, interpreter exit, the GIL released
//!   around core waits); and `python/agent_loop/`, whose driver turns the machine's effects
//!   into awaits. It builds the stores with the loop's open hook installed.
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
//! * [`inbox::projection`] holds pure folds over the same events, for UIs and reconnects.
//! * The [`agent_loop`]'s [`Machine`](agent_loop::Machine) runs turns over a log and its inbox:
//!   it claims input, asks for one pre-step decision, calls the model, plans tools and writes
//!   every event of the turn; its host awaits what each effect asks for.
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
pub mod otel;

#[cfg(feature = "python")]
mod python;

pub use agent_loop::{consumed_work, ConsumedWork};
pub use event_log::{Event, FileStore, LogError, MemoryStore, SessionLog, Store};
pub use inbox::projection::InboxProjection;
pub use inbox::{Inbox, InboxError, ProjectionError, Target};
pub use message::{Message, MessageError, MessageKind};
