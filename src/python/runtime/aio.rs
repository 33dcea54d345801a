//! Completing asyncio futures from Rust callbacks that may run on other threads.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::super::errors::log_err;
use super::doorbell::Doorbell;
use super::exit::attach_unless_exiting;
use crate::event_log::LogError;

/// Makes a completion's result on the loop thread, with the GIL (`None` when absent). Dropped
/// unrun if the future was cancelled meanwhile: what it owns must clean up in its `Drop`.
pub type Value = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Completes `future` with `None` (or what `value` makes), or with the exception `exc`, unless
/// it was cancelled or completed already.
fn resolve(future: &Bound<'_, PyAny>, exc: Option<Bound<'_, PyAny>>, value: Option<Value>) -> PyResult<()> {
    let py = future.py();
    if future.call_method0(intern!(py, "done"))?.is_truthy()? {
        return Ok(());
    }
    match (exc, value) {
        (Some(exc), _) => future.call_method1(intern!(py, "set_exception"), (exc,))?,
        (None, None) => future.call_method1(intern!(py, "set_result"), (py.None(),))?,
        (None, Some(make)) => match make(py) {
            Ok(v) => future.call_method1(intern!(py, "set_result"), (v,))?,
            Err(e) => future.call_method1(intern!(py, "set_exception"), (e.into_value(py),))?,
        },
    };
    Ok(())
}

/// One completion waiting in a [`Drain`]'s queue: everything it holds is released on the loop
/// thread, with the GIL, so writer threads never have to take it just to let go of a handle.
struct Delivered {
    future: Py<PyAny>,
    error: Option<LogError>,
    value: Option<Value>,
    /// For a `call_soon_threadsafe` drain, the loop and the drain it schedules: a doorbell's
    /// completions hold neither (a queue left undrained by a closed loop must not keep its
    /// drain, and so its pipe, alive).
    _scheduled: Option<(Py<PyAny>, Py<Drain>)>,
}

/// A drain's completions; `closed` once the drain is gone (its loop closed): what is delivered
/// then is dropped at once, with the GIL, never left in a queue nobody drains.
#[derive(Default)]
struct Pending {
    items: Vec<Delivered>,
    closed: bool,
}

type Queue = Arc<Mutex<Pending>>;

fn lock(queue: &Queue) -> MutexGuard<'_, Pending> {
    queue.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lets `stranded` go with the GIL (a writer thread must not leave Python references to be
/// released later by whoever next takes it), unless the interpreter is exiting.
fn release(stranded: Vec<Delivered>) {
    if stranded.is_empty() {
        return;
    }
    // While the interpreter exits the closure is dropped unrun: pyo3 defers those releases.
    let _ = attach_unless_exiting(move |_py| drop(stranded));
}

/// The completions of one event loop that other threads have delivered, resolved in one go on
/// the loop thread. A thread that finds the queue empty wakes the loop; the others only push.
/// The wake-up is the drain's [`Doorbell`] (a byte down a pipe the loop watches with
/// `add_reader`: no GIL on the delivering thread) or, for a loop without `add_reader`, a
/// `call_soon_threadsafe` with the GIL.
#[pyclass(frozen, weakref, module = "kerman._core")]
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
            let drain = Bound::new(py, Drain { queue: Queue::default(), bell: Some(bell) })?;
            // Proactor loops (Windows) and some third-party loops have no `add_reader`.
            if event_loop.call_method1("add_reader", (fd, &drain)).is_ok() {
                return Ok(drain);
            }
        }
        Drain::plain(py)
    }

    /// A drain woken with `call_soon_threadsafe`.
    fn plain(py: Python<'_>) -> PyResult<Bound<'_, Drain>> {
        Bound::new(py, Drain { queue: Queue::default(), bell: None })
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
        let delivered = std::mem::take(&mut lock(&self.queue).items);
        for d in delivered {
            let exc = d.error.map(|e| log_err(py, e).into_value(py).into_any().into_bound(py));
            // A failing resolve (a closed loop) leaves nobody to tell; the others still run.
            drop(resolve(d.future.bind(py), exc, d.value));
        }
        Ok(())
    }

    /// Completions delivered but not yet resolved hold their futures (and, for a
    /// `call_soon_threadsafe` drain, the loop and the drain itself).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        let Ok(queue) = self.queue.try_lock() else { return Ok(()) };
        for d in &queue.items {
            visit.call(&d.future)?;
            if let Some((event_loop, drain)) = &d._scheduled {
                visit.call(event_loop)?;
                visit.call(drain)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let stranded = std::mem::take(&mut lock(&self.queue).items);
        drop(stranded);
    }
}

impl Drop for Drain {
    /// The loop is gone (a watched drain lives as long as its `add_reader` registration): what
    /// it never drained, and whatever is delivered from now on, is dropped (here with the GIL:
    /// a drain is released by the interpreter).
    fn drop(&mut self) {
        let stranded = {
            let mut q = lock(&self.queue);
            q.closed = true;
            std::mem::take(&mut q.items)
        };
        drop(stranded);
    }
}

/// Event loop -> `(weak reference to its drain, whether it is watched)`. Weak both ways: the
/// loop's `add_reader` registration keeps a watched drain alive while the loop is open, and the
/// completions in flight keep a `call_soon_threadsafe` one. A strong value would keep the loop
/// alive through the futures in the drain's queue (a completion delivered after the loop
/// closed is never drained): every short-lived loop, and its pipe, would leak.
static DRAINS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The loop's live drain, and whether it ever got a watched one (`None`: never seen).
fn known_drain<'py>(drains: &Bound<'py, PyAny>, event_loop: &Bound<'py, PyAny>) -> (Option<Bound<'py, Drain>>, Option<bool>) {
    let Ok(entry) = drains.call_method1("get", (event_loop,)) else { return (None, None) };
    let Ok((weak, watched)) = entry.extract::<(Bound<'py, PyAny>, bool)>() else { return (None, None) };
    let drain = weak.call0().ok().and_then(|d| d.cast_into::<Drain>().ok());
    (drain, Some(watched))
}

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
        let drains =
            DRAINS.get_or_try_init(py, || py.import("weakref")?.getattr("WeakKeyDictionary")?.call0().map(Bound::unbind))?.bind(py);
        // A loop that cannot be weakly referenced gets a drain per flush: correct, not coalesced.
        let drain = match known_drain(drains, &event_loop) {
            (Some(drain), _) => drain,
            // Its watched drain went with its `add_reader` registration: the loop is closed.
            // A plain drain delivers nothing to it, and makes no pipe.
            (None, Some(true)) => Drain::plain(py)?,
            (None, watched) => {
                // Only a drain the map can name gets a pipe: one made per flush would leave a
                // watched pipe behind each time. A loop refused `add_reader` is not asked again.
                let kept = py.import("weakref")?.call_method1("ref", (&event_loop,)).is_ok();
                let drain = if kept && watched.is_none() { Drain::start(py, &event_loop)? } else { Drain::plain(py)? };
                if kept {
                    let weak = py.import("weakref")?.call_method1("ref", (&drain,))?;
                    drop(drains.set_item(&event_loop, (weak, drain.get().bell.is_some())));
                }
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

    /// The future this completes (for a holder's `__traverse__`).
    pub fn future(&self) -> &Py<PyAny> {
        &self.future
    }

    /// Delivers the outcome. May be called without the GIL, on any thread.
    pub fn deliver(self, result: Result<(), LogError>) {
        self.deliver_value(result.map(|()| None));
    }

    /// Delivers the outcome, a value made on the loop thread (`None`: `None`). May be called
    /// without the GIL, on any thread.
    pub fn deliver_value(self, result: Result<Option<Value>, LogError>) {
        let Completion { future, loop_thread, queue, wake } = self;
        let (error, value) = match result {
            Ok(value) => (None, value),
            Err(e) => (Some(e), None),
        };
        if thread::current().id() == loop_thread {
            // Completed at once, on the loop's own thread: resolve directly.
            Python::attach(|py| {
                let exc = error.map(|e| log_err(py, e).into_value(py).into_any().into_bound(py));
                drop(resolve(future.bind(py), exc, value));
                drop(future);
                drop(wake);
            });
            return;
        }
        let (event_loop, drain) = match wake {
            Wake::Bell(bell) => {
                let delivered = Delivered { future, error, value, _scheduled: None };
                let first = {
                    let mut q = lock(&queue);
                    if q.closed {
                        drop(q);
                        // Its loop closed: nobody will resolve it.
                        release(vec![delivered]);
                        return;
                    }
                    q.items.push(delivered);
                    q.items.len() == 1
                };
                if first {
                    bell.ring();
                }
                return;
            }
            Wake::Threadsafe { event_loop, drain } => (event_loop, drain),
        };
        let delivered = Delivered { future, error, value, _scheduled: Some((event_loop, drain)) };
        let delivered = {
            let mut q = lock(&queue);
            if q.items.is_empty() {
                Some(delivered)
            } else {
                q.items.push(delivered);
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
                let first = q.items.is_empty();
                q.items.push(delivered);
                first
            };
            if first && event_loop.bind(py).call_method1("call_soon_threadsafe", (drain,)).is_err() {
                // The loop is closed: nobody will drain; release what waits, with the GIL.
                let stranded = std::mem::take(&mut lock(&queue).items);
                drop(stranded);
            }
        });
    }
}
