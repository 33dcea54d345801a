//! Completing asyncio futures from Rust callbacks that may run on other threads.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::doorbell::Doorbell;
use super::errors::log_err;
use super::exit::attach_unless_exiting;
use crate::event_log::LogError;

static AIO: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub fn aio(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(AIO.get_or_try_init(py, || py.import("kerman._aio").map(Bound::unbind))?.bind(py))
}

/// One completion waiting in a [`Drain`]'s queue: everything it holds is released on the loop
/// thread, with the GIL, so writer threads never have to take it just to let go of a handle.
struct Delivered {
    future: Py<PyAny>,
    error: Option<LogError>,
    /// For a `call_soon_threadsafe` drain, the loop and the drain it schedules: a doorbell's
    /// completions hold neither (a queue left undrained by a closed loop must not keep its
    /// drain, and so its pipe, alive).
    _scheduled: Option<(Py<PyAny>, Py<Drain>)>,
}

type Queue = Arc<Mutex<Vec<Delivered>>>;

fn lock(queue: &Queue) -> MutexGuard<'_, Vec<Delivered>> {
    queue.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The completions of one event loop that other threads have delivered, resolved in one go on
/// the loop thread. A thread that finds the queue empty wakes the loop; the others only push.
/// The wake-up is the drain's [`Doorbell`] (a byte down a pipe the loop watches with
/// `add_reader`: no GIL on the delivering thread) or, for a loop without `add_reader`, a
/// `call_soon_threadsafe` with the GIL.
#[pyclass(frozen, module = "kerman._core")]
pub struct Drain {
    queue: Queue,
    bell: Option<Arc<Doorbell>>,
}

impl Drain {
    /// A drain for `event_loop`, watched through a doorbell when the loop lets us.
    fn start<'py>(py: Python<'py>, event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Drain>> {
        if let Ok(bell) = Doorbell::new() {
            let bell = Arc::new(bell);
            let fd = bell.fd();
            let drain = Bound::new(py, Drain { queue: Arc::new(Mutex::new(Vec::new())), bell: Some(bell) })?;
            // Proactor loops (Windows) and some third-party loops have no `add_reader`.
            if event_loop.call_method1("add_reader", (fd, &drain)).is_ok() {
                return Ok(drain);
            }
        }
        Drain::plain(py)
    }

    /// A drain woken with `call_soon_threadsafe`.
    fn plain(py: Python<'_>) -> PyResult<Bound<'_, Drain>> {
        Bound::new(py, Drain { queue: Arc::new(Mutex::new(Vec::new())), bell: None })
    }
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        // Empty the pipe before taking the queue: a completion pushed after the take rings
        // again, one pushed before it is in what we take.
        if let Some(bell) = &self.bell {
            bell.clear();
        }
        let delivered = std::mem::take(&mut *lock(&self.queue));
        let resolve = aio(py)?.getattr("resolve")?;
        for d in delivered {
            let exc = d.error.map(|e| log_err(py, e).into_value(py).into_any());
            // A failing resolve (a closed loop) leaves nobody to tell; the others still run.
            drop(resolve.call1((d.future, exc)));
        }
        Ok(())
    }

    /// Completions delivered but not yet resolved hold their futures (and, for a
    /// `call_soon_threadsafe` drain, the loop and the drain itself).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        let Ok(queue) = self.queue.try_lock() else { return Ok(()) };
        for d in queue.iter() {
            visit.call(&d.future)?;
            if let Some((event_loop, drain)) = &d._scheduled {
                visit.call(event_loop)?;
                visit.call(drain)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let stranded = std::mem::take(&mut *lock(&self.queue));
        drop(stranded);
    }
}

static DRAINS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A future on the running loop (a flush, a tail's wait) whose outcome can be delivered from
/// any thread through the loop's shared [`Drain`].
pub struct Completion {
    future: Py<PyAny>,
    loop_thread: ThreadId,
    queue: Queue,
    wake: Wake,
}

/// How a delivering thread wakes the loop when it finds the drain's queue empty.
enum Wake {
    Bell(Arc<Doorbell>),
    Threadsafe { event_loop: Py<PyAny>, drain: Py<Drain> },
}

impl Completion {
    /// A new future on the running loop (`RuntimeError` outside async code).
    pub fn new(py: Python<'_>) -> PyResult<(Completion, Bound<'_, PyAny>)> {
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let future = event_loop.call_method0("create_future")?;
        let drains = DRAINS.get_or_try_init(py, || py.import("weakref")?.getattr("WeakKeyDictionary")?.call0().map(Bound::unbind))?.bind(py);
        // A loop that cannot be weakly referenced gets a drain per flush: correct, not coalesced.
        let known = drains.call_method1("get", (&event_loop,)).ok().and_then(|d| d.cast_into::<Drain>().ok());
        let drain = match known {
            Some(drain) => drain,
            None => {
                // Only a drain the map can keep gets a pipe: one made per flush would leave a
                // watched pipe behind each time.
                let kept = py.import("weakref")?.call_method1("ref", (&event_loop,)).is_ok();
                let drain = if kept { Drain::start(py, &event_loop)? } else { Drain::plain(py)? };
                drop(drains.set_item(&event_loop, &drain));
                drain
            }
        };
        let queue = Arc::clone(&drain.get().queue);
        let wake = match &drain.get().bell {
            Some(bell) => Wake::Bell(Arc::clone(bell)),
            None => Wake::Threadsafe { event_loop: event_loop.unbind(), drain: drain.unbind() },
        };
        let completion = Completion { future: future.clone().unbind(), loop_thread: thread::current().id(), queue, wake };
        Ok((completion, future))
    }

    /// Delivers the outcome. May be called without the GIL, on any thread.
    pub fn deliver(self, result: Result<(), LogError>) {
        let Completion { future, loop_thread, queue, wake } = self;
        let error = result.err();
        if thread::current().id() == loop_thread {
            // Completed at once, on the loop's own thread: resolve directly.
            Python::attach(|py| {
                let result = (|| -> PyResult<()> {
                    let exc = error.map(|e| log_err(py, e).into_value(py).into_any());
                    aio(py)?.getattr("resolve")?.call1((future, exc))?;
                    Ok(())
                })();
                drop(result);
                drop(wake);
            });
            return;
        }
        let (event_loop, drain) = match wake {
            Wake::Bell(bell) => {
                let first = {
                    let mut q = lock(&queue);
                    q.push(Delivered { future, error, _scheduled: None });
                    q.len() == 1
                };
                if first {
                    bell.ring();
                }
                return;
            }
            Wake::Threadsafe { event_loop, drain } => (event_loop, drain),
        };
        let delivered = Delivered { future, error, _scheduled: Some((event_loop, drain)) };
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
            let (event_loop, drain) = match &delivered._scheduled {
                Some((event_loop, drain)) => (event_loop.clone_ref(py), drain.clone_ref(py)),
                None => return,
            };
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
