//! The tool plan of one step (reference 5.8, SPEC 4.4): which call starts next, which results
//! are committed, and which are synthesised.
//!
//! Calls start in the model's order in a rolling pool of at most `max_parallel` running at
//! once; a call of a `parallel=False` tool is a barrier: it waits for the running calls and runs
//! alone. Each call logs `tool/call` as it starts; results are committed (`tool/result`)
//! strictly in model order, so a fast call waits for slower earlier ones. A call held for a
//! person's decision ([`ToolPlan::hold`]) neither starts nor holds up the results after it: the
//! step's results are in model order among the calls that run, and the held call's result
//! follows when it is decided and runs (the history orders a step's results by call). An unknown tool's call
//! gets its error result without running. After an abort nothing new starts; what never started
//! gets a `tool/call` and an `ABORTED_BEFORE_DISPATCH` result.
//!
//! The plan does no I/O besides appending to the log: whoever runs the bodies (the binding's
//! driver for a lone call, its executor for several) asks [`ToolPlan::next`] what to do and
//! hands each body's outcome to [`ToolPlan::finish`].

use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::Value;

use super::events::{self, append};
use super::failure::{Failure, FailureCode};
use super::history::History;
use super::in_doubt::{InDoubt, Logged, ToolInfo};
use super::CoreError;
use crate::event_log::{LogError, SessionLog};
use crate::inbox::{Inbox, Target};
use crate::message::{BlockType, Message};

/// One requested call.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// A tool of that name is registered.
    pub known: bool,
    /// What the loop knows of that tool (the defaults for an unknown one).
    pub info: ToolInfo,
}

/// A result's content: a tool's plain `str`, or content blocks.
#[derive(Debug, Clone)]
pub enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

/// What a call's body gave, as the result to commit.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub content: Content,
    pub is_error: bool,
    /// The result's `error` (`name`, `code`, and for an exception `function`/`traceback`).
    pub error: Option<Value>,
    pub concludes: bool,
    /// Messages queued in next-step right after the result is logged.
    pub contexts: Vec<Arc<Message>>,
    /// `meta` as JSON text.
    pub meta: Option<String>,
    /// A bug of the tool: its body raised, or returned what is not a result. Reported
    /// (`agent/error`, the logger) once committed; the model gets the error result.
    pub bug: bool,
    /// Not a result: the call needs a person's input first (`call_decisions`). Boxed: an
    /// outcome travels by value, and this is rare.
    pub input: Option<Box<InputAsk>>,
}

/// What a call that needs input asks: the person's `note` (an MCP server's message), the
/// answer's JSON Schema and the tool's opaque `payload` for the call made again (JSON texts).
#[derive(Debug, Clone, Default)]
pub struct InputAsk {
    pub note: Option<String>,
    pub schema: Option<String>,
    pub payload: Option<String>,
}

impl Outcome {
    pub fn text(text: impl Into<String>) -> Outcome {
        Outcome {
            content: Content::Text(text.into()),
            is_error: false,
            error: None,
            concludes: false,
            contexts: Vec::new(),
            meta: None,
            bug: false,
            input: None,
        }
    }

    /// The call needs input before it can give a result.
    pub fn needs_input(ask: InputAsk) -> Outcome {
        Outcome { input: Some(Box::new(ask)), ..Outcome::text("") }
    }

    /// An error result: `text` for the model, `error {name, code}` for the log.
    pub fn error(text: impl Into<String>, name: &str, code: FailureCode) -> Outcome {
        Outcome { is_error: true, error: Some(code.tool_error(name)), ..Outcome::text(text) }
    }

    pub fn aborted_before() -> Outcome {
        Outcome::error("Error: tool call aborted before dispatch", "AbortError", FailureCode::AbortedBeforeDispatch)
    }

    pub fn aborted_during() -> Outcome {
        Outcome::error("Error: tool call aborted during dispatch", "CancelledError", FailureCode::AbortedDuringDispatch)
    }

    /// A gate or a person denied the call (`reason`, when given, tells the model why).
    pub fn denied(name: &str, reason: Option<&str>) -> Outcome {
        let text = match reason {
            Some(reason) => format!("tool call {} was denied: {reason}", py_repr(name)),
            None => format!("tool call {} was denied", py_repr(name)),
        };
        Outcome::error(text, "ToolDeniedError", FailureCode::ToolDenied)
    }

    /// The call's decision expired before anyone decided it.
    pub fn expired(name: &str) -> Outcome {
        let text = format!("tool call {} was not run: its approval expired before anyone decided it", py_repr(name));
        Outcome::error(text, "DecisionExpiredError", FailureCode::ToolDenied)
    }

    /// The `before_tool` gate failed (raised, or returned what is not a verdict): the call
    /// does not run.
    pub fn gate_failed(name: &str, detail: &str) -> Outcome {
        let text = format!("tool call {} was not run: its before_tool gate failed: {detail}", py_repr(name));
        Outcome::error(text, "GateError", FailureCode::GateError)
    }

    /// A person recorded that the call in doubt failed (`reason`, when given, tells the model
    /// how).
    pub fn recorded_failure(name: &str, reason: Option<&str>) -> Outcome {
        let text = match reason {
            Some(reason) => format!("tool call {} failed (recorded by a person): {reason}", py_repr(name)),
            None => format!("tool call {} failed (recorded by a person)", py_repr(name)),
        };
        Outcome::error(text, "RecordedFailureError", FailureCode::ToolError)
    }

    /// The arguments about to run are not the decided ones.
    pub fn mismatch() -> Outcome {
        Outcome::error(
            "tool call was not run: its arguments differ from the ones that were decided",
            "DecisionMismatchError",
            FailureCode::GateError,
        )
    }

    /// A call in doubt whose outcome stays unknown (its policy is `fail`, or its reconcile
    /// function found nothing): the words of the crash closers.
    pub fn outcome_unknown(name: &str) -> Outcome {
        let text = format!(
            "Tool call {name:?} was interrupted before its result was recorded; its side effects may or may not have happened. Do not retry blindly."
        );
        Outcome::error(text, "ToolOutcomeUnknownError", FailureCode::ToolOutcomeUnknown)
    }

    /// A call of a crashed step that never started.
    pub fn not_started(name: &str) -> Outcome {
        let text = format!("Tool call {name:?} was not started before the session was interrupted; it is safe to retry.");
        Outcome::error(text, "ToolNotStartedError", FailureCode::ToolNotStarted)
    }

    pub fn unknown_tool(name: &str) -> Outcome {
        Outcome::error(format!("unknown tool {}", py_repr(name)), "UnknownToolError", FailureCode::UnknownTool)
    }

    pub fn bad_arguments(detail: &str) -> Outcome {
        Outcome::error(format!("invalid tool arguments: {detail}"), "ValueError", FailureCode::InvalidArguments)
    }

    /// A result the log refused (content blocks that are not a message's, say): an error result
    /// in its place, so the call keeps a result. A bug of the tool, reported as one.
    pub fn invalid(tool: &str, error_name: &str, detail: &str) -> Outcome {
        let text = format!("tool {} returned an invalid result: {detail}", py_repr(tool));
        Outcome { bug: true, ..Outcome::error(text, error_name, FailureCode::ToolError) }
    }

    /// A body returned a value of type `type_name`, neither a str nor a result: an error result
    /// in its place, reported as the tool's bug.
    pub fn wrong_type(tool: &str, type_name: &str) -> Outcome {
        let text = format!("tool {} returned {type_name}; expected str or ToolResult", py_repr(tool));
        Outcome { bug: true, ..Outcome::error(text, "TypeError", FailureCode::ToolError) }
    }

    fn message(&self, call_id: &str) -> Result<Message, crate::message::MessageError> {
        match &self.content {
            Content::Text(text) if !self.is_error => Ok(Message::tool_result_text(call_id, text)),
            Content::Text(text) => Message::tool_result(call_id, vec![serde_json::json!({"type": "text", "text": text})], true, None),
            Content::Blocks(blocks) => Message::tool_result(call_id, blocks.clone(), self.is_error, None),
        }
    }
}

/// A str as Python's `repr` writes it (the wording of the errors the loop has always used).
pub fn py_repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// What the runner does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Run call `index` (its `tool/call` is logged).
    Start(usize),
    /// Wait for a running call to finish.
    Wait,
    /// Every call has its result.
    Done,
}

/// A committed result that is a bug of its tool (the body raised, or returned what is not a
/// result): the runner reports it (`agent/error`).
#[derive(Debug, Clone)]
pub struct Raised {
    pub index: usize,
    /// The error the result carries, with `message`, `callId` and `tool` added.
    pub failure: Failure,
}

/// Where the plan writes: the log, the inbox (a result's contexts) and the loop's history.
pub struct Sink<'a> {
    pub log: &'a SessionLog,
    pub inbox: &'a Inbox,
    pub history: &'a History,
}

/// What a plan knows of one call besides its outcome.
#[derive(Debug, Clone, Copy, Default)]
#[allow(clippy::struct_excessive_bools, reason = "five independent facts of one call")]
struct Flags {
    finished: bool,
    /// A resumed step's call whose `tool/call` is logged already (in doubt), or that gets no
    /// record (it never started).
    prelogged: bool,
    /// A resumed step's call that has its `tool/result`.
    done: bool,
    /// A call in doubt whose tool's reconcile function runs instead of its body.
    reconcile: bool,
    /// A call that waits for a person's decision: it neither starts nor blocks the commits of
    /// the calls after it; the step waits for it once the others have their results.
    held: bool,
}

#[derive(Debug)]
pub struct ToolPlan {
    pub turn: u64,
    pub step: u64,
    calls: Vec<Call>,
    max_parallel: usize,
    started: usize,
    running: usize,
    exclusive_running: bool,
    call_seqs: Vec<Option<u64>>,
    /// Per call: finished, and how a resumed step found it (one vector: the plan travels by
    /// value in the machine's input).
    flags: Vec<Flags>,
    outcomes: Vec<Option<Outcome>>,
    committed: usize,
    concludes: bool,
    raised: Vec<Raised>,
    /// Outcomes decided before the call could run (a gate's or a person's denial, an answer):
    /// the call is logged and gets it without running.
    presets: Vec<Option<Outcome>>,
    /// The digest a decision approved, checked against the arguments about to run.
    digests: Vec<Option<String>>,
    /// Calls that need, or were given, a person's input (none in most steps: boxed, as the
    /// plan travels by value).
    input: Option<Box<InputState>>,
}

/// The input side of a plan's calls (`call_decisions`).
#[derive(Debug, Default)]
struct InputState {
    /// Per call made again after a person answered its request for input: `{payload,
    /// answer, decisionId}` as JSON text, which its body gets (`ToolContext.input`).
    given: Vec<(usize, String)>,
    /// Calls that need input (index, what they ask), asked once every call is committed.
    asks: Vec<(usize, InputAsk)>,
    /// Requests for input were written: the step waits for them.
    waits: bool,
}

impl ToolPlan {
    pub fn new(turn: u64, step: u64, calls: Vec<Call>, max_parallel: usize) -> ToolPlan {
        let n = calls.len();
        ToolPlan {
            turn,
            step,
            calls,
            max_parallel: max_parallel.max(1),
            started: 0,
            running: 0,
            exclusive_running: false,
            call_seqs: vec![None; n],
            flags: vec![Flags::default(); n],
            outcomes: vec![None; n],
            committed: 0,
            concludes: false,
            raised: Vec::new(),
            presets: vec![None; n],
            digests: vec![None; n],
            input: None,
        }
    }

    /// The plan of a crashed step taken up again (`docs/durability.md#calls-in-doubt`): calls
    /// with a result keep it, calls that never started get `TOOL_NOT_STARTED` (the model may
    /// ask again, through its gate), and each call in doubt follows its policy under its
    /// logged `tool/call`: `retry` runs the body again, `reconcile` runs the tool's reconcile
    /// function, anything else (or a tool no longer registered) gets `TOOL_OUTCOME_UNKNOWN`.
    pub fn resumed(turn: u64, step: u64, calls: Vec<(Call, Logged)>, max_parallel: usize) -> ToolPlan {
        let (calls, logged): (Vec<Call>, Vec<Logged>) = calls.into_iter().unzip();
        let mut plan = ToolPlan::new(turn, step, calls, max_parallel);
        for (index, logged) in logged.into_iter().enumerate() {
            plan.logged(index, logged);
        }
        plan
    }

    /// What the log holds of call `index` of a step taken up again (see [`resumed`](Self::resumed)).
    pub fn logged(&mut self, index: usize, logged: Logged) {
        let name = self.calls[index].name.clone();
        match logged {
            Logged::Done => {
                self.flags[index].done = true;
                self.flags[index].finished = true;
            }
            Logged::NotStarted => {
                self.flags[index].prelogged = true;
                self.presets[index] = Some(Outcome::not_started(&name));
            }
            Logged::InDoubt { seq, arguments, policy, .. } => {
                self.flags[index].prelogged = true;
                self.call_seqs[index] = Some(seq);
                self.calls[index].arguments = arguments;
                match policy {
                    _ if !self.calls[index].known => self.presets[index] = Some(Outcome::outcome_unknown(&name)),
                    InDoubt::Retry => {}
                    InDoubt::Reconcile => self.flags[index].reconcile = true,
                    InDoubt::Fail | InDoubt::Ask => self.presets[index] = Some(Outcome::outcome_unknown(&name)),
                }
            }
        }
    }

    /// Call `index` waits for a person: the plan runs the others and leaves it without a
    /// result ([`waits`](Self::waits)).
    pub fn hold(&mut self, index: usize) {
        self.flags[index].held = true;
    }

    /// Whether call `index` runs its tool's reconcile function instead of its body (a call in
    /// doubt of a resumed step); a reconcile function that returns `None` gives
    /// [`Outcome::outcome_unknown`].
    pub fn reconciling(&self, index: usize) -> bool {
        self.flags[index].reconcile
    }

    /// Call `index` of a resumed step, in doubt, runs again under its logged `tool/call` (a
    /// person decided so, or answered its request for input: `input`, given to its body).
    pub fn run_again(&mut self, index: usize, input: Option<String>) {
        if self.calls[index].known {
            self.presets[index] = None;
            self.flags[index].reconcile = false;
            if let Some(input) = input {
                self.input.get_or_insert_with(Box::default).given.push((index, input));
            }
        }
    }

    /// What call `index` is made again with after a request for input (`{payload, answer}`).
    pub fn input(&self, index: usize) -> Option<&str> {
        self.input.as_ref()?.given.iter().find(|(i, _)| *i == index).map(|(_, input)| input.as_str())
    }

    /// Call `index` gets `outcome` without running.
    pub fn preset(&mut self, index: usize, outcome: Outcome) {
        self.presets[index] = Some(outcome);
    }

    /// Call `index` runs with `arguments` (an edit), which must have `digest` when it starts.
    pub fn decided(&mut self, index: usize, arguments: Option<String>, digest: Option<String>) {
        if let Some(arguments) = arguments {
            self.calls[index].arguments = arguments;
        }
        self.digests[index] = digest;
    }

    /// A decided call whose arguments differ from the decided ones fails closed.
    fn mismatch(&self, index: usize) -> Option<Outcome> {
        let expected = self.digests[index].as_deref()?;
        (super::decisions::digest(&self.calls[index].arguments) != expected).then(Outcome::mismatch)
    }

    pub fn calls(&self) -> &[Call] {
        &self.calls
    }

    pub fn call(&self, index: usize) -> &Call {
        &self.calls[index]
    }

    /// The seq of call `index`'s `tool/call` (0 before it is logged).
    pub fn call_seq(&self, index: usize) -> u64 {
        self.call_seqs[index].unwrap_or(0)
    }

    /// How many calls run now.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Whether a committed result concludes the turn.
    pub fn concludes(&self) -> bool {
        self.concludes
    }

    /// The committed results that are bugs of their tools, since the last call (for reporting).
    pub fn take_raised(&mut self) -> Vec<Raised> {
        std::mem::take(&mut self.raised)
    }

    /// What to do next. `aborted`: the turn's signal has aborted, so nothing new starts.
    pub fn next(&mut self, sink: &Sink<'_>, aborted: bool) -> Result<Next, CoreError> {
        let n = self.calls.len();
        while self.started < n && !aborted {
            let index = self.started;
            let call = &self.calls[index];
            let exclusive = call.known && call.info.exclusive;
            if self.flags[index].done || self.flags[index].held {
                // A resumed step's call that has its result, or one that waits for a person.
                self.started += 1;
                self.commit_ready(sink)?;
                continue;
            }
            if self.running > 0 && (exclusive || self.exclusive_running || self.running >= self.max_parallel) {
                return Ok(Next::Wait);
            }
            if !self.flags[index].prelogged {
                self.call_seqs[index] = Some(self.log_call(sink, index)?);
            }
            self.started += 1;
            let decided = self.presets[index].take().or_else(|| self.mismatch(index));
            if decided.is_some() || !self.calls[index].known {
                self.flags[index].finished = true;
                self.outcomes[index] = Some(decided.unwrap_or_else(|| Outcome::unknown_tool(&self.calls[index].name)));
                self.commit_ready(sink)?;
                continue;
            }
            self.running += 1;
            self.exclusive_running = exclusive;
            return Ok(Next::Start(index));
        }
        if self.running > 0 {
            return Ok(Next::Wait);
        }
        // Aborted (or all started and finished): the rest never runs.
        for index in self.started..n {
            if self.flags[index].held {
                // Its request is the machine's to resolve (cancelled) before it gets a result.
                continue;
            }
            self.flags[index].finished = true;
            if self.flags[index].done {
                continue;
            }
            if !self.flags[index].prelogged {
                self.call_seqs[index] = Some(self.log_call(sink, index)?);
            }
            // A call in doubt was started: an abort does not say what it did, unless a person
            // said so (the result a resolution of a request about it gave: a recorded answer or
            // failure, an interrupted request for input), which stands as when not aborted.
            let name = &self.calls[index].name;
            let in_doubt = self.call_seqs[index].is_some() && self.flags[index].prelogged;
            let decided = if in_doubt { self.presets[index].take() } else { None };
            self.outcomes[index] =
                Some(decided.unwrap_or_else(|| if in_doubt { Outcome::outcome_unknown(name) } else { Outcome::aborted_before() }));
        }
        self.started = n;
        self.commit_ready(sink)?;
        self.ask_for_input(sink)?;
        Ok(Next::Done)
    }

    /// Whether calls of the step wait for a person: held ones (their gate asked), or ones that
    /// need input (`decision/requested {kind: "input"}` logged). The other calls have their
    /// results; the step stops there, the turn stays open.
    pub fn waits(&self) -> bool {
        self.input.as_ref().is_some_and(|state| state.waits) || self.flags.iter().any(|f| f.held)
    }

    /// Writes the requests of the calls that need input, in call order, the final one `last`.
    fn ask_for_input(&mut self, sink: &Sink<'_>) -> Result<(), CoreError> {
        let Some(state) = self.input.as_mut() else { return Ok(()) };
        let asks = std::mem::take(&mut state.asks);
        let count = asks.len();
        for (n, (index, ask)) in asks.into_iter().enumerate() {
            let call = &self.calls[index];
            let request = super::decisions::Request {
                turn: self.turn,
                step: self.step,
                decision_id: crate::ids::new_id(),
                call_id: call.id.clone(),
                index,
                name: call.name.clone(),
                digest: super::decisions::digest(&call.arguments),
                arguments: call.arguments.clone(),
                kind: super::decisions::RequestKind::Input,
                note: ask.note,
                schema: ask.schema,
                expires_at: None,
                requester: None,
            };
            super::call_decisions::request_input(sink.log, request, self.call_seq(index), ask.payload, n + 1 == count)?;
            if let Some(state) = self.input.as_mut() {
                state.waits = true;
            }
        }
        Ok(())
    }

    /// Whether call `index` has its outcome (a call finishes once; later outcomes are
    /// ignored, e.g. the cancellation of a task whose body had returned).
    pub fn is_finished(&self, index: usize) -> bool {
        self.flags.get(index).is_none_or(|f| f.finished)
    }

    /// Call `index` finished with `outcome`: it is committed as soon as every earlier call is.
    pub fn finish(&mut self, sink: &Sink<'_>, index: usize, outcome: Outcome) -> Result<(), CoreError> {
        if self.is_finished(index) {
            return Ok(());
        }
        self.flags[index].finished = true;
        self.outcomes[index] = Some(outcome);
        self.running = self.running.saturating_sub(1);
        self.exclusive_running = self.exclusive_running && self.running > 0;
        self.commit_ready(sink)
    }

    /// Call `index` failed in a way its step does not survive: it stops counting as running
    /// (the runner cancels the others and fails the step).
    pub fn abandon(&mut self, index: usize) {
        if let Some(flags) = self.flags.get_mut(index) {
            flags.finished = true;
        }
        self.running = self.running.saturating_sub(1);
        self.exclusive_running = self.exclusive_running && self.running > 0;
    }

    fn log_call(&self, sink: &Sink<'_>, index: usize) -> Result<u64, LogError> {
        let call = &self.calls[index];
        let seq = append(sink.log, events::tool_call(self.turn, self.step, &call.id, &call.name, &call.arguments, call.info))?;
        sink.history.push(sink.log, seq, None);
        Ok(seq)
    }

    fn commit_ready(&mut self, sink: &Sink<'_>) -> Result<(), CoreError> {
        while self.committed < self.calls.len() {
            if self.flags[self.committed].done || self.flags[self.committed].held {
                self.committed += 1;
                continue;
            }
            let Some(outcome) = self.outcomes[self.committed].take() else { break };
            let index = self.committed;
            self.committed += 1;
            self.concludes = self.commit(sink, index, outcome)? || self.concludes;
        }
        Ok(())
    }

    /// Logs call `index`'s result and queues its contexts; whether it concludes the turn.
    fn commit(&mut self, sink: &Sink<'_>, index: usize, mut outcome: Outcome) -> Result<bool, CoreError> {
        if let Some(ask) = outcome.input.take() {
            // No result yet: asked once the step's other calls are committed.
            self.input.get_or_insert_with(Box::default).asks.push((index, *ask));
            return Ok(false);
        }
        let call = &self.calls[index];
        let (outcome, message) = match outcome.message(&call.id) {
            Ok(message) => (outcome, message),
            Err(e) => {
                let invalid = Outcome::invalid(&call.name, "InvalidMessageError", &e.to_string());
                let message = invalid.message(&call.id).map_err(CoreError::Message)?;
                (invalid, message)
            }
        };
        let seq = append(
            sink.log,
            events::tool_result(
                self.turn,
                self.step,
                &message,
                outcome.error.as_ref(),
                outcome.meta.as_deref(),
                self.call_seqs[index],
                outcome.concludes,
            ),
        )?;
        sink.history.push_result(sink.log, seq, Arc::new(message), index);
        if outcome.bug {
            if let Some(error) = &outcome.error {
                self.raised.push(Raised { index, failure: tool_failure(call, error, &outcome.content) });
            }
        }
        for context in outcome.contexts {
            sink.inbox.append(Target::NextStep, context).map_err(CoreError::Inbox)?;
        }
        Ok(outcome.concludes)
    }
}

/// The `agent/error` failure of a tool's bug: its result text as the message, the
/// result's error, the call's id and tool.
fn tool_failure(call: &Call, error: &Value, content: &Content) -> Failure {
    let message = match content {
        Content::Text(text) => Value::String(text.clone()),
        Content::Blocks(_) => error.get("name").cloned().unwrap_or(Value::Null),
    };
    Failure::of_tool(message, error, &call.id, &call.name)
}

/// The calls an assistant message requests, in order: `(id, name, arguments)`.
pub fn requested(message: &Message) -> Vec<(String, String, String)> {
    let text = |block: &Value, key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    message
        .content()
        .iter()
        .filter(|block| BlockType::of(block) == BlockType::ToolCall)
        .map(|block| (text(block, "id"), text(block, "name"), text(block, "arguments")))
        .collect()
}

/// The first id two of `calls` share.
pub fn repeated_id(calls: &[(String, String, String)]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    calls.iter().map(|(id, _, _)| id.as_str()).find(|id| !seen.insert(*id))
}
