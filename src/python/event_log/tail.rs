//! `LogTail`: the committed events, then the live ones as they commit; `LogTailStep`, the
//! awaitable of one `__anext__` or `aclose`.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyGeneratorExit, PyRuntimeError, PyStopAsyncIteration, PyStopIteration, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::{PyTraverseError, PyVisit};

use super::super::runtime::aio::Completion;
use super::super::runtime::coroutine::{coroutine_methods, Coroutine, Resume};
use super::event::{handed_out, matches};
use super::PySessionLog;
use crate::event_log::{Event, SessionLog, TypeFilter, WeakSessionLog};

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
pub(super) fn grown<'py>(py: Python<'py>, log: &SessionLog, seq: u64) -> PyResult<Bound<'py, PyAny>> {
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
pub(super) struct TailState {
    /// The Python log, kept alive while the tail may still read it (as the generator it
    /// replaces kept it); let go once the tail ends.
    pub(super) log: Option<Py<PySessionLog>>,
    pub(super) seq: u64,
    pub(super) types: Option<TypeFilter>,
    /// Read (and filtered) from the log, not yet handed out: a cancelled `__anext__` takes
    /// none of them, so none is lost.
    pub(super) ready: VecDeque<Event>,
    /// The log was closed when `ready` was last filled: after `ready`, the tail ends.
    pub(super) ended: bool,
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
    pub(super) state: Mutex<TailState>,
    /// Hand out each event's typed view (`tail(view=True)`).
    pub(super) view: bool,
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
            ready.extend(events.into_iter().filter(|e| matches(types.as_ref(), e)));
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

    /// `close`: gives up the wait it is suspended in, if any; the tail is left where it was.
    fn give_up_wait(&self, py: Python<'_>) {
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

    fn resume(&self, py: Python<'_>, resume: Resume<'_>) -> PyResult<Py<PyAny>> {
        let (tail, waiting) = {
            let mut st = lock(&self.state);
            if st.running {
                return Err(PyValueError::new_err("__anext__() already executing"));
            }
            if st.done {
                return Err(match resume {
                    Resume::Throw(exc) => exc,
                    _ => PyRuntimeError::new_err("cannot reuse already awaited __anext__()/aclose()"),
                });
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
                // `close` gives the wait up without resuming it (`Coroutine::resume`).
                Resume::Close => iter_b.call_method1(intern!(py, "throw"), (PyGeneratorExit::new_err(()).into_value(py),)),
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
        } else {
            match resume {
                Resume::Throw(exc) => return (Err(exc), None),
                Resume::Close => return (Err(PyGeneratorExit::new_err(())), None),
                Resume::Send(_) => {}
            }
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
                    // `poll` let go of the tail's lock: building a view runs Python code.
                    return match handed_out(py, event, tail.view) {
                        Ok(out) => (Err(PyStopIteration::new_err((out,))), None),
                        Err(e) => (Err(e), None),
                    };
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
                        Err(e) if e.is_instance_of::<PyStopIteration>(py) => {}
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

impl Coroutine for TailStep {
    fn resume(slf: &Bound<'_, Self>, how: Resume<'_>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        match how {
            // Gives up the wait it is suspended in, if any; the tail is left where it was.
            Resume::Close => {
                slf.get().give_up_wait(py);
                Err(PyGeneratorExit::new_err(()))
            }
            how => slf.get().resume(py, how),
        }
    }
}

coroutine_methods!(awaitable TailStep {
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
});
