//! Crash closers: a log that ends inside an open turn gets deterministic closing events on
//! open (reference 2.10), so the turn structure is balanced before anything else runs.
//!
//! For each tool call of the open step's assistant messages with no result (calls, `tool/call`s
//! and results matched by id and occurrence): an error
//! `tool/result`, `TOOL_NOT_STARTED` if no `tool/call` was logged (safe to retry) or
//! `TOOL_OUTCOME_UNKNOWN` citing the call (its side effect may have happened); then `step/end`
//! if a step is open; then `turn/end {kind: "interrupted"}`. Closers reuse the last event's time.

use std::sync::Arc;

use serde_json::{json, Value};

use super::event::Surface;
use super::{Event, LogError, SessionLog};
use crate::json;
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
}

fn field_u64(data: &Value, key: &str) -> Option<u64> {
    data.get(key).and_then(Value::as_u64)
}

fn find_open_turn(events: &[Event]) -> Option<OpenTurn> {
    let start = events.iter().rposition(|e| e.kind() == "turn/start")?;
    let turn = field_u64(&events[start].data(), "turn")?;
    let mut open = OpenTurn { turn, ..OpenTurn::default() };
    for event in &events[start + 1..] {
        match event.kind() {
            "turn/end" => return None,
            "step/start" => {
                open.step = field_u64(&event.data(), "step");
                open.requested.clear();
                open.started.clear();
                open.finished.clear();
            }
            "step/end" => open.step = None,
            "assistant/message" if open.step.is_some() => {
                let data = event.data();
                let calls = data.pointer("/message/content").and_then(Value::as_array).cloned().unwrap_or_default();
                for block in calls {
                    if block.get("type").and_then(Value::as_str) == Some("tool-call") {
                        let id = block.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
                        let name = block.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
                        open.requested.push((id, name));
                    }
                }
            }
            "tool/call" if open.step.is_some() => {
                let data = event.data();
                if let Some(id) = data.get("callId").and_then(Value::as_str) {
                    open.started.push((id.to_string(), event.seq));
                }
            }
            "tool/result" if open.step.is_some() => {
                let data = event.data();
                if let Some(id) = data.pointer("/message/source/callId").and_then(Value::as_str) {
                    open.finished.push(id.to_string());
                }
            }
            _ => {}
        }
    }
    Some(open)
}

/// Appends the closers if `log` ends inside an open turn; returns how many were appended.
pub fn close_open_turn(log: &SessionLog) -> Result<usize, LogError> {
    let (open, time) = log.with_events(|events| (find_open_turn(events), events.last().map(|e| e.time)));
    let Some(open) = open else { return Ok(0) };
    let publishing = log.publishing()?;
    let commit = |kind: &str, data: String, surface: Option<Surface>| -> Result<Event, LogError> {
        publishing.publish(kind, Arc::from(data), surface, time)
    };
    let mut count = 0;
    if let Some(step) = open.step {
        // Calls are matched to their `tool/call` and `tool/result` by id and occurrence: the
        // n-th request of an id by the n-th of each (the loop refuses a reply that repeats an
        // id, but a log may hold one), so every requested call gets exactly one result.
        let mut occurrences: Vec<(&str, usize)> = Vec::new();
        for (call_id, name) in &open.requested {
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
            let (text, error_name, code) = match started {
                None => (
                    format!("Tool call {name:?} was not started before the session was interrupted; it is safe to retry."),
                    "ToolNotStartedError",
                    "TOOL_NOT_STARTED",
                ),
                Some(_) => (
                    format!(
                        "Tool call {name:?} was interrupted before its result was recorded; its side effects may or may not have happened. Do not retry blindly."
                    ),
                    "ToolOutcomeUnknownError",
                    "TOOL_OUTCOME_UNKNOWN",
                ),
            };
            let seq = log.len();
            let message = Message::tool_result(
                call_id,
                vec![json!({"type": "text", "text": text})],
                true,
                Some(format!("interrupted-tool-result-{call_id}-{seq}")),
            )
            .map_err(|e| LogError::InvalidEvent(e.to_string()))?;
            let data = format!(
                "{{\"turn\":{},\"step\":{step},\"message\":{},\"error\":{}}}",
                open.turn,
                message.json(),
                json::compact(&json!({"name": error_name, "code": code}))
            );
            let surface = match started {
                Some(call_seq) => Surface::append_citing(vec![call_seq]),
                None => Surface::append(),
            };
            commit("tool/result", data, Some(surface))?;
            count += 1;
        }
        commit("step/end", format!("{{\"turn\":{},\"step\":{step}}}", open.turn), None)?;
        count += 1;
    }
    commit("turn/end", format!("{{\"turn\":{},\"reason\":{{\"kind\":\"interrupted\"}}}}", open.turn), None)?;
    Ok(count + 1)
}
