//! Protocol checks by type slot. `hasattr(obj, "__await__")` raises and formats an
//! `AttributeError` on every miss, which costs more than the rest of a waterfall step; the
//! slots answer the same question for any class (Python classes defining the method fill
//! them too) and are what `await` and `async for` themselves consult.

use pyo3::ffi;
use pyo3::prelude::*;

fn async_slot(obj: &Bound<'_, PyAny>, filled: fn(&ffi::PyAsyncMethods) -> bool) -> bool {
    // SAFETY: reads the type object of a live object; `tp_as_async` is null or points to
    // the type's slot table, which lives as long as the type (kept alive by `obj`).
    unsafe {
        let am = (*ffi::Py_TYPE(obj.as_ptr())).tp_as_async;
        !am.is_null() && filled(&*am)
    }
}

/// Whether `type(obj)` defines `__await__`.
pub fn has_await(obj: &Bound<'_, PyAny>) -> bool {
    async_slot(obj, |am| am.am_await.is_some())
}

/// Whether `type(obj)` defines `__anext__`.
pub fn has_anext(obj: &Bound<'_, PyAny>) -> bool {
    async_slot(obj, |am| am.am_anext.is_some())
}
