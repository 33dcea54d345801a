//! Builds an assistant message's content from a streaming model's chunks.
//!
//! Chunks are dicts with a `type`: `text-delta` / `reasoning-delta` (`text`) extend the open
//! block of that type or open a new one; `tool-call` (`id`, `name`, `arguments`) is a block of
//! its own; `usage` merges its other fields into the usage; `finish` (`reason`, `error`) says
//! how the stream ended. Other types are logged but change nothing.

use serde_json::{Map, Value};

use crate::message::BlockType;

/// How a model's reply ended, of the reasons the loop goes on from (`finish`): any other
/// reason is the reply's failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `"stop"`: the reply is whole.
    Stop,
    /// `"max-tokens"`: cut at the token limit; its tool calls are dropped (SPEC 4.9).
    MaxTokens,
}

impl Finish {
    /// The one reader of a finish reason: `None` for any reason but these two.
    pub fn parse(reason: &str) -> Option<Finish> {
        match reason {
            "stop" => Some(Finish::Stop),
            "max-tokens" => Some(Finish::MaxTokens),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct Assembler {
    blocks: Vec<Value>,
    /// The type of the last block while deltas may still extend it.
    open: Option<&'static str>,
    usage: Option<Map<String, Value>>,
    finish: Option<Value>,
    error: Option<Map<String, Value>>,
}

impl Assembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk (an object whose `type` is a string). `Err` describes a chunk whose text
    /// cannot extend the open block.
    pub fn feed(&mut self, chunk: &Map<String, Value>) -> Result<(), String> {
        let kind = chunk.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "text-delta" | "reasoning-delta" => {
                let block_type = if kind == "text-delta" { "text" } else { "reasoning" };
                let text = chunk.get("text").cloned().unwrap_or_else(|| Value::String(String::new()));
                if self.open == Some(block_type) {
                    let Some(Value::Object(block)) = self.blocks.last_mut() else { unreachable!("an open block exists") };
                    match (block.get_mut("text"), &text) {
                        (Some(Value::String(have)), Value::String(more)) => have.push_str(more),
                        _ => return Err(format!("a {kind} chunk's text must be a str, got {}", type_name(&text))),
                    }
                } else {
                    let mut block = Map::new();
                    block.insert("type".into(), Value::String(block_type.into()));
                    block.insert("text".into(), text);
                    self.blocks.push(Value::Object(block));
                    self.open = Some(block_type);
                }
            }
            "tool-call" => {
                let mut block = Map::new();
                block.insert("type".into(), Value::String("tool-call".into()));
                for key in ["id", "name"] {
                    block.insert(key.into(), chunk.get(key).cloned().unwrap_or(Value::Null));
                }
                block.insert("arguments".into(), chunk.get("arguments").cloned().unwrap_or_else(|| Value::String(String::new())));
                self.blocks.push(Value::Object(block));
                self.open = None;
            }
            "usage" => {
                let usage = self.usage.get_or_insert_with(Map::new);
                for (key, value) in chunk {
                    if key != "type" {
                        usage.insert(key.clone(), value.clone());
                    }
                }
            }
            "finish" => {
                self.finish = Some(chunk.get("reason").cloned().unwrap_or_else(|| Value::String("stop".into())));
                self.error = match chunk.get("error") {
                    Some(Value::Object(error)) => Some(error.clone()),
                    _ => None,
                };
            }
            _ => {}
        }
        Ok(())
    }

    /// The finish reason (`Stop` unless a `finish` chunk said otherwise, in any JSON value;
    /// `None`: a reason the loop does not go on from).
    pub fn finish(&self) -> Option<Finish> {
        match &self.finish {
            None => Some(Finish::Stop),
            Some(reason) => reason.as_str().and_then(Finish::parse),
        }
    }

    /// The finish reason as a Python `repr` would show it in an error message.
    pub fn finish_repr(&self) -> String {
        match &self.finish {
            None => "'stop'".into(),
            Some(Value::String(s)) => format!("'{s}'"),
            Some(Value::Null) => "None".into(),
            Some(Value::Bool(b)) => {
                if *b {
                    "True".into()
                } else {
                    "False".into()
                }
            }
            Some(other) => crate::json::compact(other),
        }
    }

    /// The failure of a stream that finished with a reason other than `stop`/`max-tokens`:
    /// its `error` dict, with a message and code added when it has none.
    pub fn failure(&self) -> super::Failure {
        super::Failure::of_stream(self.error.clone().unwrap_or_default(), || format!("model finished with reason {}", self.finish_repr()))
    }

    pub fn usage(&self) -> Option<Value> {
        self.usage.clone().map(Value::Object)
    }

    /// Every block, in stream order.
    pub fn into_blocks(self) -> Vec<Value> {
        self.blocks
    }

    /// The text and reasoning blocks (what an interrupted stream had shown).
    pub fn visible(&self) -> Vec<Value> {
        let visible = |b: &&Value| matches!(BlockType::of(b), BlockType::Text | BlockType::Reasoning);
        self.blocks.iter().filter(visible).cloned().collect()
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feed(a: &mut Assembler, chunk: &Value) {
        a.feed(chunk.as_object().unwrap()).unwrap();
    }

    #[test]
    fn deltas_extend_the_open_block_until_another_type() {
        let mut a = Assembler::new();
        feed(&mut a, &json!({"type": "text-delta", "text": "he"}));
        feed(&mut a, &json!({"type": "text-delta", "text": "llo"}));
        feed(&mut a, &json!({"type": "tool-call", "id": "c1", "name": "f", "arguments": "{}"}));
        feed(&mut a, &json!({"type": "text-delta", "text": "!"}));
        feed(&mut a, &json!({"type": "usage", "input": 3}));
        feed(&mut a, &json!({"type": "usage", "output": 4}));
        assert_eq!(a.finish(), Some(Finish::Stop));
        assert_eq!(a.usage(), Some(json!({"input": 3, "output": 4})));
        assert_eq!(a.visible(), vec![json!({"type": "text", "text": "hello"}), json!({"type": "text", "text": "!"})]);
        assert_eq!(a.into_blocks().len(), 3);
    }

    #[test]
    fn a_finish_with_another_reason_is_a_failure() {
        let mut a = Assembler::new();
        feed(&mut a, &json!({"type": "finish", "reason": "content-filter"}));
        assert_eq!(a.finish(), None);
        assert_eq!(a.failure().to_value(), json!({"message": "model finished with reason 'content-filter'", "code": "UNKNOWN"}));
    }
}
