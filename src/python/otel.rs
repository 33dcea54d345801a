//! `OtlpSpans`: the core's span fold (`crate::otel`) for `kerman.otel`'s native exporter. The
//! exporter's thread calls `batch(log)` once per batch: the committed events it has not folded
//! are read from the log in Rust, folded and encoded with the GIL released, and the OTLP
//! protobuf body comes back (no Python object per event or per span).

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::event_log::{PyEvent, PySessionLog};
use crate::event_log::{Event, SessionLog};
use crate::otel::{encode, Options, Resource, SpanFold, Value};

struct State {
    fold: SpanFold,
    resource: Resource,
    /// The events of a batch, copied out of the log (the log's lock is held for the copy
    /// only, not for the fold); kept between batches with its capacity.
    events: Vec<Event>,
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
        Ok(PyOtlpSpans { state: Mutex::new(State { fold, resource, events: Vec::new() }) })
    }

    /// Folds the events `log` committed since the last call (up to `stop`), in Rust, with the
    /// GIL released; returns the next seq to fold.
    #[pyo3(signature = (log, stop = None))]
    fn read(&self, py: Python<'_>, log: &Bound<'_, PySessionLog>, stop: Option<u64>) -> u64 {
        let log = log.borrow().inner.clone();
        py.detach(|| {
            let mut state = lock(&self.state);
            fold(&mut state, &log, stop);
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
    fn batch<'py>(&self, py: Python<'py>, log: &Bound<'_, PySessionLog>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let log = log.borrow().inner.clone();
        let request = py.detach(|| {
            let mut state = lock(&self.state);
            fold(&mut state, &log, None);
            take(&mut state)
        });
        request.map(|r| body(py, &r)).transpose()
    }

    /// The spans ended since the last take, as an OTLP `ExportTraceServiceRequest`:
    /// `"protobuf"` (bytes) or `"json"` (OTLP/JSON text); `None` when no span ended.
    #[pyo3(signature = (format = "protobuf"))]
    fn take<'py>(&self, py: Python<'py>, format: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        match format {
            "protobuf" => Ok(py.detach(|| take(&mut lock(&self.state))).map(|r| body(py, &r)).transpose()?.map(Bound::into_any)),
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

/// Folds the events `log` committed from the fold's position (up to `stop`).
fn fold(state: &mut State, log: &SessionLog, stop: Option<u64>) {
    let State { fold, events, .. } = state;
    let start = usize::try_from(fold.position).unwrap_or(usize::MAX);
    let stop = stop.map_or(usize::MAX, |s| usize::try_from(s).unwrap_or(usize::MAX));
    log.with_events(|all| events.extend_from_slice(all.get(start..stop.min(all.len())).unwrap_or_default()));
    for event in events.drain(..) {
        fold.add(&event);
    }
}

/// The spans ended since the last take, encoded (`None`: none ended). The spans' `Vec` keeps
/// its capacity for the next batch.
fn take(state: &mut State) -> Option<encode::Request> {
    if state.fold.spans.is_empty() {
        return None;
    }
    let request = encode::request(&state.resource, &state.fold.spans);
    state.fold.clear_spans();
    Some(request)
}

/// The request as a Python `bytes`, its two parts copied in place: one copy of the spans, and
/// no zeroing of a buffer about to be overwritten (`PyBytes::new_with` zeroes it first).
fn body<'py>(py: Python<'py>, request: &encode::Request) -> PyResult<Bound<'py, PyBytes>> {
    let (head, spans) = (&request.head, &request.spans);
    let len = head.len() + spans.len();
    let size = ffi::Py_ssize_t::try_from(len).map_err(|_| PyValueError::new_err("the OTLP body is too large"))?;
    // SAFETY: called with the GIL held (`py`). With a null pointer, `PyBytes_FromStringAndSize`
    // returns a new bytes object of `len` bytes not yet written (or null with an exception set,
    // which `from_owned_ptr_or_err` returns). Nothing else holds the object yet, so its buffer
    // (`PyBytes_AsString`, `len` bytes plus a terminator) is ours to write: `head` then `spans`,
    // `len` bytes in all, from vectors that do not overlap it, through raw pointers (no
    // reference to the unwritten bytes is made).
    unsafe {
        let object = ffi::PyBytes_FromStringAndSize(std::ptr::null(), size);
        let bytes = Bound::from_owned_ptr_or_err(py, object)?.cast_into_unchecked::<PyBytes>();
        let out = ffi::PyBytes_AsString(object).cast::<u8>();
        std::ptr::copy_nonoverlapping(head.as_ptr(), out, head.len());
        std::ptr::copy_nonoverlapping(spans.as_ptr(), out.add(head.len()), spans.len());
        Ok(bytes)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOtlpSpans>()
}
