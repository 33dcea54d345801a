//! Operations other processes staged for this session's owner (`PostgresStore.cancel`,
//! `.replace`, `.remove`, `.requeue`, `.decide`, `.resolve`), applied in order with the staged messages
//! around them. Replace and remove are inbox mutations, applied here; a cancel, a requeue, a
//! decision and a resolve need the loop (a requeue reads the turns it recorded and wakes it; a decision is
//! applied by the loop's own `decide` and resumes its step), which the listener reaches. Each
//! gives an outcome (a JSON object) for its requester.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{Inbox, InboxError};
use crate::event_log::{StagedInput, StagedOp, SPLICED};
use crate::message::{BlockType, Message, MessageKind};

/// What applying an operation came to: an outcome for the requester, or a failure of the
/// inbox or its log that leaves the operation staged (for this owner's next read or the next
/// owner), as a failed insertion leaves its message.
pub(super) enum Applied {
    Outcome(Value),
    Stop,
}

fn refused(op: StagedOp, reason: &str, detail: String) -> Applied {
    Applied::Outcome(json!({"applied": false, "op": op.as_str(), "reason": reason, "detail": Value::String(detail)}))
}

impl Inbox {
    pub(super) fn apply_staged_op(&self, row: &StagedInput) -> Applied {
        let op = row.op;
        let args: Value = match serde_json::from_str(&row.message) {
            Ok(args @ Value::Object(_)) => args,
            _ => return refused(op, "invalid", format!("operation {}: its arguments are not a JSON object", row.id)),
        };
        match op {
            StagedOp::Cancel => {
                let cause = args.get("cause").cloned().unwrap_or(Value::Null);
                let keep_inbox = args.get("keep_inbox").and_then(Value::as_bool).unwrap_or(false);
                return self.to_loop(op, |listener| listener.cancel(&cause, keep_inbox));
            }
            StagedOp::Requeue => {
                let turn = match args.get("turn") {
                    Some(Value::Number(n)) if n.as_u64().is_some_and(|t| t >= 1) => n.as_u64().unwrap_or_default(),
                    other => {
                        let got = other.map_or("nothing".to_string(), Value::to_string);
                        return refused(op, "invalid", format!("operation {}: \"turn\" must be a turn number (from 1), got {got}", row.id));
                    }
                };
                return self.to_loop(op, |listener| listener.requeue(turn));
            }
            StagedOp::Decide => {
                if !args.get("decision_id").is_some_and(Value::is_string) {
                    return refused(op, "invalid", format!("operation {}: no \"decision_id\"", row.id));
                }
                if !args.get("outcome").and_then(|o| o.get("kind")).is_some_and(Value::is_string) {
                    return refused(op, "invalid", format!("operation {}: no \"outcome\" with a \"kind\"", row.id));
                }
                return self.to_loop(op, |listener| listener.decide(&args));
            }
            StagedOp::Resolve => {
                if !args.get("call_id").is_some_and(Value::is_string) || !args.get("text").is_some_and(Value::is_string) {
                    return refused(op, "invalid", format!("operation {}: no \"call_id\" and \"text\"", row.id));
                }
                return self.to_loop(op, |listener| listener.resolve(&args));
            }
            _ => {}
        }
        let Some(id) = args.get("message_id").and_then(Value::as_str) else {
            return refused(op, "invalid", format!("operation {}: no \"message_id\"", row.id));
        };
        let result = match op {
            StagedOp::Remove => self.remove_message(id).map(|old| old.map(|m| json!({"removed": m.to_value()}))),
            _ => {
                let Some(current) = self.get(id) else { return self.not_pending(op, id) };
                let new = match replacement(&current, &args) {
                    Ok(new) => new,
                    Err(applied) => return applied,
                };
                self.replace_admitted(id, Arc::new(new)).map(|r| r.map(|(_, new)| json!({"message": new.to_value()})))
            }
        };
        match result {
            Ok(Some(Value::Object(mut changed))) => {
                changed.insert("applied".into(), Value::Bool(true));
                changed.insert("op".into(), op.as_str().into());
                changed.insert("message_id".into(), id.into());
                Applied::Outcome(Value::Object(changed))
            }
            Ok(_) => self.not_pending(op, id),
            Err(InboxError::Log(_) | InboxError::Closed(_)) => Applied::Stop,
            Err(InboxError::Refused(refusal)) => refused(op, "refused", refusal.to_string()),
            Err(e) => refused(op, "invalid", e.to_string()),
        }
    }

    /// Hands `op` to the session's loop through the listener; refused when there is none.
    fn to_loop(&self, op: StagedOp, apply: impl FnOnce(&dyn super::InboxListener) -> Option<Value>) -> Applied {
        match self.shared.listener.as_deref().and_then(apply) {
            Some(outcome) => Applied::Outcome(outcome),
            None => refused(op, "no-loop", format!("the session's owner has no AgentLoop over its inbox to {}", op.as_str())),
        }
    }

    /// Why message `id` cannot be changed: it was queued and is no longer (claimed by a turn,
    /// or removed), or it never was.
    fn not_pending(&self, op: StagedOp, id: &str) -> Applied {
        let mentions = |data: &str| crate::json::may_hold_string(data, id);
        let logged = self.shared.log.with_events(|events| {
            events
                .iter()
                .filter(|e| e.kind() == SPLICED && mentions(e.data_json()))
                .any(|e| crate::event_log::inserted_ids(e.data_json()).iter().any(|i| i == id))
        });
        let session = self.shared.log.id();
        match logged {
            true => refused(
                op,
                "not-queued",
                format!("message \"{id}\" is no longer queued in session \"{session}\": it was claimed by a turn or removed"),
            ),
            false => refused(op, "message-not-found", format!("no message \"{id}\" was queued in session \"{session}\"")),
        }
    }
}

/// The message replacing `current`: `{"text": …}` keeps its id and everything but the content
/// (a message holding anything but text cannot be edited so); `{"message": {…}}` replaces it whole.
fn replacement(current: &Message, args: &Value) -> Result<Message, Applied> {
    let op = StagedOp::Replace;
    if let Some(text) = args.get("text").and_then(Value::as_str) {
        if current.content().iter().any(|block| BlockType::of(block) != BlockType::Text) {
            return Err(refused(
                op,
                "not-text",
                format!("message \"{}\" holds more than text; only text messages can be edited", current.id()),
            ));
        }
        return current.with_content(vec![json!({"type": "text", "text": text})]).map_err(|e| refused(op, "invalid", e.to_string()));
    }
    let Some(value) = args.get("message") else {
        return Err(refused(op, "invalid", "a replacement needs \"text\" or \"message\"".into()));
    };
    match Message::from_value(value) {
        Ok(message) if message.kind() == MessageKind::User => Ok(message),
        Ok(message) => {
            Err(refused(op, "invalid", format!("message \"{}\" is not a user message; only user messages can be queued", message.id())))
        }
        Err(e) => Err(refused(op, "invalid", e.to_string())),
    }
}
