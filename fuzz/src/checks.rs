//! What each fuzz target checks. Every function takes arbitrary bytes and panics only when
//! kerman breaks a rule stated here (or panics itself).
//!
//! Compiled twice: by the fuzz crate and, through `#[path]`, by kerman's integration tests
//! (which replay `fuzz/corpus` and `fuzz/regressions`), so it uses only kerman, `serde_json` and
//! crc32c, which both builds have.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use kerman::event_log::file::raw;
use kerman::inbox::{Lists, Splice, Target};
use kerman::{LogError, Message};
use serde_json::Value;

/// The session every record-reader input belongs to, and a valid header for it.
const ID: &str = "f";
const HEADER: &[u8] = b"26589e1f {\"type\":\"session\",\"version\":1,\"id\":\"f\",\"createdAt\":0}\n";

/// `<crc> <json>\n`, as the writer frames a record.
fn frame(out: &mut Vec<u8>, json: &str) {
    frame_bytes(out, json.as_bytes(), true);
}

fn frame_bytes(out: &mut Vec<u8>, json: &[u8], newline: bool) {
    out.extend_from_slice(format!("{:08x} ", crc32c::crc32c(json)).as_bytes());
    out.extend_from_slice(json);
    if newline {
        out.push(b'\n');
    }
}

// ---------------------------------------------------------------------------------------------
// record_reader

/// The input's first line through `unframe`; the input as a whole file (so header damage is
/// fuzzed too); and the input after a valid header, which must never be refused. Mutations
/// almost never keep a checksum right, so an input that starts like a JSON record is also read
/// as JSON lines, each framed with its correct checksum: that is what reaches the envelope rules.
pub fn record_reader(data: &[u8]) {
    check_unframe(data.split(|&b| b == b'\n').next().unwrap_or(data));
    check_scan(data);
    check_after_header(data);
    if data.first() == Some(&b'{') {
        let mut framed = Vec::new();
        let mut lines = data.split(|&b| b == b'\n').peekable();
        while let Some(line) = lines.next() {
            let last = lines.peek().is_none();
            if !(last && line.is_empty()) {
                frame_bytes(&mut framed, line, !last);
            }
        }
        check_after_header(&framed);
    }
}

fn check_after_header(records: &[u8]) {
    let file = [HEADER, records].concat();
    assert!(raw::scan(&file, ID).is_ok(), "a valid header was refused");
    check_scan(&file);
}

/// An accepted line is exactly `<crc of the rest> <rest>`: framing it again gives it back.
fn check_unframe(line: &[u8]) {
    if let Ok(json) = raw::unframe(line) {
        let mut again = Vec::new();
        frame(&mut again, json);
        assert_eq!(&again[..again.len() - 1], line, "unframe accepted a line the writer would not write");
    }
}

/// Rules for any file `raw::scan` accepts (a refused header is all there is to check).
fn check_scan(bytes: &[u8]) {
    let Ok(s) = raw::scan(bytes, ID) else { return };
    let len = bytes.len() as u64;
    let good = usize::try_from(s.good_len).expect("an offset into the input");
    assert!(s.good_len <= len);
    for (i, e) in s.events.iter().enumerate() {
        assert_eq!(e.seq, i as u64, "events must be numbered from 0 without gaps");
    }
    match &s.corruption {
        Some(LogError::Corrupt { line, seq, .. }) => {
            assert_eq!((*seq, *line), (s.events.len() as u64, s.events.len() as u64 + 2));
            assert!(s.good_len < len);
        }
        Some(other) => panic!("corruption reported as {other:?}"),
        None => {}
    }

    // The kept prefix reads back identically, with nothing left over.
    let prefix = raw::scan(&bytes[..good], ID).expect("the good prefix was refused");
    assert_eq!(prefix.events, s.events);
    assert_eq!(prefix.good_len, s.good_len);
    assert!(prefix.corruption.is_none());

    // The events written again as the writer writes them read back identically.
    let header_end = bytes.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut again = bytes[..header_end].to_vec();
    for e in &s.events {
        frame(&mut again, &e.to_json());
    }
    let rewritten = raw::scan(&again, ID).expect("re-encoded events were refused");
    assert_eq!(rewritten.events, s.events, "an event changed when written again");
    assert_eq!(rewritten.good_len, again.len() as u64);

    // A corrupt file repairs into a clean one that keeps the records before the damage as they
    // were, a record for every kept record and lost seq, and the closing `log/repaired`.
    if s.corruption.is_some() {
        let (repaired, kept) = raw::repair(bytes, ID).expect("repair refused a readable header").expect("corrupt");
        let r = raw::scan(&repaired, ID).expect("the repaired header was refused");
        assert!(r.corruption.is_none() && r.good_len == repaired.len() as u64, "the repaired file is not clean");
        assert_eq!(r.events[..s.events.len()], s.events[..], "repair changed the records before the damage");
        assert_eq!(r.events.last().map(kerman::Event::kind), Some("log/repaired"));
        let placeholders = r.events.iter().filter(|e| e.kind() == "log/damaged").count() as u64;
        assert!(kept + placeholders + 1 >= r.events.len() as u64, "repair invented records");
    }

    // A valid record after damage whose lines are all terminated turns a torn tail into
    // corruption; after a clean file it is simply the next event when its seq fits.
    if !bytes.ends_with(b"\n") {
        return;
    }
    let next = s.events.len();
    let mut more = bytes.to_vec();
    frame(&mut more, &format!(r#"{{"type":"x/y","seq":{next},"time":0,"data":null}}"#));
    let after = raw::scan(&more, ID).expect("appending a record made the header invalid");
    if s.good_len < len {
        assert!(after.corruption.is_some(), "damage followed by a valid record was not corruption");
        assert_eq!((after.events.len(), after.good_len), (next, s.good_len));
    } else {
        assert!(after.corruption.is_none());
        assert_eq!((after.events.len(), after.good_len), (next + 1, more.len() as u64));
    }
}

// ---------------------------------------------------------------------------------------------
// splice_validator

fn user(id: &str) -> Arc<Message> {
    let block = serde_json::json!({"type": "text", "text": id});
    Arc::new(Message::user(vec![block], None, Some(id.into())).expect("a valid message"))
}

/// Lists with something in both: `a`, `b` queued for the next turn and `c` for the next step,
/// so fuzzed splices can remove, replace and collide with pending ids.
fn seeded_lists() -> Lists {
    let mut lists = Lists::default();
    for (target, ids) in [(Target::NextTurn, ["a", "b"].as_slice()), (Target::NextStep, ["c"].as_slice())] {
        let inserted = ids.iter().map(|id| user(id)).collect();
        lists.splice(&Splice { target, start: 0, removed: 0, inserted, canceled: false, by: None }).expect("seed splice");
    }
    lists
}

/// The input is one splice payload, or a list of them replayed in order against the seeded
/// lists. `validate` and `splice` must agree; a refused splice changes nothing; an accepted one
/// does exactly a `Vec::splice`, and no id is ever pending twice.
pub fn splice_validator(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let payloads = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    let mut lists = seeded_lists();
    let mut seen: HashSet<String> = ["a", "b", "c"].map(String::from).into();
    for payload in &payloads {
        let Ok(splice) = Splice::from_value(payload) else { continue };
        check_splice_payload(&splice);
        seen.extend(splice.inserted.iter().map(|m| m.id().to_string()));
        let (turn, step) = (lists.next_turn().to_vec(), lists.next_step().to_vec());
        let verdict = lists.validate(&splice);
        match (verdict, lists.splice(&splice)) {
            (Err(said), Err(did)) => {
                assert_eq!(said, did);
                assert_eq!((lists.next_turn(), lists.next_step()), (&turn[..], &step[..]), "a refused splice changed the lists");
            }
            (Ok(()), Ok(removed)) => {
                let (mut want_turn, mut want_step) = (turn, step);
                let list = if splice.target == Target::NextTurn { &mut want_turn } else { &mut want_step };
                let range = splice.start..splice.start + splice.removed;
                let want_removed: Vec<_> = list.splice(range, splice.inserted.iter().cloned()).collect();
                assert_eq!(removed, want_removed);
                assert_eq!((lists.next_turn(), lists.next_step()), (&want_turn[..], &want_step[..]));
            }
            (said, did) => panic!("validate said {said:?} but splice did {did:?}"),
        }
        check_index(&lists, &seen);
    }
}

/// What is logged for a splice parses back to the same splice.
fn check_splice_payload(splice: &Splice) {
    let text = splice.to_json();
    let value: Value = serde_json::from_str(&text).expect("a splice payload that is not JSON");
    let back = Splice::from_value(&value).expect("a logged splice payload was refused");
    assert_eq!((back.target, back.start, back.removed), (splice.target, splice.start, splice.removed), "{text}");
    assert_eq!(back.inserted, splice.inserted, "{text}");
    assert_eq!(back.canceled, splice.canceled && splice.removed > 0, "{text}");
}

/// Every pending id is pending once and known to the index; no other id is.
fn check_index(lists: &Lists, seen: &HashSet<String>) {
    let mut pending = HashSet::new();
    for m in lists.next_turn().iter().chain(lists.next_step()) {
        assert!(pending.insert(m.id()), "id {:?} is pending twice", m.id());
        assert!(lists.contains(m.id()), "pending id {:?} missing from the index", m.id());
    }
    for id in seen {
        assert_eq!(lists.contains(id), pending.contains(id.as_str()), "index out of step for {id:?}");
    }
    assert_eq!(lists.len(), pending.len());
}

// ---------------------------------------------------------------------------------------------
// message_from_json

fn hash_of(m: &Message) -> u64 {
    let mut h = DefaultHasher::new();
    m.hash(&mut h);
    h.finish()
}

/// An accepted message keeps exactly what it was given: `to_value` and the logged JSON text
/// both give the input back, and import again to an equal message with the same hash.
pub fn message_from_json(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let Ok(m) = Message::from_value(&value) else { return };
    assert_eq!(m.to_value(), value, "from_value dropped or invented something");
    let back = Message::from_value(&m.to_value()).expect("to_value gave a message from_value refuses");
    assert_eq!(back, m);
    assert_eq!(hash_of(&back), hash_of(&m));
    let logged: Value = serde_json::from_str(m.json()).expect("the logged text is not JSON");
    assert_eq!(logged, value, "the logged text does not read back as the message");
    assert_eq!(Message::from_value(&logged).expect("the logged message was refused"), m);
    assert_eq!(m.with_content(m.content().to_vec()).expect("its own content was refused"), m);
}
