//! The GIL released while the core blocks: the hook `crate::blocking` calls around its waits.

/// Releases the GIL around core waits on other threads (see `crate::blocking`).
pub fn release_gil_while(wait: &mut dyn FnMut()) {
    struct Restore(*mut pyo3::ffi::PyThreadState);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the state was saved by `PyEval_SaveThread` on this same thread.
            unsafe { pyo3::ffi::PyEval_RestoreThread(self.0) };
        }
    }
    // SAFETY: `PyGILState_Check` only reads this thread's state; when it holds the GIL we
    // release it for the duration of a pure-Rust wait and restore it before returning.
    unsafe {
        if pyo3::ffi::Py_IsInitialized() != 0 && pyo3::ffi::PyGILState_Check() == 1 {
            let _restore = Restore(pyo3::ffi::PyEval_SaveThread());
            wait();
            return;
        }
    }
    wait();
}
