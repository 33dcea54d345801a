//! Records on disk (format versions 1 and 2, see docs/format.md): `<crc> <json>\n`, where
//! `<crc>` is the CRC-32C of the JSON bytes as 8 lowercase hex digits. Line 1 is the session
//! header; every further line is one event, seq `base + n - 2` on line `n`, where `base` is 0
//! except in a version 2 file (a fork sharing its parent's records), whose events `0..base`
//! are its parent's, read through the parent's file.
//!
//! [`scan`] verifies a whole file. Header damage is always an error (there is nothing to keep);
//! damage further down is described in [`Scan::invalid`] and the caller decides: a torn tail is
//! repaired by `open`, corruption is refused except by an explicit `repair`.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::super::log::{intern, TypeNames};
use super::super::store::{FORKED_FROM, FORMAT_VERSION, PLAIN_VERSION};
use super::super::{Event, LogError};

/// The version of a fork that shares its parent's records.
pub(super) const SHARED_VERSION: u64 = 2;

/// The header key of a shared fork that pins the parent it reads: the checksum (8 hex digits)
/// of the parent's header line, which nothing but a new session under the same id changes.
pub(super) const PARENT_HEADER: &str = "parentHeader";

/// Where a shared fork reads its first events: session `id`'s events `0..=seq`, from a file
/// whose header line carries the checksum `header_crc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Parent {
    pub id: String,
    pub seq: u64,
    pub header_crc: String,
}

/// The `type` of the header record.
pub(super) const HEADER_TYPE: &str = "session";

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends the framed line for `json` (checksum, space, JSON, newline) to `out`.
pub(super) fn push_line(out: &mut Vec<u8>, json: &str) {
    push_framed(out, crc32c::crc32c(json.as_bytes()), json);
}

/// [`push_line`] with the checksum of `json` already computed (outside any lock).
pub(super) fn push_framed(out: &mut Vec<u8>, crc: u32, json: &str) {
    out.reserve(json.len() + 10);
    for shift in (0..8).rev() {
        out.push(HEX[((crc >> (shift * 4)) & 0xF) as usize]);
    }
    out.push(b' ');
    out.extend_from_slice(json.as_bytes());
    out.push(b'\n');
}

/// The header line of a session whose header map is `header` (as `new_header` builds it).
pub(super) fn header_line(header: &Map<String, Value>) -> Vec<u8> {
    // `type` goes first so a reader can tell what a file is from its first bytes.
    let mut record = Map::new();
    record.insert("type".into(), Value::String(HEADER_TYPE.into()));
    for (key, value) in header {
        if key != "type" {
            record.insert(key.clone(), value.clone());
        }
    }
    let mut out = Vec::new();
    push_line(&mut out, &crate::json::compact(&Value::Object(record)));
    out
}

fn parse_hex(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |acc, &b| {
        let v = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some(acc << 4 | u32::from(v))
    })
}

/// Checks the framing and checksum of one line (without its newline); returns the JSON text.
pub(super) fn unframe(line: &[u8]) -> Result<&str, String> {
    if line.len() < 9 || line[8] != b' ' {
        return Err("no checksum prefix".into());
    }
    let stored = parse_hex(&line[..8]).ok_or("malformed checksum")?;
    let json = &line[9..];
    let actual = crc32c::crc32c(json);
    if stored != actual {
        return Err(format!("checksum mismatch (stored {stored:08x}, computed {actual:08x})"));
    }
    std::str::from_utf8(json).map_err(|_| "record is not UTF-8".into())
}

/// The first record that failed verification.
#[derive(Debug)]
pub(super) struct Invalid {
    /// 1-based line number (the header is line 1).
    pub line: u64,
    /// The seq expected on that line.
    pub seq: u64,
    pub detail: String,
    /// The line of the first valid record after it, if any: then this is corruption, not a
    /// torn tail.
    pub valid_after: Option<u64>,
}

/// What a file holds.
#[derive(Debug)]
pub(super) struct Scan {
    /// The header record without its `type` key.
    pub header: Map<String, Value>,
    /// The seq of the file's first event (0 but in a shared fork).
    pub base: u64,
    /// The parent a shared fork reads its events `0..base` from.
    pub parent: Option<Parent>,
    /// The events before the first invalid record (the file's own: from `base` on).
    pub events: Vec<Event>,
    /// Byte offset just past the last good record (the header counts); the first invalid
    /// record, if any, starts here.
    pub good_len: u64,
    pub total_len: u64,
    pub invalid: Option<Invalid>,
}

impl Scan {
    /// The `Corrupt` error if an invalid record is followed by a valid one.
    pub fn corruption(&self, path: &Path) -> Option<LogError> {
        let invalid = self.invalid.as_ref()?;
        let after = invalid.valid_after?;
        Some(LogError::Corrupt {
            path: path.to_path_buf(),
            line: invalid.line,
            seq: invalid.seq,
            detail: format!("{}; a valid record follows on line {after}", invalid.detail),
        })
    }

    /// Bytes after the last good record (a torn tail, or everything from the corruption on).
    pub fn bad_bytes(&self) -> u64 {
        self.total_len - self.good_len
    }
}

/// A header, parsed: the record without `type`, and for a shared fork where it reads first.
pub(super) struct Header {
    pub record: Map<String, Value>,
    pub parent: Option<Parent>,
}

impl Header {
    /// The seq of the file's first event.
    pub fn base(&self) -> u64 {
        self.parent.as_ref().map_or(0, |p| p.seq + 1)
    }
}

pub(super) fn parse_header(line: &[u8], path: &Path, id: &str) -> Result<Header, LogError> {
    let corrupt = |detail: String| LogError::Corrupt { path: path.to_path_buf(), line: 1, seq: 0, detail: format!("header: {detail}") };
    let json = unframe(line).map_err(corrupt)?;
    let mut record: Map<String, Value> = serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))?;
    // The version decides how to read everything else, so it is checked first.
    let version = record.get("version").map(Value::as_u64);
    match version {
        Some(Some(PLAIN_VERSION | SHARED_VERSION)) => {}
        Some(Some(found)) => return Err(LogError::UnsupportedFormat { path: path.to_path_buf(), found, supported: FORMAT_VERSION }),
        Some(None) => return Err(corrupt("\"version\" is not a non-negative integer".into())),
        None => return Err(corrupt("no \"version\"".into())),
    }
    if record.get("type").and_then(Value::as_str) != Some(HEADER_TYPE) {
        return Err(corrupt(format!("\"type\" is not \"{HEADER_TYPE}\"")));
    }
    match record.get("id").and_then(Value::as_str) {
        Some(found) if found == id => {}
        Some(found) => return Err(corrupt(format!("it names session {found:?}, but the file belongs to {id:?}"))),
        None => return Err(corrupt("no string \"id\"".into())),
    }
    if record.get("createdAt").and_then(Value::as_i64).is_none() {
        return Err(corrupt("no integer \"createdAt\"".into()));
    }
    // Version 1 may name a parent too (a fork that copied its records): nothing to read there.
    let parent = match version {
        Some(Some(SHARED_VERSION)) => Some(shared_parent(&record).map_err(|detail| corrupt(format!("a version 2 header needs {detail}")))?),
        _ => None,
    };
    record.shift_remove("type");
    Ok(Header { record, parent })
}

/// The parent a version 2 header names, or what is missing.
fn shared_parent(record: &Map<String, Value>) -> Result<Parent, String> {
    let from = record.get(FORKED_FROM).and_then(Value::as_object);
    let id = from.and_then(|f| f.get("id")).and_then(Value::as_str).filter(|id| !id.is_empty() && !id.contains('\0'));
    let seq = from.and_then(|f| f.get("seq")).and_then(Value::as_u64).filter(|&seq| seq < u64::MAX / 2);
    let (Some(id), Some(seq)) = (id, seq) else {
        return Err(format!("\"{FORKED_FROM}\": {{\"id\": <a session id>, \"seq\": <a seq>}}"));
    };
    let crc = record.get(PARENT_HEADER).and_then(Value::as_str).filter(|c| c.len() == 8 && parse_hex(c.as_bytes()).is_some());
    let Some(crc) = crc else { return Err(format!("\"{PARENT_HEADER}\": 8 lowercase hex digits")) };
    Ok(Parent { id: id.to_string(), seq, header_crc: crc.to_string() })
}

/// Whether a session file's bytes are what a crash of the machine can leave of a session
/// created but never synced (its creation becomes durable with its first sync: see
/// `fsio::Durable::Later`): no complete line, only a prefix of a header line (`<crc> {"type":
/// "session",` ...), possibly followed by zero bytes (a length that reached the disk before the
/// data), or nothing at all. The store writes no other file without a whole header line, so
/// `open` takes such a file for a session created anew (and writes its header again).
pub(super) fn unborn(bytes: &[u8]) -> bool {
    const OPENING: &[u8] = b" {\"type\":\"session\",";
    if bytes.contains(&b'\n') {
        return false;
    }
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let text = &bytes[..end];
    let (crc, rest) = text.split_at(text.len().min(8));
    let shown = rest.len().min(OPENING.len());
    crc.iter().all(|b| HEX.contains(b)) && rest[..shown] == OPENING[..shown]
}

/// Verifies the bytes of session `id`'s file. Errors only for a damaged or foreign header.
pub(super) fn scan(bytes: &[u8], path: &Path, id: &str) -> Result<Scan, LogError> {
    scan_upto(bytes, path, id, None)
}

/// [`scan`], stopping once the log holds `limit` events (seqs `0..limit`, counting those
/// before the file's base) if no invalid record came first: a shared fork's read of its parent
/// needs nothing after the cut.
pub(super) fn scan_upto(bytes: &[u8], path: &Path, id: &str, limit: Option<u64>) -> Result<Scan, LogError> {
    let total_len = bytes.len() as u64;
    let Some(header_end) = bytes.iter().position(|&b| b == b'\n') else {
        let detail = if bytes.is_empty() { "the file is empty" } else { "header: unterminated line" };
        return Err(LogError::Corrupt { path: path.to_path_buf(), line: 1, seq: 0, detail: detail.into() });
    };
    let Header { record: header, parent } = parse_header(&bytes[..header_end], path, id)?;
    let base = parent.as_ref().map_or(0, |p| p.seq + 1);

    let mut types = TypeNames::default();
    let mut intern = |kind: &str| -> Arc<str> { intern(&mut types, kind) };
    let mut events: Vec<Event> = Vec::new();
    let mut good_len = header_end + 1;
    let mut invalid: Option<Invalid> = None;
    let mut pos = header_end + 1;
    let mut line_no = 1u64;
    while pos < bytes.len() {
        if invalid.is_none() && limit.is_some_and(|limit| base + events.len() as u64 >= limit) {
            break;
        }
        line_no += 1;
        let rest = &bytes[pos..];
        let (record, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (Ok(&rest[..i]), pos + i + 1),
            None => (Err("unterminated record (no newline)".to_string()), bytes.len()),
        };
        let parsed = record.and_then(|line| Event::from_json(unframe(line)?, &mut intern));
        match &mut invalid {
            None => {
                let expected = base + events.len() as u64;
                let failure = match parsed {
                    Ok(event) if event.seq == expected => {
                        events.push(event);
                        good_len = next;
                        None
                    }
                    Ok(event) => Some(format!("seq {} where {expected} was expected", event.seq)),
                    Err(detail) => Some(detail),
                };
                if let Some(detail) = failure {
                    invalid = Some(Invalid { line: line_no, seq: expected, detail, valid_after: None });
                }
            }
            // Whether the damage is a torn tail depends only on whether anything valid follows.
            Some(first) => {
                if parsed.is_ok() {
                    first.valid_after = Some(line_no);
                    break;
                }
            }
        }
        pos = next;
    }
    Ok(Scan { header, base, parent, events, good_len: good_len as u64, total_len, invalid })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(json: &str) -> Vec<u8> {
        let mut out = Vec::new();
        push_line(&mut out, json);
        out
    }

    fn header() -> Vec<u8> {
        let mut h = Map::new();
        h.insert("version".into(), Value::from(1));
        h.insert("id".into(), Value::from("s"));
        h.insert("createdAt".into(), Value::from(5));
        header_line(&h)
    }

    fn event(seq: u64) -> Vec<u8> {
        line(&format!(r#"{{"type":"x/y","seq":{seq},"time":1,"data":{{}}}}"#))
    }

    #[test]
    fn lines_carry_a_crc32c_prefix() {
        // CRC-32C("123456789") is the standard check value e3069283.
        assert_eq!(line("123456789"), b"e3069283 123456789\n");
        assert_eq!(unframe(b"e3069283 123456789"), Ok("123456789"));
        assert!(unframe(b"e3069284 123456789").is_err());
        assert!(unframe(b"E3069283 123456789").is_err());
        assert!(unframe(b"123456789").is_err());
    }

    #[test]
    fn header_has_type_first() {
        let h = header();
        let text = std::str::from_utf8(&h).unwrap();
        assert!(text.ends_with(" {\"type\":\"session\",\"version\":1,\"id\":\"s\",\"createdAt\":5}\n"), "{text}");
        let scan = scan(&h, Path::new("p"), "s").unwrap();
        assert_eq!(scan.header.keys().collect::<Vec<_>>(), ["version", "id", "createdAt"]);
        assert!(matches!(super::scan(&h, Path::new("p"), "t"), Err(LogError::Corrupt { line: 1, .. })));
    }

    #[test]
    fn torn_and_corrupt_are_told_apart() {
        let mut bytes = [header(), event(0), event(1)].concat();
        let good = bytes.len() as u64;
        bytes.extend_from_slice(&event(2)[..10]);
        let s = scan(&bytes, Path::new("p"), "s").unwrap();
        assert_eq!((s.events.len(), s.good_len, s.bad_bytes()), (2, good, 10));
        assert!(s.corruption(Path::new("p")).is_none());

        let bytes = [header(), event(0), event(5), event(2)].concat();
        let s = scan(&bytes, Path::new("p"), "s").unwrap();
        let err = s.corruption(Path::new("p")).unwrap();
        assert!(matches!(err, LogError::Corrupt { line: 3, seq: 1, .. }), "{err}");
    }

    #[test]
    fn what_a_crash_leaves_of_an_unsynced_creation_is_told_from_damage() {
        let h = header();
        // Every prefix of the header line (the empty file included), with or without zeros
        // after it, is a creation that never became durable ...
        for cut in 0..h.len() - 1 {
            assert!(unborn(&h[..cut]), "{cut}");
            assert!(unborn(&[&h[..cut], &[0u8; 40][..]].concat()), "{cut} + zeros");
        }
        // ... a whole header line is a session, and anything else without a newline is damage.
        assert!(!unborn(&h));
        assert!(!unborn(&[header(), event(0)[..5].to_vec()].concat()));
        assert!(!unborn(b"e3069283 {\"type\":\"event\""));
        assert!(!unborn(b"not a session"));
        assert!(!unborn(b"e30692z3"));
        assert!(!unborn(&[b"e306".as_slice(), &[0u8; 4], b" {"].concat()));
    }

    #[test]
    fn empty_files_and_future_versions() {
        assert!(matches!(scan(b"", Path::new("p"), "s"), Err(LogError::Corrupt { line: 1, seq: 0, .. })));
        let future = line(r#"{"type":"session","version":3,"id":"s","createdAt":5,"new":true}"#);
        let err = scan(&future, Path::new("p"), "s").unwrap_err();
        assert!(matches!(err, LogError::UnsupportedFormat { found: 3, supported: 2, .. }), "{err}");
    }
}
