//! One integration-test binary for the Rust core.

mod agent_loop;
mod call_decisions;
mod continuation;
mod decisions;
mod event_log;
mod file_store;
mod file_store_syncs;
mod file_store_write_through;
mod foreign_decisions;
mod fuzz_corpus;
mod in_doubt;
mod inbox;
#[cfg(feature = "postgres")]
mod postgres_distributed;
#[cfg(feature = "postgres")]
mod postgres_forks;
#[cfg(feature = "postgres")]
mod postgres_ops;
#[cfg(feature = "postgres")]
mod postgres_pool;
#[cfg(feature = "postgres")]
mod postgres_recovery;
#[cfg(feature = "postgres")]
mod postgres_renewal;
#[cfg(feature = "postgres")]
mod postgres_store;
mod projection;
mod shared_forks;
