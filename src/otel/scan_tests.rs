//! The scanner against `serde_json` on generated JSON: the same members and items, with the same
//! raw text, at every depth; and no panic on text that is not JSON.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::{is_empty, items, members, skip, string_end};

/// xorshift64*: a fixed sequence, so a failure is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[usize::try_from(self.below(from.len() as u64)).unwrap()]
    }
}

const SPACES: [&str; 5] = ["", "", "", " ", "\n\t "];
/// Pieces of strings: plain text, escapes, JSON's structural characters, non-ASCII text.
const PIECES: [&str; 16] =
    ["turn", "a", "", "\\\"", "\\\\", "\\n", "\\u00e9", "\\ud83d\\ude00", "é", "😀", "{", "}]", "[,:", " ", "\\/", "x\\\\\\\""];
const KEYS: [&str; 8] = ["turn", "step", "t\\u0075rn", "message", "content", "", "type", "é"];

fn space(rng: &mut Rng) -> &'static str {
    rng.pick(&SPACES)
}

fn string(rng: &mut Rng, out: &mut String) {
    out.push('"');
    for _ in 0..rng.below(4) {
        out.push_str(rng.pick(&PIECES));
    }
    out.push('"');
}

fn value(rng: &mut Rng, depth: u32, out: &mut String) {
    let kind = if depth >= 4 { rng.below(6) } else { rng.below(8) };
    match kind {
        0 => out.push_str(rng.pick(&["null", "true", "false"])),
        1 => out.push_str(&(rng.next() as i64 >> rng.below(64)).to_string()),
        2 => out.push_str(rng.pick(&["0", "-0", "1.5", "-2e10", "3E-2", "18446744073709551616", "0.0", "1e300"])),
        3..=5 => string(rng, out),
        6 => {
            out.push('[');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(space(rng));
                value(rng, depth + 1, out);
                out.push_str(space(rng));
            }
            out.push(']');
        }
        _ => object(rng, depth, out),
    }
}

fn object(rng: &mut Rng, depth: u32, out: &mut String) {
    out.push('{');
    out.push_str(space(rng));
    for i in 0..rng.below(5) {
        if i > 0 {
            out.push(',');
            out.push_str(space(rng));
        }
        if rng.below(2) == 0 {
            out.push('"');
            out.push_str(rng.pick(&KEYS)); // repeated keys, escaped keys
            out.push('"');
        } else {
            string(rng, out);
        }
        out.push_str(space(rng));
        out.push(':');
        out.push_str(space(rng));
        value(rng, depth + 1, out);
        out.push_str(space(rng));
    }
    out.push('}');
}

/// An object's members as serde reads them: in order, duplicates kept.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, &RawValue>()? {
                    out.push(entry);
                }
                Ok(Members(out))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// The scanner reads `text` (valid JSON) as serde does, and each nested value too.
fn agrees(text: &str) {
    let parsed: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mut scanned = Vec::new();
    let found = members(text, |k, v| scanned.push((k.to_owned(), v)));
    if parsed.is_object() {
        let serde: Members<'_> = serde_json::from_str(text).unwrap();
        let serde: Vec<(String, &str)> = serde.0.into_iter().map(|(k, v)| (k, v.get())).collect();
        assert_eq!(found, Some(()), "{text}");
        assert_eq!(scanned, serde, "{text}");
        assert_eq!(is_empty(text), serde.is_empty(), "{text}");
        for (_, v) in &scanned {
            agrees(v);
        }
    } else {
        assert_eq!(found, None, "{text}");
    }
    let mut listed = Vec::new();
    let found = items(text, |v| listed.push(v));
    if parsed.is_array() {
        let serde: Vec<&RawValue> = serde_json::from_str(text).unwrap();
        let serde: Vec<&str> = serde.into_iter().map(RawValue::get).collect();
        assert_eq!((found, &listed), (Some(()), &serde), "{text}");
        assert_eq!(is_empty(text), serde.is_empty(), "{text}");
        for v in &listed {
            agrees(v);
        }
    } else {
        assert_eq!(found, None, "{text}");
    }
}

#[test]
fn members_and_items_are_those_serde_reads() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut text = String::new();
        if rng.below(4) == 0 {
            value(&mut rng, 0, &mut text);
        } else {
            object(&mut rng, 0, &mut text);
        }
        agrees(&text);
    }
}

#[test]
fn text_that_is_not_json_reads_as_absent_or_as_serde_reads_it_never_a_panic() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let edits: [u8; 10] = *b"\"{}[],:\\ 1";
    for _ in 0..20_000 {
        let mut text = String::new();
        object(&mut rng, 0, &mut text);
        let mut bytes = text.into_bytes();
        for _ in 0..=rng.below(3) {
            let at = usize::try_from(rng.below(bytes.len() as u64 + 1)).unwrap();
            let edit = edits[usize::try_from(rng.below(10)).unwrap()];
            match rng.below(3) {
                0 if at < bytes.len() => bytes[at] = edit,
                1 if at < bytes.len() => _ = bytes.remove(at),
                _ => bytes.insert(at, edit),
            }
        }
        let Ok(text) = String::from_utf8(bytes) else { continue };
        // valid text must read as serde reads it; any other text only must not panic
        if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
            agrees(&text);
        } else {
            let _ = members(&text, |_, v| _ = items(v, |_| ()));
            let _ = is_empty(&text);
        }
    }
}

#[test]
fn escaped_keys_are_read_unescaped() {
    let mut seen = Vec::new();
    members(r#"{"t\u0075rn": 1, "a\"b" :[1, {"x":"}"}] }"#, |k, v| seen.push((k.to_owned(), v)));
    assert_eq!(seen, [("turn".to_owned(), "1"), ("a\"b".to_owned(), r#"[1, {"x":"}"}]"#)]);
}

fn pick_value(rng: &mut Rng, out: &mut String, shaped: impl FnOnce(&mut Rng, &mut String)) {
    if rng.below(5) == 0 {
        value(rng, 2, out);
    } else {
        shaped(rng, out);
    }
}

/// An object of one to three members, each a key of `keys` (or another) and its value.
fn members_of(rng: &mut Rng, out: &mut String, keys: &[&str], mut member: impl FnMut(&mut Rng, &str, &mut String)) {
    out.push('{');
    for i in 0..=rng.below(3) {
        if i > 0 {
            out.push(',');
        }
        let key = if rng.below(6) == 0 { "other" } else { rng.pick(keys) };
        out.push_str(space(rng));
        out.push('"');
        out.push_str(key);
        out.push_str("\":");
        out.push_str(space(rng));
        member(rng, key, out);
    }
    out.push('}');
}

fn block(rng: &mut Rng, out: &mut String) {
    members_of(rng, out, &["type", "toolCallId", "isError", "content", "text"], |rng, key, out| match key {
        "type" => out.push_str(rng.pick(&["\"tool-result\"", "\"text\"", "\"tool-\\u0072esult\"", "1"])),
        _ => value(rng, 2, out),
    });
}

fn message(rng: &mut Rng, out: &mut String) {
    members_of(rng, out, &["source", "content"], |rng, key, out| match key {
        "source" => pick_value(rng, out, |rng, out| members_of(rng, out, &["callId"], |rng, _, out| value(rng, 3, out))),
        "content" => pick_value(rng, out, |rng, out| {
            out.push('[');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                pick_value(rng, out, block);
            }
            out.push(']');
        }),
        _ => value(rng, 2, out),
    });
}

#[test]
fn a_tool_result_read_in_one_pass_reads_as_its_views_read_it() {
    use super::super::read::{self, Message};
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut with_block = 0;
    for _ in 0..20_000 {
        let mut text = String::new();
        members_of(&mut rng, &mut text, &["message", "error"], |rng, key, out| match key {
            "message" => pick_value(rng, out, message),
            _ => value(rng, 2, out),
        });
        let result: read::Result<'_> = read::object(&text).unwrap();
        let message: Message<'_> = read::field(result.message).unwrap_or_default();
        let expected = read::ToolResult {
            source: read::field(message.source),
            block: read::blocks(message.content).into_iter().find(|b| read::text(b.kind).as_deref() == Some("tool-result")),
            error: result.error,
        };
        with_block += usize::from(expected.block.is_some());
        assert_eq!(read::tool_result(&text), Some(expected), "{text}");
    }
    // the generator reaches the case that matters
    assert!(with_block > 500, "{with_block}");
}

/// Pieces of a string's text: quotes, backslashes and brackets land at every offset mod 8 of
/// the eight-byte skips, and runs of plain text cross their boundaries.
const TEXTS: [&str; 14] = ["a", "\"", "\\", "\n", "\u{1}", "é", "😀", "/", "{", "]", "[}", " ", "\u{7f}", "xxxxxxxxx"];

#[test]
fn strings_and_nested_values_end_where_serde_ends_them() {
    let mut rng = Rng(0x0bad_5eed_dead_beef);
    for _ in 0..20_000 {
        let mut plain = String::new();
        for _ in 0..rng.below(40) {
            plain.push_str(rng.pick(&TEXTS));
        }
        let literal = serde_json::to_string(&plain).unwrap();
        let pad = " ".repeat(usize::try_from(rng.below(16)).unwrap());
        // after the string, text a skip that went too far or stopped short would read as its end
        let tail = rng.pick(&["", "\"", "\\\"", "\"]", ",\"x\"}"]);
        let text = format!("{pad}{literal}{tail}");
        let at = pad.len();
        assert_eq!(string_end(text.as_bytes(), at), Some((at + literal.len(), literal.contains('\\'))), "{text}");
        // a string cut anywhere before its closing quote has no end
        for cut in at + 1..at + literal.len() {
            assert_eq!(string_end(&text.as_bytes()[..cut], at), None, "{}", String::from_utf8_lossy(&text.as_bytes()[..cut]));
        }
        let nested = format!("{pad}[{literal}, {{{literal}: [{literal}, {{}}]}}, []]{tail}");
        let parsed: &RawValue = serde_json::from_str(&nested[..nested.len() - tail.len()]).unwrap();
        assert_eq!(skip(&nested, 0), Some(pad.len() + parsed.get().len()), "{nested}");
    }
}
