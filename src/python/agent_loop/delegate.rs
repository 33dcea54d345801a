//! Delegation: how the driver awaits an object, like `await` in a Python coroutine.

use pyo3::exceptions::{PyGeneratorExit, PyStopIteration, PySystemError, PyTypeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;

/// What one `PyIter_Send` (or `throw`) into a delegate gave.
pub(super) enum Sent<'py> {
    /// The delegate suspended, yielding this value to the Task.
    Next(Bound<'py, PyAny>),
    /// The delegate finished: the await's result.
    Return(Bound<'py, PyAny>),
    /// The delegate raised: the await raised.
    Error(PyErr),
}

pub(super) fn fetch(py: Python<'_>) -> PyErr {
    PyErr::take(py).unwrap_or_else(|| PySystemError::new_err("error return without exception set"))
}

pub(super) fn send_into<'py>(iter: &Bound<'py, PyAny>, value: &Bound<'py, PyAny>) -> Sent<'py> {
    let py = iter.py();
    let mut result: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: both pointers are live references held by the caller and the GIL is held.
    // `PyIter_Send` stores a new (owned) reference in `result` on NEXT and RETURN and leaves
    // an exception set on ERROR.
    let status = unsafe { ffi::PyIter_Send(iter.as_ptr(), value.as_ptr(), &raw mut result) };
    // SAFETY: `result` is either NULL or an owned reference that nothing else will release.
    let owned = unsafe { Bound::from_owned_ptr_or_opt(py, result) };
    match (status, owned) {
        (ffi::PySendResult::PYGEN_NEXT, Some(v)) => Sent::Next(v),
        (ffi::PySendResult::PYGEN_RETURN, Some(v)) => Sent::Return(v),
        _ => Sent::Error(fetch(py)),
    }
}

/// Closes a delegate; what then raises at the await: `GeneratorExit`, or the close's error.
pub(super) fn close_delegate(iter: &Bound<'_, PyAny>) -> PyErr {
    let py = iter.py();
    let closed = match iter.getattr_opt(intern!(py, "close")) {
        Ok(Some(close)) => close.call0().map(drop),
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    closed.err().unwrap_or_else(|| PyGeneratorExit::new_err(()))
}

/// `throw` into a delegate, with the outcome read like `yield from` reads it (`GeneratorExit`
/// closes the delegate instead).
pub(super) fn throw_into<'py>(iter: &Bound<'py, PyAny>, exc: PyErr) -> Sent<'py> {
    let py = iter.py();
    if exc.is_instance_of::<PyGeneratorExit>(py) {
        let raised = close_delegate(iter);
        return Sent::Error(if raised.is_instance_of::<PyGeneratorExit>(py) { exc } else { raised });
    }
    let throw = match iter.getattr_opt(intern!(py, "throw")) {
        Ok(Some(throw)) => throw,
        // No `throw`: the exception is raised at the await itself.
        Ok(None) => return Sent::Error(exc),
        Err(e) => return Sent::Error(e),
    };
    match throw.call1((exc.into_value(py),)) {
        Ok(v) => Sent::Next(v),
        Err(e) => stop_value(py, e),
    }
}

/// A `StopIteration` is the delegate's return value; anything else is its error.
pub(super) fn stop_value(py: Python<'_>, e: PyErr) -> Sent<'_> {
    if e.is_instance_of::<PyStopIteration>(py) {
        match e.value(py).getattr(intern!(py, "value")) {
            Ok(v) => Sent::Return(v),
            Err(e) => Sent::Error(e),
        }
    } else {
        Sent::Error(e)
    }
}

pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// Whether `obj` is exactly a native coroutine (`types.CoroutineType`).
pub(super) fn is_coroutine(obj: &Bound<'_, PyAny>, c: &super::Classes) -> bool {
    obj.get_type().is(c.coroutine_type.bind(obj.py()))
}

/// The iterator `await obj` delegates to (`obj.__await__()`, or a native coroutine itself).
pub(super) fn await_iter(obj: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    let py = obj.py();
    let c = super::classes(py)?;
    if is_coroutine(&obj, c) {
        return Ok(obj);
    }
    if obj.get_type().is(c.generator_type.bind(py)) {
        // A `types.coroutine` generator (CO_ITERABLE_COROUTINE) is awaitable as it is.
        let flags: u64 = obj.getattr(intern!(py, "gi_code"))?.getattr(intern!(py, "co_flags"))?.extract()?;
        if flags & 0x100 != 0 {
            return Ok(obj);
        }
    }
    let Some(method) = obj.get_type().getattr_opt(intern!(py, "__await__"))? else {
        return Err(PyTypeError::new_err(format!("object {} can't be used in 'await' expression", type_name(&obj))));
    };
    let iter = method.call1((&obj,))?;
    if is_coroutine(&iter, c) {
        return Err(PyTypeError::new_err("__await__() returned a coroutine"));
    }
    if iter.cast::<pyo3::types::PyIterator>().is_err() {
        return Err(PyTypeError::new_err(format!("__await__() returned non-iterator of type '{}'", type_name(&iter))));
    }
    Ok(iter)
}
