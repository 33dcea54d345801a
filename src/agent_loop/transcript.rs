//! The transcript: the conversation as the log records it — the messages of the surface events
//! (`user/message`, `assistant/message`, `tool/result`) in log order, each with the turn and step
//! it belongs to, and every turn's ending. It is the derived history ([`super::History`]) with
//! the facts a reader of the conversation also wants: which user messages steered a running turn
//! (entered at a later step), which replies were cut off (`interrupted`), and how each turn ended
//! (a rejected batch never became a message; its turn ends `blocked`), and the input a turn
//! claimed but ended before reading (cancelled between its claim and its entry): claimed input
//! never returns by itself (SPEC D9), but it is never hidden either.

use std::sync::Arc;

use serde_json::Value;

use super::events::{self, ASSISTANT_MESSAGE, STEP_START, TOOL_RESULT, TURN_END, TURN_START, USER_MESSAGE};
use super::recovery::{unentered_claims, Unentered};
use crate::event_log::{SessionLog, SPLICED};
use crate::message::{Message, MessageError, MessageKind};

/// One message of the conversation and where the log put it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub seq: u64,
    /// The turn it belongs to; 0 for a message logged outside any turn.
    pub turn: u64,
    /// The step it belongs to; 0 outside a step.
    pub step: u64,
    pub message: Arc<Message>,
    /// An assistant reply cut off by a cancellation (`assistant/message {interrupted: true}`).
    pub interrupted: bool,
}

impl Entry {
    /// A user message entered after the turn's first step: steering or context sent while the
    /// turn ran (`steer`/`inject`), not the prompt that started it.
    pub fn mid_turn(&self) -> bool {
        self.message.kind() == MessageKind::User && self.step > 1
    }
}

/// How a turn ended: the `turn/end` event's seq, turn and `reason` (`{"kind": ...}`).
#[derive(Debug, Clone)]
pub struct TurnEnding {
    pub seq: u64,
    pub turn: u64,
    pub reason: Value,
}

/// The conversation of a log up to some seq.
#[derive(Debug, Clone, Default)]
pub struct Transcript {
    pub entries: Vec<Entry>,
    pub endings: Vec<TurnEnding>,
    /// What ended turns claimed and never read (no step started after the claim), not
    /// inserted again since (`requeue_claimed` brings it back).
    pub unread: Vec<Unentered>,
    /// Every event before this seq was read.
    pub stop: u64,
}

const READ: [&str; 7] = [TURN_START, STEP_START, USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT, TURN_END, SPLICED];

impl Transcript {
    /// Reads the conversation of `log` as it stands (every committed event). Assistant messages
    /// with empty content are left out, as the derived history leaves them out.
    pub fn of(log: &SessionLog) -> Result<Transcript, MessageError> {
        let stop = log.len();
        let read = log.range_where(0, Some(stop), |e| READ.contains(&e.kind()));
        let mut out = Transcript { stop, ..Transcript::default() };
        let (mut turn, mut step) = (0, 0);
        for event in &read {
            let kind = event.kind();
            if kind == SPLICED {
                continue; // read by `unentered_claims` below
            }
            let data: Value = serde_json::from_str(event.data_json()).map_err(|e| MessageError::new("message", e.to_string()))?;
            if kind == TURN_START {
                (turn, step) = (events::turn_of(&data).unwrap_or(turn + 1), 0);
                continue;
            }
            if kind == STEP_START {
                step = events::step_of(&data).unwrap_or(step + 1);
                continue;
            }
            if kind == TURN_END {
                let ended = events::turn_of(&data).unwrap_or(turn);
                out.endings.push(TurnEnding { seq: event.seq, turn: ended, reason: data.get("reason").cloned().unwrap_or(Value::Null) });
                step = 0;
                continue;
            }
            let value = if kind == USER_MESSAGE { &data } else { &data["message"] };
            let message = Message::from_value(value)?;
            if message.kind() == MessageKind::Assistant && message.content().is_empty() {
                continue;
            }
            let interrupted = data.get("interrupted").and_then(Value::as_bool).unwrap_or(false);
            // A user message's payload is the message itself: its turn and step are the open ones.
            let (t, s) = if kind == USER_MESSAGE {
                (turn, step)
            } else {
                (events::turn_of(&data).unwrap_or(turn), events::step_of(&data).unwrap_or(step))
            };
            out.entries.push(Entry { seq: event.seq, turn: t, step: s, message: Arc::new(message), interrupted });
        }
        out.unread = unentered_claims(&read);
        Ok(out)
    }
}
