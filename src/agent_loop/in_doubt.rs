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

/// Whether a resume settles a call in doubt of this policy (`ask` is not settled yet: the
/// closers fail it, as `fail`).
fn settled_on_resume(policy: InDoubt) -> bool {
    matches!(policy, InDoubt::Retry | InDoubt::Reconcile)
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

/// The open step a resume takes up: one with a call in doubt whose policy a resume settles.
pub fn crashed(events: &[Event]) -> Option<Crashed> {
    open_step(events).filter(|c| c.in_doubt().any(|(_, _, _, policy)| settled_on_resume(policy)))
}

/// [`crashed`] of `log`.
pub fn crashed_step(log: &SessionLog) -> Option<Crashed> {
    log.with_events(crashed)
}
