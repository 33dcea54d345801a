//! The Python objects the driver calls, and the decisions it reads without calling Python.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyType};

/// The Python objects the driver calls, looked up once.
pub(super) struct Helpers {
    pub(super) decision: Py<PyAny>,
    pub(super) failure_of: Py<PyAny>,
    pub(super) emit_error: Py<PyAny>,
    pub(super) fence: Py<PyAny>,
    pub(super) error_chain: Py<PyAny>,
    pub(super) run_tools: Py<PyAny>,
    /// For a lone call the driver runs itself (`tool.rs`): the `ToolContext` class, the
    /// arguments decoder's `decode`, `inspect.isawaitable`, and `_tools`' outcome builders and
    /// `_commit` (everything but a plain str result goes through those, so it reads the same).
    pub(super) tool_context: Py<PyAny>,
    pub(super) decode_arguments: Py<PyAny>,
    pub(super) is_awaitable: Py<PyAny>,
    pub(super) aborted_before: Py<PyAny>,
    pub(super) bad_arguments: Py<PyAny>,
    pub(super) raised: Py<PyAny>,
    pub(super) returned: Py<PyAny>,
    pub(super) commit: Py<PyAny>,
    pub(super) assembler: Py<PyAny>,
    pub(super) uncancel: Py<PyAny>,
    pub(super) turn_failure: Py<PyAny>,
    pub(super) aborted: Py<PyAny>,
    pub(super) pre_step: Py<PyAny>,
    pub(super) turn_stopping: Py<PyAny>,
    pub(super) enter: Py<PyAny>,
    pub(super) model_request: Py<PyAny>,
    pub(super) model_reply: Py<PyAny>,
    pub(super) request_failure: Py<PyAny>,
    pub(super) retry: Py<PyAny>,
    pub(super) model_error: Py<PyAny>,
    pub(super) user_message: Py<PyAny>,
    pub(super) next: Py<PyAny>,
    pub(super) json_dumps: Py<PyAny>,
    pub(super) canonical: Py<PyDict>,
    pub(super) signal: Py<PyAny>,
    pub(super) serial: Py<PyAny>,
    pub(super) sleep: Py<PyAny>,
    pub(super) current_task: Py<PyAny>,
    pub(super) cancelled_error: Py<PyType>,
    pub(super) logger: Py<PyAny>,
    /// `Task.cancelling()` exists (Python 3.11+).
    pub(super) cancelling: bool,
}

static HELPERS: PyOnceLock<Helpers> = PyOnceLock::new();

pub(super) fn helpers(py: Python<'_>) -> PyResult<&Helpers> {
    HELPERS.get_or_try_init(py, || {
        let turn = py.import("kerman._turn")?;
        let types = py.import("kerman.types")?;
        let dispatch = py.import("kerman._dispatch")?;
        let asyncio = py.import("asyncio")?;
        let core = py.import("kerman._core")?;
        let tools = py.import("kerman._tools")?;
        let get = |m: &Bound<'_, PyModule>, name: &str| m.getattr(name).map(Bound::unbind);
        Ok(Helpers {
            decision: get(&turn, "_decision")?,
            failure_of: get(&turn, "failure_of")?,
            emit_error: get(&turn, "emit_error")?,
            fence: get(&turn, "fence")?,
            error_chain: get(&turn, "error_chain")?,
            run_tools: get(&tools, "run_tools")?,
            tool_context: get(&types, "ToolContext")?,
            decode_arguments: get(&tools, "_decode_arguments")?,
            is_awaitable: get(&py.import("inspect")?, "isawaitable")?,
            aborted_before: get(&tools, "_aborted_before")?,
            bad_arguments: get(&tools, "_bad_arguments")?,
            raised: get(&tools, "_raised")?,
            returned: get(&tools, "_returned")?,
            commit: get(&tools, "_commit")?,
            assembler: get(&turn, "_Assembler")?,
            uncancel: get(&turn, "_uncancel")?,
            turn_failure: get(&turn, "TurnFailure")?,
            aborted: get(&turn, "_Aborted")?,
            pre_step: get(&types, "PreStep")?,
            turn_stopping: get(&types, "TurnStopping")?,
            enter: get(&types, "Enter")?,
            model_request: get(&types, "ModelRequest")?,
            model_reply: get(&types, "ModelReply")?,
            request_failure: get(&types, "RequestFailure")?,
            retry: get(&types, "Retry")?,
            model_error: get(&py.import("kerman.errors")?, "ModelError")?,
            user_message: get(&core, "UserMessage")?,
            next: get(&core, "Next")?,
            json_dumps: get(&py.import("json")?, "dumps")?,
            canonical: {
                // `json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)`
                let kwargs = PyDict::new(py);
                kwargs.set_item("sort_keys", true)?;
                kwargs.set_item("separators", (",", ":"))?;
                kwargs.set_item("allow_nan", false)?;
                kwargs.unbind()
            },
            signal: get(&types, "Signal")?,
            serial: get(&dispatch, "serial")?,
            sleep: get(&asyncio, "sleep")?,
            current_task: get(&asyncio, "current_task")?,
            cancelled_error: asyncio.getattr("CancelledError")?.cast_into::<PyType>()?.unbind(),
            logger: py.import("logging")?.call_method1("getLogger", ("kerman",))?.unbind(),
            cancelling: py.version_info() >= (3, 11),
        })
    })
}

/// The exception of `err` with its traceback attached (`__traceback__`): before Python 3.12 a
/// fetched error keeps its traceback beside the value, and a report of a user's bug without it
/// would not say where the bug is.
pub(super) fn exception<'py>(py: Python<'py>, err: &PyErr) -> Bound<'py, pyo3::exceptions::PyBaseException> {
    err.clone_ref(py).into_value(py).into_bound(py)
}

pub(super) fn is_cancelled(py: Python<'_>, h: &Helpers, err: &PyErr) -> bool {
    err.is_instance(py, h.cancelled_error.bind(py))
}

/// `_turn._decision(value)` for the common case, an `Enter` of a list of `UserMessage`s: a
/// copy of the list. `None` for anything else (left to `_decision`).
pub(super) fn entered<'py>(value: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
    let py = value.py();
    let h = helpers(py)?;
    if !value.get_type().is(h.enter.bind(py)) {
        return Ok(None);
    }
    let messages = value.getattr(intern!(py, "messages"))?;
    let Ok(messages) = messages.cast_exact::<PyList>() else { return Ok(None) };
    let user_message = h.user_message.bind(py);
    for message in messages.iter() {
        if !message.is_instance(user_message)? {
            return Ok(None);
        }
    }
    Ok(Some(py.get_type::<PyList>().call1((messages,))?.cast_into::<PyList>()?))
}
