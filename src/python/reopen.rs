//! The logs this process has open, held weakly, so that `store.open(id, reuse=True)` can hand
//! back the live `SessionLog` of a session this process already holds (a notebook cell that
//! opens a session running again) instead of refusing it as locked. The lock itself is
//! untouched: another process still gets `SessionLockedError`.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

use super::errors::{log_err, new_err};
use super::event_log::PySessionLog;
use crate::event_log::LogError;

/// Open logs by key (a session file's canonical path, or a memory session's id).
#[derive(Default)]
pub struct OpenLogs {
    logs: Mutex<Vec<(String, Py<PyWeakrefReference>)>>,
}

impl OpenLogs {
    pub const fn new() -> Self {
        OpenLogs { logs: Mutex::new(Vec::new()) }
    }

    /// The live, open log registered under `key`, if any.
    pub fn live<'py>(&self, py: Python<'py>, key: &str) -> Option<Bound<'py, PySessionLog>> {
        // Copied out first: upgrading and dropping references happen with no lock held.
        let found: Vec<Py<PyWeakrefReference>> = self.lock().iter().filter(|(k, _)| k == key).map(|(_, r)| r.clone_ref(py)).collect();
        found.iter().find_map(|r| {
            let log = r.bind(py).upgrade()?.cast_into::<PySessionLog>().ok()?;
            (!log.get().inner.is_closed()).then_some(log)
        })
    }

    /// Registers `log` under `key`, forgetting the entries whose logs are gone or closed.
    pub fn remember(&self, py: Python<'_>, key: String, log: &Bound<'_, PySessionLog>) -> PyResult<()> {
        let weak = PyWeakrefReference::new(log.as_any())?.unbind();
        let entries = std::mem::take(&mut *self.lock());
        let (mut kept, dropped): (Vec<_>, Vec<_>) = entries.into_iter().partition(|(_, r)| {
            r.bind(py).upgrade().and_then(|l| l.cast_into::<PySessionLog>().ok()).is_some_and(|l| !l.get().inner.is_closed())
        });
        kept.push((key, weak));
        // Whatever another thread registered meanwhile stays.
        self.lock().extend(kept);
        drop(dropped);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, Py<PyWeakrefReference>)>> {
        self.logs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The error of an `open` refused because this process holds the session: the usual
/// `SessionLockedError`, which also names the way to share the open log.
pub fn locked_here(py: Python<'_>, e: LogError) -> PyErr {
    if !matches!(e, LogError::LockedHere { .. }) {
        return log_err(py, e);
    }
    let text = log_err(py, e).value(py).str().map(|s| s.to_string()).unwrap_or_default();
    new_err(
        py,
        "SessionLockedError",
        (format!("{text}; or take that same log back with store.open(id, reuse=True) (a notebook cell that opens it running again)"),),
    )
}
