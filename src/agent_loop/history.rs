//! The derived history: the messages of the log's surface events (`user/message`,
//! `assistant/message`, `tool/result`) in log order, assistant messages with empty content left
//! out. Kept current as the loop appends (its own messages join as they are written) and caught
//! up from the log with what others appended, so a request never re-reads the whole log.
//! `context/compacted` records reshape it (see [`compaction`](super::compaction)): the history
//! is their projection over the logged messages, which are all kept for reverts and pins.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::compaction::{self, Compaction, Item};
use super::events::{CONTEXT_COMPACTED, USER_MESSAGE};
use crate::event_log::{is_surface_type, SessionLog};
use crate::message::{Message, MessageError, MessageKind};

#[derive(Default)]
struct State {
    /// The projection: what a request sends.
    view: Vec<Item>,
    /// Every logged message of the history, by seq.
    raw: Vec<(u64, Arc<Message>)>,
    /// Every event before this seq has been folded in.
    pos: u64,
    /// Bumped by each compaction: the view changed other than by appending.
    generation: u64,
}

impl State {
    fn add(&mut self, seq: u64, message: Arc<Message>) {
        self.raw.push((seq, Arc::clone(&message)));
        self.view.push(Item { lo: seq, hi: seq, message });
    }

    fn compact(&mut self, compaction: &Compaction) {
        compaction::apply(&mut self.view, &self.raw, compaction);
        self.generation += 1;
    }
}

/// A folded event: a message joining the history, or a compaction.
enum Folded {
    Message(u64, Arc<Message>),
    Compacted(Compaction),
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
        for event in &log.range_where(start, Some(stop), |e| is_surface_type(e.kind()) || e.kind() == CONTEXT_COMPACTED) {
            let data: Value = serde_json::from_str(event.data_json()).map_err(|e| MessageError::new("message", e.to_string()))?;
            if event.kind() == CONTEXT_COMPACTED {
                decoded.push(Folded::Compacted(Compaction::from_value(&data)?));
                continue;
            }
            let value = if event.kind() == USER_MESSAGE { &data } else { &data["message"] };
            let message = Message::from_value(value)?;
            if message.kind() == MessageKind::Assistant && message.content().is_empty() {
                continue;
            }
            decoded.push(Folded::Message(event.seq, Arc::new(message)));
        }
        let mut state = self.state();
        if state.pos == start {
            for folded in decoded {
                match folded {
                    Folded::Message(seq, message) => state.add(seq, message),
                    Folded::Compacted(compaction) => state.compact(&compaction),
                }
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
                state.add(seq, message);
            }
            state.pos = seq + 1;
        }
    }

    pub fn len(&self) -> usize {
        self.state().view.len()
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
        self.since_generation(start).1
    }

    /// The generation (bumped by each compaction: a copy of the messages taken before is
    /// stale) and the messages from index `start` on, read together.
    pub fn since_generation(&self, start: usize) -> (u64, Vec<Arc<Message>>) {
        let state = self.state();
        let messages =
            state.view.get(start..).map(|items| items.iter().map(|item| Arc::clone(&item.message)).collect()).unwrap_or_default();
        (state.generation, messages)
    }

    /// The compaction generation (see [`since_generation`](Self::since_generation)).
    pub fn generation(&self) -> u64 {
        self.state().generation
    }

    /// The seqs each message of the history stands for (`(lo, hi)`: a logged message its own,
    /// a compaction's replacement the span it replaced), aligned with the messages.
    pub fn spans(&self) -> Vec<(u64, u64)> {
        self.state().view.iter().map(|item| (item.lo, item.hi)).collect()
    }
}
