//! `Event`: one committed entry, and the type filters the readers take.

use std::sync::OnceLock;

use pyo3::basic::CompareOp;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use pyo3::{PyTraverseError, PyVisit};

use super::super::convert::json_to_py;
use crate::event_log::{Event, SurfaceOp, TypeFilter};

/// One committed log entry. Immutable; `data` is decoded on first access and cached.
#[pyclass(name = "Event", module = "kerman", frozen)]
pub struct PyEvent {
    pub inner: Event,
    data: OnceLock<Py<PyAny>>,
}

impl PyEvent {
    pub fn new(inner: Event) -> Self {
        PyEvent { inner, data: OnceLock::new() }
    }
}

fn surface_op_py<'py>(py: Python<'py>, event: &Event) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(match event.surface().map(|s| &s.op) {
        None => None,
        Some(SurfaceOp::Append) => Some(PyString::new(py, "append").into_any()),
        Some(SurfaceOp::Replace { start, end }) => {
            let d = PyDict::new(py);
            d.set_item("op", "replace")?;
            d.set_item("start", start)?;
            d.set_item("end", end)?;
            Some(d.into_any())
        }
    })
}

#[pymethods]
impl PyEvent {
    /// Position in the log, from 0.
    #[getter]
    fn seq(&self) -> u64 {
        self.inner.seq
    }

    /// Epoch milliseconds at append; non-decreasing within a log.
    #[getter]
    fn time(&self) -> i64 {
        self.inner.time
    }

    /// The event type, e.g. `"turn/start"`.
    #[getter(r#type)]
    fn kind(&self) -> &str {
        self.inner.kind()
    }

    /// The cached payload is a plain dict the caller may change, so it can hold a cycle back
    /// to its event. Once set it never changes, so there is nothing for `__clear__` to break.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // A std `OnceLock`, not pyo3's `PyOnceLock`: reading it needs no `Python` token, and
        // `__traverse__` is given none.
        visit.call(self.data.get())
    }

    /// The payload, decoded once and cached.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(data) = self.data.get() {
            return Ok(data.clone_ref(py));
        }
        let decoded = json_to_py(py, self.inner.data_json())?.unbind();
        // Decoding can run Python code (finalizers in a collection), so another thread may have
        // cached its decoding meanwhile: the first one cached wins, and every caller gets it.
        Ok(self.data.get_or_init(|| decoded).clone_ref(py))
    }

    /// `"append"`, `{"op": "replace", "start", "end"}`, or `None` for non-surface events.
    #[getter]
    fn surface_op<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        surface_op_py(py, &self.inner)
    }

    /// Seqs of earlier events this one cites, or `None`.
    #[getter]
    fn source_event_seqs(&self) -> Option<Vec<u64>> {
        self.inner.surface().and_then(|s| s.source_event_seqs.clone())
    }

    /// The envelope as a dict with the JSON wire names (`surfaceOp`, `sourceEventSeqs`).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.inner.to_json())
    }

    /// The record as compact JSON, exactly as stored.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyEvent>() else { return Ok(py.NotImplemented()) };
        let equal = self.inner == other.get().inner;
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "a hash: any 64 bits will do")]
    fn __hash__(&self) -> isize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.inner.seq, self.inner.time, self.inner.kind(), self.inner.data_json()).hash(&mut h);
        h.finish() as isize
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let data = self.data(py)?.bind(py).repr()?.to_string();
        let data = if data.chars().count() > 80 {
            let mut s: String = data.chars().take(79).collect();
            s.push('…');
            s
        } else {
            data
        };
        let kind = PyString::new(py, self.inner.kind()).repr()?;
        Ok(format!("Event(seq={}, type={kind}, data={data})", self.inner.seq))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::super::html::render(slf.as_any(), "event")
    }
}

/// A type filter: `None`, one type, or an iterable of types; each may be a pattern with `*`
/// and `?` (`"assistant/*"`), as on the command line.
pub fn types_arg(types: Option<&Bound<'_, PyAny>>) -> PyResult<Option<TypeFilter>> {
    let Some(types) = types.filter(|t| !t.is_none()) else { return Ok(None) };
    if let Ok(s) = types.extract::<String>() {
        return Ok(Some(TypeFilter::new([s])));
    }
    let mut out = Vec::new();
    for t in types.try_iter()? {
        let t = t?;
        let Ok(s) = t.extract::<String>() else {
            return Err(PyTypeError::new_err(format!("event types must be str, got {}", t.get_type().name()?)));
        };
        out.push(s);
    }
    Ok(Some(TypeFilter::new(out)))
}

pub(super) fn matches(types: Option<&TypeFilter>, event: &Event) -> bool {
    types.is_none_or(|t| t.matches(event.kind()))
}

/// `kerman.events.TYPES` and `OtherEvent`: the view class of each type Kerman writes, and of
/// any other type.
static VIEWS: PyOnceLock<(Py<PyDict>, Py<PyAny>)> = PyOnceLock::new();

/// What a reader hands out for `event`: the `Event`, or with `view` its typed view, built as
/// `kerman.events.view(event)` builds it (`TYPES.get(event.type, OtherEvent)(event)`; looked up
/// here, not called, to spare a Python call per event). The caller holds no Rust lock: the
/// view is built by Python code.
pub(super) fn handed_out(py: Python<'_>, event: Event, view: bool) -> PyResult<Py<PyAny>> {
    if !view {
        return Ok(Bound::new(py, PyEvent::new(event))?.into_any().unbind());
    }
    let (types, other) = VIEWS.get_or_try_init(py, || {
        let module = py.import("kerman.events")?;
        Ok::<_, PyErr>((module.getattr("TYPES")?.cast_into::<PyDict>()?.unbind(), module.getattr("OtherEvent")?.unbind()))
    })?;
    let class = match types.bind(py).get_item(event.kind())? {
        Some(class) => class,
        None => other.bind(py).clone(),
    };
    class.call1((PyEvent::new(event),)).map(Bound::unbind)
}
