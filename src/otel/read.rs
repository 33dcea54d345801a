//! The few payload fields the span fold reads, found in the event's JSON text by a scanner
//! (`scan.rs`) without building a `Value` of the payload or validating what it skips (messages'
//! content). Each field is its raw JSON text, read as the typed views read it (`kerman.events`):
//! an int is an integer (not a float or a bool), a str a string; anything else is absent. A
//! view of an object is absent when the text is not an object (a lenient read: a field of
//! another type than the one expected reads as absent), and a key given twice is read as its
//! last value, as Python's `json` reads it.

use std::borrow::Cow;

use super::scan;

/// A field's value as its JSON text.
pub type Raw<'a> = &'a str;

/// An integer field as `kerman.events` reads one (`value.__class__ is int`).
pub fn int(raw: Option<Raw<'_>>) -> Option<i64> {
    raw.and_then(|r| r.parse::<i64>().ok())
}

/// A string field (`value.__class__ is str`).
pub fn string(raw: Option<Raw<'_>>) -> Option<String> {
    text(raw).map(Cow::into_owned)
}

/// A string field, borrowed from the payload when it has no escapes.
pub fn text(raw: Option<Raw<'_>>) -> Option<Cow<'_, str>> {
    let text = raw?;
    if text.len() < 2 || !text.starts_with('"') || !text.ends_with('"') {
        return None;
    }
    if !text.contains('\\') {
        return Some(Cow::Borrowed(&text[1..text.len() - 1]));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

/// Whether a field is the JSON `true`.
pub fn is_true(raw: Option<Raw<'_>>) -> bool {
    raw == Some("true")
}

/// Python's truth of a JSON value: not null, false, 0, "", [] or {}.
pub fn truthy(raw: Option<Raw<'_>>) -> bool {
    let Some(text) = raw else { return false };
    match text {
        "null" | "false" | "\"\"" => false,
        _ if text.starts_with('[') || text.starts_with('{') => !scan::is_empty(text),
        _ => text.parse::<f64>() != Ok(0.0),
    }
}

/// A view of an object's fields: each field the raw text of the member of that key.
pub trait View<'a>: Default {
    /// Sets the field that `key` names (if any) to `value`.
    fn set(&mut self, key: &str, value: Raw<'a>);
}

/// Declares a view: a struct of optional raw fields, each read from the member of its key.
macro_rules! view {
    ($(#[$doc:meta])* $name:ident { $($field:ident: $key:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct $name<'a> {
            $(pub $field: Option<Raw<'a>>,)*
        }

        impl<'a> View<'a> for $name<'a> {
            fn set(&mut self, key: &str, value: Raw<'a>) {
                match key {
                    $($key => self.$field = Some(value),)*
                    _ => {}
                }
            }
        }
    };
}

view! {
    /// `{turn, step, ...}`: every loop payload's head.
    Head { turn: "turn", step: "step" }
}

view! {
    /// `assistant/message {turn, step, interrupted?, usage?}`.
    Reply { turn: "turn", step: "step", interrupted: "interrupted", usage: "usage" }
}

view! {
    /// `assistant/chunk {chunk}`.
    WithChunk { chunk: "chunk" }
}

view! {
    /// A chunk's fields the fold reads (`{type, reason?, partial?, model?, provider?}`; a failed
    /// `finish` names the model that failed when a `Fallback` tried several).
    Chunk { kind: "type", reason: "reason", partial: "partial", model: "model", provider: "provider" }
}

view! {
    /// The usage fields a request's totals and its model come from.
    UsageFields {
        input: "input",
        cache_read: "cacheRead",
        cache_write: "cacheWrite",
        output: "output",
        reasoning: "reasoning",
        model: "model",
        provider: "provider",
        partial: "partial",
    }
}

view! {
    /// `context/compacted {model?, usage?, turn?}`.
    Compacted { turn: "turn", model: "model", usage: "usage" }
}

view! {
    /// `request/header {options}`.
    Header { options: "options" }
}

view! {
    /// A request's options: the model it asked for.
    Options { model: "model" }
}

view! {
    /// `tool/call {turn, callId, name}`.
    Call { turn: "turn", id: "callId", name: "name" }
}

#[cfg(test)]
view! {
    /// `tool/result {message, error?}` (`tool_result` reads it in one pass).
    Result { message: "message", error: "error" }
}

#[cfg(test)]
view! {
    /// A message's `{source, content}`.
    Message { source: "source", content: "content" }
}

view! {
    /// A message source's `callId`, a content block's `type`, a tool-result block's
    /// `toolCallId`, `isError` and `content`, a text block's `text`.
    Block {
        kind: "type",
        tool_call_id: "toolCallId",
        call_id: "callId",
        is_error: "isError",
        content: "content",
        text: "text",
    }
}

view! {
    /// `turn/end {turn, reason}`.
    End { turn: "turn", reason: "reason" }
}

view! {
    /// An ending's `{kind, error?}`, a failure's `{code, message}`.
    Reason { kind: "kind", error: "error", code: "code", message: "message" }
}

/// What the fold reads of a `tool/result {message: {source, content}, error?}`: the message
/// source's `callId`, the first `tool-result` block of the content, and the error.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ToolResult<'a> {
    pub source: Option<Block<'a>>,
    pub block: Option<Block<'a>>,
    pub error: Option<Raw<'a>>,
}

/// Reads a tool result's payload in one pass: the message and its content are read as they
/// are walked, not skipped first and read after (a result's content is most of its text).
/// Reads what `object::<Result>`, then `field::<Message>` of its message, `blocks` of the
/// message's content and `field::<Block>` of its source read.
pub fn tool_result(text: &str) -> Option<ToolResult<'_>> {
    let mut out = ToolResult::default();
    scan::walk_members(text, 0, |key, at| match key {
        "message" => {
            out.source = None;
            out.block = None;
            scan::walk_members(text, at, |key, at| match key {
                "source" => {
                    let (source, end) = object_at(text, at)?;
                    out.source = source;
                    Some(end)
                }
                "content" => {
                    out.block = None;
                    let mut first = None;
                    let end = scan::walk_items(text, at, |at| {
                        if first.is_some() {
                            return scan::skip(text, at);
                        }
                        let (block, end) = object_at::<Block<'_>>(text, at)?;
                        first = block.filter(|b| text_is(b.kind, "tool-result"));
                        Some(end)
                    });
                    out.block = first;
                    end.or_else(|| scan::skip(text, at))
                }
                _ => scan::skip(text, at),
            })
            .or_else(|| scan::skip(text, at))
        }
        "error" => {
            let end = scan::skip(text, at)?;
            out.error = Some(&text[at..end]);
            Some(end)
        }
        _ => scan::skip(text, at),
    })?;
    Some(out)
}

/// Whether a string field is `expected`.
fn text_is(raw: Option<Raw<'_>>, expected: &str) -> bool {
    text(raw).as_deref() == Some(expected)
}

/// Reads `text` as the view `T` when it is a JSON object (`None` otherwise).
pub fn object<'a, T: View<'a>>(text: &'a str) -> Option<T> {
    let mut view = T::default();
    scan::members(text, |key, value| view.set(key, value))?;
    Some(view)
}

/// Reads `text` as `object` does, jumping over the object its writer recorded at `bulk`
/// (`Event::bulk`: an `assistant/message`'s message) rather than walking it, when the range
/// fits the text: it opens with `{` and closes with `}`, the walk finds a member's value
/// starting where it starts, and the object goes on after it to the end of the text (a range
/// that ends inside the object it names leaves a brace unmatched, so the walk ends early).
/// Otherwise (no range, or one the text does not bear out) the text is walked as `object`
/// walks it: the range is a hint, and the result is the same either way.
pub fn object_skipping<'a, T: View<'a>>(text: &'a str, bulk: Option<std::ops::Range<usize>>) -> Option<T> {
    let b = text.as_bytes();
    let fits = |r: &std::ops::Range<usize>| r.end >= r.start + 2 && b.get(r.start) == Some(&b'{') && b.get(r.end - 1) == Some(&b'}');
    let Some(bulk) = bulk.filter(fits) else {
        return object(text);
    };
    let mut view = T::default();
    match scan::members_skipping(text, bulk, |key, value| view.set(key, value)) {
        Some(end) if end == text.len() => Some(view),
        _ => object(text),
    }
}

/// Reads the value that starts at `at` as the view `T` when it is an object, in one pass (not
/// skipped first and read after): the view (`None`: not an object) and the index after the
/// value (`None`: no value starts at `at`).
fn object_at<'a, T: View<'a>>(text: &'a str, at: usize) -> Option<(Option<T>, usize)> {
    let mut view = T::default();
    let walked = scan::walk_members(text, at, |key, at| {
        let end = scan::skip(text, at)?;
        view.set(key, text.get(at..end)?);
        Some(end)
    });
    match walked {
        Some(end) => Some((Some(view), end)),
        None => Some((None, scan::skip(text, at)?)),
    }
}

/// An object field read as `T` (`None`: absent, or not an object).
pub fn field<'a, T: View<'a>>(raw: Option<Raw<'a>>) -> Option<T> {
    object(raw?)
}

/// The blocks of a `content` list (objects only; other items skipped).
pub fn blocks(raw: Option<Raw<'_>>) -> Vec<Block<'_>> {
    let mut out = Vec::new();
    if let Some(text) = raw {
        scan::items(text, |item| out.extend(object::<Block<'_>>(item)));
    }
    out
}

/// A block's `content` as text (`ToolResultBlock.text`): a string is itself, a list the text
/// of its text blocks joined by newlines.
pub fn content_text(raw: Option<Raw<'_>>) -> String {
    if let Some(text) = string(raw) {
        return text;
    }
    let mut out = String::new();
    let mut first = true;
    for block in blocks(raw) {
        if string(block.kind).as_deref() != Some("text") {
            continue;
        }
        if let Some(text) = string(block.text) {
            if !first {
                out.push('\n');
            }
            out.push_str(&text);
            first = false;
        }
    }
    out
}
