//! The binding layer: thin pyo3 wrappers over the core, one file (or folder: `inbox/`,
//! `agent_loop/`) per core module, and `runtime/`, what they all run on (asyncio completions,
//! interpreter exit, the GIL released around core waits).

use pyo3::prelude::*;

mod agent_loop;
mod convert;
mod errors;
mod event_log;
mod faults;
mod gc;
mod html;
mod inbox;
mod message;
mod otel;
#[cfg(feature = "postgres")]
mod pg_store;
mod reopen;
mod runtime;
mod slots;
mod store;
mod transcript;
mod waterfall;

/// `gil_used = true`: the module has only been built and tested with the GIL (see "Threads and
/// free-threaded Python" in docs/durability.md). A free-threaded interpreter re-enables the GIL
/// when it imports it, rather than run it unsupervised: the non-frozen classes (`EventIterator`,
/// `Driver`, the waterfall cursors) rely on the GIL to serialise their `&mut self` calls, and
/// the Python side of `AgentLoop` reads its state from other threads without a lock.
#[pymodule(gil_used = true)]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::blocking::set_hook(runtime::gil::release_gil_while);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", crate::event_log::FORMAT_VERSION)?;
    message::register(m)?;
    event_log::register(m)?;
    store::register(m)?;
    #[cfg(feature = "postgres")]
    pg_store::register(m)?;
    faults::register(m)?;
    runtime::exit::register(m)?;
    inbox::register(m)?;
    inbox::projection::register(m)?;
    waterfall::register(m)?;
    agent_loop::register(m)?;
    transcript::register(m)?;
    otel::register(m)?;
    Ok(())
}
