//! `SessionLog` and `Unsubscribe`; `Event` (`event.rs`), `EventIterator` (`iter.rs`) and
//! `LogTail` (`tail.rs`).

mod event;
mod iter;
mod tail;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::convert::{map_to_py, to_json_text};
use super::errors::{log_err, not_json, report_contained};
use super::gc::Held;
use super::runtime::aio::Completion;
use super::runtime::exit::attach_unless_exiting;
use crate::event_log::{Event, LogError, SessionLog, TypeFilter, SPLICED};
use event::handed_out;
pub use event::{types_arg, PyEvent};
use iter::PyEventIter;
use tail::{grown, PyLogTail, TailState};

/// Calling it removes the observer it was returned for; returns whether it was still there.
#[pyclass(name = "Unsubscribe", module = "kerman", frozen)]
pub struct PyUnsubscribe {
    log: SessionLog,
    id: u64,
    callback: Arc<Held>,
}

#[pymethods]
impl PyUnsubscribe {
    fn __call__(&self) -> bool {
        let removed = self.log.unsubscribe(self.id);
        drop(self.callback.take());
        removed
    }
}

/// The append-only log of one session.
#[pyclass(name = "SessionLog", module = "kerman", frozen, weakref)]
pub struct PySessionLog {
    pub inner: SessionLog,
    /// The Python observers this handle subscribed, visible to the collector (the core holds
    /// them as closures); ids for unsubscribing them on `__clear__`.
    observers: Mutex<Vec<(u64, Arc<Held>)>>,
    /// File and PostgreSQL logs hold a lock or a lease: dropping one open warns, the way a
    /// dropped open file does, and closes it.
    holds_session: bool,
    /// The store it came from, as its reprs name it (`FileStore('sessions')`).
    store: String,
}

impl Drop for PySessionLog {
    fn drop(&mut self) {
        if !self.holds_session || self.inner.is_closed() {
            return;
        }
        attach_unless_exiting(|py| {
            let text = format!(
                "SessionLog {:?} was not closed; it was closed when collected (its events flushed, its session released). \
                 Close it with log.close() or open it with `with store.open(id) as log:`",
                self.inner.id()
            );
            if let Err(err) =
                PyErr::warn(py, &py.get_type::<pyo3::exceptions::PyResourceWarning>(), &std::ffi::CString::new(text).unwrap_or_default(), 1)
            {
                err.write_unraisable(py, None);
            }
        });
        // A failure here was most likely reported already (a poisoned log fails its flushes),
        // but it must not pass unseen.
        if let Err(e) = self.inner.close() {
            attach_unless_exiting(|py| report_contained(py, "closing a collected SessionLog", &log_err(py, e)));
        }
    }
}

fn index(len: u64, i: i64) -> Option<u64> {
    let i = if i < 0 { i + len as i64 } else { i };
    u64::try_from(i).ok().filter(|&i| i < len)
}

#[pymethods]
impl PySessionLog {
    /// The session id.
    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// The header: `version`, `id`, `createdAt` (a fresh dict).
    #[getter]
    fn header<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        map_to_py(py, self.inner.header())
    }

    /// Whether the log was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.inner.len()).expect("the log holds its events in memory, so their count fits usize")
    }

    fn __getitem__(&self, seq: i64) -> PyResult<PyEvent> {
        let len = self.inner.len();
        index(len, seq)
            .and_then(|s| self.inner.get(s))
            .map(PyEvent::new)
            .ok_or_else(|| PyIndexError::new_err(format!("seq {seq} out of range for a log of {len} events")))
    }

    fn __iter__(&self) -> PyEventIter {
        self.events(0, None, None, false).unwrap_or(PyEventIter { log: self.inner.clone(), next: 0, stop: 0, types: None, view: false })
    }

    /// Appends a plugin event and returns it. `data` must be lossless JSON; types owned by the
    /// Inbox and the AgentLoop (`turn/*`, `step/*`, `user/message`, `assistant/*`, `tool/*`,
    /// `request/header`, `agent/inbox/spliced`) raise `ValueError`.
    #[pyo3(signature = (r#type, data))]
    fn append(&self, py: Python<'_>, r#type: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<PyEvent> {
        let kind = str_arg(r#type, "event type")?;
        let text = to_json_text(data, "data").map_err(|e| not_json(py, &kind, e.describe()))?;
        let event = self.inner.append_public(&kind, text).map_err(|e| log_err(py, e))?;
        Ok(PyEvent::new(event))
    }

    /// Whether the AgentLoop should await `flush()` before model requests and tool bodies
    /// (FileStore in `checkpoint` or `strict` mode).
    #[getter]
    fn _checkpoints(&self) -> bool {
        self.inner.checkpoints()
    }

    /// A snapshot iterator of committed events with `start <= seq < stop`, optionally only
    /// of the given type(s); with `view=True` it gives each event's typed view
    /// (`kerman.events.view`).
    #[pyo3(signature = (start=0, stop=None, types=None, *, view=false))]
    fn events(&self, start: u64, stop: Option<u64>, types: Option<&Bound<'_, PyAny>>, view: bool) -> PyResult<PyEventIter> {
        let len = self.inner.len();
        let stop = stop.unwrap_or(len).min(len);
        Ok(PyEventIter { log: self.inner.clone(), next: start, stop, types: types_arg(types)?, view })
    }

    /// Only the `agent/inbox/spliced` events, from `start`.
    #[pyo3(signature = (start=0))]
    fn splices(&self, start: u64) -> PyEventIter {
        let len = self.inner.len();
        let types = Some(TypeFilter::new([SPLICED.to_string()]));
        PyEventIter { log: self.inner.clone(), next: start, stop: len, types, view: false }
    }

    /// An async iterator: committed events from `start`, then live ones; ends on close. With
    /// `view=True` it gives each event's typed view (`kerman.events.view`).
    #[pyo3(signature = (start=0, types=None, *, view=false))]
    fn tail(slf: &Bound<'_, Self>, start: u64, types: Option<&Bound<'_, PyAny>>, view: bool) -> PyResult<PyLogTail> {
        let state =
            TailState { log: Some(slf.clone().unbind()), seq: start, types: types_arg(types)?, ready: VecDeque::new(), ended: false };
        Ok(PyLogTail { state: Mutex::new(state), view })
    }

    /// A future that completes once the log holds more than `seq` events or is closed.
    /// A cancelled future gives its wait up at once (see [`ForgetWait`]).
    fn _grown<'py>(&self, py: Python<'py>, seq: u64) -> PyResult<Bound<'py, PyAny>> {
        grown(py, &self.inner, seq)
    }

    /// How many `_grown` waits the log holds (for leak tests).
    fn _waiting(&self) -> usize {
        self.inner.waiting()
    }

    /// Registers `callback(event)`, called synchronously after each commit, in seq order.
    /// Its exceptions are logged on the `kerman` logger; it must not append to this log
    /// (`ReentrantAppendError`, also contained). With `view=True` it is given each event's typed
    /// view (`kerman.events.view`). Returns a callable that unsubscribes.
    #[pyo3(signature = (callback, *, view=false))]
    fn subscribe(&self, callback: Py<PyAny>, view: bool) -> PyResult<PyUnsubscribe> {
        Python::attach(|py| {
            if !callback.bind(py).is_callable() {
                return Err(PyTypeError::new_err("subscribe() needs a callable"));
            }
            Ok(())
        })?;
        let held = Arc::new(Held::new(callback));
        let observer = Arc::clone(&held);
        let id = self.inner.subscribe(Arc::new(move |event: &Event| {
            attach_unless_exiting(|py| {
                let Some(callback) = observer.get(py) else { return };
                let called = handed_out(py, event.clone(), view).and_then(|e| callback.call1(py, (e,)));
                if let Err(err) = called {
                    report_contained(py, "session log observer", &err);
                }
            });
        }));
        let mut observers = self.observers.lock().unwrap_or_else(PoisonError::into_inner);
        observers.retain(|(_, h)| !h.is_cleared());
        observers.push((id, Arc::clone(&held)));
        Ok(PyUnsubscribe { log: self.inner.clone(), id, callback: held })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(observers) = self.observers.try_lock() else { return Ok(()) };
        for (_, held) in observers.iter() {
            held.visit(&visit)?;
        }
        Ok(())
    }

    /// Unsubscribes this handle's observers (the collector found them only reachable from
    /// each other).
    fn __clear__(&self) {
        let observers = std::mem::take(&mut *self.observers.lock().unwrap_or_else(PoisonError::into_inner));
        let callbacks: Vec<_> = observers
            .into_iter()
            .filter_map(|(id, held)| {
                self.inner.unsubscribe(id);
                held.take()
            })
            .collect();
        drop(callbacks);
    }

    /// The durability barrier: an awaitable that completes once everything appended so far is
    /// on disk (as the store's durability mode promises), or raises `LogWriteError`.
    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (completion, future) = Completion::new(py)?;
        self.inner.flush(Box::new(move |result: Result<(), LogError>| completion.deliver(result)));
        Ok(future)
    }

    /// Flushes and closes (idempotent). Blocks until the data is on disk.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.close().map_err(|e| log_err(py, e))
    }

    /// Flushes and closes without blocking the event loop.
    fn aclose<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        event_loop.call_method1("run_in_executor", (py.None(), slf.getattr("close")?))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __aenter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let future = py.import("asyncio")?.call_method0("get_running_loop")?.call_method0("create_future")?;
        future.call_method1("set_result", (slf,))?;
        Ok(future)
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__<'py>(slf: &Bound<'py, Self>, _exc: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        // The executor future resolves to None, so exceptions propagate.
        Self::aclose(slf)
    }

    /// The conversation as it stands: the messages of `user/message`, `assistant/message` and
    /// `tool/result` in log order, each turn's ending (a `Transcript`, a snapshot).
    fn transcript(&self, py: Python<'_>) -> PyResult<super::transcript::PyTranscript> {
        let inner = crate::agent_loop::Transcript::of(&self.inner).map_err(|e| super::errors::message_err(py, e))?;
        Ok(super::transcript::PyTranscript::new(self.inner.id().to_string(), inner))
    }

    /// Whether each append reaches the session file (the OS) before `append` returns, so a
    /// killed process loses none of them; a power loss can still lose what the store has not
    /// synced yet (`flush()` waits for that). `FileStore` sessions only (`False` elsewhere).
    /// Turning it on needs no append waiting to be written: before the first append, or after
    /// `await log.flush()`.
    #[getter]
    fn write_through(&self) -> bool {
        self.inner.write_through()
    }

    #[setter(write_through)]
    fn set_write_through(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        match self.inner.set_write_through(on) {
            Ok(true) => Ok(()),
            Ok(false) if !on => Ok(()),
            Ok(false) => {
                let store = if self.store.is_empty() { "not a FileStore" } else { self.store.as_str() };
                Err(PyValueError::new_err(format!("write_through applies to FileStore sessions; this log's store is {store}")))
            }
            Err(LogError::InvalidEvent(text)) => Err(PyValueError::new_err(text)),
            Err(e) => Err(log_err(py, e)),
        }
    }

    /// The store it came from, as its reprs name it.
    #[getter]
    fn _store(&self) -> &str {
        &self.store
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let state = if self.inner.is_closed() { "closed" } else { "open" };
        let id = PyString::new(py, self.inner.id()).repr()?;
        let store = if self.store.is_empty() { String::new() } else { format!(" store={}", self.store) };
        let last = match self.inner.len().checked_sub(1).and_then(|seq| self.inner.get(seq)) {
            Some(event) => format!(" last={}", PyString::new(py, event.kind()).repr()?),
            None => String::new(),
        };
        let through = if self.inner.write_through() { " write-through" } else { "" };
        Ok(format!("<SessionLog id={id}{store} len={}{last} {state}{through}>", self.inner.len()))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::html::render(slf.as_any(), "session_log")
    }
}

/// Builds a Python `SessionLog` around a core log that holds nothing to release (a memory
/// log, a read-only follower).
pub fn wrap_log(log: SessionLog) -> PySessionLog {
    PySessionLog { inner: log, observers: Mutex::new(Vec::new()), holds_session: false, store: String::new() }
}

/// Builds a Python `SessionLog` around a log that holds its session (a file lock, a lease):
/// dropping it open warns with `ResourceWarning`, then closes it.
pub fn wrap_owned_log(log: SessionLog) -> PySessionLog {
    PySessionLog { inner: log, observers: Mutex::new(Vec::new()), holds_session: true, store: String::new() }
}

impl PySessionLog {
    /// Names the store the log came from, for its reprs.
    pub fn in_store(mut self, store: impl Into<String>) -> Self {
        self.store = store.into();
        self
    }
}

pub fn id_arg(id: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(id, "a session id").map_err(|e| {
        let py = id.py();
        if e.is_instance_of::<pyo3::exceptions::PyValueError>(py) {
            let repr = id.repr().map(|r| r.to_string()).unwrap_or_default();
            pyo3::exceptions::PyValueError::new_err(format!("invalid session id: {repr} is not valid Unicode (lone surrogate)"))
        } else {
            e
        }
    })
}

/// A `str` argument: `TypeError` for another type, `ValueError` for a str that is not valid
/// Unicode (a lone surrogate cannot be stored).
fn str_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let Ok(s) = obj.cast::<PyString>() else {
        let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(PyTypeError::new_err(format!("{what} must be a str, got {name}")));
    };
    s.to_str().map(str::to_owned).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "{what} is not valid Unicode (lone surrogate): {}",
            s.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEvent>()?;
    m.add_class::<PyEventIter>()?;
    m.add_class::<PyUnsubscribe>()?;
    m.add_class::<PySessionLog>()?;
    m.add_class::<PyLogTail>()?;
    Ok(())
}
