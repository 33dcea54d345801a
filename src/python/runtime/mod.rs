//! What every binding class runs on: asyncio futures completed from the core's threads
//! (`aio.rs`, woken through the self-pipe of `doorbell.rs`), the coroutine protocol of the
//! awaitables written in Rust (`coroutine.rs`), interpreter exit (`exit.rs`) and
//! the GIL released around core waits (`gil.rs`).

pub(super) mod aio;
pub(super) mod coroutine;
mod doorbell;
pub(super) mod exit;
pub(super) mod gil;
