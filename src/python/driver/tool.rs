//! A step's lone tool call, run by the driver itself (reference 5.8, SPEC 4.4).
//!
//! A lone call has nothing to run beside it, so it needs no pool: the driver logs `tool/call`,
//! builds the `ToolContext`, decodes the arguments, awaits the body in a copy of its context
//! (`context.rs`), and commits `tool/result` — what `kerman._tools._run_inline` does, without
//! a Python coroutine and its bookkeeping per call. Everything but the common ending (a plain
//! `str` result) is worded by `_tools`' own outcome builders and committed by its `_commit`, so
//! error results, `ToolResult`s and invalid results read exactly as from the pool.
//!
//! Several calls, a call the loop cannot run here (unknown tool, aborted signal, a checkpoint
//! barrier to await first, Python 3.10) and anything unusual about the call block go to
//! `_tools.run_tools` as before.

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyList, PyString};

use serde_json::Value;
use std::sync::Arc;

use super::super::convert::to_py;
use super::super::message::wrap;
use super::context::{copy_context, run_in, InContext};
use super::delegate::{await_iter, send_into, Sent};
use super::helpers::{exception, helpers, is_cancelled};
use super::step::{StepBody, StepEnd};
use super::{Machine, Pending};
use crate::json::push_str_literal;
use crate::message::Message;

/// What the body gave: a plain `str` (committed here), or `_tools`' outcome tuple.
enum Outcome {
    Text(Py<PyString>),
    Other(Py<PyAny>),
}

/// The lone call while it runs (kept in the step between its awaits).
pub(super) struct LoneCall {
    call: Py<PyDict>,
    id: Py<PyString>,
    tool: Py<PyAny>,
    seq: u64,
    outcome: Option<Outcome>,
}

impl LoneCall {
    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.call)?;
        visit.call(&self.id)?;
        visit.call(&self.tool)?;
        match &self.outcome {
            Some(Outcome::Text(text)) => visit.call(text),
            Some(Outcome::Other(other)) => visit.call(other),
            None => Ok(()),
        }
    }
}

/// How the body's first step went.
enum Started<'py> {
    /// It suspended: the driver awaits this (an `InContext`).
    Suspended(Bound<'py, PyAny>),
    /// It finished (or never ran); `Err` is an exception the step does not survive.
    Finished(PyResult<Outcome>),
}

/// `field` of a call block, when it is an exact `str`.
fn str_field<'py>(call: &Bound<'py, PyDict>, field: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyString>>> {
    Ok(call.get_item(field)?.and_then(|v| v.cast_into_exact::<PyString>().ok()))
}

/// The arguments as `_tools._ARGUMENTS.decode` would decode them, when serde_json's reading is
/// certainly the same: parsed, and no number that could differ (a float too large to have been
/// an integer that fits, or `-0`, which Python reads as the int 0). Anything serde_json refuses
/// (NaN, lone surrogates, numbers out of range, deep nesting, ...) is left to Python, which
/// accepts it or words the error.
fn plain_json(text: &str) -> Option<Value> {
    fn exact(value: &Value) -> bool {
        match value {
            Value::Number(n) => match n.as_f64() {
                _ if n.is_i64() || n.is_u64() => true,
                // An integer literal beyond 64 bits arrives as a float (Python keeps an int).
                Some(f) => f.abs() < 9.2e18 && !(f == 0.0 && f.is_sign_negative()),
                None => false,
            },
            Value::Array(items) => items.iter().all(exact),
            Value::Object(map) => map.values().all(exact),
            _ => true,
        }
    }
    let value: Value = serde_json::from_str(text).ok()?;
    exact(&value).then_some(value)
}

/// `,"key":"value"` — a call field as `_append_owned` writes it.
fn push_field(out: &mut String, key: &str, value: &str) {
    out.push_str(",\"");
    out.push_str(key);
    out.push_str("\":");
    push_str_literal(out, value);
}

impl Machine {
    /// Runs the step's tool calls here when there is exactly one the driver can run itself;
    /// `None` leaves them to `_tools.run_tools`.
    pub(super) fn lone_call<'py>(&mut self, py: Python<'py>, calls: &Bound<'py, PyList>) -> PyResult<Option<StepBody<'py>>> {
        let h = helpers(py)?;
        // Python 3.10 has no `Task.cancelling()` to tell an outside cancellation apart; a
        // checkpoint barrier before the body is left to the Python path, which awaits it.
        if calls.len() != 1 || !h.cancelling || self.log.get().inner.checkpoints() || self.aborted(py)? {
            return Ok(None);
        }
        let Ok(call) = calls.get_item(0)?.cast_into_exact::<PyDict>() else { return Ok(None) };
        let (Some(id), Some(name), Some(arguments)) = (
            str_field(&call, intern!(py, "id"))?,
            str_field(&call, intern!(py, "name"))?,
            str_field(&call, intern!(py, "arguments"))?,
        ) else {
            return Ok(None);
        };
        let (Ok(id_text), Ok(name_text), Ok(arguments_text)) = (id.to_str(), name.to_str(), arguments.to_str()) else {
            return Ok(None);
        };
        let tools = self.agent(py).getattr(intern!(py, "_tools"))?;
        let Ok(tools) = tools.cast_exact::<PyDict>() else { return Ok(None) };
        let tool = match tools.get_item(&name)? {
            Some(tool) if !tool.is_none() => tool,
            _ => return Ok(None),
        };
        // `tool/call`: {"turn", "step", "callId", "name", "arguments"}.
        let mut data = self.turn_step_head(py)?;
        push_field(&mut data, "callId", id_text);
        push_field(&mut data, "name", name_text);
        push_field(&mut data, "arguments", arguments_text);
        data.push('}');
        let seq = self.append_message(py, "tool/call", data, None, None)?;
        let ctx = h.tool_context.bind(py).call1((&id, self.turn_no(py), self.step_no(py), self.signal(py)?, self.agent(py)))?;
        // From here until the body is done, cancel() throws into the driver's task.
        self.agent(py).setattr(intern!(py, "_in_user"), true)?;
        self.work()?.lone = Some(LoneCall { call: call.unbind(), id: id.unbind(), tool: tool.clone().unbind(), seq, outcome: None });
        let raw = if arguments_text.is_empty() { intern!(py, "{}").clone() } else { arguments };
        let started = self.lone_start(py, &tool, raw, ctx);
        Ok(Some(match started {
            Started::Suspended(iter) => StepBody::Await(iter, Pending::Tool),
            Started::Finished(outcome) => self.lone_done(py, outcome)?,
        }))
    }

    /// `_invoke_body` up to the body's first suspension.
    fn lone_start<'py>(&self, py: Python<'py>, tool: &Bound<'py, PyAny>, raw: Bound<'py, PyString>, ctx: Bound<'py, PyAny>) -> Started<'py> {
        let h = match helpers(py) {
            Ok(h) => h,
            Err(e) => return Started::Finished(Err(e)),
        };
        // An observer of `tool/call` may have aborted the turn.
        match self.aborted(py) {
            Ok(false) => {}
            Ok(true) => return Started::Finished(h.aborted_before.bind(py).call0().map(|o| Outcome::Other(o.unbind()))),
            Err(e) => return Started::Finished(Err(e)),
        }
        let fast = raw.to_str().ok().and_then(plain_json).map(|value| to_py(py, &value));
        let decoded = match fast {
            Some(args) => args,
            None => h.decode_arguments.bind(py).call1((raw,)),
        };
        let args = match decoded {
            Ok(args) => args,
            Err(e) if e.is_instance_of::<PyValueError>(py) => {
                return Started::Finished(h.bad_arguments.bind(py).call1((e.value(py),)).map(|o| Outcome::Other(o.unbind())))
            }
            Err(e) => return Started::Finished(Err(e)),
        };
        let context = match copy_context(py) {
            Ok(context) => context,
            Err(e) => return Started::Finished(Err(e)),
        };
        let first = run_in(&context, || -> PyResult<Result<Bound<'py, PyAny>, (Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
            let value = tool.getattr(intern!(py, "fn"))?.call1((args, ctx))?;
            // SAFETY: a type check on a live object.
            let coroutine = unsafe { ffi::PyCoro_CheckExact(value.as_ptr()) } != 0;
            if !coroutine && !h.is_awaitable.bind(py).call1((&value,))?.is_truthy()? {
                return Ok(Ok(value));
            }
            let iter = await_iter(value)?;
            match send_into(&iter, &py.None().into_bound(py)) {
                Sent::Next(yielded) => Ok(Err((iter, yielded))),
                Sent::Return(value) => Ok(Ok(value)),
                Sent::Error(e) => Err(e),
            }
        });
        match first.and_then(|r| r) {
            Ok(Ok(value)) => Started::Finished(self.returned(py, tool, value)),
            Ok(Err((iter, yielded))) => match Bound::new(py, InContext::new(iter, context, yielded)) {
                Ok(awaited) => Started::Suspended(awaited.into_any()),
                Err(e) => Started::Finished(Err(e)),
            },
            Err(e) => Started::Finished(self.raised(py, e)),
        }
    }

    /// What the body returned, as an outcome.
    fn returned<'py>(&self, py: Python<'py>, tool: &Bound<'py, PyAny>, value: Bound<'py, PyAny>) -> PyResult<Outcome> {
        match value.cast_into_exact::<PyString>() {
            Ok(text) => Ok(Outcome::Text(text.unbind())),
            Err(e) => Ok(Outcome::Other(helpers(py)?.returned.bind(py).call1((tool, e.into_inner()))?.unbind())),
        }
    }

    /// What the body raised: its `CancelledError` and its `Exception`s are outcomes, anything
    /// else ends the step.
    fn raised(&self, py: Python<'_>, e: PyErr) -> PyResult<Outcome> {
        let h = helpers(py)?;
        if !is_cancelled(py, h, &e) && !e.is_instance_of::<PyException>(py) {
            return Err(e);
        }
        Ok(Outcome::Other(h.raised.bind(py).call1((exception(py, &e),))?.unbind()))
    }

    /// The suspended body finished with `outcome` (its return value or exception).
    pub(super) fn lone_resumed<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        let done = match outcome {
            Ok(value) => {
                let tool = self.lone()?.tool.bind(py).clone();
                self.returned(py, &tool, value)
            }
            Err(e) => self.raised(py, e),
        };
        self.lone_done(py, done)
    }

    fn lone(&mut self) -> PyResult<&mut LoneCall> {
        self.work()?.lone.as_mut().ok_or_else(|| pyo3::exceptions::PySystemError::new_err("the driver lost its tool call"))
    }

    /// The body is done: absorb a cancellation `cancel()` threw (as after a listener), or note
    /// one from outside, then commit.
    fn lone_done<'py>(&mut self, py: Python<'py>, outcome: PyResult<Outcome>) -> PyResult<StepBody<'py>> {
        let agent = self.agent(py).clone();
        agent.setattr(intern!(py, "_in_user"), false)?;
        let outcome = outcome?;
        self.lone()?.outcome = Some(outcome);
        if agent.getattr(intern!(py, "_thrown"))?.is_truthy()? {
            // The throw may still be pending (the body returned before it landed): consume it.
            let sleep = await_iter(helpers(py)?.sleep.bind(py).call1((0,))?)?;
            return Ok(StepBody::Await(sleep, Pending::ToolAbsorb));
        }
        let task = agent.getattr(intern!(py, "_task"))?;
        // Cancelled from outside while the call ran: its result is committed all the same (the
        // log never holds a call without its result), then the cancellation goes on.
        let external = !task.is_none() && task.call_method0(intern!(py, "cancelling"))?.is_truthy()?;
        self.lone_commit(py, external)
    }

    /// The `sleep(0)` absorbing a thrown cancellation finished.
    pub(super) fn lone_absorbed<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        if let Err(e) = outcome {
            if !is_cancelled(py, h, &e) {
                return Err(e);
            }
        }
        h.uncancel.bind(py).call1((self.agent(py),))?;
        self.lone_commit(py, false)
    }

    /// `_commit`: the result is logged; a plain `str` here, anything else by `_tools._commit`.
    fn lone_commit<'py>(&mut self, py: Python<'py>, external: bool) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        let lone = self.work()?.lone.take().ok_or_else(|| pyo3::exceptions::PySystemError::new_err("the driver lost its tool call"))?;
        let outcome = lone.outcome.ok_or_else(|| pyo3::exceptions::PySystemError::new_err("the driver lost its tool outcome"))?;
        let concludes = match outcome {
            Outcome::Text(text) if self.commit_text(py, &lone.id, lone.seq, text.bind(py))? => false,
            outcome => {
                let outcome = match outcome {
                    // A str the message refused (say, a lone surrogate): worded by `_commit`.
                    Outcome::Text(text) => h.returned.bind(py).call1((lone.tool.bind(py), text))?,
                    Outcome::Other(other) => other.into_bound(py),
                };
                let args = (self.agent(py), self.turn_no(py), self.step_no(py), lone.call.bind(py), lone.seq, outcome);
                h.commit.bind(py).call1(args)?.is_truthy()?
            }
        };
        if external {
            return Err(PyErr::from_value(h.cancelled_error.bind(py).call0()?));
        }
        Ok(StepBody::Done(if concludes { StepEnd::Completed } else { StepEnd::Again }))
    }

    /// `_record` of a plain `str` result: `tool/result` {"turn", "step", "message"}, citing the
    /// call; the message joins the history. `false` (nothing logged) when the text is not
    /// valid Unicode (a lone surrogate), for `_commit` to word the failure.
    fn commit_text(&self, py: Python<'_>, id: &Py<PyString>, seq: u64, text: &Bound<'_, PyString>) -> PyResult<bool> {
        let (Ok(id), Ok(text)) = (id.bind(py).to_str(), text.to_str()) else { return Ok(false) };
        let message = Message::tool_result_text(id, text);
        let mut data = self.turn_step_head(py)?;
        data.push_str(r#","message":"#);
        data.push_str(message.json());
        data.push('}');
        let message = wrap(py, Arc::new(message))?;
        self.append_message(py, "tool/result", data, Some(vec![seq]), Some(&message))?;
        Ok(true)
    }
}
