//! Decisions: a tool call that waits for a person (`docs/decisions.md`).
//!
//! A `before_tool` gate that asks makes the machine append `decision/requested` for the call
//! and stop the step there: the turn stays open, nothing of the step runs, and the run ends
//! waiting. What is pending is a fold of the log ([`held_step`]), so a loop that reopens the
//! session (in this process or another) finds the same requests. [`decide`] appends one
//! `decision/resolved` per request (refusing unknown, resolved and expired ones; the same `key`
//! twice is applied once); [`expire`] and [`cancel_pending`] resolve what is left as `expired` /
//! `cancelled`. Once every request of the step is resolved, the machine resumes the step from the
//! log ([`Machine::resume_held`](super::Machine::resume_held)) without asking the model again.
//!
//! A request is bound to its call by the call's position in the step's assistant message
//! (`index`), its id and the digest of its exact arguments; the decision is addressed by an id
//! Kerman assigns, so a model-made call id that repeats another cannot redirect a decision.
//!
//! Four things ask: the gate (here and [`held`]), a started call (`call_decisions`), a budget
//! (`budget_decisions`) and another framework's loop (`foreign_decisions`). Each finds its
//! request its own way; the rule of deciding one is [`decide`]'s, in one place.

use std::fmt::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::events;
use crate::event_log::LogError;

mod decide;
mod held;
mod outcome;

pub use decide::{cancel_pending, decide, expire, expire_with, next_expiry, next_expiry_with, own_pending, pending, pending_with};
pub use held::{held, held_step, HeldStep};
pub use outcome::{preset_outcome, started_outcome, started_resolution};

/// `sha256:<hex>` of the arguments' exact text: what a decision approves is the bytes that
/// run, not a reading of them.
pub fn digest(arguments: &str) -> String {
    let hash = Sha256::digest(arguments.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in &hash {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// What a request asks for: an approval (approve, deny or edit the call) or an answer (a value
/// matching its schema, or a denial).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Approval,
    Answer,
    /// About a started call in doubt (`call_decisions`): run again, record a result or a failure.
    InDoubt,
    /// About a started call that needs input (`call_decisions`): an answer, or a denial.
    Input,
    /// About a model request a spent budget stopped (`budget_decisions`): approve or deny.
    Budget,
}

impl RequestKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Approval => "approval",
            RequestKind::Answer => "answer",
            RequestKind::InDoubt => "in-doubt",
            RequestKind::Input => "input",
            RequestKind::Budget => "budget",
        }
    }

    fn parse(text: &str) -> RequestKind {
        match text {
            "answer" => RequestKind::Answer,
            "in-doubt" => RequestKind::InDoubt,
            "input" => RequestKind::Input,
            "budget" => RequestKind::Budget,
            _ => RequestKind::Approval,
        }
    }

    /// Whether an `Answer` to it is checked against its schema.
    pub fn takes_answer(self) -> bool {
        matches!(self, RequestKind::Answer | RequestKind::Input)
    }
}

/// One `decision/requested`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub turn: u64,
    pub step: u64,
    pub decision_id: String,
    pub call_id: String,
    /// The call's position among the step's calls.
    pub index: usize,
    pub name: String,
    /// The call's arguments, as the model gave them.
    pub arguments: String,
    pub digest: String,
    pub kind: RequestKind,
    pub note: Option<String>,
    /// JSON text.
    pub schema: Option<String>,
    /// Epoch milliseconds.
    pub expires_at: Option<i64>,
    /// The framework that asked: the `for` of its `decision/requested` (JSON object text);
    /// `None` for the loop's own requests.
    pub requester: Option<String>,
}

/// What a gate said of a call it asked no one about, logged with the step's requests (the
/// `gated` list of the `last` one), so that the step resumes with the very verdict the gate gave
/// before the wait rather than gating the call again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedKind {
    Run,
    Edit,
    Deny,
    /// The gate raised, or returned something that is not a verdict (fails closed).
    Failed,
}

impl GatedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GatedKind::Run => "run",
            GatedKind::Edit => "edit",
            GatedKind::Deny => "deny",
            GatedKind::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Option<GatedKind> {
        [GatedKind::Run, GatedKind::Edit, GatedKind::Deny, GatedKind::Failed].into_iter().find(|k| k.as_str() == text)
    }
}

/// One gate verdict of a round that asked: call `index` (`call_id`) runs (`digest`: of the
/// arguments that will run; `arguments`: the edited ones, for an edit), or does not (`reason`:
/// a denial's reason, or why the gate failed).
#[derive(Debug, Clone, PartialEq)]
pub struct Gated {
    pub index: usize,
    pub call_id: String,
    pub kind: GatedKind,
    pub arguments: Option<String>,
    pub digest: Option<String>,
    pub reason: Option<String>,
}

impl Gated {
    /// The JSON object the `gated` list of `decision/requested` holds.
    pub fn to_json(&self) -> Value {
        let mut object = serde_json::Map::new();
        object.insert("index".into(), Value::from(self.index));
        object.insert("callId".into(), Value::from(self.call_id.as_str()));
        object.insert("verdict".into(), Value::from(self.kind.as_str()));
        for (key, value) in [("arguments", &self.arguments), ("digest", &self.digest), ("reason", &self.reason)] {
            if let Some(value) = value {
                object.insert(key.into(), Value::from(value.as_str()));
            }
        }
        Value::Object(object)
    }

    fn of(data: &Value) -> Option<Gated> {
        Some(Gated {
            index: usize::try_from(data.get("index")?.as_u64()?).ok()?,
            call_id: text(data, "callId")?,
            kind: GatedKind::parse(data.get("verdict")?.as_str()?)?,
            arguments: text(data, "arguments"),
            digest: text(data, "digest"),
            reason: text(data, "reason"),
        })
    }
}

/// How a request was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    Approved,
    Denied,
    Edited,
    Answered,
    Expired,
    Cancelled,
}

impl Resolved {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolved::Approved => "approved",
            Resolved::Denied => "denied",
            Resolved::Edited => "edited",
            Resolved::Answered => "answered",
            Resolved::Expired => "expired",
            Resolved::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<Resolved> {
        [Resolved::Approved, Resolved::Denied, Resolved::Edited, Resolved::Answered, Resolved::Expired, Resolved::Cancelled]
            .into_iter()
            .find(|r| r.as_str() == text)
    }
}

/// One `decision/resolved`.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    pub turn: u64,
    pub step: u64,
    pub decision_id: String,
    pub call_id: String,
    pub outcome: Resolved,
    pub by: Option<String>,
    pub key: Option<String>,
    /// The digest of the arguments that will run (approved, edited).
    pub digest: Option<String>,
    /// The edited arguments' JSON text.
    pub arguments: Option<String>,
    pub reason: Option<String>,
    /// An answer's JSON text.
    pub value: Option<String>,
}

/// A person's decision, as `decide` takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decide {
    Approve,
    Deny(Option<String>),
    /// The arguments to run instead (any JSON; run as their canonical text).
    Edit(Value),
    Answer(Value),
}

/// Why a decision was refused.
#[derive(Debug)]
pub enum DecideError {
    /// No request has this id.
    Unknown(String),
    /// The request was resolved already (its outcome).
    Resolved(String, Resolved),
    /// The request's deadline passed (it is resolved `expired` now).
    Expired(String),
    /// The decision does not fit the request (an answer to an approval, say).
    Invalid(String),
    Log(LogError),
}

impl DecideError {
    /// `unknown`, `resolved`, `expired` or `invalid`.
    pub fn reason(&self) -> &'static str {
        match self {
            DecideError::Unknown(_) => "unknown",
            DecideError::Resolved(..) => "resolved",
            DecideError::Expired(_) => "expired",
            DecideError::Invalid(_) => "invalid",
            DecideError::Log(_) => "log",
        }
    }
}

impl std::fmt::Display for DecideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecideError::Unknown(id) => write!(f, "no decision {id:?} was requested in this session"),
            DecideError::Resolved(id, outcome) => write!(f, "decision {id:?} was resolved already ({})", outcome.as_str()),
            DecideError::Expired(id) => write!(f, "decision {id:?} expired before it was decided"),
            DecideError::Invalid(detail) => f.write_str(detail),
            DecideError::Log(e) => e.fmt(f),
        }
    }
}

impl From<LogError> for DecideError {
    fn from(e: LogError) -> Self {
        DecideError::Log(e)
    }
}

/// What applying a decision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// The same key was applied before: nothing was appended.
    pub duplicate: bool,
    /// Every request of the step is resolved: the step can resume.
    pub ready: bool,
}

fn text(data: &Value, key: &str) -> Option<String> {
    data.get(key).and_then(Value::as_str).map(str::to_owned)
}

pub(crate) fn request_of(data: &Value) -> Option<Request> {
    Some(Request {
        turn: events::turn_of(data)?,
        step: events::step_of(data)?,
        decision_id: text(data, "decisionId")?,
        call_id: text(data, "callId")?,
        index: usize::try_from(data.get("index")?.as_u64()?).ok()?,
        name: text(data, "name").unwrap_or_default(),
        arguments: text(data, "arguments").unwrap_or_default(),
        digest: text(data, "digest")?,
        kind: RequestKind::parse(data.get("kind").and_then(Value::as_str).unwrap_or_default()),
        note: text(data, "note"),
        schema: data.get("schema").map(crate::json::compact),
        expires_at: data.get("expiresAt").and_then(Value::as_i64),
        requester: data.get("for").filter(|v| v.is_object()).map(crate::json::compact),
    })
}

pub(crate) fn resolution_of(data: &Value) -> Option<Resolution> {
    Some(Resolution {
        turn: events::turn_of(data)?,
        step: events::step_of(data)?,
        decision_id: text(data, "decisionId")?,
        call_id: text(data, "callId").unwrap_or_default(),
        outcome: Resolved::parse(data.get("outcome")?.as_str()?)?,
        by: text(data, "by"),
        key: text(data, "key"),
        digest: text(data, "digest"),
        arguments: text(data, "arguments"),
        reason: text(data, "reason"),
        value: data.get("value").map(crate::json::compact),
    })
}

pub(crate) fn resolution(request: &Request, outcome: Resolved) -> Resolution {
    Resolution {
        turn: request.turn,
        step: request.step,
        decision_id: request.decision_id.clone(),
        call_id: request.call_id.clone(),
        outcome,
        by: None,
        key: None,
        digest: None,
        arguments: None,
        reason: None,
        value: None,
    }
}
