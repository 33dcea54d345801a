//! Failures and abort causes: what a turn that failed or aborted carries, typed.
//!
//! Both are open JSON objects on the log (a model's failure keeps the fields its provider gave,
//! an exception's carries its report fields, a caller's cancel cause may say why), so each type
//! keeps its object exactly as built, key order included (the event format is byte for byte what
//! it was), and the loop reads it only through typed accessors: [`Failure::code`] and
//! [`AbortCause::kind`]. Every failure and cause the loop and its host write is built here.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The failure codes the loop writes (a model's own failures carry the model's code, any
/// string). One enum, so a code is spelt in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCode {
    /// An exception with no code of its own.
    Unknown,
    /// A `pre_step` listener returned something that is not `Enter` or `Reject`.
    InvalidDecision,
    /// A `before_request` listener returned something that is not a request, or options that
    /// are not lossless JSON.
    InvalidRequest,
    /// The model's reply (or stream) is not a reply: a wrong type, a bad chunk, repeated call ids.
    InvalidReply,
    /// A tool raised, or returned something that is not a result.
    ToolError,
    /// The model called a tool that is not registered.
    UnknownTool,
    /// A tool call's arguments are not JSON the tool can receive.
    InvalidArguments,
    /// A call the turn's abort kept from starting.
    AbortedBeforeDispatch,
    /// A call cancelled while it ran.
    AbortedDuringDispatch,
    /// A closer's result for a call that had not started when the process died.
    ToolNotStarted,
    /// A closer's result for a call that had started: its side effect may have happened.
    ToolOutcomeUnknown,
    /// Another owner took the session over.
    Fenced,
    /// A `before_tool` gate or a person denied the call, or its decision expired.
    ToolDenied,
    /// A `before_tool` gate failed, or the arguments about to run were not the decided ones.
    GateError,
}

const CODES: [FailureCode; 14] = [
    FailureCode::Unknown,
    FailureCode::InvalidDecision,
    FailureCode::InvalidRequest,
    FailureCode::InvalidReply,
    FailureCode::ToolError,
    FailureCode::UnknownTool,
    FailureCode::InvalidArguments,
    FailureCode::AbortedBeforeDispatch,
    FailureCode::AbortedDuringDispatch,
    FailureCode::ToolNotStarted,
    FailureCode::ToolOutcomeUnknown,
    FailureCode::Fenced,
    FailureCode::ToolDenied,
    FailureCode::GateError,
];

impl FailureCode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCode::Unknown => "UNKNOWN",
            FailureCode::InvalidDecision => "INVALID_DECISION",
            FailureCode::InvalidRequest => "INVALID_REQUEST",
            FailureCode::InvalidReply => "INVALID_REPLY",
            FailureCode::ToolError => "TOOL_ERROR",
            FailureCode::UnknownTool => "UNKNOWN_TOOL",
            FailureCode::InvalidArguments => "INVALID_ARGUMENTS",
            FailureCode::AbortedBeforeDispatch => "ABORTED_BEFORE_DISPATCH",
            FailureCode::AbortedDuringDispatch => "ABORTED_DURING_DISPATCH",
            FailureCode::ToolNotStarted => "TOOL_NOT_STARTED",
            FailureCode::ToolOutcomeUnknown => "TOOL_OUTCOME_UNKNOWN",
            FailureCode::Fenced => "FENCED",
            FailureCode::ToolDenied => "TOOL_DENIED",
            FailureCode::GateError => "GATE_ERROR",
        }
    }

    /// The loop's code spelt `text`, if it is one.
    pub fn parse(text: &str) -> Option<FailureCode> {
        CODES.into_iter().find(|code| code.as_str() == text)
    }

    /// `{"name": name, "code": CODE}`: the `error` of a tool result.
    pub fn tool_error(self, name: &str) -> Value {
        let mut error = Map::new();
        error.insert("name".into(), Value::String(name.into()));
        error.insert("code".into(), Value::String(self.as_str().into()));
        Value::Object(error)
    }
}

impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure's `code`: one the loop assigns, or whatever a model (or tool) gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Code<'a> {
    Loop(FailureCode),
    Other(&'a Value),
}

/// What `turn/end {kind: "error"}` carries as its `error`, what `agent/error` reports and what
/// `request_error` listeners receive: `{message, code, ...details}`. The details are a model
/// error's `status`, `retryAfterMs` and `requestId`, an exception's report fields, a tool bug's
/// error, call id and tool, or a stream's own `error` object, in the order they were added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Failure(Map<String, Value>);

impl Failure {
    /// `{"message": message, "code": CODE}`: a loop rule's failure.
    pub fn new(code: FailureCode, message: impl Into<String>) -> Failure {
        Failure::raised(Value::String(message.into()), Value::String(code.as_str().into()))
    }

    /// `{"message": message, "code": code}` with the host's values (a model error's message and
    /// code are any JSON).
    pub fn raised(message: Value, code: Value) -> Failure {
        let mut fields = Map::new();
        fields.insert("message".into(), message);
        fields.insert("code".into(), code);
        Failure(fields)
    }

    /// A stream's `error` object as its failure: `message` (from `message`) and `code`
    /// (`UNKNOWN`) added after its own fields when it has none.
    pub fn of_stream(mut error: Map<String, Value>, message: impl FnOnce() -> String) -> Failure {
        if !error.contains_key("message") {
            error.insert("message".into(), Value::String(message()));
        }
        if !error.contains_key("code") {
            error.insert("code".into(), Value::String(FailureCode::Unknown.as_str().into()));
        }
        Failure(error)
    }

    /// A tool's bug as `agent/error` reports it: `message`, the result's `error` fields, the
    /// call's id and tool.
    pub fn of_tool(message: Value, error: &Value, call_id: &str, tool: &str) -> Failure {
        let mut fields = Map::new();
        fields.insert("message".into(), message);
        if let Value::Object(error) = error {
            fields.extend(error.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        fields.insert("callId".into(), Value::String(call_id.into()));
        fields.insert("tool".into(), Value::String(tool.into()));
        Failure(fields)
    }

    /// Adds a detail (after the fields already there; an existing key keeps its place).
    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        self.0.insert(key.into(), value);
    }

    /// Adds details, as [`insert`](Self::insert) does each.
    pub fn extend(&mut self, details: Map<String, Value>) {
        self.0.extend(details);
    }

    /// The message, when it is a string.
    pub fn message(&self) -> Option<&str> {
        self.0.get("message").and_then(Value::as_str)
    }

    /// The code, when the failure has one.
    pub fn code(&self) -> Option<Code<'_>> {
        let code = self.0.get("code")?;
        Some(match code.as_str().and_then(FailureCode::parse) {
            Some(known) => Code::Loop(known),
            None => Code::Other(code),
        })
    }

    /// The failure as the log writes it.
    pub fn to_value(&self) -> Value {
        Value::Object(self.0.clone())
    }
}

/// Why a turn's signal aborted: the `kind` of its cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortKind<'a> {
    /// `loop.cancel()`.
    User,
    /// The parent signal aborted.
    Parent,
    /// The loop was disposed, or its task cancelled from outside.
    Disposed,
    /// Another owner took the session over.
    Fenced,
    /// A caller's own kind.
    Other(&'a str),
}

impl AbortKind<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            AbortKind::User => "user",
            AbortKind::Parent => "parent",
            AbortKind::Disposed => "disposed",
            AbortKind::Fenced => "fenced",
            AbortKind::Other(kind) => kind,
        }
    }
}

/// The cause of an abort, as `turn/end {kind: "aborted"}` carries it in `reason`: an object
/// with a string `kind` and whatever else its caller said.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct AbortCause(Map<String, Value>);

impl AbortCause {
    /// `{"kind": kind}`.
    pub fn new(kind: AbortKind<'_>) -> AbortCause {
        let mut fields = Map::new();
        fields.insert("kind".into(), Value::String(kind.as_str().into()));
        AbortCause(fields)
    }

    /// A caller's cause; `Err` says why it is not one (not an object, or no string `kind`).
    pub fn from_value(value: Value) -> Result<AbortCause, String> {
        match value {
            Value::Object(fields) if fields.get("kind").is_some_and(Value::is_string) => Ok(AbortCause(fields)),
            other => Err(format!("an abort cause is an object with a string \"kind\", got {}", crate::json::compact(&other))),
        }
    }

    pub fn kind(&self) -> AbortKind<'_> {
        match self.0.get("kind").and_then(Value::as_str).unwrap_or_default() {
            "user" => AbortKind::User,
            "parent" => AbortKind::Parent,
            "disposed" => AbortKind::Disposed,
            "fenced" => AbortKind::Fenced,
            other => AbortKind::Other(other),
        }
    }

    /// The cause as the log writes it.
    pub fn to_value(&self) -> Value {
        Value::Object(self.0.clone())
    }
}

impl<'de> Deserialize<'de> for AbortCause {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        AbortCause::from_value(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_loop_code_reads_back_as_itself() {
        for code in CODES {
            assert_eq!(FailureCode::parse(code.as_str()), Some(code));
            assert_eq!(Failure::new(code, "m").code(), Some(Code::Loop(code)));
        }
        assert_eq!(Failure::raised(json!("m"), json!("RATE_LIMIT")).code(), Some(Code::Other(&json!("RATE_LIMIT"))));
    }

    #[test]
    fn a_failure_keeps_its_fields_in_the_order_they_were_added() {
        let mut failure = Failure::raised(json!("boom"), json!(429));
        failure.insert("status", json!(429));
        failure.extend(json!({"exception": "E"}).as_object().unwrap().clone());
        assert_eq!(serde_json::to_string(&failure).unwrap(), r#"{"message":"boom","code":429,"status":429,"exception":"E"}"#);
        let stream = Failure::of_stream(json!({"code": "X", "detail": 1}).as_object().unwrap().clone(), || "cut".into());
        assert_eq!(serde_json::to_string(&stream).unwrap(), r#"{"code":"X","detail":1,"message":"cut"}"#);
        let tool = Failure::of_tool(json!("oops"), &json!({"name": "E", "code": "TOOL_ERROR"}), "c1", "t");
        assert_eq!(serde_json::to_string(&tool).unwrap(), r#"{"message":"oops","name":"E","code":"TOOL_ERROR","callId":"c1","tool":"t"}"#);
    }

    #[test]
    fn an_abort_cause_is_an_object_with_a_string_kind() {
        let cause = AbortCause::from_value(json!({"why": "bored", "kind": "user"})).unwrap();
        assert_eq!(cause.kind(), AbortKind::User);
        assert_eq!(serde_json::to_string(&cause).unwrap(), r#"{"why":"bored","kind":"user"}"#);
        assert_eq!(AbortCause::new(AbortKind::Other("timeout")).kind(), AbortKind::Other("timeout"));
        assert_eq!(AbortCause::new(AbortKind::Disposed).to_value(), json!({"kind": "disposed"}));
        assert!(AbortCause::from_value(json!({"kind": 1})).is_err());
        assert!(AbortCause::from_value(json!("user")).is_err());
    }
}
