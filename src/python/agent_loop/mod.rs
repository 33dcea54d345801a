//! The binding of `crate::agent_loop`: the `LoopCore` an `AgentLoop` holds (the loop's state,
//! read through typed accessors), and the `Driver` that runs a turn machine as the loop's
//! asyncio Task, turning its effects into awaits (`driver.rs`). The driver, the seams
//! (`seams.rs`, and `gate.rs` for `before_tool`) and the tool runs (`tools.rs`) each work on the
//! run's state (`run.rs`) and none uses another.
//!
//! The native side imports Python only for values: the payload and decision classes, the
//! `Signal` class, exception classes, and `asyncio`'s own functions. Everything the loop does in
//! Python (reporting, dispatching hooks, the executor of a tool plan) is handed to `LoopCore`
//! by the `AgentLoop` façade as plain callables.

mod context;
pub(super) mod decide;
mod delegate;
mod driver;
mod gate;
mod read;
mod run;
mod seams;
mod tool_call;
mod tools;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyType};
use pyo3::{PyTraverseError, PyVisit};

use super::convert::to_value;
use super::errors::new_err;
use super::event_log::PySessionLog;
use super::inbox::PyInbox;
use super::message::wrap;
use crate::agent_loop::budget::{Budget, Per};
use crate::agent_loop::{decisions, events, requeue_claimed, AbortCause, Ctx, RequeueError, Shared};

pub use driver::PyDriver;

/// The Python classes and functions the binding uses as values, looked up once.
pub(crate) struct Classes {
    pub signal: Py<PyAny>,
    pub pre_step: Py<PyAny>,
    pub turn_stopping: Py<PyAny>,
    pub enter: Py<PyAny>,
    pub reject: Py<PyAny>,
    pub model_request: Py<PyAny>,
    pub model_reply: Py<PyAny>,
    pub request_failure: Py<PyAny>,
    pub retry: Py<PyAny>,
    pub tool_context: Py<PyAny>,
    pub tool: Py<PyAny>,
    pub tool_result: Py<PyAny>,
    pub model_error: Py<PyAny>,
    pub invalid_tool_arguments: Py<PyAny>,
    pub lease_lost: Py<PyAny>,
    /// `kerman.decisions`' verdicts.
    pub approve: Py<PyAny>,
    pub deny: Py<PyAny>,
    pub edit: Py<PyAny>,
    pub ask: Py<PyAny>,
    /// `kerman.decisions.InputRequired`: a tool body's "ask a person first".
    pub input_required: Py<PyAny>,
    pub user_message: Py<PyAny>,
    pub json_dumps: Py<PyAny>,
    pub json_decoder: Py<PyAny>,
    pub canonical: Py<PyDict>,
    pub sleep: Py<PyAny>,
    pub current_task: Py<PyAny>,
    pub is_awaitable: Py<PyAny>,
    /// `types.CoroutineType` and `types.GeneratorType`, for exact type checks.
    pub coroutine_type: Py<PyAny>,
    pub generator_type: Py<PyAny>,
    pub cancelled_error: Py<PyType>,
    pub recursion_limit: Py<PyAny>,
    /// `Task.cancelling()` exists (Python 3.11+).
    pub cancelling: bool,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

pub(crate) fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let types = py.import("kerman.types")?;
        let errors = py.import("kerman.errors")?;
        let core = py.import("kerman._core")?;
        let asyncio = py.import("asyncio")?;
        let decisions = py.import("kerman.decisions")?;
        let get = |m: &Bound<'_, PyModule>, name: &str| m.getattr(name).map(Bound::unbind);
        Ok(Classes {
            signal: get(&types, "Signal")?,
            pre_step: get(&types, "PreStep")?,
            turn_stopping: get(&types, "TurnStopping")?,
            enter: get(&types, "Enter")?,
            reject: get(&types, "Reject")?,
            model_request: get(&types, "ModelRequest")?,
            model_reply: get(&types, "ModelReply")?,
            request_failure: get(&types, "RequestFailure")?,
            retry: get(&types, "Retry")?,
            tool_context: get(&types, "ToolContext")?,
            tool: get(&types, "Tool")?,
            tool_result: get(&types, "ToolResult")?,
            model_error: get(&errors, "ModelError")?,
            invalid_tool_arguments: get(&errors, "InvalidToolArgumentsError")?,
            lease_lost: get(&errors, "LeaseLostError")?,
            approve: get(&decisions, "Approve")?,
            deny: get(&decisions, "Deny")?,
            edit: get(&decisions, "Edit")?,
            ask: get(&decisions, "Ask")?,
            input_required: get(&decisions, "InputRequired")?,
            user_message: get(&core, "UserMessage")?,
            json_dumps: get(&py.import("json")?, "dumps")?,
            json_decoder: read::arguments_decoder(py)?.unbind(),
            canonical: {
                // `json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)`
                let kwargs = PyDict::new(py);
                kwargs.set_item("sort_keys", true)?;
                kwargs.set_item("separators", (",", ":"))?;
                kwargs.set_item("allow_nan", false)?;
                kwargs.unbind()
            },
            sleep: get(&asyncio, "sleep")?,
            current_task: get(&asyncio, "current_task")?,
            is_awaitable: get(&py.import("inspect")?, "isawaitable")?,
            coroutine_type: get(&py.import("types")?, "CoroutineType")?,
            generator_type: get(&py.import("types")?, "GeneratorType")?,
            cancelled_error: asyncio.getattr("CancelledError")?.cast_into::<PyType>()?.unbind(),
            recursion_limit: get(&py.import("sys")?, "getrecursionlimit")?,
            cancelling: py.version_info() >= (3, 11),
        })
    })
}

/// What the façade hands the core: the loop's registries (the very lists and dict it keeps,
/// so registration needs no call here) and the Python side of what the loop does.
pub(crate) struct Parts {
    pub log: Py<PySessionLog>,
    pub inbox: Py<PyInbox>,
    pub model: Py<PyAny>,
    pub tools: Py<PyDict>,
    pub pre_step: Py<PyList>,
    pub before_request: Py<PyList>,
    pub request_error: Py<PyList>,
    pub turn_stopping: Py<PyList>,
    pub before_tool: Py<PyList>,
    pub options: Py<PyDict>,
    pub max_parallel: usize,
    /// `describe(exc, function, typed) -> dict`: an exception's report fields.
    pub describe: Py<PyAny>,
    /// `report_turn(loop, turn, step, failure, exc)`: a failed turn.
    pub report_turn: Py<PyAny>,
    /// `report_tool(loop, turn, step, failure, exc)`: a tool that raised.
    pub report_tool: Py<PyAny>,
    /// `finished(loop)`: the driver is done (the loop goes idle).
    pub finished: Py<PyAny>,
    /// `abort(signal, cause)`: the host signal aborts.
    pub abort: Py<PyAny>,
    /// `serial(listeners, payload)`: the `turn_stopping` dispatch.
    pub serial: Py<PyAny>,
    /// `run_tools(run)`: the executor of a plan of several calls.
    pub run_tools: Py<PyAny>,
    /// `default_gate(call)`: the end of the `before_tool` waterfall (`Approve`, or `Ask` for a
    /// tool that needs approval).
    pub default_gate: Py<PyAny>,
}

impl Parts {
    /// The machine's context over these parts and `core`'s shared state; `tools` says whether a
    /// tool is registered (and runs alone).
    pub fn ctx<'a>(&'a self, core: &'a PyLoopCore, tools: &'a dyn Fn(&str) -> Option<crate::agent_loop::ToolInfo>) -> Ctx<'a> {
        Ctx {
            log: &self.log.get().inner,
            inbox: &self.inbox.get().inner,
            shared: &core.shared,
            tools,
            max_parallel: self.max_parallel,
            gated: core.gated.load(Ordering::Relaxed),
        }
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.log)?;
        visit.call(&self.inbox)?;
        visit.call(&self.model)?;
        visit.call(&self.tools)?;
        for list in [&self.pre_step, &self.before_request, &self.request_error, &self.turn_stopping, &self.before_tool] {
            visit.call(list)?;
        }
        visit.call(&self.options)?;
        for hook in [
            &self.describe, &self.report_turn, &self.report_tool, &self.finished, &self.abort, &self.serial, &self.run_tools,
            &self.default_gate,
        ] {
            visit.call(hook)?;
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The loop's native state: the core's `Shared` (turn, step, abort cause, wake latch, history)
/// and the Python objects a run needs. Held by `AgentLoop` as `_core`.
#[pyclass(name = "LoopCore", module = "kerman._core", frozen)]
pub struct PyLoopCore {
    pub(crate) shared: Arc<Shared>,
    parts: Mutex<Option<Arc<Parts>>>,
    /// The running turn's signal.
    signal: Mutex<Option<Py<PyAny>>>,
    /// The `LeaseLostError` that fenced the loop out of its session.
    fenced: Mutex<Option<Py<PyAny>>>,
    /// The driver awaits user code (so `cancel()` throws into its task)...
    in_user: AtomicBool,
    /// ... and `cancel()` threw, so the driver absorbs that cancellation.
    thrown: AtomicBool,
    /// A `before_tool` gate is registered or a tool needs approval: calls are gated.
    gated: AtomicBool,
    /// Python objects of the history's messages, wrapped once each (aligned with the core's),
    /// in a list of its own that is never handed out: a request gets a slice of it, which
    /// Python copies in one step.
    history: Mutex<Option<(u64, Py<PyList>)>>,
}

impl PyLoopCore {
    pub(crate) fn parts(&self) -> PyResult<Arc<Parts>> {
        lock(&self.parts).clone().ok_or_else(|| PyValueError::new_err("this AgentLoop was cleared"))
    }

    pub(crate) fn signal_obj(&self, py: Python<'_>) -> Py<PyAny> {
        lock(&self.signal).as_ref().map_or_else(|| py.None(), |s| s.clone_ref(py))
    }

    pub(crate) fn set_signal(&self, signal: Py<PyAny>) {
        let old = lock(&self.signal).replace(signal);
        drop(old);
    }

    pub(crate) fn set_in_user(&self, on: bool) {
        self.in_user.store(on, Ordering::Relaxed);
    }

    pub(crate) fn thrown(&self) -> bool {
        self.thrown.load(Ordering::Relaxed)
    }

    pub(crate) fn clear_thrown(&self) {
        self.thrown.store(false, Ordering::Relaxed);
    }

    pub(crate) fn is_fenced(&self) -> bool {
        lock(&self.fenced).is_some()
    }

    pub(crate) fn set_fenced(&self, exc: Py<PyAny>) {
        let old = lock(&self.fenced).replace(exc);
        drop(old);
    }

    /// The history's messages as a new list, wrapping the ones not wrapped yet; a message that
    /// is one of `known` (the step's entered objects) is that object.
    pub(crate) fn history_list<'py>(&self, py: Python<'py>, known: Option<&Bound<'py, PyList>>) -> PyResult<Bound<'py, PyList>> {
        let cache = lock(&self.history).as_ref().map(|(generation, list)| (*generation, list.clone_ref(py)));
        let generation = self.shared.history.generation();
        let cache = match cache {
            // A compaction or a rollback since the cache was filled reshaped the history: start over.
            Some((had, list)) if had == generation => list.into_bound(py),
            _ => {
                let list = PyList::empty(py);
                *lock(&self.history) = Some((generation, list.clone().unbind()));
                list
            }
        };
        let (now, messages) = self.shared.history.since_generation(cache.len());
        if now != generation {
            // Compacted meanwhile (another thread's append): read it afresh.
            *lock(&self.history) = None;
            return self.history_list(py, known);
        }
        for message in messages {
            let same = known.and_then(|known| {
                known.iter().find(|obj| obj.cast::<super::message::PyMessage>().is_ok_and(|m| Arc::ptr_eq(&m.get().inner, &message)))
            });
            match same {
                Some(obj) => cache.append(obj)?,
                None => cache.append(wrap(py, message)?)?,
            }
        }
        Ok(cache.get_slice(0, cache.len()))
    }
}

#[pymethods]
impl PyLoopCore {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (log, inbox, model, tools, pre_step, before_request, request_error, turn_stopping, options, max_parallel, *, describe, report_turn, report_tool, finished, abort, serial, run_tools, before_tool, default_gate))]
    fn new(
        log: Bound<'_, PySessionLog>,
        inbox: Bound<'_, PyInbox>,
        model: Py<PyAny>,
        tools: Py<PyDict>,
        pre_step: Py<PyList>,
        before_request: Py<PyList>,
        request_error: Py<PyList>,
        turn_stopping: Py<PyList>,
        options: Py<PyDict>,
        max_parallel: usize,
        describe: Py<PyAny>,
        report_turn: Py<PyAny>,
        report_tool: Py<PyAny>,
        finished: Py<PyAny>,
        abort: Py<PyAny>,
        serial: Py<PyAny>,
        run_tools: Py<PyAny>,
        before_tool: Py<PyList>,
        default_gate: Py<PyAny>,
    ) -> PyResult<Self> {
        classes(log.py())?;
        let shared = Arc::new(Shared::resume(&log.get().inner));
        let parts = Parts {
            log: log.unbind(),
            inbox: inbox.unbind(),
            model,
            tools,
            pre_step,
            before_request,
            request_error,
            turn_stopping,
            options,
            max_parallel: max_parallel.max(1),
            describe,
            report_turn,
            report_tool,
            finished,
            abort,
            serial,
            run_tools,
            before_tool,
            default_gate,
        };
        Ok(PyLoopCore {
            shared,
            parts: Mutex::new(Some(Arc::new(parts))),
            signal: Mutex::new(None),
            fenced: Mutex::new(None),
            in_user: AtomicBool::new(false),
            thrown: AtomicBool::new(false),
            gated: AtomicBool::new(false),
            history: Mutex::new(None),
        })
    }

    /// The last turn started (0 before the first).
    #[getter]
    fn turn(&self) -> u64 {
        self.shared.state().turn
    }

    /// The configured instructions each request starts with (`None`: none). A resumed loop
    /// starts with the ones its session last recorded.
    #[getter]
    fn instructions(&self) -> Option<String> {
        self.shared.state().instructions.clone()
    }

    #[setter]
    fn set_instructions(&self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let text = match value {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => match v.cast::<PyString>() {
                Ok(text) => Some(text.to_str()?.to_owned()),
                Err(_) => return Err(PyTypeError::new_err(format!("instructions must be a str or None, got {}", v.get_type().name()?))),
            },
        };
        self.shared.state().instructions = text;
        Ok(())
    }

    /// The last step entered in the running turn.
    #[getter]
    fn step(&self) -> u64 {
        self.shared.state().step
    }

    /// The running turn's signal.
    #[getter]
    fn signal(&self, py: Python<'_>) -> Py<PyAny> {
        self.signal_obj(py)
    }

    /// Whether the running turn was aborted.
    #[getter]
    fn aborted(&self) -> bool {
        self.shared.state().abort.is_some()
    }

    /// The `LeaseLostError` that fenced this loop out of its session, or `None`.
    #[getter]
    fn fenced(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.fenced).as_ref().map(|e| e.clone_ref(py))
    }

    /// Whether the driver is awaiting user code.
    #[getter]
    fn in_user(&self) -> bool {
        self.in_user.load(Ordering::Relaxed)
    }

    /// Whether `cancel()` threw into the driver and the driver has not absorbed it yet.
    #[getter(thrown)]
    fn thrown_flag(&self) -> bool {
        self.thrown()
    }

    /// Aborts the running turn with `cause` (first cause wins); true if this call aborted it.
    fn abort(&self, cause: &Bound<'_, PyAny>) -> PyResult<bool> {
        let cause = to_value(cause, "cause").map_err(|e| PyValueError::new_err(e.describe()))?;
        let cause = AbortCause::from_value(cause).map_err(PyValueError::new_err)?;
        Ok(self.shared.state().abort(cause))
    }

    /// For `cancel()`: true when the driver awaits user code and no cancellation was thrown
    /// into it yet; the caller then cancels the driver's task (and this marks it thrown).
    fn should_throw(&self) -> bool {
        if self.in_user.load(Ordering::Relaxed) && !self.thrown() {
            self.thrown.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// A waking input while a turn runs: latched when the turn is being cancelled (not
    /// disposed) and the input went to next-turn because of that.
    fn latch_wake(&self, after_abort: bool) {
        self.shared.state().latch_wake(after_abort);
    }

    /// Takes the wake latch (the loop is going idle: a latched wake starts the next turn).
    fn take_latch(&self) -> bool {
        std::mem::take(&mut self.shared.state().wake_latched)
    }

    fn clear_latch(&self) {
        self.shared.state().wake_latched = false;
    }

    /// A run is about to start: `signal` is the new turn's, nothing is aborted or latched,
    /// no step entered. (Before the loop says it is running, so a listener of that can cancel.)
    fn prepare(&self, signal: Py<PyAny>) {
        self.shared.state().reset_run();
        self.set_signal(signal);
        self.clear_thrown();
    }

    /// Starts a turn for `loop` (`turn/start`, the first claim) and returns the driver that
    /// runs it, or `None` when no turn was recorded (the signal had aborted, or `turn/start`
    /// was refused).
    fn begin(slf: &Bound<'_, Self>, r#loop: &Bound<'_, PyAny>) -> PyResult<Option<PyDriver>> {
        PyDriver::begin(slf, r#loop)
    }

    /// Sets the loop's budget (`per`: `"turn"` or `"session"`), or removes it (no limit given);
    /// `ask`: a stop before a model request asks a person (`budget_decisions`).
    #[pyo3(signature = (tokens=None, requests=None, tool_calls=None, usd=None, per="session", ask=false))]
    fn set_budget(
        &self,
        tokens: Option<u64>,
        requests: Option<u64>,
        tool_calls: Option<u64>,
        usd: Option<f64>,
        per: &str,
        ask: bool,
    ) -> PyResult<()> {
        let per = match per {
            "turn" => Per::Turn,
            "session" => Per::Session,
            other => return Err(PyValueError::new_err(format!("per must be 'turn' or 'session', got {other:?}"))),
        };
        let any = tokens.is_some() || requests.is_some() || tool_calls.is_some() || usd.is_some();
        self.shared.budget.set(any.then_some(Budget { tokens, requests, tool_calls, usd, per }));
        self.shared.budget.set_ask(ask);
        Ok(())
    }

    /// What the log shows spent: `{"turn": n, "thisTurn": {...}, "session": {...}}` (the
    /// budget's fold, caught up with the log).
    fn spent<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let log = &self.parts()?.log;
        let fold = self.shared.budget.usage(&log.get().inner);
        let value = serde_json::json!({"turn": fold.turn, "thisTurn": fold.this_turn.to_value(), "session": fold.session.to_value()});
        super::convert::to_py(py, &value)
    }

    /// Whether every tool call is gated before it runs (the façade sets it when a
    /// `before_tool` gate or a tool that needs approval is registered).
    #[getter]
    fn gated(&self) -> bool {
        self.gated.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_gated(&self, on: bool) {
        self.gated.store(on, Ordering::Relaxed);
    }

    /// The requests waiting for a decision, as dicts (oldest first).
    fn decisions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let parts = self.parts()?;
        decide::request_list(py, &decisions::pending_with(&parts.log.get().inner, &self.shared.foreign))
    }

    /// Whether the last turn waits for decisions: its own, not another framework's (those are
    /// listed by `decisions` but hold no turn of this loop).
    #[getter]
    fn waiting(&self) -> PyResult<bool> {
        Ok(!decisions::own_pending(&self.parts()?.log.get().inner).is_empty())
    }

    /// Whether the last turn's step stopped at decisions and a resume has something to do (they
    /// are all resolved now, or a call that needs none lacks its result), or crashed with calls
    /// in doubt a resume settles, or the last turn was interrupted with its input unanswered and
    /// a continuation is due: the next run resumes it.
    #[getter]
    fn resumable(&self) -> PyResult<bool> {
        let parts = self.parts()?;
        let log = &parts.log.get().inner;
        let limit = self.shared.state().continue_crashes;
        Ok(decisions::held(log).is_some_and(|h| h.actionable(&log.with_events(crate::agent_loop::call_decisions::requests)))
            || crate::agent_loop::budget_decisions::resolved(log).is_some()
            || crate::agent_loop::in_doubt::crashed_step(log).is_some()
            || crate::agent_loop::continuation::next_of(log, limit).is_some())
    }

    /// A run begins with a continuation of an interrupted turn whose input is unanswered while
    /// fewer than this many crashed turns in a row left it so (0: never, `resume="close"`).
    #[getter]
    fn continue_crashes(&self) -> u32 {
        self.shared.state().continue_crashes
    }

    #[setter]
    fn set_continue_crashes(&self, limit: u32) {
        self.shared.state().continue_crashes = limit;
    }

    /// The continuation the log calls for, whatever the limit: `(interrupted turn, crashed
    /// turns in its chain)`, or `None`.
    #[getter]
    fn continuation(&self) -> PyResult<Option<(u64, u32)>> {
        let parts = self.parts()?;
        Ok(parts.log.get().inner.with_events(crate::agent_loop::continuation::due).map(|c| (c.turn, c.crashes)))
    }

    /// The earliest deadline of a pending request (epoch ms).
    #[getter]
    fn next_expiry(&self) -> PyResult<Option<i64>> {
        Ok(decisions::next_expiry_with(&self.parts()?.log.get().inner, &self.shared.foreign))
    }

    /// Applies `outcome` (`Approve`, `Deny`, `Edit`, `Answer`) to request `decision_id` at
    /// `now` (epoch ms); `(duplicate, ready)`. Raises `DecisionError` naming why it is refused.
    #[pyo3(signature = (decision_id, outcome, by=None, key=None, now=None))]
    #[allow(clippy::needless_pass_by_value, reason = "pyo3 extracts the optional strings as owned values")]
    fn decide(
        &self,
        py: Python<'_>,
        decision_id: &str,
        outcome: &Bound<'_, PyAny>,
        by: Option<String>,
        key: Option<String>,
        now: Option<i64>,
    ) -> PyResult<(bool, bool)> {
        let decision = decide::decision(outcome)?;
        let parts = self.parts()?;
        let now = now.unwrap_or_else(crate::event_log::now_ms);
        decide::check_answer(py, &parts.log.get().inner, decision_id, &decision, now)?;
        let decided = decisions::decide(&parts.log.get().inner, decision_id, decision, by.as_deref(), key.as_deref(), now)
            .map_err(|e| decide::decide_err(py, e))?;
        Ok((decided.duplicate, decided.ready))
    }

    /// Records `text` as the one result of call `call_id` in doubt (an error result when
    /// `is_error`); runs nothing. Returns the result's seq; `ValueError` for a call not in doubt.
    #[pyo3(signature = (call_id, text, is_error=false))]
    fn resolve(&self, py: Python<'_>, call_id: &str, text: &str, is_error: bool) -> PyResult<u64> {
        let parts = self.parts()?;
        crate::agent_loop::in_doubt::resolve(&parts.log.get().inner, call_id, text, is_error).map_err(|e| resolve_err(py, e))
    }

    /// The calls in doubt of the last turn: `[(call_id, name, seq, policy)]`.
    fn in_doubt(&self) -> PyResult<Vec<(String, String, u64, &'static str)>> {
        let parts = self.parts()?;
        Ok(parts
            .log
            .get()
            .inner
            .with_events(crate::agent_loop::in_doubt::list)
            .into_iter()
            .map(|(id, name, seq, p)| (id, name, seq, p.as_str()))
            .collect())
    }

    /// Resolves the pending requests due at `now` (epoch ms) as `expired`; how many.
    #[pyo3(signature = (now=None))]
    fn expire(&self, py: Python<'_>, now: Option<i64>) -> PyResult<usize> {
        let parts = self.parts()?;
        decisions::expire_with(&parts.log.get().inner, &self.shared.foreign, now.unwrap_or_else(crate::event_log::now_ms))
            .map_err(|e| super::errors::log_err(py, e))
    }

    /// Resolves every pending request as `cancelled`; how many.
    fn cancel_decisions(&self, py: Python<'_>) -> PyResult<usize> {
        let parts = self.parts()?;
        decisions::cancel_pending(&parts.log.get().inner).map_err(|e| super::errors::log_err(py, e))
    }

    /// Logs `output/validated {turn, step, output}` (the structured output of turn `turn`,
    /// validated in Python by its output type); its seq. `output` must be lossless JSON.
    fn record_output(&self, py: Python<'_>, turn: u64, step: u64, output: &Bound<'_, PyAny>) -> PyResult<u64> {
        let parts = self.parts()?;
        let value = to_value(output, "output").map_err(|e| super::errors::not_json(py, events::OUTPUT_VALIDATED, e.describe()))?;
        let text = value.to_string();
        events::append(&parts.log.get().inner, events::output_validated(turn, step, &text)).map_err(|e| super::errors::log_err(py, e))
    }

    /// Logs `tool/progress {turn, step, callId, progress[, total][, message][, task]}` for the
    /// running call `call_id` (its tool reported progress; `task`: the server-side task the
    /// call became); its seq. Which updates to log is the caller's choice (`kerman.mcp`
    /// coalesces them).
    #[pyo3(signature = (turn, step, call_id, progress, total=None, message=None, task=None))]
    #[allow(clippy::too_many_arguments)]
    fn record_progress(
        &self,
        py: Python<'_>,
        turn: u64,
        step: u64,
        call_id: &str,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
        task: Option<&str>,
    ) -> PyResult<u64> {
        use crate::agent_loop::progress::{self, ProgressError, Update};
        let parts = self.parts()?;
        let update = Update { progress, total, message, task };
        progress::append(&parts.log.get().inner, turn, step, call_id, &update).map_err(|e| match e {
            ProgressError::Invalid(text) => PyValueError::new_err(text),
            ProgressError::Log(e) => super::errors::log_err(py, e),
        })
    }

    /// SPEC D9: re-inserts what finished turn `turn` claimed but never entered.
    fn requeue_claimed<'py>(&self, py: Python<'py>, turn: u64) -> PyResult<Bound<'py, PyList>> {
        let parts = self.parts()?;
        let inbox = parts.inbox.bind(py);
        let requeued = requeue_claimed(&inbox.get().inner, turn).map_err(|e| match e {
            RequeueError::Inbox(e) => super::errors::inbox_err(py, e),
            other => new_err(py, "LoopError", (other.to_string(),)),
        })?;
        inbox.get().pending_objects(py, &requeued)
    }

    /// The history's messages (user, assistant and tool results, in log order, compactions
    /// applied), caught up with the log.
    fn history<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let parts = self.parts()?;
        let log = &parts.log.get().inner;
        self.shared.history.catch_up(log, log.len()).map_err(|e| super::errors::message_err(py, e))?;
        self.history_list(py, None)
    }

    /// The seqs each history message stands for, `(lo, hi)`, aligned with `history()`.
    fn history_spans(&self, py: Python<'_>) -> PyResult<Vec<(u64, u64)>> {
        let parts = self.parts()?;
        let log = &parts.log.get().inner;
        self.shared.history.catch_up(log, log.len()).map_err(|e| super::errors::message_err(py, e))?;
        Ok(self.shared.history.spans())
    }

    /// Appends a `context/compacted` record (its payload as JSON text) and folds it into the
    /// history; its seq. A record the core refuses appends nothing (`ValueError`).
    fn compact(&self, py: Python<'_>, data: &str) -> PyResult<u64> {
        let parts = self.parts()?;
        let log = &parts.log.get().inner;
        let seq = crate::agent_loop::compaction::append(log, data).map_err(|e| match e {
            crate::agent_loop::compaction::CompactError::Invalid(why) => PyValueError::new_err(why),
            crate::agent_loop::compaction::CompactError::Log(e) => super::errors::log_err(py, e),
        })?;
        self.shared.history.catch_up(log, seq + 1).map_err(|e| super::errors::message_err(py, e))?;
        Ok(seq)
    }

    fn __repr__(&self) -> String {
        let state = self.shared.state();
        format!("<LoopCore turn={} step={} aborted={}>", state.turn, state.step, state.abort.is_some())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(parts) = self.parts.try_lock() {
            if let Some(parts) = parts.as_ref() {
                parts.visit(&visit)?;
            }
        }
        for held in [&self.signal, &self.fenced] {
            if let Ok(obj) = held.try_lock() {
                visit.call(obj.as_ref())?;
            }
        }
        if let Ok(history) = self.history.try_lock() {
            visit.call(history.as_ref().map(|(_, list)| list))?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        let parts = lock(&self.parts).take();
        let signal = lock(&self.signal).take();
        let fenced = lock(&self.fenced).take();
        let history = lock(&self.history).take();
        drop((parts, signal, fenced, history));
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoopCore>()?;
    m.add_class::<PyDriver>()?;
    m.add_class::<tools::PyToolRun>()?;
    m.add_class::<tool_call::PyToolCall>()?;
    m.add_function(wrap_pyfunction!(decide::pending_decisions, m)?)?;
    m.add_function(wrap_pyfunction!(decide::request_foreign_decisions, m)?)?;
    m.add_function(wrap_pyfunction!(decide::decide_on_log, m)?)?;
    m.add_function(wrap_pyfunction!(decide::expire_decisions, m)?)?;
    m.add_function(wrap_pyfunction!(decide::cancel_foreign_decisions, m)?)?;
    Ok(())
}

/// The host's exception for a refused `resolve`: `ValueError` naming the call, or the log's.
pub(crate) fn resolve_err(py: Python<'_>, e: crate::agent_loop::in_doubt::ResolveError) -> PyErr {
    match e {
        crate::agent_loop::in_doubt::ResolveError::Log(e) => super::errors::log_err(py, e),
        e @ crate::agent_loop::in_doubt::ResolveError::NotInDoubt(_) => PyValueError::new_err(e.to_string()),
    }
}
