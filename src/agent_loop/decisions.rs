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

use std::fmt::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::events::{self, publish};
use super::in_doubt::Logged;
use super::tools::Outcome;
use crate::event_log::{Event, LogError, SessionLog};

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

/// The result a resolution gives a call that does not run (denied, answered, expired,
/// cancelled); `None` for one that runs (approved, edited). The one mapping of outcomes: a step
/// resumed from the log ([`Machine::resume_held`](super::Machine::resume_held)) gives it to such
/// a call, and the crash closers to such a call whose result the log lacks (the call never ran,
/// whatever `tool/call` says).
pub fn preset_outcome(resolution: &Resolution, name: &str) -> Option<Outcome> {
    match resolution.outcome {
        Resolved::Approved | Resolved::Edited => None,
        Resolved::Denied => Some(Outcome::denied(name, resolution.reason.as_deref())),
        Resolved::Answered => Some(answered(resolution.value.as_deref())),
        Resolved::Expired => Some(Outcome::expired(name)),
        Resolved::Cancelled => Some(Outcome::aborted_before()),
    }
}

/// The resolution `decision` gives a request about a started call, or why it does not fit:
/// in doubt, `Approve` runs the call again (only where the request offers `run-again`),
/// `Answer(value)` records `value` as its result and `Deny(reason)` records a failure; for
/// input, `Answer(value)` makes the call again with the value and `Deny(reason)` declines.
pub fn started_resolution(ask: &super::call_decisions::CallRequest, decision: Decide) -> Result<Resolution, DecideError> {
    let request = &ask.request;
    let id = &request.decision_id;
    let mut resolved = resolution(request, Resolved::Approved);
    let refuse = |what: &str, offered: &str| {
        DecideError::Invalid(format!(
            "decision {id:?} is about a call {}; {what} does not answer it (it takes {offered})",
            match request.kind {
                RequestKind::Input => "that needs input",
                _ => "in doubt",
            }
        ))
    };
    let offered = match request.kind {
        RequestKind::Input => "Answer(value) or Deny(reason)",
        _ if ask.options.iter().any(|o| o == "run-again") => "Approve() to run it again, Answer(result) or Deny(reason)",
        _ => "Answer(result) or Deny(reason): running a write tool again may do it twice",
    };
    match (decision, request.kind) {
        (Decide::Approve, RequestKind::InDoubt) if ask.options.iter().any(|o| o == "run-again") => {
            resolved.digest = Some(request.digest.clone());
        }
        (Decide::Answer(value), _) => {
            resolved.outcome = Resolved::Answered;
            resolved.value = Some(crate::json::canonical(&value));
            if request.kind == RequestKind::Input {
                resolved.digest = Some(request.digest.clone());
            }
        }
        (Decide::Deny(reason), _) => {
            resolved.outcome = Resolved::Denied;
            resolved.reason = reason;
        }
        (Decide::Approve, _) => return Err(refuse("an approval", offered)),
        (Decide::Edit(_), _) => return Err(refuse("an edit", offered)),
    }
    Ok(resolved)
}

/// What a resolution of a request about a started call gives the call: `None` when it runs
/// again (in doubt and approved; input and answered), else its one result.
pub fn started_outcome(kind: RequestKind, resolution: &Resolution, name: &str) -> Option<Outcome> {
    match (kind, resolution.outcome) {
        (RequestKind::Input, Resolved::Answered) | (_, Resolved::Approved | Resolved::Edited) => None,
        (RequestKind::Input, Resolved::Denied) => Some(Outcome::denied(name, resolution.reason.as_deref())),
        (_, Resolved::Answered) => Some(answered(resolution.value.as_deref())),
        (_, Resolved::Denied) => Some(Outcome::recorded_failure(name, resolution.reason.as_deref())),
        (RequestKind::Input, Resolved::Expired) => Some(Outcome::expired(name)),
        (RequestKind::Input, Resolved::Cancelled) => Some(Outcome::aborted_during()),
        (_, Resolved::Expired | Resolved::Cancelled) => Some(Outcome::outcome_unknown(name)),
    }
}

/// The result an answer gives its call: a string as it is, any other JSON as its text.
fn answered(value: Option<&str>) -> Outcome {
    let value = value.unwrap_or("null");
    match serde_json::from_str::<Value>(value) {
        Ok(Value::String(text)) => Outcome::text(text),
        _ => Outcome::text(value),
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

/// The last turn's open step that the gate asked about: no `step/end` after its assistant
/// message, and at least one gate request. Its calls that need no decision may have run (or
/// be in doubt) while it waits: `logged` says what the log holds of each.
#[derive(Debug, Clone, Default)]
pub struct HeldStep {
    pub turn: u64,
    pub step: u64,
    /// The calls of the step's assistant message: (id, name, arguments).
    pub calls: Vec<(String, String, String)>,
    /// Per call, aligned with `calls`: its result, its `tool/call` without a result, or neither.
    pub logged: Vec<Logged>,
    pub requests: Vec<Request>,
    pub resolutions: Vec<Resolution>,
    /// The gate's verdicts on the step's other calls, as its requests logged them.
    pub gated: Vec<Gated>,
}

impl HeldStep {
    pub fn resolution(&self, decision_id: &str) -> Option<&Resolution> {
        self.resolutions.iter().find(|r| r.decision_id == decision_id)
    }

    /// The requests not resolved yet, in order.
    pub fn pending(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| self.resolution(&r.decision_id).is_none()).collect()
    }

    /// Every request is resolved.
    pub fn ready(&self) -> bool {
        self.pending().is_empty()
    }

    /// Whether a resume has something to do now (what `Machine::take_up` would do): a call
    /// without a result that no pending request holds (one the gate let run, or denied, that
    /// has not started; one that started and is in doubt; once every request is resolved, a
    /// decided one), or, with every request resolved and nothing left to run, the step's end.
    /// `asked`: the open step's requests about started calls.
    pub fn actionable(&self, asked: &[(super::call_decisions::CallRequest, Option<Resolution>)]) -> bool {
        let ready = self.ready();
        let mut holding = false;
        for (index, logged) in self.logged.iter().enumerate() {
            let acts = match logged {
                Logged::Done => false,
                Logged::InDoubt { seq, .. } => !asked.iter().any(|(r, s)| r.call_seq == *seq && s.is_none()),
                Logged::NotStarted => match self.decision_for(index) {
                    Some((_, None)) => false,
                    Some((_, Some(_))) => ready,
                    None => self.gated_for(index).is_some() || ready,
                },
            };
            if acts {
                return true;
            }
            holding |= *logged != Logged::Done;
        }
        ready && !holding
    }

    /// The gate's logged verdict on call `index`, which asked no one (the latest, should the
    /// step have been gated more than once).
    pub fn gated_for(&self, index: usize) -> Option<&Gated> {
        self.gated.iter().rev().find(|g| g.index == index)
    }

    /// The last request made for call `index`, and its resolution.
    pub fn decision_for(&self, index: usize) -> Option<(&Request, Option<&Resolution>)> {
        let request = self.requests.iter().rev().find(|r| r.index == index)?;
        Some((request, self.resolution(&request.decision_id)))
    }
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

/// The calls an `assistant/message` payload requests: (id, name, arguments) in order.
fn calls_of(data: &Value) -> Vec<(String, String, String)> {
    let blocks = data.pointer("/message/content").and_then(Value::as_array);
    let field = |block: &Value, key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    blocks
        .into_iter()
        .flatten()
        .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool-call"))
        .map(|block| (field(block, "id"), field(block, "name"), field(block, "arguments")))
        .collect()
}

/// The held step of `events`' last turn, if it is one.
pub fn held_step(events: &[Event]) -> Option<HeldStep> {
    let start = events.iter().rposition(|e| e.kind() == events::TURN_START)?;
    // By type alone first: most turns asked nothing, or ended.
    let tail = &events[start + 1..];
    if !tail.iter().any(|e| e.kind() == events::DECISION_REQUESTED) || tail.iter().any(|e| e.kind() == events::TURN_END) {
        return None;
    }
    let mut held = HeldStep { turn: events::turn_of(&events[start].data())?, ..HeldStep::default() };
    let mut step_open = false;
    for event in &events[start + 1..] {
        match event.kind() {
            events::TURN_END => return None,
            events::STEP_START => {
                held.step = events::step_of(&event.data()).unwrap_or(0);
                step_open = true;
                held.calls.clear();
                held.logged.clear();
                held.requests.clear();
                held.resolutions.clear();
                held.gated.clear();
            }
            events::STEP_END => step_open = false,
            events::ASSISTANT_MESSAGE if step_open => {
                held.calls = calls_of(&event.data());
                held.logged = vec![Logged::NotStarted; held.calls.len()];
                held.requests.clear();
                held.resolutions.clear();
                held.gated.clear();
            }
            // Matched by id, the first call of that id still without a record of the kind (a
            // reply that repeats an id is refused before it is logged).
            events::TOOL_CALL if step_open => {
                let data = event.data();
                let Some(id) = events::call_id(&data) else { continue };
                let (effect, policy) = events::call_policy(&data);
                let arguments = data.get("arguments").and_then(Value::as_str).unwrap_or_default().to_owned();
                let found = held.calls.iter().zip(held.logged.iter_mut()).find(|((i, _, _), l)| i == id && **l == Logged::NotStarted);
                if let Some((_, logged)) = found {
                    *logged = Logged::InDoubt { seq: event.seq, arguments, effect, policy };
                }
            }
            events::TOOL_RESULT if step_open => {
                let data = event.data();
                let Some(id) = events::result_call_id(&data) else { continue };
                if let Some((_, logged)) =
                    held.calls.iter().zip(held.logged.iter_mut()).find(|((i, _, _), l)| i == id && **l != Logged::Done)
                {
                    *logged = Logged::Done;
                }
            }
            events::DECISION_REQUESTED if step_open => {
                let data = event.data();
                // A budget request holds no call (`budget_decisions`); one about a started call
                // (`callSeq`) is `call_decisions`'.
                if data.get("kind").and_then(Value::as_str) == Some(RequestKind::Budget.as_str()) || data.get("callSeq").is_some() {
                    continue;
                }
                held.requests.extend(request_of(&data));
                let gated = data.get("gated").and_then(Value::as_array);
                held.gated.extend(gated.into_iter().flatten().filter_map(Gated::of));
            }
            events::DECISION_RESOLVED if step_open => held.resolutions.extend(resolution_of(&event.data())),
            _ => {}
        }
    }
    (step_open && !held.requests.is_empty()).then_some(held)
}

/// The held step of `log`, if its last turn is one.
pub fn held(log: &SessionLog) -> Option<HeldStep> {
    log.with_events(held_step)
}

/// The requests of `log` waiting for a decision, in order.
pub fn pending(log: &SessionLog) -> Vec<Request> {
    let mut out: Vec<Request> = held(log).map(|held| held.pending().into_iter().cloned().collect()).unwrap_or_default();
    out.extend(log.with_events(super::call_decisions::pending).into_iter().map(|r| r.request));
    out.extend(log.with_events(super::budget_decisions::pending));
    out.extend(log.with_events(super::foreign_decisions::pending));
    out
}

/// The earliest deadline of a pending request.
pub fn next_expiry(log: &SessionLog) -> Option<i64> {
    pending(log).iter().filter_map(|r| r.expires_at).min()
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

/// Resolves every pending request whose deadline is at or before `now` as `expired`; how many.
pub fn expire(log: &SessionLog, now: i64) -> Result<usize, LogError> {
    resolve_all(log, Resolved::Expired, |r| r.expires_at.is_some_and(|t| t <= now))
}

/// Resolves every pending request as `cancelled` (`loop.cancel()` while waiting); how many.
pub fn cancel_pending(log: &SessionLog) -> Result<usize, LogError> {
    resolve_all(log, Resolved::Cancelled, |_| true)
}

fn resolve_all(log: &SessionLog, outcome: Resolved, due: impl Fn(&Request) -> bool) -> Result<usize, LogError> {
    // The fold and the appends under one publish token: nothing resolves a request in between.
    let publishing = log.publishing()?;
    let mut count = 0;
    if let Some(held) = held(log) {
        for request in held.pending().into_iter().filter(|r| due(r)) {
            publish(&publishing, events::decision_resolved(&resolution(request, outcome)), None)?;
            count += 1;
        }
    }
    for ask in log.with_events(super::call_decisions::pending).into_iter().filter(|r| due(&r.request)) {
        publish(&publishing, events::decision_resolved(&resolution(&ask.request, outcome)), None)?;
        count += 1;
    }
    if let Some(request) = log.with_events(super::budget_decisions::pending).filter(|r| due(r)) {
        publish(&publishing, events::decision_resolved(&resolution(&request, outcome)), None)?;
        count += 1;
    }
    Ok(count)
}

/// Applies a person's decision to request `decision_id` (checking its deadline against `now`
/// first): exactly one `decision/resolved`, or none when `key` was applied before.
pub fn decide(
    log: &SessionLog,
    decision_id: &str,
    decision: Decide,
    by: Option<&str>,
    key: Option<&str>,
    now: i64,
) -> Result<Decided, DecideError> {
    let publishing = log.publishing()?;
    let held = held(log);
    let started = log.with_events(super::call_decisions::requests);
    if let Some((ask, resolved)) = started.iter().find(|(r, _)| r.request.decision_id == decision_id) {
        if let Some(r) = resolved {
            if key.is_some() && r.key.as_deref() == key {
                return Ok(Decided { duplicate: true, ready: started.iter().all(|(_, r)| r.is_some()) });
            }
            if r.outcome == Resolved::Expired {
                return Err(DecideError::Expired(decision_id.to_owned()));
            }
            return Err(DecideError::Resolved(decision_id.to_owned(), r.outcome));
        }
        if ask.request.expires_at.is_some_and(|t| t <= now) {
            publish(&publishing, events::decision_resolved(&resolution(&ask.request, Resolved::Expired)), None)?;
            return Err(DecideError::Expired(decision_id.to_owned()));
        }
        let others = started.iter().any(|(r, s)| s.is_none() && r.request.decision_id != decision_id);
        return super::call_decisions::decide(&publishing, ask, decision, by, key, others);
    }
    if let Some(found) = log.with_events(|all| super::foreign_decisions::find(all, decision_id)) {
        return super::foreign_decisions::decide(&publishing, log, &found, decision, by, key, now);
    }
    if let Some((request, None)) = log.with_events(super::budget_decisions::latest).filter(|(r, _)| r.decision_id == decision_id) {
        if request.expires_at.is_some_and(|t| t <= now) {
            publish(&publishing, events::decision_resolved(&resolution(&request, Resolved::Expired)), None)?;
            return Err(DecideError::Expired(decision_id.to_owned()));
        }
        let mut resolved = resolution(&request, Resolved::Approved);
        resolved.by = by.map(str::to_owned);
        resolved.key = key.map(str::to_owned);
        match decision {
            Decide::Approve => resolved.digest = Some(request.digest.clone()),
            Decide::Deny(reason) => {
                resolved.outcome = Resolved::Denied;
                resolved.reason = reason;
            }
            Decide::Edit(_) | Decide::Answer(_) => {
                return Err(DecideError::Invalid(format!(
                    "decision {decision_id:?} asks whether to spend past the budget; it takes Approve() or Deny(reason)"
                )));
            }
        }
        publish(&publishing, events::decision_resolved(&resolved), None)?;
        return Ok(Decided { duplicate: false, ready: true });
    }
    let Some(held) = held.filter(|h| h.requests.iter().any(|r| r.decision_id == decision_id)) else {
        // Not in the held step: resolved in an earlier turn, or never requested.
        let earlier = log.with_events(|all| {
            all.iter()
                .rev()
                .filter(|e| e.kind() == events::DECISION_RESOLVED)
                .filter_map(|e| resolution_of(&e.data()))
                .find(|r| r.decision_id == decision_id)
        });
        return match earlier {
            Some(r) if key.is_some() && r.key.as_deref() == key => Ok(Decided { duplicate: true, ready: false }),
            Some(r) if r.outcome == Resolved::Expired => Err(DecideError::Expired(decision_id.to_owned())),
            Some(r) => Err(DecideError::Resolved(decision_id.to_owned(), r.outcome)),
            None => Err(DecideError::Unknown(decision_id.to_owned())),
        };
    };
    if let Some(r) = held.resolution(decision_id) {
        if key.is_some() && r.key.as_deref() == key {
            return Ok(Decided { duplicate: true, ready: held.ready() });
        }
        if r.outcome == Resolved::Expired {
            return Err(DecideError::Expired(decision_id.to_owned()));
        }
        return Err(DecideError::Resolved(decision_id.to_owned(), r.outcome));
    }
    let request = held.requests.iter().find(|r| r.decision_id == decision_id).cloned().expect("found above");
    if request.expires_at.is_some_and(|t| t <= now) {
        publish(&publishing, events::decision_resolved(&resolution(&request, Resolved::Expired)), None)?;
        return Err(DecideError::Expired(decision_id.to_owned()));
    }
    let resolved = resolve_request(&request, decision, by, key)?;
    publish(&publishing, events::decision_resolved(&resolved), None)?;
    let ready = held.pending().iter().all(|r| r.decision_id == decision_id);
    Ok(Decided { duplicate: false, ready })
}

/// The resolution of `request` by a person's `decision` (refused when it does not fit the
/// request's kind).
pub(crate) fn resolve_request(request: &Request, decision: Decide, by: Option<&str>, key: Option<&str>) -> Result<Resolution, DecideError> {
    let decision_id = request.decision_id.as_str();
    let mut resolved = resolution(request, Resolved::Approved);
    resolved.by = by.map(str::to_owned);
    resolved.key = key.map(str::to_owned);
    let kind = request.kind;
    let refuse =
        |what: &str| DecideError::Invalid(format!("decision {decision_id:?} asks for {}; {what} does not answer it", kind.as_str()));
    match (decision, kind) {
        (Decide::Approve, RequestKind::Approval) => resolved.digest = Some(request.digest.clone()),
        (Decide::Edit(arguments), RequestKind::Approval) => {
            if !arguments.is_object() {
                return Err(DecideError::Invalid(format!(
                    "edited arguments must be a JSON object, got {}",
                    crate::json::compact(&arguments)
                )));
            }
            let text = crate::json::canonical(&arguments);
            resolved.outcome = Resolved::Edited;
            resolved.digest = Some(digest(&text));
            resolved.arguments = Some(text);
        }
        (Decide::Answer(value), RequestKind::Answer) => {
            resolved.outcome = Resolved::Answered;
            resolved.value = Some(crate::json::canonical(&value));
        }
        (Decide::Deny(reason), _) => {
            resolved.outcome = Resolved::Denied;
            resolved.reason = reason;
        }
        (Decide::Approve, _) => return Err(refuse("an approval")),
        (Decide::Edit(_), _) => return Err(refuse("an edit")),
        (Decide::Answer(_), _) => return Err(refuse("an answer")),
    }
    Ok(resolved)
}
