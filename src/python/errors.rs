//! Maps core errors onto the Python hierarchy in `kerman.errors`, in one place.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::event_log::LogError;
use crate::inbox::{InboxError, ProjectionError};
use crate::message::MessageError;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub(crate) fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS.get_or_try_init(py, || py.import("kerman.errors").map(Bound::unbind))?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// Builds `kerman.errors.<name>(*args)` as a `PyErr`.
pub fn new_err<'py>(py: Python<'py>, name: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    match class(py, name).and_then(|cls| cls.call1(args)) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

pub fn message_err(py: Python<'_>, e: MessageError) -> PyErr {
    new_err(py, "InvalidMessageError", (e.to_string(), e.field))
}

pub fn not_json(py: Python<'_>, event_type: &str, detail: String) -> PyErr {
    log_err(py, LogError::NotJson { event_type: event_type.into(), detail })
}

pub fn log_err(py: Python<'_>, e: LogError) -> PyErr {
    let text = e.to_string();
    match e {
        LogError::NotJson { .. } => new_err(py, "NotJsonError", (text,)),
        LogError::Reentrant => new_err(py, "ReentrantAppendError", (text,)),
        LogError::ReservedType(_) | LogError::InvalidType(_) | LogError::InvalidId(_) => PyValueError::new_err(text),
        LogError::Unstorable(_) | LogError::InvalidFork(_) => PyValueError::new_err(text),
        LogError::InvalidEvent(_) => new_err(py, "LogError", (text,)),
        LogError::Corrupt { path, line, seq, .. } => new_err(py, "CorruptLogError", (text, path.display().to_string(), line, seq)),
        LogError::UnsupportedFormat { path, found, supported } => {
            new_err(py, "UnsupportedFormatError", (text, path.display().to_string(), found, supported))
        }
        LogError::Locked { .. } => new_err(py, "SessionLockedError", (text,)),
        LogError::LockedHere { .. } => {
            let how = "log.close(), or open it as `with store.open(id) as log:` so it closes itself; \
                       a handle dropped but not yet garbage-collected is released by gc.collect()";
            new_err(py, "SessionLockedError", (format!("{text} ({how})"),))
        }
        LogError::NotFound { .. } => new_err(py, "SessionNotFoundError", (text,)),
        LogError::Exists { .. } => new_err(py, "SessionExistsError", (text,)),
        LogError::Closed { .. } => new_err(py, "LogClosedError", (text,)),
        LogError::Write { .. } => new_err(py, "LogWriteError", (text,)),
        LogError::LeaseLost { .. } => new_err(py, "LeaseLostError", (text,)),
        LogError::HasForks { forks, .. } => new_err(py, "SessionHasForksError", (text, forks)),
        LogError::Io { .. }
        | LogError::Database { .. }
        | LogError::ReadOnly { .. }
        | LogError::Forked { .. }
        | LogError::BrokenFork { .. } => new_err(py, "LogError", (text,)),
    }
}

pub fn inbox_err(py: Python<'_>, e: InboxError) -> PyErr {
    match e {
        InboxError::Duplicate(ref id) => {
            let id = id.clone();
            new_err(py, "DuplicateMessageError", (e.to_string(), id))
        }
        InboxError::NotUserMessage(_) => PyTypeError::new_err(e.to_string()),
        InboxError::Log(e) => log_err(py, e),
        InboxError::Projection(e) => projection_err(py, &e),
        // `InboxError` itself, not a subclass: nothing to catch them apart by yet.
        InboxError::Attached(_) | InboxError::Closed(_) => new_err(py, "InboxError", (e.to_string(),)),
        // The insertion transform's own exception (or the InsertRefusedError made for its
        // refusal), raised to the caller as it was.
        InboxError::Refused(r) => match r.cause.and_then(|cause| cause.downcast::<PyErr>().ok()) {
            Some(err) => *err,
            None => new_err(py, "InsertRefusedError", (r.detail,)),
        },
    }
}

pub fn projection_err(py: Python<'_>, e: &ProjectionError) -> PyErr {
    new_err(py, "ProjectionError", (e.to_string(), e.seq))
}

/// Logs a contained failure of user code (an observer or listener) on the `kerman` logger.
pub fn report_contained(py: Python<'_>, what: &str, err: &PyErr) {
    let logged = (|| -> PyResult<()> {
        let logger = py.import("logging")?.call_method1("getLogger", ("kerman",))?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("exc_info", err.value(py))?;
        logger.call_method("error", (format!("{what} raised {}", err.value(py)),), Some(&kwargs))?;
        Ok(())
    })();
    if logged.is_err() {
        err.print(py);
    }
}

/// Logs a warning on the `kerman` logger.
pub fn warn(py: Python<'_>, text: &str) {
    let _ = py.import("logging").and_then(|m| m.call_method1("getLogger", ("kerman",))).and_then(|l| l.call_method1("warning", (text,)));
}
