//! `Driver`: a coroutine object (the AgentLoop's asyncio Task) that runs a turn machine,
//! turning its effects into awaits.
//!
//! Wherever the machine asks for something to be awaited (a waterfall of listeners, the model,
//! a chunk, a flush, a tool body) the driver holds that awaitable's iterator and delegates
//! `send`/`throw` to it with `PyIter_Send`, exactly like `await` in a Python coroutine; the
//! outcome goes back to the machine as its next input. The driver keeps the coroutine
//! protocol, the absorption of the cancellations `cancel()` throws (`seams.rs`), context
//! variables for tool bodies (`tools.rs`) and payload building; the loop's rules are the
//! machine's.
//!
//! The run is taken out of the object for the duration of every call, so no borrow of the
//! object is held while Python code runs; a re-entrant call sees "already executing".

use std::sync::Arc;

use pyo3::exceptions::{PyGeneratorExit, PyRuntimeError, PyStopIteration, PySystemError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};

use super::super::runtime::coroutine::{coroutine_methods, Coroutine, Resume};
use super::delegate::{close_delegate, send_into, throw_into, Sent};
use super::run::{core_err, Pending, Run, Step};
use super::{classes, PyLoopCore};
use crate::agent_loop::{decisions, Effect, Input, Machine};

impl Run {
    /// Runs effects until one must be awaited or the run is over.
    fn advance<'py>(&mut self, py: Python<'py>, input: Input) -> Step<'py> {
        let mut input = input;
        loop {
            let effect = self.with_ctx(py, |machine, ctx| machine.resume(ctx, input));
            match self.perform(py, effect) {
                Step::Input(next) => input = next,
                step => return step,
            }
        }
    }

    /// Does what `effect` asks; an exception doing it is the effect's outcome.
    fn perform<'py>(&mut self, py: Python<'py>, effect: Effect) -> Step<'py> {
        match self.try_perform(py, effect) {
            Ok(step) => step,
            Err(e) => Step::Input(self.raised(py, e)),
        }
    }

    fn try_perform<'py>(&mut self, py: Python<'py>, effect: Effect) -> PyResult<Step<'py>> {
        let c = classes(py)?;
        let parts = Arc::clone(&self.parts);
        Ok(match effect {
            Effect::PreStep { batch } => return self.pre_step(py, batch),
            Effect::BeforeRequest => return self.before_request(py),
            Effect::Flush => {
                let flush = parts.log.bind(py).call_method0(intern!(py, "flush"))?;
                Step::Await(super::delegate::await_iter(flush)?, Pending::Flush)
            }
            Effect::CallModel => return self.call_model(py),
            Effect::NextChunk => return self.next_chunk(py),
            Effect::CloseStream => {
                let Some(stream) = self.stream.take() else { return Ok(Step::Input(Input::Continue)) };
                match stream.bind(py).getattr_opt(intern!(py, "aclose")) {
                    Ok(Some(aclose)) => match aclose.call0().and_then(super::delegate::await_iter) {
                        Ok(iter) => Step::Await(iter, Pending::CloseStream),
                        Err(_) => Step::Input(Input::Continue),
                    },
                    _ => Step::Input(Input::Continue),
                }
            }
            Effect::RequestError { failure, exception } => return self.request_error(py, &failure, exception),
            Effect::RunTools => {
                let plan = self.machine.take_plan().ok_or_else(|| PySystemError::new_err("the driver lost its tool plan"))?;
                return self.run_plan(py, plan);
            }
            Effect::TurnStopping => return self.turn_stopping(py),
            Effect::BeforeTool { call_id, name, arguments, .. } => return self.before_tool(py, call_id, &name, arguments),
            // The step waits for decisions: the run ends, the turn stays open.
            Effect::AwaitDecisions => Step::Finished,
            Effect::Describe(e) => Step::Input(self.raised(py, core_err(py, e))),
            Effect::Report { turn, step, failure, exception } => {
                let exc = if exception { self.last_exc.take().map(|e| e.into_bound(py).into_any()) } else { None };
                let failure = super::super::convert::to_py(py, &failure.map_or(serde_json::Value::Null, |f| f.to_value()))?;
                parts.report_turn.bind(py).call1((self.agent.bind(py), turn, step, failure, exc))?;
                Step::Input(Input::Continue)
            }
            Effect::Abort(cause) => {
                let cause = super::super::convert::to_py(py, &cause.to_value())?;
                parts.abort.bind(py).call1((self.core(py).get().signal_obj(py), cause))?;
                Step::Input(Input::Continue)
            }
            Effect::Fence { turn, failure, cause } => {
                let cause = super::super::convert::to_py(py, &cause.to_value())?;
                parts.abort.bind(py).call1((self.core(py).get().signal_obj(py), cause))?;
                let core_obj = self.core.clone_ref(py);
                let core = core_obj.bind(py).get();
                if !core.is_fenced() {
                    let exc = self.last_exc.take().map(|e| e.into_bound(py).into_any());
                    core.set_fenced(exc.as_ref().map_or_else(|| py.None(), |e| e.clone().unbind()));
                    let failure = super::super::convert::to_py(py, &failure.to_value())?;
                    let step = core.shared.state().step;
                    parts.report_turn.bind(py).call1((self.agent.bind(py), turn, step, failure, exc))?;
                }
                Step::Input(Input::Continue)
            }
            Effect::NewTurn => {
                let signal = c.signal.bind(py).call0()?;
                self.core(py).get().set_signal(signal.unbind());
                Step::Input(Input::Continue)
            }
            Effect::NoTurn | Effect::Finished => Step::Finished,
        })
    }

    /// An await finished with `outcome`.
    fn settled<'py>(&mut self, py: Python<'py>, pending: Pending, outcome: PyResult<Bound<'py, PyAny>>) -> Step<'py> {
        match pending {
            Pending::User(seam) => self.user_finish(py, seam, outcome),
            Pending::Absorb { seam, result } => self.absorb_finish(py, seam, outcome, result),
            Pending::Flush => match outcome {
                Ok(_) => Step::Input(Input::Continue),
                Err(e) => Step::Input(self.raised(py, e)),
            },
            // Whatever closing the stream gave, the fault it was closed for goes on.
            Pending::CloseStream => Step::Input(Input::Continue),
            Pending::Tools => self.tools_done(py, outcome),
            Pending::ToolFlush => self.lone_flushed(py, outcome),
            Pending::Tool => self.lone_resumed(py, outcome),
            Pending::ToolAbsorb => self.lone_absorbed(py, outcome),
        }
    }

    /// Drives until the run suspends (`Ok(yielded)`) or finishes (`Err`: `StopIteration` on
    /// return, else the exception); the bool says whether it finished.
    fn drive<'py>(&mut self, py: Python<'py>, mut step: Step<'py>) -> (bool, PyResult<Py<PyAny>>) {
        loop {
            step = match step {
                Step::Input(input) => self.advance(py, input),
                Step::Await(iter, pending) => match send_into(&iter, &py.None().into_bound(py)) {
                    Sent::Next(y) => {
                        self.inner = Some((iter.unbind(), pending));
                        return (false, Ok(y.unbind()));
                    }
                    Sent::Return(r) => self.settled(py, pending, Ok(r)),
                    Sent::Error(e) => self.settled(py, pending, Err(e)),
                },
                Step::Finished => return (true, self.finish(py)),
            };
        }
    }

    fn run<'py>(&mut self, py: Python<'py>, input: Resume<'py>) -> (bool, PyResult<Py<PyAny>>) {
        let step = match (self.inner.take(), input) {
            (Some((iter, pending)), Resume::Send(value)) => {
                let iter = iter.into_bound(py);
                match send_into(&iter, &value) {
                    Sent::Next(y) => {
                        self.inner = Some((iter.unbind(), pending));
                        return (false, Ok(y.unbind()));
                    }
                    Sent::Return(r) => self.settled(py, pending, Ok(r)),
                    Sent::Error(e) => self.settled(py, pending, Err(e)),
                }
            }
            (Some((iter, pending)), Resume::Throw(exc)) => {
                let iter = iter.into_bound(py);
                match throw_into(&iter, exc) {
                    Sent::Next(y) => {
                        self.inner = Some((iter.unbind(), pending));
                        return (false, Ok(y.unbind()));
                    }
                    Sent::Return(r) => self.settled(py, pending, Ok(r)),
                    Sent::Error(e) => self.settled(py, pending, Err(e)),
                }
            }
            (None, Resume::Send(value)) => {
                if self.started {
                    return (true, Err(PySystemError::new_err("the driver lost its awaited object")));
                }
                if !value.is_none() {
                    return (false, Err(PyTypeError::new_err("can't send non-None value to a just-started coroutine")));
                }
                self.started = true;
                match self.first.take() {
                    // A held step taken up again starts where it stopped.
                    Some(effect) => self.perform(py, effect),
                    None => Step::Input(Input::Continue),
                }
            }
            (Some((iter, pending)), Resume::Close) => {
                let exc = close_delegate(&iter.into_bound(py));
                self.settled(py, pending, Err(exc))
            }
            // Closed before the first step: nothing ran, nothing to unwind.
            (None, Resume::Close) => return (true, Err(PyGeneratorExit::new_err(()))),
            // Thrown before the first step (the Task was cancelled before it ran): the
            // exception lands at the top of the turn, which still ends and reports.
            (None, Resume::Throw(exc)) => {
                self.started = true;
                Step::Input(self.raised(py, exc))
            }
        };
        self.drive(py, step)
    }

    /// The run's `finally`: the façade learns the driver is done; then an outside
    /// cancellation or a fatal error propagates.
    fn finish(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.lone = None;
        self.tool_run = None;
        let propagating = if self.machine.propagates() { self.propagating.take() } else { None };
        self.parts.finished.bind(py).call1((self.agent.bind(py),))?;
        match propagating.map(|e| PyErr::from_value(e.into_bound(py).into_any())) {
            Some(e) if e.is_instance_of::<PyStopIteration>(py) => {
                let wrapped = PyRuntimeError::new_err("coroutine raised StopIteration");
                wrapped.set_cause(py, Some(e));
                Err(wrapped)
            }
            Some(e) => Err(e),
            None => Err(PyStopIteration::new_err(())),
        }
    }
}

enum State {
    Ready(Box<Run>),
    /// Inside `send`/`throw`/`close`: the run is on the Rust stack.
    Running,
    Done,
}

/// The AgentLoop's turn driver: a coroutine object (``send``/``throw``/``close``/``__await__``)
/// run as the loop's Task. ``LoopCore.begin(loop, signal)`` makes one for a turn whose
/// ``turn/start`` and first claim it committed.
#[pyclass(name = "Driver", module = "kerman", weakref)]
pub struct PyDriver {
    state: State,
}

impl PyDriver {
    /// Starts a turn (synchronously: `turn/start`, the first claim); `None` when no turn was
    /// recorded (the failure, if any, is reported).
    pub(super) fn begin(core: &Bound<'_, PyLoopCore>, agent: &Bound<'_, PyAny>) -> PyResult<Option<PyDriver>> {
        let py = core.py();
        let parts = core.get().parts()?;
        if decisions::held(&parts.log.get().inner).is_some() {
            return Self::resume_held(core, agent, &parts, Machine::resume_held);
        }
        if crate::agent_loop::budget_decisions::resolved(&parts.log.get().inner).is_some() {
            return Self::resume_held(core, agent, &parts, Machine::resume_budget);
        }
        if crate::agent_loop::in_doubt::crashed_step(&parts.log.get().inner).is_some() {
            return Self::resume_held(core, agent, &parts, Machine::resume_in_doubt);
        }
        // An interrupted turn whose input is unanswered: a continuation answers it first.
        let limit = core.get().shared.state().continue_crashes;
        if crate::agent_loop::continuation::next_of(&parts.log.get().inner, limit).is_some() {
            return Self::resume_held(core, agent, &parts, Machine::continue_interrupted);
        }
        let (machine, mut effect) = {
            // The first claim and `turn/start` plan no tools.
            Machine::begin(&parts.ctx(core.get(), &|_| None))
        };
        let mut run = Box::new(Run {
            agent: agent.clone().unbind(),
            core: core.clone().unbind(),
            parts,
            machine,
            started: false,
            inner: None,
            entered: None,
            request: None,
            stream: None,
            lone: None,
            tool_run: None,
            failed_attempts: Vec::new(),
            last_exc: None,
            propagating: None,
            task: std::sync::OnceLock::new(),
            first: None,
        });
        // A turn that could not start reports why, synchronously (no await is involved).
        while let Some(e) = effect.take() {
            match e {
                Effect::NoTurn | Effect::Finished => return Ok(None),
                e => match run.perform(py, e) {
                    Step::Input(input) => effect = Some(run.with_ctx(py, |machine, ctx| machine.resume(ctx, input))),
                    Step::Await(..) | Step::Finished => return Ok(None),
                },
            }
        }
        Ok(Some(PyDriver { state: State::Ready(run) }))
    }

    /// The last turn's step stopped at its decisions, or crashed with calls in doubt, or the
    /// last turn was interrupted with its input unanswered: a driver that takes it up again
    /// (`resume`: `Machine::resume_held`, `None` while a decision is pending,
    /// `Machine::resume_in_doubt`, or `Machine::continue_interrupted`).
    fn resume_held(
        core: &Bound<'_, PyLoopCore>,
        agent: &Bound<'_, PyAny>,
        parts: &Arc<super::Parts>,
        resume: fn(&crate::agent_loop::Ctx<'_>) -> Option<(Machine, Effect)>,
    ) -> PyResult<Option<PyDriver>> {
        let py = core.py();
        let tools = parts.tools.bind(py);
        let lookup = |name: &str| super::run::tool_lookup(tools, name);
        let Some((machine, effect)) = resume(&parts.ctx(core.get(), &lookup)) else { return Ok(None) };
        let run = Box::new(Run {
            agent: agent.clone().unbind(),
            core: core.clone().unbind(),
            parts: Arc::clone(parts),
            machine,
            started: false,
            inner: None,
            entered: None,
            request: None,
            stream: None,
            lone: None,
            tool_run: None,
            failed_attempts: Vec::new(),
            last_exc: None,
            propagating: None,
            task: std::sync::OnceLock::new(),
            first: Some(effect),
        });
        Ok(Some(PyDriver { state: State::Ready(run) }))
    }

    fn take(slf: &Bound<'_, Self>) -> PyResult<Result<Box<Run>, bool>> {
        let mut this = slf.try_borrow_mut()?;
        Ok(match std::mem::replace(&mut this.state, State::Running) {
            State::Ready(run) => Ok(run),
            State::Running => Err(true),
            State::Done => {
                this.state = State::Done;
                Err(false)
            }
        })
    }

    fn put(slf: &Bound<'_, Self>, run: Box<Run>, done: bool) -> PyResult<()> {
        let finished = {
            let mut this = slf.try_borrow_mut()?;
            if done {
                this.state = State::Done;
                Some(run)
            } else {
                this.state = State::Ready(run);
                None
            }
        };
        // Dropping the references may run finalizers: not while the object is borrowed.
        drop(finished);
        Ok(())
    }
}

impl Coroutine for PyDriver {
    /// Closed (or thrown into) while suspended, the turn ends and the loop goes idle.
    fn resume(slf: &Bound<'_, Self>, input: Resume<'_>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let mut run = match Self::take(slf)? {
            Ok(run) => run,
            Err(true) => return Err(PyValueError::new_err("coroutine already executing")),
            Err(false) => {
                return Err(match input {
                    Resume::Send(_) => PyRuntimeError::new_err("cannot reuse already awaited coroutine"),
                    Resume::Throw(exc) => exc,
                    Resume::Close => PyGeneratorExit::new_err(()),
                })
            }
        };
        let (done, out) = run.run(py, input);
        Self::put(slf, run, done)?;
        out
    }
}

coroutine_methods!(awaitable PyDriver {
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
            State::Ready(run) => run.visit(&visit),
            _ => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        if let State::Ready(_) = self.state {
            self.state = State::Done;
        }
    }
});
