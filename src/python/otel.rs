//! `OtlpSpans`: the core's span fold (`crate::otel`) for `kerman.otel`'s native exporter. The
//! exporter's thread calls `batch(log)` once per batch: the committed events it has not folded
//! are read from the log in Rust, folded and encoded with the GIL released, and the OTLP
//! protobuf body comes back (no Python object per event or per span).

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::event_log::{PyEvent, PySessionLog};
use crate::otel::{encode, Options, Resource, SpanFold, Value};

struct State {
    fold: SpanFold,
    resource: Resource,
}

/// The spans of one session, folded from its events and encoded as OTLP.
#[pyclass(name = "OtlpSpans", module = "kerman._core", frozen)]
pub struct PyOtlpSpans {
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn value(item: &Bound<'_, PyAny>) -> PyResult<Value> {
    if item.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(item.extract()?));
    }
    if item.is_instance_of::<PyString>() {
        return Ok(Value::Str(item.extract()?));
    }
    if item.is_instance_of::<PyInt>() {
        return Ok(Value::Int(item.extract()?));
    }
    if item.is_instance_of::<PyFloat>() {
        return Ok(Value::Double(item.extract()?));
    }
    if item.is_instance_of::<PyList>() || item.is_instance_of::<PyTuple>() {
        return item.try_iter()?.map(|v| value(&v?)).collect::<PyResult<Vec<_>>>().map(Value::Array);
    }
    Err(PyTypeError::new_err(format!("a resource attribute is a str, bool, int, float or a sequence of them, got {}", item.repr()?)))
}

#[pymethods]
impl PyOtlpSpans {
    #[new]
    #[allow(clippy::needless_pass_by_value, reason = "pyo3 extracts the resource's pairs as an owned list")]
    #[pyo3(signature = (session, *, agent_name = "kerman".to_owned(), model = None, provider = None, latest = false, resource = Vec::new(), scope_version = String::new()))]
    fn new(
        session: String,
        agent_name: String,
        model: Option<String>,
        provider: Option<String>,
        latest: bool,
        resource: Vec<(String, Bound<'_, PyAny>)>,
        scope_version: String,
    ) -> PyResult<Self> {
        let attributes = resource.iter().map(|(k, v)| Ok((k.clone(), value(v)?))).collect::<PyResult<Vec<_>>>()?;
        let resource = Resource { attributes, scope_name: "kerman.otel".into(), scope_version };
        let fold = SpanFold::new(Options { session, agent_name, model, provider, latest });
        Ok(PyOtlpSpans { state: Mutex::new(State { fold, resource }) })
    }

    /// Folds the events `log` committed since the last call (up to `stop`), in Rust, with the
    /// GIL released; returns the next seq to fold.
    #[pyo3(signature = (log, stop = None))]
    fn read(&self, py: Python<'_>, log: &Bound<'_, PySessionLog>, stop: Option<u64>) -> u64 {
        let log = log.borrow().inner.clone();
        py.detach(|| {
            let mut state = lock(&self.state);
            let start = state.fold.position;
            for event in log.range(start, stop) {
                state.fold.add(&event);
            }
            state.fold.position
        })
    }

    /// Folds `events` (`kerman.Event`s, in log order, from the one after the last folded).
    fn add(&self, events: &Bound<'_, PyAny>) -> PyResult<()> {
        // Read the Python iterable first: no call into Python while the state's lock is held.
        let mut read = Vec::new();
        for item in events.try_iter()? {
            let item = item?;
            let event = item.cast::<PyEvent>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "add takes kerman.Event objects, got {}",
                    item.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ))
            })?;
            read.push(event.get().inner.clone());
        }
        let mut state = lock(&self.state);
        for event in &read {
            state.fold.add(event);
        }
        Ok(())
    }

    /// Settles a request the events ended during (after the fact: a live log may still end it).
    fn finish(&self) {
        lock(&self.state).fold.finish();
    }

    /// Folds what `log` committed since the last call and returns the spans that ended, as an
    /// OTLP protobuf `ExportTraceServiceRequest` (`None`: no span ended); one GIL-free call.
    fn batch<'py>(&self, py: Python<'py>, log: &Bound<'_, PySessionLog>) -> Option<Bound<'py, PyBytes>> {
        let log = log.borrow().inner.clone();
        let body = py.detach(|| {
            let mut state = lock(&self.state);
            let start = state.fold.position;
            for event in log.range(start, None) {
                state.fold.add(&event);
            }
            take(&mut state)
        })?;
        Some(PyBytes::new(py, &body))
    }

    /// The spans ended since the last take, as an OTLP `ExportTraceServiceRequest`:
    /// `"protobuf"` (bytes) or `"json"` (OTLP/JSON text); `None` when no span ended.
    #[pyo3(signature = (format = "protobuf"))]
    fn take<'py>(&self, py: Python<'py>, format: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        match format {
            "protobuf" => Ok(py.detach(|| take(&mut lock(&self.state))).map(|b| PyBytes::new(py, &b).into_any())),
            "json" => {
                let text = py.detach(|| {
                    let mut state = lock(&self.state);
                    let spans = std::mem::take(&mut state.fold.spans);
                    (!spans.is_empty()).then(|| encode::json(&state.resource, &spans))
                });
                Ok(text.map(|t| PyString::new(py, &t).into_any()))
            }
            _ => Err(PyValueError::new_err(format!("format must be 'protobuf' or 'json', got '{format}'"))),
        }
    }

    /// The next seq to fold.
    #[getter]
    fn position(&self) -> u64 {
        lock(&self.state).fold.position
    }

    /// Spans ended and not yet taken.
    #[getter]
    fn pending(&self) -> usize {
        lock(&self.state).fold.spans.len()
    }

    fn __repr__(&self) -> String {
        let state = lock(&self.state);
        format!("<OtlpSpans position={} pending={}>", state.fold.position, state.fold.spans.len())
    }
}

fn take(state: &mut State) -> Option<Vec<u8>> {
    if state.fold.spans.is_empty() {
        return None;
    }
    let spans = std::mem::take(&mut state.fold.spans);
    let mut out = Vec::with_capacity(256 + spans.len() * 400);
    encode::protobuf(&mut out, &state.resource, &spans);
    Some(out)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOtlpSpans>()
}
