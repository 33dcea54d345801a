//! What a resolution gives its call: the one mapping of outcomes to results, for the gate's
//! requests and for those about started calls.

use serde_json::Value;

use super::{Decide, DecideError, RequestKind, Resolution, Resolved};
use crate::agent_loop::tools::Outcome;

/// The result a resolution gives a call that does not run (denied, answered, expired,
/// cancelled); `None` for one that runs (approved, edited). The one mapping of outcomes: a step
/// resumed from the log ([`Machine::resume_held`](crate::agent_loop::Machine::resume_held)) gives it to such
/// a call, and the crash closers to such a call whose result the log lacks (the call never ran,
/// whatever `tool/call` says).
pub fn preset_outcome(resolution: &Resolution, name: &str) -> Option<Outcome> {
    match resolution.outcome {
        Resolved::Approved | Resolved::Edited => None,
        Resolved::Denied => Some(Outcome::denied(name, resolution.reason.as_deref())),
        Resolved::Answered => Some(answered(resolution.value.as_deref())),
        Resolved::Expired => Some(Outcome::expired(name)),
        Resolved::Cancelled => Some(Outcome::aborted_before()),
    }
}

/// The resolution `decision` gives a request about a started call, or why it does not fit:
/// in doubt, `Approve` runs the call again (only where the request offers `run-again`),
/// `Answer(value)` records `value` as its result and `Deny(reason)` records a failure; for
/// input, `Answer(value)` makes the call again with the value and `Deny(reason)` declines.
pub fn started_resolution(ask: &crate::agent_loop::call_decisions::CallRequest, decision: Decide) -> Result<Resolution, DecideError> {
    let request = &ask.request;
    let id = &request.decision_id;
    let mut resolved = super::resolution(request, Resolved::Approved);
    let refuse = |what: &str, offered: &str| {
        DecideError::Invalid(format!(
            "decision {id:?} is about a call {}; {what} does not answer it (it takes {offered})",
            match request.kind {
                RequestKind::Input => "that needs input",
                _ => "in doubt",
            }
        ))
    };
    let offered = match request.kind {
        RequestKind::Input => "Answer(value) or Deny(reason)",
        _ if ask.options.iter().any(|o| o == "run-again") => "Approve() to run it again, Answer(result) or Deny(reason)",
        _ => "Answer(result) or Deny(reason): running a write tool again may do it twice",
    };
    match (decision, request.kind) {
        (Decide::Approve, RequestKind::InDoubt) if ask.options.iter().any(|o| o == "run-again") => {
            resolved.digest = Some(request.digest.clone());
        }
        (Decide::Answer(value), _) => {
            resolved.outcome = Resolved::Answered;
            resolved.value = Some(crate::json::canonical(&value));
            if request.kind == RequestKind::Input {
                resolved.digest = Some(request.digest.clone());
            }
        }
        (Decide::Deny(reason), _) => {
            resolved.outcome = Resolved::Denied;
            resolved.reason = reason;
        }
        (Decide::Approve, _) => return Err(refuse("an approval", offered)),
        (Decide::Edit(_), _) => return Err(refuse("an edit", offered)),
    }
    Ok(resolved)
}

/// What a resolution of a request about a started call gives the call: `None` when it runs
/// again (in doubt and approved; input and answered), else its one result.
pub fn started_outcome(kind: RequestKind, resolution: &Resolution, name: &str) -> Option<Outcome> {
    match (kind, resolution.outcome) {
        (RequestKind::Input, Resolved::Answered) | (_, Resolved::Approved | Resolved::Edited) => None,
        (RequestKind::Input, Resolved::Denied) => Some(Outcome::denied(name, resolution.reason.as_deref())),
        (_, Resolved::Answered) => Some(answered(resolution.value.as_deref())),
        (_, Resolved::Denied) => Some(Outcome::recorded_failure(name, resolution.reason.as_deref())),
        (RequestKind::Input, Resolved::Expired) => Some(Outcome::expired(name)),
        (RequestKind::Input, Resolved::Cancelled) => Some(Outcome::aborted_during()),
        (_, Resolved::Expired | Resolved::Cancelled) => Some(Outcome::outcome_unknown(name)),
    }
}

/// The result an answer gives its call: a string as it is, any other JSON as its text.
fn answered(value: Option<&str>) -> Outcome {
    let value = value.unwrap_or("null");
    match serde_json::from_str::<Value>(value) {
        Ok(Value::String(text)) => Outcome::text(text),
        _ => Outcome::text(value),
    }
}
