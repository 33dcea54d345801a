//! Decisions asked for a loop other than Kerman's: a framework's tool calls that wait for a
//! person (pydantic-ai's deferred tool approvals under `KermanDurability`).
//!
//! Such a request is an ordinary `decision/requested` of kind `approval`, outside any turn
//! (`turn` and `step` 0), carrying `for`: the requester, a JSON object naming what the framework
//! will resume (`{"kind": "pydantic-ai", "run": 2}`). It is pending until one
//! `decision/resolved` with its `decisionId` follows, which [`decide`](super::decisions::decide)
//! writes as for any approval (from the owner, `FileStore.decide` or `PostgresStore.decide`); the
//! framework reads the resolutions back when it resumes. Kerman's machine never runs these calls.

use serde_json::Value;

use super::decisions::{self, request_of, resolution_of, Decide, DecideError, Decided, Request, RequestKind, Resolution, Resolved};
use super::events::{self, publish};
use crate::event_log::{Event, LogError, Publishing, SessionLog};

/// One call a framework asks a person about: its id, tool name and arguments (JSON text).
#[derive(Debug, Clone)]
pub struct ForeignCall {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

/// A foreign request as logged, with its requester and its resolution, if any.
#[derive(Debug, Clone)]
pub struct Found {
    pub request: Request,
    /// The `for` object's compact text.
    pub requester: String,
    pub resolution: Option<Resolution>,
}

/// Writes one request per call, in order, for `requester` (a JSON object; `InvalidEvent`
/// otherwise, before anything is written), the last marked `last`. The requests are written
/// under one publish token. Returns them (their `decisionId`s are new).
pub fn request(log: &SessionLog, requester: &Value, calls: &[ForeignCall]) -> Result<Vec<Request>, LogError> {
    if !requester.is_object() {
        return Err(LogError::InvalidEvent(format!(
            "a decision's requester must be a JSON object, got {}",
            crate::json::compact(requester)
        )));
    }
    let requester = crate::json::compact(requester);
    let publishing = log.publishing()?;
    let mut out = Vec::with_capacity(calls.len());
    for (index, call) in calls.iter().enumerate() {
        let request = Request {
            turn: 0,
            step: 0,
            decision_id: crate::ids::new_id(),
            call_id: call.call_id.clone(),
            index,
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            digest: decisions::digest(&call.arguments),
            kind: RequestKind::Approval,
            note: None,
            schema: None,
            expires_at: None,
        };
        publish(&publishing, events::foreign_decision_requested(&request, &requester, index + 1 == calls.len()), None)?;
        out.push(request);
    }
    Ok(out)
}

/// Every foreign request of `events`, in order, with its resolution.
pub fn requests(events: &[Event]) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for event in events {
        match event.kind() {
            events::DECISION_REQUESTED => {
                let data = event.data();
                let Some(requester) = data.get("for").filter(|v| v.is_object()) else { continue };
                if let Some(request) = request_of(&data) {
                    out.push(Found { request, requester: crate::json::compact(requester), resolution: None });
                }
            }
            events::DECISION_RESOLVED if !out.is_empty() => {
                let Some(resolution) = resolution_of(&event.data()) else { continue };
                if let Some(found) = out.iter_mut().find(|f| f.request.decision_id == resolution.decision_id && f.resolution.is_none()) {
                    found.resolution = Some(resolution);
                }
            }
            _ => {}
        }
    }
    out
}

/// The foreign request `decision_id`, if `events` hold one.
pub fn find(events: &[Event], decision_id: &str) -> Option<Found> {
    if !events.iter().any(|e| e.kind() == events::DECISION_REQUESTED) {
        return None;
    }
    requests(events).into_iter().find(|f| f.request.decision_id == decision_id)
}

/// The foreign requests of `events` waiting for a person, in order.
pub fn pending(events: &[Event]) -> Vec<Request> {
    if !events.iter().any(|e| e.kind() == events::DECISION_REQUESTED) {
        return Vec::new();
    }
    requests(events).into_iter().filter(|f| f.resolution.is_none()).map(|f| f.request).collect()
}

/// Applies a person's decision to the foreign request `found`: one `decision/resolved`, or none
/// when `key` was applied before. `ready`: no request of the same requester is still pending.
pub(super) fn decide(
    publishing: &Publishing<'_>,
    log: &SessionLog,
    found: &Found,
    decision: Decide,
    by: Option<&str>,
    key: Option<&str>,
    now: i64,
) -> Result<Decided, DecideError> {
    let decision_id = found.request.decision_id.as_str();
    let others_pending = || {
        log.with_events(requests)
            .iter()
            .any(|f| f.requester == found.requester && f.resolution.is_none() && f.request.decision_id != decision_id)
    };
    if let Some(r) = &found.resolution {
        if key.is_some() && r.key.as_deref() == key {
            return Ok(Decided { duplicate: true, ready: !others_pending() });
        }
        if r.outcome == Resolved::Expired {
            return Err(DecideError::Expired(decision_id.to_owned()));
        }
        return Err(DecideError::Resolved(decision_id.to_owned(), r.outcome));
    }
    if found.request.expires_at.is_some_and(|t| t <= now) {
        publish(publishing, events::decision_resolved(&decisions::resolution(&found.request, Resolved::Expired)), None)?;
        return Err(DecideError::Expired(decision_id.to_owned()));
    }
    let resolved = decisions::resolve_request(&found.request, decision, by, key)?;
    publish(publishing, events::decision_resolved(&resolved), None)?;
    Ok(Decided { duplicate: false, ready: !others_pending() })
}
