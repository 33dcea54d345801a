//! The few payload fields the span fold reads, parsed from the event's JSON text without
//! building a `Value` of the whole payload (messages' content is skipped). Each field is taken
//! as raw JSON and read as the typed views read it (`kerman.events`): an int is an integer
//! (not a float or a bool), a str a string; anything else is absent.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::de::{self, value::MapAccessDeserializer, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// An integer field as `kerman.events` reads one (`value.__class__ is int`).
pub fn int(raw: Option<&RawValue>) -> Option<i64> {
    raw.and_then(|r| r.get().parse::<i64>().ok())
}

/// A string field (`value.__class__ is str`).
pub fn string(raw: Option<&RawValue>) -> Option<String> {
    text(raw).map(Cow::into_owned)
}

/// A string field, borrowed from the payload when it has no escapes.
pub fn text(raw: Option<&RawValue>) -> Option<Cow<'_, str>> {
    let text = raw?.get();
    if !text.starts_with('"') {
        return None;
    }
    if !text.contains('\\') {
        return Some(Cow::Borrowed(&text[1..text.len() - 1]));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
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
        _ => text.parse::<f64>() != Ok(0.0),
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

/// A chunk's fields the fold reads (`{type, reason?, partial?, model?, provider?}`; a failed
/// `finish` names the model that failed when a `Fallback` tried several).
#[derive(Deserialize, Default)]
pub struct Chunk<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub reason: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub partial: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub provider: Option<&'a RawValue>,
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
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
}

/// `tool/result {message, error?}`, read in one pass: the message's `source` and the blocks of
/// its `content` (a field of another type than the one expected reads as absent).
#[derive(Deserialize, Default)]
pub struct Result<'a> {
    #[serde(borrow, default)]
    pub message: Lenient<Message<'a>>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

/// A message's `{source, content}`.
#[derive(Deserialize, Default)]
pub struct Message<'a> {
    #[serde(borrow, default)]
    pub source: Lenient<Block<'a>>,
    #[serde(borrow, default)]
    pub content: Blocks<'a>,
}

/// A message source's `callId`, a content block's `type`, a tool-result block's `toolCallId`,
/// `isError` and `content`, a text block's `text`.
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

/// An object read as `T`; any other JSON value reads as absent (`None`).
pub struct Lenient<T>(pub Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Of<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Of<T> {
            type Value = Lenient<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(|t| Lenient(Some(t)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Self::Value, E> {
                Ok(Lenient(None))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(Lenient(None))
            }
        }
        deserializer.deserialize_any(Of(PhantomData))
    }
}

/// A `content` list's object items read as blocks (other items, or a content that is not a
/// list, read as no blocks).
#[derive(Default)]
pub struct Blocks<'a>(pub Vec<Block<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Blocks<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct List<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for List<'a> {
            type Value = Blocks<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
                let mut blocks = Vec::new();
                while let Some(Lenient(block)) = seq.next_element::<Lenient<Block<'a>>>()? {
                    blocks.extend(block);
                }
                Ok(Blocks(blocks))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Blocks(Vec::new()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<Self::Value, E> {
                Ok(Blocks(Vec::new()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<Self::Value, E> {
                Ok(Blocks(Vec::new()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<Self::Value, E> {
                Ok(Blocks(Vec::new()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<Self::Value, E> {
                Ok(Blocks(Vec::new()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<Self::Value, E> {
                Ok(Blocks(Vec::new()))
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(Blocks(Vec::new()))
            }
        }
        deserializer.deserialize_any(List(PhantomData))
    }
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
pub fn blocks(raw: Option<&RawValue>) -> Vec<Block<'_>> {
    raw.and_then(|r| serde_json::from_str::<Blocks<'_>>(r.get()).ok()).map(|b| b.0).unwrap_or_default()
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
