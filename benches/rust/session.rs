//! Realistic sessions for the benchmarks, built through the public API so every splice is one
//! the inbox really logs and the file bytes are checked by the real reader.
//!
//! One turn is what the agent loop logs for a prompt that needs a tool and gets a steering
//! message: the prompt splice and its claim, two steps of streamed chunks, a tool call with a
//! ~6 kB result, the steering splice and its claim, the step and turn boundaries (29 events,
//! ~21 kB serialised). The shapes follow `benches/python/gen_log.py`, so the Python and Rust
//! figures describe the same records.

use std::sync::Arc;

use kerman::event_log::Surface;
use kerman::message::new_id;
use kerman::{Event, Inbox, MemoryStore, Message, SessionLog, Store, Target};
use serde_json::{json, Map, Value};

/// English-ish words plus what makes JSON text expensive: quotes, tabs, non-ASCII.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "with", "on", "session", "log", "inbox", "turn", "step", "model", "tool", "claim",
    "durable", "append", "writer", "prompt", "context", "result", "reply", "stream", "chunk", "résumé", "naïve", "\"quoted\"", "tab\there",
    "src/event_log/file/format.rs", "{json: [1, 2]}", "42", "3.14",
];

/// Deterministic text of exactly `len` bytes (cut at a char boundary), about one line per
/// dozen words.
pub fn text(len: usize, seed: u64) -> String {
    let mut out = String::with_capacity(len + 32);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        // xorshift64: cheap, and the same text on every run.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(WORDS[usize::try_from(x % WORDS.len() as u64).expect("below the word count")]);
        out.push(if x.is_multiple_of(13) { '\n' } else { ' ' });
    }
    let mut end = len;
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    out.truncate(end);
    out
}

/// A user message holding one text block, with a fresh UUIDv7 id as the loop mints them.
pub fn user_message(len: usize, seed: u64) -> Arc<Message> {
    let content = vec![json!({"type": "text", "text": text(len, seed)})];
    Arc::new(Message::user(content, None, None).expect("a text block is a valid user message"))
}

/// A session log being filled turn by turn, with its inbox (which logs the splices).
pub struct Builder {
    pub log: SessionLog,
    inbox: Inbox,
    turns: u64,
}

impl Builder {
    pub fn new() -> Self {
        let log = MemoryStore::new().create(None).expect("a new memory session");
        let inbox = Inbox::new(log.clone(), None).expect("an empty log replays");
        Builder { log, inbox, turns: 0 }
    }

    /// A session of at least `events` events, in whole turns.
    pub fn with_events(events: u64) -> Self {
        let mut b = Builder::new();
        while b.log.len() < events {
            b.turn();
        }
        b
    }

    /// A session whose file ([`file_bytes`]) is at least `bytes` long, in whole turns.
    pub fn with_file_size(bytes: usize) -> Self {
        let mut b = Builder::new();
        let mut size = 0;
        while size < bytes {
            let first = b.log.len();
            b.turn();
            size += b.log.range(first, None).iter().map(|e| e.to_json().len() + 10).sum::<usize>();
        }
        b
    }

    pub fn events(&self) -> Vec<Event> {
        self.log.range(0, None)
    }

    fn event(&self, kind: &str, data: &Value, surface: Option<Surface>) -> u64 {
        self.log.append_loop_event(kind, data, surface).expect("a loop event appends").seq
    }

    /// Streams `body` as six text deltas; returns their seqs (the message cites them).
    fn chunks(&self, turn: u64, step: u64, body: &str) -> Vec<u64> {
        let cut: Vec<usize> = (0..=6).map(|i| floor_boundary(body, body.len() * i / 6)).collect();
        cut.windows(2)
            .map(|w| {
                let delta = json!({"type": "text-delta", "text": &body[w[0]..w[1]]});
                self.event("assistant/chunk", &json!({"turn": turn, "step": step, "chunk": delta}), None)
            })
            .collect()
    }

    /// Appends one turn (29 events).
    pub fn turn(&mut self) {
        self.turns += 1;
        let (turn, seed) = (self.turns, self.turns * 8);
        let prompt = user_message(1200, seed);
        let steer = user_message(300, seed + 1);
        self.inbox.append(Target::NextTurn, Arc::clone(&prompt)).expect("prompt queued");
        self.event("turn/start", &json!({"turn": turn}), None);
        self.inbox.claim(Target::NextTurn, turn).expect("prompt claimed");

        self.event("step/start", &json!({"turn": turn, "step": 1}), None);
        self.event("user/message", &prompt.to_value(), Some(Surface::append()));
        let answer = text(1500, seed + 2);
        let call_id = new_id();
        let args = r#"{"path":"src/event_log/file/format.rs","start":100,"end":180}"#;
        let call = json!({"type": "tool-call", "id": call_id, "name": "read_file", "arguments": args});
        let mut cited = self.chunks(turn, 1, &answer);
        cited.push(self.event("assistant/chunk", &json!({"turn": turn, "step": 1, "chunk": call}), None));
        let reply = model_message(vec![json!({"type": "text", "text": answer}), call]);
        let data = json!({"turn": turn, "step": 1, "message": reply, "usage": {"inputTokens": 5210, "outputTokens": 412}});
        self.event("assistant/message", &data, Some(Surface::append_citing(cited)));
        let data = json!({"turn": turn, "step": 1, "callId": call_id, "name": "read_file", "arguments": args});
        let call_seq = self.event("tool/call", &data, None);
        let output = vec![json!({"type": "text", "text": text(6000, seed + 3)})];
        let result = Message::tool_result(&call_id, output, false, None).expect("a valid tool result");
        let data = json!({"turn": turn, "step": 1, "message": result.to_value()});
        self.event("tool/result", &data, Some(Surface::append_citing(vec![call_seq])));
        self.inbox.append(Target::NextStep, Arc::clone(&steer)).expect("steering queued");
        self.event("step/end", &json!({"turn": turn, "step": 1}), None);

        self.inbox.claim(Target::NextStep, turn).expect("steering claimed");
        self.event("step/start", &json!({"turn": turn, "step": 2}), None);
        self.event("user/message", &steer.to_value(), Some(Surface::append()));
        let answer = text(1800, seed + 4);
        let cited = self.chunks(turn, 2, &answer);
        let reply = model_message(vec![json!({"type": "text", "text": answer})]);
        let data = json!({"turn": turn, "step": 2, "message": reply, "usage": {"inputTokens": 7730, "outputTokens": 505}});
        self.event("assistant/message", &data, Some(Surface::append_citing(cited)));
        self.event("step/end", &json!({"turn": turn, "step": 2}), None);
        self.event("turn/end", &json!({"turn": turn, "reason": {"kind": "completed"}}), None);
    }
}

fn model_message(content: Vec<Value>) -> Value {
    Message::assistant(content, None, None).expect("a valid assistant message").to_value()
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One framed record as `docs/format.md` writes it, without the newline.
pub fn frame(json: &str) -> String {
    format!("{:08x} {json}", crc32c::crc32c(json.as_bytes()))
}

/// The session file of `log`: the header line (`type` first), then one line per event.
pub fn file_bytes(log: &SessionLog) -> Vec<u8> {
    let mut header = Map::new();
    header.insert("type".into(), Value::from("session"));
    header.extend(log.header().clone());
    let mut out = frame(&Value::Object(header).to_string());
    out.push('\n');
    for event in log.range(0, None) {
        out.push_str(&frame(&event.to_json()));
        out.push('\n');
    }
    out.into_bytes()
}
