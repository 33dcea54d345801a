//! The binding layer: thin pyo3 wrappers over the core, one file per core module.

use pyo3::prelude::*;

mod agent_loop;
mod aio;
mod convert;
mod doorbell;
mod errors;
mod event_log;
mod exit;
mod faults;
mod gc;
mod inbox;
mod message;
#[cfg(feature = "postgres")]
mod pg_store;
mod slots;
mod store;
mod waterfall;

/// Releases the GIL around core waits on other threads (see `crate::blocking`).
fn release_gil_while(wait: &mut dyn FnMut()) {
    struct Restore(*mut pyo3::ffi::PyThreadState);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the state was saved by `PyEval_SaveThread` on this same thread.
            unsafe { pyo3::ffi::PyEval_RestoreThread(self.0) };
        }
    }
    // SAFETY: `PyGILState_Check` only reads this thread's state; when it holds the GIL we
    // release it for the duration of a pure-Rust wait and restore it before returning.
    unsafe {
        if pyo3::ffi::Py_IsInitialized() != 0 && pyo3::ffi::PyGILState_Check() == 1 {
            let _restore = Restore(pyo3::ffi::PyEval_SaveThread());
            wait();
            return;
        }
    }
    wait();
}

/// `gil_used = true`: the module has only been built and tested with the GIL (see "Threads and
/// free-threaded Python" in docs/durability.md). A free-threaded interpreter re-enables the GIL
/// when it imports it, rather than run it unsupervised: the non-frozen classes (`EventIterator`,
/// `Driver`, the waterfall cursors) rely on the GIL to serialise their `&mut self` calls, and
/// the Python side of `AgentLoop` reads its state from other threads without a lock.
#[pymodule(gil_used = true)]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::blocking::set_hook(release_gil_while);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", crate::event_log::FORMAT_VERSION)?;
    message::register(m)?;
    event_log::register(m)?;
    store::register(m)?;
    #[cfg(feature = "postgres")]
    pg_store::register(m)?;
    faults::register(m)?;
    exit::register(m)?;
    inbox::register(m)?;
    inbox::projection::register(m)?;
    waterfall::register(m)?;
    agent_loop::register(m)?;
    Ok(())
}
