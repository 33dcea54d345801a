//! `Inbox`: the two pending lists of a session, thread-safe.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};

use super::errors::{inbox_err, projection_err, report_contained};
use super::event_log::PySessionLog;
use super::message::{user_message_arg, wrap};
use crate::inbox::{Inbox, InboxListener, Target};
use crate::message::Message;

/// `"next-turn"` or `"next-step"`; anything else is a `ValueError` naming it.
pub fn target_arg(obj: &Bound<'_, PyAny>) -> PyResult<Target> {
    if let Ok(s) = obj.cast::<PyString>() {
        if let Some(t) = s.to_str().ok().and_then(Target::parse) {
            return Ok(t);
        }
    }
    Err(PyValueError::new_err(format!("target must be \"next-turn\" or \"next-step\", got {}", obj.repr()?)))
}

/// A splice coordinate: a Python `int` (not `bool`, not `float`), saturated to 64 bits.
fn coord_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!("{name} must be an int, got {}", obj.get_type().name()?)));
    }
    match obj.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(_) if obj.lt(0)? => Ok(i64::MIN),
        Err(_) => Ok(i64::MAX),
    }
}

fn messages_to_list<'py>(py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for m in messages {
        list.append(wrap(py, Arc::clone(m))?)?;
    }
    Ok(list)
}

pub fn messages_to_tuple<'py>(py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, messages.iter().map(|m| wrap(py, Arc::clone(m))).collect::<PyResult<Vec<_>>>()?)
}

/// The stored message as Python: the caller's own object when it passed a `UserMessage`.
fn returned<'py>(py: Python<'py>, given: &Bound<'py, PyAny>, stored: Arc<Message>) -> PyResult<Bound<'py, PyAny>> {
    if given.is_instance_of::<super::message::PyMessage>() {
        return Ok(given.clone());
    }
    wrap(py, stored)
}

/// Calls the Python notification callbacks; their failures are logged, never raised.
struct Callbacks {
    on_inserted: Option<Py<PyAny>>,
    on_discarded: Option<Py<PyAny>>,
    on_claimed: Option<Py<PyAny>>,
}

fn call(callback: &Option<Py<PyAny>>, what: &str, message: &Arc<Message>, turn: Option<u64>) {
    let Some(callback) = callback else { return };
    Python::attach(|py| {
        let result = wrap(py, Arc::clone(message)).and_then(|m| match turn {
            Some(turn) => callback.call1(py, (m, turn)),
            None => callback.call1(py, (m,)),
        });
        if let Err(err) = result {
            report_contained(py, what, err);
        }
    });
}

impl InboxListener for Callbacks {
    fn inserted(&self, message: &Arc<Message>) {
        call(&self.on_inserted, "inbox on_inserted callback", message, None);
    }

    fn discarded(&self, message: &Arc<Message>) {
        call(&self.on_discarded, "inbox on_discarded callback", message, None);
    }

    fn claimed(&self, message: &Arc<Message>, turn: u64) {
        call(&self.on_claimed, "inbox on_claimed callback", message, Some(turn));
    }
}

/// Queued user input: `next_turn` prompts and `next_step` steering/context, a projection of
/// the log's `agent/inbox/spliced` events. Every mutation logs one splice before the lists
/// change. Thread-safe.
#[pyclass(name = "Inbox", module = "kerman", frozen)]
pub struct PyInbox {
    pub inner: Inbox,
    log: Py<PySessionLog>,
}

fn callable(obj: Option<Py<PyAny>>, name: &str, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
    match obj {
        Some(o) if o.is_none(py) => Ok(None),
        Some(o) if !o.bind(py).is_callable() => Err(PyTypeError::new_err(format!("{name} must be callable"))),
        other => Ok(other),
    }
}

#[pymethods]
impl PyInbox {
    #[new]
    #[pyo3(signature = (log, on_inserted=None, on_discarded=None, on_claimed=None))]
    fn new(
        py: Python<'_>,
        log: Py<PySessionLog>,
        on_inserted: Option<Py<PyAny>>,
        on_discarded: Option<Py<PyAny>>,
        on_claimed: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let callbacks = Callbacks {
            on_inserted: callable(on_inserted, "on_inserted", py)?,
            on_discarded: callable(on_discarded, "on_discarded", py)?,
            on_claimed: callable(on_claimed, "on_claimed", py)?,
        };
        let any = callbacks.on_inserted.is_some() || callbacks.on_discarded.is_some() || callbacks.on_claimed.is_some();
        let listener: Option<Box<dyn InboxListener>> = if any { Some(Box::new(callbacks)) } else { None };
        let inner = Inbox::new(log.get().inner.clone(), listener).map_err(|e| projection_err(py, e))?;
        Ok(PyInbox { inner, log })
    }

    /// The session log this inbox projects.
    #[getter]
    fn log(&self, py: Python<'_>) -> Py<PySessionLog> {
        self.log.clone_ref(py)
    }

    /// Pending prompts, oldest first (a tuple of `UserMessage`).
    #[getter]
    fn next_turn<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        messages_to_tuple(py, &self.inner.list(Target::NextTurn))
    }

    /// Pending steering and context for the next step (a tuple of `UserMessage`).
    #[getter]
    fn next_step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        messages_to_tuple(py, &self.inner.list(Target::NextStep))
    }

    /// Whether either list holds anything.
    #[getter]
    fn has_pending(&self) -> bool {
        self.inner.has_pending()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, id: &Bound<'_, PyAny>) -> bool {
        id.extract::<String>().is_ok_and(|id| self.inner.contains(&id))
    }

    /// The pending message with this id, or `None`.
    fn get<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner.get(id).map(|m| wrap(py, m)).transpose()
    }

    /// Inserts at the end of `target`; returns the stored message.
    fn append<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, message: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (target, stored) = (target_arg(target)?, user_message_arg(message)?);
        self.inner.append(target, Arc::clone(&stored)).map_err(|e| inbox_err(py, e))?;
        returned(py, message, stored)
    }

    /// Inserts at the start of `target`; returns the stored message.
    fn prepend<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, message: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (target, stored) = (target_arg(target)?, user_message_arg(message)?);
        self.inner.prepend(target, Arc::clone(&stored)).map_err(|e| inbox_err(py, e))?;
        returned(py, message, stored)
    }

    /// Removes `delete_count` messages at `start` of `target` and inserts `inserted` there,
    /// with Python slice semantics for negative and out-of-range values. Returns the removed.
    #[pyo3(signature = (target, start, delete_count, inserted=None))]
    fn splice<'py>(
        &self,
        py: Python<'py>,
        target: &Bound<'py, PyAny>,
        start: &Bound<'py, PyAny>,
        delete_count: &Bound<'py, PyAny>,
        inserted: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let target = target_arg(target)?;
        let start = coord_arg(start, "start")?;
        let delete_count = coord_arg(delete_count, "delete_count")?;
        let mut messages = Vec::new();
        if let Some(inserted) = inserted.filter(|i| !i.is_none()) {
            if inserted.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err("inserted must be a sequence of messages, not a str"));
            }
            for item in inserted.try_iter()? {
                messages.push(user_message_arg(&item?)?);
            }
        }
        let removed = self.inner.splice(target, start, delete_count, messages).map_err(|e| inbox_err(py, e))?;
        messages_to_list(py, &removed)
    }

    /// Replaces the pending message `message_id` (in whichever list holds it) by
    /// `new_message`, which may keep or change the id. False if `message_id` is not pending.
    fn replace(&self, py: Python<'_>, message_id: &str, new_message: &Bound<'_, PyAny>) -> PyResult<bool> {
        let message = user_message_arg(new_message)?;
        self.inner.replace(message_id, message).map_err(|e| inbox_err(py, e))
    }

    /// Removes the pending message `message_id`; false if it is not pending.
    fn remove(&self, py: Python<'_>, message_id: &str) -> PyResult<bool> {
        self.inner.remove(message_id).map_err(|e| inbox_err(py, e))
    }

    /// Cancels everything pending: next-step first, then next-turn; returns them in that order.
    fn clear<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let removed = self.inner.clear().map_err(|e| inbox_err(py, e))?;
        messages_to_list(py, &removed)
    }

    /// The loop's step-boundary operation: removes all of next-step and, when `target` is
    /// `"next-turn"`, the first prompt; returns that batch (next-step items first).
    fn claim<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, turn: u64) -> PyResult<Bound<'py, PyList>> {
        let target = target_arg(target)?;
        let batch = self.inner.claim(target, turn).map_err(|e| inbox_err(py, e))?;
        messages_to_list(py, &batch)
    }

    fn __repr__(&self) -> String {
        let lists = self.inner.snapshot();
        format!("<Inbox next_turn={} next_step={}>", lists.next_turn.len(), lists.next_step.len())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInbox>()?;
    m.add("NEXT_TURN", Target::NextTurn.as_str())?;
    m.add("NEXT_STEP", Target::NextStep.as_str())?;
    Ok(())
}
