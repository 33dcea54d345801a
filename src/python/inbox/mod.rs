//! `Inbox`: the two pending lists of a session, thread-safe. The cache of the queued Python
//! objects is `identity.rs`, the notification callbacks `callbacks.rs`; `projection.rs` binds
//! `InboxProjection`.

mod callbacks;
mod identity;
pub(super) mod projection;
mod transform;

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::errors::inbox_err;
use super::event_log::PySessionLog;
use super::gc::Held;
use super::message::{user_message_arg, wrap};
use crate::inbox::{Inbox, InboxError, InboxListener, Target};
use crate::message::Message;
use callbacks::{callable, Callbacks, Listener};
use identity::Wrappers;
use transform::{Hook, Transforms};

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

pub fn messages_to_tuple<'py>(py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, messages.iter().map(|m| wrap(py, Arc::clone(m))).collect::<PyResult<Vec<_>>>()?)
}

/// The stored message as Python: the caller's own object when it passed a `UserMessage`.
fn returned<'py>(given: &Bound<'py, PyAny>, stored: &Arc<Message>) -> PyResult<Bound<'py, PyAny>> {
    if given.is_instance_of::<super::message::PyMessage>() {
        return Ok(given.clone());
    }
    wrap(given.py(), Arc::clone(stored))
}

/// The object of what an insertion stored: `obj` when it is what was given, else the object
/// an insert transform returned (cached for it), or a new wrapper.
fn stored_object<'py>(
    wrappers: &Wrappers,
    obj: Bound<'py, PyAny>,
    given: &Arc<Message>,
    stored: &Arc<Message>,
) -> PyResult<Bound<'py, PyAny>> {
    if Arc::ptr_eq(given, stored) {
        return Ok(obj);
    }
    match wrappers.lookup(obj.py(), stored) {
        Some(obj) => Ok(obj),
        None => wrap(obj.py(), Arc::clone(stored)),
    }
}

/// Queued user input: `next_turn` prompts and `next_step` steering/context, a projection of
/// the log's `agent/inbox/spliced` events. Every mutation logs one splice before the lists
/// change. Thread-safe.
#[pyclass(name = "Inbox", module = "kerman", frozen, weakref)]
pub struct PyInbox {
    pub inner: Inbox,
    log: Py<PySessionLog>,
    wrappers: Arc<Wrappers>,
    callbacks: Option<Arc<Callbacks>>,
    transforms: Arc<Transforms>,
}

impl PyInbox {
    /// Inserts one message with `insert`, its Python object cached first (see
    /// [`Wrappers::precache`]); returns that object.
    fn insert_one<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
        stored: &Arc<Message>,
        insert: impl FnOnce(&Inbox, Arc<Message>) -> Result<crate::inbox::Spliced, crate::inbox::InboxError>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let obj = returned(message, stored)?;
        let previous = self.wrappers.precache(stored, &obj);
        let spliced = match insert(&self.inner, Arc::clone(stored)) {
            Ok(spliced) => spliced,
            Err(e) => {
                self.wrappers.restore(stored, previous);
                return Err(inbox_err(py, e));
            }
        };
        drop(previous);
        let obj = match spliced.inserted.first() {
            Some(inserted) if !Arc::ptr_eq(inserted, stored) => {
                // An insert transform rewrote it: the given message is not pending.
                self.wrappers.forget(stored);
                stored_object(&self.wrappers, obj, stored, inserted)?
            }
            _ => obj,
        };
        self.wrappers.prune_if_large(&self.inner);
        Ok(obj)
    }
}

impl PyInbox {
    /// The Python objects of a batch the loop claimed (the ones that were inserted, where
    /// cached), as a new list; the cache forgets them.
    pub(crate) fn claimed_objects<'py>(&self, py: Python<'py>, batch: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
        self.wrappers.taken(py, batch)
    }

    /// The objects of messages just inserted by the core (a requeue), cached as theirs.
    pub(crate) fn pending_objects<'py>(&self, py: Python<'py>, messages: &[Arc<Message>]) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for message in messages {
            out.append(self.wrappers.pending(py, &self.inner, message)?)?;
        }
        Ok(out)
    }
}

#[pymethods]
impl PyInbox {
    #[new]
    #[pyo3(signature = (log, on_inserted=None, on_discarded=None, on_claimed=None, *, _gates=None, _on_remote=None, _on_remote_cancel=None, _on_remote_requeue=None, _on_remote_decide=None, _on_remote_resolve=None))]
    // The Python constructor's keyword arguments, one each.
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        log: Py<PySessionLog>,
        on_inserted: Option<Py<PyAny>>,
        on_discarded: Option<Py<PyAny>>,
        on_claimed: Option<Py<PyAny>>,
        _gates: Option<(Py<PyList>, Py<PyList>, Py<PyList>)>,
        _on_remote: Option<Py<PyAny>>,
        _on_remote_cancel: Option<Py<PyAny>>,
        _on_remote_requeue: Option<Py<PyAny>>,
        _on_remote_decide: Option<Py<PyAny>>,
        _on_remote_resolve: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let wrappers = Arc::new(Wrappers::default());
        let callbacks = Callbacks {
            on_inserted: callable(on_inserted, "on_inserted", py)?,
            on_discarded: callable(on_discarded, "on_discarded", py)?,
            on_claimed: callable(on_claimed, "on_claimed", py)?,
            on_remote: callable(_on_remote, "_on_remote", py)?,
            on_remote_cancel: callable(_on_remote_cancel, "_on_remote_cancel", py)?,
            on_remote_requeue: callable(_on_remote_requeue, "_on_remote_requeue", py)?,
            on_remote_decide: callable(_on_remote_decide, "_on_remote_decide", py)?,
            on_remote_resolve: callable(_on_remote_resolve, "_on_remote_resolve", py)?,
            gates: _gates.map(|(a, b, c)| [Held::new(a), Held::new(b), Held::new(c)]),
            wrappers: Arc::clone(&wrappers),
        };
        let any = callbacks.held().next().is_some();
        let callbacks = any.then(|| Arc::new(callbacks));
        let listener = || callbacks.as_ref().map(|c| Box::new(Listener(Arc::clone(c))) as Box<dyn InboxListener>);
        let transforms = Arc::new(Transforms::new(Arc::clone(&wrappers)));
        let hook = || Some(Box::new(Hook(Arc::clone(&transforms))) as Box<dyn crate::inbox::InsertHook>);
        let core = log.get().inner.clone();
        let inner = match Inbox::with_hook(core.clone(), listener(), hook()) {
            // The open inbox may be garbage the collector has not reached yet (a notebook
            // re-creating its AgentLoop, whose callbacks make a cycle): collect once, retry.
            Err(InboxError::Attached(_)) => {
                py.import("gc")?.call_method0("collect")?;
                Inbox::with_hook(core, listener(), hook())
            }
            other => other,
        };
        let inner = inner.map_err(|e| inbox_err(py, e))?;
        Ok(PyInbox { inner, log, wrappers, callbacks, transforms })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.log)?;
        if let Some(callbacks) = &self.callbacks {
            callbacks.visit(&visit)?;
        }
        self.transforms.visit(&visit)?;
        self.wrappers.visit(&visit)
    }

    /// Drops the callbacks and the cached message objects: the collector found the inbox
    /// only reachable from them. The pending messages themselves stay.
    fn __clear__(&self) {
        if let Some(callbacks) = &self.callbacks {
            callbacks.clear();
        }
        self.transforms.clear();
        self.wrappers.clear();
    }

    /// Registers an insert transform, `transform(message: UserMessage, target: str) -> UserMessage |
    /// kerman.Refuse`, which every new message passes before its splice is planned (also
    /// usable as a decorator: `@inbox.on_insert`). Returns `transform`.
    #[pyo3(signature = (transform=None, *, prepend=false))]
    fn on_insert<'py>(slf: &Bound<'py, Self>, transform: Option<&Bound<'py, PyAny>>, prepend: bool) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let Some(f) = transform.filter(|f| !f.is_none()) else {
            let inbox = slf.clone().unbind();
            let register = move |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, pyo3::types::PyDict>>| -> PyResult<Py<PyAny>> {
                let f = args.get_item(0)?;
                inbox.bind(args.py()).get().transforms.add(&f, prepend)?;
                Ok(f.unbind())
            };
            return Ok(pyo3::types::PyCFunction::new_closure(py, Some(c"on_insert"), None, register)?.into_any());
        };
        slf.get().transforms.add(f, prepend)?;
        Ok(f.clone())
    }

    /// Removes an insert transform; false if it was not registered.
    fn remove_transform(&self, transform: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.transforms.remove(transform)
    }

    /// The insert transforms, in the order they run.
    #[getter]
    fn transforms<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.transforms.snapshot(py))
    }

    /// Stops projecting the log: later mutations raise `InboxError`, and another `Inbox` (or
    /// `AgentLoop`) may be created over the log. Idempotent; the lists stay readable.
    fn close(&self) {
        self.inner.close();
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The session log this inbox projects.
    #[getter]
    fn log(&self, py: Python<'_>) -> Py<PySessionLog> {
        self.log.clone_ref(py)
    }

    /// Pending prompts, oldest first (a tuple of `UserMessage`).
    #[getter]
    fn next_turn<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.wrappers.tuple(py, &self.inner, &self.inner.list(Target::NextTurn))
    }

    /// Pending steering and context for the next step (a tuple of `UserMessage`).
    #[getter]
    fn next_step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.wrappers.tuple(py, &self.inner, &self.inner.list(Target::NextStep))
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
        self.inner.get(id).map(|m| self.wrappers.pending(py, &self.inner, &m)).transpose()
    }

    /// Inserts at the end of `target`; returns the stored message.
    fn append<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, message: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (target, stored) = (target_arg(target)?, user_message_arg(message)?);
        self.insert_one(py, message, &stored, |inbox, m| inbox.insert(target, i64::MAX, 0, vec![m]))
    }

    /// Inserts at the start of `target`; returns the stored message.
    fn prepend<'py>(&self, py: Python<'py>, target: &Bound<'py, PyAny>, message: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let (target, stored) = (target_arg(target)?, user_message_arg(message)?);
        self.insert_one(py, message, &stored, |inbox, m| inbox.insert(target, 0, 0, vec![m]))
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
        let mut objects = Vec::new();
        if let Some(inserted) = inserted.filter(|i| !i.is_none()) {
            if inserted.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err("inserted must be a sequence of messages, not a str"));
            }
            for item in inserted.try_iter()? {
                let item = item?;
                messages.push(user_message_arg(&item)?);
                objects.push(item);
            }
        }
        let is_message = |o: &&Bound<'py, PyAny>| o.is_instance_of::<super::message::PyMessage>();
        let given: Vec<_> = messages.iter().zip(&objects).filter(|(_, o)| is_message(o)).collect();
        let previous: Vec<_> = given.iter().map(|(stored, obj)| self.wrappers.precache(stored, obj)).collect();
        let (removed, inserted) = match self.inner.insert(target, start, delete_count, messages.clone()) {
            Ok(spliced) => (spliced.removed, spliced.inserted),
            Err(e) => {
                // Undone in reverse, so a message given twice gets its first displaced entry back.
                for ((stored, _), prev) in given.iter().zip(previous).rev() {
                    self.wrappers.restore(stored, prev);
                }
                return Err(inbox_err(py, e));
            }
        };
        drop(previous);
        // Messages an insert transform rewrote are not pending as given.
        for (stored, _) in given.iter().filter(|(stored, _)| !inserted.iter().any(|i| Arc::ptr_eq(i, stored))) {
            self.wrappers.forget(stored);
        }
        let out = self.wrappers.taken(py, &removed)?;
        // A message both removed and inserted again by this splice keeps its object.
        for (stored, obj) in given.iter().filter(|(stored, _)| removed.iter().any(|r| Arc::ptr_eq(r, stored))) {
            drop(self.wrappers.precache(stored, obj));
        }
        self.wrappers.prune_if_large(&self.inner);
        Ok(out)
    }

    /// Replaces the pending message `message_id` (in whichever list holds it) by
    /// `new_message`, which may keep or change the id. False if `message_id` is not pending.
    fn replace(&self, py: Python<'_>, message_id: &str, new_message: &Bound<'_, PyAny>) -> PyResult<bool> {
        let message = user_message_arg(new_message)?;
        let given = new_message.is_instance_of::<super::message::PyMessage>();
        let previous = given.then(|| self.wrappers.precache(&message, new_message));
        let replaced = match self.inner.replace_admitted(message_id, Arc::clone(&message)) {
            Ok(Some((replaced, inserted))) => {
                if !Arc::ptr_eq(&inserted, &message) {
                    self.wrappers.forget(&message); // rewritten by an insert transform
                }
                replaced
            }
            outcome => {
                if let Some(previous) = previous {
                    self.wrappers.restore(&message, previous);
                }
                return outcome.map(|_| false).map_err(|e| inbox_err(py, e));
            }
        };
        drop(previous);
        if !Arc::ptr_eq(&replaced, &message) {
            self.wrappers.forget(&replaced);
        }
        self.wrappers.prune_if_large(&self.inner);
        Ok(true)
    }

    /// Removes the pending message `message_id`; false if it is not pending.
    fn remove(&self, py: Python<'_>, message_id: &str) -> PyResult<bool> {
        let removed = self.inner.remove_message(message_id).map_err(|e| inbox_err(py, e))?;
        let Some(removed) = removed else { return Ok(false) };
        self.wrappers.forget(&removed);
        Ok(true)
    }

    /// Cancels everything pending: next-step first, then next-turn; returns them in that order.
    fn clear<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let removed = self.inner.clear().map_err(|e| inbox_err(py, e))?;
        self.wrappers.taken(py, &removed)
    }

    /// The loop's step-boundary operation: removes all of next-step and, when `target` is
    /// `"next-turn"`, the first prompt; returns that batch (next-step items first). `by` (a
    /// JSON-able dict) names the claimant when a loop other than Kerman's claims (a
    /// framework's, under `KermanDurability`): each claiming splice carries it, so the claim and
    /// the record of what it was for are one append.
    #[pyo3(signature = (target, turn, *, by=None))]
    pub(crate) fn claim<'py>(
        &self,
        py: Python<'py>,
        target: &Bound<'py, PyAny>,
        turn: u64,
        by: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let target = target_arg(target)?;
        let batch = match by.filter(|by| !by.is_none()) {
            None => self.inner.claim(target, turn),
            Some(by) => {
                if !by.is_instance_of::<pyo3::types::PyDict>() {
                    return Err(PyTypeError::new_err(format!("by must be a dict (the claimant), got {}", by.repr()?)));
                }
                let value = super::convert::to_value(by, "by").map_err(|e| PyTypeError::new_err(e.describe()))?;
                self.inner.claim_by(target, turn, Some(&value))
            }
        };
        self.wrappers.taken(py, &batch.map_err(|e| inbox_err(py, e))?)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let lists = self.inner.snapshot();
        let session = pyo3::types::PyString::new(py, self.log.get().inner.id()).repr()?;
        let closed = if self.inner.is_closed() { " closed" } else { "" };
        Ok(format!("<Inbox session={session} next_turn={} next_step={}{closed}>", lists.next_turn().len(), lists.next_step().len()))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::html::render(slf.as_any(), "inbox")
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInbox>()?;
    m.add("NEXT_TURN", Target::NextTurn.as_str())?;
    m.add("NEXT_STEP", Target::NextStep.as_str())?;
    Ok(())
}
