//! `InboxProjection`, `consumed_work` and `ConsumedWork`.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::super::convert::to_value;
use super::super::errors::{new_err, projection_err};
use super::super::event_log::PyEvent;
use super::super::message::wrap;
use super::messages_to_tuple;
use crate::agent_loop::consumed_work;
use crate::event_log::{Event, SPLICED};
use crate::inbox::projection::InboxProjection;
use crate::inbox::Target;

/// An event from an `Event` or an envelope dict (`to_dict()` form).
fn event_arg(obj: &Bound<'_, PyAny>) -> PyResult<Event> {
    if let Ok(ev) = obj.cast::<PyEvent>() {
        return Ok(ev.get().inner.clone());
    }
    if obj.cast::<PyDict>().is_err() {
        return Err(PyTypeError::new_err(format!("expected an Event or an event dict, got {}", obj.get_type().name()?)));
    }
    let py = obj.py();
    let seq = obj.get_item("seq").ok().and_then(|s| s.extract::<u64>().ok());
    let value = to_value(obj, "event").map_err(|e| new_err(py, "ProjectionError", (format!("invalid event: {}", e.describe()), seq)))?;
    Event::from_json(&crate::json::compact(&value), &mut |k: &str| Arc::from(k))
        .map_err(|e| new_err(py, "ProjectionError", (format!("invalid event: {e}"), seq)))
}

/// A pure fold of `agent/inbox/spliced` events into the two pending lists, validated like the
/// inbox's own replay. For UIs and reconnects: no log needed.
#[pyclass(name = "InboxProjection", module = "kerman")]
pub struct PyInboxProjection {
    inner: Mutex<InboxProjection>,
}

impl PyInboxProjection {
    fn with<R>(&self, f: impl FnOnce(&mut InboxProjection) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[pymethods]
impl PyInboxProjection {
    #[new]
    fn new() -> Self {
        PyInboxProjection { inner: Mutex::new(InboxProjection::new()) }
    }

    /// Applies one event (an `Event` or its dict). Other types are ignored; an invalid splice
    /// raises `ProjectionError` with `.seq` and leaves the projection unchanged.
    fn apply(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let event = event_arg(event)?;
        self.with(|p| p.apply(&event)).map_err(|e| projection_err(py, &e))
    }

    /// Folds a whole stream of events (e.g. `log.splices()`).
    #[staticmethod]
    fn fold(py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<Self> {
        let projection = PyInboxProjection::new();
        for event in events.try_iter()? {
            projection.apply(py, &event?)?;
        }
        Ok(projection)
    }

    #[getter]
    fn next_turn<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let list = self.with(|p| p.list(Target::NextTurn).to_vec());
        messages_to_tuple(py, &list)
    }

    #[getter]
    fn next_step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let list = self.with(|p| p.list(Target::NextStep).to_vec());
        messages_to_tuple(py, &list)
    }

    /// `[(placement, message)]`: next-turn as `"queued"`, then next-step as `"steering"`
    /// (human source) or `"context"`.
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self.with(|p| p.items());
        let list = PyList::empty(py);
        for (placement, message) in items {
            list.append((placement, wrap(py, message)?))?;
        }
        Ok(list)
    }

    fn __len__(&self) -> usize {
        self.with(|p| p.list(Target::NextTurn).len() + p.list(Target::NextStep).len())
    }

    fn __repr__(&self) -> String {
        self.with(|p| {
            format!("<InboxProjection next_turn={} next_step={}>", p.list(Target::NextTurn).len(), p.list(Target::NextStep).len())
        })
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::super::html::render(slf.as_any(), "inbox")
    }
}

/// The result of `consumed_work`: the last `turn/end` that accounts for consumed input, and
/// whether input was dropped unrun after it.
#[pyclass(name = "ConsumedWork", module = "kerman", frozen)]
pub struct PyConsumedWork {
    end: Option<Event>,
    dropped_unrun: bool,
}

#[pymethods]
impl PyConsumedWork {
    #[getter]
    fn end(&self) -> Option<PyEvent> {
        self.end.clone().map(PyEvent::new)
    }

    #[getter]
    fn dropped_unrun(&self) -> bool {
        self.dropped_unrun
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyConsumedWork>().is_ok_and(|o| o.get().end == self.end && o.get().dropped_unrun == self.dropped_unrun)
    }

    fn __repr__(&self) -> String {
        let end = self.end.as_ref().map_or("None".to_string(), |e| format!("<turn/end seq={}>", e.seq));
        format!("ConsumedWork(end={end}, dropped_unrun={})", if self.dropped_unrun { "True" } else { "False" })
    }
}

/// Folds events (a log or an owned suffix) into `ConsumedWork` (reference 4.4).
#[pyfunction(name = "consumed_work")]
fn py_consumed_work(events: &Bound<'_, PyAny>) -> PyResult<PyConsumedWork> {
    let mut list = Vec::new();
    for event in events.try_iter()? {
        list.push(event_arg(&event?)?);
    }
    let work = consumed_work(&list);
    Ok(PyConsumedWork { end: work.end, dropped_unrun: work.dropped_unrun })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInboxProjection>()?;
    m.add_class::<PyConsumedWork>()?;
    m.add_function(wrap_pyfunction!(py_consumed_work, m)?)?;
    m.add("SPLICED", SPLICED)?;
    Ok(())
}
