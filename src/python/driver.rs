//! `Driver`: the AgentLoop's turn driver as a native coroutine object (SPEC 1, 4.3, 4.4).
//!
//! The AgentLoop runs one `Driver` as its Task. The driver is an explicit state machine over
//! the turn algorithm (reference 5.5 steps 4a–7): wherever the algorithm awaits something (the
//! `pre_step` waterfall, the step, the `turn_stopping` hooks, the `sleep(0)` that absorbs a
//! pending self-thrown cancellation) the driver holds that awaitable's iterator and delegates
//! `send`/`throw` to it with `PyIter_Send`, exactly like `await` in a Python coroutine. The
//! step body is states of the same machine (`step.rs`), and so is a step's lone tool call
//! (`tool.rs`); several calls are still a Python coroutine (`kerman._tools.run_tools`),
//! delegated to like any other awaitable.
//!
//! The machine is taken out of the object for the duration of every call, so no borrow of the
//! object is held while Python code runs; a re-entrant call sees "already executing".

mod canonical;
mod context;
mod delegate;
mod helpers;
mod step;
mod tool;
mod user;

use pyo3::exceptions::{
    PyBaseException, PyException, PyGeneratorExit, PyRuntimeError, PyStopIteration, PySystemError, PyTypeError,
    PyValueError,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyCFunction, PyDict, PyList, PyTuple, PyType};

use super::convert::to_json_text;
use super::errors::{log_err, not_json};
use super::event_log::PySessionLog;
use super::history::PyHistory;
use super::inbox::PyInbox;
use crate::inbox::Target;
use crate::json::push_u64;
use super::message::PyMessage;
use crate::event_log::{is_surface_type, Surface, SurfaceOp};
use delegate::{close_delegate, send_into, throw_into, type_name, Sent};
use helpers::{entered, exception, helpers, is_cancelled};
use step::{Step, StepEnd};

/// The user-code seams the driver awaits (each through `user_await`'s rules).
#[derive(Clone, Copy)]
enum Seam {
    /// The `pre_step` waterfall.
    PreStep,
    /// The `turn_stopping` hooks.
    Stopping,
    /// The `before_request` waterfall.
    BeforeRequest,
    /// A model call that returned an awaitable.
    Model,
    /// One `__anext__()` of a streaming model.
    Chunk,
    /// The `request_error` waterfall.
    RequestError,
}

/// What the driver is awaiting.
enum Pending {
    /// User code at a seam.
    User(Seam),
    /// `asyncio.sleep(0)` absorbing a self-thrown cancellation; `result` is the seam's.
    Absorb { seam: Seam, result: Py<PyAny> },
    /// `log.flush()`, the checkpoint barrier before a model request.
    Flush,
    /// `aclose()` of a stream that failed or was aborted; `error` is then raised.
    CloseStream { error: PyErr },
    /// `_tools.run_tools(loop, turn, step, calls)`.
    Tools,
    /// The body of a lone tool call the driver runs itself, suspended (an `InContext`).
    Tool,
    /// `asyncio.sleep(0)` absorbing a cancellation thrown into that body.
    ToolAbsorb,
}

/// How a `user_await` goes on: suspended in the awaitable, or done with its outcome.
enum UserStep<'py> {
    Await(Bound<'py, PyAny>, Pending),
    Done(PyResult<Bound<'py, PyAny>>),
}

/// How the turn body goes on.
enum Body<'py> {
    Await(Bound<'py, PyAny>, Pending),
    /// `break` out of the step loop: the turn ends with the recorded `ending`.
    Break,
}

/// How the driver goes on.
enum Flow<'py> {
    Await(Bound<'py, PyAny>, Pending),
    Return,
    Raise(PyErr),
}

/// One turn's state (the locals of the turn loop).
struct Turn {
    turn: Py<PyAny>,
    /// The turn's abort signal (`loop._signal` when the turn began; replaced only between
    /// turns), held so the many aborted-checks of a turn read one attribute, not two.
    signal: Py<PyAny>,
    claimed: Option<Py<PyAny>>,
    claim_error: Option<PyErr>,
    next_step: bool,
    batch: Option<Py<PyAny>>,
    step: Option<Py<PyAny>>,
    ending: Option<Py<PyAny>>,
    stop_driver: bool,
    max_tokens: bool,
    /// The running step's state, between `step/start` and `step/end`.
    work: Option<Step>,
}

impl Turn {
    fn new(turn: Py<PyAny>, signal: Py<PyAny>, claimed: Option<Py<PyAny>>, claim_error: Option<PyErr>) -> Turn {
        Turn {
            turn,
            signal,
            claimed,
            claim_error,
            next_step: false,
            batch: None,
            step: None,
            ending: None,
            stop_driver: false,
            max_tokens: false,
            work: None,
        }
    }
}

struct Machine {
    agent: Py<PyAny>,
    log: Py<PySessionLog>,
    inbox: Py<PyInbox>,
    history: Py<PyHistory>,
    turn: Turn,
    started: bool,
    /// The awaited delegate, while suspended in it.
    inner: Option<(Py<PyAny>, Pending)>,
}

enum Input<'py> {
    Send(Bound<'py, PyAny>),
    Throw(PyErr),
}

fn dict<'py>(py: Python<'py>, items: &[(&str, &Bound<'py, PyAny>)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in items {
        d.set_item(*k, v)?;
    }
    Ok(d)
}

impl Machine {
    fn agent<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.agent.bind(py)
    }

    fn signal<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.turn.signal.bind(py).clone())
    }

    fn aborted(&self, py: Python<'_>) -> PyResult<bool> {
        is_aborted(self.turn.signal.bind(py))
    }

    /// `_turn.check(loop)`: raises `_Aborted` once the signal has aborted.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        if self.aborted(py)? {
            return Err(PyErr::from_value(helpers(py)?.aborted.bind(py).call0()?));
        }
        Ok(())
    }

    /// Appends a loop-owned event whose payload is already JSON text, straight to the core
    /// log: no Python dict is built and converted for the loop's own fixed-shape events.
    /// Returns the event's seq (copying the event out of the log would cost atomics for nothing).
    fn append_json(&self, py: Python<'_>, kind: &str, data: String, seqs: Option<Vec<u64>>) -> PyResult<u64> {
        let surface = is_surface_type(kind).then_some(Surface { op: SurfaceOp::Append, source_event_seqs: seqs });
        self.log.get().inner.append_owned_seq(kind, data, surface).map_err(|e| log_err(py, e))
    }

    fn append(&self, py: Python<'_>, kind: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let text = to_json_text(data, "data").map_err(|e| not_json(py, kind, e.describe()))?;
        self.append_json(py, kind, text, None).map(drop)
    }

    /// `{"turn":T,"step":S}` (the data of `step/start` and `step/end`).
    fn turn_and_step(&self, py: Python<'_>) -> PyResult<String> {
        let mut out = self.turn_step_head(py)?;
        out.push('}');
        Ok(out)
    }

    /// `{"turn":T,"step":S` (unterminated): the head of every step payload.
    fn turn_step_head(&self, py: Python<'_>) -> PyResult<String> {
        let turn: u64 = self.turn.turn.bind(py).extract()?;
        let step: Option<u64> = match &self.turn.step {
            Some(s) => s.bind(py).extract()?,
            None => None,
        };
        let mut out = turn_json(turn);
        out.push_str(r#","step":"#);
        match step {
            Some(step) => push_u64(&mut out, step),
            None => out.push_str("null"),
        }
        Ok(out)
    }

    /// Appends a surface event carrying `message`; the message joins the derived history
    /// directly, so requests never re-read what the loop wrote.
    fn append_message(&self, py: Python<'_>, kind: &str, data: String, seqs: Option<Vec<u64>>, message: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        let seq = self.append_json(py, kind, data, seqs)?;
        self.history.get().push(py, self.log.get(), seq, message)?;
        Ok(seq)
    }

    fn next_step_pending(&self, _py: Python<'_>) -> PyResult<bool> {
        Ok(self.inbox.get().inner.count(Target::NextStep) > 0)
    }

    // ---- the driver: one delegation step at a time ------------------------------------------

    /// Runs until the driver suspends (`Ok(yielded)`) or finishes (`Err`: `StopIteration` on
    /// return, else the exception). The bool says whether it finished.
    fn run<'py>(&mut self, py: Python<'py>, input: Input<'py>) -> (bool, PyResult<Py<PyAny>>) {
        let flow = match (self.inner.take(), input) {
            (Some((iter, pending)), Input::Send(value)) => {
                let iter = iter.into_bound(py);
                match send_into(&iter, &value) {
                    Sent::Next(y) => {
                        self.inner = Some((iter.unbind(), pending));
                        return (false, Ok(y.unbind()));
                    }
                    Sent::Return(r) => self.resume(py, Some(pending), Ok(r)),
                    Sent::Error(e) => self.resume(py, Some(pending), Err(e)),
                }
            }
            (Some((iter, pending)), Input::Throw(exc)) => {
                let iter = iter.into_bound(py);
                match throw_into(&iter, exc) {
                    Sent::Next(y) => {
                        self.inner = Some((iter.unbind(), pending));
                        return (false, Ok(y.unbind()));
                    }
                    Sent::Return(r) => self.resume(py, Some(pending), Ok(r)),
                    Sent::Error(e) => self.resume(py, Some(pending), Err(e)),
                }
            }
            (None, Input::Send(value)) => {
                if self.started {
                    return (true, Err(PySystemError::new_err("the driver lost its awaited object")));
                }
                if !value.is_none() {
                    return (false, Err(PyTypeError::new_err("can't send non-None value to a just-started coroutine")));
                }
                self.started = true;
                self.resume(py, None, Ok(value))
            }
            // Thrown before the first step (the Task was cancelled before it ran): the
            // exception lands at the top of the turn, which still ends and reports.
            (None, Input::Throw(exc)) => {
                self.started = true;
                self.resume(py, None, Err(exc))
            }
        };
        self.drive(py, flow)
    }

    fn drive<'py>(&mut self, py: Python<'py>, mut flow: Flow<'py>) -> (bool, PyResult<Py<PyAny>>) {
        loop {
            flow = match flow {
                Flow::Await(iter, pending) => match send_into(&iter, &py.None().into_bound(py)) {
                    Sent::Next(y) => {
                        self.inner = Some((iter.unbind(), pending));
                        return (false, Ok(y.unbind()));
                    }
                    Sent::Return(r) => self.resume(py, Some(pending), Ok(r)),
                    Sent::Error(e) => self.resume(py, Some(pending), Err(e)),
                },
                Flow::Return => return (true, Err(PyStopIteration::new_err(()))),
                Flow::Raise(e) => {
                    if e.is_instance_of::<PyStopIteration>(py) {
                        let wrapped = PyRuntimeError::new_err("coroutine raised StopIteration");
                        wrapped.set_cause(py, Some(e));
                        return (true, Err(wrapped));
                    }
                    return (true, Err(e));
                }
            };
        }
    }

    /// An await finished with `outcome` (`pending` is `None` for the driver's start).
    fn resume<'py>(&mut self, py: Python<'py>, pending: Option<Pending>, outcome: PyResult<Bound<'py, PyAny>>) -> Flow<'py> {
        let body = match pending {
            None => match outcome {
                Ok(_) => self.turn_top(py),
                Err(e) => Err(e),
            },
            Some(Pending::User(seam)) => match self.user_finish(py, outcome, seam) {
                UserStep::Await(iter, pending) => Ok(Body::Await(iter, pending)),
                UserStep::Done(result) => self.seam_done(py, seam, result),
            },
            Some(Pending::Absorb { seam, result }) => {
                let result = self.absorb_finish(py, outcome, result);
                self.seam_done(py, seam, result)
            }
            Some(Pending::Flush) => {
                let flushed = self.flush_done(py, outcome);
                self.step_settle(py, flushed)
            }
            Some(Pending::CloseStream { error }) => self.step_settle(py, Err(error)),
            Some(Pending::Tools) => {
                let ran = self.tools_done(py, outcome);
                self.step_settle(py, ran)
            }
            Some(Pending::Tool) => {
                let ran = self.lone_resumed(py, outcome);
                self.step_settle(py, ran)
            }
            Some(Pending::ToolAbsorb) => {
                let ran = self.lone_absorbed(py, outcome);
                self.step_settle(py, ran)
            }
        };
        self.settle(py, body)
    }

    /// Runs turn ends and the driver loop until something is awaited or the driver finishes.
    fn settle<'py>(&mut self, py: Python<'py>, mut body: PyResult<Body<'py>>) -> Flow<'py> {
        loop {
            let exc = match body {
                Ok(Body::Await(iter, pending)) => return Flow::Await(iter, pending),
                Ok(Body::Break) => None,
                Err(e) => Some(e),
            };
            let next = match self.end_turn(py, exc) {
                Ok(true) => self.next_turn(py),
                Ok(false) => Ok(false),
                Err(e) => Err(e),
            };
            body = match next {
                Ok(true) => self.turn_top(py),
                Ok(false) => return self.finish(py, None),
                Err(e) => return self.finish(py, Some(e)),
            };
        }
    }

    // ---- the turn body (inside the turn's try) ----------------------------------------------

    fn turn_top<'py>(&mut self, py: Python<'py>) -> PyResult<Body<'py>> {
        if let Some(e) = self.turn.claim_error.take() {
            return Err(e);
        }
        self.turn.next_step = false;
        self.turn.batch = Some(match self.turn.claimed.take() {
            Some(claimed) if claimed.bind(py).is_truthy()? => claimed,
            _ => PyList::empty(py).into_any().unbind(),
        });
        self.step_top(py)
    }

    /// The head of the step loop: claim (between steps) and start the `pre_step` waterfall.
    fn step_top<'py>(&mut self, py: Python<'py>) -> PyResult<Body<'py>> {
        let h = helpers(py)?;
        self.check(py)?;
        let agent = self.agent(py).clone();
        let step = agent.getattr(intern!(py, "_step"))?.add(1)?;
        if self.turn.next_step {
            let batch = self.inbox.bind(py).call_method1(intern!(py, "claim"), ("next-step", self.turn.turn.bind(py)))?;
            self.turn.batch = Some(batch.unbind());
        }
        let batch = self.turn.batch.as_ref().map(|b| b.bind(py).clone()).unwrap_or_else(|| PyList::empty(py).into_any());
        let listeners = agent.getattr(intern!(py, "_pre_step"))?;
        if !listeners.is_truthy()? {
            // No listener: the decision is the default one, entering the batch as claimed,
            // and there is nobody to see a payload, so none is built.
            self.turn.step = Some(step.unbind());
            let messages = PyList::new(py, batch.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
            return self.decided(py, "enter", messages.into_any());
        }
        let payload = h.pre_step.bind(py).call1((&agent, batch, self.turn.turn.bind(py), &step, self.signal(py)?))?;
        self.turn.step = Some(step.unbind());
        let default = {
            let payload = payload.clone().unbind();
            PyCFunction::new_closure(py, Some(c"enter_claimed"), None, move |args, _kwargs| -> PyResult<Py<PyAny>> {
                let py = args.py();
                let messages = payload.bind(py).getattr(intern!(py, "messages"))?;
                Ok(helpers(py)?.enter.bind(py).call1((messages,))?.unbind())
            })?
        };
        let awaitable = step::waterfall(&listeners, &payload, default.as_any());
        self.user_await(py, awaitable, Seam::PreStep)
    }

    fn after_pre_step<'py>(&mut self, py: Python<'py>, result: Bound<'py, PyAny>) -> PyResult<Body<'py>> {
        let h = helpers(py)?;
        let (kind, value): (String, Bound<'py, PyAny>) = match entered(&result)? {
            Some(messages) => ("enter".to_owned(), messages.into_any()),
            None => h.decision.bind(py).call1((result,))?.extract()?,
        };
        self.decided(py, &kind, value)
    }

    /// The pre-step decision, `"enter"` (with the messages) or `"reject"` (with the reason).
    fn decided<'py>(&mut self, py: Python<'py>, kind: &str, value: Bound<'py, PyAny>) -> PyResult<Body<'py>> {
        self.check(py)?;
        if kind == "reject" {
            let blocked = "blocked".into_pyobject(py)?.into_any();
            let ending = dict(py, &[("kind", &blocked)])?;
            if !value.is_none() {
                ending.set_item("reason", value)?;
            }
            self.turn.ending = Some(ending.into_any().unbind());
            self.turn.stop_driver = true;
            return Ok(Body::Break);
        }
        let entering = value.is_truthy()?;
        if self.turn.ending.is_some() && !entering {
            return Ok(Body::Break);
        }
        let agent = self.agent(py).clone();
        if agent.getattr(intern!(py, "_step"))?.eq(0)? && !entering {
            let completed = "completed".into_pyobject(py)?.into_any();
            self.turn.ending = Some(dict(py, &[("kind", &completed)])?.into_any().unbind());
            self.turn.stop_driver = true;
            return Ok(Body::Break);
        }
        self.check(py)?;
        self.append_json(py, "step/start", self.turn_and_step(py)?, None)?;
        let step = self.turn.step.as_ref().map(|s| s.bind(py).clone()).unwrap_or_else(|| py.None().into_bound(py));
        agent.setattr(intern!(py, "_step"), &step)?;
        // try: ... finally: step/end
        let entered = (|| -> PyResult<()> {
            for message in value.try_iter()? {
                let message = message?;
                // Entered batches hold UserMessage objects only (`entered` / `_decision`).
                let data = message.cast::<PyMessage>()?.get().inner.json().to_owned();
                self.append_message(py, "user/message", data, None, Some(&message))?;
            }
            Ok(())
        })();
        let body = entered.and_then(|()| self.step_begin(py, value));
        self.step_settle(py, body)
    }

    fn step_done<'py>(&mut self, py: Python<'py>, outcome: PyResult<StepEnd>) -> PyResult<Body<'py>> {
        // The step's finally: step/end is appended whatever happened (and its failure wins).
        self.turn.work = None;
        self.append_json(py, "step/end", self.turn_and_step(py)?, None)?;
        let end = outcome?;
        self.turn.max_tokens = self.turn.max_tokens || matches!(end, StepEnd::MaxTokens);
        self.turn.ending = if matches!(end, StepEnd::Again) {
            None
        } else {
            let kind = if self.turn.max_tokens { "max-tokens" } else { "completed" };
            let kind = kind.into_pyobject(py)?.into_any();
            Some(dict(py, &[("kind", &kind)])?.into_any().unbind())
        };
        self.check(py)?;
        if self.turn.ending.is_some() && !self.next_step_pending(py)? {
            let h = helpers(py)?;
            let agent = self.agent(py);
            let listeners = agent.getattr(intern!(py, "_turn_stopping"))?;
            // No hooks: `serial` over none would return at once, with no user code run.
            if listeners.is_truthy()? {
                let stop = h.turn_stopping.bind(py).call1((agent, self.turn.turn.bind(py), self.signal(py)?))?;
                let awaitable = h.serial.bind(py).call1((listeners, stop));
                return self.user_await(py, awaitable, Seam::Stopping);
            }
            self.check(py)?;
        }
        self.after_stopping(py)
    }

    fn after_stopping<'py>(&mut self, py: Python<'py>) -> PyResult<Body<'py>> {
        if self.turn.ending.is_some() && !self.next_step_pending(py)? {
            return Ok(Body::Break);
        }
        self.turn.next_step = true;
        self.step_top(py)
    }

    // ---- the turn's except and finally ------------------------------------------------------

    /// Ends the turn (`exc` is what escaped its body): records the ending, appends `turn/end`.
    /// `Ok` says whether the driver goes on with the next queued turn; `Err` propagates.
    fn end_turn(&mut self, py: Python<'_>, exc: Option<PyErr>) -> PyResult<bool> {
        let mut external: Option<PyErr> = None;
        let mut reraise: Option<PyErr> = None;
        if let Some(exc) = exc {
            self.turn.stop_driver = true;
            // Fenced out by a newer lease owner: the session is no longer ours, so not even a
            // turn/end is appended (the new owner's open closed this turn).
            if self.fenced(py, &exc)? {
                return Ok(false);
            }
            let handled = (|| -> PyResult<bool> {
                let h = helpers(py)?;
                let cancelled = is_cancelled(py, h, &exc);
                if cancelled && !self.aborted(py)? {
                    // Cancelled from outside (event-loop shutdown): end the turn, then propagate.
                    let disposed = "disposed".into_pyobject(py)?.into_any();
                    self.signal(py)?.call_method1(intern!(py, "_abort"), (dict(py, &[("kind", &disposed)])?,))?;
                    external = Some(exc.clone_ref(py));
                }
                if self.aborted(py)? {
                    let aborted = "aborted".into_pyobject(py)?.into_any();
                    let reason = self.signal(py)?.getattr(intern!(py, "reason"))?;
                    self.turn.ending = Some(dict(py, &[("kind", &aborted), ("reason", &reason)])?.into_any().unbind());
                } else {
                    let value = &exception(py, &exc);
                    let failure = h.failure_of.bind(py).call1((value,))?;
                    let error = "error".into_pyobject(py)?.into_any();
                    self.turn.ending = Some(dict(py, &[("kind", &error), ("error", &failure)])?.into_any().unbind());
                    let reported = if value.is_instance(h.turn_failure.bind(py))? {
                        value.getattr(intern!(py, "cause"))?
                    } else {
                        value.clone().into_any()
                    };
                    h.emit_error.bind(py).call1((self.agent(py), self.turn.turn.bind(py), failure, reported))?;
                }
                Ok(cancelled || exc.is_instance_of::<PyException>(py))
            })();
            match handled {
                Ok(true) => {}
                Ok(false) => reraise = Some(exc),
                Err(e) => reraise = Some(e),
            }
        }
        // finally: turn/end, whatever happened.
        let ending = match &self.turn.ending {
            Some(e) => e.bind(py).clone(),
            None => py.None().into_bound(py),
        };
        let appended = (|| -> PyResult<()> {
            let turn: u64 = self.turn.turn.bind(py).extract()?;
            let reason = to_json_text(&ending, "data.reason").map_err(|e| not_json(py, "turn/end", e.describe()))?;
            let mut data = turn_json(turn);
            data.push_str(r#","reason":"#);
            data.push_str(&reason);
            data.push('}');
            self.append_json(py, "turn/end", data, None).map(drop)
        })();
        if let Err(e) = appended {
            if !e.is_instance_of::<PyException>(py) {
                return Err(e);
            }
            if self.fenced(py, &e)? {
                return Ok(false);
            }
            let reported = (|| -> PyResult<()> {
                let h = helpers(py)?;
                let value = exception(py, &e);
                let failure = h.failure_of.bind(py).call1((&value,))?;
                h.emit_error.bind(py).call1((self.agent(py), self.turn.turn.bind(py), failure, value))?;
                Ok(())
            })();
            reported?;
            self.turn.stop_driver = true;
        }
        if let Some(e) = reraise {
            return Err(e);
        }
        if let Some(e) = external {
            return Err(e);
        }
        Ok(!self.turn.stop_driver && self.inbox.bind(py).getattr(intern!(py, "has_pending"))?.is_truthy()?)
    }

    /// `_turn.fence(loop, turn, exc)`: true (and the loop fenced) when `exc` is a lost lease.
    fn fenced(&mut self, py: Python<'_>, exc: &PyErr) -> PyResult<bool> {
        let fenced = helpers(py)?.fence.bind(py).call1((self.agent(py), self.turn.turn.bind(py), exc.value(py)))?.is_truthy()?;
        if fenced {
            self.turn.stop_driver = true;
        }
        Ok(fenced)
    }

    /// Between turns: a fresh signal, then the next turn's synchronous prefix. `Ok(false)` when
    /// no turn was recorded.
    fn next_turn(&mut self, py: Python<'_>) -> PyResult<bool> {
        let h = helpers(py)?;
        let agent = self.agent(py);
        agent.setattr(intern!(py, "_signal"), h.signal.bind(py).call0()?)?;
        agent.setattr(intern!(py, "_step"), 0)?;
        agent.setattr(intern!(py, "_wake_requested"), false)?;
        match begin_turn(agent, self.log.get(), self.inbox.get())? {
            Some(turn) => {
                self.turn = turn;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The driver's except and finally: an outside cancellation propagates after the loop is
    /// idle, any other exception was already reported by its turn and is logged.
    fn finish<'py>(&mut self, py: Python<'py>, err: Option<PyErr>) -> Flow<'py> {
        let mut external: Option<PyErr> = None;
        let mut reraise: Option<PyErr> = None;
        if let Some(e) = err {
            let kind = helpers(py).map(|h| (is_cancelled(py, h, &e), e.is_instance_of::<PyException>(py)));
            match kind {
                Ok((true, _)) => external = Some(e),
                Ok((false, true)) => {
                    let logged = (|| -> PyResult<()> {
                        // The next turn's turn/start refused for a lost lease: fenced, not a bug.
                        if self.fenced(py, &e)? {
                            return Ok(());
                        }
                        let kwargs = PyDict::new(py);
                        kwargs.set_item("exc_info", e.value(py))?;
                        helpers(py)?.logger.bind(py).call_method("error", ("AgentLoop driver failed",), Some(&kwargs))?;
                        Ok(())
                    })();
                    if let Err(e2) = logged {
                        reraise = Some(e2);
                    }
                }
                Ok((false, false)) => reraise = Some(e),
                Err(e2) => reraise = Some(e2),
            }
        }
        let finally = (|| -> PyResult<()> {
            let agent = self.agent(py);
            agent.setattr(intern!(py, "_task"), py.None())?;
            agent.call_method0(intern!(py, "_finish_driver"))?;
            Ok(())
        })();
        if let Err(e) = finally {
            return Flow::Raise(e);
        }
        match (reraise, external) {
            (Some(e), _) | (None, Some(e)) => Flow::Raise(e),
            (None, None) => Flow::Return,
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.agent)?;
        visit.call(&self.log)?;
        visit.call(&self.inbox)?;
        visit.call(&self.history)?;
        let t = &self.turn;
        visit.call(&t.turn)?;
        visit.call(&t.signal)?;
        for obj in [&t.claimed, &t.batch, &t.step, &t.ending].into_iter().flatten() {
            visit.call(obj)?;
        }
        if let Some(work) = &t.work {
            work.visit(visit)?;
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

/// `{"turn":T` (unterminated): the head of every turn and step payload.
fn turn_json(turn: u64) -> String {
    let mut out = String::with_capacity(64);
    out.push_str(r#"{"turn":"#);
    push_u64(&mut out, turn);
    out
}

/// `signal.aborted`, read from its slot (`_reason is not None`) for an exact `Signal`.
fn is_aborted(signal: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = signal.py();
    if signal.get_type().is(helpers(py)?.signal.bind(py)) {
        return Ok(!signal.getattr(intern!(py, "_reason"))?.is_none());
    }
    signal.getattr(intern!(py, "aborted"))?.is_truthy()
}

/// The synchronous prefix of a turn (reference 5.5 steps 1–3, 5.6 step 1): `turn/start`, then
/// the first claim of `next-turn`. `None` when no turn was recorded: the signal had aborted,
/// or `turn/start` could not be appended (reported as `agent/error`). A failed claim is kept
/// for the turn's body to raise, so the turn still ends.
fn begin_turn(agent: &Bound<'_, PyAny>, log: &PySessionLog, inbox: &PyInbox) -> PyResult<Option<Turn>> {
    let py = agent.py();
    let signal = agent.getattr(intern!(py, "_signal"))?;
    if is_aborted(&signal)? {
        return Ok(None);
    }
    let last: u64 = agent.getattr(intern!(py, "_turn"))?.extract()?;
    let turn = last + 1;
    let mut data = turn_json(turn);
    data.push('}');
    let started = log.inner.append_owned_seq("turn/start", data, None);
    if let Err(e) = started {
        let e = log_err(py, e);
        let h = helpers(py)?;
        // A lost lease fences the loop (and reports it); any other failure is reported as is.
        if !h.fence.bind(py).call1((agent, last, e.value(py)))?.is_truthy()? {
            let value = exception(py, &e);
            let failure = h.failure_of.bind(py).call1((&value,))?;
            h.emit_error.bind(py).call1((agent, last, failure, value))?;
        }
        return Ok(None);
    }
    agent.setattr(intern!(py, "_turn"), turn)?;
    let (claimed, claim_error) = match inbox.claim(py, intern!(py, "next-turn").as_any(), turn) {
        Ok(batch) => (Some(batch.into_any().unbind()), None),
        Err(e) if e.is_instance_of::<PyException>(py) => (None, Some(e)),
        Err(e) => return Err(e),
    };
    Ok(Some(Turn::new(turn.into_pyobject(py)?.into_any().unbind(), signal.unbind(), claimed, claim_error)))
}

fn prefix_turn(agent: &Bound<'_, PyAny>, turn: Bound<'_, PyAny>, claimed: Bound<'_, PyAny>, claim_error: Bound<'_, PyAny>) -> PyResult<Turn> {
    let signal = agent.getattr(intern!(agent.py(), "_signal"))?.unbind();
    let claimed = if claimed.is_none() { None } else { Some(claimed.unbind()) };
    let claim_error = if claim_error.is_none() {
        None
    } else {
        Some(PyErr::from_value(claim_error.cast_into::<PyBaseException>()?.into_any()))
    };
    Ok(Turn::new(turn.unbind(), signal, claimed, claim_error))
}

enum State {
    Ready(Box<Machine>),
    /// Inside `send`/`throw`/`close`: the machine is on the Rust stack.
    Running,
    Done,
}

/// The AgentLoop's turn driver: a coroutine object (``send``/``throw``/``close``/``__await__``)
/// run as the loop's Task. ``Driver(loop, turn, claimed, claim_error)`` takes the turn whose
/// ``turn/start`` and first claim ``begin_turn`` already committed.
#[pyclass(name = "Driver", module = "kerman", weakref)]
pub struct PyDriver {
    state: State,
}

impl PyDriver {
    fn take(slf: &Bound<'_, Self>) -> PyResult<Result<Box<Machine>, bool>> {
        let mut this = slf.try_borrow_mut()?;
        Ok(match std::mem::replace(&mut this.state, State::Running) {
            State::Ready(machine) => Ok(machine),
            State::Running => Err(true),
            State::Done => {
                this.state = State::Done;
                Err(false)
            }
        })
    }

    fn put(slf: &Bound<'_, Self>, machine: Box<Machine>, done: bool) -> PyResult<()> {
        let finished = {
            let mut this = slf.try_borrow_mut()?;
            if done {
                this.state = State::Done;
                Some(machine)
            } else {
                this.state = State::Ready(machine);
                None
            }
        };
        // Dropping the references may run finalizers: not while the object is borrowed.
        drop(finished);
        Ok(())
    }

    fn run<'py>(slf: &Bound<'py, Self>, input: Input<'py>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let mut machine = match Self::take(slf)? {
            Ok(machine) => machine,
            Err(true) => return Err(PyValueError::new_err("coroutine already executing")),
            Err(false) => {
                return Err(match input {
                    Input::Send(_) => PyRuntimeError::new_err("cannot reuse already awaited coroutine"),
                    Input::Throw(exc) => exc,
                })
            }
        };
        let (done, out) = machine.run(py, input);
        Self::put(slf, machine, done)?;
        out
    }
}

fn exception_arg(typ: &Bound<'_, PyAny>, val: Option<&Bound<'_, PyAny>>, tb: Option<&Bound<'_, PyAny>>) -> PyResult<PyErr> {
    let val = val.filter(|v| !v.is_none());
    let exc = if typ.is_instance_of::<PyBaseException>() {
        if val.is_some() {
            return Err(PyTypeError::new_err("instance exception may not have a separate value"));
        }
        typ.clone()
    } else if typ.cast::<PyType>().is_ok_and(|t| t.is_subclass_of::<PyBaseException>().unwrap_or(false)) {
        match val {
            None => typ.call0()?,
            Some(v) if v.is_instance(typ)? => v.clone(),
            Some(v) => match v.cast::<PyTuple>() {
                Ok(args) => typ.call1(args)?,
                Err(_) => typ.call1((v,))?,
            },
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "exceptions must be classes or instances deriving from BaseException, not {}",
            type_name(typ)
        )));
    };
    let exc = match tb.filter(|t| !t.is_none()) {
        Some(tb) => exc.call_method1(intern!(typ.py(), "with_traceback"), (tb,))?,
        None => exc,
    };
    Ok(PyErr::from_value(exc))
}

#[pymethods]
impl PyDriver {
    #[new]
    #[pyo3(signature = (r#loop, turn, claimed, claim_error))]
    fn new(
        r#loop: &Bound<'_, PyAny>,
        turn: &Bound<'_, PyAny>,
        claimed: &Bound<'_, PyAny>,
        claim_error: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let py = r#loop.py();
        helpers(py)?;
        let machine = Machine {
            agent: r#loop.clone().unbind(),
            log: r#loop.getattr(intern!(py, "_log"))?.cast_into::<PySessionLog>()?.unbind(),
            inbox: r#loop.getattr(intern!(py, "_inbox"))?.cast_into::<PyInbox>()?.unbind(),
            history: r#loop.getattr(intern!(py, "_history"))?.cast_into::<PyHistory>()?.unbind(),
            turn: prefix_turn(r#loop, turn.clone(), claimed.clone(), claim_error.clone())?,
            started: false,
            inner: None,
        };
        Ok(PyDriver { state: State::Ready(Box::new(machine)) })
    }

    /// Starts a turn for `loop` (`turn/start`, the first claim) and returns the driver that
    /// runs it, or `None` when no turn was recorded.
    #[staticmethod]
    fn begin(r#loop: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let py = r#loop.py();
        let log = r#loop.getattr(intern!(py, "_log"))?.cast_into::<PySessionLog>()?;
        let inbox = r#loop.getattr(intern!(py, "_inbox"))?.cast_into::<PyInbox>()?;
        let Some(turn) = begin_turn(r#loop, log.get(), inbox.get())? else { return Ok(None) };
        let machine = Machine {
            agent: r#loop.clone().unbind(),
            log: log.unbind(),
            inbox: inbox.unbind(),
            history: r#loop.getattr(intern!(py, "_history"))?.cast_into::<PyHistory>()?.unbind(),
            turn,
            started: false,
            inner: None,
        };
        Ok(Some(PyDriver { state: State::Ready(Box::new(machine)) }))
    }

    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Self::run(slf, Input::Send(slf.py().None().into_bound(slf.py())))
    }

    /// Resumes the driver with ``value``; returns what it yields, raises ``StopIteration``
    /// when it finishes.
    fn send(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Self::run(slf, Input::Send(value.clone()))
    }

    /// Raises ``exc`` where the driver is suspended (inside the awaited object, if any).
    #[pyo3(signature = (typ, val=None, tb=None))]
    fn throw(
        slf: &Bound<'_, Self>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let exc = exception_arg(typ, val, tb)?;
        Self::run(slf, Input::Throw(exc))
    }

    /// Raises ``GeneratorExit`` where the driver is suspended (closing the awaited object
    /// first); the turn ends and the loop goes idle.
    fn close(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let mut machine = match Self::take(slf)? {
            Ok(machine) => machine,
            Err(true) => return Err(PyValueError::new_err("coroutine already executing")),
            Err(false) => return Ok(()),
        };
        let Some((iter, pending)) = machine.inner.take() else {
            // Never started: nothing ran, nothing to unwind.
            return Self::put(slf, machine, true);
        };
        let exc = close_delegate(&iter.into_bound(py));
        let flow = machine.resume(py, Some(pending), Err(exc));
        let (done, out) = machine.drive(py, flow);
        Self::put(slf, machine, done)?;
        match out {
            Ok(_) => Err(PyRuntimeError::new_err("coroutine ignored GeneratorExit")),
            Err(e) if e.is_instance_of::<PyGeneratorExit>(py) || e.is_instance_of::<PyStopIteration>(py) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// For asyncio's Task repr.
    #[getter]
    fn __name__(&self) -> &'static str {
        "Driver"
    }

    #[getter]
    fn __qualname__(&self) -> &'static str {
        "Driver"
    }

    fn __repr__(&self) -> &'static str {
        match self.state {
            State::Ready(_) => "<kerman.Driver suspended>",
            State::Running => "<kerman.Driver running>",
            State::Done => "<kerman.Driver done>",
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.state {
            State::Ready(machine) => machine.visit(&visit),
            _ => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        if let State::Ready(_) = self.state {
            self.state = State::Done;
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDriver>()?;
    Ok(())
}
