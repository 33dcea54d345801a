//! `Transcript`: the conversation of a session log (`log.transcript()`), a snapshot of the
//! core's fold (`agent_loop::Transcript`).

use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PySlice};

use super::convert::to_py;
use super::message::wrap;
use crate::agent_loop::Transcript;

/// The conversation as messages in log order: what each turn entered (`user/message`), the
/// replies (`assistant/message`) and the tool results (`tool/result`). A sequence of messages
/// (`len`, indexing, slicing, iteration); `entries()` adds where each sits, `endings` how each
/// turn ended. A snapshot: later appends are not in it.
#[pyclass(name = "Transcript", module = "kerman", frozen)]
pub struct PyTranscript {
    session_id: String,
    inner: Transcript,
}

impl PyTranscript {
    pub fn new(session_id: String, inner: Transcript) -> Self {
        PyTranscript { session_id, inner }
    }

    fn message<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyAny>> {
        wrap(py, self.inner.entries[i].message.clone())
    }
}

#[pymethods]
impl PyTranscript {
    /// The session's id.
    #[getter]
    fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The log's length when the transcript was read (events from this seq on are not in it).
    #[getter]
    fn stop(&self) -> u64 {
        self.inner.stop
    }

    fn __len__(&self) -> usize {
        self.inner.entries.len()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let len = self.inner.entries.len();
        if let Ok(slice) = index.cast::<PySlice>() {
            let range = slice.indices(len as isize)?;
            let list = PyList::empty(py);
            let mut i = range.start;
            for _ in 0..range.slicelength {
                let at = usize::try_from(i).map_err(|_| PyIndexError::new_err("transcript slice index out of range"))?;
                list.append(self.message(py, at)?)?;
                i += range.step;
            }
            return Ok(list.into_any());
        }
        if !index.is_instance_of::<PyInt>() || index.is_instance_of::<pyo3::types::PyBool>() {
            return Err(PyTypeError::new_err(format!("transcript indices must be integers or slices, not {}", index.get_type().name()?)));
        }
        let i: i64 = index.extract().unwrap_or(i64::MAX);
        let at = if i < 0 { i.checked_add(len as i64) } else { Some(i) };
        match at.and_then(|at| usize::try_from(at).ok()).filter(|&at| at < len) {
            Some(at) => self.message(py, at),
            None => Err(PyIndexError::new_err(format!("transcript index {i} out of range for {len} messages"))),
        }
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let messages = (0..self.inner.entries.len()).map(|i| self.message(py, i)).collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, messages)?.try_iter().map(Bound::into_any)
    }

    /// One dict per message: `seq` (its event), `turn` and `step` (0 outside any),
    /// `message`, `mid_turn` (a user message entered after the turn's first step: `steer` or
    /// `inject` input) and `interrupted` (a reply cut off by a cancellation).
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for entry in &self.inner.entries {
            let d = PyDict::new(py);
            d.set_item("seq", entry.seq)?;
            d.set_item("turn", entry.turn)?;
            d.set_item("step", entry.step)?;
            d.set_item("message", wrap(py, entry.message.clone())?)?;
            d.set_item("mid_turn", entry.mid_turn())?;
            d.set_item("interrupted", entry.interrupted)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// What ended turns claimed but never read (a prompt cancelled between its claim and its
    /// entry, a batch a `pre_step` rejected, a turn whose process died), and nothing inserted
    /// again since: dicts `{seq, turn, target, message, ending}`, in claim order. `seq` is the
    /// claim's splice, `target` the list it was claimed from, `ending` its turn's `turn/end`
    /// reason. `loop.requeue_claimed(turn)` sends them again.
    fn unread<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for claim in &self.inner.unread {
            let Ok(message) = crate::message::Message::from_value(&claim.message) else { continue };
            let d = PyDict::new(py);
            d.set_item("seq", claim.seq)?;
            d.set_item("turn", claim.turn)?;
            d.set_item("target", claim.target.as_str())?;
            d.set_item("message", wrap(py, std::sync::Arc::new(message))?)?;
            let ending = self.inner.endings.iter().find(|e| e.turn == claim.turn).map(|e| &e.reason);
            d.set_item("ending", to_py(py, ending.unwrap_or(&serde_json::Value::Null))?)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// How each turn ended, in order: dicts `{seq, turn, reason}` (`reason` as in `turn/end`:
    /// `{"kind": "completed" | "max-tokens" | "blocked" | "error" | "aborted" | "interrupted", ...}`).
    #[getter]
    fn endings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for ending in &self.inner.endings {
            let d = PyDict::new(py);
            d.set_item("seq", ending.seq)?;
            d.set_item("turn", ending.turn)?;
            d.set_item("reason", to_py(py, &ending.reason)?)?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let session = pyo3::types::PyString::new(py, &self.session_id).repr()?;
        Ok(format!("<Transcript session={session} messages={} turns={}>", self.inner.entries.len(), self.inner.endings.len()))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::html::render(slf.as_any(), "transcript")
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTranscript>()
}
