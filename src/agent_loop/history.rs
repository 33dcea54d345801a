//! The derived history: the messages of the log's surface events (`user/message`,
//! `assistant/message`, `tool/result`) in log order, assistant messages with empty content left
//! out. Kept current as the loop appends (its own messages join as they are written) and caught
//! up from the log with what others appended, so a request never re-reads the whole log.
//! `context/compacted` records reshape it (see [`compaction`](super::compaction)): the history
//! is their projection over the logged messages, which are all kept for reverts and pins.
//! A turn that ends rolled back (see [`super::rollback`]) takes its messages out again.
//!
//! A step's tool results are in the history in call order (the order of the calls in their
//! assistant message), whatever their order in the log: a step that waits for a decision
//! commits the results of its other calls first, and the decided call's after it runs.

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
    /// The last assistant message of the view and the call indices of the results after it.
    tail: Tail,
}

/// The tool results that end the view, after the assistant message whose calls they answer:
/// what a result logged out of call order is placed among.
#[derive(Default)]
struct Tail {
    assistant: Option<Arc<Message>>,
    /// The call index of each result after it, in view order (ascending).
    results: Vec<usize>,
}

impl Tail {
    /// The position of call `call_id` among the assistant message's calls.
    fn index_of(&self, call_id: &str) -> Option<usize> {
        let assistant = self.assistant.as_ref()?;
        assistant
            .content()
            .iter()
            .filter(|b| crate::message::BlockType::of(b) == crate::message::BlockType::ToolCall)
            .position(|b| b.get("id").and_then(Value::as_str) == Some(call_id))
    }
}

impl State {
    /// `call`: the call index of a tool result, when the writer knows it (else it is looked up).
    fn add(&mut self, seq: u64, message: Arc<Message>, call: Option<usize>) {
        self.raw.push((seq, Arc::clone(&message)));
        match message.kind() {
            MessageKind::Assistant => self.tail = Tail { assistant: Some(Arc::clone(&message)), results: Vec::new() },
            MessageKind::User => self.tail = Tail::default(),
            MessageKind::ToolResult => {
                let call = call.or_else(|| {
                    let id = message.source().get("callId").and_then(Value::as_str)?;
                    self.tail.index_of(id)
                });
                if let Some(call) = call.filter(|_| self.tail.assistant.is_some()) {
                    // Placed before the results of later calls already in the view.
                    let later = self.tail.results.iter().rev().take_while(|&&j| j > call).count();
                    let at = self.view.len() - later;
                    self.view.insert(at, Item { lo: seq, hi: seq, message });
                    let slot = self.tail.results.len() - later;
                    self.tail.results.insert(slot, call);
                    if later > 0 {
                        self.generation += 1;
                    }
                    return;
                }
                self.tail = Tail::default();
            }
        }
        self.view.push(Item { lo: seq, hi: seq, message });
    }

    fn compact(&mut self, compaction: &Compaction) {
        compaction::apply(&mut self.view, &self.raw, compaction);
        self.generation += 1;
        self.tail = Tail::default();
    }

    /// The turn that just ended rolled back: its messages leave the history (and the raw
    /// messages, so no later revert brings them back). A compaction's replacement that stands
    /// for messages on both sides of the cut gives way to the raw messages before the cut.
    fn roll_back(&mut self) {
        let from = self.turn_from;
        self.tail = Tail::default();
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
                    Folded::Message(seq, message) => state.add(seq, message, None),
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
        self.push_call(log, seq, message, None);
    }

    /// The loop appended the result of call `call` (its index in its step) at `seq`.
    pub fn push_result(&self, log: &SessionLog, seq: u64, message: Arc<Message>, call: usize) {
        self.push_call(log, seq, Some(message), Some(call));
    }

    fn push_call(&self, log: &SessionLog, seq: u64, message: Option<Arc<Message>>, call: Option<usize>) {
        // A gap before it (someone else appended) is decoded now; if that fails, the next
        // catch-up (before a request) reports it.
        let _ = self.catch_up(log, seq);
        let mut state = self.state();
        if state.pos == seq {
            if let Some(message) = message {
                state.add(seq, message, call);
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
