//! A JSON scanner for payload fields: an object's members (or an array's items) as slices of
//! the text, each value left as its raw JSON. It checks only the structure it walks through
//! (quotes, brackets, colons, commas) and skips strings, nested values and numbers without
//! validating them: the log's payloads are valid JSON already (serde wrote them, or checked
//! them when the log was read), and the span fold reads a few fields of payloads whose
//! message content it never looks at. On text that is not valid JSON it gives `None` or
//! some slices, never a panic.

use std::borrow::Cow;

fn space(b: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(at) {
        at += 1;
    }
    at
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` that may equal `byte`: exact for the lowest such byte
/// (a borrow can only mark bytes above a true match).
fn bytes_equal(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The index after the closing quote of the string whose opening quote is at `at`, and
/// whether the string holds an escape. Eight bytes are looked at a time: payload strings
/// (ids, texts, arguments) are most of what is skipped.
fn string_end(b: &[u8], at: usize) -> Option<(usize, bool)> {
    let mut i = at + 1;
    let mut escaped = false;
    loop {
        if let Some(chunk) = b.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let word = u64::from_le_bytes(word);
            let found = bytes_equal(word, b'"') | bytes_equal(word, b'\\');
            if found == 0 {
                i += 8;
                continue;
            }
            i += (found.trailing_zeros() / 8) as usize;
        }
        match b.get(i)? {
            b'"' => return Some((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                i += 2;
            }
            _ => i += 1,
        }
    }
}

/// The index after the array or object that opens at `at`. One byte at a time outside strings:
/// a message's structure puts a quote every few bytes, so eight-byte steps would not pay there.
fn nested_end(b: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = at;
    loop {
        match b.get(i)? {
            b'"' => {
                i = string_end(b, i)?.0;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// The index after the value that starts at `at`.
fn value_end(b: &[u8], at: usize) -> Option<usize> {
    match b.get(at)? {
        b'"' => string_end(b, at).map(|(end, _)| end),
        b'{' | b'[' => nested_end(b, at),
        b',' | b'}' | b']' | b':' => None,
        _ => {
            // a number, true, false or null: up to the next delimiter
            let mut i = at + 1;
            while let Some(c) = b.get(i) {
                if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                i += 1;
            }
            Some(i)
        }
    }
}

/// Calls `f(key, value)` for each member of the object `text` (in order; a key that appears
/// twice is seen twice), with the key unescaped and the value as its JSON text. `None` when
/// `text` is not an object.
pub fn members<'a>(text: &'a str, mut f: impl FnMut(&str, &'a str)) -> Option<()> {
    walk_members(text, 0, |key, at| {
        let stop = value_end(text.as_bytes(), at)?;
        f(key, text.get(at..stop)?);
        Some(stop)
    })
    .map(drop)
}

/// `members`, with the value that starts at `bulk.start` taken to end at `bulk.end`, not
/// walked: the caller knows where that value ends (`read::object_skipping` checks the range
/// against the text first). `None` when `text` is not an object, or when what follows the
/// range is not the rest of one; else the index after the object.
pub fn members_skipping<'a>(text: &'a str, bulk: std::ops::Range<usize>, mut f: impl FnMut(&str, &'a str)) -> Option<usize> {
    walk_members(text, 0, |key, at| {
        let stop = if at == bulk.start { bulk.end } else { value_end(text.as_bytes(), at)? };
        f(key, text.get(at..stop)?);
        Some(stop)
    })
}

/// Calls `f(item)` for each item of the array `text`, as its JSON text. `None` when `text` is
/// not an array.
pub fn items<'a>(text: &'a str, mut f: impl FnMut(&'a str)) -> Option<()> {
    walk_items(text, 0, |at| {
        let stop = value_end(text.as_bytes(), at)?;
        f(text.get(at..stop)?);
        Some(stop)
    })
    .map(drop)
}

/// The index after the JSON value that starts at `at` (after any space).
pub fn skip(text: &str, at: usize) -> Option<usize> {
    value_end(text.as_bytes(), space(text.as_bytes(), at))
}

/// Walks the object that starts at `at` (after any space) in one pass: `f(key, start)` is
/// given each member's key and the index its value starts at, and returns the index after the
/// value — by `skip`, or by reading the value itself (`walk_members`, `walk_items`), so a
/// nested value a caller reads is walked once rather than skipped and then read. Gives the
/// index after the object; `None` when no object starts at `at`. Inlined: `members` is a
/// closure over it, and a call per member would cost what the scan of a short member costs.
#[allow(clippy::inline_always, reason = "members and items are thin wrappers: no call for their walk")]
#[inline(always)]
pub fn walk_members(text: &str, at: usize, mut f: impl FnMut(&str, usize) -> Option<usize>) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = space(b, at);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = space(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (end, escaped) = string_end(b, i)?;
        let key = key(text.get(i + 1..end - 1)?, escaped)?;
        i = space(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = space(b, i + 1);
        let stop = f(&key, i)?;
        i = space(b, stop);
        match b.get(i)? {
            b',' => i = space(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Walks the array that starts at `at` (after any space) in one pass, as `walk_members` walks
/// an object: `f(start)` returns the index after the item that starts at `start`.
#[allow(clippy::inline_always, reason = "members and items are thin wrappers: no call for their walk")]
#[inline(always)]
pub fn walk_items(text: &str, at: usize, mut f: impl FnMut(usize) -> Option<usize>) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = space(b, at);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = space(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        let stop = f(i)?;
        i = space(b, stop);
        match b.get(i)? {
            b',' => i = space(b, i + 1),
            b']' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Whether the array or object `text` has no member (`[]`, `{ }`).
pub fn is_empty(text: &str) -> bool {
    let b = text.as_bytes();
    let open = space(b, 0);
    matches!(b.get(open), Some(b'[' | b'{')) && matches!(b.get(space(b, open + 1)), Some(b']' | b'}'))
}

/// A key's text, unescaped when it holds an escape (keys rarely do: that case is a call of its
/// own, so the common one is inlined into the walk).
#[inline]
fn key(raw: &str, escaped: bool) -> Option<Cow<'_, str>> {
    if !escaped {
        return Some(Cow::Borrowed(raw));
    }
    unescaped(raw)
}

#[cold]
fn unescaped(raw: &str) -> Option<Cow<'_, str>> {
    let mut quoted = String::with_capacity(raw.len() + 2);
    quoted.push('"');
    quoted.push_str(raw);
    quoted.push('"');
    serde_json::from_str::<String>(&quoted).ok().map(Cow::Owned)
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
