//! Crashed turns are answered (`docs/durability.md#crashed-turns-are-answered`).
//!
//! A turn a crash interrupted (the store's closers ended it `interrupted`) may have entered
//! input the model never answered. A loop that resumes with `continue` starts a
//! *continuation*: a new turn, `turn/start {turn, continues: <the interrupted turn>}`, that
//! claims nothing and asks the model again over the history as logged (model calls have no
//! side effects), then ends as any turn ends. This module is the fold that decides whether one
//! is due, from the log alone.
//!
//! A continuation that crashes too is itself interrupted, and continued in turn: the turns
//! from the first interrupted one through its continuations form a *chain* (each `continues`
//! the one before it, each ended `interrupted`). Input is unanswered when a `user/message` of
//! the chain has no final answer after it: an `assistant/message`, not cut short, that asks for
//! no tool, or a `tool/result` that concluded the turn (`concludesTurn`). So an input is never
//! answered twice: once the chain holds its answer nothing is due. The loop stops continuing once the chain holds as many crashed turns as its limit
//! (the count a `Worker` parks a session at).

use super::ending::EndKind;
use super::events;
use crate::event_log::{Event, SessionLog};

/// A continuation that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Continuation {
    /// The interrupted turn it continues (the log's last turn).
    pub turn: u64,
    /// The crashed turns of the chain: the first interrupted one and the continuations of it
    /// that were interrupted too (1 when none was).
    pub crashes: u32,
}

/// The continuation `events` call for, whatever the limit: `None` unless the last turn ended
/// `interrupted` with input of its chain unanswered.
pub fn due(events: &[Event]) -> Option<Continuation> {
    // From the end: most logs end with a turn that ended otherwise, told by its `turn/end`.
    let end = events.iter().rposition(|e| e.kind() == events::TURN_END)?;
    if events::end_kind(&events[end].data()) != Some(EndKind::Interrupted) || events[end..].iter().any(|e| e.kind() == events::TURN_START) {
        return None;
    }
    let mut start = events[..end].iter().rposition(|e| e.kind() == events::TURN_START)?;
    let data = events[start].data();
    let turn = events::turn_of(&data)?;
    let mut crashes = 1;
    let mut continues = events::continues_of(&data);
    // Back through the chain: each continuation's predecessor is the turn before it.
    while let Some(previous) = continues {
        let Some(at) = events[..start].iter().rposition(|e| e.kind() == events::TURN_START) else { break };
        let data = events[at].data();
        if events::turn_of(&data) != Some(previous) || !ended_interrupted(&events[at..start]) {
            break;
        }
        start = at;
        crashes += 1;
        continues = events::continues_of(&data);
    }
    unanswered(&events[start..]).then_some(Continuation { turn, crashes })
}

/// The continuation a loop that continues at most `limit` crashed turns in a row starts now
/// (`limit` 0: never, SPEC's `close`).
pub fn next(events: &[Event], limit: u32) -> Option<Continuation> {
    if limit == 0 {
        return None;
    }
    due(events).filter(|c| c.crashes < limit)
}

/// [`next`] of `log`.
pub fn next_of(log: &SessionLog, limit: u32) -> Option<Continuation> {
    if limit == 0 {
        return None;
    }
    log.with_events(|events| next(events, limit))
}

/// Whether the turn that starts `turn` (its events from its `turn/start`) ended `interrupted`.
fn ended_interrupted(turn: &[Event]) -> bool {
    turn.iter().rev().find(|e| e.kind() == events::TURN_END).is_some_and(|e| events::end_kind(&e.data()) == Some(EndKind::Interrupted))
}

/// Whether a `user/message` of `chain` has no final answer after it. A tool result that
/// concluded the turn (`concludesTurn`) answers too: the turn asked the model nothing more.
fn unanswered(chain: &[Event]) -> bool {
    let mut waiting = false;
    for event in chain {
        match event.kind() {
            events::USER_MESSAGE => waiting = true,
            events::ASSISTANT_MESSAGE if waiting => {
                let data = event.data();
                if !events::cut_short(&data) && events::requested_calls(&data).is_empty() {
                    waiting = false;
                }
            }
            // By the text first: only a concluding result parses.
            events::TOOL_RESULT
                if waiting
                    && event.data_json().contains(r#""concludesTurn":true"#)
                    && event.data().get("concludesTurn") == Some(&serde_json::Value::Bool(true)) =>
            {
                waiting = false;
            }
            _ => {}
        }
    }
    waiting
}
