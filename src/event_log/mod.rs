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

pub use error::LogError;
pub use event::{inserted_ids, is_reserved_type, is_surface_type, Bulk, Event, Surface, SurfaceOp, INSTRUCTIONS, SPLICED, SURFACE_TYPES};
pub use file::{DamagedSnapshot, Durability, Fault, FaultHook, FaultPoint, FaultSite, FileStore, Recovery, RepairReport, Snapshot};
pub use filter::{is_pattern, TypeFilter};
pub use log::{
    now_ms, Backend, FlushCallback, Intake, Observer, Publishing, SessionLog, StagedInput, StagedOp, Taken, Waiter, WeakSessionLog,
};
pub use memory::MemoryStore;
pub(crate) use store::{check_id, fork_beyond, fork_header, new_header, resolve_id, run_open_hook};
pub use store::{OpenHook, Store, FORKED_FROM, FORMAT_VERSION, PLAIN_VERSION};
