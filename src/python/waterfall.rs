//! `Next`: the `next()` callable handed to waterfall listeners, over the core cursor.

use std::sync::Mutex;

use pyo3::exceptions::{PyGeneratorExit, PyStopIteration, PySystemError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use super::runtime::coroutine::{coroutine_methods, Coroutine, Resume};
use crate::agent_loop::waterfall::{Cursor, Pull};

/// An awaitable that is already complete (for sync listeners and the default).
#[pyclass(name = "Ready", module = "kerman")]
pub struct PyReady {
    value: Option<Py<PyAny>>,
}

impl Coroutine for PyReady {
    /// Finishes with its value at the first step; a throw or a close drops the value.
    fn resume(slf: &Bound<'_, Self>, how: Resume<'_>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let value = slf.try_borrow_mut()?.value.take();
        match how {
            Resume::Send(_) => Err(PyStopIteration::new_err((value.unwrap_or_else(|| py.None()),))),
            Resume::Throw(exc) => Err(exc),
            Resume::Close => Err(PyGeneratorExit::new_err(())),
        }
    }
}

coroutine_methods!(awaitable PyReady {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.value)
    }

    fn __clear__(&mut self) {
        self.value = None;
    }
});

/// `Ready`'s `am_send` slot, which `await` (CPython's `SEND`) and `PyIter_Send` consult before
/// `__next__`: the value comes back as a return, with no `StopIteration` made for it (an
/// exception object per `await next()` of every waterfall's default, otherwise). What it does
/// is `resume(Send)`'s: the value once, then `None`.
unsafe extern "C" fn ready_send(
    iter: *mut ffi::PyObject,
    _value: *mut ffi::PyObject,
    result: *mut *mut ffi::PyObject,
) -> ffi::PySendResult {
    // SAFETY: CPython calls a slot with the GIL held, `iter` a live object of the slot's type.
    let py = unsafe { Python::assume_attached() };
    let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `iter` is a borrowed reference to a live object, for this call.
        let iter = unsafe { Bound::from_borrowed_ptr(py, iter) };
        let ready = iter.cast::<PyReady>().map_err(PyErr::from)?;
        let value = ready.try_borrow_mut()?.value.take();
        Ok::<_, PyErr>(value.unwrap_or_else(|| py.None()))
    }));
    match taken {
        Ok(Ok(value)) => {
            // SAFETY: `result` is the caller's out-pointer; it takes the new reference.
            unsafe { *result = value.into_ptr() };
            ffi::PySendResult::PYGEN_RETURN
        }
        Ok(Err(e)) => {
            e.restore(py);
            ffi::PySendResult::PYGEN_ERROR
        }
        Err(_) => {
            PySystemError::new_err("Ready's send panicked").restore(py);
            ffi::PySendResult::PYGEN_ERROR
        }
    }
}

fn awaitable(value: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    let py = value.py();
    if super::slots::has_await(&value) {
        return Ok(value);
    }
    Ok(Bound::new(py, PyReady { value: Some(value.unbind()) })?.into_any())
}

/// The `next()` of one waterfall dispatch: calling it runs the next remaining listener with
/// the shared payload (or, once none remain, the default) and returns an awaitable of its
/// result.
#[pyclass(name = "Next", module = "kerman")]
pub struct PyNext {
    cursor: Mutex<Cursor<Py<PyAny>>>,
    payload: Py<PyAny>,
    default: Fallback,
}

/// What `next()` gives once no listener remains.
pub enum Fallback {
    /// What `default()` returns (the Python constructor's `default`).
    Call(Py<PyAny>),
    /// What `default(payload)` returns.
    CallWithPayload(Py<PyAny>),
    /// This value, without a call.
    Value(Py<PyAny>),
}

impl Fallback {
    fn get(&self) -> &Py<PyAny> {
        match self {
            Fallback::Call(f) | Fallback::CallWithPayload(f) | Fallback::Value(f) => f,
        }
    }
}

impl PyNext {
    /// `Next(list(listeners), payload, default)()`, built here: the awaitable of a waterfall
    /// dispatch over a snapshot of `listeners` (a listener registered meanwhile joins the next
    /// dispatch, not this one).
    pub fn dispatch<'py>(listeners: &Bound<'py, PyList>, payload: &Bound<'py, PyAny>, default: Fallback) -> PyResult<Bound<'py, PyAny>> {
        let listeners = listeners.iter().map(Bound::unbind).collect();
        let next = PyNext { cursor: Mutex::new(Cursor::new(listeners)), payload: payload.clone().unbind(), default };
        Self::__call__(&Bound::new(payload.py(), next)?)
    }
}

#[pymethods]
impl PyNext {
    #[new]
    fn new(listeners: Vec<Py<PyAny>>, payload: Py<PyAny>, default: Py<PyAny>) -> Self {
        PyNext { cursor: Mutex::new(Cursor::new(listeners)), payload, default: Fallback::Call(default) }
    }

    fn __call__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.borrow();
        // Take what to call out of the cursor first: no Rust lock is held while Python runs.
        let listener = {
            let mut cursor = this.cursor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match cursor.pull() {
                Pull::Listener(l) => Some(l.clone_ref(py)),
                Pull::Default => None,
            }
        };
        let result = match listener {
            Some(listener) => listener.bind(py).call1((this.payload.bind(py), slf))?,
            None => match &this.default {
                Fallback::Call(f) => f.bind(py).call0()?,
                Fallback::CallWithPayload(f) => f.bind(py).call1((this.payload.bind(py),))?,
                Fallback::Value(value) => value.bind(py).clone(),
            },
        };
        awaitable(result)
    }

    /// Listeners not yet pulled.
    #[getter]
    fn remaining(&self) -> usize {
        self.cursor.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remaining()
    }

    fn __repr__(&self) -> String {
        format!("<Next remaining={}>", self.remaining())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.payload)?;
        visit.call(self.default.get())?;
        let Ok(cursor) = self.cursor.try_lock() else { return Ok(()) };
        for listener in cursor.listeners() {
            visit.call(listener)?;
        }
        Ok(())
    }

    /// Drops the listeners (the payload and default never change, so a cycle through them is
    /// broken elsewhere).
    fn __clear__(&mut self) {
        let listeners = self.cursor.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take_listeners();
        drop(listeners);
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyReady>()?;
    let ready = m.py().get_type::<PyReady>();
    // SAFETY: `Ready` is a heap type (pyo3 makes classes with `PyType_FromSpec`), whose
    // `tp_as_async` points at the slot table inside its own type object, filled before any
    // instance exists; pyo3 has no attribute for `am_send`, so it is set here, once.
    unsafe {
        let am = (*ready.as_type_ptr()).tp_as_async;
        if am.is_null() {
            return Err(PySystemError::new_err("Ready has no async slots"));
        }
        (*am).am_send = Some(ready_send);
    }
    m.add_class::<PyNext>()?;
    Ok(())
}
