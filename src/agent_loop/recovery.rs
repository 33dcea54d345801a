//! Folds over a finished session that the loop's recovery needs: which turn accounts for the
//! input it consumed (`consumed_work`, reference 4.4), and what a finished turn claimed but never
//! entered (`requeue_claimed`, SPEC D9; the transcript shows them: `unentered_claims`).

use std::sync::Arc;

use serde_json::Value;

use super::ending::EndKind;
use super::events::{self, end_kind, turn_of};
use crate::event_log::{Event, SPLICED};
use crate::inbox::{Inbox, InboxError, SpliceOutcome, Target};
use crate::message::{Message, MessageKind};

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
            events::TURN_START => open = turn_of(&event.data()),
            events::STEP_START => stepped.extend(turn_of(&event.data())),
            SPLICED => {
                let data = event.data();
                if data.get("removedCount").is_none() {
                    continue;
                }
                if SpliceOutcome::of(&data) == SpliceOutcome::Canceled {
                    let replaced = data.get("inserted").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
                    out.dropped_unrun |= !replaced;
                } else if let Some(turn) = open {
                    claimed.push(turn);
                }
            }
            events::TURN_END => {
                let data = event.data();
                let Some(turn) = turn_of(&data) else { continue };
                let completed = end_kind(&data) == Some(EndKind::Completed);
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

/// Why a turn's claimed input cannot be requeued.
#[derive(Debug)]
pub enum RequeueError {
    NotInLog(u64),
    StillOpen(u64),
    NothingLeft(u64),
    Inbox(InboxError),
}

impl std::fmt::Display for RequeueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequeueError::NotInLog(turn) => write!(f, "turn {turn} is not in this log"),
            RequeueError::StillOpen(turn) => write!(f, "turn {turn} is still open"),
            RequeueError::NothingLeft(turn) => write!(f, "turn {turn} has nothing left to requeue"),
            RequeueError::Inbox(e) => write!(f, "{e}"),
        }
    }
}

/// A message a turn claimed that never appeared after its claim (neither as a `user/message`
/// nor in a later insertion).
#[derive(Debug, Clone)]
pub struct Unentered {
    pub turn: u64,
    /// The seq of the claim's splice.
    pub seq: u64,
    /// The list it was claimed from.
    pub target: Target,
    pub message: Value,
    /// A step started after the claim: the pre-step decision took the batch (and entered what
    /// it chose), so the message was read, not lost.
    pub decided: bool,
}

/// What a pass over the events found: every claim of a turn never entered or requeued, and
/// which turns are open and ended.
struct Claims {
    unentered: Vec<Unentered>,
    started: std::collections::HashSet<u64>,
    ended: std::collections::HashSet<u64>,
}

fn fold_claims(events: &[Event]) -> Claims {
    let mut lists: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    let slot = |target: Target| usize::from(target != Target::NextTurn);
    let mut claimed: Vec<Unentered> = Vec::new();
    // Claims are pure deletions: the lists are rebuilt to know what each one removed.
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut open: Option<u64> = None;
    let (mut started, mut ended) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    for event in events {
        match event.kind() {
            events::TURN_START => {
                open = turn_of(&event.data());
                started.extend(open);
            }
            events::TURN_END => {
                let turn = turn_of(&event.data());
                if turn.is_some() && open == turn {
                    ended.extend(turn);
                    open = None;
                }
            }
            events::STEP_START => {
                for claim in claimed.iter_mut().filter(|c| Some(c.turn) == open) {
                    claim.decided = true;
                }
            }
            SPLICED => {
                let data = event.data();
                let target = data.get("target").and_then(Value::as_str).and_then(Target::parse).unwrap_or(Target::NextTurn);
                let items = &mut lists[slot(target)];
                // A count beyond `usize` (a 32-bit target) clamps like any count past the end.
                let count = |key: &str| data.get(key).and_then(Value::as_u64).map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
                let start = count("start").min(items.len());
                let removed = count("removedCount");
                let end = start.saturating_add(removed).min(items.len());
                let inserted = data.get("inserted").and_then(Value::as_array).cloned().unwrap_or_default();
                let gone: Vec<Value> = items.splice(start..end, inserted.iter().cloned()).collect();
                if let Some(turn) = open {
                    if removed > 0 && SpliceOutcome::of(&data) == SpliceOutcome::Claimed {
                        claimed.extend(gone.into_iter().map(|message| Unentered { turn, seq: event.seq, target, message, decided: false }));
                    }
                }
                for m in &inserted {
                    if let Some(id) = m.get("id").and_then(Value::as_str) {
                        seen.insert(id.to_owned(), event.seq);
                    }
                }
            }
            events::USER_MESSAGE => {
                if let Some(id) = event.data().get("id").and_then(Value::as_str) {
                    seen.insert(id.to_owned(), event.seq);
                }
            }
            _ => {}
        }
    }
    let unentered = claimed
        .into_iter()
        .filter(|c| {
            let id = c.message.get("id").and_then(Value::as_str).unwrap_or_default();
            seen.get(id).is_none_or(|at| *at <= c.seq)
        })
        .collect();
    Claims { unentered, started, ended }
}

/// Every message an ended turn claimed and never read: no step started after its claim (the
/// turn was cancelled before the pre-step decision, the decision rejected the batch, the turn
/// failed or its process died), and it was not inserted again since (`requeue_claimed` brings
/// it back). In claim order. The transcript shows them, so a prompt cancelled before the loop
/// read it is never hidden.
pub fn unentered_claims(events: &[Event]) -> Vec<Unentered> {
    let claims = fold_claims(events);
    claims.unentered.into_iter().filter(|c| !c.decided && claims.ended.contains(&c.turn)).collect()
}

/// The messages finished turn `turn` claimed that never appeared after the claim (neither as a
/// `user/message` nor in a later insertion), each with the list it was claimed from, in claim
/// order.
pub fn claimed_unentered(events: &[Event], turn: u64) -> Result<Vec<(Target, Value)>, RequeueError> {
    let claims = fold_claims(events);
    if !claims.started.contains(&turn) {
        return Err(RequeueError::NotInLog(turn));
    }
    if !claims.ended.contains(&turn) {
        return Err(RequeueError::StillOpen(turn));
    }
    let missing: Vec<(Target, Value)> = claims.unentered.into_iter().filter(|c| c.turn == turn).map(|c| (c.target, c.message)).collect();
    if missing.is_empty() {
        return Err(RequeueError::NothingLeft(turn));
    }
    Ok(missing)
}

/// SPEC D9: re-inserts what finished turn `turn` claimed but never entered, at the head of the
/// list each came from, in claim order (one splice per list, next-step first). Returns them in
/// that order.
pub fn requeue_claimed(inbox: &Inbox, turn: u64) -> Result<Vec<Arc<Message>>, RequeueError> {
    let missing = inbox.log().with_events(|events| claimed_unentered(events, turn))?;
    let mut out = Vec::new();
    for target in [Target::NextStep, Target::NextTurn] {
        let messages: Vec<Arc<Message>> = missing
            .iter()
            .filter(|(t, _)| *t == target)
            .filter_map(|(_, m)| Message::from_value(m).ok())
            .filter(|m| m.kind() == MessageKind::User)
            .map(Arc::new)
            .collect();
        if !messages.is_empty() {
            // Not passed to the insertion hook again: the log holds them as they were admitted.
            inbox.reinsert(target, 0, 0, messages.clone()).map_err(RequeueError::Inbox)?;
            out.extend(messages);
        }
    }
    Ok(out)
}
