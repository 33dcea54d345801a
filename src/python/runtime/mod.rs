//! What every binding class runs on: asyncio futures completed from the core's threads
//! (`aio.rs`, woken through the self-pipe of `doorbell.rs`), interpreter exit (`exit.rs`) and
//! the GIL released around core waits (`gil.rs`).

pub(super) mod aio;
mod doorbell;
pub(super) mod exit;
pub(super) mod gil;
