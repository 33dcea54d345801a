//! The few payload fields the span fold reads, parsed from the event's JSON text without
//! building a `Value` of the whole payload (messages' content is skipped). Each field is taken
//! as raw JSON and read as the typed views read it (`kerman.events`): an int is an integer
//! (not a float or a bool), a str a string; anything else is absent.

use serde::Deserialize;
use serde_json::value::RawValue;

/// An integer field as `kerman.events` reads one (`value.__class__ is int`).
pub fn int(raw: Option<&RawValue>) -> Option<i64> {
    raw.and_then(|r| r.get().parse::<i64>().ok())
}

/// A string field (`value.__class__ is str`).
pub fn string(raw: Option<&RawValue>) -> Option<String> {
    let text = raw?.get();
    if !text.starts_with('"') {
        return None;
    }
    if !text.contains('\\') {
        return Some(text[1..text.len() - 1].to_owned());
    }
    serde_json::from_str(text).ok()
}

/// Whether a field is the JSON `true`.
pub fn is_true(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| r.get() == "true")
}

/// Python's truth of a JSON value: not null, false, 0, "", [] or {}.
pub fn truthy(raw: Option<&RawValue>) -> bool {
    let Some(text) = raw.map(RawValue::get) else { return false };
    match text {
        "null" | "false" | "\"\"" | "[]" | "{}" => false,
        _ if text.starts_with('[') || text.starts_with('{') => serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| match v {
            serde_json::Value::Array(a) => !a.is_empty(),
            serde_json::Value::Object(o) => !o.is_empty(),
            _ => true,
        }),
        _ => text.parse::<f64>().map_or(true, |n| n != 0.0),
    }
}

/// `{turn, step, ...}`: every loop payload's head.
#[derive(Deserialize, Default)]
pub struct Head<'a> {
    #[serde(borrow, default)]
    pub turn: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub step: Option<&'a RawValue>,
}

/// `assistant/message {turn, step, interrupted?, usage?}`.
#[derive(Deserialize, Default)]
pub struct Reply<'a> {
    #[serde(borrow, default)]
    pub turn: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub step: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub interrupted: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
}

/// `assistant/chunk {chunk}`.
#[derive(Deserialize, Default)]
pub struct WithChunk<'a> {
    #[serde(borrow, default)]
    pub chunk: Option<&'a RawValue>,
}

/// A chunk's fields the fold reads (`{type, reason?, partial?}`).
#[derive(Deserialize, Default)]
pub struct Chunk<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub reason: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub partial: Option<&'a RawValue>,
}

/// The usage fields a request's totals and its model come from.
#[derive(Deserialize, Default)]
pub struct UsageFields<'a> {
    #[serde(borrow, default)]
    pub input: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "cacheRead")]
    pub cache_read: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "cacheWrite")]
    pub cache_write: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub provider: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub partial: Option<&'a RawValue>,
}

/// `context/compacted {model?, usage?, turn?}`.
#[derive(Deserialize, Default)]
pub struct Compacted<'a> {
    #[serde(borrow, default)]
    pub turn: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
}

/// `request/header {options}`.
#[derive(Deserialize, Default)]
pub struct Header<'a> {
    #[serde(borrow, default)]
    pub options: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
pub struct Options<'a> {
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
}

/// `tool/call {turn, callId, name}`.
#[derive(Deserialize, Default)]
pub struct Call<'a> {
    #[serde(borrow, default)]
    pub turn: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "callId")]
    pub call_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
}

/// `tool/result {message, error?}`.
#[derive(Deserialize, Default)]
pub struct Result<'a> {
    #[serde(borrow, default)]
    pub message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

/// A message's `{source, content}`.
#[derive(Deserialize, Default)]
pub struct Message<'a> {
    #[serde(borrow, default)]
    pub source: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
}

/// A message source's `callId`, a tool-result block's `toolCallId`, `isError` and `content`.
#[derive(Deserialize, Default)]
pub struct Block<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "toolCallId")]
    pub tool_call_id: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "callId")]
    pub call_id: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "isError")]
    pub is_error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub text: Option<&'a RawValue>,
}

/// `turn/end {turn, reason}`.
#[derive(Deserialize, Default)]
pub struct End<'a> {
    #[serde(borrow, default)]
    pub turn: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub reason: Option<&'a RawValue>,
}

/// An ending's `{kind, error?}`, a failure's `{code, message}`.
#[derive(Deserialize, Default)]
pub struct Reason<'a> {
    #[serde(borrow, default)]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub code: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub message: Option<&'a RawValue>,
}

/// Parses `text` as `T` when it is a JSON object (`None` otherwise, or when it does not parse).
pub fn object<'a, T: Deserialize<'a>>(text: &'a str) -> Option<T> {
    if !text.starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// An object field parsed as `T` (`None`: absent, or not an object).
pub fn field<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    object(raw?.get())
}

/// The blocks of a `content` list (objects only; other items skipped).
pub fn blocks<'a>(raw: Option<&'a RawValue>) -> Vec<Block<'a>> {
    let Some(text) = raw.map(RawValue::get).filter(|t| t.starts_with('[')) else { return Vec::new() };
    let items: Vec<&RawValue> = serde_json::from_str(text).unwrap_or_default();
    items.into_iter().filter_map(|item| object(item.get())).collect()
}

/// A block's `content` as text (`ToolResultBlock.text`): a string is itself, a list the text
/// of its text blocks joined by newlines.
pub fn content_text(raw: Option<&RawValue>) -> String {
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
