//! The model requests of a log, grouped as the usage ledger groups them (`kerman.usage`'s
//! `Fold`, docs/usage.md "What is counted"): one request per `assistant/message` (with the
//! chunks it cites), one per failed attempt (chunks that got no message: settled by a failed
//! `finish`, a usage chunk marked partial, a message citing later chunks, or a settling event:
//! `step/*`, `turn/*`, `request/header`, `tool/call`, `user/message`), and one per
//! `context/compacted` that asked a model. Times: a request starts at the last event before its
//! first chunk that is not a chunk (or, unstreamed, the last event before its message) and ends
//! at its message (or last chunk).

use std::sync::Arc;

use crate::agent_loop::events as kinds;
use crate::event_log::Event;

use super::read;

/// The event types the folds tell apart, named once per event: one match on the type's text
/// rather than a comparison per test (a fold tests each event's type a dozen times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Type {
    TurnStart,
    TurnEnd,
    StepStart,
    StepEnd,
    UserMessage,
    RequestHeader,
    AssistantChunk,
    AssistantMessage,
    ToolCall,
    ToolResult,
    ContextCompacted,
    Other,
}

impl Type {
    pub(super) fn of(kind: &str) -> Type {
        match kind {
            kinds::TURN_START => Type::TurnStart,
            kinds::TURN_END => Type::TurnEnd,
            kinds::STEP_START => Type::StepStart,
            kinds::STEP_END => Type::StepEnd,
            kinds::USER_MESSAGE => Type::UserMessage,
            kinds::REQUEST_HEADER => Type::RequestHeader,
            kinds::ASSISTANT_CHUNK => Type::AssistantChunk,
            kinds::ASSISTANT_MESSAGE => Type::AssistantMessage,
            kinds::TOOL_CALL => Type::ToolCall,
            kinds::TOOL_RESULT => Type::ToolResult,
            kinds::CONTEXT_COMPACTED => Type::ContextCompacted,
            _ => Type::Other,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    MaxTokens,
    /// The turn was aborted mid-stream: the message is what was visible.
    Interrupted,
    /// No message: the request failed, was retried, or the process stopped during it.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::MaxTokens => "max-tokens",
            Outcome::Interrupted => "interrupted",
            Outcome::Failed => "failed",
        }
    }
}

/// A request's usage as logged: the counts (positive integers, else 0), and the model and
/// provider the provider logged with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub input: i64,
    pub cache_read: i64,
    pub cache_write: i64,
    pub output: i64,
    pub reasoning: i64,
    pub model: Option<String>,
    pub provider: Option<String>,
    pub partial: bool,
}

fn count(raw: Option<read::Raw<'_>>) -> i64 {
    read::int(raw).filter(|n| *n > 0).unwrap_or(0)
}

impl Usage {
    /// Sets every field `fields` holds (a later usage chunk overrides an earlier one's keys).
    fn merge(&mut self, fields: &read::UsageFields<'_>) {
        if fields.input.is_some() {
            self.input = count(fields.input);
        }
        if fields.cache_read.is_some() {
            self.cache_read = count(fields.cache_read);
        }
        if fields.cache_write.is_some() {
            self.cache_write = count(fields.cache_write);
        }
        if fields.output.is_some() {
            self.output = count(fields.output);
        }
        if fields.reasoning.is_some() {
            self.reasoning = count(fields.reasoning);
        }
        if fields.model.is_some() {
            self.model = read::string(fields.model);
        }
        if fields.provider.is_some() {
            self.provider = read::string(fields.provider);
        }
        if fields.partial.is_some() {
            self.partial = read::is_true(fields.partial);
        }
    }

    fn of(raw: Option<read::Raw<'_>>) -> Option<Usage> {
        let fields: read::UsageFields<'_> = read::field(raw)?;
        let mut usage = Usage::default();
        usage.merge(&fields);
        Some(usage)
    }

    /// The whole prompt (`input + cacheRead + cacheWrite` of the ledger's split, where `input`
    /// excludes the cached tokens): what `gen_ai.usage.input_tokens` reports.
    pub fn prompt(&self) -> i64 {
        (self.input - self.cache_read - self.cache_write).max(0) + self.cache_read + self.cache_write
    }
}

/// The model and provider a failed `finish` named (a `Fallback` names each model it tried).
type Named = (Option<Arc<str>>, Option<Arc<str>>);

/// One model request as the log shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub turn: i64,
    pub step: i64,
    /// The seq of its first event (its first chunk, or its message): its span's id.
    pub first_seq: u64,
    pub outcome: Outcome,
    pub usage: Option<Usage>,
    pub partial: bool,
    pub started: i64,
    pub ended: i64,
    pub model: Option<Arc<str>>,
    pub provider: Option<Arc<str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkKind {
    Usage,
    Finish { max_tokens: bool },
    Other,
}

#[derive(Debug, Clone)]
struct Chunk {
    seq: u64,
    time: i64,
    kind: ChunkKind,
    /// The event, read again for its usage when the request settles.
    event: Event,
}

/// The request fold, one event at a time; finished requests are pushed to `out`.
#[derive(Debug, Default)]
pub struct Requests {
    /// Names what served requests whose model and provider the log does not record.
    pub model: Option<Arc<str>>,
    pub provider: Option<Arc<str>>,
    option_model: Option<Arc<str>>,
    /// The names logged last, shared by the requests that log them again.
    names: Vec<Arc<str>>,
    turn: i64,
    step: i64,
    /// The time of the last event that is not a chunk: a request starts after it.
    last_time: i64,
    chunks: Vec<Chunk>,
    start: i64,
    pub out: Vec<Request>,
}

impl Requests {
    /// A fold whose requests default to `model` and `provider`.
    pub fn new(model: Option<String>, provider: Option<String>) -> Requests {
        Requests { model: model.map(Arc::from), provider: provider.map(Arc::from), ..Requests::default() }
    }

    /// `name` as a shared text (the same one for every request that logs it).
    fn shared(&mut self, name: &str) -> Arc<str> {
        if let Some(known) = self.names.iter().find(|n| &***n == name) {
            return Arc::clone(known);
        }
        let name: Arc<str> = Arc::from(name);
        if self.names.len() < 16 {
            self.names.push(Arc::clone(&name));
        }
        name
    }

    /// The turn of the last `turn/start` or `step/start` folded (0 when it names none).
    pub fn turn(&self) -> i64 {
        self.turn
    }

    /// Folds one event.
    pub fn add(&mut self, event: &Event) {
        self.add_typed(event, Type::of(event.kind()));
    }

    /// Folds one event of type `kind` (`Type::of` its type).
    pub(super) fn add_typed(&mut self, event: &Event, kind: Type) {
        if kind == Type::AssistantChunk {
            self.chunk(event);
            return;
        }
        if kind == Type::AssistantMessage {
            self.message(event);
        } else {
            let settling = matches!(
                kind,
                Type::StepEnd
                    | Type::TurnEnd
                    | Type::StepStart
                    | Type::TurnStart
                    | Type::RequestHeader
                    | Type::ToolCall
                    | Type::UserMessage
            );
            if settling {
                if let Some(last) = self.chunks.last() {
                    self.settle(last.time);
                }
            }
            match kind {
                Type::TurnStart => {
                    let head: read::Head<'_> = read::object(event.data_json()).unwrap_or_default();
                    (self.turn, self.step) = (read::int(head.turn).unwrap_or(0), 0);
                }
                Type::StepStart => {
                    let head: read::Head<'_> = read::object(event.data_json()).unwrap_or_default();
                    (self.turn, self.step) = (read::int(head.turn).unwrap_or(0), read::int(head.step).unwrap_or(0));
                }
                Type::ContextCompacted => self.compacted(event),
                Type::RequestHeader => {
                    let header: read::Header<'_> = read::object(event.data_json()).unwrap_or_default();
                    let options: Option<read::Options<'_>> = read::field(header.options);
                    self.option_model = options.and_then(|o| read::text(o.model).map(|m| self.shared(&m)));
                }
                _ => {}
            }
        }
        self.last_time = event.time;
    }

    /// Settles the chunks still in flight: the log ended during a request.
    pub fn finish(&mut self) {
        if let Some(last) = self.chunks.last() {
            self.settle(last.time);
        }
    }

    fn chunk(&mut self, event: &Event) {
        if self.chunks.is_empty() {
            self.start = self.last_time;
        }
        let with: read::WithChunk<'_> = read::object(event.data_json()).unwrap_or_default();
        let chunk: read::Chunk<'_> = read::field(with.chunk).unwrap_or_default();
        let (kind, ends) = match read::string(chunk.kind).as_deref() {
            Some("usage") => (ChunkKind::Usage, read::is_true(chunk.partial)),
            Some("finish") => {
                let reason = read::string(chunk.reason);
                let ok = matches!(reason.as_deref(), Some("stop" | "max-tokens"));
                (ChunkKind::Finish { max_tokens: reason.as_deref() == Some("max-tokens") }, !ok)
            }
            _ => (ChunkKind::Other, false),
        };
        self.chunks.push(Chunk { seq: event.seq, time: event.time, kind, event: event.clone() });
        // A failed finish, or usage the provider marked partial, ends an attempt that gets no
        // message: the next chunk belongs to another request (a retry).
        if ends {
            self.settle(event.time);
        }
    }

    fn message(&mut self, event: &Event) {
        let cited: &[u64] = event.surface().and_then(|s| s.source_event_seqs.as_deref()).unwrap_or(&[]);
        let (mine, before): (Vec<Chunk>, Vec<Chunk>) = std::mem::take(&mut self.chunks).into_iter().partition(|c| cited.contains(&c.seq));
        if let Some(last) = before.last() {
            let end = last.time;
            self.chunks = before;
            self.settle(end);
        }
        let start = if mine.is_empty() { self.last_time } else { self.start };
        self.chunks.clear();
        // The core's writer records where the message lies: its fields are read around it.
        let reply: read::Reply<'_> = read::object_skipping(event.data_json(), event.bulk()).unwrap_or_default();
        let usage = Usage::of(reply.usage);
        let interrupted = read::is_true(reply.interrupted);
        let outcome = if interrupted {
            Outcome::Interrupted
        } else {
            let finish = mine.iter().rev().find_map(|c| match c.kind {
                ChunkKind::Finish { max_tokens } => Some(max_tokens),
                _ => None,
            });
            if finish == Some(true) {
                Outcome::MaxTokens
            } else {
                Outcome::Completed
            }
        };
        let partial = interrupted || usage.as_ref().is_some_and(|u| u.partial);
        let first_seq = mine.first().map_or(event.seq, |c| c.seq);
        let (turn, step) = (read::int(reply.turn).unwrap_or(0), read::int(reply.step).unwrap_or(0));
        self.record(turn, step, first_seq, outcome, usage, partial, start, event.time, (None, None));
        self.last_time = event.time;
    }

    /// A compaction that asked a model (an LLM summary) is a request, in the turn it was made
    /// in (or the last one, between turns).
    fn compacted(&mut self, event: &Event) {
        let data: read::Compacted<'_> = read::object(event.data_json()).unwrap_or_default();
        let usage = Usage::of(data.usage);
        let model = read::text(data.model).map(|m| self.shared(&m));
        if usage.is_none() && model.is_none() {
            return; // no model asked: nothing to count
        }
        let turn = read::int(data.turn);
        let step = if turn.is_some() { self.step } else { 0 };
        let option_model = std::mem::replace(&mut self.option_model, model);
        self.record(turn.unwrap_or(self.turn), step, event.seq, Outcome::Completed, usage, false, event.time, event.time, (None, None));
        self.option_model = option_model;
    }

    /// The chunks in flight are one request that got no message: a failed attempt, or, ended by
    /// the loop's `cancelled` finish, one a cancellation cut before anything visible was logged
    /// (interrupted). A failed finish naming a `model` (a `Fallback` names each model it tried)
    /// says what served it, unless its usage names one.
    fn settle(&mut self, end: i64) {
        let chunks = std::mem::take(&mut self.chunks);
        let mut usage: Option<Usage> = None;
        let mut outcome = Outcome::Failed;
        let mut named: Named = (None, None);
        for chunk in chunks.iter().filter(|c| c.kind != ChunkKind::Other) {
            let with: read::WithChunk<'_> = read::object(chunk.event.data_json()).unwrap_or_default();
            if chunk.kind == ChunkKind::Usage {
                let fields: read::UsageFields<'_> = read::field(with.chunk).unwrap_or_default();
                usage.get_or_insert_with(Usage::default).merge(&fields);
                continue;
            }
            let finish: read::Chunk<'_> = read::field(with.chunk).unwrap_or_default();
            if let Some(model) = read::text(finish.model).filter(|m| !m.is_empty()) {
                let provider = read::text(finish.provider).filter(|p| !p.is_empty());
                named = (Some(self.shared(&model)), provider.map(|p| self.shared(&p)));
            }
            let cancelled = read::text(finish.reason).as_deref() == Some("cancelled");
            outcome = if cancelled { Outcome::Interrupted } else { Outcome::Failed };
        }
        let start = std::mem::replace(&mut self.start, end);
        self.last_time = end;
        let partial = usage.is_some();
        let first_seq = chunks.first().map_or(0, |c| c.seq);
        self.record(self.turn, self.step, first_seq, outcome, usage, partial, start, end, named);
    }

    #[allow(clippy::too_many_arguments)] // one request's fields, as the ledger's `_record` takes them
    fn record(
        &mut self,
        turn: i64,
        step: i64,
        first_seq: u64,
        outcome: Outcome,
        usage: Option<Usage>,
        partial: bool,
        started: i64,
        ended: i64,
        named: Named,
    ) {
        // Which model answered: what the provider logged with the usage, else the model a failed
        // finish named, else the request's `model` option, else the default.
        let logged = usage.as_ref().and_then(|u| u.model.as_deref()).filter(|m| !m.is_empty()).map(|m| self.shared(m));
        let model = logged.or(named.0).or_else(|| self.option_model.clone().filter(|m| !m.is_empty())).or_else(|| self.model.clone());
        let vendor = usage.as_ref().and_then(|u| u.provider.as_deref()).filter(|p| !p.is_empty()).map(|p| self.shared(p));
        let provider = vendor.or(named.1).or_else(|| self.provider.clone());
        self.out.push(Request { turn, step, first_seq, outcome, usage, partial, started, ended, model, provider });
    }
}
