//! Python references held where the collector cannot see them on its own.
//!
//! The core keeps callbacks as opaque closures (a log's observers, an inbox's listener), so a
//! Python object they hold is invisible to `tp_traverse` and every cycle through one (a
//! callback that refers back to its loop, the normal shape of a plugin) would be immortal. The
//! binding therefore keeps each such reference in a [`Held`] that exactly one Python object
//! owns and visits: visiting one reference from two objects would let the collector free a
//! live object.

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

/// One Python reference, shared with the core's closures, that its owner's `__clear__` can
/// drop.
pub struct Held<T = PyAny>(Mutex<Option<Py<T>>>);

impl<T> Held<T> {
    pub fn new(obj: Py<T>) -> Self {
        Held(Mutex::new(Some(obj)))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Py<T>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new reference to the object, or `None` once cleared. The lock is released before the
    /// caller runs any Python.
    pub fn get(&self, py: Python<'_>) -> Option<Py<T>> {
        self.lock().as_ref().map(|obj| obj.clone_ref(py))
    }

    /// Whether the reference was cleared.
    pub fn is_cleared(&self) -> bool {
        self.lock().is_none()
    }

    /// Takes the reference out (to be dropped by the caller, outside the lock: dropping may
    /// run finalizers).
    pub fn take(&self) -> Option<Py<T>> {
        self.lock().take()
    }

    /// Visits the reference. A lock held elsewhere means a thread is copying it out; skipping
    /// it then can only keep objects alive one collection longer, never free a live one.
    pub fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self.0.try_lock() {
            Ok(obj) => visit.call(obj.as_ref()),
            Err(_) => Ok(()),
        }
    }
}
