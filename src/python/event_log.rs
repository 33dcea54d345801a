//! `Event`, `SessionLog` and the stores.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use pyo3::basic::CompareOp;
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyStopAsyncIteration, PyStopIteration, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::convert::{json_to_py, map_to_py, to_json_text, to_json_text_with_messages};
use super::errors::{log_err, not_json, report_contained};
use super::gc::Held;
use super::runtime::aio::Completion;
use super::runtime::exit::attach_unless_exiting;
use crate::event_log::{Event, LogError, SessionLog, Surface, SurfaceOp, TypeFilter, WeakSessionLog, SPLICED};

/// One committed log entry. Immutable; `data` is decoded on first access and cached.
#[pyclass(name = "Event", module = "kerman", frozen)]
pub struct PyEvent {
    pub inner: Event,
    data: OnceLock<Py<PyAny>>,
}

impl PyEvent {
    pub fn new(inner: Event) -> Self {
        PyEvent { inner, data: OnceLock::new() }
    }
}

fn surface_op_py<'py>(py: Python<'py>, event: &Event) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(match event.surface().map(|s| &s.op) {
        None => None,
        Some(SurfaceOp::Append) => Some(PyString::new(py, "append").into_any()),
        Some(SurfaceOp::Replace { start, end }) => {
            let d = PyDict::new(py);
            d.set_item("op", "replace")?;
            d.set_item("start", start)?;
            d.set_item("end", end)?;
            Some(d.into_any())
        }
    })
}

#[pymethods]
impl PyEvent {
    /// Position in the log, from 0.
    #[getter]
    fn seq(&self) -> u64 {
        self.inner.seq
    }

    /// Epoch milliseconds at append; non-decreasing within a log.
    #[getter]
    fn time(&self) -> i64 {
        self.inner.time
    }

    /// The event type, e.g. `"turn/start"`.
    #[getter(r#type)]
    fn kind(&self) -> &str {
        self.inner.kind()
    }

    /// The cached payload is a plain dict the caller may change, so it can hold a cycle back
    /// to its event. Once set it never changes, so there is nothing for `__clear__` to break.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // A std `OnceLock`, not pyo3's `PyOnceLock`: reading it needs no `Python` token, and
        // `__traverse__` is given none.
        visit.call(self.data.get())
    }

    /// The payload, decoded once and cached.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(data) = self.data.get() {
            return Ok(data.clone_ref(py));
        }
        let decoded = json_to_py(py, self.inner.data_json())?.unbind();
        // Decoding can run Python code (finalizers in a collection), so another thread may have
        // cached its decoding meanwhile: the first one cached wins, and every caller gets it.
        Ok(self.data.get_or_init(|| decoded).clone_ref(py))
    }

    /// `"append"`, `{"op": "replace", "start", "end"}`, or `None` for non-surface events.
    #[getter]
    fn surface_op<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        surface_op_py(py, &self.inner)
    }

    /// Seqs of earlier events this one cites, or `None`.
    #[getter]
    fn source_event_seqs(&self) -> Option<Vec<u64>> {
        self.inner.surface().and_then(|s| s.source_event_seqs.clone())
    }

    /// The envelope as a dict with the JSON wire names (`surfaceOp`, `sourceEventSeqs`).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.inner.to_json())
    }

    /// The record as compact JSON, exactly as stored.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyEvent>() else { return Ok(py.NotImplemented()) };
        let equal = self.inner == other.get().inner;
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> isize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.inner.seq, self.inner.time, self.inner.kind(), self.inner.data_json()).hash(&mut h);
        h.finish() as isize
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let data = self.data(py)?.bind(py).repr()?.to_string();
        let data = if data.chars().count() > 80 {
            let mut s: String = data.chars().take(79).collect();
            s.push('…');
            s
        } else {
            data
        };
        let kind = PyString::new(py, self.inner.kind()).repr()?;
        Ok(format!("Event(seq={}, type={kind}, data={data})", self.inner.seq))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::html::render(slf.as_any(), "event")
    }
}

/// A type filter: `None`, one type, or an iterable of types; each may be a pattern with `*`
/// and `?` (`"assistant/*"`), as on the command line.
pub fn types_arg(types: Option<&Bound<'_, PyAny>>) -> PyResult<Option<TypeFilter>> {
    let Some(types) = types.filter(|t| !t.is_none()) else { return Ok(None) };
    if let Ok(s) = types.extract::<String>() {
        return Ok(Some(TypeFilter::new([s])));
    }
    let mut out = Vec::new();
    for t in types.try_iter()? {
        let t = t?;
        let Ok(s) = t.extract::<String>() else {
            return Err(PyTypeError::new_err(format!("event types must be str, got {}", t.get_type().name()?)));
        };
        out.push(s);
    }
    Ok(Some(TypeFilter::new(out)))
}

fn matches(types: &Option<TypeFilter>, event: &Event) -> bool {
    types.as_ref().is_none_or(|t| t.matches(event.kind()))
}

/// A snapshot iterator over committed events (its end is fixed when it is made).
#[pyclass(name = "EventIterator", module = "kerman")]
pub struct PyEventIter {
    log: SessionLog,
    next: u64,
    stop: u64,
    types: Option<TypeFilter>,
}

#[pymethods]
impl PyEventIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> Option<PyEvent> {
        while self.next < self.stop {
            let event = self.log.get(self.next)?;
            self.next += 1;
            if matches(&self.types, &event) {
                return Some(PyEvent::new(event));
            }
        }
        None
    }

    /// The next `n` events this iterator would give, without advancing it (for its reprs).
    fn _peek(&self, n: usize) -> Vec<PyEvent> {
        let events = self.log.range_where(self.next, Some(self.stop), |e| matches(&self.types, e));
        events.into_iter().take(n).map(PyEvent::new).collect()
    }

    /// How many events are left to give (filtered by its types).
    fn _remaining(&self) -> usize {
        match &self.types {
            None => self.stop.saturating_sub(self.next) as usize,
            Some(_) => self.log.range_where(self.next, Some(self.stop), |e| matches(&self.types, e)).len(),
        }
    }

    /// `(session id, next seq, stop)`, for its reprs.
    #[getter]
    fn _position(&self) -> (String, u64, u64) {
        (self.log.id().to_string(), self.next, self.stop)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let id = PyString::new(py, self.log.id()).repr()?;
        let types = match &self.types {
            None => String::new(),
            Some(t) => format!(" types={}", pyo3::types::PyList::new(py, t.entries())?.repr()?),
        };
        Ok(format!("<EventIterator session={id} next={} stop={}{types}>", self.next, self.stop))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::html::render(slf.as_any(), "event_iterator")
    }
}

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
/// The done callback of a `_grown` future: a cancelled one (a `tail()` timed out or cancelled)
/// drops its waiter, and with it the future and its event loop, instead of leaving it in the
/// log until the next append. Holds no Python object.
#[pyclass(frozen, module = "kerman._core")]
struct ForgetWait {
    log: WeakSessionLog,
    id: u64,
}

#[pymethods]
impl ForgetWait {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0(intern!(future.py(), "cancelled"))?.is_truthy()? {
            if let Some(log) = self.log.upgrade() {
                log.forget_wait(self.id);
            }
        }
        Ok(())
    }
}

/// A future on the running loop that completes once `log` holds more than `seq` events or is
/// closed. A cancelled one gives its wait up at once (see [`ForgetWait`]).
fn grown<'py>(py: Python<'py>, log: &SessionLog, seq: u64) -> PyResult<Bound<'py, PyAny>> {
    let (completion, future) = Completion::new(py)?;
    if let Some(id) = log.wait_beyond(seq, Box::new(move || completion.deliver(Ok(())))) {
        let forget = Bound::new(py, ForgetWait { log: log.downgrade(), id })?;
        future.call_method1(intern!(py, "add_done_callback"), (forget,))?;
    }
    Ok(future)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a [`PyLogTail`] is: the events read from the log but not yet handed out, and the seq
/// the next read starts at.
struct TailState {
    /// The Python log, kept alive while the tail may still read it (as the generator it
    /// replaces kept it); let go once the tail ends.
    log: Option<Py<PySessionLog>>,
    seq: u64,
    types: Option<TypeFilter>,
    /// Read (and filtered) from the log, not yet handed out: a cancelled `__anext__` takes
    /// none of them, so none is lost.
    ready: VecDeque<Event>,
    /// The log was closed when `ready` was last filled: after `ready`, the tail ends.
    ended: bool,
}

/// What the tail has for the next `__anext__`.
enum Poll {
    Event(Event),
    /// The tail ended; the log it let go of is released by the caller, outside the lock.
    End(Option<Py<PySessionLog>>),
    /// Nothing yet: wait for `log` to grow beyond `seq`.
    Wait(SessionLog, u64),
}

/// `SessionLog.tail()`: an async iterator over the committed events from `start` (of the given
/// types), then the live ones as they commit; it ends (`StopAsyncIteration`) when the log
/// closes. A cancelled `__anext__` gives up its wait and loses nothing: the next one carries
/// on where it stopped.
#[pyclass(name = "LogTail", module = "kerman", frozen)]
pub struct PyLogTail {
    state: Mutex<TailState>,
}

impl PyLogTail {
    /// The next event if one is committed, the end if the log is closed, else what to wait for.
    fn poll(&self) -> Poll {
        let mut st = lock(&self.state);
        loop {
            if let Some(event) = st.ready.pop_front() {
                return Poll::Event(event);
            }
            let log = match (&st.log, st.ended) {
                (Some(log), false) => log.get().inner.clone(),
                _ => {
                    st.ended = true;
                    return Poll::End(st.log.take());
                }
            };
            // Read `closed` first: a closed log cannot grow, so what follows is then all of it.
            let closed = log.is_closed();
            let events = log.range(st.seq, None);
            st.seq += events.len() as u64;
            let TailState { ready, types, .. } = &mut *st;
            ready.extend(events.into_iter().filter(|e| matches(types, e)));
            st.ended = closed;
            if st.ready.is_empty() && !closed {
                return Poll::Wait(log, st.seq);
            }
        }
    }

    /// Ends the tail (`aclose`): every later `__anext__` raises `StopAsyncIteration`.
    fn finish(&self) -> Option<Py<PySessionLog>> {
        let mut st = lock(&self.state);
        st.ready.clear();
        st.ended = true;
        st.log.take()
    }
}

#[pymethods]
impl PyLogTail {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// An awaitable that gives the next event, or raises `StopAsyncIteration` at the end.
    fn __anext__(slf: &Bound<'_, Self>) -> TailStep {
        TailStep::new(slf, StepKind::Next)
    }

    /// An awaitable that ends the tail (like an async generator's `aclose`).
    fn aclose(slf: &Bound<'_, Self>) -> TailStep {
        TailStep::new(slf, StepKind::Close)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(st) = self.state.try_lock() else { return Ok(()) };
        visit.call(&st.log)
    }

    fn __clear__(&self) {
        drop(self.finish());
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (id, seq, ended) = {
            let st = lock(&self.state);
            (st.log.as_ref().map(|l| l.get().inner.id().to_string()), st.ready.front().map_or(st.seq, |e| e.seq), st.ended)
        };
        let id = match id {
            Some(id) => PyString::new(py, &id).repr()?.to_string(),
            None => "None".to_string(),
        };
        let state = if ended { "ended" } else { "live" };
        Ok(format!("<LogTail session={id} next={seq} {state}>"))
    }
}

#[derive(Clone, Copy)]
enum StepKind {
    Next,
    Close,
}

/// How an awaitable is resumed.
enum Resume<'py> {
    Send(Bound<'py, PyAny>),
    Throw(PyErr),
}

/// A `_grown` future and the iterator of its `__await__`, delegated to like `await future`.
type Wait = (Py<PyAny>, Py<PyAny>);

struct StepState {
    tail: Option<Py<PyLogTail>>,
    /// The wait it is suspended in.
    waiting: Option<Wait>,
    running: bool,
    done: bool,
}

/// What `LogTail.__anext__` and `LogTail.aclose` return: an awaitable (its own `__await__`
/// iterator) that finishes with `StopIteration(event)`, `StopAsyncIteration` or `None`.
#[pyclass(name = "LogTailStep", module = "kerman", frozen)]
pub struct TailStep {
    kind: StepKind,
    state: Mutex<StepState>,
}

/// Cancels a wait given up (a no-op for a completed future). The done callback then forgets the
/// log's waiter; a closed loop's refusal leaves it to the next append, as a dropped wait.
fn give_up(py: Python<'_>, future: &Py<PyAny>) {
    drop(future.bind(py).call_method0(intern!(py, "cancel")));
}

impl TailStep {
    fn new(tail: &Bound<'_, PyLogTail>, kind: StepKind) -> Self {
        let state = StepState { tail: Some(tail.clone().unbind()), waiting: None, running: false, done: false };
        TailStep { kind, state: Mutex::new(state) }
    }

    fn resume(&self, py: Python<'_>, resume: Resume<'_>) -> PyResult<Py<PyAny>> {
        let (tail, waiting) = {
            let mut st = lock(&self.state);
            if st.running {
                return Err(PyValueError::new_err("__anext__() already executing"));
            }
            if st.done {
                return Err(PyRuntimeError::new_err("cannot reuse already awaited __anext__()/aclose()"));
            }
            st.running = true;
            (st.tail.as_ref().map(|t| t.clone_ref(py)), st.waiting.take())
        };
        let (out, waiting) = self.step(py, tail, waiting, resume);
        let released = {
            let mut st = lock(&self.state);
            st.running = false;
            st.waiting = waiting;
            if out.is_err() {
                st.done = true;
                st.tail.take()
            } else {
                None
            }
        };
        drop(released);
        out
    }

    /// Runs until the step suspends (`Ok`: what the awaited future yields) or finishes (`Err`:
    /// `StopIteration` with the result, or the error); returns the wait it is suspended in.
    fn step(
        &self,
        py: Python<'_>,
        tail: Option<Py<PyLogTail>>,
        waiting: Option<Wait>,
        resume: Resume<'_>,
    ) -> (PyResult<Py<PyAny>>, Option<Wait>) {
        if let Some((future, iter)) = waiting {
            let iter_b = iter.bind(py);
            let sent = match resume {
                Resume::Send(value) if value.is_none() => iter_b.call_method0(intern!(py, "__next__")),
                Resume::Send(value) => iter_b.call_method1(intern!(py, "send"), (value,)),
                Resume::Throw(exc) => iter_b.call_method1(intern!(py, "throw"), (exc.into_value(py),)),
            };
            match sent {
                Ok(yielded) => return (Ok(yielded.unbind()), Some((future, iter))),
                // The future completed: the log grew or closed; read it below.
                Err(e) if e.is_instance_of::<PyStopIteration>(py) => {}
                // Cancelled (or thrown into): nothing was taken from the tail, and the wait is
                // given up, so a later `__anext__` carries on with every event.
                Err(e) => {
                    give_up(py, &future);
                    return (Err(e), None);
                }
            }
        } else if let Resume::Throw(exc) = resume {
            return (Err(exc), None);
        }
        let Some(tail) = tail else { return (Err(PyStopAsyncIteration::new_err(())), None) };
        let tail = tail.get();
        if let StepKind::Close = self.kind {
            drop(tail.finish());
            return (Err(PyStopIteration::new_err(())), None);
        }
        loop {
            match tail.poll() {
                Poll::Event(event) => {
                    let event = match Bound::new(py, PyEvent::new(event)) {
                        Ok(event) => event,
                        Err(e) => return (Err(e), None),
                    };
                    return (Err(PyStopIteration::new_err((event.unbind(),))), None);
                }
                Poll::End(log) => {
                    drop(log);
                    return (Err(PyStopAsyncIteration::new_err(())), None);
                }
                Poll::Wait(log, seq) => {
                    let waited = (|| {
                        let future = grown(py, &log, seq)?;
                        let iter = future.call_method0(intern!(py, "__await__"))?;
                        Ok::<_, PyErr>((future, iter))
                    })();
                    let (future, iter) = match waited {
                        Ok(w) => w,
                        Err(e) => return (Err(e), None),
                    };
                    match iter.call_method0(intern!(py, "__next__")) {
                        Ok(yielded) => return (Ok(yielded.unbind()), Some((future.unbind(), iter.unbind()))),
                        // Already complete (it grew meanwhile): read again.
                        Err(e) if e.is_instance_of::<PyStopIteration>(py) => continue,
                        Err(e) => {
                            give_up(py, &future.unbind());
                            return (Err(e), None);
                        }
                    }
                }
            }
        }
    }
}

#[pymethods]
impl TailStep {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.resume(py, Resume::Send(py.None().into_bound(py)))
    }

    fn send(&self, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.resume(value.py(), Resume::Send(value.clone()))
    }

    #[pyo3(signature = (typ, val=None, _tb=None))]
    fn throw(&self, typ: &Bound<'_, PyAny>, val: Option<&Bound<'_, PyAny>>, _tb: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let exc = match val.filter(|v| !v.is_none()) {
            Some(val) if typ.is_instance_of::<pyo3::types::PyType>() && !val.is_instance(typ)? => PyErr::from_value(typ.call1((val,))?),
            Some(val) if typ.is_instance_of::<pyo3::types::PyType>() => PyErr::from_value(val.clone()),
            _ => PyErr::from_value(typ.clone()),
        };
        self.resume(typ.py(), Resume::Throw(exc))
    }

    /// Gives up the wait it is suspended in, if any; the tail is left where it was.
    fn close(&self, py: Python<'_>) {
        let (waiting, tail) = {
            let mut st = lock(&self.state);
            st.done = true;
            (st.waiting.take(), st.tail.take())
        };
        if let Some((future, _)) = &waiting {
            give_up(py, future);
        }
        drop((waiting, tail));
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(st) = self.state.try_lock() else { return Ok(()) };
        visit.call(&st.tail)?;
        if let Some((future, iter)) = &st.waiting {
            visit.call(future)?;
            visit.call(iter)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        let cleared = {
            let mut st = lock(&self.state);
            (st.waiting.take(), st.tail.take())
        };
        drop(cleared);
    }
}

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
            attach_unless_exiting(|py| report_contained(py, "closing a collected SessionLog", log_err(py, e)));
        }
    }
}

fn index(len: u64, i: i64) -> Option<u64> {
    let i = if i < 0 { i + len as i64 } else { i };
    (i >= 0 && (i as u64) < len).then_some(i as u64)
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
        self.inner.len() as usize
    }

    fn __getitem__(&self, seq: i64) -> PyResult<PyEvent> {
        let len = self.inner.len();
        index(len, seq)
            .and_then(|s| self.inner.get(s))
            .map(PyEvent::new)
            .ok_or_else(|| PyIndexError::new_err(format!("seq {seq} out of range for a log of {len} events")))
    }

    fn __iter__(&self) -> PyEventIter {
        self.events(0, None, None).unwrap_or(PyEventIter { log: self.inner.clone(), next: 0, stop: 0, types: None })
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

    /// For the AgentLoop only: appends a loop-owned event (`turn/*`, `user/message`, ...).
    /// Surface types get `surfaceOp: "append"` and the given `source_event_seqs`. Top-level
    /// values of `data` may be `Message` objects (written as their JSON).
    #[pyo3(signature = (r#type, data, source_event_seqs=None))]
    fn _append_owned(
        &self,
        py: Python<'_>,
        r#type: &str,
        data: &Bound<'_, PyAny>,
        source_event_seqs: Option<Vec<u64>>,
    ) -> PyResult<PyEvent> {
        let text = to_json_text_with_messages(data, "data").map_err(|e| not_json(py, r#type, e.describe()))?;
        let surface = crate::event_log::is_surface_type(r#type).then_some(Surface { op: SurfaceOp::Append, source_event_seqs });
        self.inner.append_owned(r#type, text, surface).map(PyEvent::new).map_err(|e| log_err(py, e))
    }

    /// Whether the AgentLoop should await `flush()` before model requests and tool bodies
    /// (FileStore in `checkpoint` or `strict` mode).
    #[getter]
    fn _checkpoints(&self) -> bool {
        self.inner.checkpoints()
    }

    /// A snapshot iterator of committed events with `start <= seq < stop`, optionally only
    /// of the given type(s).
    #[pyo3(signature = (start=0, stop=None, types=None))]
    fn events(&self, start: u64, stop: Option<u64>, types: Option<&Bound<'_, PyAny>>) -> PyResult<PyEventIter> {
        let len = self.inner.len();
        Ok(PyEventIter { log: self.inner.clone(), next: start, stop: stop.unwrap_or(len).min(len), types: types_arg(types)? })
    }

    /// Only the `agent/inbox/spliced` events, from `start`.
    #[pyo3(signature = (start=0))]
    fn splices(&self, start: u64) -> PyEventIter {
        let len = self.inner.len();
        PyEventIter { log: self.inner.clone(), next: start, stop: len, types: Some(TypeFilter::new([SPLICED.to_string()])) }
    }

    /// An async iterator: committed events from `start`, then live ones; ends on close.
    #[pyo3(signature = (start=0, types=None))]
    fn tail(slf: &Bound<'_, Self>, start: u64, types: Option<&Bound<'_, PyAny>>) -> PyResult<PyLogTail> {
        let state =
            TailState { log: Some(slf.clone().unbind()), seq: start, types: types_arg(types)?, ready: VecDeque::new(), ended: false };
        Ok(PyLogTail { state: Mutex::new(state) })
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
    /// (`ReentrantAppendError`, also contained). Returns a callable that unsubscribes.
    fn subscribe(&self, callback: Py<PyAny>) -> PyResult<PyUnsubscribe> {
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
                if let Err(err) = callback.call1(py, (PyEvent::new(event.clone()),)) {
                    report_contained(py, "session log observer", err);
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

    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
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
        Ok(format!("<SessionLog id={id}{store} len={}{last} {state}>", self.inner.len()))
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
