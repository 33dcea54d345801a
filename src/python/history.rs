//! The AgentLoop's derived history (the messages of the log's surface events, in log order),
//! kept current as the loop appends instead of re-read from the log for every request.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::event_log::PySessionLog;

struct State {
    messages: Vec<Py<PyAny>>,
    /// Every event before this seq has been folded in.
    pos: u64,
}

/// Private to the AgentLoop (`loop._history`).
#[pyclass(name = "LoopHistory", module = "kerman._core", frozen)]
pub struct PyHistory {
    state: Mutex<State>,
}

impl PyHistory {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Only ever locked for plain Vec operations: a poisoned lock still holds valid data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Folds the surface events before `stop` that are not folded yet, decoding them from the
    /// log (events someone else appended; the loop's own join through `remember`).
    pub fn catch_up(&self, py: Python<'_>, log: &PySessionLog, stop: u64) -> PyResult<()> {
        let start = self.state().pos;
        if start >= stop {
            return Ok(());
        }
        // Decoded without the lock held: decoding builds Python objects.
        let decoded = log.surface_messages(py, start, Some(stop))?;
        let mut state = self.state();
        if state.pos == start {
            state.messages.extend(decoded.into_iter().map(Bound::unbind));
            state.pos = stop;
        }
        Ok(())
    }

    /// The loop appended the event at `seq`, carrying `message` if it is a surface event: it
    /// joins directly once everything before it is folded.
    pub fn push(&self, py: Python<'_>, log: &PySessionLog, seq: u64, message: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.catch_up(py, log, seq)?;
        self.advance(seq, message.map(|m| m.clone().unbind()));
        Ok(())
    }

    /// Folds the event at `seq` (carrying `message`, if a surface event) when everything
    /// before it is folded; otherwise leaves it to the next catch-up.
    fn advance(&self, seq: u64, message: Option<Py<PyAny>>) {
        let mut state = self.state();
        if state.pos == seq {
            state.messages.extend(message);
            state.pos = seq + 1;
        }
    }

    /// A fresh list of the messages (what a request carries).
    pub fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let state = self.state();
        PyList::new(py, state.messages.iter().map(|m| m.bind(py)))
    }
}

#[pymethods]
impl PyHistory {
    #[new]
    fn new() -> Self {
        PyHistory { state: Mutex::new(State { messages: Vec::new(), pos: 0 }) }
    }

    /// For the tool scheduler: like the driver's own appends, without the catch-up (a gap is
    /// decoded by the driver before the next request).
    #[pyo3(signature = (seq, message=None))]
    fn remember(&self, seq: u64, message: Option<Py<PyAny>>) {
        self.advance(seq, message);
    }

    /// The seq up to which the log is folded.
    #[getter]
    fn pos(&self) -> u64 {
        self.state().pos
    }

    /// A copy of the messages.
    fn messages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.snapshot(py)
    }

    fn __len__(&self) -> usize {
        self.state().messages.len()
    }

    fn __repr__(&self) -> String {
        let state = self.state();
        format!("<LoopHistory messages={} pos={}>", state.messages.len(), state.pos)
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        let Ok(state) = self.state.try_lock() else { return Ok(()) };
        for m in &state.messages {
            visit.call(m)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        // Dropped outside the lock: dropping may run finalizers.
        let messages = std::mem::take(&mut self.state().messages);
        drop(messages);
    }
}
