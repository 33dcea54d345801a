//! The derived history: the messages of the log's surface events (`user/message`,
//! `assistant/message`, `tool/result`) in log order, assistant messages with empty content left
//! out. Kept current as the loop appends (its own messages join as they are written) and caught
//! up from the log with what others appended, so a request never re-reads the whole log.
//! A turn that ends rolled back (see [`super::rollback`]) takes its messages out again.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::events::{TURN_END, TURN_START, USER_MESSAGE};
use super::rollback;
use crate::event_log::{is_surface_type, SessionLog};
use crate::message::{Message, MessageError, MessageKind};

#[derive(Default)]
struct State {
    messages: Vec<Arc<Message>>,
    /// The seq of each message's event (aligned with `messages`).
    seqs: Vec<u64>,
    /// Every event before this seq has been folded in.
    pos: u64,
    /// The seq of the last `turn/start` folded: where a rollback of that turn cuts.
    turn_from: u64,
    /// How many times messages were taken out (a reader's cache by index is stale after one).
    epoch: u64,
}

/// One folded event, decoded outside the lock and applied under it, in log order.
enum Fold {
    Message(u64, Arc<Message>),
    TurnStart(u64),
    RolledBack,
}

impl State {
    fn apply(&mut self, fold: Fold) {
        match fold {
            Fold::Message(seq, message) => {
                self.messages.push(message);
                self.seqs.push(seq);
            }
            Fold::TurnStart(seq) => self.turn_from = seq,
            Fold::RolledBack => self.roll_back(),
        }
    }

    /// The turn that just ended rolled back: its messages leave the history.
    fn roll_back(&mut self) {
        let keep = self.seqs.partition_point(|&seq| seq < self.turn_from);
        if keep < self.messages.len() {
            self.messages.truncate(keep);
            self.seqs.truncate(keep);
            self.epoch += 1;
        }
    }
}

/// The events the history folds: the surface ones, and the turn bounds rollbacks need.
fn folded(kind: &str) -> bool {
    is_surface_type(kind) || kind == TURN_START || kind == TURN_END
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
        for event in &log.range_where(start, Some(stop), |e| folded(e.kind())) {
            match event.kind() {
                TURN_START => {
                    decoded.push(Fold::TurnStart(event.seq));
                    continue;
                }
                TURN_END => {
                    if rollback::rolls_back(event.data_json()) {
                        decoded.push(Fold::RolledBack);
                    }
                    continue;
                }
                _ => {}
            }
            let data: Value = serde_json::from_str(event.data_json()).map_err(|e| MessageError::new("message", e.to_string()))?;
            let value = if event.kind() == USER_MESSAGE { &data } else { &data["message"] };
            let message = Message::from_value(value)?;
            if message.kind() == MessageKind::Assistant && message.content().is_empty() {
                continue;
            }
            decoded.push(Fold::Message(event.seq, Arc::new(message)));
        }
        let mut state = self.state();
        if state.pos == start {
            for fold in decoded {
                state.apply(fold);
            }
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
            if let Some(message) = message {
                state.apply(Fold::Message(seq, message));
            }
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

    /// What a reader holding the first `start` messages as of `epoch` lacks: the current epoch
    /// and the messages from `start` on, or every message when messages were taken out since.
    pub fn since_epoch(&self, epoch: u64, start: usize) -> (u64, Vec<Arc<Message>>) {
        let state = self.state();
        let start = if state.epoch == epoch { start } else { 0 };
        (state.epoch, state.messages.get(start..).map(<[_]>::to_vec).unwrap_or_default())
    }
}
