//! Decisions asked for a loop other than Kerman's: a framework's tool calls that wait for a
//! person (pydantic-ai's deferred tool approvals under `KermanDurability`).
//!
//! Such a request is an ordinary `decision/requested` of kind `approval`, outside any turn
//! (`turn` and `step` 0), carrying `for`: the requester, a JSON object naming what the framework
//! will resume (`{"kind": "pydantic-ai", "run": 2}`). It is pending until one
//! `decision/resolved` with its `decisionId` follows, which [`decide`](super::decisions::decide)
//! writes as for any approval (from the owner, `FileStore.decide` or `PostgresStore.decide`); the
//! framework reads the resolutions back when it resumes. Kerman's machine never runs these calls.
//!
//! A request may carry a deadline (`expiresAt`): past it, a decision is refused and the request
//! resolved `expired`, as [`expire`](super::decisions::expire) does for whoever reads the log
//! next (a Kerman loop's timer, the framework going on). A Kerman loop's `cancel` leaves these
//! requests alone (they are not its turn's); [`cancel`] resolves them `cancelled` for the
//! framework that gave up waiting.

use serde_json::Value;

use super::decisions::{self, request_of, resolution_of, Request, RequestKind, Resolution, Resolved};
use super::events::{self, publish};
use crate::event_log::{Event, LogError, SessionLog};

/// One call a framework asks a person about: its id, tool name and arguments (JSON text), and
/// the deadline of the request (epoch milliseconds), if it has one.
#[derive(Debug, Clone)]
pub struct ForeignCall {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
    pub expires_at: Option<i64>,
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
            expires_at: call.expires_at,
            requester: Some(requester.clone()),
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

/// A foreign request found by its id: the request, its resolution (if any), and whether
/// another request of its requester still waits (the framework goes on once none does).
#[derive(Debug, Clone)]
pub struct Located {
    pub request: Request,
    pub resolution: Option<Resolution>,
    pub others_pending: bool,
}

/// The foreign request `decision_id`, if `events` hold one. Decodes only what can matter: the
/// request (the last `decision/requested` whose text names the id), its batch ([`request`]
/// writes a requester's requests together under one publish token, in order, the last marked
/// `last`, so they stand side by side), and the resolutions after it that name one of the
/// batch's ids; a decide on a long session reads the rest by type and text alone. A batch that
/// is not laid out so (a log written otherwise) is read by the whole fold.
pub fn find(events: &[Event], decision_id: &str) -> Option<Located> {
    let (at, data) = events
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, e)| e.kind() == events::DECISION_REQUESTED && e.data_json().contains(decision_id))
        .map(|(at, e)| (at, e.data()))
        .find(|(_, data)| data.get("decisionId").and_then(Value::as_str) == Some(decision_id))?;
    let requester = data.get("for").filter(|v| v.is_object())?;
    let request = request_of(&data)?;
    let Some(batch) = batch_of(events, at, &request, requester) else { return find_by_fold(events, decision_id) };
    let end = at - request.index + batch.len();
    let mut resolutions: Vec<Option<Resolution>> = vec![None; batch.len()];
    for event in &events[end..] {
        if event.kind() != events::DECISION_RESOLVED || !batch.iter().any(|r| event.data_json().contains(&r.decision_id)) {
            continue;
        }
        let Some(resolution) = resolution_of(&event.data()) else { continue };
        if let Some(slot) = batch.iter().zip(resolutions.iter_mut()).find(|(r, s)| s.is_none() && r.decision_id == resolution.decision_id) {
            *slot.1 = Some(resolution);
        }
    }
    let mine = batch.iter().position(|r| r.decision_id == decision_id)?;
    let others_pending = resolutions.iter().enumerate().any(|(i, s)| i != mine && s.is_none());
    Some(Located { request, resolution: resolutions.swap_remove(mine), others_pending })
}

/// The batch of requests `request` (at `at`) was written in, in order, when they stand side by
/// side as [`request`] writes them: from the one at index 0 to the one marked `last` (or, for a
/// batch a crash cut short, the last of them).
fn batch_of(events: &[Event], at: usize, request: &Request, requester: &Value) -> Option<Vec<Request>> {
    let first = at.checked_sub(request.index)?;
    let mut batch: Vec<Request> = Vec::new();
    for event in &events[first..] {
        if event.kind() != events::DECISION_REQUESTED {
            break;
        }
        let data = event.data();
        if data.get("for") != Some(requester) {
            break;
        }
        let sibling = request_of(&data)?;
        if sibling.index != batch.len() {
            return None;
        }
        batch.push(sibling);
        if data.get("last").and_then(Value::as_bool) == Some(true) {
            break;
        }
    }
    (batch.len() > request.index && batch[request.index].decision_id == request.decision_id).then_some(batch)
}

/// [`find`] by the whole fold.
fn find_by_fold(events: &[Event], decision_id: &str) -> Option<Located> {
    let all = requests(events);
    let found = all.iter().find(|f| f.request.decision_id == decision_id)?;
    let others_pending =
        all.iter().any(|f| f.requester == found.requester && f.resolution.is_none() && f.request.decision_id != decision_id);
    Some(Located { request: found.request.clone(), resolution: found.resolution.clone(), others_pending })
}

/// The foreign requests of `events` waiting for a person, in order.
pub fn pending(events: &[Event]) -> Vec<Request> {
    let mut fold = Waiting::default();
    fold.read(events);
    fold.requests
}

/// The foreign requests of one log waiting for a person, folded as the log grows: each look
/// reads only the events appended since the one before, so a loop that asks after every turn
/// (`waiting`, `next_expiry`, `expire`) does not read its whole log each time. A loop keeps one
/// for its log (`Shared::foreign`); the result is [`pending`]'s over the whole log.
#[derive(Debug, Default)]
pub struct Index {
    fold: std::sync::Mutex<Waiting>,
}

impl Index {
    /// The foreign requests of `log` waiting for a person, in order.
    pub fn pending(&self, log: &SessionLog) -> Vec<Request> {
        let mut fold = self.fold.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        log.with_events(|events| {
            if fold.read > events.len() {
                // Not the log it folded (a log only grows): start again.
                *fold = Waiting::default();
            }
            fold.read(events);
        });
        fold.requests.clone()
    }
}

/// The fold behind [`pending`] and [`Index`]: the requests that wait after the first `read`
/// events.
#[derive(Debug, Default)]
struct Waiting {
    read: usize,
    requests: Vec<Request>,
}

impl Waiting {
    /// Folds `events[self.read..]`: a `decision/requested` that names a requester (`for`)
    /// waits until a `decision/resolved` names it (the first waiting one with its id, as
    /// [`requests`] matches them).
    fn read(&mut self, events: &[Event]) {
        for event in &events[self.read.min(events.len())..] {
            match event.kind() {
                events::DECISION_REQUESTED => {
                    let data = event.data();
                    if data.get("for").is_some_and(Value::is_object) {
                        self.requests.extend(request_of(&data));
                    }
                }
                events::DECISION_RESOLVED if !self.requests.is_empty() => {
                    let Some(resolution) = resolution_of(&event.data()) else { continue };
                    if let Some(at) = self.requests.iter().position(|r| r.decision_id == resolution.decision_id) {
                        self.requests.remove(at);
                    }
                }
                _ => {}
            }
        }
        self.read = events.len();
    }
}

/// Resolves the pending foreign requests as `cancelled` (of `requester` only, when given: the
/// framework's run that gave up waiting); how many. Refuses a requester that is not a JSON
/// object (`InvalidEvent`), before anything is written.
pub fn cancel(log: &SessionLog, requester: Option<&Value>) -> Result<usize, LogError> {
    if let Some(value) = requester.filter(|v| !v.is_object()) {
        return Err(LogError::InvalidEvent(format!("a decision's requester must be a JSON object, got {}", crate::json::compact(value))));
    }
    let of = |found: &Found| requester.is_none_or(|r| serde_json::from_str::<Value>(&found.requester).is_ok_and(|v| v == *r));
    // The fold and the appends under one publish token: nothing resolves a request in between.
    let publishing = log.publishing()?;
    let due: Vec<Request> = log.with_events(requests).into_iter().filter(|f| f.resolution.is_none() && of(f)).map(|f| f.request).collect();
    for request in &due {
        publish(&publishing, events::decision_resolved(&decisions::resolution(request, Resolved::Cancelled)), None)?;
    }
    Ok(due.len())
}
