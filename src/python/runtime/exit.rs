//! Interpreter exit and the core's own threads.
//!
//! Writer and PostgreSQL reply threads deliver completions into Python. Once the interpreter
//! is finalizing, attaching a thread parks it for good (pyo3; older CPythons end such a thread
//! with an abort). A log dropped during finalization joins its writer thread, so a writer
//! parked that way hung the process at exit: 12 of 20 runs of a script that exited with
//! flushes in flight. So those threads attach through [`attach_unless_exiting`], and an
//! `atexit` hook (registered by `kerman/__init__.py`, so it runs before finalization) closes
//! the door and waits for the deliveries already inside.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

static EXITING: AtomicBool = AtomicBool::new(false);
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// `Python::attach` for calls from the core's threads: `None` (nothing runs) once the
/// interpreter is exiting.
pub fn attach_unless_exiting<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            INSIDE.fetch_sub(1, SeqCst);
        }
    }
    if EXITING.load(SeqCst) {
        return None;
    }
    // SAFETY: CPython allows `PyGILState_Check` on any thread at any time, attached or not
    // (pyo3 has no safe "is this thread attached?"); it only reads the calling thread's state.
    if unsafe { pyo3::ffi::PyGILState_Check() } == 1 {
        // Already attached (Python code mutating an inbox, say): there is no attach to guard,
        // and `at_exit`, which needs the GIL this thread holds, cannot be running. Skipping
        // the count saves two atomic operations per call, ~20 ns here.
        return Some(Python::attach(f));
    }
    // Counted before the check (both SeqCst): `at_exit` either sees this call inside and waits
    // for it, or this call sees the flag.
    INSIDE.fetch_add(1, SeqCst);
    let _leave = Leave;
    if EXITING.load(SeqCst) {
        return None;
    }
    Python::try_attach(f)
}

/// Called by `atexit`: no delivery starts after this; the ones under way (waiting for the GIL
/// this thread holds) finish first, for at most two seconds.
#[pyfunction]
fn _at_exit(py: Python<'_>) {
    EXITING.store(true, SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        while INSIDE.load(SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Private (not in `__all__`): only `kerman/__init__.py` calls it.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.as_any().setattr("_at_exit", wrap_pyfunction!(_at_exit, m)?)
}
