//! Insertion transforms: the Python functions every new message passes before its splice is
//! planned (`Inbox.on_insert`, `AgentLoop.on_insert`). The core calls [`Hook::admit`] with no
//! lock held; each transform gets `(message, target)` and returns the message to insert (the
//! same one, or a rewrite keeping its id) or a `kerman.Refuse(reason)`. A refusal, an exception
//! or a wrong return value refuses the whole insertion, as an exception for the caller.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};
use pyo3::{PyTraverseError, PyVisit};

use super::super::errors::{new_err, report_contained};
use super::super::message::{wrap, PyMessage};
use super::super::runtime::exit::attach_unless_exiting;
use super::super::slots::has_await;
use super::identity::Wrappers;
use crate::inbox::{InsertHook, Refusal, Target};
use crate::message::{Message, MessageKind};

static REFUSE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn refuse_class(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    Ok(REFUSE
        .get_or_try_init(py, || -> PyResult<_> { Ok(py.import("kerman.types")?.getattr("Refuse")?.cast_into::<PyType>()?.unbind()) })?
        .bind(py))
}

/// The registered transforms, shared by the inbox (which visits and clears them) and the
/// core's hook.
#[derive(Default)]
pub(super) struct Transforms {
    list: Mutex<Vec<Py<PyAny>>>,
    /// `list.len()`, read without the lock: an inbox without transforms calls no Python.
    count: AtomicUsize,
    wrappers: Arc<Wrappers>,
}

/// A transform's name in errors: its qualified name, or its repr.
fn name_of(f: &Bound<'_, PyAny>) -> String {
    if let Ok(Some(name)) = f.getattr_opt(intern!(f.py(), "__qualname__")) {
        if let Ok(name) = name.extract::<String>() {
            return name;
        }
    }
    f.repr().map_or_else(|_| "<transform>".to_owned(), |r| r.to_string())
}

fn refusal(err: PyErr) -> Refusal {
    Refusal { detail: err.to_string(), cause: Some(Box::new(err)) }
}

impl Transforms {
    pub(super) fn new(wrappers: Arc<Wrappers>) -> Transforms {
        Transforms { wrappers, ..Transforms::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Py<PyAny>>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new reference to each transform, in order (the lock is released before any runs).
    pub(super) fn snapshot(&self, py: Python<'_>) -> Vec<Py<PyAny>> {
        self.lock().iter().map(|f| f.clone_ref(py)).collect()
    }

    fn position(&self, py: Python<'_>, f: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        for (i, g) in self.snapshot(py).iter().enumerate() {
            if g.bind(py).is(f) || g.bind(py).eq(f)? {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    pub(super) fn add(&self, f: &Bound<'_, PyAny>, prepend: bool) -> PyResult<()> {
        let py = f.py();
        if !f.is_callable() {
            return Err(PyTypeError::new_err(format!("an insert transform must be callable, got {}", f.get_type().name()?)));
        }
        if self.position(py, f)?.is_some() {
            return Err(PyValueError::new_err(format!("insert transform {} is already registered", name_of(f))));
        }
        let mut list = self.lock();
        if prepend {
            list.insert(0, f.clone().unbind());
        } else {
            list.push(f.clone().unbind());
        }
        self.count.store(list.len(), Ordering::Release);
        Ok(())
    }

    pub(super) fn remove(&self, f: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = f.py();
        // Compared outside the lock (`==` may run Python); removed by identity under it.
        let Some(at) = self.position(py, f)? else { return Ok(false) };
        let Some(found) = self.snapshot(py).into_iter().nth(at) else { return Ok(false) };
        let removed = {
            let mut list = self.lock();
            let removed = list.iter().position(|g| g.is(&found)).map(|i| list.remove(i));
            self.count.store(list.len(), Ordering::Release);
            removed
        };
        Ok(removed.is_some())
    }

    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(list) = self.list.try_lock() else { return Ok(()) };
        for f in list.iter() {
            visit.call(f)?;
        }
        Ok(())
    }

    pub(super) fn clear(&self) {
        let taken = std::mem::take(&mut *self.lock());
        self.count.store(0, Ordering::Release);
        drop(taken);
    }

    /// Runs every transform on `message`; the message to insert, or why not.
    fn run(&self, py: Python<'_>, target: Target, message: Arc<Message>) -> Result<Arc<Message>, Refusal> {
        let transforms = self.snapshot(py);
        let original = match self.wrappers.lookup(py, &message) {
            Some(obj) => obj,
            None => wrap(py, Arc::clone(&message)).map_err(refusal)?,
        };
        let mut current = original.clone();
        let target_name = PyString::new(py, target.as_str());
        for f in &transforms {
            let f = f.bind(py);
            let returned = f.call1((&current, &target_name)).map_err(refusal)?;
            current = self.read(f, &current, returned, target).map_err(refusal)?;
        }
        if current.is(&original) {
            return Ok(message);
        }
        let rewritten = Arc::clone(&current.cast::<PyMessage>().map_err(|e| refusal(e.into()))?.get().inner);
        // The transform's object is what the caller, the listeners and the lists hand back.
        drop(self.wrappers.precache(&rewritten, &current));
        Ok(rewritten)
    }

    /// What transform `f` returned for `message`: the message to go on with, or the error to
    /// refuse with (`InsertRefusedError` for a `Refuse`).
    fn read<'py>(
        &self,
        f: &Bound<'py, PyAny>,
        message: &Bound<'py, PyAny>,
        returned: Bound<'py, PyAny>,
        target: Target,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = f.py();
        let id = message.cast::<PyMessage>()?.get().inner.id().to_owned();
        if let Ok(rewritten) = returned.cast::<PyMessage>() {
            let inner = &rewritten.get().inner;
            if inner.kind() != MessageKind::User {
                return Err(PyTypeError::new_err(format!(
                    "insert transform {} returned a {} message for \"{id}\"; expected a UserMessage or kerman.Refuse",
                    name_of(f),
                    inner.role()
                )));
            }
            if inner.id() != id {
                return Err(PyValueError::new_err(format!(
                    "insert transform {} changed the id of message \"{id}\" to \"{}\"; a rewrite keeps the id (message.with_content(...))",
                    name_of(f),
                    inner.id()
                )));
            }
            return Ok(returned);
        }
        if returned.is_instance(refuse_class(py)?)? {
            let reason = returned.getattr(intern!(py, "reason"))?;
            let name = name_of(f);
            let text = format!("insert transform {name} refused message \"{id}\" ({}): {reason}", target.as_str());
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("transform", &name)?;
            kwargs.set_item("reason", &reason)?;
            kwargs.set_item("message_id", &id)?;
            kwargs.set_item("target", target.as_str())?;
            let cls = py.import("kerman.errors")?.getattr("InsertRefusedError")?;
            return Err(PyErr::from_value(cls.call((text,), Some(&kwargs))?));
        }
        if has_await(&returned) {
            // Closed, so an un-awaited coroutine does not warn on top of the error.
            if let Ok(Some(close)) = returned.getattr_opt(intern!(py, "close")) {
                let _ = close.call0();
            }
            return Err(PyTypeError::new_err(format!(
                "insert transform {} returned an awaitable; transforms run inside the inserting call and must be plain functions (def, not async def)",
                name_of(f)
            )));
        }
        let shown = returned.repr().map_or_else(|_| "<unrepresentable value>".to_owned(), |r| r.to_string());
        Err(PyTypeError::new_err(format!("insert transform {} returned {shown}; expected a UserMessage or kerman.Refuse", name_of(f))))
    }
}

/// The core's view of the transforms.
pub(super) struct Hook(pub(super) Arc<Transforms>);

impl InsertHook for Hook {
    fn active(&self) -> bool {
        self.0.count.load(Ordering::Acquire) > 0
    }

    fn admit(&self, target: Target, message: Arc<Message>) -> Result<Arc<Message>, Refusal> {
        if !self.active() {
            return Ok(message);
        }
        attach_unless_exiting(|py| self.0.run(py, target, message))
            .unwrap_or_else(|| Err(Refusal::new("the interpreter is exiting: insert transforms cannot run, so nothing is inserted")))
    }

    fn dropped(&self, message: &Arc<Message>, refusal: Refusal) {
        attach_unless_exiting(|py| {
            let err = match refusal.cause.and_then(|c| c.downcast::<PyErr>().ok()) {
                Some(err) => *err,
                None => new_err(py, "InsertRefusedError", (refusal.detail,)),
            };
            let what = format!("message \"{}\" enqueued by another process was dropped: its insert transform", message.id());
            report_contained(py, &what, &err);
        });
    }
}
