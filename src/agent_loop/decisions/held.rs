//! The gate's held step: the open step of the last turn that asked, folded from the log.

use serde_json::Value;

use super::{request_of, resolution_of, Gated, Request, RequestKind, Resolution};
use crate::agent_loop::call_decisions::CallRequest;
use crate::agent_loop::events;
use crate::agent_loop::in_doubt::Logged;
use crate::event_log::{Event, SessionLog};

/// The last turn's open step that the gate asked about: no `step/end` after its assistant
/// message, and at least one gate request. Its calls that need no decision may have run (or
/// be in doubt) while it waits: `logged` says what the log holds of each.
#[derive(Debug, Clone, Default)]
pub struct HeldStep {
    pub turn: u64,
    pub step: u64,
    /// The calls of the step's assistant message: (id, name, arguments).
    pub calls: Vec<(String, String, String)>,
    /// Per call, aligned with `calls`: its result, its `tool/call` without a result, or neither.
    pub logged: Vec<Logged>,
    pub requests: Vec<Request>,
    pub resolutions: Vec<Resolution>,
    /// The gate's verdicts on the step's other calls, as its requests logged them.
    pub gated: Vec<Gated>,
}

impl HeldStep {
    pub fn resolution(&self, decision_id: &str) -> Option<&Resolution> {
        self.resolutions.iter().find(|r| r.decision_id == decision_id)
    }

    /// The requests not resolved yet, in order.
    pub fn pending(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| self.resolution(&r.decision_id).is_none()).collect()
    }

    /// Every request is resolved.
    pub fn ready(&self) -> bool {
        self.pending().is_empty()
    }

    /// Whether a resume has something to do now (what `Machine::take_up` would do): a call
    /// without a result that no pending request holds (one the gate let run, or denied, that
    /// has not started; one that started and is in doubt; once every request is resolved, a
    /// decided one), or, with every request resolved and nothing left to run, the step's end.
    /// `asked`: the open step's requests about started calls.
    pub fn actionable(&self, asked: &[(CallRequest, Option<Resolution>)]) -> bool {
        let ready = self.ready();
        let mut holding = false;
        for (index, logged) in self.logged.iter().enumerate() {
            let acts = match logged {
                Logged::Done => false,
                Logged::InDoubt { seq, .. } => !asked.iter().any(|(r, s)| r.call_seq == *seq && s.is_none()),
                Logged::NotStarted => match self.decision_for(index) {
                    Some((_, None)) => false,
                    Some((_, Some(_))) => ready,
                    None => self.gated_for(index).is_some() || ready,
                },
            };
            if acts {
                return true;
            }
            holding |= *logged != Logged::Done;
        }
        ready && !holding
    }

    /// The gate's logged verdict on call `index`, which asked no one (the latest, should the
    /// step have been gated more than once).
    pub fn gated_for(&self, index: usize) -> Option<&Gated> {
        self.gated.iter().rev().find(|g| g.index == index)
    }

    /// The last request made for call `index`, and its resolution.
    pub fn decision_for(&self, index: usize) -> Option<(&Request, Option<&Resolution>)> {
        let request = self.requests.iter().rev().find(|r| r.index == index)?;
        Some((request, self.resolution(&request.decision_id)))
    }
}

/// The calls an `assistant/message` payload requests: (id, name, arguments) in order.
fn calls_of(data: &Value) -> Vec<(String, String, String)> {
    let blocks = data.pointer("/message/content").and_then(Value::as_array);
    let field = |block: &Value, key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    blocks
        .into_iter()
        .flatten()
        .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool-call"))
        .map(|block| (field(block, "id"), field(block, "name"), field(block, "arguments")))
        .collect()
}

/// The held step of `events`' last turn, if it is one.
pub fn held_step(events: &[Event]) -> Option<HeldStep> {
    let start = events.iter().rposition(|e| e.kind() == events::TURN_START)?;
    // By type alone first: most turns asked nothing, or ended.
    let tail = &events[start + 1..];
    if !tail.iter().any(|e| e.kind() == events::DECISION_REQUESTED) || tail.iter().any(|e| e.kind() == events::TURN_END) {
        return None;
    }
    let mut held = HeldStep { turn: events::turn_of(&events[start].data())?, ..HeldStep::default() };
    let mut step_open = false;
    for event in &events[start + 1..] {
        match event.kind() {
            events::TURN_END => return None,
            events::STEP_START => {
                held.step = events::step_of(&event.data()).unwrap_or(0);
                step_open = true;
                held.calls.clear();
                held.logged.clear();
                held.requests.clear();
                held.resolutions.clear();
                held.gated.clear();
            }
            events::STEP_END => step_open = false,
            events::ASSISTANT_MESSAGE if step_open => {
                held.calls = calls_of(&event.data());
                held.logged = vec![Logged::NotStarted; held.calls.len()];
                held.requests.clear();
                held.resolutions.clear();
                held.gated.clear();
            }
            // Matched by id, the first call of that id still without a record of the kind (a
            // reply that repeats an id is refused before it is logged).
            events::TOOL_CALL if step_open => {
                let data = event.data();
                let Some(id) = events::call_id(&data) else { continue };
                let (effect, policy) = events::call_policy(&data);
                let arguments = data.get("arguments").and_then(Value::as_str).unwrap_or_default().to_owned();
                let found = held.calls.iter().zip(held.logged.iter_mut()).find(|((i, _, _), l)| i == id && **l == Logged::NotStarted);
                if let Some((_, logged)) = found {
                    *logged = Logged::InDoubt { seq: event.seq, arguments, effect, policy };
                }
            }
            events::TOOL_RESULT if step_open => {
                let data = event.data();
                let Some(id) = events::result_call_id(&data) else { continue };
                if let Some((_, logged)) =
                    held.calls.iter().zip(held.logged.iter_mut()).find(|((i, _, _), l)| i == id && **l != Logged::Done)
                {
                    *logged = Logged::Done;
                }
            }
            events::DECISION_REQUESTED if step_open => {
                let data = event.data();
                // A budget request holds no call (`budget_decisions`); one about a started call
                // (`callSeq`) is `call_decisions`'.
                if data.get("kind").and_then(Value::as_str) == Some(RequestKind::Budget.as_str()) || data.get("callSeq").is_some() {
                    continue;
                }
                held.requests.extend(request_of(&data));
                let gated = data.get("gated").and_then(Value::as_array);
                held.gated.extend(gated.into_iter().flatten().filter_map(Gated::of));
            }
            events::DECISION_RESOLVED if step_open => held.resolutions.extend(resolution_of(&event.data())),
            _ => {}
        }
    }
    (step_open && !held.requests.is_empty()).then_some(held)
}

/// The held step of `log`, if its last turn is one.
pub fn held(log: &SessionLog) -> Option<HeldStep> {
    log.with_events(held_step)
}
