//! Messages: immutable, identified values shared by the inbox, the log and model requests.
//!
//! A message is `{id, role, content, source}`. Content is a list of JSON blocks discriminated by
//! `type`; source is a JSON object discriminated by `kind`. Unknown block types, source kinds
//! and extra fields are kept verbatim. Shapes are validated at construction (SPEC D5) so nothing
//! malformed can reach the log.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, OnceLock};

use serde_json::{Map, Value};

use crate::json::{self, Scratch};

/// Which of the three message values a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// Role `user`: prompts, steering, injected context.
    User,
    /// Role `assistant`, source kind `model`.
    Assistant,
    /// Role `user`, source `{kind: "tool", callId}`, exactly one `tool-result` block.
    ToolResult,
}

impl MessageKind {
    /// The wire role of this kind.
    pub fn role(self) -> &'static str {
        match self {
            MessageKind::Assistant => "assistant",
            MessageKind::User | MessageKind::ToolResult => "user",
        }
    }
}

/// A content block's `type`: the ones the core reads, and any other (kept as it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockType {
    Text,
    Reasoning,
    ToolCall,
    ToolResult,
    Other,
}

impl BlockType {
    /// The type spelt `text`.
    pub fn parse(text: &str) -> BlockType {
        match text {
            "text" => BlockType::Text,
            "reasoning" => BlockType::Reasoning,
            "tool-call" => BlockType::ToolCall,
            "tool-result" => BlockType::ToolResult,
            _ => BlockType::Other,
        }
    }

    /// The type of `block` (`Other` for a block without a string `type`): the one reader of
    /// the field.
    pub fn of(block: &Value) -> BlockType {
        block.get("type").and_then(Value::as_str).map_or(BlockType::Other, BlockType::parse)
    }
}

/// A message that failed shape validation; `field` names the offending part (`content[0].text`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageError {
    pub field: String,
    pub reason: String,
}

impl MessageError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        MessageError { field: field.into(), reason: reason.into() }
    }
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid message {}: {}", self.field, self.reason)
    }
}

impl std::error::Error for MessageError {}

/// An immutable message value. Equality and hashing are by value (object key order ignored).
///
/// A message is held as its compact JSON, as its content and source values, or both: each is
/// made from the other on first use. The messages an agent loop makes most (a prompt or a reply
/// given as a `str`, a tool's `str` result) are written as JSON text straight away and parsed
/// only if something reads their content: a handful of JSON maps per message costs ~25 heap
/// blocks and ~1 kB, the text two blocks and its length.
pub struct Message {
    id: String,
    kind: MessageKind,
    repr: Repr,
}

/// What a message is made from, and the other form made from it on first use. (A set
/// `OnceLock` at construction would cost its one-time initialisation, two atomic operations
/// and a call, on every message: the made form is a plain field instead.)
#[derive(Clone)]
enum Repr {
    /// Written as compact JSON text; content and source parsed on first use. Boxed: a message
    /// that never needs them pays one word, not the two collections' headers.
    Text { json: Arc<str>, parts: OnceLock<Box<Parts>> },
    /// Built from content and source; the JSON text written on first use.
    Parts { parts: Box<Parts>, json: OnceLock<Arc<str>> },
}

#[derive(Clone, Debug, serde::Deserialize)]
struct Parts {
    content: Vec<Value>,
    source: Map<String, Value>,
}

impl Clone for Message {
    fn clone(&self) -> Self {
        Message { id: self.id.clone(), kind: self.kind, repr: self.repr.clone() }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("role", &self.kind.role())
            .field("content", &self.content())
            .field("source", self.source())
            .finish_non_exhaustive()
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.kind == other.kind
            && (self.same_text(other) || (self.content() == other.content() && self.source() == other.source()))
    }
}

impl Eq for Message {}

impl Hash for Message {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
        self.kind.hash(state);
        json::canonical(&Value::Array(self.content().to_vec())).hash(state);
        json::canonical(&Value::Object(self.source().clone())).hash(state);
    }
}

/// Mints a new message id: a UUIDv7 (time-ordered) in its text form.
pub fn new_id() -> String {
    crate::ids::new_id()
}

// Building a JSON object hashes each key (serde_json's ordered map); cloning a prototype
// copies the stored hashes instead, which is most of the cost of the small maps every
// message carries.
const SOURCE_KINDS: [&str; 3] = ["user", "model", "tool"];
static SOURCES: LazyLock<[Map<String, Value>; 3]> = LazyLock::new(|| {
    SOURCE_KINDS.map(|kind| {
        let mut source = Map::new();
        source.insert("kind".into(), Value::String(kind.into()));
        source
    })
});

fn kind_source(kind: &str) -> Map<String, Value> {
    // By name, not by looking into each prototype: `s["kind"]` hashes the key every time.
    match SOURCE_KINDS.iter().position(|k| *k == kind) {
        Some(i) => SOURCES[i].clone(),
        None => {
            let mut source = Map::new();
            source.insert("kind".into(), Value::String(kind.into()));
            source
        }
    }
}

impl Message {
    /// A user message. `source` defaults to `{kind: "user"}`; `id` to a fresh UUIDv7.
    pub fn user(content: Vec<Value>, source: Option<Map<String, Value>>, id: Option<String>) -> Result<Message, MessageError> {
        let source = source.unwrap_or_else(|| kind_source("user"));
        if field(&source, "kind").and_then(Value::as_str) == Some("tool") {
            return Err(MessageError::new("source.kind", "\"tool\" is reserved for tool results; use a ToolResultMessage"));
        }
        Message::build(MessageKind::User, content, source, id)
    }

    /// A user message holding one text block, with a fresh id.
    pub fn user_text(text: &str) -> Message {
        Message::of_text(MessageKind::User, text, None)
    }

    /// A user (source `{kind: "user"}`) or assistant (source `{kind: "model"}`) message holding
    /// one text block: what `Message::user` or `Message::assistant` build from that block and
    /// no source, valid by construction and written as JSON text (see [`Message`]).
    pub fn of_text(kind: MessageKind, text: &str, id: Option<String>) -> Message {
        let source = match kind {
            MessageKind::Assistant => "model",
            MessageKind::User | MessageKind::ToolResult => "user",
        };
        let kind = if kind == MessageKind::Assistant { kind } else { MessageKind::User };
        let id = id.unwrap_or_else(new_id);
        let mut out = json_head(&id, kind.role(), 96 + id.len() + text.len());
        out.push_str(r#"[{"type":"text","text":"#);
        json::push_str_literal(&mut out, text);
        out.push_str(r#"}],"source":{"kind":""#);
        out.push_str(source);
        out.push_str("\"}}");
        Message { id, kind, repr: Repr::Text { json: out.to_arc(), parts: OnceLock::new() } }
    }

    /// An assistant message holding only tool-call blocks `{type, id, name, arguments}`
    /// (each `(id, name, arguments)` of `calls`, in order) and no source: what
    /// `Message::assistant` builds from those blocks, valid by construction and written as JSON
    /// text (the same bytes), so a reply of tool calls is neither validated nor serialised
    /// from maps. Repeated ids are the caller's rule to check.
    pub fn of_tool_calls(calls: &[(String, String, String)]) -> Message {
        let id = new_id();
        let capacity = 64 + id.len() + calls.iter().map(|(i, n, a)| 48 + i.len() + n.len() + a.len() * 2).sum::<usize>();
        let mut out = json_head(&id, MessageKind::Assistant.role(), capacity);
        out.push('[');
        for (i, (call_id, name, arguments)) in calls.iter().enumerate() {
            out.push_str(if i == 0 { r#"{"type":"tool-call","id":"# } else { r#",{"type":"tool-call","id":"# });
            json::push_str_literal(&mut out, call_id);
            out.push_str(r#","name":"#);
            json::push_str_literal(&mut out, name);
            out.push_str(r#","arguments":"#);
            json::push_str_literal(&mut out, arguments);
            out.push('}');
        }
        out.push_str(r#"],"source":{"kind":"model"}}"#);
        Message { id, kind: MessageKind::Assistant, repr: Repr::Text { json: out.to_arc(), parts: OnceLock::new() } }
    }

    /// An assistant message. `source` defaults to `{kind: "model"}` and must have that kind.
    pub fn assistant(content: Vec<Value>, source: Option<Map<String, Value>>, id: Option<String>) -> Result<Message, MessageError> {
        let source = source.unwrap_or_else(|| kind_source("model"));
        Message::build(MessageKind::Assistant, content, source, id)
    }

    /// A tool result for `call_id`: one `tool-result` block wrapping `content`.
    pub fn tool_result(call_id: &str, content: Vec<Value>, is_error: bool, id: Option<String>) -> Result<Message, MessageError> {
        let mut block = Map::new();
        block.insert("type".into(), Value::String("tool-result".into()));
        block.insert("toolCallId".into(), Value::String(call_id.into()));
        block.insert("content".into(), Value::Array(content));
        if is_error {
            block.insert("isError".into(), Value::Bool(true));
        }
        let mut source = kind_source("tool");
        source.insert("callId".into(), Value::String(call_id.into()));
        Message::build(MessageKind::ToolResult, vec![Value::Object(block)], source, id)
    }

    /// What `tool_result(call_id, [a text block of text], false, None)` builds, for the
    /// commonest result (a tool returned a `str`): valid by construction, so not checked again,
    /// and its JSON written as it is built rather than serialised from the maps later.
    pub fn tool_result_text(call_id: &str, text: &str) -> Message {
        let id = new_id();
        let mut out = json_head(&id, "user", 160 + 2 * call_id.len() + text.len());
        out.push_str(r#"[{"type":"tool-result","toolCallId":"#);
        json::push_str_literal(&mut out, call_id);
        out.push_str(r#","content":[{"type":"text","text":"#);
        json::push_str_literal(&mut out, text);
        out.push_str(r#"}]}],"source":{"kind":"tool","callId":"#);
        json::push_str_literal(&mut out, call_id);
        out.push_str("}}");
        Message { id, kind: MessageKind::ToolResult, repr: Repr::Text { json: out.to_arc(), parts: OnceLock::new() } }
    }

    /// Imports a message dict (`{id, role, content, source}`), keeping its id. The kind follows
    /// from the role and source: `assistant`, a `tool` source, or an ordinary user message.
    pub fn from_value(value: &Value) -> Result<Message, MessageError> {
        let Value::Object(map) = value else {
            return Err(MessageError::new("message", format!("expected an object, got {}", type_name(value))));
        };
        for key in map.keys() {
            if !matches!(key.as_str(), "id" | "role" | "content" | "source") {
                return Err(MessageError::new(key.clone(), "unknown message field"));
            }
        }
        let id = match map.get("id") {
            Some(Value::String(id)) => id.clone(),
            Some(other) => return Err(MessageError::new("id", format!("expected a string, got {}", type_name(other)))),
            None => return Err(MessageError::new("id", "missing")),
        };
        let role = match map.get("role") {
            Some(Value::String(role)) => role.as_str(),
            Some(other) => return Err(MessageError::new("role", format!("expected a string, got {}", type_name(other)))),
            None => return Err(MessageError::new("role", "missing")),
        };
        let content = match map.get("content") {
            Some(Value::Array(items)) => items.clone(),
            Some(other) => return Err(MessageError::new("content", format!("expected a list, got {}", type_name(other)))),
            None => return Err(MessageError::new("content", "missing")),
        };
        let source = match map.get("source") {
            Some(Value::Object(source)) => source.clone(),
            Some(other) => return Err(MessageError::new("source", format!("expected an object, got {}", type_name(other)))),
            None => return Err(MessageError::new("source", "missing")),
        };
        let kind = match role {
            "assistant" => MessageKind::Assistant,
            "user" if field(&source, "kind").and_then(Value::as_str) == Some("tool") => MessageKind::ToolResult,
            "user" => MessageKind::User,
            other => return Err(MessageError::new("role", format!("expected \"user\" or \"assistant\", got {other:?}"))),
        };
        Message::build(kind, content, source, Some(id))
    }

    fn build(kind: MessageKind, content: Vec<Value>, source: Map<String, Value>, id: Option<String>) -> Result<Message, MessageError> {
        let id = match id {
            Some(id) if id.is_empty() => return Err(MessageError::new("id", "must be a non-empty string")),
            Some(id) => id,
            None => new_id(),
        };
        validate_blocks(&content, &|| "content".to_owned())?;
        validate_source(kind, &content, &source)?;
        Ok(Message { id, kind, repr: Repr::Parts { parts: Box::new(Parts { content, source }), json: OnceLock::new() } })
    }

    /// The same message (same id, kind and source) with new content.
    pub fn with_content(&self, content: Vec<Value>) -> Result<Message, MessageError> {
        Message::build(self.kind, content, self.source().clone(), Some(self.id.clone()))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn kind(&self) -> MessageKind {
        self.kind
    }

    pub fn role(&self) -> &'static str {
        self.kind.role()
    }

    pub fn content(&self) -> &[Value] {
        &self.parts().content
    }

    pub fn source(&self) -> &Map<String, Value> {
        &self.parts().source
    }

    /// The content and source, parsed from the JSON text the first time they are asked for.
    fn parts(&self) -> &Parts {
        match &self.repr {
            Repr::Parts { parts, .. } => parts,
            Repr::Text { json, parts } => parts.get_or_init(|| {
                // The text was written by this module (or serialised from validated parts), so
                // it parses; an empty message is no worse than a panic if that ever broke.
                Box::new(serde_json::from_str(json).unwrap_or_else(|_| Parts { content: Vec::new(), source: Map::new() }))
            }),
        }
    }

    /// The JSON text, if it has been made.
    fn made_json(&self) -> Option<&Arc<str>> {
        match &self.repr {
            Repr::Text { json, .. } => Some(json),
            Repr::Parts { json, .. } => json.get(),
        }
    }

    /// Both messages hold the same JSON text already (no parsing to compare them).
    fn same_text(&self, other: &Message) -> bool {
        matches!((self.made_json(), other.made_json()), (Some(a), Some(b)) if a == b)
    }

    /// `source.kind`, always present.
    pub fn source_kind(&self) -> &str {
        field(self.source(), "kind").and_then(Value::as_str).unwrap_or("")
    }

    /// The text blocks joined with `\n`. For a tool result, those of the result's content (the
    /// inner `content` of its one `tool-result` block), so a tool's `str` result reads back as
    /// that `str`; its own content holds no text block of its own.
    pub fn text(&self) -> String {
        let blocks = match self.kind {
            MessageKind::ToolResult => {
                self.content().first().and_then(|block| block.get("content")).and_then(Value::as_array).map_or(&[][..], Vec::as_slice)
            }
            MessageKind::User | MessageKind::Assistant => self.content(),
        };
        let texts: Vec<&str> =
            blocks.iter().filter(|b| BlockType::of(b) == BlockType::Text).filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
        texts.join("\n")
    }

    /// The message as a JSON object `{id, role, content, source}`.
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("id".into(), Value::String(self.id.clone()));
        map.insert("role".into(), Value::String(self.role().into()));
        map.insert("content".into(), Value::Array(self.content().to_vec()));
        map.insert("source".into(), Value::Object(self.source().clone()));
        Value::Object(map)
    }

    /// Compact JSON of [`to_value`](Self::to_value), computed once.
    pub fn json(&self) -> &str {
        self.json_text()
    }

    /// [`json`](Self::json) as the shared text itself: a `user/message` event holds the
    /// message's own text rather than a copy.
    pub fn json_arc(&self) -> Arc<str> {
        Arc::clone(self.json_text())
    }

    fn json_text(&self) -> &Arc<str> {
        let (parts, json) = match &self.repr {
            Repr::Text { json, .. } => return json,
            Repr::Parts { parts, json } => (parts, json),
        };
        json.get_or_init(|| {
            let mut head = String::with_capacity(256);
            write_head(&mut head, &self.id, self.role());
            let mut out = head.into_bytes();
            // Serialising values of a `Value` tree into a `Vec` cannot fail.
            let _ = serde_json::to_writer(&mut out, &parts.content);
            out.extend_from_slice(b",\"source\":");
            let _ = serde_json::to_writer(&mut out, &parts.source);
            out.push(b'}');
            // Only UTF-8 was written (serde_json writes valid UTF-8).
            String::from_utf8(out).unwrap_or_default().into()
        })
    }
}

/// The start of a message's compact JSON, up to its content: `{"id":…,"role":"…","content":`.
fn json_head(id: &str, role: &str, capacity: usize) -> Scratch {
    let mut out = Scratch::new();
    out.reserve(capacity);
    write_head(&mut out, id, role);
    out
}

fn write_head(out: &mut String, id: &str, role: &str) {
    out.push_str("{\"id\":");
    json::push_str_literal(out, id);
    out.push_str(",\"role\":\"");
    out.push_str(role);
    out.push_str("\",\"content\":");
}

/// `map.get(key)` for the small objects messages are made of (a block, a source): comparing a
/// handful of short keys is several times cheaper than hashing `key` with the map's SipHash.
fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    if map.len() > 8 {
        return map.get(key);
    }
    map.iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

fn require_str(block: &Map<String, Value>, key: &str, path: &dyn Fn() -> String) -> Result<(), MessageError> {
    match field(block, key) {
        Some(Value::String(_)) => Ok(()),
        Some(other) => Err(MessageError::new(format!("{}.{key}", path()), format!("expected a string, got {}", type_name(other)))),
        None => Err(MessageError::new(format!("{}.{key}", path()), "missing")),
    }
}

/// Checks content blocks. `path` names the list in errors; it is built only on failure, since
/// formatting a path per block costs more than the checks themselves.
fn validate_blocks(blocks: &[Value], path: &dyn Fn() -> String) -> Result<(), MessageError> {
    for (i, block) in blocks.iter().enumerate() {
        let here = || format!("{}[{i}]", path());
        let Value::Object(map) = block else {
            return Err(MessageError::new(here(), format!("expected a content block object, got {}", type_name(block))));
        };
        let kind = match field(map, "type") {
            Some(Value::String(kind)) if !kind.is_empty() => kind.as_str(),
            Some(_) => return Err(MessageError::new(format!("{}.type", here()), "expected a non-empty string")),
            None => return Err(MessageError::new(format!("{}.type", here()), "missing")),
        };
        match BlockType::parse(kind) {
            BlockType::Text | BlockType::Reasoning => require_str(map, "text", &here)?,
            BlockType::ToolCall => {
                require_str(map, "id", &here)?;
                require_str(map, "name", &here)?;
                require_str(map, "arguments", &here)?;
            }
            BlockType::ToolResult => {
                require_str(map, "toolCallId", &here)?;
                match field(map, "content") {
                    Some(Value::Array(inner)) => validate_blocks(inner, &|| format!("{}.content", here()))?,
                    Some(other) => {
                        return Err(MessageError::new(format!("{}.content", here()), format!("expected a list, got {}", type_name(other))))
                    }
                    None => return Err(MessageError::new(format!("{}.content", here()), "missing")),
                }
                if let Some(flag) = field(map, "isError") {
                    if !flag.is_boolean() {
                        return Err(MessageError::new(format!("{}.isError", here()), "expected a bool"));
                    }
                }
            }
            // Unknown block types (and `image`, which only references an attachment) are kept as-is.
            BlockType::Other => {}
        }
    }
    Ok(())
}

fn validate_source(kind: MessageKind, content: &[Value], source: &Map<String, Value>) -> Result<(), MessageError> {
    let source_kind = match field(source, "kind") {
        Some(Value::String(k)) if !k.is_empty() => k.as_str(),
        Some(_) => return Err(MessageError::new("source.kind", "expected a non-empty string")),
        None => return Err(MessageError::new("source.kind", "missing")),
    };
    match kind {
        MessageKind::User => Ok(()),
        MessageKind::Assistant if source_kind != "model" => {
            Err(MessageError::new("source.kind", format!("an assistant message must have source kind \"model\", got {source_kind:?}")))
        }
        MessageKind::Assistant => Ok(()),
        MessageKind::ToolResult => {
            let Some(Value::String(call_id)) = field(source, "callId") else {
                return Err(MessageError::new("source.callId", "a tool result needs a string callId"));
            };
            let [Value::Object(block)] = content else {
                return Err(MessageError::new("content", "a tool result must hold exactly one tool-result block"));
            };
            if field(block, "type").and_then(Value::as_str) != Some("tool-result") {
                return Err(MessageError::new("content[0].type", "a tool result must hold a tool-result block"));
            }
            if field(block, "toolCallId").and_then(Value::as_str) != Some(call_id.as_str()) {
                return Err(MessageError::new("content[0].toolCallId", format!("does not match source.callId {call_id:?}")));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::hash_map::DefaultHasher;

    fn blocks(v: Value) -> Vec<Value> {
        match v {
            Value::Array(items) => items,
            _ => Vec::new(),
        }
    }

    #[test]
    fn block_types_are_read_from_a_string_type() {
        for (block, kind) in [
            (json!({"type": "text", "text": "x"}), BlockType::Text),
            (json!({"type": "reasoning", "text": "x"}), BlockType::Reasoning),
            (json!({"type": "tool-call"}), BlockType::ToolCall),
            (json!({"type": "tool-result"}), BlockType::ToolResult),
            (json!({"type": "image"}), BlockType::Other),
            (json!({"type": 1}), BlockType::Other),
            (json!({}), BlockType::Other),
            (json!("text"), BlockType::Other),
        ] {
            assert_eq!(BlockType::of(&block), kind, "{block}");
        }
    }

    #[test]
    fn tool_call_messages_are_the_bytes_the_general_path_writes() {
        let calls: Vec<(String, String, String)> =
            vec![("call-1".into(), "git_log".into(), r#"{"n": 1}"#.into()), ("c\"2\n".into(), "é/名".into(), String::new())];
        let fast = Message::of_tool_calls(&calls);
        let blocks = calls
            .iter()
            .map(|(id, name, arguments)| json!({"type": "tool-call", "id": id, "name": name, "arguments": arguments}))
            .collect();
        let built = Message::assistant(blocks, None, Some(fast.id().to_owned())).unwrap();
        assert_eq!(fast.json(), built.json());
        assert_eq!(fast, built);
        assert_eq!(Message::from_value(&serde_json::from_str(fast.json()).unwrap()).unwrap(), fast);
    }

    #[test]
    fn tool_result_text_is_tool_result_of_a_text_block() {
        for (call_id, text) in [("c1", "ok"), ("c\"1 \u{e9}\\", "a\n\t\u{1}\"q\" \u{1F600} \u{2028}"), ("", "")] {
            let fast = Message::tool_result_text(call_id, text);
            let built =
                Message::tool_result(call_id, blocks(json!([{"type": "text", "text": text}])), false, Some(fast.id().to_owned())).unwrap();
            assert_eq!(fast, built);
            // The JSON written up front is what serialising the maps gives.
            let serialised = Message { repr: Repr::Parts { parts: Box::new(fast.parts().clone()), json: OnceLock::new() }, ..fast.clone() };
            assert_eq!(fast.json(), serialised.json());
            assert_eq!(fast.json(), built.json());
            assert_eq!(Message::from_value(&serde_json::from_str(fast.json()).unwrap()).unwrap(), fast);
        }
    }

    #[test]
    fn a_tool_results_text_is_the_text_of_its_content() {
        let fast = Message::tool_result_text("c1", "12:00");
        let logged = fast.json().to_owned();
        assert_eq!(fast.text(), "12:00");
        // Reading the text parses the content but leaves the logged JSON as it was written.
        assert_eq!(fast.json(), logged);
        let content = blocks(json!([{"type": "text", "text": "a"}, {"type": "image", "ref": "x"}, {"type": "text", "text": "b"}]));
        let built = Message::tool_result("c2", content, true, None).unwrap();
        assert_eq!(built.text(), "a\nb");
        assert_eq!(Message::tool_result("c3", vec![], false, None).unwrap().text(), "");
        assert_eq!(Message::from_value(&serde_json::from_str(built.json()).unwrap()).unwrap().text(), "a\nb");
        // A user message holding a tool-result-shaped block is not a tool result: only its own
        // text blocks count.
        let user = Message::user(
            blocks(json!([{"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "x"}]}])),
            None,
            None,
        )
        .unwrap();
        assert_eq!(user.text(), "");
    }

    #[test]
    fn text_messages_are_the_general_build_of_one_text_block() {
        for text in ["", "hi", "a\n\t\u{1}\"q\" \u{1F600} \u{2028} \\"] {
            for kind in [MessageKind::User, MessageKind::Assistant] {
                let fast = Message::of_text(kind, text, Some("m-1".into()));
                let block = blocks(json!([{"type": "text", "text": text}]));
                let built = match kind {
                    MessageKind::Assistant => Message::assistant(block, None, Some("m-1".into())),
                    _ => Message::user(block, None, Some("m-1".into())),
                }
                .unwrap();
                // Same bytes before anything parses the text, then the same values after.
                assert_eq!(fast.json(), built.json());
                assert!(matches!(&fast.repr, Repr::Text { parts, .. } if parts.get().is_none()));
                assert_eq!(fast.content(), built.content());
                assert_eq!(fast.source(), built.source());
                assert_eq!(fast, built);
                let hash = |m: &Message| {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    m.hash(&mut h);
                    h.finish()
                };
                assert_eq!(hash(&Message::of_text(kind, text, Some("m-1".into()))), hash(&built));
                assert_eq!(Message::from_value(&serde_json::from_str(fast.json()).unwrap()).unwrap(), fast);
            }
        }
        // A tool-result kind is not a text message: it is made a user message.
        assert_eq!(Message::of_text(MessageKind::ToolResult, "x", None).kind(), MessageKind::User);
    }

    #[test]
    fn equality_of_unparsed_messages_compares_values_when_texts_differ() {
        let a = Message::of_text(MessageKind::User, "x", Some("i".into()));
        let b = Message::of_text(MessageKind::User, "y", Some("i".into()));
        assert_ne!(a, b);
        let c = Message::user(blocks(json!([{"text": "x", "type": "text"}])), None, Some("i".into())).unwrap();
        assert_ne!(a.json(), c.json());
        assert_eq!(a, c);
    }

    #[test]
    fn user_text_defaults() {
        let m = Message::user_text("hi");
        assert_eq!(m.role(), "user");
        assert_eq!(m.source_kind(), "user");
        assert_eq!(m.text(), "hi");
        assert_eq!(m.id().len(), 36);
    }

    #[test]
    fn json_round_trips_through_from_value() {
        let m = Message::user(
            blocks(json!([{"type": "text", "text": "x"}, {"type": "custom", "z": [1]}])),
            Some(json!({"kind": "plugin", "plugin": "", "extra": 1}).as_object().cloned().unwrap_or_default()),
            Some("m-1".into()),
        )
        .unwrap();
        let back = Message::from_value(&serde_json::from_str(m.json()).unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.json(), m.json());
    }

    #[test]
    fn floats_survive_the_logged_text() {
        // Found with the message_from_json fuzz target's checks: without serde_json's
        // float_roundtrip this read back one ulp away, so a replayed message differed.
        let m = Message::user(blocks(json!([{"type": "x", "v": 3.055_591_565_431_534_3e-167}])), None, Some("i".into())).unwrap();
        let back = Message::from_value(&serde_json::from_str(m.json()).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn from_value_classifies_kinds() {
        let tool = Message::tool_result("c1", blocks(json!([{"type": "text", "text": "ok"}])), false, None).unwrap();
        assert_eq!(Message::from_value(&tool.to_value()).unwrap().kind(), MessageKind::ToolResult);
        let asst = Message::assistant(vec![], None, None).unwrap();
        assert_eq!(Message::from_value(&asst.to_value()).unwrap().kind(), MessageKind::Assistant);
    }

    #[test]
    fn errors_name_the_field() {
        let err = Message::user(blocks(json!([{"type": "text", "text": 3}])), None, None).unwrap_err();
        assert_eq!(err.field, "content[0].text");
        let err = Message::user(vec![], None, Some(String::new())).unwrap_err();
        assert_eq!(err.field, "id");
        let err = Message::assistant(vec![], Some(kind_source("user")), None).unwrap_err();
        assert_eq!(err.field, "source.kind");
        let err = Message::from_value(&json!({"id": "a", "role": "system", "content": [], "source": {"kind": "user"}})).unwrap_err();
        assert_eq!(err.field, "role");
    }

    #[test]
    fn equality_ignores_key_order() {
        let a = Message::user(blocks(json!([{"type": "text", "text": "x"}])), None, Some("i".into())).unwrap();
        let b = Message::from_value(
            &json!({"source": {"kind": "user"}, "content": [{"text": "x", "type": "text"}], "role": "user", "id": "i"}),
        )
        .unwrap();
        assert_eq!(a, b);
        let (mut ha, mut hb) = (DefaultHasher::new(), DefaultHasher::new());
        a.hash(&mut ha);
        b.hash(&mut hb);
        assert_eq!(ha.finish(), hb.finish());
    }
}
