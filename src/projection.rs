//! Pure folds over log events, for UIs, reconnects and accounting (reference section 4).

use std::sync::Arc;

use serde_json::Value;

use crate::event_log::{Event, SPLICED};
use crate::inbox::{placement, Lists, ProjectionError, Splice, Target};
use crate::message::Message;

/// The inbox rebuilt from `agent/inbox/spliced` events alone, with the same validation as the
/// inbox's replay. Other event types are ignored.
#[derive(Clone, Debug, Default)]
pub struct InboxProjection {
    lists: Lists,
}

impl InboxProjection {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one splice payload logged at `seq`.
    pub fn apply_data(&mut self, seq: u64, data: &Value) -> Result<(), ProjectionError> {
        let fail = |cause| ProjectionError { seq, cause };
        let splice = Splice::from_value(data).map_err(fail)?;
        self.lists.splice(&splice).map_err(fail)?;
        Ok(())
    }

    /// Applies an event; events of other types are ignored.
    pub fn apply(&mut self, event: &Event) -> Result<(), ProjectionError> {
        if event.kind() != SPLICED {
            return Ok(());
        }
        self.apply_data(event.seq, &event.data())
    }

    pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> Result<Self, ProjectionError> {
        let mut projection = Self::new();
        for event in events {
            projection.apply(event)?;
        }
        Ok(projection)
    }

    pub fn list(&self, target: Target) -> &[Arc<Message>] {
        self.lists.list(target)
    }

    /// Every pending message with its placement: `queued` (next-turn), then `steering`
    /// (next-step, human source) or `context` (next-step, anything else).
    pub fn items(&self) -> Vec<(&'static str, Arc<Message>)> {
        [Target::NextTurn, Target::NextStep]
            .into_iter()
            .flat_map(|t| self.lists.list(t).iter().map(move |m| (placement(t, m), Arc::clone(m))))
            .collect()
    }
}

/// What `consumed_work` found: the last `turn/end` that accounts for consumed input, and whether
/// input was dropped without running since.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsumedWork {
    pub end: Option<Event>,
    pub dropped_unrun: bool,
}

/// Reference 4.4 (`foldConsumedWork`), one pass over a log or an owned suffix of it.
pub fn consumed_work<'a>(events: impl IntoIterator<Item = &'a Event>) -> ConsumedWork {
    let mut out = ConsumedWork::default();
    let mut open: Option<u64> = None;
    let mut stepped: Vec<u64> = Vec::new();
    let mut claimed: Vec<u64> = Vec::new();
    for event in events {
        match event.kind() {
            "turn/start" => open = event.data().get("turn").and_then(Value::as_u64),
            "step/start" => stepped.extend(event.data().get("turn").and_then(Value::as_u64)),
            SPLICED => {
                let data = event.data();
                if data.get("removedCount").is_none() {
                    continue;
                }
                if data.get("outcome").and_then(Value::as_str) == Some("canceled") {
                    let replaced = data.get("inserted").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
                    out.dropped_unrun |= !replaced;
                } else if let Some(turn) = open {
                    claimed.push(turn);
                }
            }
            "turn/end" => {
                let data = event.data();
                let Some(turn) = data.get("turn").and_then(Value::as_u64) else { continue };
                let completed = data.pointer("/reason/kind").and_then(Value::as_str) == Some("completed");
                if stepped.contains(&turn) || (claimed.contains(&turn) && !completed) {
                    out.end = Some(event.clone());
                    out.dropped_unrun = false;
                }
                if open == Some(turn) {
                    open = None;
                }
            }
            _ => {}
        }
    }
    out
}
