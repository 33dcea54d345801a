//! How turns end.

use serde_json::{Map, Value};

use super::budget::Stop;
use super::failure::{AbortCause, Failure};

/// `turn/end.reason.kind`: how a turn ended, without what it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndKind {
    Completed,
    MaxTokens,
    Blocked,
    Error,
    Aborted,
    Interrupted,
    Budget,
}

const END_KINDS: [EndKind; 7] =
    [EndKind::Completed, EndKind::MaxTokens, EndKind::Blocked, EndKind::Error, EndKind::Aborted, EndKind::Interrupted, EndKind::Budget];

impl EndKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EndKind::Completed => "completed",
            EndKind::MaxTokens => "max-tokens",
            EndKind::Blocked => "blocked",
            EndKind::Error => "error",
            EndKind::Aborted => "aborted",
            EndKind::Interrupted => "interrupted",
            EndKind::Budget => "budget",
        }
    }

    /// The kind spelt `text`, if it is one: the one reader of a logged `reason.kind`.
    pub fn parse(text: &str) -> Option<EndKind> {
        END_KINDS.into_iter().find(|kind| kind.as_str() == text)
    }
}

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
    /// The loop's budget was spent (at the claim, or before a request): the limit and numbers.
    Budget(Stop),
}

impl Ending {
    pub fn kind(&self) -> EndKind {
        match self {
            Ending::Completed => EndKind::Completed,
            Ending::MaxTokens => EndKind::MaxTokens,
            Ending::Blocked(_) => EndKind::Blocked,
            Ending::Error(_) => EndKind::Error,
            Ending::Aborted(_) => EndKind::Aborted,
            Ending::Interrupted => EndKind::Interrupted,
            Ending::Budget(_) => EndKind::Budget,
        }
    }

    /// Whether pending next-turn input starts the next turn at once (otherwise the loop goes
    /// idle and waits for a wake).
    pub fn runs_on(&self) -> bool {
        matches!(self, Ending::Completed | Ending::MaxTokens)
    }

    pub fn to_value(&self) -> Value {
        let mut reason = Map::new();
        reason.insert("kind".into(), Value::String(self.kind().as_str().into()));
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
            Ending::Budget(stop) => reason.extend(stop.fields()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_end_kind_reads_back_as_itself() {
        for kind in END_KINDS {
            assert_eq!(EndKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(EndKind::parse("Completed"), None);
        assert_eq!(Ending::Interrupted.to_value()["kind"], EndKind::Interrupted.as_str());
    }
}
