//! The one writer (and reader) of the loop's events: `turn/*`, `step/*`, `user/message`,
//! `request/header`, `assistant/*`, `tool/*`, `decision/*`, `output/validated` and `context/compacted`. Every
//! payload the loop logs is built here, as compact JSON text, and appended through [`append`]; the crash closers and the recovery folds
//! read them back with the readers at the end. Keeping writer and reader side by side is what
//! keeps the grammar in one place (docs/format.md documents it for outsiders).

use std::sync::Arc;

use serde_json::Value;

use super::ending::{EndKind, Ending};
use super::in_doubt::{InDoubt, SideEffect, ToolInfo};
use crate::event_log::{is_surface_type, Bulk, Event, LogError, Publishing, SessionLog, Surface, SurfaceOp};
use crate::json::{push_str_literal, push_u64, Scratch};
use crate::message::{BlockType, Message};

pub const TURN_START: &str = "turn/start";
pub const TURN_END: &str = "turn/end";
pub const STEP_START: &str = "step/start";
pub const STEP_END: &str = "step/end";
pub const USER_MESSAGE: &str = "user/message";
pub const REQUEST_HEADER: &str = "request/header";
pub const ASSISTANT_CHUNK: &str = "assistant/chunk";
pub const ASSISTANT_MESSAGE: &str = "assistant/message";
pub const TOOL_CALL: &str = "tool/call";
pub const TOOL_RESULT: &str = "tool/result";
pub const DECISION_REQUESTED: &str = "decision/requested";
pub const DECISION_RESOLVED: &str = "decision/resolved";
pub const OUTPUT_VALIDATED: &str = "output/validated";
pub const CONTEXT_COMPACTED: &str = "context/compacted";
pub const TOOL_PROGRESS: &str = "tool/progress";
pub use crate::event_log::INSTRUCTIONS;

/// One loop event, ready to append: its type, payload and (for surface events) the seqs it
/// cites and where its message lies in the payload (`bulk`, when written here).
#[derive(Debug, Clone, PartialEq)]
pub struct LoopEvent {
    pub kind: &'static str,
    pub data: Payload,
    pub cites: Option<Vec<u64>>,
    pub bulk: Bulk,
}

/// A payload's JSON text: written for the event, or a message's own text (`user/message`),
/// which the event shares instead of copying.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Written(Scratch),
    Shared(Arc<str>),
}

impl Payload {
    pub fn as_str(&self) -> &str {
        match self {
            Payload::Written(text) => text,
            Payload::Shared(text) => text,
        }
    }

    fn into_arc(self) -> Arc<str> {
        match self {
            Payload::Written(text) => text.to_arc(),
            Payload::Shared(text) => text,
        }
    }
}

impl LoopEvent {
    fn new(kind: &'static str, data: Scratch) -> LoopEvent {
        LoopEvent { kind, data: Payload::Written(data), cites: None, bulk: Bulk::NONE }
    }

    fn citing(kind: &'static str, data: Scratch, cites: Vec<u64>) -> LoopEvent {
        LoopEvent { kind, data: Payload::Written(data), cites: Some(cites), bulk: Bulk::NONE }
    }
}

/// Appends `event` to `log`; its seq.
pub fn append(log: &SessionLog, event: LoopEvent) -> Result<u64, LogError> {
    let surface =
        is_surface_type(event.kind).then_some(Surface { op: SurfaceOp::Append, source_event_seqs: event.cites, bulk: event.bulk });
    log.append_owned_seq(event.kind, event.data.into_arc(), surface)
}

/// Commits `event` under a publish token already held, at `time` (the closers reuse the last
/// event's time) or now.
pub fn publish(publishing: &Publishing<'_>, event: LoopEvent, time: Option<i64>) -> Result<Event, LogError> {
    let surface =
        is_surface_type(event.kind).then_some(Surface { op: SurfaceOp::Append, source_event_seqs: event.cites, bulk: event.bulk });
    publishing.publish(event.kind, event.data.into_arc(), surface, time)
}

/// `{"turn":T` (unterminated).
fn turn_head(turn: u64) -> Scratch {
    let mut out = Scratch::new();
    out.push_str(r#"{"turn":"#);
    push_u64(&mut out, turn);
    out
}

/// `{"turn":T,"step":S` (unterminated): the head of every step payload.
fn step_head(turn: u64, step: u64) -> Scratch {
    let mut out = turn_head(turn);
    out.push_str(r#","step":"#);
    push_u64(&mut out, step);
    out
}

pub fn turn_start(turn: u64) -> LoopEvent {
    let mut data = turn_head(turn);
    data.push('}');
    LoopEvent::new(TURN_START, data)
}

/// `turn/start {turn, continues}`: a continuation, which answers the input of turn `continues`
/// (interrupted by a crash) by asking the model again (`continuation.rs`).
pub fn turn_start_continuing(turn: u64, continues: u64) -> LoopEvent {
    let mut data = turn_head(turn);
    data.push_str(r#","continues":"#);
    push_u64(&mut data, continues);
    data.push('}');
    LoopEvent::new(TURN_START, data)
}

/// `turn/end {turn, reason}`.
pub fn turn_end(turn: u64, ending: &Ending) -> LoopEvent {
    let mut data = turn_head(turn);
    data.push_str(r#","reason":"#);
    ending.write_json(&mut data);
    data.push('}');
    LoopEvent::new(TURN_END, data)
}

pub fn step_start(turn: u64, step: u64) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push('}');
    LoopEvent::new(STEP_START, data)
}

pub fn step_end(turn: u64, step: u64) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push('}');
    LoopEvent::new(STEP_END, data)
}

/// `user/message`: the message itself is the payload.
pub fn user_message(message: &Message) -> LoopEvent {
    LoopEvent { kind: USER_MESSAGE, data: Payload::Shared(message.json_arc()), cites: None, bulk: Bulk::NONE }
}

/// `request/header {options, instructions?}`; `options` is the options' JSON text,
/// `instructions` the instructions the request carries (the key is absent without).
pub fn request_header(options: &str, instructions: Option<&str>) -> LoopEvent {
    let mut data = Scratch::new();
    data.push_str(r#"{"options":"#);
    data.push_str(options);
    if let Some(text) = instructions {
        data.push_str(r#","instructions":"#);
        push_str_literal(&mut data, text);
    }
    data.push('}');
    LoopEvent::new(REQUEST_HEADER, data)
}

/// `agent/instructions {instructions}`: the loop's configured instructions from now on
/// (`null`: none).
pub fn instructions(text: Option<&str>) -> LoopEvent {
    let mut data = Scratch::new();
    data.push_str(r#"{"instructions":"#);
    match text {
        Some(text) => push_str_literal(&mut data, text),
        None => data.push_str("null"),
    }
    data.push('}');
    LoopEvent::new(INSTRUCTIONS, data)
}

/// `assistant/chunk {turn, step, chunk}`; `chunk` is the chunk's JSON text.
pub fn assistant_chunk(turn: u64, step: u64, chunk: &str) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push_str(r#","chunk":"#);
    data.push_str(chunk);
    data.push('}');
    LoopEvent::new(ASSISTANT_CHUNK, data)
}

/// `assistant/chunk {turn, step, chunk: {type: "finish", reason: "error", error}}`: a model
/// request failed with nothing in the log that ends it (`machine/attempt.rs`); `error` is the
/// failure, as `request_error` gets it.
pub fn failed_finish(turn: u64, step: u64, failure: &super::failure::Failure) -> LoopEvent {
    let mut chunk = serde_json::Map::new();
    chunk.insert("type".into(), "finish".into());
    chunk.insert("reason".into(), "error".into());
    chunk.insert("error".into(), failure.to_value());
    assistant_chunk(turn, step, &crate::json::compact(&Value::Object(chunk)))
}

/// `assistant/chunk {turn, step, chunk: {type: "finish", reason: "cancelled"}}`: a cancellation
/// cut a model request the loop had made before anything visible of it was logged
/// (`machine/attempt.rs`): the request is in the log, counted once, without an
/// `assistant/message` (reference CAN-22).
pub fn cancelled_finish(turn: u64, step: u64) -> LoopEvent {
    assistant_chunk(turn, step, r#"{"type":"finish","reason":"cancelled"}"#)
}

/// `assistant/message {turn, step, message[, interrupted: true][, usage]}`, citing the chunks
/// it was assembled from; the message's bytes are its `bulk` (the span fold reads the fields
/// around it and jumps over it).
pub fn assistant_message(turn: u64, step: u64, message: &Message, interrupted: bool, usage: Option<&str>, chunks: Vec<u64>) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push_str(r#","message":"#);
    let start = data.len();
    data.push_str(message.json());
    let bulk = Bulk::new(start, data.len());
    if interrupted {
        data.push_str(r#","interrupted":true"#);
    }
    if let Some(usage) = usage {
        data.push_str(r#","usage":"#);
        data.push_str(usage);
    }
    data.push('}');
    LoopEvent { bulk, ..LoopEvent::citing(ASSISTANT_MESSAGE, data, chunks) }
}

/// `tool/call {turn, step, callId, name, arguments}`.
pub fn tool_call(turn: u64, step: u64, id: &str, name: &str, arguments: &str, info: ToolInfo) -> LoopEvent {
    let mut data = step_head(turn, step);
    for (key, value) in [("callId", id), ("name", name), ("arguments", arguments)] {
        data.push_str(",\"");
        data.push_str(key);
        data.push_str("\":");
        push_str_literal(&mut data, value);
    }
    // The defaults (`write`, `fail`) are left out: a record without them is one of those.
    if info.effect != SideEffect::Write {
        data.push_str(",\"effect\":\"");
        data.push_str(info.effect.as_str());
        data.push('"');
    }
    if info.in_doubt != InDoubt::Fail {
        data.push_str(",\"onInDoubt\":\"");
        data.push_str(info.in_doubt.as_str());
        data.push('"');
    }
    data.push('}');
    LoopEvent::new(TOOL_CALL, data)
}

/// `tool/result {turn, step, message[, error][, meta][, concludesTurn]}`, citing its `tool/call`
/// (none for a closer's result of a call that never started). `concludesTurn: true`: the result
/// ended the turn (`ToolResult(concludes_turn=True)`), which asks the model nothing more, so a
/// reader of the log counts it as the answer to the turn's input (`continuation`).
pub fn tool_result(
    turn: u64,
    step: u64,
    message: &Message,
    error: Option<&Value>,
    meta: Option<&str>,
    call: Option<u64>,
    concludes: bool,
) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push_str(r#","message":"#);
    data.push_str(message.json());
    if let Some(error) = error {
        data.push_str(r#","error":"#);
        data.push_str(&crate::json::compact(error));
    }
    if let Some(meta) = meta {
        data.push_str(r#","meta":"#);
        data.push_str(meta);
    }
    if concludes {
        data.push_str(r#","concludesTurn":true"#);
    }
    data.push('}');
    match call {
        Some(seq) => LoopEvent::citing(TOOL_RESULT, data, vec![seq]),
        None => LoopEvent::new(TOOL_RESULT, data),
    }
}

/// Pushes `,"key":value` for each present field (`value`: JSON text).
fn push_fields(data: &mut Scratch, fields: &[(&str, Option<&str>)]) {
    for (key, value) in fields {
        if let Some(value) = value {
            data.push_str(",\"");
            data.push_str(key);
            data.push_str("\":");
            data.push_str(value);
        }
    }
}

fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_str_literal(&mut out, text);
    out
}

/// `decision/requested {turn, step, decisionId, callId, index, name, arguments, digest, kind[,
/// note][, schema][, expiresAt][, last][, gated]}`: call `index` of the step waits for a person. `schema`
/// is JSON text; `expiresAt` epoch milliseconds; `last: true` on the final request written before
/// the step stops to wait (a reader such as a UI stream knows the step waits from it).
pub fn decision_requested(request: &super::decisions::Request, last: bool) -> LoopEvent {
    decision_round(request, last, &[])
}

/// `decision/requested` as the machine writes it: the `last` request of a round also carries
/// `gated`, the gate's verdicts on the step's calls that asked no one (`[{index, callId,
/// verdict: "run"|"edit"|"deny"|"failed"[, arguments][, digest][, reason]}]`), so the step
/// resumes with them rather than gating those calls again. Left out when empty.
pub fn decision_round(request: &super::decisions::Request, last: bool, gated: &[super::decisions::Gated]) -> LoopEvent {
    let mut data = request_fields(request, last, gated);
    data.push('}');
    LoopEvent::new(DECISION_REQUESTED, data)
}

/// `decision/requested` for a loop other than Kerman's (a framework's deferred tool call under
/// `KermanDurability`), outside any turn: `{turn: 0, step: 0, decisionId, callId, index, name,
/// arguments, digest, kind: "approval"[, last], for}`; `for` is the requester's JSON object text.
pub fn foreign_decision_requested(request: &super::decisions::Request, requester: &str, last: bool) -> LoopEvent {
    let mut data = request_fields(request, last, &[]);
    push_fields(&mut data, &[("for", Some(requester))]);
    data.push('}');
    LoopEvent::new(DECISION_REQUESTED, data)
}

/// A request's fields, unterminated.
fn request_fields(request: &super::decisions::Request, last: bool, gated: &[super::decisions::Gated]) -> Scratch {
    let mut data = step_head(request.turn, request.step);
    let gated =
        (!gated.is_empty()).then(|| crate::json::compact(&Value::Array(gated.iter().map(super::decisions::Gated::to_json).collect())));
    let index = request.index.to_string();
    let expires = request.expires_at.map(|t| t.to_string());
    let note = request.note.as_deref().map(literal);
    push_fields(
        &mut data,
        &[
            ("decisionId", Some(&literal(&request.decision_id))),
            ("callId", Some(&literal(&request.call_id))),
            ("index", Some(&index)),
            ("name", Some(&literal(&request.name))),
            ("arguments", Some(&literal(&request.arguments))),
            ("digest", Some(&literal(&request.digest))),
            ("kind", Some(&literal(request.kind.as_str()))),
            ("note", note.as_deref()),
            ("schema", request.schema.as_deref()),
            ("expiresAt", expires.as_deref()),
            ("last", last.then_some("true")),
            ("gated", gated.as_deref()),
        ],
    );
    data
}

/// `decision/requested` about a call that started (`callSeq`: its `tool/call`'s seq):
/// `{turn, step, decisionId, callId, index, name, arguments, digest, kind: "in-doubt"|"input",
/// callSeq, options[, note][, schema][, payload][, expiresAt][, last]}`. `payload` is the tool's
/// opaque JSON for the call made again (an MCP server's state token).
pub fn call_decision_requested(ask: &super::call_decisions::CallRequest, last: bool) -> LoopEvent {
    let request = &ask.request;
    let mut data = step_head(request.turn, request.step);
    let index = request.index.to_string();
    let call_seq = ask.call_seq.to_string();
    let expires = request.expires_at.map(|t| t.to_string());
    let note = request.note.as_deref().map(literal);
    let options = crate::json::compact(&Value::Array(ask.options.iter().map(|o| Value::from(o.as_str())).collect()));
    push_fields(
        &mut data,
        &[
            ("decisionId", Some(&literal(&request.decision_id))),
            ("callId", Some(&literal(&request.call_id))),
            ("index", Some(&index)),
            ("name", Some(&literal(&request.name))),
            ("arguments", Some(&literal(&request.arguments))),
            ("digest", Some(&literal(&request.digest))),
            ("kind", Some(&literal(request.kind.as_str()))),
            ("callSeq", Some(&call_seq)),
            ("options", Some(&options)),
            ("note", note.as_deref()),
            ("schema", request.schema.as_deref()),
            ("payload", ask.payload.as_deref()),
            ("expiresAt", expires.as_deref()),
            ("last", last.then_some("true")),
        ],
    );
    data.push('}');
    LoopEvent::new(DECISION_REQUESTED, data)
}

/// `decision/resolved {turn, step, decisionId, callId, outcome[, by][, key][, digest][,
/// arguments][, reason][, value]}`: `digest` (and, edited, `arguments`) of what will run;
/// `value` is an answer's JSON.
pub fn decision_resolved(resolution: &super::decisions::Resolution) -> LoopEvent {
    let mut data = step_head(resolution.turn, resolution.step);
    let opt = |v: &Option<String>| v.as_deref().map(literal);
    let (by, key, digest, arguments, reason) =
        (opt(&resolution.by), opt(&resolution.key), opt(&resolution.digest), opt(&resolution.arguments), opt(&resolution.reason));
    push_fields(
        &mut data,
        &[
            ("decisionId", Some(&literal(&resolution.decision_id))),
            ("callId", Some(&literal(&resolution.call_id))),
            ("outcome", Some(&literal(resolution.outcome.as_str()))),
            ("by", by.as_deref()),
            ("key", key.as_deref()),
            ("digest", digest.as_deref()),
            ("arguments", arguments.as_deref()),
            ("reason", reason.as_deref()),
            ("value", resolution.value.as_deref()),
        ],
    );
    data.push('}');
    LoopEvent::new(DECISION_RESOLVED, data)
}

/// `output/validated {turn, step, output}`: the turn's final reply, as its output type
/// validated it; `output` is the value's JSON text.
pub fn output_validated(turn: u64, step: u64, output: &str) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push_str(r#","output":"#);
    data.push_str(output);
    data.push('}');
    LoopEvent::new(OUTPUT_VALIDATED, data)
}

/// `context/compacted {first, last, messages, pinned, strategy, ...}`: the record as the host
/// built it (checked by [`compaction::append`](super::compaction::append)), written compact.
pub fn context_compacted(data: &Value) -> LoopEvent {
    let mut out = Scratch::new();
    out.push_str(&crate::json::compact(data));
    LoopEvent::new(CONTEXT_COMPACTED, out)
}

/// `tool/progress {turn, step, callId, progress[, total][, message][, task]}`: a running call's
/// progress as its tool reported it (an MCP progress notification; `task`: the id of the
/// server-side task the call became, which a resumed session polls). The numbers must be finite
/// (checked by [`progress::append`](super::progress::append)).
pub fn tool_progress(turn: u64, step: u64, call_id: &str, update: &super::progress::Update<'_>) -> LoopEvent {
    let mut data = step_head(turn, step);
    data.push_str(r#","callId":"#);
    push_str_literal(&mut data, call_id);
    data.push_str(r#","progress":"#);
    push_number(&mut data, update.progress);
    if let Some(total) = update.total {
        data.push_str(r#","total":"#);
        push_number(&mut data, total);
    }
    if let Some(message) = update.message {
        data.push_str(r#","message":"#);
        push_str_literal(&mut data, message);
    }
    if let Some(task) = update.task {
        data.push_str(r#","task":"#);
        push_str_literal(&mut data, task);
    }
    data.push('}');
    LoopEvent::new(TOOL_PROGRESS, data)
}

/// A finite number as JSON: `Display` writes no exponent and no `.0` (`3`, `0.25`), which is
/// JSON; a non-finite one (the caller checks) is `null`.
fn push_number(out: &mut String, n: f64) {
    use std::fmt::Write;
    if n.is_finite() {
        let _ = write!(out, "{n}");
    } else {
        out.push_str("null");
    }
}

// ---- readers ---------------------------------------------------------------------------------

/// The `turn` field of a `turn/*` or `step/*` payload.
pub fn turn_of(data: &Value) -> Option<u64> {
    data.get("turn").and_then(Value::as_u64)
}

/// The `continues` field of a `turn/start` payload: the interrupted turn a continuation answers.
pub fn continues_of(data: &Value) -> Option<u64> {
    data.get("continues").and_then(Value::as_u64)
}

/// Whether an `assistant/message` payload was cut short (`interrupted: true`).
pub fn cut_short(data: &Value) -> bool {
    data.get("interrupted").and_then(Value::as_bool).unwrap_or(false)
}

/// The `instructions` of an `agent/instructions` payload (`None`: none, or not a str).
pub fn instructions_of(data: &Value) -> Option<String> {
    data.get("instructions").and_then(Value::as_str).map(str::to_owned)
}

/// The `step` field of a `step/*` payload.
pub fn step_of(data: &Value) -> Option<u64> {
    data.get("step").and_then(Value::as_u64)
}

/// `reason.kind` of a `turn/end` payload (`None`: missing, or not a kind the loop writes).
pub fn end_kind(data: &Value) -> Option<EndKind> {
    data.pointer("/reason/kind").and_then(Value::as_str).and_then(EndKind::parse)
}

/// The tool calls an `assistant/message` payload requests: (id, name) in order.
pub fn requested_calls(data: &Value) -> Vec<(String, String)> {
    let blocks = data.pointer("/message/content").and_then(Value::as_array);
    let field = |block: &Value, key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    blocks
        .into_iter()
        .flatten()
        .filter(|block| BlockType::of(block) == BlockType::ToolCall)
        .map(|block| (field(block, "id"), field(block, "name")))
        .collect()
}

/// The call id a `tool/call` payload starts.
pub fn call_id(data: &Value) -> Option<&str> {
    data.get("callId").and_then(Value::as_str)
}

/// A `tool/call`'s effect class and in-doubt policy (absent: `write`, `fail`; unknown words
/// read as the defaults, which fail closed).
pub fn call_policy(data: &Value) -> (SideEffect, InDoubt) {
    let word = |key: &str| data.get(key).and_then(Value::as_str);
    (word("effect").and_then(SideEffect::parse).unwrap_or_default(), word("onInDoubt").and_then(InDoubt::parse).unwrap_or_default())
}

/// The call id a `tool/result` payload answers.
pub fn result_call_id(data: &Value) -> Option<&str> {
    data.pointer("/message/source/callId").and_then(Value::as_str)
}
