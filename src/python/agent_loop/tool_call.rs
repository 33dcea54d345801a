//! `kerman.ToolCall`, the `before_tool` payload: one call of the model's, before it runs.
//!
//! The seam builds one per call of every step of a gated loop, and most gates read the name and
//! at most a few arguments (`return await next()` reads nothing), so the payload is a native
//! object holding the model's arguments as text, parsed into Python values at the first read of
//! `.arguments` and kept. Built from Python (`kerman.testing`, a user's test) it holds the
//! parsed value it was given. It keeps what the dataclass it replaces offered: the seven
//! fields by keyword or position, `repr`, equality by fields (and no hash), `copy`/`pickle`
//! through `__reduce__`, `__match_args__`, and (attached in `kerman.decisions`) the dataclass
//! field table, so `dataclasses.replace`, `fields` and `asdict` work on it.

use std::sync::OnceLock;

use pyo3::basic::CompareOp;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

/// The parsed arguments: `None` when the text is not JSON (the call then fails when it runs).
fn parse(py: Python<'_>, text: &str) -> PyResult<Py<PyAny>> {
    Ok(match super::tools::arguments(py, text)? {
        Ok(value) => value.unbind(),
        Err(_) => py.None(),
    })
}

/// The `before_tool` payload (`docs/decisions.md`): `loop`, `call_id`, `name`, `arguments`
/// (parsed; `None` when they are not JSON), `turn`, `step` and the turn's `signal`.
#[pyclass(name = "ToolCall", module = "kerman.decisions", frozen)]
pub struct PyToolCall {
    agent: Py<PyAny>,
    /// The call id, made a Python `str` at the first read (few gates read it).
    call_id: String,
    call_id_str: OnceLock<Py<PyString>>,
    name: Py<PyString>,
    /// The model's arguments text while not parsed; `None` when built with parsed arguments.
    text: Option<String>,
    /// The parsed arguments. A std `OnceLock` (as `Event.data`): `__traverse__` has no
    /// `Python` token to read a `PyOnceLock` with. Once set it never changes, so there is
    /// nothing for a `__clear__` to break; every cycle through a call passes through an object
    /// the collector can clear (its loop, or the user's containers).
    arguments: OnceLock<Py<PyAny>>,
    turn: u64,
    step: u64,
    signal: Py<PyAny>,
}

impl PyToolCall {
    /// The payload the seam hands a gate: `arguments` is the model's text, parsed when read.
    pub(super) fn lazy(
        agent: Py<PyAny>,
        call_id: String,
        name: Py<PyString>,
        arguments: String,
        (turn, step): (u64, u64),
        signal: Py<PyAny>,
    ) -> Self {
        PyToolCall {
            agent,
            call_id,
            call_id_str: OnceLock::new(),
            name,
            text: Some(arguments),
            arguments: OnceLock::new(),
            turn,
            step,
            signal,
        }
    }

    /// The seven fields in order, as the dataclass compared them.
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let (turn, step) = (self.turn.into_pyobject(py)?, self.step.into_pyobject(py)?);
        PyTuple::new(
            py,
            [
                self.agent.bind(py).clone(),
                self.call_id(py).into_bound(py).into_any(),
                self.name.bind(py).clone().into_any(),
                self.arguments(py)?.into_bound(py),
                turn.into_any(),
                step.into_any(),
                self.signal.bind(py).clone(),
            ],
        )
    }
}

#[pymethods]
impl PyToolCall {
    #[new]
    #[pyo3(signature = (r#loop, call_id, name, arguments, turn, step, signal))]
    fn new(
        r#loop: Py<PyAny>,
        call_id: Bound<'_, PyString>,
        name: Py<PyString>,
        arguments: Py<PyAny>,
        turn: u64,
        step: u64,
        signal: Py<PyAny>,
    ) -> PyResult<Self> {
        let (parsed, call_id_str) = (OnceLock::new(), OnceLock::new());
        let _ = parsed.set(arguments);
        let text = call_id.to_str()?.to_owned();
        let _ = call_id_str.set(call_id.unbind());
        Ok(PyToolCall { agent: r#loop, call_id: text, call_id_str, name, text: None, arguments: parsed, turn, step, signal })
    }

    /// The `AgentLoop` the call belongs to.
    #[getter(r#loop)]
    fn agent(&self, py: Python<'_>) -> Py<PyAny> {
        self.agent.clone_ref(py)
    }

    /// The model's id of the call.
    #[getter]
    fn call_id(&self, py: Python<'_>) -> Py<PyString> {
        self.call_id_str.get_or_init(|| PyString::new(py, &self.call_id).unbind()).clone_ref(py)
    }

    /// The tool's name.
    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    /// The parsed arguments (`None` when they are not JSON), parsed at the first read.
    #[getter]
    fn arguments(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(value) = self.arguments.get() {
            return Ok(value.clone_ref(py));
        }
        let parsed = parse(py, self.text.as_deref().unwrap_or_default())?;
        // Parsing can run Python code (the decoder's fallback, a finalizer), so another thread
        // may have parsed them meanwhile: the first one kept wins, and every reader gets it.
        Ok(self.arguments.get_or_init(|| parsed).clone_ref(py))
    }

    #[getter]
    fn turn(&self) -> u64 {
        self.turn
    }

    #[getter]
    fn step(&self) -> u64 {
        self.step
    }

    /// The turn's `Signal` (`signal.aborted`, `await signal.wait()`).
    #[getter]
    fn signal(&self, py: Python<'_>) -> Py<PyAny> {
        self.signal.clone_ref(py)
    }

    #[classattr]
    fn __match_args__(py: Python<'_>) -> PyResult<Py<PyTuple>> {
        Ok(PyTuple::new(py, ["loop", "call_id", "name", "arguments", "turn", "step", "signal"])?.unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let r = |obj: &Bound<'_, PyAny>| obj.repr().map(|s| s.to_string());
        Ok(format!(
            "ToolCall(loop={}, call_id={}, name={}, arguments={}, turn={}, step={}, signal={})",
            r(self.agent.bind(py))?,
            r(self.call_id(py).bind(py).as_any())?,
            r(self.name.bind(py).as_any())?,
            r(self.arguments(py)?.bind(py))?,
            self.turn,
            self.step,
            r(self.signal.bind(py))?,
        ))
    }

    /// Equal when every field is (as the dataclass compared: another class is not comparable).
    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyToolCall>() else { return Ok(py.NotImplemented()) };
        let equal = || -> PyResult<bool> { self.fields(py)?.eq(other.get().fields(py)?) };
        match op {
            CompareOp::Eq => Ok(pyo3::types::PyBool::new(py, equal()?).to_owned().into_any().unbind()),
            CompareOp::Ne => Ok(pyo3::types::PyBool::new(py, !equal()?).to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    /// `copy.copy` and `pickle` (when the loop and the signal pickle): rebuilt from its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        Ok((slf.get_type().into_any(), slf.get().fields(slf.py())?))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.agent)?;
        visit.call(&self.signal)?;
        visit.call(self.arguments.get())
    }
}
