//! Crash closers: a log that ends inside an open turn gets deterministic closing events on
//! open (reference 2.10), so the turn structure is balanced before anything else runs.
//!
//! For each tool call of the open step's assistant messages with no result (calls, `tool/call`s
//! and results matched by id and occurrence): an error
//! `tool/result`, `TOOL_NOT_STARTED` if no `tool/call` was logged (safe to retry) or
//! `TOOL_OUTCOME_UNKNOWN` citing the call (its side effect may have happened); then `step/end`
//! if a step is open; then `turn/end {kind: "interrupted"}`. Closers reuse the last event's time.
//! A call a person decided not to run (denied, answered, expired, cancelled: `decision/resolved`
//! in the step) never ran, whatever its `tool/call` says: it gets what was decided, as the
//! resumed step would have given it.

use serde_json::json;

use super::decisions::{self, Request, Resolution};
use super::ending::Ending;
use super::events::{self, publish, LoopEvent};
use super::failure::FailureCode;
use crate::event_log::{Event, LogError, OpenHook, SessionLog};
use crate::message::Message;

/// What the tail of a log says about its last turn.
#[derive(Default)]
struct OpenTurn {
    turn: u64,
    step: Option<u64>,
    /// Tool calls requested by assistant messages of the open step, in order: (id, name).
    requested: Vec<(String, String)>,
    /// `tool/call` seqs by call id, in the open step.
    started: Vec<(String, u64)>,
    finished: Vec<String>,
    /// The open step's `decision/requested` and `decision/resolved`, in log order.
    requests: Vec<Request>,
    resolutions: Vec<Resolution>,
}

impl OpenTurn {
    /// What a person decided for call `index` of the step (`call_id`), when it does not run:
    /// the last request for that position naming that call, and its resolution.
    fn decided_not_to_run(&self, index: usize, call_id: &str, name: &str) -> Option<super::tools::Outcome> {
        let request = self.requests.iter().rev().find(|r| r.index == index && r.call_id == call_id)?;
        let resolution = self.resolutions.iter().find(|r| r.decision_id == request.decision_id)?;
        decisions::preset_outcome(resolution, name)
    }
}

fn find_open_turn(events: &[Event]) -> Option<OpenTurn> {
    let start = events.iter().rposition(|e| e.kind() == events::TURN_START)?;
    let turn = events::turn_of(&events[start].data())?;
    let mut open = OpenTurn { turn, ..OpenTurn::default() };
    for event in &events[start + 1..] {
        match event.kind() {
            events::TURN_END => return None,
            events::STEP_START => {
                open.step = events::step_of(&event.data());
                open.requested.clear();
                open.started.clear();
                open.finished.clear();
                open.requests.clear();
                open.resolutions.clear();
            }
            events::STEP_END => open.step = None,
            events::ASSISTANT_MESSAGE if open.step.is_some() => open.requested.extend(events::requested_calls(&event.data())),
            events::DECISION_REQUESTED if open.step.is_some() => open.requests.extend(decisions::request_of(&event.data())),
            events::DECISION_RESOLVED if open.step.is_some() => open.resolutions.extend(decisions::resolution_of(&event.data())),
            events::TOOL_CALL if open.step.is_some() => {
                if let Some(id) = events::call_id(&event.data()) {
                    open.started.push((id.to_string(), event.seq));
                }
            }
            events::TOOL_RESULT if open.step.is_some() => {
                if let Some(id) = events::result_call_id(&event.data()) {
                    open.finished.push(id.to_string());
                }
            }
            _ => {}
        }
    }
    Some(open)
}

/// The closers as a store's open hook: whoever builds the loop installs this on its stores
/// (`with_open_hook`), so every log they open starts with its turns balanced.
pub fn crash_closers() -> OpenHook {
    std::sync::Arc::new(|log: &SessionLog| Ok(super::call_decisions::request_in_doubt(log)? + close_open_turn(log)?))
}

/// Appends the closers if `log` ends inside an open turn; returns how many were appended.
pub fn close_open_turn(log: &SessionLog) -> Result<usize, LogError> {
    // A turn whose step stopped at its decisions stays open: a decision resumes it.
    let (open, time) = log.with_events(|events| {
        // So does one whose open step has a call in doubt that a resume settles (its policy is
        // `retry` or `reconcile`): the loop that resumes the session takes it up.
        // And one whose budget asked a person (`budget_decisions`): a decision takes it up.
        let open = find_open_turn(events).filter(|_| {
            super::decisions::held_step(events).is_none()
                && super::in_doubt::crashed(events).is_none()
                && super::budget_decisions::latest(events).is_none()
        });
        (open, events.last().map(|e| e.time))
    });
    let Some(open) = open else { return Ok(0) };
    let publishing = log.publishing()?;
    let commit = |event: LoopEvent| -> Result<Event, LogError> { publish(&publishing, event, time) };
    let mut count = 0;
    if let Some(step) = open.step {
        // Calls are matched to their `tool/call` and `tool/result` by id and occurrence: the
        // n-th request of an id by the n-th of each (the loop refuses a reply that repeats an
        // id, but a log may hold one), so every requested call gets exactly one result.
        let mut occurrences: Vec<(&str, usize)> = Vec::new();
        for (index, (call_id, name)) in open.requested.iter().enumerate() {
            let nth = match occurrences.iter_mut().find(|(id, _)| *id == call_id.as_str()) {
                Some((_, n)) => {
                    *n += 1;
                    *n - 1
                }
                None => {
                    occurrences.push((call_id.as_str(), 1));
                    0
                }
            };
            if open.finished.iter().filter(|id| *id == call_id).count() > nth {
                continue;
            }
            let started = open.started.iter().filter(|(id, _)| id == call_id).nth(nth).map(|(_, seq)| *seq);
            let seq = log.len();
            let id = Some(format!("interrupted-tool-result-{call_id}-{seq}"));
            if let Some(outcome) = open.decided_not_to_run(index, call_id, name) {
                let content = match &outcome.content {
                    super::tools::Content::Text(text) => vec![json!({"type": "text", "text": text})],
                    super::tools::Content::Blocks(blocks) => blocks.clone(),
                };
                let message =
                    Message::tool_result(call_id, content, outcome.is_error, id).map_err(|e| LogError::InvalidEvent(e.to_string()))?;
                commit(events::tool_result(open.turn, step, &message, outcome.error.as_ref(), None, started, false))?;
                count += 1;
                continue;
            }
            let (text, error_name, code) = match started {
                None => (
                    format!("Tool call {name:?} was not started before the session was interrupted; it is safe to retry."),
                    "ToolNotStartedError",
                    FailureCode::ToolNotStarted,
                ),
                Some(_) => (
                    format!(
                        "Tool call {name:?} was interrupted before its result was recorded; its side effects may or may not have happened. Do not retry blindly."
                    ),
                    "ToolOutcomeUnknownError",
                    FailureCode::ToolOutcomeUnknown,
                ),
            };
            let message = Message::tool_result(call_id, vec![json!({"type": "text", "text": text})], true, id)
                .map_err(|e| LogError::InvalidEvent(e.to_string()))?;
            commit(events::tool_result(open.turn, step, &message, Some(&code.tool_error(error_name)), None, started, false))?;
            count += 1;
        }
        commit(events::step_end(open.turn, step))?;
        count += 1;
    }
    commit(events::turn_end(open.turn, &Ending::Interrupted))?;
    Ok(count + 1)
}
