//! Salvaging a corrupt session file (docs/format.md, "Repairing corruption"): which records
//! `repair` keeps, which lines it sets aside, and the `log/damaged` placeholders that keep every
//! later record at its seq.
//!
//! Seqs are positions (seq `s` is the log's `s`-th event, and `sourceEventSeqs`, tails and
//! readers rely on that), so a lost record is not removed from the numbering: its seq gets a
//! placeholder and every verified record after it keeps its seq. Renumbering would silently
//! re-point every `sourceEventSeqs` written after the damage.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::format;
use crate::event_log::log::{intern, TypeNames};
use crate::event_log::{Event, LogError};

/// The type of the placeholder written at the seq of a record that was lost.
pub const DAMAGED: &str = "log/damaged";
/// The type of the record `repair` appends, naming everything it set aside.
pub const REPAIRED: &str = "log/repaired";

/// Shorter than any event record can be (`<crc> {"type":"x","seq":0,"time":0,"data":0}\n` is
/// 47 bytes): a seq cannot have been skipped without at least this many bytes per record in
/// the file, which bounds the placeholders a forged record with a huge seq could ask for.
const MIN_RECORD: u64 = 47;

/// A line that is set aside: it does not verify, or it verifies but does not continue the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// 1-based line number in the damaged file (its `.corrupt` copy).
    pub line: u64,
    /// Byte range in the damaged file, newline included.
    pub bytes: Range<u64>,
    /// The seq the line claims, if its JSON still reads (it may be wrong: it did not verify).
    pub claimed_seq: Option<u64>,
    pub detail: String,
}

/// A run of seqs whose records are lost, with the lines that stood where they were.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    pub seqs: Range<u64>,
    /// The dropped lines between the kept records around the run (may be empty: a record that
    /// vanished whole).
    pub lines: Vec<u64>,
}

/// What a salvage found.
#[derive(Debug)]
pub(super) struct Salvage {
    pub header: Map<String, Value>,
    /// The seq of the file's first event (0 but in a shared fork), and the parent that fork
    /// reads the ones before it from.
    pub base: u64,
    pub parent: Option<format::Parent>,
    /// The header line, newline included.
    pub header_len: u64,
    /// Every verified record that continues the log, with its byte range.
    pub kept: Vec<(Event, Range<u64>)>,
    pub dropped: Vec<Dropped>,
    pub lost: Vec<Lost>,
    /// Where the torn tail (everything after the last verified record) starts, and its line.
    pub torn: Option<(u64, u64)>,
    pub total_len: u64,
}

impl Salvage {
    pub fn torn_bytes(&self) -> u64 {
        self.torn.map_or(0, |(start, _)| self.total_len - start)
    }

    /// The events a reader may see: the kept ones, each at its own seq (a lost seq is a gap).
    pub fn events(&self) -> Vec<Event> {
        self.kept.iter().map(|(e, _)| e.clone()).collect()
    }
}

fn claimed_seq(line: &[u8]) -> Option<u64> {
    let json = line.get(9..)?;
    serde_json::from_slice::<Value>(json).ok()?.get("seq")?.as_u64()
}

/// Reads every line of `bytes`; errors only for a damaged or foreign header (nothing to keep).
pub(super) fn salvage(bytes: &[u8], path: &Path, id: &str) -> Result<Salvage, LogError> {
    let total_len = bytes.len() as u64;
    let Some(header_end) = bytes.iter().position(|&b| b == b'\n') else {
        let detail = if bytes.is_empty() { "the file is empty" } else { "header: unterminated line" };
        return Err(LogError::Corrupt { path: path.to_path_buf(), line: 1, seq: 0, detail: detail.into() });
    };
    let format::Header { record: header, parent } = format::parse_header(&bytes[..header_end], path, id)?;
    let base = parent.as_ref().map_or(0, |p| p.seq + 1);

    // Every line after the header, verified or not.
    let mut types = TypeNames::default();
    let mut intern = |kind: &str| -> Arc<str> { intern(&mut types, kind) };
    let mut lines: Vec<(Range<u64>, Result<Event, String>)> = Vec::new();
    let mut pos = header_end + 1;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        let (parsed, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (format::unframe(&rest[..i]).and_then(|json| Event::from_json(json, &mut intern)), pos + i + 1),
            None => (Err("unterminated record (no newline)".to_string()), bytes.len()),
        };
        lines.push((pos as u64..next as u64, parsed));
        pos = next;
    }
    // Everything after the last verified record is a torn tail, exactly as for `open`.
    let last_valid = lines.iter().rposition(|(_, p)| p.is_ok());
    let keep_upto = last_valid.map_or(0, |i| i + 1);
    let torn = lines.get(keep_upto).map(|(r, _)| (r.start, keep_upto as u64 + 2));

    let max_gap = total_len / MIN_RECORD;
    let mut out = Salvage {
        header,
        base,
        parent,
        header_len: header_end as u64 + 1,
        kept: Vec::new(),
        dropped: Vec::new(),
        lost: Vec::new(),
        torn,
        total_len,
    };
    let mut next = base;
    let mut since_kept: Vec<u64> = Vec::new();
    for (index, (range, parsed)) in lines.into_iter().take(keep_upto).enumerate() {
        let line = index as u64 + 2;
        let detail = match parsed {
            Ok(event) if event.seq >= next && event.seq - next <= max_gap => {
                if event.seq > next || !since_kept.is_empty() {
                    let lines = std::mem::take(&mut since_kept);
                    if event.seq > next {
                        out.lost.push(Lost { seqs: next..event.seq, lines });
                    }
                }
                next = event.seq + 1;
                out.kept.push((event, range));
                continue;
            }
            Ok(event) if event.seq < next => format!("seq {} out of sequence (expected {next} or later)", event.seq),
            Ok(event) => format!("seq {} is implausibly far ahead (expected {next})", event.seq),
            Err(detail) => detail,
        };
        let claimed = claimed_seq(&bytes[super::at(range.start)..super::at(range.end)]);
        out.dropped.push(Dropped { line, bytes: range, claimed_seq: claimed, detail });
        since_kept.push(line);
    }
    Ok(out)
}

/// The placeholder record of lost seq `seq`, as JSON text.
pub(super) fn damaged_record(seq: u64, time: i64, lost: &Lost, backup: &str) -> String {
    let lines: Value = match (lost.lines.first(), lost.lines.last()) {
        (Some(a), Some(b)) => json!([a, b]),
        _ => Value::Null,
    };
    let data = json!({"seqs": [lost.seqs.start, lost.seqs.end - 1], "lines": lines, "backup": backup});
    Event::new(seq, time, Arc::from(DAMAGED), Arc::from(crate::json::compact(&data)), None).to_json()
}

/// The record `repair` appends at `seq`, naming what it set aside, as JSON text.
pub(super) fn repaired_record(seq: u64, time: i64, s: &Salvage, backup: &str, quarantine: Option<&str>) -> String {
    let dropped: Vec<Value> = s
        .dropped
        .iter()
        .map(|d| json!({"line": d.line, "bytes": d.bytes.end - d.bytes.start, "seq": d.claimed_seq, "detail": d.detail}))
        .collect();
    let lost: Vec<Value> = s.lost.iter().map(|l| json!([l.seqs.start, l.seqs.end - 1])).collect();
    let data = json!({
        "backup": backup,
        "quarantine": quarantine,
        "dropped": dropped,
        "lostSeqs": lost,
        "tornTailBytes": s.torn_bytes(),
    });
    Event::new(seq, time, Arc::from(REPAIRED), Arc::from(crate::json::compact(&data)), None).to_json()
}

/// The repaired file: the header, every kept record verbatim at its seq with a placeholder at
/// each lost seq, then the `log/repaired` record.
pub(super) fn rebuild(bytes: &[u8], s: &Salvage, now: i64, backup: &str, quarantine: Option<&str>) -> Vec<u8> {
    let mut out = bytes[..super::at(s.header_len)].to_vec();
    let created = s.header.get("createdAt").and_then(Value::as_i64).unwrap_or(0);
    let mut lost = s.lost.iter().peekable();
    let mut seq = s.base;
    let mut last_time = created;
    for (event, range) in &s.kept {
        while let Some(run) = lost.next_if(|l| l.seqs.start == seq) {
            for lost_seq in run.seqs.clone() {
                format::push_line(&mut out, &damaged_record(lost_seq, last_time, run, backup));
            }
            seq = run.seqs.end;
        }
        out.extend_from_slice(&bytes[super::at(range.start)..super::at(range.end)]);
        last_time = last_time.max(event.time);
        seq = event.seq + 1;
    }
    format::push_line(&mut out, &repaired_record(seq, now.max(last_time), s, backup, quarantine));
    out
}
