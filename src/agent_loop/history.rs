//! The derived history: the messages of the log's surface events (`user/message`,
//! `assistant/message`, `tool/result`) in log order, assistant messages with empty content left
//! out. Kept current as the loop appends (its own messages join as they are written) and caught
//! up from the log with what others appended, so a request never re-reads the whole log.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::events::USER_MESSAGE;
use crate::event_log::{is_surface_type, SessionLog};
use crate::message::{Message, MessageError, MessageKind};

#[derive(Default)]
struct State {
    messages: Vec<Arc<Message>>,
    /// Every event before this seq has been folded in.
    pos: u64,
}

/// Shared by the turn machine and a tool plan run elsewhere; locked only for plain Vec work.
#[derive(Default)]
pub struct History {
    state: Mutex<State>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Never held across a call out: a poisoned lock still holds valid data.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Folds the surface events before `stop` that are not folded yet, decoded from the log.
    pub fn catch_up(&self, log: &SessionLog, stop: u64) -> Result<(), MessageError> {
        let start = self.state().pos;
        if start >= stop {
            return Ok(());
        }
        let mut decoded = Vec::new();
        for event in &log.range_where(start, Some(stop), |e| is_surface_type(e.kind())) {
            let data: Value = serde_json::from_str(event.data_json()).map_err(|e| MessageError::new("message", e.to_string()))?;
            let value = if event.kind() == USER_MESSAGE { &data } else { &data["message"] };
            let message = Message::from_value(value)?;
            if message.kind() == MessageKind::Assistant && message.content().is_empty() {
                continue;
            }
            decoded.push(Arc::new(message));
        }
        let mut state = self.state();
        if state.pos == start {
            state.messages.extend(decoded);
            state.pos = stop;
        }
        Ok(())
    }

    /// The loop appended the event at `seq`, carrying `message` if it joins the history: it
    /// joins directly when everything before it is folded, else the next catch-up decodes it.
    pub fn push(&self, log: &SessionLog, seq: u64, message: Option<Arc<Message>>) {
        // A gap before it (someone else appended) is decoded now; if that fails, the next
        // catch-up (before a request) reports it.
        let _ = self.catch_up(log, seq);
        let mut state = self.state();
        if state.pos == seq {
            state.messages.extend(message);
            state.pos = seq + 1;
        }
    }

    pub fn len(&self) -> usize {
        self.state().messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The seq up to which the log is folded.
    pub fn pos(&self) -> u64 {
        self.state().pos
    }

    /// The messages from index `start` on (what a request adds to what it had).
    pub fn since(&self, start: usize) -> Vec<Arc<Message>> {
        let state = self.state();
        state.messages.get(start..).map(<[_]>::to_vec).unwrap_or_default()
    }
}
