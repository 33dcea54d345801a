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
