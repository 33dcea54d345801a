//! Decisions about a call that has already started (`docs/decisions.md#calls-that-started`).
//!
//! The gate's decisions ([`decisions`](super::decisions)) hold a step before any of its calls
//! runs. These hold a call whose `tool/call` is logged and whose `tool/result` is not:
//!
//! - **in doubt** (`kind: "in-doubt"`): the call's tool has `on_in_doubt="ask"` and its process
//!   died (or lost the session) while it ran. The crash closers ask ([`request_in_doubt`]) and
//!   leave the turn open; a person runs it again (`Approve`, offered only where a retry is
//!   allowed: `read` and `idempotent` tools), records a result (`Answer`) or records a failure
//!   (`Deny`).
//! - **input** (`kind: "input"`): the call's tool said it needs input first (an MCP server's
//!   input-required result). The step's other calls finish, the turn waits; an `Answer` (checked
//!   against the request's schema) makes the call run again with the answer and the request's
//!   `payload` (the server's state token), a `Deny` declines.
//!
//! A request names its call by `callSeq`, the seq of the call's `tool/call`: the call runs again
//! under that record (same idempotency key), and exactly one `tool/result` ends it. What is
//! pending is a fold of the log ([`requests`]), so any process that opens the session finds it.

use serde_json::Value;

use super::decisions::{self, Request, RequestKind, Resolution};
use super::events::{self, publish};
use super::in_doubt::{self, InDoubt, Logged, SideEffect};
use crate::event_log::{Event, LogError, SessionLog};

/// What an in-doubt request offers: `run-again` only for a tool whose effect class allows a
/// retry (running a `write` tool again may do it twice).
pub fn in_doubt_options(effect: SideEffect) -> Vec<&'static str> {
    match effect {
        SideEffect::Read | SideEffect::Idempotent => vec!["run-again", "record-result", "record-failure"],
        SideEffect::Write => vec!["record-result", "record-failure"],
    }
}

/// What an in-doubt request tells the person.
fn in_doubt_note(name: &str, effect: SideEffect) -> String {
    let offered = match effect {
        SideEffect::Read | SideEffect::Idempotent => {
            "Approve() runs it again with the same idempotency key, Answer(result) records its result, Deny(reason) records a failure"
        }
        SideEffect::Write => {
            "Answer(result) records its result, Deny(reason) records a failure (a write tool is not run again: it may do it twice)"
        }
    };
    format!(
        "tool call {} was running when its process stopped; its side effects may or may not have happened. {offered}",
        super::tools::py_repr(name)
    )
}

/// One `decision/requested` about a started call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRequest {
    pub request: Request,
    /// The seq of the call's `tool/call`.
    pub call_seq: u64,
    /// What the person may choose (`run-again`, `record-result`, `record-failure`; `answer`,
    /// `decline` for input).
    pub options: Vec<String>,
    /// The tool's opaque data for the call made again (JSON text): an MCP server's input
    /// requests and state token.
    pub payload: Option<String>,
}

fn call_request_of(data: &Value) -> Option<CallRequest> {
    let call_seq = data.get("callSeq")?.as_u64()?;
    let options =
        data.get("options").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
    Some(CallRequest { request: decisions::request_of(data)?, call_seq, options, payload: data.get("payload").map(crate::json::compact) })
}

/// Every request about a started call of the open step of `events`' last turn, in log order,
/// with its resolution. Empty when the last turn ended.
pub fn requests(events: &[Event]) -> Vec<(CallRequest, Option<Resolution>)> {
    let Some(start) = events.iter().rposition(|e| e.kind() == events::TURN_START) else { return Vec::new() };
    let tail = &events[start + 1..];
    // By type alone first: most turns asked nothing about a started call.
    if !tail.iter().any(|e| e.kind() == events::DECISION_REQUESTED) || tail.iter().any(|e| e.kind() == events::TURN_END) {
        return Vec::new();
    }
    let mut out: Vec<(CallRequest, Option<Resolution>)> = Vec::new();
    for event in tail {
        match event.kind() {
            events::STEP_START => out.clear(),
            events::DECISION_REQUESTED => out.extend(call_request_of(&event.data()).map(|r| (r, None))),
            events::TOOL_RESULT => {
                // A call with its result needs no decision any more (an operator's `resolve`).
                if let Some(id) = events::result_call_id(&event.data()) {
                    out.retain(|(r, _)| r.request.call_id != id);
                }
            }
            events::DECISION_RESOLVED => {
                let Some(resolution) = decisions::resolution_of(&event.data()) else { continue };
                if let Some(slot) = out.iter_mut().find(|(r, s)| s.is_none() && r.request.decision_id == resolution.decision_id) {
                    slot.1 = Some(resolution);
                }
            }
            _ => {}
        }
    }
    out
}

/// The requests about started calls that wait for a person, in order.
pub fn pending(events: &[Event]) -> Vec<CallRequest> {
    requests(events).into_iter().filter(|(_, r)| r.is_none()).map(|(r, _)| r).collect()
}

/// The last request about the call whose `tool/call` is at `call_seq`, and its resolution.
pub fn latest_for(events: &[Event], call_seq: u64) -> Option<(CallRequest, Option<Resolution>)> {
    requests(events).into_iter().rev().find(|(r, _)| r.call_seq == call_seq)
}

/// Asks a person about every call in doubt of the open step whose policy is `ask` and that has
/// no request yet: one `decision/requested {kind: "in-doubt"}` each, the final one `last`.
/// The crash closers run it before they look at the turn, so the request is in the log as
/// soon as any process opens the session. Returns how many were appended.
pub fn request_in_doubt(log: &SessionLog) -> Result<usize, LogError> {
    let publishing = log.publishing()?;
    let (asks, time) = log.with_events(|events| {
        let time = events.last().map(|e| e.time);
        let Some(open) = in_doubt::open_step(events) else { return (Vec::new(), time) };
        let asked = requests(events);
        let asks: Vec<CallRequest> = open
            .calls
            .iter()
            .enumerate()
            .filter_map(|(index, (call_id, name, logged))| match logged {
                Logged::InDoubt { seq, arguments, effect, policy: InDoubt::Ask } if !asked.iter().any(|(r, _)| r.call_seq == *seq) => {
                    Some(CallRequest {
                        request: Request {
                            turn: open.turn,
                            step: open.step,
                            decision_id: crate::ids::new_id(),
                            call_id: call_id.clone(),
                            index,
                            name: name.clone(),
                            digest: decisions::digest(arguments),
                            arguments: arguments.clone(),
                            kind: RequestKind::InDoubt,
                            note: Some(in_doubt_note(name, *effect)),
                            schema: None,
                            expires_at: None,
                            requester: None,
                        },
                        call_seq: *seq,
                        options: in_doubt_options(*effect).into_iter().map(str::to_owned).collect(),
                        payload: None,
                    })
                }
                _ => None,
            })
            .collect();
        (asks, time)
    });
    let count = asks.len();
    for (n, ask) in asks.iter().enumerate() {
        publish(&publishing, events::call_decision_requested(ask, n + 1 == count), time)?;
    }
    Ok(count)
}

/// Asks a person for the input call `call_seq` needs (its tool said so): one
/// `decision/requested {kind: "input"}` with the tool's `note` (the server's message), `schema`
/// (the answer's JSON Schema) and `payload`.
pub fn request_input(
    log: &SessionLog,
    request: Request,
    call_seq: u64,
    payload: Option<String>,
    last: bool,
) -> Result<CallRequest, LogError> {
    let ask = CallRequest { request, call_seq, options: vec!["answer".to_owned(), "decline".to_owned()], payload };
    events::append(log, events::call_decision_requested(&ask, last))?;
    Ok(ask)
}

/// The open step's requests about started calls are all resolved (or there are none).
pub fn settled(events: &[Event]) -> bool {
    requests(events).iter().all(|(_, r)| r.is_some())
}
