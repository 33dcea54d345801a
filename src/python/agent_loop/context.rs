//! `InContext`: a suspended tool body, resumed inside the context it started in.
//!
//! A pooled tool call runs in a task of its own, so it runs in a copy of the driver's context
//! variables: whatever it sets stays in that call. A lone call the driver runs itself must give
//! the same, so every resumption of its body enters that copy and leaves it again.

use pyo3::exceptions::{PyStopIteration, PySystemError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};

use super::super::runtime::coroutine::{coroutine_methods, Coroutine, Resume};
use super::delegate::{close_delegate, fetch, send_into, throw_into, Sent};

/// `contextvars.copy_context()`.
pub(super) fn copy_context(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: the GIL is held; the call returns a new reference or NULL with an exception set.
    let ctx = unsafe { ffi::PyContext_CopyCurrent() };
    // SAFETY: `ctx` is an owned reference (or NULL, handled).
    unsafe { Bound::from_owned_ptr_or_opt(py, ctx) }.ok_or_else(|| fetch(py))
}

/// Runs `f` inside `context` (what `context.run(f)` does).
pub(super) fn run_in<T>(context: &Bound<'_, PyAny>, f: impl FnOnce() -> T) -> PyResult<T> {
    let py = context.py();
    // SAFETY: `context` is a live `contextvars.Context` (from `copy_context`) and the GIL is held.
    if unsafe { ffi::PyContext_Enter(context.as_ptr()) } != 0 {
        return Err(fetch(py));
    }
    let out = f();
    // SAFETY: as above; it was entered just before.
    if unsafe { ffi::PyContext_Exit(context.as_ptr()) } != 0 {
        return Err(fetch(py));
    }
    Ok(out)
}

/// The iterator the driver awaits for a body that suspended: `send`/`throw`/`close` go to the
/// body's own iterator inside its context. `first` is what the body yielded when it started
/// (that first step ran before this object existed); the first `__next__` hands it on.
#[pyclass(name = "_InContext", module = "kerman")]
pub(super) struct InContext {
    iter: Option<Py<PyAny>>,
    context: Option<Py<PyAny>>,
    first: Option<Py<PyAny>>,
}

impl InContext {
    pub(super) fn new(iter: Bound<'_, PyAny>, context: Bound<'_, PyAny>, first: Bound<'_, PyAny>) -> InContext {
        InContext { iter: Some(iter.unbind()), context: Some(context.unbind()), first: Some(first.unbind()) }
    }

    fn parts<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        match (&self.iter, &self.context) {
            (Some(iter), Some(context)) => Ok((iter.bind(py).clone(), context.bind(py).clone())),
            _ => Err(PySystemError::new_err("the tool body was cleared")),
        }
    }
}

/// A delegate's outcome as this iterator's: yielded, or returned (`StopIteration(value)`).
fn passed(sent: Sent<'_>) -> PyResult<Py<PyAny>> {
    match sent {
        Sent::Next(value) => Ok(value.unbind()),
        Sent::Return(value) => Err(PyStopIteration::new_err((value.unbind(),))),
        Sent::Error(e) => Err(e),
    }
}

impl Coroutine for InContext {
    /// Every step enters the body's context; `close` closes the body's iterator there.
    fn resume(slf: &Bound<'_, Self>, how: Resume<'_>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let (iter, context) = {
            let mut this = slf.try_borrow_mut()?;
            match &how {
                Resume::Send(_) => {
                    if let Some(first) = this.first.take() {
                        return Ok(first);
                    }
                }
                Resume::Throw(_) => this.first = None,
                Resume::Close => {}
            }
            this.parts(py)?
        };
        match how {
            Resume::Send(value) => passed(run_in(&context, || send_into(&iter, &value))?),
            Resume::Throw(exc) => passed(run_in(&context, || throw_into(&iter, exc))?),
            Resume::Close => Err(run_in(&context, || close_delegate(&iter))?),
        }
    }
}

coroutine_methods!(iterator InContext {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for obj in [&self.iter, &self.context, &self.first].into_iter().flatten() {
            visit.call(obj)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.iter = None;
        self.context = None;
        self.first = None;
    }
});
