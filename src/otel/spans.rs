//! The span fold: a session's events in, finished spans out, as `kerman.otel`'s Python
//! `SpanBuilder` makes them (docs/tracing.md): `invoke_agent` per turn, `chat` per model
//! request (`requests.rs`), `execute_tool` per call, each made when the log shows it ended,
//! with the log's times and ids derived from the session and seqs (`ids.rs`).

use std::sync::Arc;

use crate::event_log::Event;

use super::requests::{Outcome, Request, Requests, Type};
use super::{ids, read, Kind, Span, Status, Value};

/// Turn endings that mean the work failed.
const FAILED_ENDINGS: [&str; 2] = ["error", "interrupted"];

/// What the spans say about the agent that the log does not record.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `gen_ai.conversation.id` and the seed of every id.
    pub session: String,
    /// `gen_ai.agent.name` (and the `invoke_agent` span's name).
    pub agent_name: String,
    /// What served requests whose model (provider) the log does not record.
    pub model: Option<String>,
    pub provider: Option<String>,
    /// The latest experimental semantic conventions (`gen_ai.provider.name`, cache tokens)
    /// instead of those of v1.36.0 (`gen_ai.system`).
    pub latest: bool,
}

#[derive(Debug, Clone, Copy)]
struct Turn {
    number: i64,
    time: i64,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
}

#[derive(Debug, Clone)]
struct Call {
    id: String,
    seq: u64,
    time: i64,
    /// The tool's name and its span's name.
    name: (Arc<str>, Arc<str>),
    turn: i64,
}

/// The attributes a span has at most (a `chat` span with every usage count and an error).
const ATTRIBUTES: usize = 12;
/// Attribute vectors kept for reuse: about a batch's spans. What is kept is at most what the
/// last batch's spans held (each vector 12 attributes, 576 bytes), so at most about 590 KB.
const SPARE: usize = 1024;

/// Turn endings as constants (others are copied).
const ENDINGS: [&str; 8] = ["completed", "max-tokens", "blocked", "error", "aborted", "interrupted", "budget", "unknown"];

/// The fold. Feed it events in log order (`add`); take the spans they ended from `spans`.
#[derive(Debug)]
pub struct SpanFold {
    options: Options,
    session: Arc<str>,
    /// The key every id is derived from (one hash per session).
    key: ids::Key,
    agent_name: Arc<str>,
    /// `invoke_agent {agent_name}`.
    agent_span: Arc<str>,
    /// `chat {model}` and `execute_tool {tool}` per model and tool seen (a few).
    chat_names: Vec<(Arc<str>, Arc<str>)>,
    tool_names: Vec<(Arc<str>, Arc<str>)>,
    requests: Requests,
    /// Open turns (one, unless a log interleaves them).
    turns: Vec<Turn>,
    /// Started calls without their result.
    calls: Vec<Call>,
    /// An interrupted turn the next turn continues.
    continues: Option<Turn>,
    /// The next seq to fold (the events before it are folded).
    pub position: u64,
    /// Finished spans not yet taken.
    pub spans: Vec<Span>,
    /// The attribute vectors of spans taken (`clear_spans`), emptied, for the next spans: a
    /// span's attributes take no allocation of their own once a batch has gone.
    spare: Vec<Vec<(&'static str, Value)>>,
}

fn ns(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

impl SpanFold {
    pub fn new(options: Options) -> SpanFold {
        let requests = Requests::new(options.model.clone(), options.provider.clone());
        SpanFold {
            session: Arc::from(options.session.as_str()),
            key: ids::Key::new(&options.session),
            agent_name: Arc::from(options.agent_name.as_str()),
            agent_span: Arc::from(format!("invoke_agent {}", options.agent_name)),
            chat_names: Vec::new(),
            tool_names: Vec::new(),
            options,
            requests,
            turns: Vec::new(),
            calls: Vec::new(),
            continues: None,
            position: 0,
            spans: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Drops the finished spans (taken: encoded), keeping their attribute vectors and the
    /// spans' own for the next ones.
    pub fn clear_spans(&mut self) {
        for span in self.spans.drain(..) {
            let mut attributes = span.attributes;
            attributes.clear();
            if self.spare.len() < SPARE {
                self.spare.push(attributes);
            }
        }
    }

    /// Folds one event (the next in the log).
    pub fn add(&mut self, event: &Event) {
        let kind = Type::of(event.kind());
        self.requests.add_typed(event, kind);
        self.chats();
        match kind {
            Type::TurnStart => self.turn_start(event),
            Type::TurnEnd => self.turn_end(event),
            Type::ToolCall => self.tool_call(event),
            Type::ToolResult => self.tool_result(event),
            _ => {}
        }
        self.position = event.seq + 1;
    }

    /// Settles a request the log ended during (after the fact only: live, it may still end).
    pub fn finish(&mut self) {
        self.requests.finish();
        self.chats();
    }

    fn chats(&mut self) {
        if self.requests.out.is_empty() {
            return;
        }
        // Moved out and back (`chat` borrows the fold): the vector keeps its capacity.
        let mut out = std::mem::take(&mut self.requests.out);
        for request in out.drain(..) {
            self.chat(&request);
        }
        self.requests.out = out;
    }

    fn common(&mut self, operation: &'static str) -> Vec<(&'static str, Value)> {
        let mut attributes = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(ATTRIBUTES));
        attributes.push(("gen_ai.operation.name", Value::from(operation)));
        attributes.push(("gen_ai.conversation.id", Value::Shared(Arc::clone(&self.session))));
        attributes
    }

    fn turn(&self, number: i64) -> Option<Turn> {
        self.turns.iter().find(|t| t.number == number).copied()
    }

    fn turn_start(&mut self, event: &Event) {
        // The request fold read the turn's number from this event already.
        let number = self.requests.turn();
        let span_id = self.key.span(event.seq);
        let turn = match self.continues.take() {
            // The turn after one a crash interrupted continues its work: the same trace, under it.
            Some(before) => Turn { number, time: event.time, trace_id: before.trace_id, span_id, parent: Some(before.span_id) },
            None => Turn { number, time: event.time, trace_id: self.key.trace(event.seq), span_id, parent: None },
        };
        self.turns.retain(|t| t.number != number);
        self.turns.push(turn);
    }

    fn turn_end(&mut self, event: &Event) {
        let end: read::End<'_> = read::object(event.data_json()).unwrap_or_default();
        let number = read::int(end.turn).unwrap_or(0);
        let Some(at) = self.turns.iter().position(|t| t.number == number) else { return };
        let turn = self.turns.remove(at);
        let reason: read::Reason<'_> = read::field(end.reason).unwrap_or_default();
        let kind = read::text(reason.kind).filter(|k| !k.is_empty()).unwrap_or(std::borrow::Cow::Borrowed("unknown"));
        let kind_value = ENDINGS.iter().find(|k| **k == kind).map_or_else(|| Value::Str(kind.to_string()), |k| Value::Static(k));
        let mut attributes = self.common("invoke_agent");
        attributes.push(("gen_ai.agent.name", Value::Shared(Arc::clone(&self.agent_name))));
        attributes.push(("kerman.turn", Value::Int(turn.number)));
        attributes.push(("kerman.turn.end", kind_value));
        if let Some(model) = self.requests.model.as_ref().filter(|m| !m.is_empty()) {
            attributes.push(("gen_ai.request.model", Value::Shared(Arc::clone(model))));
        }
        let mut status = Status::default();
        if FAILED_ENDINGS.contains(&&*kind) {
            let error: Option<read::Reason<'_>> = read::field(reason.error);
            let code = error.as_ref().and_then(|e| read::string(e.code)).filter(|c| !c.is_empty());
            attributes.push(("error.type", Value::Str(code.unwrap_or_else(|| kind.to_string()))));
            let message = match &error {
                Some(e) => read::string(e.message).unwrap_or_default(),
                None => kind.to_string(),
            };
            status = Status::error(message);
        }
        self.spans.push(Span {
            trace_id: turn.trace_id,
            span_id: turn.span_id,
            parent: turn.parent,
            name: Arc::clone(&self.agent_span),
            kind: Kind::Internal,
            start_ns: ns(turn.time),
            end_ns: ns(event.time),
            attributes,
            status,
        });
        self.continues = (kind == "interrupted").then_some(turn);
    }

    fn chat(&mut self, request: &Request) {
        let Some(turn) = self.turn(request.turn) else { return };
        let latest = self.options.latest;
        let model = request.model.as_ref().filter(|m| !m.is_empty());
        let mut attributes = self.common("chat");
        if let Some(model) = model {
            attributes.push(("gen_ai.request.model", Value::Shared(Arc::clone(model))));
        }
        if let Some(provider) = request.provider.as_ref().filter(|p| !p.is_empty()) {
            attributes.push((if latest { "gen_ai.provider.name" } else { "gen_ai.system" }, Value::Shared(Arc::clone(provider))));
        }
        if let Some(usage) = &request.usage {
            // input_tokens is the whole prompt, cached tokens included, as the conventions count it
            attributes.push(("gen_ai.usage.input_tokens", Value::Int(usage.prompt())));
            attributes.push(("gen_ai.usage.output_tokens", Value::Int(usage.output)));
            if latest {
                attributes.push(("gen_ai.usage.cache_read.input_tokens", Value::Int(usage.cache_read)));
                attributes.push(("gen_ai.usage.cache_creation.input_tokens", Value::Int(usage.cache_write)));
            }
            attributes.push(("kerman.usage.reasoning_tokens", Value::Int(usage.reasoning)));
        }
        attributes.push(("kerman.step", Value::Int(request.step)));
        attributes.push(("kerman.request.outcome", Value::from(request.outcome.as_str())));
        if request.partial {
            attributes.push(("kerman.usage.partial", Value::Bool(true)));
        }
        match request.outcome {
            Outcome::Completed => attributes.push(("gen_ai.response.finish_reasons", Value::Strs(&["stop"]))),
            Outcome::MaxTokens => attributes.push(("gen_ai.response.finish_reasons", Value::Strs(&["length"]))),
            _ => {}
        }
        let name = self.chat_name(model.cloned());
        let mut status = Status::default();
        if matches!(request.outcome, Outcome::Failed | Outcome::Interrupted) {
            attributes.push(("error.type", Value::from(request.outcome.as_str())));
            status = Status::error(format!("the request {}", request.outcome.as_str()));
        }
        self.spans.push(Span {
            trace_id: turn.trace_id,
            span_id: self.key.span(request.first_seq),
            parent: Some(turn.span_id),
            name,
            kind: Kind::Client,
            start_ns: ns(request.started),
            end_ns: ns(request.ended),
            attributes,
            status,
        });
    }

    /// `chat {model}` (`chat` without a model), shared by the spans of one model.
    fn chat_name(&mut self, model: Option<Arc<str>>) -> Arc<str> {
        let key = model.unwrap_or_else(|| Arc::from(""));
        if let Some((_, name)) = self.chat_names.iter().find(|(m, _)| *m == key) {
            return Arc::clone(name);
        }
        let name: Arc<str> = if key.is_empty() { Arc::from("chat") } else { Arc::from(format!("chat {key}")) };
        if self.chat_names.len() < 16 {
            self.chat_names.push((key, Arc::clone(&name)));
        }
        name
    }

    /// A tool's name and its span's name (`execute_tool {tool}`), shared by its calls.
    fn tool_name(&mut self, tool: &str) -> (Arc<str>, Arc<str>) {
        if let Some(known) = self.tool_names.iter().find(|(t, _)| &**t == tool) {
            return known.clone();
        }
        let names: (Arc<str>, Arc<str>) = (Arc::from(tool), Arc::from(format!("execute_tool {tool}")));
        if self.tool_names.len() < 64 {
            self.tool_names.push(names.clone());
        }
        names
    }

    fn tool_call(&mut self, event: &Event) {
        let call: read::Call<'_> = read::object(event.data_json()).unwrap_or_default();
        let id = read::string(call.id).unwrap_or_default();
        let name = self.tool_name(&read::text(call.name).unwrap_or_default());
        let turn = read::int(call.turn).unwrap_or(0);
        self.calls.retain(|c| c.id != id);
        self.calls.push(Call { id, seq: event.seq, time: event.time, name, turn });
    }

    fn tool_result(&mut self, event: &Event) {
        let result = read::tool_result(event.data_json()).unwrap_or_default();
        let block = result.block;
        let mut call_id = block.as_ref().and_then(|b| read::text(b.tool_call_id)).filter(|id| !id.is_empty());
        if call_id.is_none() {
            call_id = result.source.and_then(|s| read::text(s.call_id)).filter(|id| !id.is_empty());
        }
        let call_id = call_id.unwrap_or_default();
        let Some(at) = self.calls.iter().position(|c| *c.id == *call_id) else { return };
        let call = self.calls.remove(at);
        let Some(turn) = self.turn(call.turn) else { return };
        let mut attributes = self.common("execute_tool");
        attributes.push(("gen_ai.tool.name", Value::Shared(Arc::clone(&call.name.0))));
        // The call's id (equal to the result's): its text moves into the span, no copy made.
        attributes.push(("gen_ai.tool.call.id", Value::Str(call.id)));
        attributes.push(("gen_ai.tool.type", Value::from("function")));
        let error: Option<read::Reason<'_>> = read::field(result.error);
        let is_error = block.as_ref().is_some_and(|b| read::truthy(b.is_error)) || read::truthy(result.error);
        let mut status = Status::default();
        if error.is_some() || is_error {
            let code = error.as_ref().and_then(|e| read::string(e.code)).filter(|c| !c.is_empty());
            attributes.push(("error.type", Value::Str(code.unwrap_or_else(|| "tool_error".into()))));
            let message = match &error {
                Some(e) => read::string(e.message).unwrap_or_default(),
                None => block.as_ref().map(|b| read::content_text(b.content)).unwrap_or_default().chars().take(200).collect(),
            };
            status = Status::error(message);
        }
        self.spans.push(Span {
            trace_id: turn.trace_id,
            span_id: self.key.span(call.seq),
            parent: Some(turn.span_id),
            name: call.name.1,
            kind: Kind::Internal,
            start_ns: ns(call.time),
            end_ns: ns(event.time),
            attributes,
            status,
        });
    }
}
