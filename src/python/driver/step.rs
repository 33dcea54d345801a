//! The step (reference 5.6 steps 2–6, SPEC D1, D3, 4.9) as states of the driver: build the
//! request, the `before_request` waterfall, `request/header`, the checkpoint barrier, the model
//! call (awaited or streamed chunk by chunk), `request_error` with `Retry` re-issuing in the
//! same step, the assistant message, and the tool calls (a lone call run here, `tool.rs`;
//! several through the Python coroutine `kerman._tools.run_tools`, delegated to).
//!
//! Every function here runs inside the step's `try`: an `Err` ends the step (its `finally`
//! appends `step/end`) and then the turn.

use pyo3::exceptions::{PyStopAsyncIteration, PySystemError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyCFunction, PyDict, PyList, PyString};

use std::sync::Arc;

use super::super::convert::to_json_text;
use super::super::errors::{message_err, not_json};
use super::super::message::{content_arg, text_message, wrap};
use super::super::slots::{has_anext, has_await};
use super::delegate::await_iter;
use super::tool::LoneCall;
use crate::message::{Message, MessageKind};
use super::{dict, helpers, Machine, Pending, Seam, UserStep};

/// The running step's state (the locals of `run_step`).
pub(super) struct Step {
    /// The user messages entered in this step.
    entered: Py<PyAny>,
    /// The request being made.
    request: Option<Py<PyAny>>,
    /// A streaming model's async iterator, its assembler and the chunks' seqs.
    stream: Option<Py<PyAny>>,
    assembler: Option<Py<PyAny>>,
    seqs: Option<Py<PyList>>,
    /// The failure the `request_error` waterfall is deciding about: (failure dict, exception).
    failure: Option<(Py<PyAny>, Py<PyAny>)>,
    /// A lone tool call the driver runs itself (`tool.rs`).
    pub(super) lone: Option<LoneCall>,
}

impl Step {
    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.entered)?;
        for obj in [&self.request, &self.stream, &self.assembler].into_iter().flatten() {
            visit.call(obj)?;
        }
        if let Some(seqs) = &self.seqs {
            visit.call(seqs)?;
        }
        if let Some((failure, exc)) = &self.failure {
            visit.call(failure)?;
            visit.call(exc)?;
        }
        if let Some(lone) = &self.lone {
            lone.visit(visit)?;
        }
        Ok(())
    }
}

/// How a step ended (what `run_step` returned).
pub(super) enum StepEnd {
    /// The turn may complete.
    Completed,
    /// The model stopped at its token limit.
    MaxTokens,
    /// Tool results are owed another request: the step loop goes on.
    Again,
}

/// How the step goes on.
pub(super) enum StepBody<'py> {
    Await(Bound<'py, PyAny>, Pending),
    Done(StepEnd),
}

/// `Next(list(listeners), payload, default)()`: a waterfall dispatch's awaitable.
pub(super) fn waterfall<'py>(
    listeners: &Bound<'py, PyAny>,
    payload: &Bound<'py, PyAny>,
    default: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = listeners.py();
    let listeners = py.get_type::<PyList>().call1((listeners,))?;
    helpers(py)?.next.bind(py).call1((listeners, payload, default))?.call0()
}

/// The first `id` (a `str`) that two of `calls` share. Other ids are the message's to refuse.
fn duplicate_call_id(calls: &Bound<'_, PyList>) -> PyResult<Option<String>> {
    if calls.len() < 2 {
        return Ok(None);
    }
    let mut seen = std::collections::HashSet::new();
    for call in calls.iter() {
        let id = call.call_method1(intern!(call.py(), "get"), ("id",))?;
        if let Ok(id) = id.cast::<PyString>() {
            let id = id.to_cow()?.into_owned();
            if !seen.insert(id.clone()) {
                return Ok(Some(id));
            }
        }
    }
    Ok(None)
}

/// A `TurnFailure` with `{"message": message, "code": code}`.
fn turn_failure(py: Python<'_>, message: String, code: &str) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let message = message.into_pyobject(py)?.into_any();
        let code = code.into_pyobject(py)?.into_any();
        let failure = dict(py, &[("message", &message), ("code", &code)])?;
        Ok(PyErr::from_value(helpers(py)?.turn_failure.bind(py).call1((failure,))?))
    })();
    built.unwrap_or_else(|e| e)
}

fn missing(what: &str) -> PyErr {
    PySystemError::new_err(format!("the driver lost its {what}"))
}

impl Machine {
    pub(super) fn work(&mut self) -> PyResult<&mut Step> {
        self.turn.work.as_mut().ok_or_else(|| missing("step"))
    }

    pub(super) fn turn_no<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.turn.turn.bind(py).clone()
    }

    pub(super) fn step_no<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.turn.step.as_ref().map(|s| s.bind(py).clone()).unwrap_or_else(|| py.None().into_bound(py))
    }

    /// `{"turn": turn, "step": step, ...}`.
    fn step_data<'py>(&self, py: Python<'py>, items: &[(&str, &Bound<'py, PyAny>)]) -> PyResult<Bound<'py, PyDict>> {
        let data = dict(py, &[("turn", &self.turn_no(py)), ("step", &self.step_no(py))])?;
        for (k, v) in items {
            data.set_item(*k, v)?;
        }
        Ok(data)
    }

    /// `assistant/message`: `{"turn", "step", "message"[, "interrupted": true][, "usage"]}`,
    /// the message built and serialised in Rust; it joins the history unless it is empty.
    fn append_assistant(&self, py: Python<'_>, content: &Bound<'_, PyAny>, usage: &Bound<'_, PyAny>, seqs: Vec<u64>, interrupted: bool) -> PyResult<()> {
        // A `str` reply is one text block: never empty, and its content is not parsed to say so.
        let (message, empty) = match text_message(MessageKind::Assistant, content, None, None)? {
            Some(message) => (message, false),
            None => {
                let message = Message::assistant(content_arg(content)?, None, None).map_err(|e| message_err(py, e))?;
                let empty = message.content().is_empty();
                (message, empty)
            }
        };
        let mut data = self.turn_step_head(py)?;
        data.push_str(r#","message":"#);
        data.push_str(message.json());
        if interrupted {
            data.push_str(r#","interrupted":true"#);
        }
        if !usage.is_none() {
            let usage = to_json_text(usage, "data.usage").map_err(|e| not_json(py, "assistant/message", e.describe()))?;
            data.push_str(r#","usage":"#);
            data.push_str(&usage);
        }
        data.push('}');
        // An empty assistant message stays in the log but not in the history.
        let message = if empty { None } else { Some(wrap(py, Arc::new(message))?) };
        self.append_message(py, "assistant/message", data, Some(seqs), message.as_ref()).map(drop)
    }

    /// `log._append_owned(kind, data, seqs)`: the appended event.
    fn append_event<'py>(&self, py: Python<'py>, kind: &str, data: &Bound<'py, PyAny>, seqs: Option<&Bound<'py, PyList>>) -> PyResult<Bound<'py, PyAny>> {
        let log = self.log.bind(py);
        match seqs {
            Some(seqs) => log.call_method1(intern!(py, "_append_owned"), (kind, data, seqs)),
            None => log.call_method1(intern!(py, "_append_owned"), (kind, data)),
        }
    }

    /// A seam of the step awaits user code.
    fn step_user<'py>(&mut self, py: Python<'py>, awaitable: PyResult<Bound<'py, PyAny>>, seam: Seam) -> PyResult<StepBody<'py>> {
        match self.user_begin(py, awaitable, seam) {
            UserStep::Await(iter, pending) => Ok(StepBody::Await(iter, pending)),
            UserStep::Done(result) => self.step_seam(py, seam, result),
        }
    }

    /// A seam of the step finished its `user_await` with `result`.
    pub(super) fn step_seam<'py>(&mut self, py: Python<'py>, seam: Seam, result: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        match seam {
            Seam::BeforeRequest => self.after_before_request(py, result?),
            Seam::Model => self.after_model(py, result),
            Seam::Chunk => self.after_chunk(py, result),
            Seam::RequestError => self.after_request_error(py, result?),
            Seam::PreStep | Seam::Stopping => Err(PySystemError::new_err("a turn seam resumed inside the step")),
        }
    }

    /// `run_step(loop, turn, step, entered)`.
    pub(super) fn step_begin<'py>(&mut self, py: Python<'py>, entered: Bound<'py, PyAny>) -> PyResult<StepBody<'py>> {
        self.turn.work = Some(Step {
            entered: entered.unbind(),
            request: None,
            stream: None,
            assembler: None,
            seqs: None,
            failure: None,
            lone: None,
        });
        self.request_begin(py)
    }

    /// Builds the request (history, tool specs, a copy of the options) and starts the
    /// `before_request` waterfall over it.
    fn request_begin<'py>(&mut self, py: Python<'py>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        let agent = self.agent(py).clone();
        // The derived history: kept current as the loop appends, caught up here with what
        // others appended since.
        let log = self.log.get();
        self.history.get().catch_up(py, log, log.inner.len())?;
        let history = self.history.get().snapshot(py)?;
        let tools = PyList::empty(py);
        for tool in agent.getattr(intern!(py, "_tools"))?.call_method0(intern!(py, "values"))?.try_iter()? {
            tools.append(tool?.call_method0(intern!(py, "spec"))?)?;
        }
        let options = py.get_type::<PyDict>().call1((agent.getattr(intern!(py, "_options"))?,))?;
        let entered = py.get_type::<PyList>().call1((self.work()?.entered.bind(py),))?;
        let request = h.model_request.bind(py).call1((
            history,
            tools,
            options,
            self.turn_no(py),
            self.step_no(py),
            self.signal(py)?,
            entered,
            &agent,
        ))?;
        let listeners = agent.getattr(intern!(py, "_before_request"))?;
        if !listeners.is_truthy()? {
            // No listener: the request goes out as built.
            return self.after_before_request(py, request);
        }
        let default = {
            let request = request.clone().unbind();
            PyCFunction::new_closure(py, Some(c"the_request"), None, move |args, _kwargs| -> PyResult<Py<PyAny>> {
                Ok(request.clone_ref(args.py()))
            })?
        };
        let awaitable = waterfall(&listeners, &request, default.as_any());
        self.step_user(py, awaitable, Seam::BeforeRequest)
    }

    /// The request as `before_request` left it: `request/header` when the options changed,
    /// then the checkpoint barrier.
    fn after_before_request<'py>(&mut self, py: Python<'py>, request: Bound<'py, PyAny>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        self.check(py)?;
        if !request.is_instance(h.model_request.bind(py))? {
            let message = format!("before_request listener returned {}; expected a ModelRequest", request.repr()?);
            return Err(turn_failure(py, message, "INVALID_REQUEST"));
        }
        let agent = self.agent(py).clone();
        let options = request.getattr(intern!(py, "options"))?;
        let canonical = super::canonical::canonical(&options).map_err(|e| {
            let message = format!("request options are not lossless JSON: {}", e.value(py));
            turn_failure(py, message, "INVALID_REQUEST")
        })?;
        let requests = agent.getattr(intern!(py, "_requests"))?;
        if requests.eq(0)? || canonical.ne(agent.getattr(intern!(py, "_last_options"))?)? {
            self.append(py, "request/header", dict(py, &[("options", &options)])?.as_any())?;
            agent.setattr(intern!(py, "_last_options"), canonical)?;
        }
        agent.setattr(intern!(py, "_requests"), requests.add(1)?)?;
        self.work()?.request = Some(request.unbind());
        let log = self.log.bind(py);
        if log.getattr(intern!(py, "_checkpoints"))?.is_truthy()? {
            let flush = log.call_method0(intern!(py, "flush"))?;
            return Ok(StepBody::Await(await_iter(flush)?, Pending::Flush));
        }
        self.call_model(py)
    }

    pub(super) fn flush_done<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        outcome?;
        self.check(py)?;
        self.call_model(py)
    }

    fn is_model_error(&self, py: Python<'_>, e: &PyErr) -> PyResult<bool> {
        e.value(py).is_instance(helpers(py)?.model_error.bind(py))
    }

    /// Calls the model once: a failure goes to `request_error`; an async iterator is
    /// streamed; anything else is awaited.
    fn call_model<'py>(&mut self, py: Python<'py>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        let request = self.work()?.request.as_ref().map(|r| r.clone_ref(py)).ok_or_else(|| missing("request"))?;
        let produced = match self.agent(py).getattr(intern!(py, "_model"))?.call1((request,)) {
            Ok(produced) => produced,
            Err(e) if self.is_model_error(py, &e)? => return self.model_failed(py, e),
            Err(e) => return Err(e),
        };
        if has_anext(&produced) {
            let assembler = h.assembler.bind(py).call0()?;
            let work = self.work()?;
            work.stream = Some(produced.unbind());
            work.assembler = Some(assembler.unbind());
            work.seqs = Some(PyList::empty(py).unbind());
            return self.next_chunk(py);
        }
        if !has_await(&produced) {
            // A plain function's return value: a reply given synchronously, or garbage.
            return self.after_model(py, Ok(produced));
        }
        self.step_user(py, Ok(produced), Seam::Model)
    }

    fn model_failed<'py>(&mut self, py: Python<'py>, e: PyErr) -> PyResult<StepBody<'py>> {
        let exc = e.into_value(py).into_bound(py).into_any();
        let failure = helpers(py)?.failure_of.bind(py).call1((&exc,))?;
        self.request_failed(py, failure, exc)
    }

    fn after_model<'py>(&mut self, py: Python<'py>, result: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        let reply = match result {
            Ok(reply) => reply,
            Err(e) if self.is_model_error(py, &e)? => return self.model_failed(py, e),
            Err(e) => return Err(e),
        };
        let reply = if reply.is_instance_of::<PyString>() { h.model_reply.bind(py).call1((reply,))? } else { reply };
        if !reply.is_instance(h.model_reply.bind(py))? {
            let message = format!("model returned {}; expected a ModelReply", reply.repr()?);
            return Err(turn_failure(py, message, "INVALID_REPLY"));
        }
        let content = reply.getattr(intern!(py, "content"))?;
        let usage = reply.getattr(intern!(py, "usage"))?;
        let finish = reply.getattr(intern!(py, "finish"))?;
        self.reply_done(py, content, usage, finish, PyList::empty(py))
    }

    // ---- streaming ------------------------------------------------------------------------

    fn stream<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.work()?.stream.as_ref().ok_or_else(|| missing("stream"))?.bind(py).clone())
    }

    fn assembler<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.work()?.assembler.as_ref().ok_or_else(|| missing("assembler"))?.bind(py).clone())
    }

    fn seqs<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        Ok(self.work()?.seqs.as_ref().ok_or_else(|| missing("chunk seqs"))?.bind(py).clone())
    }

    fn next_chunk<'py>(&mut self, py: Python<'py>) -> PyResult<StepBody<'py>> {
        let awaitable = self.stream(py).and_then(|s| s.call_method0(intern!(py, "__anext__")));
        self.step_user(py, awaitable, Seam::Chunk)
    }

    fn after_chunk<'py>(&mut self, py: Python<'py>, result: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        let chunk = match result {
            Ok(chunk) => chunk,
            Err(e) if e.is_instance_of::<PyStopAsyncIteration>(py) => return self.stream_end(py),
            Err(e) => return self.stream_failed(py, e),
        };
        match self.take_chunk(py, &chunk) {
            Ok(()) => self.next_chunk(py),
            Err(e) => self.stream_failed(py, e),
        }
    }

    /// Logs one chunk (`assistant/chunk`) and feeds it to the assembler.
    fn take_chunk<'py>(&mut self, py: Python<'py>, chunk: &Bound<'py, PyAny>) -> PyResult<()> {
        self.check(py)?;
        let valid = chunk.is_instance_of::<PyDict>()
            && chunk.call_method1(intern!(py, "get"), ("type",))?.is_instance_of::<PyString>();
        if !valid {
            let message = format!("model stream yielded {}; expected a chunk dict", chunk.repr()?);
            return Err(turn_failure(py, message, "INVALID_REPLY"));
        }
        let data = self.step_data(py, &[("chunk", chunk)])?;
        let event = self.append_event(py, "assistant/chunk", data.as_any(), None)?;
        self.seqs(py)?.append(event.getattr(intern!(py, "seq"))?)?;
        self.assembler(py)?.call_method1(intern!(py, "feed"), (chunk,))?;
        Ok(())
    }

    /// A stream failed (or was aborted, or cancelled from outside): a `ModelError` goes to
    /// `request_error`; otherwise what was visible is logged as an interrupted message when
    /// the turn aborted, the stream is closed, and the error propagates.
    fn stream_failed<'py>(&mut self, py: Python<'py>, error: PyErr) -> PyResult<StepBody<'py>> {
        if self.is_model_error(py, &error)? {
            return self.model_failed(py, error);
        }
        let stream = self.stream(py)?;
        let interrupted = (|| -> PyResult<()> {
            if !self.aborted(py)? {
                return Ok(());
            }
            let assembler = self.assembler(py)?;
            let visible = assembler.call_method0(intern!(py, "visible"))?;
            if !visible.is_truthy()? {
                return Ok(());
            }
            let usage = assembler.getattr(intern!(py, "usage"))?;
            let seqs = self.seqs(py)?.extract()?;
            self.append_assistant(py, &visible, &usage, seqs, true)?;
            Ok(())
        })();
        if let Err(e) = interrupted {
            // Raised while handling `error`: it becomes the new exception's context.
            e.value(py).setattr(intern!(py, "__context__"), error.value(py))?;
            return Err(e);
        }
        // `await aclose()`, whatever it raises, then `raise`.
        let aclose = match stream.getattr_opt(intern!(py, "aclose")) {
            Ok(Some(aclose)) => aclose,
            Ok(None) => return Err(error),
            Err(e) => {
                e.value(py).setattr(intern!(py, "__context__"), error.value(py))?;
                return Err(e);
            }
        };
        match aclose.call0().and_then(await_iter) {
            Ok(iter) => Ok(StepBody::Await(iter, Pending::CloseStream { error })),
            Err(_) => Err(error),
        }
    }

    /// The stream ended: a finish reason other than `stop` or `max-tokens` is a failure.
    fn stream_end<'py>(&mut self, py: Python<'py>) -> PyResult<StepBody<'py>> {
        let assembler = self.assembler(py)?;
        let seqs = self.seqs(py)?;
        let work = self.work()?;
        work.stream = None;
        work.assembler = None;
        work.seqs = None;
        let finish = assembler.getattr(intern!(py, "finish"))?;
        if !(finish.eq("stop")? || finish.eq("max-tokens")?) {
            let error = assembler.getattr(intern!(py, "error"))?;
            let failure = if error.is_truthy()? { py.get_type::<PyDict>().call1((error,))? } else { PyDict::new(py).into_any() };
            let failure = failure.cast_into::<PyDict>()?;
            if !failure.contains("message")? {
                failure.set_item("message", format!("model finished with reason {}", finish.repr()?))?;
            }
            if !failure.contains("code")? {
                failure.set_item("code", "UNKNOWN")?;
            }
            return self.request_failed(py, failure.into_any(), py.None().into_bound(py));
        }
        let blocks = assembler.getattr(intern!(py, "blocks"))?;
        let usage = assembler.getattr(intern!(py, "usage"))?;
        self.reply_done(py, blocks, usage, finish, seqs)
    }

    // ---- failures and retries (D1) ----------------------------------------------------------

    fn request_failed<'py>(&mut self, py: Python<'py>, failure: Bound<'py, PyAny>, exc: Bound<'py, PyAny>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        self.work()?.failure = Some((failure.clone().unbind(), exc.clone().unbind()));
        let agent = self.agent(py).clone();
        let awaitable = (|| -> PyResult<Bound<'py, PyAny>> {
            let payload = h.request_failure.bind(py).call1((&agent, self.turn_no(py), self.step_no(py), failure, exc, self.signal(py)?))?;
            let default = PyCFunction::new_closure(py, Some(c"no_action"), None, |args, _kwargs| -> PyResult<Py<PyAny>> {
                Ok(args.py().None())
            })?;
            waterfall(&agent.getattr(intern!(py, "_request_error"))?, &payload, default.as_any())
        })();
        self.step_user(py, awaitable, Seam::RequestError)
    }

    fn after_request_error<'py>(&mut self, py: Python<'py>, action: Bound<'py, PyAny>) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        self.check(py)?;
        let retry = action.is_instance(h.retry.bind(py))?
            || (action.is_instance_of::<PyDict>() && action.call_method1(intern!(py, "get"), ("kind",))?.eq("retry")?);
        let (failure, exc) = self.work()?.failure.take().ok_or_else(|| missing("failure"))?;
        if retry {
            return self.request_begin(py);
        }
        Err(PyErr::from_value(h.turn_failure.bind(py).call1((failure, exc))?))
    }

    // ---- the reply ----------------------------------------------------------------------------

    /// Logs the assistant message (tool calls dropped on `max-tokens`, 4.9), then runs its
    /// tool calls.
    fn reply_done<'py>(
        &mut self,
        py: Python<'py>,
        content: Bound<'py, PyAny>,
        usage: Bound<'py, PyAny>,
        finish: Bound<'py, PyAny>,
        seqs: Bound<'py, PyList>,
    ) -> PyResult<StepBody<'py>> {
        let h = helpers(py)?;
        let max_tokens = finish.eq("max-tokens")?;
        let content = if max_tokens {
            let kept = PyList::empty(py);
            for block in content.try_iter()? {
                let block = block?;
                if block.call_method1(intern!(py, "get"), ("type",))?.ne("tool-call")? {
                    kept.append(block)?;
                }
            }
            kept.into_any()
        } else {
            content
        };
        let calls = PyList::empty(py);
        if !max_tokens {
            // Only dicts: anything else fails the message's own validation, below.
            for block in content.try_iter()? {
                let block = block?;
                let Ok(dict) = block.cast::<PyDict>() else { continue };
                if dict.get_item(intern!(py, "type"))?.is_some_and(|t| t.eq("tool-call").unwrap_or(false)) {
                    calls.append(block)?;
                }
            }
            // Results are matched to calls by id (by the model's provider, and by the crash
            // closers): two calls with one id could never both be answered. Refused before the
            // message is logged, so the log never holds a call without its result.
            if let Some(id) = duplicate_call_id(&calls)? {
                let message = format!("model reply has two tool calls with id {id:?}; tool-call ids must be unique within a reply");
                return Err(turn_failure(py, message, "INVALID_REPLY"));
            }
        }
        self.append_assistant(py, &content, &usage, seqs.extract()?, false)?;
        if max_tokens {
            return Ok(StepBody::Done(StepEnd::MaxTokens));
        }
        if calls.is_empty() {
            return Ok(StepBody::Done(StepEnd::Completed));
        }
        if let Some(body) = self.lone_call(py, &calls)? {
            return Ok(body);
        }
        let ran = h.run_tools.bind(py).call1((self.agent(py), self.turn_no(py), self.step_no(py), calls))?;
        Ok(StepBody::Await(await_iter(ran)?, Pending::Tools))
    }

    pub(super) fn tools_done<'py>(&mut self, _py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>) -> PyResult<StepBody<'py>> {
        Ok(StepBody::Done(if outcome?.is_truthy()? { StepEnd::Completed } else { StepEnd::Again }))
    }
}
