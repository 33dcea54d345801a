//! The sans-IO turn machine: `resume(input) -> effect`.
//!
//! The machine holds a driver run's turn and step state and decides everything the loop does;
//! whatever must be awaited (user code, the model, a flush) or done in the host language
//! (reporting an error with its exception, aborting the host's signal) is an [`Effect`] it
//! returns, and the result comes back as the next [`Input`]. It writes its events itself,
//! through [`events`](super::events), to the log in its [`Ctx`]: appends are synchronous and
//! in memory, and their failures are turn failures like any other.
//!
//! Where a Python coroutine would raise, the machine *unwinds*: a fault inside a step closes
//! the step (`step/end`, whose own failure wins), then the turn ends (`turn/end`) with the
//! fault's ending, and the run goes on with the next queued turn or finishes.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::assemble::{Assembler, Finish};
use super::ending::Ending;
use super::events::{self, append, LoopEvent};
use super::failure::{AbortCause, AbortKind, Failure, FailureCode};
use super::tools::{repeated_id, requested, Call, Sink, ToolPlan};
use super::{CoreError, Shared};

mod attempt;
mod budget;
mod call_decision;
mod continuation;
mod gate;
mod in_doubt;
use crate::event_log::{LogError, SessionLog};
use crate::inbox::{Inbox, Target};
use crate::message::{BlockType, Message};
pub use gate::{Ask, Gate};

/// What the machine works on besides its own state.
pub struct Ctx<'a> {
    pub log: &'a SessionLog,
    pub inbox: &'a Inbox,
    pub shared: &'a Shared,
    /// What the loop knows of the tool of that name, when one is registered.
    pub tools: &'a dyn Fn(&str) -> Option<super::ToolInfo>,
    pub max_parallel: usize,
    /// A `before_tool` gate is registered (or a tool needs approval): every call is gated
    /// before it runs (`Effect::BeforeTool`).
    pub gated: bool,
}

impl Ctx<'_> {
    pub fn sink(&self) -> Sink<'_> {
        Sink { log: self.log, inbox: self.inbox, history: &self.shared.history }
    }

    fn append(&self, event: LoopEvent) -> Result<u64, LogError> {
        append(self.log, event)
    }

    /// Appends a surface event carrying `message`, which joins the history.
    fn append_message(&self, event: LoopEvent, message: Option<Arc<Message>>) -> Result<u64, LogError> {
        let seq = self.append(event)?;
        self.shared.history.push(self.log, seq, message);
        Ok(seq)
    }

    fn aborted(&self) -> bool {
        self.shared.state().abort.is_some()
    }
}

/// The `pre_step` decision, as the host read it.
#[derive(Debug)]
pub enum Decision {
    Enter(Vec<Arc<Message>>),
    Reject(Option<String>),
    /// Neither: the host's `repr` of what the waterfall returned.
    Invalid(String),
}

/// The request `before_request` left, as the host read it.
#[derive(Debug)]
pub enum Requested {
    /// `canonical`: the options' canonical text (compared between requests to decide whether a
    /// `request/header` is due); `options`: their JSON text for the header, or why they have
    /// none (read only when the header is due: see [`LoopState::header_due`](super::LoopState::header_due)).
    /// `instructions`: what the request carries as its instructions (system prompt).
    Request { options: Result<String, LogError>, canonical: String, instructions: Option<String> },
    /// Not a request: its `repr`.
    NotARequest(String),
    /// Options that are not lossless JSON: why.
    NotJson(String),
    /// Instructions that are neither a `str` nor `None`: their type's name.
    BadInstructions(String),
}

/// A complete model reply.
#[derive(Debug)]
pub struct Reply {
    pub content: ReplyContent,
    /// The usage's JSON text.
    pub usage: Option<String>,
    pub max_tokens: bool,
}

/// What a reply holds. The two common shapes are given as what they are, so the message is
/// written as JSON text at once rather than built from maps, validated and serialised.
#[derive(Debug)]
pub enum ReplyContent {
    /// One text block.
    Text(String),
    /// Only tool-call blocks `{type, id, name, arguments}`, each `(id, name, arguments)`.
    Calls(Vec<(String, String, String)>),
    /// Any content blocks.
    Blocks(Vec<Value>),
}

/// How host code the machine awaited raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaisedKind {
    /// An ordinary exception.
    Error,
    /// A cancellation the loop did not cause (the driver's task was cancelled from outside).
    Cancelled,
    /// Something that is not an ordinary exception (`KeyboardInterrupt`, ...): the turn ends
    /// and it propagates.
    Fatal,
    /// The session's lease was lost: another owner took it over.
    LeaseLost,
}

/// An exception out of host code: its kind and failure (what `turn/end` would carry).
#[derive(Debug, Clone)]
pub struct Raised {
    pub kind: RaisedKind,
    /// `None` for a cancellation, and for a fault after the signal aborted (the turn ends
    /// aborted, carrying its cause instead).
    pub failure: Option<Failure>,
}

impl Raised {
    pub fn new(kind: RaisedKind, failure: Failure) -> Raised {
        Raised { kind, failure: Some(failure) }
    }

    /// An exception with no failure to carry (see [`failure`](Self::failure)).
    pub fn bare(kind: RaisedKind) -> Raised {
        Raised { kind, failure: None }
    }
}

#[derive(Debug)]
pub enum Input {
    /// The driver starts (or an effect that needs no answer is done).
    Continue,
    Decided(Decision),
    Requested(Requested),
    Reply(Reply),
    /// The model returned something that is not a reply: its `repr`.
    NotAReply(String),
    /// The model returned a stream: chunks follow.
    Streaming,
    Chunk(Map<String, Value>),
    /// The stream yielded something that is not a chunk dict: its `repr`.
    NotAChunk(String),
    StreamEnded,
    /// The model failed (a `ModelError`).
    ModelFailed(Failure),
    /// The model's answer to `CallModel` (`outcome`: a `Reply`, `ModelFailed`, `Raised`…) came
    /// after attempts of its own that failed (a non-streaming `Fallback`'s models): `failed`
    /// holds their failed `finish` chunks, logged first, each one request (`machine/attempt.rs`).
    AfterFailed {
        failed: Vec<Value>,
        outcome: Box<Input>,
    },
    /// What `request_error` decided: re-issue the request or not.
    Retry(bool),
    /// The tool plan, every call committed.
    ToolsDone(ToolPlan),
    /// What the `before_tool` gate decided for the call `BeforeTool` named.
    Gated(Gate),
    Raised(Raised),
}

#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Run the `pre_step` waterfall over this batch; answer `Decided`.
    PreStep { batch: Vec<Arc<Message>> },
    /// Build the request (`history`, `entered`) and run `before_request`; answer `Requested`.
    BeforeRequest,
    /// Await a flush of the log (the checkpoint barrier); answer `Continue`.
    Flush,
    /// Call the model; answer `Reply`, `Streaming`, `NotAReply` or `ModelFailed` (after failed
    /// attempts of the model's own: `AfterFailed`).
    CallModel,
    /// Await the stream's next chunk; answer `Chunk`, `NotAChunk`, `StreamEnded` or `ModelFailed`.
    NextChunk,
    /// Close the stream (`aclose()`), whatever that gives; answer `Continue`.
    CloseStream,
    /// Run `request_error` over this failure (`exception`: the host's last exception is
    /// behind it); answer `Retry`.
    RequestError { failure: Failure, exception: bool },
    /// Run the tool plan (`take_plan`); answer `ToolsDone`.
    RunTools,
    /// Run the `before_tool` gate for call `index` of the step; answer `Gated` (a gate that
    /// raised an ordinary exception: `Gated(Gate::Failed)`).
    BeforeTool { index: usize, call_id: String, name: String, arguments: String },
    /// The step waits for decisions (`decision/requested` appended): the run is over and the
    /// turn stays open until they are resolved. No answer.
    AwaitDecisions,
    /// Run the `turn_stopping` hooks; answer `Continue`.
    TurnStopping,
    /// Turn this core error into the host's exception; answer `Raised`.
    Describe(CoreError),
    /// Report a failed turn (`agent/error`, the logger); `exception`: with the exception the
    /// host last raised. Answer `Continue`.
    /// `failure` is `None` for a cancellation (the report carries `None`).
    Report { turn: u64, step: u64, failure: Option<Failure>, exception: bool },
    /// The turn's signal aborted with this cause (already set in the shared state). Answer
    /// `Continue`.
    Abort(AbortCause),
    /// Another owner took the session over: abort the signal with `cause` (`fenced`), and
    /// unless the loop is fenced already, mark it so and report `failure`. Answer `Continue`.
    Fence { turn: u64, failure: Failure, cause: AbortCause },
    /// A fresh signal for the next turn; answer `Continue`.
    NewTurn,
    /// No turn was recorded (`begin` only).
    NoTurn,
    /// The run is over: the loop goes idle.
    Finished,
}

/// Why the turn body stopped early.
#[derive(Debug)]
enum Fault {
    /// The signal aborted.
    Aborted,
    /// A failure with no host exception behind it, or one whose exception the host holds.
    Failure {
        failure: Failure,
        exception: bool,
    },
    Raised(Raised),
    /// A core operation failed; the host describes it first.
    Core(CoreError),
}

impl Fault {
    fn rule(code: FailureCode, message: impl Into<String>) -> Fault {
        Fault::Failure { failure: Failure::new(code, message), exception: false }
    }
}

/// Where the machine waits.
#[derive(Debug)]
enum Wait {
    Start,
    PreStep,
    BeforeRequest,
    Flush,
    Model,
    Chunk,
    CloseStream(Fault),
    RequestError(Failure, bool),
    Tools,
    Gate,
    Stopping,
    /// A described core error goes on unwinding from `Unwind`.
    Describe(Unwind),
    /// A report is done; go on from `Then`.
    Then(Then),
    Done,
}

/// Where an unwinding fault came from.
#[derive(Debug, Clone, Copy)]
enum Unwind {
    /// The turn body (a step may be open).
    Body,
    /// `turn/end` could not be appended.
    TurnEnd,
    /// `turn/start` could not be appended.
    Begin,
}

/// What follows an effect that needs no answer.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Append `turn/end`.
    TurnEnd,
    /// The run goes on with the next turn or finishes.
    Conclude,
    /// A fresh signal is in place: begin the next turn.
    Begin,
    /// Finish (after a fence).
    Finish,
    /// The signal was aborted (`disposed`): the turn ends aborted.
    EndAborted,
    /// The turn stops with nothing more appended.
    NoTurn,
}

/// One driver run: turns until one stops it.
#[derive(Debug)]
pub struct Machine {
    wait: Wait,
    turn: u64,
    claimed: Vec<Arc<Message>>,
    claim_error: Option<CoreError>,
    next_step: bool,
    /// The step the batch would enter.
    step: u64,
    step_open: bool,
    entered: Vec<Arc<Message>>,
    ending: Option<Ending>,
    max_tokens: bool,
    stop_driver: bool,
    assembler: Option<Assembler>,
    chunks: Vec<u64>,
    /// The model request in flight: a failed one is ended in the log (`attempt`).
    attempt: attempt::Attempt,
    plan: Option<ToolPlan>,
    /// The step's calls being gated, before they run.
    gating: Option<gate::Gating>,
    /// A result committed in the running step concludes the turn (a held step's results come
    /// in more than one plan).
    concludes: bool,
    /// The exception the run ends with propagates (an outside cancellation, a fatal error).
    propagate: bool,
}

impl Machine {
    /// The synchronous prefix of a turn (reference 5.5 steps 1–3): `turn/start`, then the first
    /// claim of next-turn. The effect is `Continue`-able: `Report`/`Fence` effects and then
    /// `NoTurn` when no turn was recorded; `None` effect (the turn began) otherwise. A failed
    /// claim is kept for the body to raise, so the turn still ends.
    pub fn begin(ctx: &Ctx<'_>) -> (Machine, Option<Effect>) {
        let mut machine = Machine::blank();
        let effect = machine.begin_turn(ctx);
        (machine, effect)
    }

    fn blank() -> Machine {
        Machine {
            wait: Wait::Start,
            turn: 0,
            claimed: Vec::new(),
            claim_error: None,
            next_step: false,
            step: 0,
            step_open: false,
            entered: Vec::new(),
            ending: None,
            max_tokens: false,
            stop_driver: false,
            assembler: None,
            chunks: Vec::new(),
            attempt: attempt::Attempt::default(),
            plan: None,
            gating: None,
            concludes: false,
            propagate: false,
        }
    }

    /// The turn this run is in.
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The step being decided or run.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The messages entered in the running step (what the request's `entered` holds).
    pub fn entered(&self) -> &[Arc<Message>] {
        &self.entered
    }

    /// The tool plan to run (after `RunTools`).
    pub fn take_plan(&mut self) -> Option<ToolPlan> {
        self.plan.take()
    }

    /// Whether the exception that ended the run propagates out of it: a cancellation from
    /// outside, or something that is not an ordinary exception.
    pub fn propagates(&self) -> bool {
        self.propagate
    }

    /// Whether the run is over.
    pub fn is_done(&self) -> bool {
        matches!(self.wait, Wait::Done)
    }

    fn begin_turn(&mut self, ctx: &Ctx<'_>) -> Option<Effect> {
        if ctx.aborted() {
            self.wait = Wait::Done;
            return Some(Effect::NoTurn);
        }
        let last = ctx.shared.state().turn;
        if let Err(e) = ctx.append(events::turn_start(last + 1)) {
            self.turn = last;
            self.wait = Wait::Describe(Unwind::Begin);
            return Some(Effect::Describe(CoreError::Log(e)));
        }
        self.turn = last + 1;
        ctx.shared.state().turn = self.turn;
        self.next_step = false;
        self.ending = None;
        self.max_tokens = false;
        self.stop_driver = false;
        match ctx.inbox.claim(Target::NextTurn, self.turn) {
            Ok(batch) => self.claimed = batch,
            Err(e) => self.claim_error = Some(CoreError::Inbox(e)),
        }
        self.wait = Wait::Start;
        None
    }

    /// Feeds the result of the last effect (`Continue` to start); returns the next effect.
    pub fn resume(&mut self, ctx: &Ctx<'_>, input: Input) -> Effect {
        let wait = std::mem::replace(&mut self.wait, Wait::Done);
        match (wait, input) {
            (Wait::Start, Input::Continue) => self.turn_top(ctx),
            (Wait::PreStep, Input::Decided(decision)) => self.decided(ctx, decision),
            (Wait::BeforeRequest, Input::Requested(requested)) => self.requested(ctx, requested),
            (Wait::Flush, Input::Continue) => match self.check(ctx) {
                Ok(()) => self.call_model(),
                Err(f) => self.fail(ctx, f),
            },
            (Wait::Model, input) => self.model_result(ctx, input),
            (Wait::Chunk, input) => self.chunk_result(ctx, input),
            (Wait::CloseStream(fault), Input::Continue) => self.fail(ctx, fault),
            (Wait::RequestError(failure, exception), Input::Retry(retry)) => {
                if let Err(f) = self.check(ctx) {
                    return self.fail(ctx, f);
                }
                if retry {
                    return self.request_begin(ctx);
                }
                self.fail(ctx, Fault::Failure { failure, exception })
            }
            (Wait::Gate, Input::Gated(gate)) => self.gated(ctx, gate),
            (Wait::Gate, Input::Raised(raised)) => self.gate_raised(ctx, raised),
            (Wait::Tools, Input::ToolsDone(plan)) => {
                self.concludes |= plan.concludes();
                if plan.waits() {
                    return self.plan_waits(ctx);
                }
                let end = if std::mem::take(&mut self.concludes) { StepEnd::Completed } else { StepEnd::Again };
                self.step_done(ctx, end)
            }
            (Wait::Stopping, Input::Continue) => match self.check(ctx) {
                Ok(()) => self.after_stopping(ctx),
                Err(f) => self.fail(ctx, f),
            },
            (Wait::Describe(from), Input::Raised(raised)) => self.unwind(ctx, from, Fault::Raised(raised)),
            (Wait::Then(then), Input::Continue) => self.then(ctx, then),
            // Host code an effect awaited raised: the fault unwinds from where it was awaited.
            (Wait::CloseStream(fault), Input::Raised(_)) => self.fail(ctx, fault),
            (
                Wait::Stopping | Wait::Flush | Wait::PreStep | Wait::BeforeRequest | Wait::RequestError(..) | Wait::Tools | Wait::Start,
                Input::Raised(raised),
            ) => self.fail(ctx, Fault::Raised(raised)),
            (Wait::Then(then), Input::Raised(_)) => self.then(ctx, then),
            (Wait::Done, _) => Effect::Finished,
            (wait, input) => panic!("the turn machine got {input:?} while waiting for {wait:?}"),
        }
    }

    fn check(&self, ctx: &Ctx<'_>) -> Result<(), Fault> {
        if ctx.aborted() {
            return Err(Fault::Aborted);
        }
        Ok(())
    }

    // ---- the turn body ------------------------------------------------------------------------

    fn turn_top(&mut self, ctx: &Ctx<'_>) -> Effect {
        if let Some(e) = self.claim_error.take() {
            return self.fail(ctx, Fault::Core(e));
        }
        self.next_step = false;
        let batch = std::mem::take(&mut self.claimed);
        self.step_top(ctx, batch)
    }

    /// The head of the step loop: the batch (claimed between steps) goes to `pre_step`.
    fn step_top(&mut self, ctx: &Ctx<'_>, batch: Vec<Arc<Message>>) -> Effect {
        if let Err(f) = self.check(ctx) {
            return self.fail(ctx, f);
        }
        self.step = ctx.shared.state().step + 1;
        let batch = if self.next_step {
            match ctx.inbox.claim(Target::NextStep, self.turn) {
                Ok(batch) => batch,
                Err(e) => return self.fail(ctx, Fault::Core(CoreError::Inbox(e))),
            }
        } else {
            batch
        };
        if !batch.is_empty() {
            if let Some(effect) = self.budget_stop(ctx, super::budget::At::Claim) {
                return effect;
            }
        }
        self.wait = Wait::PreStep;
        Effect::PreStep { batch }
    }

    fn decided(&mut self, ctx: &Ctx<'_>, decision: Decision) -> Effect {
        let messages = match decision {
            Decision::Invalid(repr) => {
                let message = format!("pre-step listener returned {repr}; expected Enter or Reject");
                return self.fail(ctx, Fault::rule(FailureCode::InvalidDecision, message));
            }
            _ if ctx.aborted() => return self.fail(ctx, Fault::Aborted),
            Decision::Reject(reason) => {
                self.ending = Some(Ending::Blocked(reason));
                self.stop_driver = true;
                return self.end_turn(ctx);
            }
            Decision::Enter(messages) => messages,
        };
        let entering = !messages.is_empty();
        if self.ending.is_some() && !entering {
            return self.end_turn(ctx);
        }
        if ctx.shared.state().step == 0 && !entering {
            // An empty first batch: nothing to do.
            self.ending = Some(Ending::Completed);
            self.stop_driver = true;
            return self.end_turn(ctx);
        }
        if let Err(e) = ctx.append(events::step_start(self.turn, self.step)) {
            return self.fail(ctx, Fault::Core(CoreError::Log(e)));
        }
        ctx.shared.state().step = self.step;
        self.step_open = true;
        for message in &messages {
            if let Err(e) = ctx.append_message(events::user_message(message), Some(Arc::clone(message))) {
                return self.fail(ctx, Fault::Core(CoreError::Log(e)));
            }
        }
        self.entered = messages;
        self.request_begin(ctx)
    }

    // ---- the step -----------------------------------------------------------------------------

    fn request_begin(&mut self, ctx: &Ctx<'_>) -> Effect {
        // Caught up with what others appended, so the request's history is the whole log.
        if let Err(e) = ctx.shared.history.catch_up(ctx.log, ctx.log.len()) {
            return self.fail(ctx, Fault::Core(CoreError::Message(e)));
        }
        if let Some(effect) = self.budget_stop(ctx, super::budget::At::Request) {
            return effect;
        }
        self.wait = Wait::BeforeRequest;
        Effect::BeforeRequest
    }

    fn requested(&mut self, ctx: &Ctx<'_>, requested: Requested) -> Effect {
        if let Err(f) = self.check(ctx) {
            return self.fail(ctx, f);
        }
        let (options, canonical, instructions) = match requested {
            Requested::Request { options, canonical, instructions } => (options, canonical, instructions),
            Requested::NotARequest(repr) => {
                let message = format!("before_request listener returned {repr}; expected a ModelRequest");
                return self.fail(ctx, Fault::rule(FailureCode::InvalidRequest, message));
            }
            Requested::NotJson(detail) => {
                let message = format!("request options are not lossless JSON: {detail}");
                return self.fail(ctx, Fault::rule(FailureCode::InvalidRequest, message));
            }
            Requested::BadInstructions(repr) => {
                let message = format!("request.instructions must be a str or None, got {repr}");
                return self.fail(ctx, Fault::rule(FailureCode::InvalidRequest, message));
            }
        };
        // The configured instructions are recorded when they change (a resumed loop reads
        // them back), before the header of the first request that starts from them.
        let configured = {
            let state = ctx.shared.state();
            (state.instructions != state.logged_instructions).then(|| state.instructions.clone())
        };
        if let Some(configured) = configured {
            if let Err(e) = ctx.append(events::instructions(configured.as_deref())) {
                return self.fail(ctx, Fault::Core(CoreError::Log(e)));
            }
            ctx.shared.state().logged_instructions = configured;
        }
        let header_due = ctx.shared.state().header_due(&canonical, instructions.as_deref());
        if header_due {
            let appended = options.and_then(|options| ctx.append(events::request_header(&options, instructions.as_deref())));
            if let Err(e) = appended {
                return self.fail(ctx, Fault::Core(CoreError::Log(e)));
            }
            let mut state = ctx.shared.state();
            state.last_options = Some(canonical);
            state.last_instructions = instructions;
        }
        ctx.shared.state().requests += 1;
        if ctx.log.checkpoints() {
            self.wait = Wait::Flush;
            return Effect::Flush;
        }
        self.call_model()
    }

    fn call_model(&mut self) -> Effect {
        self.chunks.clear();
        self.attempt.begin();
        self.wait = Wait::Model;
        Effect::CallModel
    }

    fn model_result(&mut self, ctx: &Ctx<'_>, input: Input) -> Effect {
        match input {
            Input::Reply(Reply { content: ReplyContent::Text(text), usage, max_tokens }) => {
                // One text block: no tool calls to drop or plan, nothing to validate.
                let message = Message::of_text(crate::message::MessageKind::Assistant, &text, None);
                if let Err(fault) = self.append_assistant(ctx, message, false, usage.as_deref(), Vec::new(), false) {
                    return self.fail(ctx, fault);
                }
                self.step_done(ctx, if max_tokens { StepEnd::MaxTokens } else { StepEnd::Completed })
            }
            Input::Reply(Reply { content: ReplyContent::Calls(calls), usage, max_tokens: false }) => {
                // Checked as `reply_done` checks, in the same order: nothing is logged of a
                // reply that repeats an id.
                let message = Message::of_tool_calls(&calls);
                if let Some(id) = repeated_id(&calls) {
                    return self.fail(ctx, Fault::rule(FailureCode::InvalidReply, repeated_message(id)));
                }
                if let Err(fault) = self.append_assistant(ctx, message, false, usage.as_deref(), Vec::new(), false) {
                    return self.fail(ctx, fault);
                }
                self.plan_calls(ctx, calls)
            }
            Input::Reply(Reply { content: ReplyContent::Calls(calls), usage, max_tokens: true }) => {
                let blocks = calls
                    .into_iter()
                    .map(|(id, name, arguments)| serde_json::json!({"type": "tool-call", "id": id, "name": name, "arguments": arguments}))
                    .collect();
                self.reply_done(ctx, blocks, usage.as_deref(), true, Vec::new())
            }
            Input::Reply(Reply { content: ReplyContent::Blocks(content), usage, max_tokens }) => {
                self.reply_done(ctx, content, usage.as_deref(), max_tokens, Vec::new())
            }
            Input::NotAReply(repr) => {
                let message = format!("model returned {repr}; expected a ModelReply");
                self.fail(ctx, Fault::rule(FailureCode::InvalidReply, message))
            }
            Input::Streaming => {
                self.assembler = Some(Assembler::new());
                self.chunks.clear();
                self.wait = Wait::Chunk;
                Effect::NextChunk
            }
            Input::ModelFailed(failure) => self.request_failed(ctx, failure, true),
            Input::Raised(raised) => self.fail(ctx, Fault::Raised(raised)),
            Input::AfterFailed { failed, outcome } => match self.log_failed_attempts(ctx, failed, &outcome) {
                Ok(()) => self.model_result(ctx, *outcome),
                Err(fault) => self.fail(ctx, fault),
            },
            input => panic!("the turn machine got {input:?} while waiting for the model"),
        }
    }

    fn chunk_result(&mut self, ctx: &Ctx<'_>, input: Input) -> Effect {
        match input {
            Input::Chunk(chunk) => match self.take_chunk(ctx, chunk) {
                Ok(()) => {
                    self.wait = Wait::Chunk;
                    Effect::NextChunk
                }
                Err(fault) => self.stream_failed(ctx, fault),
            },
            Input::NotAChunk(repr) => {
                let message = format!("model stream yielded {repr}; expected a chunk dict");
                self.stream_failed(ctx, Fault::rule(FailureCode::InvalidReply, message))
            }
            Input::StreamEnded => self.stream_end(ctx),
            Input::ModelFailed(failure) => self.request_failed(ctx, failure, true),
            Input::Raised(raised) => self.stream_failed(ctx, Fault::Raised(raised)),
            input => panic!("the turn machine got {input:?} while waiting for a chunk"),
        }
    }

    /// Logs one chunk (`assistant/chunk`) and feeds it to the assembler.
    fn take_chunk(&mut self, ctx: &Ctx<'_>, chunk: Map<String, Value>) -> Result<(), Fault> {
        self.check(ctx)?;
        let text = crate::json::compact(&Value::Object(chunk));
        let Ok(Value::Object(chunk)) = serde_json::from_str::<Value>(&text) else { unreachable!("compact JSON of an object") };
        if self.attempt.ended() {
            // The last chunk ended an attempt and the stream goes on: this is another attempt
            // of the request (a `Fallback`'s next model), and the message is only its own.
            self.chunks.clear();
            self.assembler = None;
        }
        let seq = ctx.append(events::assistant_chunk(self.turn, self.step, &text)).map_err(|e| Fault::Core(CoreError::Log(e)))?;
        self.chunks.push(seq);
        self.attempt.chunk(&chunk);
        let assembler = self.assembler.get_or_insert_with(Assembler::new);
        assembler.feed(&chunk).map_err(|message| Fault::rule(FailureCode::Unknown, message))
    }

    /// A stream failed (or was aborted, or cancelled from outside): a cancellation logs the
    /// request as an interrupted message of what was visible (`attempt`), the stream is closed,
    /// and the fault unwinds.
    fn stream_failed(&mut self, ctx: &Ctx<'_>, fault: Fault) -> Effect {
        if Self::cut_by(ctx, &fault) {
            let assembler = self.assembler.take().unwrap_or_default();
            let usage = assembler.usage().map(|u| crate::json::compact(&u));
            if let Err(fault) = self.close_cut_attempt(ctx, assembler.visible(), usage.as_deref()) {
                return self.fail(ctx, fault);
            }
        }
        self.assembler = None;
        self.wait = Wait::CloseStream(fault);
        Effect::CloseStream
    }

    /// The stream ended: a finish reason other than `stop` or `max-tokens` is a failure.
    fn stream_end(&mut self, ctx: &Ctx<'_>) -> Effect {
        let assembler = self.assembler.take().unwrap_or_default();
        let chunks = std::mem::take(&mut self.chunks);
        let max_tokens = match assembler.finish() {
            Some(Finish::Stop) => false,
            Some(Finish::MaxTokens) => true,
            _ => return self.request_failed(ctx, assembler.failure(), false),
        };
        let usage = assembler.usage().map(|u| crate::json::compact(&u));
        self.reply_done(ctx, assembler.into_blocks(), usage.as_deref(), max_tokens, chunks)
    }

    /// The request failed: the attempt is ended in the log, then `request_error` decides.
    fn request_failed(&mut self, ctx: &Ctx<'_>, failure: Failure, exception: bool) -> Effect {
        if let Err(e) = self.close_attempt(ctx, &failure) {
            return self.fail(ctx, Fault::Core(CoreError::Log(e)));
        }
        self.wait = Wait::RequestError(failure.clone(), exception);
        Effect::RequestError { failure, exception }
    }

    /// `assistant/message`; an empty message stays in the log but not in the history. `empty`
    /// says which (the caller knows: asking a text message built without its parts would parse
    /// its JSON).
    fn append_assistant(
        &mut self,
        ctx: &Ctx<'_>,
        message: Message,
        empty: bool,
        usage: Option<&str>,
        chunks: Vec<u64>,
        interrupted: bool,
    ) -> Result<(), Fault> {
        let event = events::assistant_message(self.turn, self.step, &message, interrupted, usage, chunks);
        let joined = (!empty).then(|| Arc::new(message));
        ctx.append_message(event, joined).map_err(|e| Fault::Core(CoreError::Log(e)))?;
        self.attempt.answered();
        Ok(())
    }

    /// Logs the assistant message (its tool calls dropped on `max-tokens`, SPEC 4.9), then
    /// plans its tool calls.
    fn reply_done(&mut self, ctx: &Ctx<'_>, content: Vec<Value>, usage: Option<&str>, max_tokens: bool, chunks: Vec<u64>) -> Effect {
        let content = if max_tokens { content.into_iter().filter(|b| BlockType::of(b) != BlockType::ToolCall).collect() } else { content };
        // Validated before anything is logged: results are matched to calls by id (by the
        // model's provider and by the crash closers), so two calls with one id could never
        // both be answered, and the log never holds a call without its result.
        let message = match Message::assistant(content, None, None) {
            Ok(message) => message,
            Err(e) => return self.fail(ctx, Fault::Core(CoreError::Message(e))),
        };
        let calls = if max_tokens { Vec::new() } else { requested(&message) };
        if let Some(id) = repeated_id(&calls) {
            return self.fail(ctx, Fault::rule(FailureCode::InvalidReply, repeated_message(id)));
        }
        let empty = message.content().is_empty();
        if let Err(fault) = self.append_assistant(ctx, message, empty, usage, chunks, false) {
            return self.fail(ctx, fault);
        }
        if max_tokens {
            return self.step_done(ctx, StepEnd::MaxTokens);
        }
        self.plan_calls(ctx, calls)
    }

    /// The reply's calls, logged with it, become the step's tool plan (none: the step is done).
    fn plan_calls(&mut self, ctx: &Ctx<'_>, calls: Vec<(String, String, String)>) -> Effect {
        if calls.is_empty() {
            return self.step_done(ctx, StepEnd::Completed);
        }
        if ctx.gated {
            return self.gate_calls(ctx, calls, Vec::new());
        }
        self.run_plan(ctx, calls, Vec::new())
    }

    /// The plan's calls that could run have their results, and some wait for a person. A step
    /// the gate asked about goes on from the log (decisions that came in meanwhile apply at
    /// once; after a cancel, what still waits is resolved `cancelled`), else the step waits.
    fn plan_waits(&mut self, ctx: &Ctx<'_>) -> Effect {
        if ctx.aborted() {
            if let Err(e) = super::decisions::cancel_pending(ctx.log) {
                return self.fail(ctx, Fault::Core(CoreError::Log(e)));
            }
        }
        match super::decisions::held(ctx.log) {
            Some(held) => self.take_up(ctx, held),
            // Only calls that need input wait (`call_decisions`): resumed once they are decided.
            None => self.await_decisions(),
        }
    }

    /// The step's calls become its tool plan, with what was decided for them.
    fn run_plan(&mut self, ctx: &Ctx<'_>, calls: Vec<(String, String, String)>, verdicts: Vec<gate::Verdict>) -> Effect {
        let started = verdicts.iter().any(|v| matches!(v, gate::Verdict::Logged(super::in_doubt::Logged::InDoubt { .. }, _)));
        let calls = calls
            .into_iter()
            .map(|(id, name, arguments)| {
                let tool = (ctx.tools)(&name);
                Call { id, name, arguments, known: tool.is_some(), info: tool.unwrap_or_default() }
            })
            .collect();
        let mut plan = ToolPlan::new(self.turn, self.step, calls, ctx.max_parallel);
        for (index, verdict) in verdicts.into_iter().enumerate() {
            verdict.apply(&mut plan, index);
        }
        if started {
            // Calls of a held step that started: what a person decided about them.
            call_decision::apply(ctx, &mut plan);
        }
        self.plan = Some(plan);
        self.wait = Wait::Tools;
        Effect::RunTools
    }

    fn step_done(&mut self, ctx: &Ctx<'_>, end: StepEnd) -> Effect {
        // The step's `finally`: step/end is appended whatever happened.
        self.step_open = false;
        if let Err(e) = ctx.append(events::step_end(self.turn, self.step)) {
            return self.fail(ctx, Fault::Core(CoreError::Log(e)));
        }
        self.max_tokens |= matches!(end, StepEnd::MaxTokens);
        self.ending = match end {
            StepEnd::Again => None,
            _ if self.max_tokens => Some(Ending::MaxTokens),
            _ => Some(Ending::Completed),
        };
        if let Err(f) = self.check(ctx) {
            return self.fail(ctx, f);
        }
        if self.ending.is_some() && ctx.inbox.count(Target::NextStep) == 0 {
            self.wait = Wait::Stopping;
            return Effect::TurnStopping;
        }
        self.after_stopping(ctx)
    }

    fn after_stopping(&mut self, ctx: &Ctx<'_>) -> Effect {
        if self.ending.is_some() && ctx.inbox.count(Target::NextStep) == 0 {
            return self.end_turn(ctx);
        }
        self.next_step = true;
        self.step_top(ctx, Vec::new())
    }

    // ---- ending -------------------------------------------------------------------------------

    /// The turn body raised `fault`: it unwinds through the open step, then ends the turn.
    fn fail(&mut self, ctx: &Ctx<'_>, fault: Fault) -> Effect {
        self.unwind(ctx, Unwind::Body, fault)
    }

    fn unwind(&mut self, ctx: &Ctx<'_>, from: Unwind, fault: Fault) -> Effect {
        if let Fault::Core(e) = fault {
            self.log_failed(&e);
            self.wait = Wait::Describe(from);
            return Effect::Describe(e);
        }
        match from {
            Unwind::Body => {}
            Unwind::Begin => return self.begin_failed(ctx, fault),
            Unwind::TurnEnd => return self.turn_end_failed(ctx, fault),
        }
        self.assembler = None;
        self.plan = None;
        if let Err(e) = self.close_failed_attempt(ctx, &fault) {
            return self.fail(ctx, e);
        }
        if self.step_open {
            self.step_open = false;
            // The step's `finally`; its own failure replaces the one being handled.
            if let Err(e) = ctx.append(events::step_end(self.turn, self.step)) {
                return self.fail(ctx, Fault::Core(CoreError::Log(e)));
            }
        }
        self.turn_failed(ctx, fault)
    }

    /// The turn's `except`: the ending a fault gives.
    fn turn_failed(&mut self, ctx: &Ctx<'_>, fault: Fault) -> Effect {
        self.stop_driver = true;
        let (failure, exception) = match fault {
            Fault::Raised(Raised { kind: RaisedKind::LeaseLost, failure }) => {
                // Fenced out by a newer owner: the session is no longer ours, so not even a
                // turn/end is appended (the new owner's open closed this turn).
                return self.fence(ctx, failure.as_ref(), Then::Finish);
            }
            Fault::Raised(Raised { kind: RaisedKind::Cancelled, .. }) if !ctx.aborted() => {
                // Cancelled from outside (event-loop shutdown): the turn ends disposed.
                let cause = AbortCause::new(AbortKind::Disposed);
                ctx.shared.state().abort = Some(cause.clone());
                self.propagate = true;
                self.wait = Wait::Then(Then::EndAborted);
                return Effect::Abort(cause);
            }
            Fault::Raised(Raised { kind, failure }) => {
                // Not an ordinary exception: the turn ends, then it propagates.
                self.propagate |= kind == RaisedKind::Fatal;
                (failure, true)
            }
            Fault::Failure { failure, exception } => (Some(failure), exception),
            Fault::Aborted => (None, false),
            Fault::Core(_) => unreachable!("described before it unwinds"),
        };
        // Copied out first: the state is never locked across an append (observers run Python).
        let abort = ctx.shared.state().abort.clone();
        if let Some(cause) = abort {
            self.ending = Some(Ending::Aborted(cause));
            return self.end_turn(ctx);
        }
        // Only a fault after an abort comes without a failure, and the abort ended the turn.
        let failure = failure.unwrap_or_else(|| Failure::new(FailureCode::Unknown, "the turn failed with no failure"));
        self.ending = Some(Ending::Error(failure.clone()));
        self.wait = Wait::Then(Then::TurnEnd);
        let step = ctx.shared.state().step;
        Effect::Report { turn: self.turn, step, failure: Some(failure), exception }
    }

    fn fence(&mut self, ctx: &Ctx<'_>, failure: Option<&Failure>, then: Then) -> Effect {
        self.stop_driver = true;
        let cause = AbortCause::new(AbortKind::Fenced);
        {
            let mut state = ctx.shared.state();
            if state.abort.is_none() {
                state.abort = Some(cause.clone());
            }
        }
        // The report says who: the lost lease's message, code FENCED.
        let message = failure.and_then(Failure::message).unwrap_or_default();
        self.wait = Wait::Then(then);
        Effect::Fence { turn: self.turn, failure: Failure::new(FailureCode::Fenced, message), cause }
    }

    /// The turn's `finally`: `turn/end`.
    fn end_turn(&mut self, ctx: &Ctx<'_>) -> Effect {
        let ending = self.ending.clone().unwrap_or(Ending::Completed);
        if let Err(e) = ctx.append(events::turn_end(self.turn, &ending)) {
            self.wait = Wait::Describe(Unwind::TurnEnd);
            return Effect::Describe(CoreError::Log(e));
        }
        self.conclude(ctx)
    }

    fn turn_end_failed(&mut self, ctx: &Ctx<'_>, fault: Fault) -> Effect {
        match fault {
            Fault::Raised(Raised { kind: RaisedKind::LeaseLost, failure }) => self.fence(ctx, failure.as_ref(), Then::Finish),
            Fault::Raised(Raised { failure, .. }) => self.report_unwound(ctx, failure),
            Fault::Failure { failure, .. } => self.report_unwound(ctx, Some(failure)),
            Fault::Aborted | Fault::Core(_) => self.conclude(ctx),
        }
    }

    /// A fault while the turn ended: reported, then the run concludes.
    fn report_unwound(&mut self, ctx: &Ctx<'_>, failure: Option<Failure>) -> Effect {
        self.stop_driver = true;
        self.wait = Wait::Then(Then::Conclude);
        let step = ctx.shared.state().step;
        Effect::Report { turn: self.turn, step, failure, exception: true }
    }

    fn begin_failed(&mut self, ctx: &Ctx<'_>, fault: Fault) -> Effect {
        let turn = self.turn;
        match fault {
            Fault::Raised(Raised { kind: RaisedKind::LeaseLost, failure }) => self.fence(ctx, failure.as_ref(), Then::NoTurn),
            Fault::Raised(Raised { failure, .. }) => {
                self.wait = Wait::Then(Then::NoTurn);
                Effect::Report { turn, step: 0, failure, exception: true }
            }
            Fault::Failure { failure, .. } => {
                self.wait = Wait::Then(Then::NoTurn);
                Effect::Report { turn, step: 0, failure: Some(failure), exception: true }
            }
            Fault::Aborted | Fault::Core(_) => {
                self.wait = Wait::Done;
                Effect::NoTurn
            }
        }
    }

    fn then(&mut self, ctx: &Ctx<'_>, then: Then) -> Effect {
        match then {
            Then::TurnEnd => self.end_turn(ctx),
            Then::Conclude => self.conclude(ctx),
            Then::Begin => {
                // A fresh signal is in place (the host made it): nothing aborted, no step.
                ctx.shared.state().reset_run();
                self.begin_next(ctx)
            }
            Then::Finish => {
                self.wait = Wait::Done;
                Effect::Finished
            }
            Then::EndAborted => {
                // Set by the turn's `except` before it asked the host to abort.
                let cause = ctx.shared.state().abort.clone().unwrap_or_else(|| AbortCause::new(AbortKind::Disposed));
                self.ending = Some(Ending::Aborted(cause));
                self.end_turn(ctx)
            }
            Then::NoTurn => {
                self.wait = Wait::Done;
                Effect::NoTurn
            }
        }
    }

    fn begin_next(&mut self, ctx: &Ctx<'_>) -> Effect {
        match self.begin_turn(ctx) {
            None => self.turn_top(ctx),
            Some(Effect::NoTurn) => {
                self.wait = Wait::Done;
                Effect::Finished
            }
            Some(effect) => effect,
        }
    }

    /// After `turn/end`: the next queued turn starts unless this one stopped the run.
    fn conclude(&mut self, ctx: &Ctx<'_>) -> Effect {
        if !self.stop_driver && ctx.inbox.has_pending() {
            self.wait = Wait::Then(Then::Begin);
            return Effect::NewTurn;
        }
        self.wait = Wait::Done;
        Effect::Finished
    }
}

/// How a step ended.
#[derive(Debug, Clone, Copy)]
enum StepEnd {
    /// The turn may complete.
    Completed,
    /// The model stopped at its token limit.
    MaxTokens,
    /// Tool results are owed another request.
    Again,
}

fn repeated_message(id: &str) -> String {
    format!("model reply has two tool calls with id {id:?}; tool-call ids must be unique within a reply")
}
