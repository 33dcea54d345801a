//! JSON helpers shared by the core: compact text, canonical text and key-order-free hashing,
//! and the one number policy ([`number`]).
//!
//! Values are `serde_json::Value` with `preserve_order`, so objects keep the key order they were
//! built or parsed with; that order is part of what is written to the log.

use std::cell::Cell;
use std::sync::Arc;

use serde_json::Value;

pub mod number;
pub use number::{parse_exact, push_number, Num, NumberError};

thread_local! {
    static SPARE: Cell<String> = const { Cell::new(String::new()) };
}

/// A `String` for writing one JSON text that is then copied out (into an `Arc<str>`, as the
/// log and messages hold text): taken from this thread's spare and given back when dropped, so
/// writing the texts of a loop turn allocates only their copies, not a buffer each too. One
/// taken while another is in use starts empty, as a new `String` would.
pub struct Scratch(String);

/// Spares above this are freed rather than kept (a 1 MB prompt is not held on to).
const KEEP: usize = 16 * 1024;

impl Scratch {
    pub fn new() -> Scratch {
        let mut text = SPARE.try_with(Cell::take).unwrap_or_default();
        text.clear();
        Scratch(text)
    }

    pub fn to_arc(&self) -> Arc<str> {
        Arc::from(self.0.as_str())
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let text = std::mem::take(&mut self.0);
        if text.capacity() <= KEEP {
            // During the thread's exit the spare is gone: the text is simply freed.
            let _ = SPARE.try_with(|spare| spare.set(text));
        }
    }
}

impl std::ops::Deref for Scratch {
    type Target = String;
    fn deref(&self) -> &String {
        &self.0
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut String {
        &mut self.0
    }
}

impl Clone for Scratch {
    fn clone(&self) -> Self {
        let mut copy = Scratch::new();
        copy.push_str(&self.0);
        copy
    }
}

impl PartialEq for Scratch {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Compact JSON text of `value` (no whitespace), keys in their stored order.
pub fn compact(value: &Value) -> String {
    // Serialising a `Value` cannot fail: it has no non-string keys and no non-finite floats.
    serde_json::to_string(value).unwrap_or_default()
}

/// Canonical JSON text: compact, object keys sorted recursively, ASCII only (other characters
/// as `\uXXXX` escapes, UTF-16 surrogate pairs beyond the BMP), numbers as [`push_number`]
/// writes them. It is the text of Python's `json.dumps(value, sort_keys=True,
/// separators=(",", ":"))`, so a host can compare it with that of a value it could not convert
/// (the binding does, for request options). Two values that compare equal have the same
/// canonical text.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => push_number(out, n),
        Value::String(s) => push_ascii_literal(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_ascii_literal(out, key);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string literal in ASCII, as Python's `json.dumps` writes it (`ensure_ascii`).
fn push_ascii_literal(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                for unit in c.encode_utf16(&mut [0u16; 2]) {
                    out.push_str("\\u");
                    for shift in [12, 8, 4, 0] {
                        out.push(HEX[usize::from((*unit >> shift) & 0xf)] as char);
                    }
                }
            }
        }
    }
    out.push('"');
}

/// Appends `s` to `out` as a JSON string literal, escaped exactly as `serde_json` escapes it
/// (`"`, `\\`, and control characters; everything else, non-ASCII included, as it is).
pub fn push_str_literal(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Most strings here (ids, event types, prose) need no escaping. This test has no early
    // exit, so the compiler checks 32 bytes at a time; a per-byte loop cost ~7 instructions
    // a byte on every event.
    #[allow(clippy::needless_bitwise_bool, reason = "`|` on purpose: no short circuit, so the test vectorises")]
    let dirty = s.bytes().fold(false, |dirty, b| dirty | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if dirty {
        push_escaped(out, s);
    } else {
        out.push_str(s);
    }
    out.push('"');
}

fn push_escaped(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        // Escaped bytes are ASCII, so `start..i` falls on character boundaries.
        out.push_str(&s[start..i]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        } else {
            out.push_str(short);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

/// Whether JSON text written by this crate may hold the string `s` as a value: a cheap
/// filter before parsing, never the comparison itself (`"a"` also occurs as a key, or inside
/// a longer text's escapes). Strings are written by [`push_str_literal`], so `s` occurs as
/// that literal, quotes included; text holding any `\u` escape is let through too, since
/// such an escape can spell any character another writer chose to escape.
pub fn may_hold_string(json: &str, s: &str) -> bool {
    let mut literal = String::with_capacity(s.len() + 2);
    push_str_literal(&mut literal, s);
    json.contains(literal.as_str()) || json.contains("\\u")
}

/// Whether JSON `text` nests arrays and objects more than `limit` deep (brackets inside strings
/// are not counted). A check made before decoding, so that what is too deep does not depend on
/// the decoder: Python 3.13's decodes depths that 3.12's refuses with `RecursionError`.
pub fn nests_deeper_than(text: &str, limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in text.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Appends `n` in decimal (without `format!`, whose machinery costs more than the rest of
/// building a small payload).
pub fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nesting_depth_is_counted_outside_strings() {
        assert!(!nests_deeper_than("[[1]]", 2));
        assert!(nests_deeper_than("[[[1]]]", 2));
        assert!(!nests_deeper_than(r#"{"a": "[[[[[[", "b": [{"c": 1}]}"#, 3));
        assert!(!nests_deeper_than(r#"["\"[[[[", []]"#, 2));
        assert!(nests_deeper_than(r#"{"a": {"b": {"c": {}}}}"#, 3));
        assert!(!nests_deeper_than("[1], [2], [3]", 1)); // depth, not count
    }

    #[test]
    fn scratch_texts_are_reused_and_independent() {
        let mut a = Scratch::new();
        a.push_str("first");
        let arc = a.to_arc();
        let kept = a.capacity();
        drop(a);
        let mut b = Scratch::new();
        assert!(b.is_empty());
        assert!(b.capacity() >= kept, "the spare came back");
        // A second one while the first is in use starts empty and apart.
        let mut c = Scratch::new();
        b.push('b');
        c.push('c');
        assert_eq!((&**b, &**c, &*arc), ("b", "c", "first"));
        let mut big = Scratch::new();
        big.push_str(&"x".repeat(KEEP + 1));
        drop(big);
        assert!(Scratch::new().capacity() <= KEEP, "a large spare is not kept");
    }

    #[test]
    fn string_literals_are_escaped_as_serde_json_escapes_them() {
        let mut cases: Vec<String> = (0u8..0x80).map(|b| format!("a{}b", b as char)).collect();
        cases.extend(
            ["", "plain text", "é\u{2028}\u{10FFFF}", "\"\\\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}", "tail\\", "\"head"].map(String::from),
        );
        cases.push((0u8..0x80).map(char::from).chain("日本語".chars()).collect());
        for s in cases {
            let mut out = String::from("[");
            push_str_literal(&mut out, &s);
            assert_eq!(out[1..], serde_json::to_string(&s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn may_hold_string_finds_ids_json_escapes_and_not_bare_substrings() {
        for id in ["q\"uote", "back\\slash", "ctl\u{1}", "nl\n", "a", "é"] {
            let text = serde_json::to_string(&json!({"inserted": [{"id": id}]})).unwrap();
            assert!(may_hold_string(&text, id), "{id:?} in {text}");
        }
        // A short id inside other text is not the string "a" (the parse decides anyway).
        assert!(!may_hold_string(r#"{"text":"banana"}"#, "a"));
        assert!(may_hold_string(r#"{"text":"\u0041"}"#, "A"));
    }

    #[test]
    #[allow(clippy::unreadable_literal, reason = "the extreme integers, digit for digit")]
    fn canonical_text_is_python_json_dumps_sorted_and_compact() {
        // Each text is Python's `json.dumps(value, sort_keys=True, separators=(",", ":"))`.
        let value = json!({"é": "日本\u{1F600}\u{7f}\u{0}\"\\\n", "b": [1.5e-7, -0.0, 1e16, 100.0, -9223372036854775808i64, 18446744073709551615u64], "a": true});
        assert_eq!(
            canonical(&value),
            r#"{"a":true,"b":[1.5e-07,-0.0,1e+16,100.0,-9223372036854775808,18446744073709551615],"\u00e9":"\u65e5\u672c\ud83d\ude00\u007f\u0000\"\\\n"}"#
        );
        // Keys sort by code point, as Python's `str` comparison sorts them.
        assert_eq!(canonical(&json!({"\u{e000}": 1, "\u{1F600}": 2, "z": 3})), r#"{"z":3,"\ue000":1,"\ud83d\ude00":2}"#);
    }

    #[test]
    fn canonical_sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": 1}], "c": null}});
        assert_eq!(canonical(&a), r#"{"a":{"c":null,"d":[1,{"y":1,"z":0}]},"b":1}"#);
    }

    #[test]
    fn compact_keeps_insertion_order() {
        let a = json!({"b": 1, "a": 2});
        assert_eq!(compact(&a), r#"{"b":1,"a":2}"#);
    }

    #[test]
    fn string_literals_are_escaped() {
        let mut out = String::new();
        push_str_literal(&mut out, "a\"b\n");
        assert_eq!(out, r#""a\"b\n""#);
        for s in ["plain/type-1", "", "é", "\u{7f}", "a\\b", "\t", "\u{2028}"] {
            let mut out = String::new();
            push_str_literal(&mut out, s);
            assert_eq!(out, serde_json::to_string(s).unwrap());
        }
    }
}
