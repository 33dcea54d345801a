//! EXPERIMENT (abi3 measurement only): C API functions outside the limited API, declared by
//! hand. They exist in every CPython 3.10+ on Linux and macOS, but not in Windows' python3.dll.
use pyo3::ffi::{PyObject, PyThreadState};
use std::os::raw::c_int;

extern "C" {
    pub fn PyGILState_Check() -> c_int;
    pub fn PyContext_CopyCurrent() -> *mut PyObject;
    pub fn PyContext_Enter(ctx: *mut PyObject) -> c_int;
    pub fn PyContext_Exit(ctx: *mut PyObject) -> c_int;
    #[allow(dead_code)]
    pub fn PyThreadState_Get() -> *mut PyThreadState;
}
