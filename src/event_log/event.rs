//! The event envelope: `{type, seq, time, data, sourceEventSeqs?, surfaceOp?}`.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::json;

/// Types whose events carry a message into the derived history and so need `surfaceOp`.
pub const SURFACE_TYPES: [&str; 3] = ["user/message", "assistant/message", "tool/result"];

/// The durable inbox event type.
pub const SPLICED: &str = "agent/inbox/spliced";
/// The agent's configured instructions (system prompt), logged when they change.
pub const INSTRUCTIONS: &str = "agent/instructions";

/// True for types only the Inbox and the AgentLoop may append (SPEC 4.7).
pub fn is_reserved_type(kind: &str) -> bool {
    kind.starts_with("turn/")
        || kind.starts_with("step/")
        || kind.starts_with("assistant/")
        || kind.starts_with("tool/")
        || kind == "user/message"
        || kind == "request/header"
        || kind == SPLICED
        || kind == INSTRUCTIONS
        || kind.starts_with("decision/")
        || kind.starts_with("output/")
        || kind.starts_with("context/")
}

pub fn is_surface_type(kind: &str) -> bool {
    SURFACE_TYPES.contains(&kind)
}

/// How a surface event changes the derived history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SurfaceOp {
    Append,
    Replace { start: u64, end: u64 },
}

/// Surface metadata, present only on surface types.
#[derive(Clone, Debug)]
pub struct Surface {
    pub op: SurfaceOp,
    pub source_event_seqs: Option<Vec<u64>>,
    /// Where the event's bulky value lies in its data, as its writer knew it (see [`Bulk`]).
    /// Kept here, beside the op, because only surface events carry a message: no `Event`
    /// grows for it.
    pub bulk: Bulk,
}

/// Equal surfaces say the same about the history: `bulk` is a reader's hint, not the record's.
impl PartialEq for Surface {
    fn eq(&self, other: &Surface) -> bool {
        self.op == other.op && self.source_event_seqs == other.source_event_seqs
    }
}

impl Eq for Surface {}

impl Surface {
    pub fn append() -> Self {
        Surface { op: SurfaceOp::Append, source_event_seqs: None, bulk: Bulk::NONE }
    }

    pub fn append_citing(seqs: Vec<u64>) -> Self {
        Surface { op: SurfaceOp::Append, source_event_seqs: Some(seqs), bulk: Bulk::NONE }
    }
}

/// The byte range of an event's data that holds its bulky value (a surface event's message),
/// recorded by the writer that built the text so that a reader that needs the fields around
/// it can jump over it rather than walk it. Known only in memory, for events this process
/// appended: it is not part of the record, so an event read back from storage has none and
/// its readers walk the text. A hint, not a promise: a reader checks it against the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bulk {
    start: u32,
    end: u32,
}

impl Bulk {
    /// Unknown.
    pub const NONE: Bulk = Bulk { start: 0, end: 0 };

    /// The range `start..end` of the data (unknown when empty or beyond 4 GiB).
    pub fn new(start: usize, end: usize) -> Bulk {
        match (u32::try_from(start), u32::try_from(end)) {
            (Ok(start), Ok(end)) if start < end => Bulk { start, end },
            _ => Bulk::NONE,
        }
    }

    /// The range, if known.
    pub fn range(self) -> Option<std::ops::Range<usize>> {
        (self.start < self.end).then_some(self.start as usize..self.end as usize)
    }
}

/// One committed log entry. Cheap to clone: the type and the data text are shared.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub seq: u64,
    /// Epoch milliseconds; non-decreasing within a log.
    pub time: i64,
    kind: Arc<str>,
    /// Compact JSON text of the payload; decoded only when asked.
    data: Arc<str>,
    surface: Option<Arc<Surface>>,
}

impl Event {
    /// Builds an event. `data` must be valid JSON text (callers produce it from a `Value` or
    /// from the lossless-JSON conversion of the binding).
    pub(crate) fn new(seq: u64, time: i64, kind: Arc<str>, data: Arc<str>, surface: Option<Surface>) -> Self {
        Event { seq, time, kind, data, surface: surface.map(Arc::new) }
    }

    /// The same event with `kind` (an equal type name, interned by the log that keeps it):
    /// the data text and surface are moved, not copied.
    pub(crate) fn with_kind(self, kind: Arc<str>) -> Self {
        debug_assert_eq!(&*kind, &*self.kind);
        Event { kind, ..self }
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The payload as JSON text.
    pub fn data_json(&self) -> &str {
        &self.data
    }

    /// The payload decoded.
    pub fn data(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }

    pub fn surface(&self) -> Option<&Surface> {
        self.surface.as_deref()
    }

    /// The byte range of the data its writer recorded as bulky ([`Bulk`]): `None` when unknown.
    pub fn bulk(&self) -> Option<std::ops::Range<usize>> {
        self.surface.as_ref().and_then(|s| s.bulk.range())
    }

    /// The record as compact JSON, keys in the reference's order.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.data.len() + self.kind.len() + 48);
        out.push_str("{\"type\":");
        json::push_str_literal(&mut out, &self.kind);
        out.push_str(",\"seq\":");
        json::push_u64(&mut out, self.seq);
        out.push_str(",\"time\":");
        out.push_str(itoa::Buffer::new().format(self.time));
        out.push_str(",\"data\":");
        out.push_str(&self.data);
        if let Some(surface) = &self.surface {
            if let Some(seqs) = &surface.source_event_seqs {
                out.push_str(",\"sourceEventSeqs\":");
                out.push_str(&serde_json::to_string(seqs).unwrap_or_default());
            }
            match surface.op {
                SurfaceOp::Append => out.push_str(",\"surfaceOp\":\"append\""),
                SurfaceOp::Replace { start, end } => {
                    let _ = write!(out, ",\"surfaceOp\":{{\"op\":\"replace\",\"start\":{start},\"end\":{end}}}");
                }
            }
        }
        out.push('}');
        out
    }

    /// Parses one record, checking the envelope rules. `intern` shares type strings.
    pub fn from_json(text: &str, intern: &mut dyn FnMut(&str) -> Arc<str>) -> Result<Event, String> {
        let raw: RawEnvelope<'_> = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let kind: &str = &raw.kind;
        if kind.is_empty() {
            return Err("empty event type".into());
        }
        if raw.ignorable == Some(false) {
            return Err("\"ignorable\" may only be true".into());
        }
        let surface = match (is_surface_type(kind), raw.surface_op) {
            (true, Some(op)) => Some(Surface { op: op.into_op()?, source_event_seqs: raw.source_event_seqs, bulk: Bulk::NONE }),
            (true, None) => return Err(format!("surface event \"{kind}\" lacks surfaceOp")),
            (false, Some(_)) => return Err(format!("event \"{kind}\" must not carry surfaceOp")),
            (false, None) if raw.source_event_seqs.is_some() => return Err(format!("event \"{kind}\" must not carry sourceEventSeqs")),
            (false, None) => None,
        };
        if let Some(seqs) = surface.as_ref().and_then(|s| s.source_event_seqs.as_ref()) {
            if seqs.iter().any(|&s| s >= raw.seq) {
                return Err(format!("sourceEventSeqs of seq {} cite a later event", raw.seq));
            }
        }
        Ok(Event::new(raw.seq, raw.time, intern(kind), Arc::from(raw.data.get()), surface))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvelope<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    seq: u64,
    time: i64,
    #[serde(borrow)]
    data: &'a RawValue,
    #[serde(rename = "sourceEventSeqs", default)]
    source_event_seqs: Option<Vec<u64>>,
    #[serde(rename = "surfaceOp", default)]
    surface_op: Option<WireSurfaceOp>,
    #[serde(default)]
    ignorable: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum WireSurfaceOp {
    Name(String),
    Replace { op: String, start: u64, end: u64 },
}

impl WireSurfaceOp {
    fn into_op(self) -> Result<SurfaceOp, String> {
        match self {
            WireSurfaceOp::Name(name) if name == "append" => Ok(SurfaceOp::Append),
            WireSurfaceOp::Replace { op, start, end } if op == "replace" && start <= end => Ok(SurfaceOp::Replace { start, end }),
            _ => Err("invalid surfaceOp".into()),
        }
    }
}

/// The ids a logged splice payload inserts, read without building the messages (for the
/// staged-input checks of the PostgreSQL store and the inbox); empty if the payload does not parse.
pub fn inserted_ids(data: &str) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Payload {
        #[serde(default)]
        inserted: Vec<Inserted>,
    }
    #[derive(serde::Deserialize)]
    struct Inserted {
        id: String,
    }
    serde_json::from_str::<Payload>(data).map(|p| p.inserted.into_iter().map(|m| m.id).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intern(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn record_round_trips() {
        let ev = Event::new(3, 10, intern("tool/result"), Arc::from("{\"a\":1}"), Some(Surface::append_citing(vec![1])));
        let text = ev.to_json();
        assert_eq!(text, r#"{"type":"tool/result","seq":3,"time":10,"data":{"a":1},"sourceEventSeqs":[1],"surfaceOp":"append"}"#);
        assert_eq!(Event::from_json(&text, &mut intern).unwrap(), ev);
    }

    #[test]
    fn envelope_rules_are_checked() {
        let bad = [
            r#"{"type":"user/message","seq":0,"time":1,"data":{}}"#,
            r#"{"type":"goal/change","seq":0,"time":1,"data":{},"surfaceOp":"append"}"#,
            r#"{"type":"goal/change","seq":0,"time":1,"data":{},"extra":1}"#,
            r#"{"type":"","seq":0,"time":1,"data":{}}"#,
            r#"{"type":"tool/result","seq":1,"time":1,"data":{},"sourceEventSeqs":[1],"surfaceOp":"append"}"#,
        ];
        for text in bad {
            assert!(Event::from_json(text, &mut intern).is_err(), "{text}");
        }
    }

    #[test]
    fn reserved_types() {
        assert!(is_reserved_type("turn/start"));
        assert!(is_reserved_type("agent/inbox/spliced"));
        assert!(is_reserved_type("request/header"));
        assert!(is_reserved_type("output/validated"));
        assert!(!is_reserved_type("goal/change"));
        assert!(!is_reserved_type("request/context"));
    }
}
