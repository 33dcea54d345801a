//! A driver run: the machine and the Python objects of its current step, and what it awaits
//! (`Pending`) and does next (`Step`). The driver (`driver.rs`), the seams (`seams.rs`) and the
//! tool runs (`tools.rs`) each add their part of `Run`'s methods.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::PyBaseException;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyList;

use super::super::errors::{inbox_err, log_err, message_err};
use super::read;
use super::{Parts, PyLoopCore};
use crate::agent_loop::{CoreError, Ctx, InDoubt, Input, Machine, Outcome, Raised, RaisedKind, SideEffect, ToolInfo, ToolPlan};

/// The user-code seams the driver awaits (`seams.rs`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Seam {
    PreStep,
    BeforeRequest,
    Model,
    Chunk,
    RequestError,
    Stopping,
    BeforeTool,
}

/// What the driver is awaiting.
pub(super) enum Pending {
    /// User code at a seam.
    User(Seam),
    /// `asyncio.sleep(0)` absorbing a self-thrown cancellation; `result` is the seam's.
    Absorb { seam: Seam, result: Py<PyAny> },
    /// `log.flush()`, the checkpoint barrier before a model request.
    Flush,
    /// `aclose()` of a stream that failed or was aborted.
    CloseStream,
    /// The executor running a plan of several tool calls.
    Tools,
    /// The checkpoint barrier before a lone call's body.
    ToolFlush,
    /// A lone call's body, suspended (an `InContext`).
    Tool,
    /// `asyncio.sleep(0)` absorbing a cancellation thrown into that body.
    ToolAbsorb,
}

/// How the driver goes on after an effect or an await.
#[allow(clippy::large_enum_variant, reason = "a step lives for one hop of the driver; boxing its input would allocate on every effect")]
pub(super) enum Step<'py> {
    /// Feed this to the machine.
    Input(Input),
    /// Await this.
    Await(Bound<'py, PyAny>, Pending),
    /// The run is over.
    Finished,
}

/// A driver run: the machine and the Python objects of its current step.
pub(super) struct Run {
    pub agent: Py<PyAny>,
    pub core: Py<PyLoopCore>,
    pub parts: Arc<Parts>,
    pub machine: Machine,
    pub started: bool,
    /// The awaited delegate, while suspended in it.
    pub inner: Option<(Py<PyAny>, Pending)>,
    /// The step's entered messages (the Python objects), its request and its stream.
    pub entered: Option<Py<PyList>>,
    pub request: Option<Py<PyAny>>,
    pub stream: Option<Py<PyAny>>,
    /// The lone tool call the driver runs itself.
    pub lone: Option<Lone>,
    /// The executor's run of a plan of several calls (a `ToolRun`, `tools.rs`).
    #[allow(clippy::struct_field_names, reason = "named after the Python class it holds, ToolRun")]
    pub tool_run: Option<Py<PyAny>>,
    /// The failed attempts the exception a model call raised carries (`read::failed_attempts`),
    /// until its failure reaches the machine.
    pub failed_attempts: Vec<serde_json::Value>,
    /// The exception behind the last failure the machine was told of (for its report).
    pub last_exc: Option<Py<PyBaseException>>,
    /// The exception the run ends with, if the machine says it propagates.
    pub propagating: Option<Py<PyBaseException>>,
    /// The task running this driver, once asked for: it never changes while the run lasts,
    /// and `asyncio.current_task()` is a Python call and, on 3.11, a `getpid` system call.
    pub task: std::sync::OnceLock<Py<PyAny>>,
    /// The effect a resumed step starts with (a held step taken up again), performed at the
    /// first `send` instead of starting a turn.
    pub first: Option<crate::agent_loop::Effect>,
}

/// What the loop knows of the tool of `name`, when one is registered: whether it runs alone
/// (`parallel=False`), its effect class and in-doubt policy (a callable policy reconciles).
pub(super) fn tool_lookup(tools: &Bound<'_, pyo3::types::PyDict>, name: &str) -> Option<ToolInfo> {
    let py = tools.py();
    let tool = tools.get_item(name).ok().flatten().filter(|t| !t.is_none())?;
    let parallel = tool.getattr(intern!(py, "parallel")).and_then(|p| p.is_truthy()).unwrap_or(true);
    // A tool without the attributes (a duck-typed one) has the defaults.
    let effect = tool
        .getattr(intern!(py, "effect"))
        .ok()
        .and_then(|v| v.extract::<String>().ok())
        .and_then(|v| SideEffect::parse(&v))
        .unwrap_or_default();
    let in_doubt = match tool.getattr(intern!(py, "on_in_doubt")).ok().filter(|v| !v.is_none()) {
        Some(v) if v.is_callable() => InDoubt::Reconcile,
        Some(v) => v.extract::<String>().ok().and_then(|v| InDoubt::parse(&v)).unwrap_or_default(),
        None => InDoubt::Fail,
    };
    Some(ToolInfo { exclusive: !parallel, effect, in_doubt })
}

/// The host's exception for a core error.
pub(super) fn core_err(py: Python<'_>, e: CoreError) -> PyErr {
    match e {
        CoreError::Log(e) => log_err(py, e),
        CoreError::Inbox(e) => inbox_err(py, e),
        CoreError::Message(e) => message_err(py, e),
    }
}

impl Run {
    pub fn core<'py>(&self, py: Python<'py>) -> &Bound<'py, PyLoopCore> {
        self.core.bind(py)
    }

    /// Runs `f` with the machine's context (the log, the inbox, the shared state, the tools).
    pub fn with_ctx<R>(&mut self, py: Python<'_>, f: impl FnOnce(&mut Machine, &Ctx<'_>) -> R) -> R {
        let parts = Arc::clone(&self.parts);
        let core = self.core.bind(py).get();
        let tools = parts.tools.bind(py);
        let lookup = |name: &str| tool_lookup(tools, name);
        f(&mut self.machine, &parts.ctx(core, &lookup))
    }

    /// How an exception reads to the machine; keeps it for the report (and for propagating).
    pub fn raised(&mut self, py: Python<'_>, err: PyErr) -> Input {
        let (raised, propagates) = match read::raised(&self.parts, py, &err) {
            Ok(classified) => classified,
            // Describing it failed: the failure says what it can.
            Err(_) => (
                Raised::new(RaisedKind::Error, crate::agent_loop::Failure::new(crate::agent_loop::FailureCode::Unknown, err.to_string())),
                false,
            ),
        };
        // Kept as the exception object (its traceback attached), which the collector can see.
        let exc = err.into_value(py);
        if propagates {
            self.propagating = Some(exc.clone_ref(py));
        }
        if raised.kind != RaisedKind::Cancelled {
            self.last_exc = Some(exc);
        }
        Input::Raised(raised)
    }

    pub fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.agent)?;
        visit.call(&self.core)?;
        for obj in [&self.request, &self.stream].into_iter().flatten() {
            visit.call(obj)?;
        }
        if let Some(entered) = &self.entered {
            visit.call(entered)?;
        }
        if let Some(run) = &self.tool_run {
            visit.call(run)?;
        }
        for exc in [&self.last_exc, &self.propagating].into_iter().flatten() {
            visit.call(exc)?;
        }
        if let Some(task) = self.task.get() {
            visit.call(task)?;
        }
        if let Some(lone) = &self.lone {
            lone.visit(visit)?;
        }
        if let Some((iter, pending)) = &self.inner {
            visit.call(iter)?;
            if let Pending::Absorb { result, .. } = pending {
                visit.call(result)?;
            }
        }
        Ok(())
    }
}

/// The lone call while it runs (kept in the run between its awaits).
pub(super) struct Lone {
    pub plan: ToolPlan,
    pub tool: Py<PyAny>,
    pub outcome: Option<Outcome>,
    pub exceptions: HashMap<usize, Py<PyBaseException>>,
    /// What the body raised that propagates once its result is committed.
    pub fatal: Option<Py<PyBaseException>>,
}

impl Lone {
    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.tool)?;
        for exc in self.exceptions.values().chain(&self.fatal) {
            visit.call(exc)?;
        }
        Ok(())
    }
}
