//! Deciding: the one rule every request is decided by ([`apply`]), what is pending, and
//! resolving what is left (`expired`, `cancelled`).

use super::{held, resolution, resolution_of, Decide, DecideError, Decided, Request, RequestKind, Resolution, Resolved};
use crate::agent_loop::events::{self, publish};
use crate::agent_loop::{budget_decisions, call_decisions, foreign_decisions};
use crate::event_log::{LogError, Publishing, SessionLog};

/// The requests of `log` waiting for a decision, in order.
pub fn pending(log: &SessionLog) -> Vec<Request> {
    pending_with(log, &foreign_decisions::Index::default())
}

/// [`pending`], another framework's requests read through `foreign`, the index a loop keeps
/// for its log (the others are read from the last turn only).
pub fn pending_with(log: &SessionLog, foreign: &foreign_decisions::Index) -> Vec<Request> {
    let mut out = own_pending(log);
    out.extend(foreign.pending(log));
    out
}

/// The loop's own requests of `log` waiting for a decision, in order: its last turn's (the
/// gate's, about calls in doubt, about the budget), without another framework's. A loop waits
/// for these alone: a request with a requester (`for`) is that framework's to wait for, and a
/// loop that counted it would wait for a decision its turns never take up.
pub fn own_pending(log: &SessionLog) -> Vec<Request> {
    let mut out: Vec<Request> = held(log).map(|held| held.pending().into_iter().cloned().collect()).unwrap_or_default();
    out.extend(log.with_events(call_decisions::pending).into_iter().map(|r| r.request));
    out.extend(log.with_events(budget_decisions::pending));
    out
}

/// The earliest deadline of a pending request.
pub fn next_expiry(log: &SessionLog) -> Option<i64> {
    next_expiry_with(log, &foreign_decisions::Index::default())
}

/// [`next_expiry`] through a loop's index ([`pending_with`]).
pub fn next_expiry_with(log: &SessionLog, foreign: &foreign_decisions::Index) -> Option<i64> {
    pending_with(log, foreign).iter().filter_map(|r| r.expires_at).min()
}

/// Resolves every pending request whose deadline is at or before `now` as `expired` (another
/// framework's too: a deadline is a deadline, whoever reads the log); how many.
pub fn expire(log: &SessionLog, now: i64) -> Result<usize, LogError> {
    expire_with(log, &foreign_decisions::Index::default(), now)
}

/// [`expire`] through a loop's index ([`pending_with`]).
pub fn expire_with(log: &SessionLog, foreign: &foreign_decisions::Index, now: i64) -> Result<usize, LogError> {
    resolve_all(log, Resolved::Expired, |r| r.expires_at.is_some_and(|t| t <= now), Some(foreign))
}

/// Resolves every pending request of the loop as `cancelled` (`loop.cancel()` while waiting);
/// how many. Another framework's requests are its own to cancel
/// ([`foreign_decisions::cancel`]).
pub fn cancel_pending(log: &SessionLog) -> Result<usize, LogError> {
    resolve_all(log, Resolved::Cancelled, |_| true, None)
}

fn resolve_all(
    log: &SessionLog,
    outcome: Resolved,
    due: impl Fn(&Request) -> bool,
    foreign: Option<&foreign_decisions::Index>,
) -> Result<usize, LogError> {
    // The fold and the appends under one publish token: nothing resolves a request in between.
    let publishing = log.publishing()?;
    let mut due_now: Vec<Request> =
        held(log).map(|held| held.pending().into_iter().filter(|r| due(r)).cloned().collect()).unwrap_or_default();
    due_now.extend(log.with_events(call_decisions::pending).into_iter().map(|ask| ask.request).filter(|r| due(r)));
    due_now.extend(log.with_events(budget_decisions::pending).filter(|r| due(r)));
    if let Some(foreign) = foreign {
        due_now.extend(foreign.pending(log).into_iter().filter(|r| due(r)));
    }
    for request in &due_now {
        publish(&publishing, events::decision_resolved(&resolution(request, outcome)), None)?;
    }
    Ok(due_now.len())
}

/// Why a request resolved as `outcome` refuses a decision.
fn refused(decision_id: &str, outcome: Resolved) -> DecideError {
    match outcome {
        Resolved::Expired => DecideError::Expired(decision_id.to_owned()),
        outcome => DecideError::Resolved(decision_id.to_owned(), outcome),
    }
}

/// The rule of deciding `request`, whoever asked it, found in the log with its resolution
/// `resolved` (if any), under the publish token: resolved already → a duplicate when `key` is
/// the one it was resolved with (nothing appended), else refused (`Expired` or `Resolved`);
/// past its deadline at `now` → resolved `expired` (appended) and refused; otherwise
/// `resolve()` (the request kind's reading of the decision, which may refuse it as `Invalid`),
/// signed with `by` and `key`, is appended. `others_pending`: whether another request that
/// must be decided before the asker goes on still waits.
#[allow(clippy::too_many_arguments)] // the request, its state, the decision's signature, the clock and the two readings
pub(crate) fn apply(
    publishing: &Publishing<'_>,
    request: &Request,
    resolved: Option<&Resolution>,
    by: Option<&str>,
    key: Option<&str>,
    now: i64,
    resolve: impl FnOnce() -> Result<Resolution, DecideError>,
    others_pending: impl FnOnce() -> bool,
) -> Result<Decided, DecideError> {
    if let Some(r) = resolved {
        if key.is_some() && r.key.as_deref() == key {
            return Ok(Decided { duplicate: true, ready: !others_pending() });
        }
        return Err(refused(&request.decision_id, r.outcome));
    }
    if request.expires_at.is_some_and(|t| t <= now) {
        publish(publishing, events::decision_resolved(&resolution(request, Resolved::Expired)), None)?;
        return Err(DecideError::Expired(request.decision_id.clone()));
    }
    let mut resolution = resolve()?;
    resolution.by = by.map(str::to_owned);
    resolution.key = key.map(str::to_owned);
    publish(publishing, events::decision_resolved(&resolution), None)?;
    Ok(Decided { duplicate: false, ready: !others_pending() })
}

/// Applies a person's decision to request `decision_id` (checking its deadline against `now`
/// first): exactly one `decision/resolved`, or none when `key` was applied before.
pub fn decide(
    log: &SessionLog,
    decision_id: &str,
    decision: Decide,
    by: Option<&str>,
    key: Option<&str>,
    now: i64,
) -> Result<Decided, DecideError> {
    let publishing = log.publishing()?;
    let held = held(log);
    let started = log.with_events(call_decisions::requests);
    if let Some((ask, resolved)) = started.iter().find(|(r, _)| r.request.decision_id == decision_id) {
        let others = || started.iter().any(|(r, s)| s.is_none() && r.request.decision_id != decision_id);
        return apply(&publishing, &ask.request, resolved.as_ref(), by, key, now, || super::started_resolution(ask, decision), others);
    }
    if let Some(found) = log.with_events(|all| foreign_decisions::find(all, decision_id)) {
        let others = || found.others_pending;
        return apply(
            &publishing,
            &found.request,
            found.resolution.as_ref(),
            by,
            key,
            now,
            || resolve_request(&found.request, decision),
            others,
        );
    }
    if let Some((request, None)) = log.with_events(budget_decisions::latest).filter(|(r, _)| r.decision_id == decision_id) {
        return apply(&publishing, &request, None, by, key, now, || budget_resolution(&request, decision), || false);
    }
    let found = held.as_ref().and_then(|h| Some((h, h.requests.iter().find(|r| r.decision_id == decision_id)?)));
    let Some((held, request)) = found else {
        // Not in the held step: resolved in an earlier turn, or never requested.
        let earlier = log.with_events(|all| {
            all.iter()
                .rev()
                .filter(|e| e.kind() == events::DECISION_RESOLVED)
                .filter_map(|e| resolution_of(&e.data()))
                .find(|r| r.decision_id == decision_id)
        });
        return match earlier {
            Some(r) if key.is_some() && r.key.as_deref() == key => Ok(Decided { duplicate: true, ready: false }),
            Some(r) => Err(refused(decision_id, r.outcome)),
            None => Err(DecideError::Unknown(decision_id.to_owned())),
        };
    };
    let others = || held.pending().iter().any(|r| r.decision_id != decision_id);
    apply(&publishing, request, held.resolution(decision_id), by, key, now, || resolve_request(request, decision), others)
}

/// A budget request's reading of a decision: `Approve` lets the stopped model request through,
/// `Deny` ends the turn; nothing else fits.
fn budget_resolution(request: &Request, decision: Decide) -> Result<Resolution, DecideError> {
    let mut resolved = resolution(request, Resolved::Approved);
    match decision {
        Decide::Approve => resolved.digest = Some(request.digest.clone()),
        Decide::Deny(reason) => {
            resolved.outcome = Resolved::Denied;
            resolved.reason = reason;
        }
        Decide::Edit(_) | Decide::Answer(_) => {
            return Err(DecideError::Invalid(format!(
                "decision {:?} asks whether to spend past the budget; it takes Approve() or Deny(reason)",
                request.decision_id
            )));
        }
    }
    Ok(resolved)
}

/// The resolution of `request` (an approval or a question of the gate's, or another
/// framework's approval) by a person's `decision`, refused when it does not fit the request's
/// kind.
pub(crate) fn resolve_request(request: &Request, decision: Decide) -> Result<Resolution, DecideError> {
    let decision_id = request.decision_id.as_str();
    let mut resolved = resolution(request, Resolved::Approved);
    let kind = request.kind;
    let refuse =
        |what: &str| DecideError::Invalid(format!("decision {decision_id:?} asks for {}; {what} does not answer it", kind.as_str()));
    match (decision, kind) {
        (Decide::Approve, RequestKind::Approval) => resolved.digest = Some(request.digest.clone()),
        (Decide::Edit(arguments), RequestKind::Approval) => {
            if !arguments.is_object() {
                return Err(DecideError::Invalid(format!(
                    "edited arguments must be a JSON object, got {}",
                    crate::json::compact(&arguments)
                )));
            }
            let text = crate::json::canonical(&arguments);
            resolved.outcome = Resolved::Edited;
            resolved.digest = Some(super::digest(&text));
            resolved.arguments = Some(text);
        }
        (Decide::Answer(value), RequestKind::Answer) => {
            resolved.outcome = Resolved::Answered;
            resolved.value = Some(crate::json::canonical(&value));
        }
        (Decide::Deny(reason), _) => {
            resolved.outcome = Resolved::Denied;
            resolved.reason = reason;
        }
        (Decide::Approve, _) => return Err(refuse("an approval")),
        (Decide::Edit(_), _) => return Err(refuse("an edit")),
        (Decide::Answer(_), _) => return Err(refuse("an answer")),
    }
    Ok(resolved)
}
