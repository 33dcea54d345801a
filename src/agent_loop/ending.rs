//! How turns end.

use serde_json::{Map, Value};

use super::failure::{AbortCause, Failure};

/// `turn/end.reason`.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Completed,
    MaxTokens,
    /// `Reject(reason)` from `pre_step`.
    Blocked(Option<String>),
    /// The turn failed.
    Error(Failure),
    /// The turn's signal aborted.
    Aborted(AbortCause),
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
                reason.insert("error".into(), failure.to_value());
            }
            Ending::Aborted(cause) => {
                reason.insert("reason".into(), cause.to_value());
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
