//! Compaction: a `context/compacted` record names a span of the log (`first..=last`, seqs) and
//! the messages that stand for it in the derived history from then on. The raw events stay in
//! the log; only the history's projection changes, so a compaction can be reverted or re-run.
//!
//! The projection is a list of items in log order, each covering the seqs `lo..=hi` it stands
//! for (a logged message covers its own seq). A compaction removes every item lying wholly
//! inside its span and puts in their place its replacement messages (each covering the span)
//! followed by the span's pinned messages, verbatim. `messages: null` is a revert: the span's
//! raw messages come back. So a later compaction of the same (or a wider) span supersedes an
//! earlier one; one of a span inside an earlier summary's leaves that summary alone.

use std::sync::Arc;

use serde_json::Value;

use super::events::{self, LoopEvent};
use crate::event_log::{LogError, SessionLog};
use crate::message::{Message, MessageError};

/// A compaction record, as the history folds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    pub first: u64,
    pub last: u64,
    /// What stands for the span; `None`: its raw messages (a revert).
    pub messages: Option<Vec<Arc<Message>>>,
    /// Seqs of the span's messages kept verbatim after the replacement.
    pub pinned: Vec<u64>,
}

fn bad(field: &str, reason: impl Into<String>) -> MessageError {
    MessageError::new(format!("context/compacted.{field}"), reason)
}

fn seq_field(data: &Value, field: &str) -> Result<u64, MessageError> {
    data.get(field)
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(field, format!("expected a seq (an int >= 0), got {}", shown(data.get(field)))))
}

fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_owned(), crate::json::compact)
}

impl Compaction {
    /// Reads a record's payload (`first`, `last`, `messages`, `pinned`; other fields are the
    /// host's: strategy, model, usage, reason, native).
    pub fn from_value(data: &Value) -> Result<Compaction, MessageError> {
        let first = seq_field(data, "first")?;
        let last = seq_field(data, "last")?;
        if first > last {
            return Err(bad("last", format!("the span {first}..={last} is empty (last < first)")));
        }
        let messages = match data.get("messages") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(items.iter().map(|m| Message::from_value(m).map(Arc::new)).collect::<Result<Vec<_>, _>>()?),
            Some(other) => {
                return Err(bad("messages", format!("expected a list of messages or null, got {}", crate::json::compact(other))))
            }
        };
        let mut pinned = Vec::new();
        match data.get("pinned") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for item in items {
                    match item.as_u64() {
                        Some(seq) if (first..=last).contains(&seq) => pinned.push(seq),
                        _ => {
                            return Err(bad(
                                "pinned",
                                format!("{} is not a seq inside the span {first}..={last}", crate::json::compact(item)),
                            ))
                        }
                    }
                }
            }
            Some(other) => return Err(bad("pinned", format!("expected a list of seqs, got {}", crate::json::compact(other)))),
        }
        pinned.sort_unstable();
        pinned.dedup();
        Ok(Compaction { first, last, messages, pinned })
    }
}

/// One item of the projected history: a message and the seqs it stands for.
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub lo: u64,
    pub hi: u64,
    pub message: Arc<Message>,
}

/// Applies `compaction` to `view` (items in log order); `raw` holds every logged message of the
/// history by seq, for pins and reverts.
pub(super) fn apply(view: &mut Vec<Item>, raw: &[(u64, Arc<Message>)], compaction: &Compaction) {
    let (first, last) = (compaction.first, compaction.last);
    // Items overlapping the span without lying inside it stay; what they cover is not brought
    // back, and a span wholly inside one of them changes nothing.
    let straddling: Vec<(u64, u64)> = view
        .iter()
        .filter(|item| item.lo <= last && item.hi >= first && !(item.lo >= first && item.hi <= last))
        .map(|item| (item.lo, item.hi))
        .collect();
    if straddling.iter().any(|&(lo, hi)| lo <= first && hi >= last) {
        return;
    }
    let covered = |seq: u64| straddling.iter().any(|&(lo, hi)| lo <= seq && seq <= hi);
    let at = view.partition_point(|item| item.lo < first);
    view.retain(|item| !(item.lo >= first && item.hi <= last));
    let span = raw.partition_point(|(seq, _)| *seq < first)..raw.partition_point(|(seq, _)| *seq <= last);
    let verbatim = |(seq, message): &(u64, Arc<Message>)| Item { lo: *seq, hi: *seq, message: Arc::clone(message) };
    let uncovered = |entry: &&(u64, Arc<Message>)| !covered(entry.0);
    let block: Vec<Item> = match &compaction.messages {
        None => raw[span].iter().filter(uncovered).map(verbatim).collect(),
        Some(messages) => {
            let replaced = messages.iter().map(|message| Item { lo: first, hi: last, message: Arc::clone(message) });
            let pinned = raw[span].iter().filter(|(seq, _)| compaction.pinned.binary_search(seq).is_ok()).filter(uncovered).map(verbatim);
            replaced.chain(pinned).collect()
        }
    };
    let at = at.min(view.len());
    view.splice(at..at, block);
}

/// Appends a `context/compacted` record (`data`: its payload as JSON text, checked here: the
/// span must lie before the record) to `log`; its seq. Nothing is appended if the check fails.
pub fn append(log: &SessionLog, data: &str) -> Result<u64, CompactError> {
    let value: Value = serde_json::from_str(data).map_err(|e| CompactError::Invalid(format!("not JSON: {e}")))?;
    if !value.is_object() {
        return Err(CompactError::Invalid(format!("expected an object, got {}", crate::json::compact(&value))));
    }
    let compaction = Compaction::from_value(&value).map_err(|e| CompactError::Invalid(e.to_string()))?;
    let end = log.len();
    if compaction.last >= end {
        return Err(CompactError::Invalid(format!(
            "the span {}..={} reaches past the log's last seq ({})",
            compaction.first,
            compaction.last,
            end.saturating_sub(1)
        )));
    }
    events::append(log, events::context_compacted(&value)).map_err(CompactError::Log)
}

/// Why a compaction record was not appended.
#[derive(Debug)]
pub enum CompactError {
    /// The record is malformed: why.
    Invalid(String),
    Log(LogError),
}

impl std::fmt::Display for CompactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompactError::Invalid(why) => write!(f, "invalid compaction: {why}"),
            CompactError::Log(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CompactError {}

/// The record's event (see [`events::context_compacted`]).
pub fn event(data: &Value) -> LoopEvent {
    events::context_compacted(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(n: u64) -> Vec<(u64, Arc<Message>)> {
        (0..n).map(|seq| (seq * 2, Arc::new(Message::user_text(&format!("m{}", seq * 2))))).collect()
    }

    fn view_of(raw: &[(u64, Arc<Message>)]) -> Vec<Item> {
        raw.iter().map(|(seq, m)| Item { lo: *seq, hi: *seq, message: Arc::clone(m) }).collect()
    }

    fn texts(view: &[Item]) -> Vec<String> {
        view.iter().map(|item| item.message.text()).collect()
    }

    fn compaction(first: u64, last: u64, summary: Option<&str>, pinned: &[u64]) -> Compaction {
        let messages = summary.map(|s| json!([Message::user_text(s).to_value()]));
        Compaction::from_value(&json!({"first": first, "last": last, "messages": messages, "pinned": pinned})).unwrap()
    }

    #[test]
    fn a_summary_replaces_its_span_and_keeps_pins_after_it() {
        let raw = raw(6);
        let mut view = view_of(&raw);
        apply(&mut view, &raw, &compaction(0, 6, Some("S"), &[4]));
        assert_eq!(texts(&view), ["S", "m4", "m8", "m10"]);
    }

    #[test]
    fn a_later_compaction_of_the_span_supersedes_and_a_revert_restores() {
        let raw = raw(6);
        let mut view = view_of(&raw);
        apply(&mut view, &raw, &compaction(0, 6, Some("S1"), &[]));
        apply(&mut view, &raw, &compaction(0, 6, Some("S2"), &[2]));
        assert_eq!(texts(&view), ["S2", "m2", "m8", "m10"]);
        apply(&mut view, &raw, &compaction(0, 10, Some("S3"), &[]));
        assert_eq!(texts(&view), ["S3"]);
        apply(&mut view, &raw, &compaction(0, 6, None, &[]));
        assert_eq!(texts(&view), ["S3"], "a span inside an earlier summary leaves it alone");
        apply(&mut view, &raw, &compaction(0, 10, None, &[]));
        assert_eq!(texts(&view), ["m0", "m2", "m4", "m6", "m8", "m10"]);
    }

    #[test]
    fn a_sliding_window_is_an_empty_replacement() {
        let raw = raw(4);
        let mut view = view_of(&raw);
        let window = Compaction::from_value(&json!({"first": 0, "last": 2, "messages": []})).unwrap();
        apply(&mut view, &raw, &window);
        assert_eq!(texts(&view), ["m4", "m6"]);
    }

    #[test]
    fn malformed_records_are_refused_naming_the_field() {
        let e = Compaction::from_value(&json!({"first": 3, "last": 1})).unwrap_err();
        assert!(e.to_string().contains("last"), "{e}");
        let e = Compaction::from_value(&json!({"first": 0, "last": 4, "pinned": [9]})).unwrap_err();
        assert!(e.to_string().contains("9 is not a seq inside the span 0..=4"), "{e}");
        let e = Compaction::from_value(&json!({"first": "a", "last": 4})).unwrap_err();
        assert!(e.to_string().contains("first"), "{e}");
    }

    #[test]
    fn the_history_folds_records_from_the_log_and_refuses_a_bad_one_appending_nothing() {
        use crate::event_log::{MemoryStore, Store};
        let log = MemoryStore::new().create(None).unwrap();
        let history = super::super::History::new();
        for text in ["a", "b", "c"] {
            let message = Arc::new(Message::user_text(text));
            let seq = events::append(&log, events::user_message(&message)).unwrap();
            history.push(&log, seq, Some(message));
        }
        let before = log.len();
        assert!(matches!(append(&log, r#"{"first": 0, "last": 7, "messages": []}"#), Err(CompactError::Invalid(_))));
        assert!(matches!(append(&log, "[1]"), Err(CompactError::Invalid(_))));
        assert_eq!(log.len(), before, "a refused record appends nothing");
        let summary = json!({"first": 0, "last": 1, "messages": [Message::user_text("S").to_value()], "strategy": "summary"});
        let seq = append(&log, &summary.to_string()).unwrap();
        history.catch_up(&log, seq + 1).unwrap();
        let texts: Vec<String> = history.since(0).iter().map(|m| m.text()).collect();
        assert_eq!(texts, ["S", "c"]);
        assert_eq!(history.spans(), [(0, 1), (2, 2)]);
        assert_eq!(history.generation(), 1);
        // A fresh fold of the whole log (a reopened session) reads the same.
        let reopened = super::super::History::new();
        reopened.catch_up(&log, log.len()).unwrap();
        assert_eq!(reopened.since(0).iter().map(|m| m.text()).collect::<Vec<_>>(), ["S", "c"]);
    }
}
