//! `EventIterator`: a snapshot iterator over committed events.

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::event::{handed_out, matches, PyEvent};
use crate::event_log::{Event, SessionLog, TypeFilter};

/// A snapshot iterator over committed events (its end is fixed when it is made), handing out
/// each `Event` or, with `view`, its typed view.
#[pyclass(name = "EventIterator", module = "kerman")]
pub struct PyEventIter {
    pub(super) log: SessionLog,
    pub(super) next: u64,
    pub(super) stop: u64,
    pub(super) types: Option<TypeFilter>,
    pub(super) view: bool,
}

impl PyEventIter {
    fn advance(&mut self) -> Option<Event> {
        while self.next < self.stop {
            let event = self.log.get(self.next)?;
            self.next += 1;
            if matches(self.types.as_ref(), &event) {
                return Some(event);
            }
        }
        None
    }
}

#[pymethods]
impl PyEventIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<PyAny>>> {
        // The borrow ends before the view is built: building it runs Python code.
        let (event, view) = {
            let mut it = slf.borrow_mut();
            (it.advance(), it.view)
        };
        event.map(|e| handed_out(slf.py(), e, view)).transpose()
    }

    /// The next `n` events this iterator would give, without advancing it (for its reprs).
    fn _peek(&self, n: usize) -> Vec<PyEvent> {
        let events = self.log.range_where(self.next, Some(self.stop), |e| matches(self.types.as_ref(), e));
        events.into_iter().take(n).map(PyEvent::new).collect()
    }

    /// How many events are left to give (filtered by its types).
    fn _remaining(&self) -> usize {
        match &self.types {
            None => usize::try_from(self.stop.saturating_sub(self.next)).unwrap_or(usize::MAX),
            Some(_) => self.log.range_where(self.next, Some(self.stop), |e| matches(self.types.as_ref(), e)).len(),
        }
    }

    /// `(session id, next seq, stop)`, for its reprs.
    #[getter]
    fn _position(&self) -> (String, u64, u64) {
        (self.log.id().to_string(), self.next, self.stop)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let id = PyString::new(py, self.log.id()).repr()?;
        let types = match &self.types {
            None => String::new(),
            Some(t) => format!(" types={}", pyo3::types::PyList::new(py, t.entries())?.repr()?),
        };
        Ok(format!("<EventIterator session={id} next={} stop={}{types}>", self.next, self.stop))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::super::html::render(slf.as_any(), "event_iterator")
    }
}
