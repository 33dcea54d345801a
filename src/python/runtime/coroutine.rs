//! The one coroutine protocol of the binding: every awaitable written in Rust (`Driver`,
//! `Ready`, `LogTailStep`, the lone tool body's `_InContext`) is its own `__await__` iterator
//! and answers `__next__`/`send`/`throw`/`close` through the functions here, so the protocol
//! and its cancellation rule are written once. A type supplies one step ([`Coroutine::resume`]);
//! its `#[pymethods]` block is written by [`coroutine_methods!`], whose methods only forward to
//! [`next`], [`send`], [`throw`] and [`close`].
//!
//! # The cancellation rule
//!
//! asyncio cancels a task by throwing `CancelledError` into the awaitable the task is suspended
//! in; `close()` is the same with `GeneratorExit`, when the awaitable is dropped unfinished.
//!
//! - `throw(exc)` raises `exc` where the awaitable is suspended: into the object it awaits, if
//!   any (through that object's own `throw`, so a future is cancelled and a coroutine unwinds),
//!   else at the awaitable itself. The awaitable stops the work it was waiting for; it may still
//!   await its own cleanup (yield again, as a `finally` with an `await` does), but it never goes
//!   back to that work: it ends by raising (`exc`, or what its cleanup raised) or by returning.
//!   Only an exception the awaitable raises at itself as part of its contract is handled and
//!   not re-raised (the driver absorbs the cancellation its own `cancel()` throws).
//! - Thrown before the first step, the exception lands at the start (the driver still ends the
//!   turn it had begun, and reports it). Thrown into a finished awaitable, it is raised as it is.
//!   Thrown while the awaitable runs (a re-entrant call), `ValueError`.
//! - The arguments are those of `generator.throw`: an exception instance, or a class with an
//!   optional value (an instance of it, a tuple of arguments, or one argument), and an optional
//!   traceback.
//! - `close()` stops the awaitable (closing the object it awaits) and returns `None`; an
//!   awaitable that yields instead raises `RuntimeError`, one whose cleanup raises another
//!   exception raises that. Closing a finished or never-started awaitable does nothing.

use pyo3::exceptions::{PyBaseException, PyGeneratorExit, PyRuntimeError, PyStopIteration, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};
use pyo3::PyClass;

/// How a coroutine is resumed.
pub enum Resume<'py> {
    /// `__next__` (`None`) or `send(value)`.
    Send(Bound<'py, PyAny>),
    /// `throw(exc)`, the arguments already made into the exception.
    Throw(PyErr),
    /// `close()`: stop, as if `GeneratorExit` were thrown (a never-started or finished
    /// awaitable raises `GeneratorExit` at once).
    Close,
}

/// An awaitable written in Rust.
pub trait Coroutine: PyClass {
    /// One step: `Ok(yielded)` when it suspends, `Err(StopIteration(value))` when it returns
    /// `value`, `Err(exc)` when it raises. Follows the rule in this module's doc.
    fn resume(slf: &Bound<'_, Self>, how: Resume<'_>) -> PyResult<Py<PyAny>>;
}

/// The `#[pymethods]` block of a [`Coroutine`]: `__iter__` (and, for an `awaitable`,
/// `__await__`) give the object itself; `__next__`, `send`, `throw` and `close` forward to this
/// module's functions. The class's other methods follow in the braces (pyo3 takes one
/// `#[pymethods]` block a class).
macro_rules! coroutine_methods {
    (awaitable $ty:ident { $($rest:tt)* }) => {
        $crate::python::runtime::coroutine::coroutine_methods!(iterator $ty {
            fn __await__(slf: ::pyo3::PyRef<'_, Self>) -> ::pyo3::PyRef<'_, Self> {
                slf
            }

            $($rest)*
        });
    };
    (iterator $ty:ident { $($rest:tt)* }) => {
        #[::pyo3::pymethods]
        impl $ty {
            fn __iter__(slf: ::pyo3::PyRef<'_, Self>) -> ::pyo3::PyRef<'_, Self> {
                slf
            }

            fn __next__(slf: &::pyo3::Bound<'_, Self>) -> ::pyo3::PyResult<::pyo3::Py<::pyo3::PyAny>> {
                $crate::python::runtime::coroutine::next(slf)
            }

            /// Resumes with ``value``; returns what it yields, raises ``StopIteration`` when it
            /// finishes.
            fn send(
                slf: &::pyo3::Bound<'_, Self>,
                value: &::pyo3::Bound<'_, ::pyo3::PyAny>,
            ) -> ::pyo3::PyResult<::pyo3::Py<::pyo3::PyAny>> {
                $crate::python::runtime::coroutine::send(slf, value)
            }

            /// Raises ``exc`` where it is suspended (inside the awaited object, if any).
            #[pyo3(signature = (typ, val=None, tb=None))]
            fn throw(
                slf: &::pyo3::Bound<'_, Self>,
                typ: &::pyo3::Bound<'_, ::pyo3::PyAny>,
                val: Option<&::pyo3::Bound<'_, ::pyo3::PyAny>>,
                tb: Option<&::pyo3::Bound<'_, ::pyo3::PyAny>>,
            ) -> ::pyo3::PyResult<::pyo3::Py<::pyo3::PyAny>> {
                $crate::python::runtime::coroutine::throw(slf, typ, val, tb)
            }

            /// Raises ``GeneratorExit`` where it is suspended (closing the awaited object
            /// first).
            fn close(slf: &::pyo3::Bound<'_, Self>) -> ::pyo3::PyResult<()> {
                $crate::python::runtime::coroutine::close(slf)
            }

            $($rest)*
        }
    };
}

pub(crate) use coroutine_methods;

/// `__next__`.
pub fn next<C: Coroutine>(slf: &Bound<'_, C>) -> PyResult<Py<PyAny>> {
    C::resume(slf, Resume::Send(slf.py().None().into_bound(slf.py())))
}

/// `send(value)`.
pub fn send<C: Coroutine>(slf: &Bound<'_, C>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    C::resume(slf, Resume::Send(value.clone()))
}

/// `throw(typ, val=None, tb=None)`.
pub fn throw<C: Coroutine>(
    slf: &Bound<'_, C>,
    typ: &Bound<'_, PyAny>,
    val: Option<&Bound<'_, PyAny>>,
    tb: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    C::resume(slf, Resume::Throw(thrown(typ, val, tb)?))
}

/// `close()`.
pub fn close<C: Coroutine>(slf: &Bound<'_, C>) -> PyResult<()> {
    let py = slf.py();
    match C::resume(slf, Resume::Close) {
        Ok(_) => Err(PyRuntimeError::new_err("coroutine ignored GeneratorExit")),
        Err(e) if e.is_instance_of::<PyGeneratorExit>(py) || e.is_instance_of::<PyStopIteration>(py) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The exception `throw`'s arguments stand for, as `generator.throw` reads them.
pub fn thrown(typ: &Bound<'_, PyAny>, val: Option<&Bound<'_, PyAny>>, tb: Option<&Bound<'_, PyAny>>) -> PyResult<PyErr> {
    let val = val.filter(|v| !v.is_none());
    let exc = if typ.is_instance_of::<PyBaseException>() {
        if val.is_some() {
            return Err(PyTypeError::new_err("instance exception may not have a separate value"));
        }
        typ.clone()
    } else if typ.cast::<PyType>().is_ok_and(|t| t.is_subclass_of::<PyBaseException>().unwrap_or(false)) {
        match val {
            None => typ.call0()?,
            Some(v) if v.is_instance(typ)? => v.clone(),
            Some(v) => match v.cast::<PyTuple>() {
                Ok(args) => typ.call1(args)?,
                Err(_) => typ.call1((v,))?,
            },
        }
    } else {
        let name = typ.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string());
        return Err(PyTypeError::new_err(format!("exceptions must be classes or instances deriving from BaseException, not {name}")));
    };
    let exc = match tb.filter(|t| !t.is_none()) {
        Some(tb) => exc.call_method1(intern!(typ.py(), "with_traceback"), (tb,))?,
        None => exc,
    };
    Ok(PyErr::from_value(exc))
}
