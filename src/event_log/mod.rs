//! The session log: events, the append path, and the stores that keep logs.

mod error;
mod event;
pub mod file;
mod filter;
mod log;
mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
mod publish;
pub mod storable;
mod store;

/// The crash closers belong to the loop (they write its events); stores call them on open.
pub use crate::agent_loop::close_open_turn;
pub use error::LogError;
pub use event::{is_reserved_type, is_surface_type, Event, Surface, SurfaceOp, INSTRUCTIONS, SPLICED, SURFACE_TYPES};
pub use file::{DamagedSnapshot, Durability, Fault, FaultHook, FaultPoint, FaultSite, FileStore, Recovery, RepairReport, Snapshot};
pub use filter::{is_pattern, TypeFilter};
pub use log::{
    now_ms, Backend, FlushCallback, Intake, Observer, Publishing, SessionLog, StagedInput, StagedOp, Taken, Waiter, WeakSessionLog,
};
pub use memory::MemoryStore;
pub(crate) use store::{check_id, new_header, resolve_id};
pub use store::{Store, FORMAT_VERSION};
