//! Completing asyncio futures from Rust callbacks that may run on other threads.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::errors::log_err;
use super::exit::attach_unless_exiting;
use crate::event_log::LogError;

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

/// One completion waiting in a [`Drain`]'s queue: everything it holds is released on the loop
/// thread, with the GIL, so writer threads never have to take it just to let go of a handle.
struct Delivered {
    future: Py<PyAny>,
    error: Option<LogError>,
    _event_loop: Py<PyAny>,
    _drain: Py<Drain>,
}

type Queue = Arc<Mutex<Vec<Delivered>>>;

fn lock(queue: &Queue) -> MutexGuard<'_, Vec<Delivered>> {
    queue.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The completions of one event loop that other threads have delivered, resolved in one go on
/// the loop thread. A thread that finds the queue empty schedules the drain (one
/// `call_soon_threadsafe`, with the GIL); the others only push, without the GIL.
#[pyclass(frozen, module = "kerman._core")]
pub struct Drain {
    queue: Queue,
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let delivered = std::mem::take(&mut *lock(&self.queue));
        let resolve = aio(py)?.getattr("resolve")?;
        for d in delivered {
            let exc = d.error.map(|e| log_err(py, e).into_value(py).into_any());
            // A failing resolve (a closed loop) leaves nobody to tell; the others still run.
            drop(resolve.call1((d.future, exc)));
        }
        Ok(())
    }
}

static DRAINS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A flush future on the running loop whose result can be delivered from any thread through
/// the loop's shared [`Drain`].
pub struct FlushCompletion {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
    loop_thread: ThreadId,
    drain: Py<Drain>,
    queue: Queue,
}

impl FlushCompletion {
    /// A new future on the running loop (`RuntimeError` outside async code).
    pub fn new(py: Python<'_>) -> PyResult<(FlushCompletion, Bound<'_, PyAny>)> {
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let future = event_loop.call_method0("create_future")?;
        let drains = DRAINS.get_or_try_init(py, || py.import("weakref")?.getattr("WeakKeyDictionary")?.call0().map(Bound::unbind))?.bind(py);
        // A loop that cannot be weakly referenced gets a drain per flush: correct, not coalesced.
        let known = drains.call_method1("get", (&event_loop,)).ok().and_then(|d| d.cast_into::<Drain>().ok());
        let drain = match known {
            Some(drain) => drain,
            None => {
                let drain = Bound::new(py, Drain { queue: Arc::new(Mutex::new(Vec::new())) })?;
                drop(drains.set_item(&event_loop, &drain));
                drain
            }
        };
        let queue = Arc::clone(&drain.get().queue);
        let completion = FlushCompletion {
            event_loop: event_loop.unbind(),
            future: future.clone().unbind(),
            loop_thread: thread::current().id(),
            drain: drain.unbind(),
            queue,
        };
        Ok((completion, future))
    }

    /// Delivers the outcome. May be called without the GIL, on any thread.
    pub fn deliver(self, result: Result<(), LogError>) {
        let FlushCompletion { event_loop, future, loop_thread, drain, queue } = self;
        let delivered = Delivered { future, error: result.err(), _event_loop: event_loop, _drain: drain };
        if thread::current().id() == loop_thread {
            // Completed at once, on the loop's own thread: resolve directly.
            Python::attach(|py| {
                let result = (|| -> PyResult<()> {
                    let exc = delivered.error.map(|e| log_err(py, e).into_value(py).into_any());
                    aio(py)?.getattr("resolve")?.call1((delivered.future, exc))?;
                    Ok(())
                })();
                drop(result);
                drop((delivered._event_loop, delivered._drain));
            });
            return;
        }
        let delivered = {
            let mut q = lock(&queue);
            if q.is_empty() {
                Some(delivered)
            } else {
                q.push(delivered);
                None
            }
        };
        let Some(delivered) = delivered else { return };
        // From the writer or reply thread: never while the interpreter exits (`exit.rs`).
        attach_unless_exiting(|py| {
            let event_loop = delivered._event_loop.clone_ref(py);
            let drain = delivered._drain.clone_ref(py);
            let first = {
                let mut q = lock(&queue);
                let first = q.is_empty();
                q.push(delivered);
                first
            };
            if first && event_loop.bind(py).call_method1("call_soon_threadsafe", (drain,)).is_err() {
                // The loop is closed: nobody will drain; release what waits, with the GIL.
                let stranded = std::mem::take(&mut *lock(&queue));
                drop(stranded);
            }
        });
    }
}
