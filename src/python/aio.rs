//! Completing asyncio futures from Rust callbacks that may run on other threads.

use std::thread::{self, ThreadId};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static AIO: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub fn aio(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(AIO.get_or_try_init(py, || py.import("kerman._aio").map(Bound::unbind))?.bind(py))
}

/// A future on the running event loop, and how to complete it from any thread.
pub struct Completion {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
    loop_thread: ThreadId,
}

impl Completion {
    /// A new future on the running loop (`RuntimeError` outside async code).
    pub fn new(py: Python<'_>) -> PyResult<(Completion, Bound<'_, PyAny>)> {
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let future = event_loop.call_method0("create_future")?;
        let completion = Completion {
            event_loop: event_loop.unbind(),
            future: future.clone().unbind(),
            loop_thread: thread::current().id(),
        };
        Ok((completion, future))
    }

    /// Completes the future (with `error` if given). On the loop's own thread this is direct;
    /// from any other thread it goes through `call_soon_threadsafe`.
    pub fn complete(self, py: Python<'_>, error: Option<PyErr>) {
        let exc = error.map(|e| e.into_value(py).into_any());
        let result = (|| -> PyResult<()> {
            let resolve = aio(py)?.getattr("resolve")?;
            if thread::current().id() == self.loop_thread {
                resolve.call1((self.future, exc))?;
            } else {
                self.event_loop.bind(py).call_method1("call_soon_threadsafe", (resolve, self.future, exc))?;
            }
            Ok(())
        })();
        // The loop may be closed by now; nobody is left to tell.
        drop(result);
    }
}
