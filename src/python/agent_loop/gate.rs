//! The `before_tool` seam (`docs/decisions.md`): a gate's waterfall over one call.
//!
//! The seam runs once per call of every step of a gated loop, so what it costs is a share of
//! every tool turn; the work is the crossing, not the gate. Where the tool's `needs_approval` is
//! a bool (no tool of the name counts as `False`) the default verdict is known without asking
//! the façade's `default_gate`: with no listener the verdict goes to the machine at once (no
//! payload, no Python call), and with listeners the waterfall's default is that verdict as a
//! value. Anything else (a predicate, a tool without the attribute) is `default_gate(call)`'s to
//! decide, as before. The payload is a native `ToolCall` (`tool_call.rs`) that takes the
//! effect's strings as they are and parses the arguments only when a gate reads them.

use std::sync::Arc;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyString};

use super::super::waterfall::{Fallback, PyNext};
use super::classes;
use super::run::{Run, Seam, Step};
use super::seams::Fail;
use super::tool_call::PyToolCall;
use crate::agent_loop::{Gate, Input};

/// The one `Approve()` a default verdict that runs hands to listeners (frozen, no fields).
static APPROVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The `needs_approval` of the tool `name` when it is a bool (`false` for no tool of that
/// name); `None` when only `default_gate` can tell.
fn constant_need(tools: &Bound<'_, PyDict>, name: &Bound<'_, PyString>) -> Option<bool> {
    let py = tools.py();
    let tool = tools.get_item(name).ok()?;
    let Some(tool) = tool.filter(|t| !t.is_none()) else { return Some(false) };
    let needs = tool.getattr_opt(intern!(py, "needs_approval")).ok()??;
    needs.cast::<PyBool>().ok().map(PyBoolMethods::is_true)
}

/// The verdict object `default_gate` returns for a constant `needs_approval`.
fn default_verdict(py: Python<'_>, needs_approval: bool) -> PyResult<Py<PyAny>> {
    let c = classes(py)?;
    if needs_approval {
        return Ok(c.ask.bind(py).call0()?.unbind());
    }
    Ok(APPROVE.get_or_try_init(py, || c.approve.bind(py).call0().map(Bound::unbind))?.clone_ref(py))
}

impl Run {
    /// The `before_tool` waterfall over one call; its default is the façade's
    /// `default_gate(call)` (`Approve`, or `Ask` for a tool that needs approval).
    pub(super) fn before_tool<'py>(&mut self, py: Python<'py>, call_id: String, name: &str, arguments: String) -> PyResult<Step<'py>> {
        let parts = Arc::clone(&self.parts);
        let listeners = parts.before_tool.bind(py);
        // One `str` of the name: the tools' lookup hashes it, the payload keeps it (hashed).
        let name = PyString::new(py, name);
        let need = constant_need(parts.tools.bind(py), &name);
        if let (true, Some(need)) = (listeners.is_empty(), need) {
            return Ok(Step::Input(Input::Gated(Gate::by_default(need))));
        }
        let (turn, step) = (self.machine.turn(), self.machine.step());
        let signal = self.core(py).get().signal_obj(py);
        let call = PyToolCall::lazy(self.agent.clone_ref(py), call_id, name.unbind(), arguments, (turn, step), signal);
        let payload = Bound::new(py, call)?.into_any();
        if listeners.is_empty() {
            // A predicate, called as the waterfall's default would be: synchronously, its error
            // the seam's outcome.
            let verdict = parts.default_gate.bind(py).call1((&payload,)).map_err(Fail::Err);
            return Ok(match self.seam_result(py, Seam::BeforeTool, verdict) {
                Ok(step) => step,
                Err(e) => Step::Input(self.raised(py, e)),
            });
        }
        let fallback = match need {
            Some(need) => Fallback::Value(default_verdict(py, need)?),
            None => Fallback::CallWithPayload(parts.default_gate.clone_ref(py)),
        };
        let awaitable = PyNext::dispatch(listeners, &payload, fallback);
        Ok(self.user_begin(py, awaitable, Seam::BeforeTool))
    }
}
