//! The derived history: the messages of the log's surface events (`user/message`,
//! `assistant/message`, `tool/result`) in log order, assistant messages with empty content left
//! out. Kept current as the loop appends (its own messages join as they are written) and caught
//! up from the log with what others appended, so a request never re-reads the whole log.
//! `context/compacted` records reshape it (see [`compaction`](super::compaction)): the history
//! is their projection over the logged messages, which are all kept for reverts and pins.
//! A turn that ends rolled back (see [`super::rollback`]) takes its messages out again.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::compaction::{self, Compaction, Item};
use super::events::{CONTEXT_COMPACTED, TURN_END, TURN_START, USER_MESSAGE};
use super::rollback;
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
    /// Bumped by each compaction and rollback: the view changed other than by appending.
    generation: u64,
    /// The seq of the last `turn/start` folded: where a rollback of that turn cuts.
    turn_from: u64,
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

    /// The turn that just ended rolled back: its messages leave the history (and the raw
    /// messages, so no later revert brings them back). A compaction's replacement that stands
    /// for messages on both sides of the cut gives way to the raw messages before the cut.
    fn roll_back(&mut self) {
        let from = self.turn_from;
        let keep_raw = self.raw.partition_point(|(seq, _)| *seq < from);
        let keep_view = self.view.iter().position(|item| item.hi >= from).unwrap_or(self.view.len());
        if keep_raw == self.raw.len() && keep_view == self.view.len() {
            return;
        }
        let straddling = self.view.get(keep_view).filter(|item| item.lo < from).map(|item| item.lo);
        self.view.truncate(keep_view);
        if let Some(lo) = straddling {
            for (seq, message) in &self.raw[..keep_raw] {
                if *seq >= lo {
                    self.view.push(Item { lo: *seq, hi: *seq, message: Arc::clone(message) });
                }
            }
        }
        self.raw.truncate(keep_raw);
        self.generation += 1;
    }
}

/// A folded event: a message joining the history, a compaction, or the turn bounds a rollback
/// needs.
enum Folded {
    Message(u64, Arc<Message>),
    Compacted(Compaction),
    TurnStart(u64),
    RolledBack,
}

/// The events the history folds.
fn folded(kind: &str) -> bool {
    is_surface_type(kind) || kind == CONTEXT_COMPACTED || kind == TURN_START || kind == TURN_END
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
                    decoded.push(Folded::TurnStart(event.seq));
                    continue;
                }
                TURN_END => {
                    if rollback::rolls_back(event.data_json()) {
                        decoded.push(Folded::RolledBack);
                    }
                    continue;
                }
                _ => {}
            }
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
                    Folded::TurnStart(seq) => state.turn_from = seq,
                    Folded::RolledBack => state.roll_back(),
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

    /// The generation (bumped by each compaction and rollback: a copy of the messages taken
    /// before is stale) and the messages from index `start` on, read together.
    pub fn since_generation(&self, start: usize) -> (u64, Vec<Arc<Message>>) {
        let state = self.state();
        let messages =
            state.view.get(start..).map(|items| items.iter().map(|item| Arc::clone(&item.message)).collect()).unwrap_or_default();
        (state.generation, messages)
    }

    /// The generation (see [`since_generation`](Self::since_generation)).
    pub fn generation(&self) -> u64 {
        self.state().generation
    }

    /// The seqs each message of the history stands for (`(lo, hi)`: a logged message its own,
    /// a compaction's replacement the span it replaced), aligned with the messages.
    pub fn spans(&self) -> Vec<(u64, u64)> {
        self.state().view.iter().map(|item| (item.lo, item.hi)).collect()
    }
}
