//! How turns end, and the failure codes the loop itself assigns.

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
}

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
        }
    }

    /// `{"message": message, "code": CODE}`: the failure dict of a loop rule.
    pub fn failure(self, message: impl Into<String>) -> Value {
        let mut failure = Map::new();
        failure.insert("message".into(), Value::String(message.into()));
        failure.insert("code".into(), Value::String(self.as_str().into()));
        Value::Object(failure)
    }

    /// `{"name": name, "code": CODE}`: the `error` of a tool result.
    pub fn tool_error(self, name: &str) -> Value {
        let mut error = Map::new();
        error.insert("name".into(), Value::String(name.into()));
        error.insert("code".into(), Value::String(self.as_str().into()));
        Value::Object(error)
    }
}

impl std::fmt::Display for FailureCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `turn/end.reason`.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Completed,
    MaxTokens,
    /// `Reject(reason)` from `pre_step`.
    Blocked(Option<String>),
    /// The turn failed; the failure dict (`message`, `code`, ...).
    Error(Value),
    /// The turn's signal aborted; the cause dict.
    Aborted(Value),
    /// Appended by the crash closers: the process died inside the turn.
    Interrupted,
}

impl Ending {
    pub fn kind(&self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::MaxTokens => "max-tokens",
            Ending::Blocked(_) => "blocked",
            Ending::Error(_) => "error",
            Ending::Aborted(_) => "aborted",
            Ending::Interrupted => "interrupted",
        }
    }

    /// Whether pending next-turn input starts the next turn at once (otherwise the loop goes
    /// idle and waits for a wake).
    pub fn runs_on(&self) -> bool {
        matches!(self, Ending::Completed | Ending::MaxTokens)
    }

    pub fn to_value(&self) -> Value {
        let mut reason = Map::new();
        reason.insert("kind".into(), Value::String(self.kind().into()));
        match self {
            Ending::Blocked(Some(text)) => {
                reason.insert("reason".into(), Value::String(text.clone()));
            }
            Ending::Error(failure) => {
                reason.insert("error".into(), failure.clone());
            }
            Ending::Aborted(cause) => {
                reason.insert("reason".into(), cause.clone());
            }
            _ => {}
        }
        Value::Object(reason)
    }

    pub fn to_json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out);
        out
    }

    /// Appends [`to_json`](Self::to_json)'s text to `out`.
    pub fn write_json(&self, out: &mut String) {
        match self {
            Ending::Completed => out.push_str(r#"{"kind":"completed"}"#),
            _ => out.push_str(&crate::json::compact(&self.to_value())),
        }
    }
}
