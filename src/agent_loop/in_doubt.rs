//! Side effects and calls in doubt (`docs/durability.md`, "Calls in doubt").
//!
//! A tool declares its [`SideEffect`] class and what happens to a call of it that is *in doubt*
//! ([`InDoubt`]): its `tool/call` write-ahead record is in the log and its `tool/result` is not
//! (the process died, the lease was lost). Both are written into the `tool/call` record, so the
//! code that handles a crashed turn (the closers a store runs when it opens a log, the resume of
//! a loop) reads the policy from the log and needs no registered tool.

use super::events;
use crate::event_log::{Event, SessionLog};

/// What running a tool does to the outside world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SideEffect {
    /// Reads only: running it again changes nothing.
    Read,
    /// Writes, but running it again with the same idempotency key has the effect of once.
    Idempotent,
    /// Writes; running it again may do it twice (the default).
    #[default]
    Write,
}

impl SideEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::Read => "read",
            SideEffect::Idempotent => "idempotent",
            SideEffect::Write => "write",
        }
    }

    pub fn parse(text: &str) -> Option<SideEffect> {
        match text {
            "read" => Some(SideEffect::Read),
            "idempotent" => Some(SideEffect::Idempotent),
            "write" => Some(SideEffect::Write),
            _ => None,
        }
    }
}

/// What becomes of a call in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InDoubt {
    /// It gets a `TOOL_OUTCOME_UNKNOWN` error result (the default; the crash closers write it).
    #[default]
    Fail,
    /// It runs again with the same idempotency key (`read` and `idempotent` tools only).
    Retry,
    /// The tool's reconcile function looks at the outside world and gives the result (or
    /// nothing: then it fails).
    Reconcile,
    /// A person decides (run again, record a result, record a failure).
    Ask,
}

impl InDoubt {
    pub fn as_str(self) -> &'static str {
        match self {
            InDoubt::Fail => "fail",
            InDoubt::Retry => "retry",
            InDoubt::Reconcile => "reconcile",
            InDoubt::Ask => "ask",
        }
    }

    pub fn parse(text: &str) -> Option<InDoubt> {
        match text {
            "fail" => Some(InDoubt::Fail),
            "retry" => Some(InDoubt::Retry),
            "reconcile" => Some(InDoubt::Reconcile),
            "ask" => Some(InDoubt::Ask),
            _ => None,
        }
    }
}

/// What the loop knows of a registered tool when it plans a call of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolInfo {
    /// It runs alone (`parallel=False`).
    pub exclusive: bool,
    pub effect: SideEffect,
    pub in_doubt: InDoubt,
}

impl ToolInfo {
    /// A tool with the defaults (`write`, `fail`) that runs alone or not.
    pub fn exclusive(exclusive: bool) -> ToolInfo {
        ToolInfo { exclusive, ..ToolInfo::default() }
    }
}

/// The idempotency key of the call whose `tool/call` is at `call_seq` in session `session`:
/// the same for every execution of that call, in any process, and different for every other
/// call (a log position is never reused).
pub fn idempotency_key(session: &str, call_seq: u64) -> String {
    format!("kerman:{session}:{call_seq}")
}

/// What the log says of one requested call of a crashed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logged {
    /// It has its `tool/result`.
    Done,
    /// No `tool/call` was logged: it never started.
    NotStarted,
    /// Its `tool/call` (at `seq`, with the arguments that ran and the tool's policy) has no
    /// result.
    InDoubt { seq: u64, arguments: String, effect: SideEffect, policy: InDoubt },
}

/// The open step of a crashed turn with a call in doubt that a resume settles (its policy is
/// not `fail`): the turn stays open (the crash closers leave it) until a loop resumes it.
#[derive(Debug, Clone)]
pub struct Crashed {
    pub turn: u64,
    pub step: u64,
    /// The step's requested calls, in order: `(id, name)` and what the log says of each.
    pub calls: Vec<(String, String, Logged)>,
}

impl Crashed {
    /// The calls in doubt, with their `tool/call` seqs and policies.
    pub fn in_doubt(&self) -> impl Iterator<Item = (&str, &str, u64, InDoubt)> {
        self.calls.iter().filter_map(|(id, name, logged)| match logged {
            Logged::InDoubt { seq, policy, .. } => Some((id.as_str(), name.as_str(), *seq, *policy)),
            _ => None,
        })
    }
}

/// Whether a resume settles a call in doubt of this policy (`ask`: once a person decided,
/// through the request the closers write, `call_decisions::request_in_doubt`).
fn settled_on_resume(policy: InDoubt) -> bool {
    matches!(policy, InDoubt::Retry | InDoubt::Reconcile | InDoubt::Ask)
}

/// Every call in doubt of the open step of `events`' last turn, whatever its policy: `None`
/// when the last turn ended, or its open step has no call in doubt, or the step is not one a
/// resume can take up (a call id repeated in it).
pub fn open_step(events: &[Event]) -> Option<Crashed> {
    let start = events.iter().rposition(|e| e.kind() == events::TURN_START)?;
    let tail = &events[start + 1..];
    // By type alone first: most logs end with their turn closed.
    if tail.iter().any(|e| e.kind() == events::TURN_END) || !tail.iter().any(|e| e.kind() == events::TOOL_CALL) {
        return None;
    }
    let turn = events::turn_of(&events[start].data())?;
    let mut step: Option<u64> = None;
    let mut calls: Vec<(String, String, Logged)> = Vec::new();
    for event in tail {
        match event.kind() {
            events::STEP_START => {
                step = events::step_of(&event.data());
                calls.clear();
            }
            events::STEP_END => {
                step = None;
                calls.clear();
            }
            events::ASSISTANT_MESSAGE if step.is_some() => {
                calls.extend(events::requested_calls(&event.data()).into_iter().map(|(id, name)| (id, name, Logged::NotStarted)));
            }
            events::TOOL_CALL if step.is_some() => {
                let data = event.data();
                let Some(id) = events::call_id(&data) else { continue };
                let (effect, policy) = events::call_policy(&data);
                let arguments = data.get("arguments").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
                if let Some(call) = calls.iter_mut().find(|(i, _, l)| i == id && *l == Logged::NotStarted) {
                    call.2 = Logged::InDoubt { seq: event.seq, arguments, effect, policy };
                }
            }
            events::TOOL_RESULT if step.is_some() => {
                let Some(id) = events::result_call_id(&event.data()).map(str::to_owned) else { continue };
                if let Some(call) = calls.iter_mut().find(|(i, _, l)| *i == id && *l != Logged::Done) {
                    call.2 = Logged::Done;
                }
            }
            _ => {}
        }
    }
    let step = step?;
    let mut ids = std::collections::HashSet::new();
    if calls.iter().any(|(id, _, _)| !ids.insert(id.as_str())) {
        return None;
    }
    let crashed = Crashed { turn, step, calls };
    let any = crashed.in_doubt().next().is_some();
    any.then_some(crashed)
}

/// The open step a resume takes up: one with a call in doubt whose policy a resume settles,
/// or about which a person was asked (`call_decisions`: a call that needs input, say).
/// A step the gate asked about is a held step's to take up (`decisions::held_step`), whatever
/// ran in it while it waited.
pub fn crashed(events: &[Event]) -> Option<Crashed> {
    open_step(events)
        .filter(|c| c.in_doubt().any(|(_, _, _, policy)| settled_on_resume(policy)) || !super::call_decisions::requests(events).is_empty())
        .filter(|_| super::decisions::held_step(events).is_none())
}

/// [`crashed`] of `log`, once no request about its calls waits for a person: the step a
/// loop can take up now.
pub fn crashed_step(log: &SessionLog) -> Option<Crashed> {
    log.with_events(|events| crashed(events).filter(|_| super::call_decisions::settled(events)))
}

/// Why [`resolve`] refused.
#[derive(Debug)]
pub enum ResolveError {
    /// The call is not in doubt: it has its result, never started, or is not a call of the
    /// open step of the last turn.
    NotInDoubt(String),
    Log(crate::event_log::LogError),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::NotInDoubt(id) => {
                write!(f, "call {id:?} is not in doubt: it has its result, never started, or is not a call of the last turn's open step")
            }
            ResolveError::Log(e) => write!(f, "{e}"),
        }
    }
}

/// An operator's answer for call `call_id` in doubt: its one `tool/result` (`text`, an error
/// result when `is_error`), citing its `tool/call`; nothing runs. When no call of the step is
/// in doubt any more for a resume to settle, the step is closed as the crash closers close
/// it. Returns the result's seq.
pub fn resolve(log: &SessionLog, call_id: &str, text: &str, is_error: bool) -> Result<u64, ResolveError> {
    let not_in_doubt = || ResolveError::NotInDoubt(call_id.to_owned());
    let open = log.with_events(open_step).ok_or_else(not_in_doubt)?;
    let seq = open.in_doubt().find(|(id, _, _, _)| *id == call_id).map(|(_, _, seq, _)| seq).ok_or_else(not_in_doubt)?;
    let message = if is_error {
        crate::message::Message::tool_result(call_id, vec![serde_json::json!({"type": "text", "text": text})], true, None)
    } else {
        Ok(crate::message::Message::tool_result_text(call_id, text))
    }
    .map_err(|e| ResolveError::Log(crate::event_log::LogError::InvalidEvent(e.to_string())))?;
    let error = is_error.then(|| super::failure::FailureCode::ToolError.tool_error("ResolvedError"));
    let event = events::tool_result(open.turn, open.step, &message, error.as_ref(), None, Some(seq), false);
    let at = events::append(log, event).map_err(ResolveError::Log)?;
    if log.with_events(crashed).is_none() {
        super::closers::close_open_turn(log).map_err(ResolveError::Log)?;
    }
    Ok(at)
}

/// Every call in doubt of `events`' last turn, whatever its policy: `(call id, tool name,
/// tool/call seq, policy)`.
pub fn list(events: &[Event]) -> Vec<(String, String, u64, InDoubt)> {
    open_step(events)
        .map(|open| open.in_doubt().map(|(id, name, seq, policy)| (id.to_owned(), name.to_owned(), seq, policy)).collect())
        .unwrap_or_default()
}
