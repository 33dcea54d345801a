//! The seams: building each payload, awaiting user code so that `cancel()` can throw
//! `CancelledError` into it (SPEC 4.4), and reading what it gave back.
//!
//! While user code is awaited `LoopCore.in_user` is set, so `cancel()` knows to cancel the
//! driver's task; the cancellation it threw (`thrown`) is absorbed here and reaches the machine
//! as a plain fault, which the aborted signal turns into an aborted ending. A `CancelledError`
//! user code raises with no cancellation in progress is a failure like any other (Python 3.11+;
//! 3.10 cannot tell the two apart); any other is an outside cancellation.

use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyList};

use std::sync::Arc;

use super::super::convert::to_py;
use super::super::slots::{has_anext, has_await};
use super::super::waterfall::{Fallback, PyNext};
use super::delegate::await_iter;
use super::run::{Pending, Run, Seam, Step};
use super::{classes, read};
use crate::agent_loop::{Decision, Failure, Input, Raised, RaisedKind};
use crate::message::Message;

/// How user code at a seam failed.
pub(super) enum Fail {
    /// The cancellation `cancel()` threw (absorbed): the signal has aborted.
    Aborted,
    /// User code raised `CancelledError` itself, with no cancellation in progress.
    Own(PyErr),
    Err(PyErr),
}

/// `Next(list(listeners), payload, default)()`: a waterfall dispatch's awaitable.
fn waterfall<'py>(listeners: &Bound<'py, PyList>, payload: &Bound<'py, PyAny>, default: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    PyNext::dispatch(listeners, payload, Fallback::Call(default.clone().unbind()))
}

/// `tool.spec()`: built here for a plain `Tool` (what `Tool.spec` returns, without a call into
/// Python per tool per request); a subclass's own `spec` is called.
fn tool_spec<'py>(tool: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = tool.py();
    if !tool.get_type().is(classes(py)?.tool.bind(py)) {
        return tool.call_method0(intern!(py, "spec"));
    }
    let spec = pyo3::types::PyDict::new(py);
    spec.set_item(intern!(py, "name"), tool.getattr(intern!(py, "name"))?)?;
    spec.set_item(intern!(py, "description"), tool.getattr(intern!(py, "description"))?)?;
    spec.set_item(intern!(py, "parameters"), tool.getattr(intern!(py, "parameters"))?)?;
    Ok(spec.into_any())
}

impl Run {
    fn turn_step(&self) -> (u64, u64) {
        (self.machine.turn(), self.machine.step())
    }

    fn signal<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.core(py).get().signal_obj(py).into_bound(py)
    }

    pub(super) fn pre_step<'py>(&mut self, py: Python<'py>, batch: Vec<Arc<Message>>) -> PyResult<Step<'py>> {
        let parts = Arc::clone(&self.parts);
        let objects = parts.inbox.get().claimed_objects(py, &batch)?;
        let listeners = parts.pre_step.bind(py);
        if listeners.is_empty() {
            // No listener: the decision is the default one, entering the batch as claimed.
            self.entered = Some(objects.unbind());
            return Ok(Step::Input(Input::Decided(Decision::Enter(batch))));
        }
        let (turn, step) = self.turn_step();
        let payload = classes(py)?.pre_step.bind(py).call1((self.agent.bind(py), objects, turn, step, self.signal(py)))?;
        let default = {
            let payload = payload.clone().unbind();
            PyCFunction::new_closure(py, Some(c"enter_claimed"), None, move |args, _kwargs| -> PyResult<Py<PyAny>> {
                let py = args.py();
                let messages = payload.bind(py).getattr(intern!(py, "messages"))?;
                Ok(classes(py)?.enter.bind(py).call1((messages,))?.unbind())
            })?
        };
        let awaitable = waterfall(listeners, &payload, default.as_any());
        Ok(self.user_begin(py, awaitable, Seam::PreStep))
    }

    pub(super) fn before_request<'py>(&mut self, py: Python<'py>) -> PyResult<Step<'py>> {
        let parts = Arc::clone(&self.parts);
        let c = classes(py)?;
        let entered = self.entered.as_ref().map(|list| list.bind(py).clone());
        let history = self.core(py).get().history_list(py, entered.as_ref())?;
        let tools = PyList::empty(py);
        for tool in parts.tools.bind(py).values() {
            tools.append(tool_spec(&tool)?)?;
        }
        let options = parts.options.bind(py).copy()?;
        let entered = match entered {
            Some(list) => PyList::new(py, list.iter())?,
            None => PyList::empty(py),
        };
        let (turn, step) = self.turn_step();
        let instructions = self.core(py).get().shared.state().instructions.clone();
        let request = c.model_request.bind(py).call1((
            history,
            tools,
            options,
            turn,
            step,
            self.signal(py),
            entered,
            self.agent.bind(py),
            instructions,
        ))?;
        let listeners = parts.before_request.bind(py);
        if listeners.is_empty() {
            // No listener: the request goes out as built.
            let requested = self.read_request(py, &request)?;
            self.request = Some(request.unbind());
            return Ok(Step::Input(Input::Requested(requested)));
        }
        let default = {
            let request = request.clone().unbind();
            PyCFunction::new_closure(py, Some(c"the_request"), None, move |args, _kwargs| -> PyResult<Py<PyAny>> {
                Ok(request.clone_ref(args.py()))
            })?
        };
        let awaitable = waterfall(listeners, &request, default.as_any());
        Ok(self.user_begin(py, awaitable, Seam::BeforeRequest))
    }

    /// Calls the model once: an async iterator is streamed; an awaitable awaited; anything else
    /// is the reply given synchronously (or garbage).
    pub(super) fn call_model<'py>(&mut self, py: Python<'py>) -> PyResult<Step<'py>> {
        let request = self.request.as_ref().map_or_else(|| py.None(), |r| r.clone_ref(py));
        let produced = match self.parts.model.bind(py).call1((request,)) {
            Ok(produced) => produced,
            Err(e) => {
                match read::failed_attempts(e.value(py)) {
                    Ok(failed) => self.failed_attempts = failed,
                    Err(unreadable) => return self.seam_result(py, Seam::Model, Err(Fail::Err(unreadable))),
                }
                return self.seam_result(py, Seam::Model, Err(Fail::Err(e)));
            }
        };
        if has_anext(&produced) {
            self.stream = Some(produced.unbind());
            return Ok(Step::Input(Input::Streaming));
        }
        if !has_await(&produced) {
            return self.seam_result(py, Seam::Model, Ok(produced));
        }
        Ok(self.user_begin(py, Ok(produced), Seam::Model))
    }

    pub(super) fn next_chunk<'py>(&mut self, py: Python<'py>) -> PyResult<Step<'py>> {
        let stream = self.stream.as_ref().map_or_else(|| py.None(), |s| s.clone_ref(py));
        let awaitable = stream.bind(py).call_method0(intern!(py, "__anext__"));
        Ok(self.user_begin(py, awaitable, Seam::Chunk))
    }

    pub(super) fn request_error<'py>(&mut self, py: Python<'py>, failure: &Failure, exception: bool) -> PyResult<Step<'py>> {
        let parts = Arc::clone(&self.parts);
        let listeners = parts.request_error.bind(py);
        if listeners.is_empty() {
            return Ok(Step::Input(Input::Retry(false)));
        }
        let exc = match (&self.last_exc, exception) {
            (Some(e), true) => e.clone_ref(py).into_bound(py).into_any(),
            _ => py.None().into_bound(py),
        };
        let (turn, step) = self.turn_step();
        let failure = to_py(py, &failure.to_value())?;
        let payload = classes(py)?.request_failure.bind(py).call1((self.agent.bind(py), turn, step, failure, exc, self.signal(py)))?;
        let default =
            PyCFunction::new_closure(py, Some(c"no_action"), None, |args, _kwargs| -> PyResult<Py<PyAny>> { Ok(args.py().None()) })?;
        let awaitable = waterfall(listeners, &payload, default.as_any());
        Ok(self.user_begin(py, awaitable, Seam::RequestError))
    }

    pub(super) fn turn_stopping<'py>(&mut self, py: Python<'py>) -> PyResult<Step<'py>> {
        let parts = Arc::clone(&self.parts);
        let listeners = parts.turn_stopping.bind(py);
        // No hooks: nothing to run.
        if listeners.is_empty() {
            return Ok(Step::Input(Input::Continue));
        }
        let stop = classes(py)?.turn_stopping.bind(py).call1((self.agent.bind(py), self.machine.turn(), self.signal(py)))?;
        let awaitable = parts.serial.bind(py).call1((listeners, stop));
        Ok(self.user_begin(py, awaitable, Seam::Stopping))
    }

    fn read_request(&self, py: Python<'_>, request: &Bound<'_, PyAny>) -> PyResult<crate::agent_loop::Requested> {
        let core = self.core(py).get();
        read::request(request, |canonical, instructions| core.shared.state().header_due(canonical, instructions))
    }

    // ---- awaiting user code -------------------------------------------------------------------

    /// The flag `cancel()` reads, then the await. An error building the awaitable is the
    /// await's outcome.
    pub(super) fn user_begin<'py>(&mut self, py: Python<'py>, awaitable: PyResult<Bound<'py, PyAny>>, seam: Seam) -> Step<'py> {
        let awaitable = match awaitable {
            Ok(awaitable) => awaitable,
            Err(e) => return self.seam_step(py, seam, Err(Fail::Err(e))),
        };
        self.core(py).get().set_in_user(true);
        match await_iter(awaitable) {
            Ok(iter) => Step::Await(iter, Pending::User(seam)),
            Err(e) => self.user_finish(py, seam, Err(e)),
        }
    }

    pub(super) fn user_finish<'py>(&mut self, py: Python<'py>, seam: Seam, outcome: PyResult<Bound<'py, PyAny>>) -> Step<'py> {
        // Read before the exception is classified: the cancellation `cancel()` threw is dropped
        // then, and a non-streaming `Fallback` cancelled while it waited on a later model hands
        // the attempts that failed before in it.
        let failed = match (&seam, &outcome) {
            (Seam::Model, Err(e)) => Some(read::failed_attempts(e.value(py))),
            _ => None,
        };
        let outcome = outcome.map_err(|e| self.user_error(py, e));
        self.core(py).get().set_in_user(false);
        match failed {
            Some(Ok(failed)) => self.failed_attempts = failed,
            Some(Err(e)) => return self.seam_step(py, seam, Err(Fail::Err(e))),
            None => {}
        }
        let result = match outcome {
            Ok(result) => result,
            Err(fail) => return self.seam_step(py, seam, Err(fail)),
        };
        if self.core(py).get().thrown() {
            // The throw may still be pending (the code returned before awaiting): consume it.
            match classes(py).and_then(|c| c.sleep.bind(py).call1((0,))).and_then(await_iter) {
                Ok(sleep) => return Step::Await(sleep, Pending::Absorb { seam, result: result.unbind() }),
                Err(e) => return self.seam_step(py, seam, Err(Fail::Err(e))),
            }
        }
        self.seam_step(py, seam, Ok(result))
    }

    pub(super) fn absorb_finish<'py>(
        &mut self,
        py: Python<'py>,
        seam: Seam,
        outcome: PyResult<Bound<'py, PyAny>>,
        result: Py<PyAny>,
    ) -> Step<'py> {
        if let Err(e) = outcome {
            if !self.is_cancelled(py, &e) {
                return self.seam_step(py, seam, Err(Fail::Err(e)));
            }
        }
        if let Err(e) = self.uncancel(py) {
            return self.seam_step(py, seam, Err(Fail::Err(e)));
        }
        self.seam_step(py, seam, Ok(result.into_bound(py)))
    }

    pub(super) fn is_cancelled(&self, py: Python<'_>, e: &PyErr) -> bool {
        classes(py).is_ok_and(|c| e.is_instance(py, c.cancelled_error.bind(py)))
    }

    /// The cancellation `cancel()` threw is consumed: the flag drops and the task's cancel
    /// requests are withdrawn.
    pub(super) fn uncancel(&self, py: Python<'_>) -> PyResult<()> {
        self.core(py).get().clear_thrown();
        let c = classes(py)?;
        if !c.cancelling {
            return Ok(());
        }
        let Some(task) = self.task(py)? else { return Ok(()) };
        while task.call_method0(intern!(py, "cancelling"))?.is_truthy()? {
            task.call_method0(intern!(py, "uncancel"))?;
        }
        Ok(())
    }

    /// Whether the driver's task is being cancelled from outside (Python 3.11+).
    pub(super) fn cancelling(&self, py: Python<'_>) -> PyResult<bool> {
        let c = classes(py)?;
        if !c.cancelling {
            return Ok(false);
        }
        match self.task(py)? {
            Some(task) => task.call_method0(intern!(py, "cancelling"))?.is_truthy(),
            None => Ok(false),
        }
    }

    /// The task running the driver (`None` outside a task: driven by hand).
    fn task<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Some(task) = self.task.get() {
            return Ok(Some(task.bind(py).clone()));
        }
        let task = classes(py)?.current_task.bind(py).call0()?;
        if task.is_none() {
            return Ok(None);
        }
        Ok(Some(self.task.get_or_init(|| task.unbind()).bind(py).clone()))
    }

    /// What a `CancelledError` out of user code is: the abort we threw, a failure when no
    /// cancellation is in progress (SPEC 4.4), else itself (cancelled from outside).
    fn user_error(&self, py: Python<'_>, err: PyErr) -> Fail {
        if !self.is_cancelled(py, &err) {
            return Fail::Err(err);
        }
        if self.core(py).get().thrown() {
            return match self.uncancel(py) {
                Ok(()) => Fail::Aborted,
                Err(e) => Fail::Err(e),
            };
        }
        match classes(py) {
            Ok(c) if c.cancelling => match self.cancelling(py) {
                Ok(false) => Fail::Own(err),
                Ok(true) => Fail::Err(err),
                Err(e) => Fail::Err(e),
            },
            _ => Fail::Err(err),
        }
    }

    fn seam_step<'py>(&mut self, py: Python<'py>, seam: Seam, result: Result<Bound<'py, PyAny>, Fail>) -> Step<'py> {
        match self.seam_result(py, seam, result) {
            Ok(step) => step,
            Err(e) => Step::Input(self.raised(py, e)),
        }
    }

    /// What a seam's user code gave, as the machine's input; a model's failure after failed
    /// attempts of its own (`failed_attempts`) comes with them.
    pub(super) fn seam_result<'py>(&mut self, py: Python<'py>, seam: Seam, result: Result<Bound<'py, PyAny>, Fail>) -> PyResult<Step<'py>> {
        let failed = if result.is_err() { std::mem::take(&mut self.failed_attempts) } else { Vec::new() };
        let step = self.seam_input(py, seam, result)?;
        Ok(match step {
            Step::Input(outcome) if !failed.is_empty() => Step::Input(Input::AfterFailed { failed, outcome: Box::new(outcome) }),
            step => step,
        })
    }

    fn seam_input<'py>(&mut self, py: Python<'py>, seam: Seam, result: Result<Bound<'py, PyAny>, Fail>) -> PyResult<Step<'py>> {
        let value = match result {
            Ok(value) => value,
            // The signal has aborted: any fault ends the turn aborted.
            Err(Fail::Aborted) => return Ok(Step::Input(Input::Raised(Raised::bare(RaisedKind::Error)))),
            Err(Fail::Own(e)) => {
                let failure = read::failure_of(&self.parts, &read::exception(py, &e))?;
                self.last_exc = Some(e.into_value(py));
                return Ok(Step::Input(Input::Raised(Raised::new(RaisedKind::Error, failure))));
            }
            Err(Fail::Err(e)) => {
                if matches!(seam, Seam::Chunk) && e.is_instance_of::<PyStopAsyncIteration>(py) {
                    self.stream = None;
                    return Ok(Step::Input(Input::StreamEnded));
                }
                if matches!(seam, Seam::Model | Seam::Chunk) && read::is_model_error(py, &e)? {
                    let failure = read::failure_of(&self.parts, &read::exception(py, &e))?;
                    self.last_exc = Some(e.into_value(py));
                    self.stream = None;
                    return Ok(Step::Input(Input::ModelFailed(failure)));
                }
                return Ok(Step::Input(self.raised(py, e)));
            }
        };
        Ok(Step::Input(match seam {
            Seam::PreStep => {
                let (decision, objects) = read::decision(&value)?;
                if let Some(objects) = objects {
                    self.entered = Some(objects.unbind());
                }
                Input::Decided(decision)
            }
            Seam::BeforeRequest => {
                let requested = self.read_request(py, &value)?;
                self.request = Some(value.unbind());
                Input::Requested(requested)
            }
            Seam::Model => match read::reply(&value)? {
                Some((reply, failed)) if failed.is_empty() => Input::Reply(reply),
                Some((reply, failed)) => Input::AfterFailed { failed, outcome: Box::new(Input::Reply(reply)) },
                None => Input::NotAReply(read::repr(&value)),
            },
            Seam::Chunk => match read::chunk(&value)? {
                Some(chunk) => Input::Chunk(chunk),
                None => Input::NotAChunk(read::repr(&value)),
            },
            Seam::RequestError => Input::Retry(read::is_retry(&value)?),
            Seam::BeforeTool => Input::Gated(super::decide::gate(&value)?),
            Seam::Stopping => Input::Continue,
        }))
    }
}
