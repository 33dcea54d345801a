//! Budget decisions: `Budget(ask=True)` (`docs/usage.md#budgets`, `docs/decisions.md`).
//!
//! A budget that asks does not end the turn when it stops a model request: the loop appends a
//! `decision/requested {kind: "budget"}` (no call: `name` is `budget`, `arguments` the numbers
//! that stopped it, `note` what was spent) with the step open, and the run ends waiting. An
//! approval lets that one request through; a denial, an expiry or a cancellation ends the turn
//! `budget` as a plain stop does. The stop at the claim stays a plain stop.
//!
//! What is pending, or decided, is a fold of the log ([`latest`]): the last budget request of
//! the open turn that no model request followed. A resumed loop (this process or another) reads
//! the same answer, so an approved request is not asked about twice.

use serde_json::Value;

use super::budget::Stop;
use super::decisions::{self, Request, RequestKind, Resolution};
use super::events;
use crate::event_log::{Event, LogError, SessionLog};

/// The last budget request of `events`' open turn, and its resolution, while no model request
/// followed it (no chunk, message, step boundary or `turn/end`).
pub fn latest(events: &[Event]) -> Option<(Request, Option<Resolution>)> {
    let start = events.iter().rposition(|e| e.kind() == events::TURN_START)?;
    let mut out: Option<(Request, Option<Resolution>)> = None;
    for event in &events[start + 1..] {
        match event.kind() {
            events::DECISION_REQUESTED => {
                let data = event.data();
                if data.get("kind").and_then(Value::as_str) == Some(RequestKind::Budget.as_str()) {
                    out = decisions::request_of(&data).map(|r| (r, None));
                }
            }
            events::DECISION_RESOLVED => {
                let Some(resolution) = decisions::resolution_of(&event.data()) else { continue };
                if let Some((request, slot @ None)) = out.as_mut() {
                    if request.decision_id == resolution.decision_id {
                        *slot = Some(resolution);
                    }
                }
            }
            events::ASSISTANT_CHUNK
            | events::ASSISTANT_MESSAGE
            | events::STEP_START
            | events::STEP_END
            | events::TURN_END
            | events::TURN_START => out = None,
            _ => {}
        }
    }
    out
}

/// The pending budget request of `events`, if any.
pub fn pending(events: &[Event]) -> Option<Request> {
    latest(events).filter(|(_, r)| r.is_none()).map(|(r, _)| r)
}

/// The last budget request of `log`'s open turn is resolved: the turn can be taken up.
pub fn resolved(log: &SessionLog) -> Option<(Request, Resolution)> {
    log.with_events(latest).and_then(|(r, s)| s.map(|s| (r, s)))
}

/// What a budget request tells the person: what was spent, against which limit.
fn note(stop: &Stop) -> String {
    let used = &stop.used;
    format!(
        "the budget is spent ({} {} of {} per {}; used {} tokens, {} requests, {} tool calls, ${:.4}). \
         Approve() lets this model request through, Deny(reason) ends the turn",
        stop.limit,
        stop.spent,
        stop.max,
        stop.per.as_str(),
        used.tokens,
        used.requests,
        used.tool_calls,
        used.usd
    )
}

/// Appends the request `stop` asks for, at `turn`'s open `step`.
pub fn request(log: &SessionLog, turn: u64, step: u64, stop: &Stop) -> Result<Request, LogError> {
    let arguments = crate::json::compact(&Value::Object(stop.fields()));
    let request = Request {
        turn,
        step,
        decision_id: crate::ids::new_id(),
        call_id: String::new(),
        index: 0,
        name: "budget".to_owned(),
        digest: decisions::digest(&arguments),
        arguments,
        kind: RequestKind::Budget,
        note: Some(note(stop)),
        schema: None,
        expires_at: None,
        requester: None,
    };
    events::append(log, events::decision_round(&request, true, &[]))?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_loop::budget::{At, Budget, Keeper, Per};
    use crate::agent_loop::decisions::{decide, Decide, Resolved};
    use crate::event_log::{MemoryStore, Store};
    use crate::message::{Message, MessageKind};

    fn reply(log: &SessionLog) {
        let message = Message::of_text(MessageKind::Assistant, "ok", None);
        events::append(log, events::assistant_message(1, 1, &message, false, Some(r#"{"input":5,"output":5}"#), Vec::new())).unwrap();
    }

    #[test]
    fn a_budget_request_is_pending_until_decided_and_an_approval_holds_until_a_request_is_made() {
        let log = MemoryStore::new().create(None).unwrap();
        events::append(&log, events::turn_start(1)).unwrap();
        events::append(&log, events::step_start(1, 1)).unwrap();
        reply(&log);
        let keeper = Keeper::default();
        keeper.set(Some(Budget { tokens: None, requests: Some(1), tool_calls: None, usd: None, per: Per::Session }));
        let stop = keeper.check(&log, At::Request).expect("one request of one");
        events::append(&log, events::step_end(1, 1)).unwrap();
        events::append(&log, events::step_start(1, 2)).unwrap();
        let asked = request(&log, 1, 2, &stop).unwrap();
        assert_eq!(asked.kind, RequestKind::Budget);
        let numbers: Value = serde_json::from_str(&asked.arguments).unwrap();
        assert_eq!((numbers["limit"].as_str(), numbers["spent"].as_u64(), numbers["max"].as_u64()), (Some("requests"), Some(1), Some(1)));
        assert!(asked.note.as_deref().unwrap().contains("requests 1 of 1 per session"));
        // Pending: listed with the other decisions, and not a held step of the gate.
        assert_eq!(decisions::pending(&log).iter().map(|r| r.decision_id.clone()).collect::<Vec<_>>(), vec![asked.decision_id.clone()]);
        assert!(decisions::held(&log).is_none());
        assert!(resolved(&log).is_none());
        // An answer does not fit; an approval does, once.
        assert_eq!(decide(&log, &asked.decision_id, Decide::Answer(Value::Null), None, None, 0).unwrap_err().reason(), "invalid");
        decide(&log, &asked.decision_id, Decide::Approve, Some("ann"), None, 0).unwrap();
        assert_eq!(decide(&log, &asked.decision_id, Decide::Approve, None, None, 0).unwrap_err().reason(), "resolved");
        let (_, resolution) = resolved(&log).expect("decided");
        assert_eq!((resolution.outcome, resolution.by.as_deref()), (Resolved::Approved, Some("ann")));
        assert!(decisions::pending(&log).is_empty());
        // The approval is read back by any reader of the log until the request it let through
        // is logged; after that the next stop asks again.
        assert!(log.with_events(latest).is_some());
        reply(&log);
        assert!(log.with_events(latest).is_none());
    }

    #[test]
    fn expiry_and_cancellation_resolve_a_budget_request() {
        let log = MemoryStore::new().create(None).unwrap();
        events::append(&log, events::turn_start(1)).unwrap();
        events::append(&log, events::step_start(1, 1)).unwrap();
        let keeper = Keeper::default();
        keeper.set(Some(Budget { tokens: Some(0), requests: None, tool_calls: None, usd: None, per: Per::Turn }));
        let asked = request(&log, 1, 1, &keeper.check(&log, At::Request).unwrap()).unwrap();
        assert_eq!(decisions::cancel_pending(&log).unwrap(), 1);
        let (request, resolution) = resolved(&log).unwrap();
        assert_eq!((request.decision_id, resolution.outcome), (asked.decision_id, Resolved::Cancelled));
    }
}
