//! Running a step's tool plan (reference 5.8, SPEC 4.4). The machine's `ToolPlan` decides what
//! starts, commits and is synthesised; this file runs the bodies. A plan of one call runs in
//! the driver's own task (Python 3.11+: no task, no `asyncio.wait`, two event-loop iterations
//! fewer per call); a plan of several goes to the façade's executor as a `ToolRun`, whose calls
//! each run in an asyncio task. Both read a body's outcome the same way (`returned`/`raised`)
//! and commit through the plan, so one call and many differ only in who awaits them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::{PyBaseException, PyException, PySystemError, PySystemExit, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyString, PyTuple};
use serde_json::{Map, Value};

use super::super::convert::{to_json_text, to_py};
use super::super::errors::not_json;
use super::super::message::content_arg;
use super::context::{copy_context, run_in, InContext};
use super::delegate::{await_iter, send_into, Sent};
use super::run::{core_err, Lone, Pending, Run, Step};
use super::{classes, read, Parts, PyLoopCore};
use crate::agent_loop::{Content, Ctx, FailureCode, Input, Next, Outcome, ToolPlan};
use crate::message::Message;

/// The call's arguments as Python values, or the `INVALID_ARGUMENTS` outcome.
pub(super) fn arguments<'py>(py: Python<'py>, text: &str) -> PyResult<Result<Bound<'py, PyAny>, Outcome>> {
    let text = if text.is_empty() { "{}" } else { text };
    // serde_json's reading where it is certainly the decoder's (the number policy says where);
    // the decoder accepts the rest or words the error.
    if let Some(value) = crate::json::parse_exact(text) {
        return Ok(Ok(to_py(py, &value)?));
    }
    Ok(read::decode_arguments(py, &PyString::new(py, text))?.map_err(|detail| Outcome::bad_arguments(&detail)))
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value.get_type().name().map(|n| n.to_string()).unwrap_or_default()
}

fn callable_name(f: &Bound<'_, PyAny>) -> Option<String> {
    let py = f.py();
    for attr in [intern!(py, "__qualname__"), intern!(py, "__name__")] {
        if let Ok(Some(name)) = f.getattr_opt(attr) {
            if let Ok(name) = name.extract::<String>() {
                return Some(name);
            }
        }
    }
    None
}

/// A body's return value as its outcome: a `str`, a `ToolResult`, or a `TOOL_ERROR`.
/// `Err`: the result's additional contexts are not messages (the step fails).
fn returned(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<Outcome> {
    let c = classes(py)?;
    // A str the message refuses (a lone surrogate, say) is an invalid result.
    let content = |content: &Bound<'_, PyAny>| -> Result<Content, Box<Outcome>> {
        // An exact str; a subclass goes to the message's own reading, which refuses it.
        if let Ok(text) = content.cast_exact::<PyString>() {
            if let Ok(text) = text.to_str() {
                return Ok(Content::Text(text.to_owned()));
            }
        }
        content_arg(content).map(Content::Blocks).map_err(|e| Box::new(invalid(py, name, &e)))
    };
    if value.is_instance_of::<PyString>() {
        return Ok(content(value).map_or_else(|o| *o, |content| Outcome { content, ..Outcome::text("") }));
    }
    if value.is_instance(c.input_required.bind(py))? {
        return Ok(input_required(py, name, value));
    }
    if !value.is_instance(c.tool_result.bind(py))? {
        return Ok(Outcome::wrong_type(name, &type_name(value)));
    }
    let content = match content(&value.getattr(intern!(py, "content"))?) {
        Ok(content) => content,
        Err(invalid) => return Ok(*invalid),
    };
    let meta = value.getattr(intern!(py, "meta"))?;
    let meta = if meta.is_none() {
        None
    } else {
        match to_json_text(&meta, "data.meta") {
            Ok(text) => Some(text),
            Err(e) => return Ok(invalid(py, name, &not_json(py, crate::agent_loop::events::TOOL_RESULT, e.describe()))),
        }
    };
    let mut contexts = Vec::new();
    for context in value.getattr(intern!(py, "additional_contexts"))?.try_iter()? {
        let context = context?;
        let message = match context.cast::<PyString>() {
            Ok(text) => {
                let mut source = Map::new();
                source.insert("kind".into(), Value::String("plugin".into()));
                source.insert("plugin".into(), Value::String(format!("tool:{name}")));
                let block = serde_json::json!({"type": "text", "text": text.to_str()?});
                Message::user(vec![block], Some(source), None).map_err(|e| super::super::errors::message_err(py, e))?
            }
            Err(_) => (*super::super::message::user_message_arg(&context)?).clone(),
        };
        contexts.push(Arc::new(message));
    }
    Ok(Outcome {
        content,
        is_error: value.getattr(intern!(py, "is_error"))?.is_truthy()?,
        error: None,
        concludes: value.getattr(intern!(py, "concludes_turn"))?.is_truthy()?,
        contexts,
        meta,
        bug: false,
        input: None,
    })
}

/// A body's `InputRequired(message, schema, payload)`: the call waits for a person's answer.
/// A schema or payload that is not JSON is the tool's bug (an invalid result).
fn input_required(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> Outcome {
    let json = |attr: &str| -> Result<Option<String>, Box<Outcome>> {
        let field = value.getattr(attr).map_err(|e| Box::new(invalid(py, name, &e)))?;
        if field.is_none() {
            return Ok(None);
        }
        to_json_text(&field, attr).map(Some).map_err(|e| Box::new(invalid(py, name, &not_json(py, "decision/requested", e.describe()))))
    };
    let note = value.getattr("message").ok().filter(|m| !m.is_none()).and_then(|m| m.str().ok()).map(|m| m.to_string());
    match (json("schema"), json("payload")) {
        (Ok(schema), Ok(payload)) => Outcome::needs_input(crate::agent_loop::InputAsk { note, schema, payload }),
        (Err(outcome), _) | (_, Err(outcome)) => *outcome,
    }
}

fn invalid(py: Python<'_>, name: &str, e: &PyErr) -> Outcome {
    Outcome::invalid(name, &type_name(e.value(py).as_any()), &e.value(py).to_string())
}

/// What becomes of a body's exception once its call's result is committed.
enum Kept {
    /// Nothing (a cancellation, the model's bad arguments).
    Nothing,
    /// Reported as the tool's bug (`agent/error`, the logger); the turn goes on.
    Report(PyErr),
    /// It propagates: the step's other calls are answered, the turn fails with it and it
    /// leaves the driver, as out of a model (`KeyboardInterrupt`: Ctrl-C still stops the
    /// program).
    Propagate(PyErr),
}

/// A body's exception as its outcome: its `CancelledError` is an aborted dispatch; any other
/// exception, `SystemExit` included (argparse and click exit on bad input: the tool's own
/// failure, not the program's), an error result reported once committed. Whatever else is not
/// an `Exception` (`KeyboardInterrupt`, ...) also gets its error result, then propagates.
fn raised(parts: &Parts, py: Python<'_>, tool: &Bound<'_, PyAny>, e: PyErr) -> PyResult<(Outcome, Kept)> {
    let c = classes(py)?;
    if e.is_instance(py, c.cancelled_error.bind(py)) {
        return Ok((Outcome::aborted_during(), Kept::Nothing));
    }
    let ordinary = e.is_instance_of::<PyException>(py);
    let exc = read::exception(py, &e);
    let name = type_name(&exc);
    let text = match exc.str() {
        Ok(s) if !s.to_string_lossy().is_empty() => s.to_string_lossy().into_owned(),
        _ => String::new(),
    };
    // An exit code alone ("2") tells the model nothing: the class names what happened.
    let text = match (ordinary, text.is_empty()) {
        (_, true) => name.clone(),
        (true, false) => text,
        (false, false) => format!("{name}: {text}"),
    };
    // The model's mistake, as arguments that are not JSON are: no bug to report.
    if exc.is_instance(c.invalid_tool_arguments.bind(py))? {
        return Ok((Outcome::bad_arguments(&text), Kept::Nothing));
    }
    let mut outcome = Outcome::error(text, &name, FailureCode::ToolError);
    let function = tool.getattr(intern!(py, "fn")).ok().and_then(|f| callable_name(&f));
    if let Some(Value::Object(error)) = &mut outcome.error {
        error.extend(read::describe(parts, &exc, function.as_deref(), false)?);
    }
    if !ordinary && !e.is_instance_of::<PySystemExit>(py) {
        // The turn's failure reports it; the result only answers the call.
        return Ok((outcome, Kept::Propagate(e)));
    }
    outcome.bug = true;
    Ok((outcome, Kept::Report(e)))
}

/// Reports the committed results whose bodies raised (`agent/error`, the logger).
fn report_raised(
    parts: &Parts,
    py: Python<'_>,
    agent: &Bound<'_, PyAny>,
    plan: &mut ToolPlan,
    exceptions: &mut HashMap<usize, Py<PyBaseException>>,
) -> PyResult<()> {
    for raised in plan.take_raised() {
        let exc = exceptions.remove(&raised.index).map(|e| e.into_bound(py).into_any());
        let failure = to_py(py, &raised.failure.to_value())?;
        parts.report_tool.bind(py).call1((agent, plan.turn, plan.step, failure, exc))?;
    }
    Ok(())
}

const NO_TOOLS: &dyn Fn(&str) -> Option<crate::agent_loop::ToolInfo> = &|_| None;

/// The tool of `name`, when registered.
fn tool<'py>(parts: &Parts, py: Python<'py>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(parts.tools.bind(py).get_item(name)?.filter(|t| !t.is_none()))
}

/// What runs for a call, with `(args, ctx)`: the tool's body, or for a call in doubt being
/// reconciled its reconcile function (`Tool.reconcile` calls `on_in_doubt(ctx)`).
fn body<'py>(py: Python<'py>, tool: &Bound<'py, PyAny>, reconciling: bool) -> PyResult<Bound<'py, PyAny>> {
    tool.getattr(if reconciling { intern!(py, "reconcile") } else { intern!(py, "fn") })
}

/// What call `index`'s body is called with (its arguments and `ToolContext`), or the outcome
/// it gets without running: the turn aborted (an observer of `tool/call` may have aborted it),
/// or the arguments are not JSON the tool can receive. One reading for a lone call and for
/// each call of the executor.
fn prepare_call<'py>(
    py: Python<'py>,
    core: &PyLoopCore,
    plan: &ToolPlan,
    index: usize,
    signal: &Bound<'py, PyAny>,
    agent: &Bound<'py, PyAny>,
) -> PyResult<Result<(Bound<'py, PyAny>, Bound<'py, PyAny>), Outcome>> {
    if core.shared.state().abort.is_some() {
        return Ok(Err(Outcome::aborted_before()));
    }
    let call = plan.call(index);
    let args = match arguments(py, &call.arguments)? {
        Ok(args) => args,
        Err(outcome) => return Ok(Err(outcome)),
    };
    let key = crate::agent_loop::idempotency_key(core.parts()?.log.get().inner.id(), plan.call_seq(index));
    let ctx = classes(py)?.tool_context.bind(py).call1((&call.id, plan.turn, plan.step, signal, agent, key))?;
    if let Some(input) = plan.input(index) {
        // A call made again after a person answered its request for input.
        let input: serde_json::Value = serde_json::from_str(input).unwrap_or(serde_json::Value::Null);
        ctx.setattr(intern!(py, "input"), super::super::convert::to_py(py, &input)?)?;
    }
    Ok(Ok((args, ctx)))
}

// ---- a lone call, run by the driver -----------------------------------------------------------

impl Run {
    /// Runs the step's tool plan: a lone call here (3.11+), several through the executor.
    pub(super) fn run_plan<'py>(&mut self, py: Python<'py>, plan: ToolPlan) -> PyResult<Step<'py>> {
        if plan.calls().len() == 1 && classes(py)?.cancelling {
            return self.lone_next(py, plan, HashMap::new());
        }
        let run = Bound::new(
            py,
            PyToolRun {
                core: self.core.clone_ref(py),
                agent: self.agent.clone_ref(py),
                signal: self.core(py).get().signal_obj(py),
                plan: Mutex::new(Some(plan)),
                exceptions: Mutex::new(HashMap::new()),
            },
        )?;
        let awaitable = self.parts.run_tools.bind(py).call1((&run,))?;
        self.tool_run = Some(run.into_any().unbind());
        Ok(Step::Await(await_iter(awaitable)?, Pending::Tools))
    }

    pub(super) fn tools_done<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> Step<'py> {
        let run = self.tool_run.take();
        if let Err(e) = outcome {
            return Step::Input(self.raised(py, e));
        }
        let plan = run.and_then(|run| {
            let run = run.bind(py).cast::<PyToolRun>().ok()?.get();
            run.plan.lock().unwrap_or_else(PoisonError::into_inner).take()
        });
        match plan {
            Some(plan) => Step::Input(Input::ToolsDone(plan)),
            None => Step::Input(self.raised(py, PySystemError::new_err("the executor lost its tool plan"))),
        }
    }

    /// Asks the plan what to do next: start the call, or (all committed) give the plan back.
    fn lone_next<'py>(
        &mut self,
        py: Python<'py>,
        mut plan: ToolPlan,
        mut exceptions: HashMap<usize, Py<PyBaseException>>,
    ) -> PyResult<Step<'py>> {
        let parts = Arc::clone(&self.parts);
        let core = self.core(py).get();
        let aborted = core.shared.state().abort.is_some();
        let next = {
            let ctx = parts.ctx(core, NO_TOOLS);
            plan.next(&ctx.sink(), aborted)
        };
        let next = next.map_err(|e| core_err(py, e))?;
        report_raised(&parts, py, self.agent.bind(py), &mut plan, &mut exceptions)?;
        match next {
            Next::Done => Ok(Step::Input(Input::ToolsDone(plan))),
            Next::Wait => Err(PySystemError::new_err("a lone tool call waits for nothing")),
            Next::Start(index) => {
                let name = plan.call(index).name.clone();
                let Some(tool) = tool(&parts, py, &name)? else {
                    return Err(PySystemError::new_err(format!("tool {name:?} was unregistered while its call started")));
                };
                self.lone = Some(Lone { plan, tool: tool.unbind(), outcome: None, exceptions, fatal: None });
                if parts.log.get().inner.checkpoints() {
                    // The checkpoint barrier before the body.
                    let flush = parts.log.bind(py).call_method0(intern!(py, "flush"))?;
                    return Ok(Step::Await(await_iter(flush)?, Pending::ToolFlush));
                }
                self.lone_start(py)
            }
        }
    }

    fn lone(&mut self) -> PyResult<&mut Lone> {
        self.lone.as_mut().ok_or_else(|| PySystemError::new_err("the driver lost its tool call"))
    }

    pub(super) fn lone_flushed<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> Step<'py> {
        match outcome {
            Ok(_) => self.lone_step(py, |run, py| run.lone_start(py)),
            Err(e) if self.is_cancelled(py, &e) => self.lone_step(py, |run, py| run.lone_done(py, Ok(Outcome::aborted_before()))),
            Err(e) => {
                self.lone = None;
                Step::Input(self.raised(py, e))
            }
        }
    }

    fn lone_step<'py>(&mut self, py: Python<'py>, f: impl FnOnce(&mut Self, Python<'py>) -> PyResult<Step<'py>>) -> Step<'py> {
        match f(self, py) {
            Ok(step) => step,
            Err(e) => {
                self.lone = None;
                self.core(py).get().set_in_user(false);
                Step::Input(self.raised(py, e))
            }
        }
    }

    /// The body up to its first suspension.
    fn lone_start<'py>(&mut self, py: Python<'py>) -> PyResult<Step<'py>> {
        let c = classes(py)?;
        let signal = self.core(py).get().signal_obj(py).into_bound(py);
        let prepared = {
            let core = self.core.clone_ref(py);
            let agent = self.agent.clone_ref(py);
            let plan = &self.lone()?.plan;
            prepare_call(py, core.bind(py).get(), plan, 0, &signal, agent.bind(py))?
        };
        let (args, ctx) = match prepared {
            Ok(prepared) => prepared,
            Err(outcome) => return self.lone_done(py, Ok(outcome)),
        };
        // From here until the body is done, cancel() throws into the driver's task.
        self.core(py).get().set_in_user(true);
        let tool = self.lone()?.tool.clone_ref(py).into_bound(py);
        let body = body(py, &tool, self.lone()?.plan.reconciling(0))?;
        let context = copy_context(py)?;
        let first = run_in(&context, || -> PyResult<Result<Bound<'py, PyAny>, (Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
            let value = body.call1((args, ctx))?;
            if !super::delegate::is_coroutine(&value, c) && !c.is_awaitable.bind(py).call1((&value,))?.is_truthy()? {
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
            Ok(Ok(value)) => {
                let outcome = self.lone_returned(py, &value);
                self.lone_done(py, outcome)
            }
            Ok(Err((iter, yielded))) => {
                let awaited = Bound::new(py, InContext::new(iter, context, yielded))?;
                Ok(Step::Await(awaited.into_any(), Pending::Tool))
            }
            Err(e) => {
                let outcome = self.lone_raised(py, e);
                self.lone_done(py, outcome)
            }
        }
    }

    fn lone_returned(&mut self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Outcome> {
        let lone = self.lone()?;
        let name = lone.plan.call(0).name.clone();
        if lone.plan.reconciling(0) && value.is_none() {
            return Ok(Outcome::outcome_unknown(&name));
        }
        returned(py, &name, value)
    }

    fn lone_raised(&mut self, py: Python<'_>, e: PyErr) -> PyResult<Outcome> {
        let parts = Arc::clone(&self.parts);
        let tool = self.lone()?.tool.clone_ref(py).into_bound(py);
        let (outcome, kept) = raised(&parts, py, &tool, e)?;
        match kept {
            Kept::Nothing => {}
            Kept::Report(exc) => {
                self.lone()?.exceptions.insert(0, exc.into_value(py));
            }
            Kept::Propagate(exc) => self.lone()?.fatal = Some(exc.into_value(py)),
        }
        Ok(outcome)
    }

    /// The suspended body finished with `outcome` (its return value or exception).
    pub(super) fn lone_resumed<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> Step<'py> {
        self.lone_step(py, |run, py| {
            let done = match outcome {
                Ok(value) => run.lone_returned(py, &value),
                Err(e) => run.lone_raised(py, e),
            };
            run.lone_done(py, done)
        })
    }

    /// The body is done: absorb a cancellation `cancel()` threw (as after a listener), or note
    /// one from outside, then commit.
    fn lone_done<'py>(&mut self, py: Python<'py>, outcome: PyResult<Outcome>) -> PyResult<Step<'py>> {
        self.core(py).get().set_in_user(false);
        let outcome = outcome?;
        self.lone()?.outcome = Some(outcome);
        if self.core(py).get().thrown() {
            // The throw may still be pending (the body returned before it landed): consume it.
            let sleep = await_iter(classes(py)?.sleep.bind(py).call1((0,))?)?;
            return Ok(Step::Await(sleep, Pending::ToolAbsorb));
        }
        // Cancelled from outside while the call ran: its result is committed all the same (the
        // log never holds a call without its result), then the cancellation goes on.
        let external = self.cancelling(py)?;
        self.lone_commit(py, external)
    }

    /// The `sleep(0)` absorbing a thrown cancellation finished.
    pub(super) fn lone_absorbed<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> Step<'py> {
        self.lone_step(py, |run, py| {
            if let Err(e) = outcome {
                if !run.is_cancelled(py, &e) {
                    return Err(e);
                }
            }
            run.uncancel(py)?;
            run.lone_commit(py, false)
        })
    }

    fn lone_commit<'py>(&mut self, py: Python<'py>, external: bool) -> PyResult<Step<'py>> {
        let Lone { mut plan, outcome, exceptions, fatal, .. } =
            self.lone.take().ok_or_else(|| PySystemError::new_err("the driver lost its tool call"))?;
        let outcome = outcome.ok_or_else(|| PySystemError::new_err("the driver lost its tool outcome"))?;
        let parts = Arc::clone(&self.parts);
        {
            let core = self.core(py).get();
            let ctx = parts.ctx(core, NO_TOOLS);
            plan.finish(&ctx.sink(), 0, outcome).map_err(|e| core_err(py, e))?;
        }
        let step = self.lone_next(py, plan, exceptions)?;
        if let Some(fatal) = fatal {
            // Answered; now the turn fails with it and it propagates.
            return Ok(Step::Input(self.raised(py, PyErr::from_value(fatal.into_bound(py).into_any()))));
        }
        if external {
            let cancelled = classes(py)?.cancelled_error.bind(py).call0()?;
            return Ok(Step::Input(self.raised(py, PyErr::from_value(cancelled))));
        }
        Ok(step)
    }
}

// ---- several calls, run by the executor -------------------------------------------------------

/// A plan of several tool calls, handed to the executor (`kerman._executor.run`): it asks
/// `next()` what to start, runs each body in a task of its own (`prepare`, then the body, then
/// `returned` / `raised` / `cancelled`), and the plan commits results in model order.
#[pyclass(name = "ToolRun", module = "kerman._core", frozen)]
pub struct PyToolRun {
    core: Py<PyLoopCore>,
    agent: Py<PyAny>,
    signal: Py<PyAny>,
    plan: Mutex<Option<ToolPlan>>,
    /// The exceptions of bodies that raised, until their results are reported.
    exceptions: Mutex<HashMap<usize, Py<PyBaseException>>>,
}

impl PyToolRun {
    /// Runs `f` on the plan, taken out of its lock (committing runs log observers, which may
    /// run Python).
    fn with_plan<R>(&self, py: Python<'_>, f: impl FnOnce(&mut ToolPlan, &Ctx<'_>) -> PyResult<R>) -> PyResult<R> {
        let mut plan = self
            .plan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| PyValueError::new_err("this tool run is over"))?;
        let core = self.core.bind(py).get();
        let out = match core.parts() {
            Ok(parts) => {
                let ctx = parts.ctx(core, NO_TOOLS);
                let out = f(&mut plan, &ctx);
                let mut exceptions = std::mem::take(&mut *self.exceptions.lock().unwrap_or_else(PoisonError::into_inner));
                let reported = report_raised(&parts, py, self.agent.bind(py), &mut plan, &mut exceptions);
                self.exceptions.lock().unwrap_or_else(PoisonError::into_inner).extend(exceptions);
                out.and_then(|out| reported.map(|()| out))
            }
            Err(e) => Err(e),
        };
        *self.plan.lock().unwrap_or_else(PoisonError::into_inner) = Some(plan);
        out
    }

    fn finish_with(&self, py: Python<'_>, index: usize, outcome: Outcome) -> PyResult<()> {
        self.with_plan(py, |plan, ctx| plan.finish(&ctx.sink(), index, outcome).map_err(|e| core_err(py, e)))
    }

    fn tool<'py>(&self, py: Python<'py>, index: usize) -> PyResult<(String, Option<Bound<'py, PyAny>>)> {
        let name = self.with_plan(py, |plan, _| Ok(plan.calls().get(index).map(|c| c.name.clone())))?;
        let name = name.ok_or_else(|| PyValueError::new_err(format!("no tool call {index} in this run")))?;
        let parts = self.core.bind(py).get().parts()?;
        let tool = tool(&parts, py, &name)?;
        Ok((name, tool))
    }
}

#[pymethods]
impl PyToolRun {
    /// The index of the call to start next, or `None`: wait for a running call (or, with
    /// nothing running, every call has its result).
    fn next(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        let aborted = self.core.bind(py).get().shared.state().abort.is_some();
        self.with_plan(py, |plan, ctx| match plan.next(&ctx.sink(), aborted).map_err(|e| core_err(py, e))? {
            Next::Start(index) => Ok(Some(index)),
            Next::Wait | Next::Done => Ok(None),
        })
    }

    /// How many calls run now.
    #[getter]
    fn running(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_plan(py, |plan, _| Ok(plan.running()))
    }

    /// The turn's signal.
    #[getter]
    fn signal(&self, py: Python<'_>) -> Py<PyAny> {
        self.signal.clone_ref(py)
    }

    /// Whether a flush barrier precedes every body (checkpoint durability).
    #[getter]
    fn checkpoints(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.core.bind(py).get().parts()?.log.get().inner.checkpoints())
    }

    /// `log.flush()`: the checkpoint barrier's awaitable.
    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.core.bind(py).get().parts()?.log.bind(py).call_method0(intern!(py, "flush"))
    }

    /// What call `index`'s body is called with, `(fn, args, ctx)`; `None` when its outcome is
    /// decided without running it (the turn aborted, the arguments are not JSON).
    fn prepare<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let core = self.core.bind(py).get();
        let prepared = self.with_plan(py, |plan, _| prepare_call(py, core, plan, index, self.signal.bind(py), self.agent.bind(py)))?;
        let (args, ctx) = match prepared {
            Ok(prepared) => prepared,
            Err(outcome) => {
                self.finish_with(py, index, outcome)?;
                return Ok(None);
            }
        };
        let (name, tool) = self.tool(py, index)?;
        let tool = tool.ok_or_else(|| PySystemError::new_err(format!("tool {name:?} was unregistered while its call started")))?;
        let reconciling = self.with_plan(py, |plan, _| Ok(plan.reconciling(index)))?;
        Ok(Some(PyTuple::new(py, [body(py, &tool, reconciling)?, args, ctx])?))
    }

    /// Call `index`'s body returned `value`.
    fn returned(&self, py: Python<'_>, index: usize, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let (name, _) = self.tool(py, index)?;
        let reconciling = value.is_none() && self.with_plan(py, |plan, _| Ok(plan.reconciling(index)))?;
        let outcome = if reconciling { Outcome::outcome_unknown(&name) } else { returned(py, &name, value)? };
        self.finish_with(py, index, outcome)
    }

    /// Call `index`'s body raised `exc`. True when `exc` must propagate once every call has
    /// its result (a `KeyboardInterrupt`): the executor cancels the others, then raises it.
    fn raised(&self, py: Python<'_>, index: usize, exc: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (_, tool) = self.tool(py, index)?;
        let tool = tool.unwrap_or_else(|| py.None().into_bound(py));
        let parts = self.core.bind(py).get().parts()?;
        let (outcome, kept) = raised(&parts, py, &tool, PyErr::from_value(exc.clone()))?;
        if let Kept::Report(exc) = &kept {
            self.exceptions.lock().unwrap_or_else(PoisonError::into_inner).insert(index, exc.clone_ref(py).into_value(py));
        }
        self.finish_with(py, index, outcome)?;
        Ok(matches!(kept, Kept::Propagate(_)))
    }

    /// Call `index` was cancelled: aborted during dispatch, unless its body had finished.
    fn cancelled(&self, py: Python<'_>, index: usize) -> PyResult<()> {
        self.finish_with(py, index, Outcome::aborted_during())
    }

    /// Call `index` never reached its body (its barrier was cancelled).
    fn aborted_before(&self, py: Python<'_>, index: usize) -> PyResult<()> {
        self.finish_with(py, index, Outcome::aborted_before())
    }

    /// The run is being cancelled from outside: the calls not started get their aborted
    /// results (call once nothing runs).
    fn abort_unstarted(&self, py: Python<'_>) -> PyResult<()> {
        self.with_plan(py, |plan, ctx| plan.next(&ctx.sink(), true).map(drop).map_err(|e| core_err(py, e)))
    }

    /// A call that failed in a way its step does not survive (its barrier raised).
    fn abandon(&self, py: Python<'_>, index: usize) -> PyResult<()> {
        self.with_plan(py, |plan, _| {
            plan.abandon(index);
            Ok(())
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.with_plan(py, |plan, _| Ok((plan.calls().len(), plan.running()))) {
            Ok((calls, running)) => format!("<ToolRun calls={calls} running={running}>"),
            Err(_) => "<ToolRun done>".to_owned(),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.core)?;
        visit.call(&self.agent)?;
        visit.call(&self.signal)?;
        if let Ok(exceptions) = self.exceptions.try_lock() {
            for exc in exceptions.values() {
                visit.call(exc)?;
            }
        }
        Ok(())
    }
}
