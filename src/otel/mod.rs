//! OpenTelemetry spans derived from a session's log in the core, encoded as OTLP
//! (docs/tracing.md, "The native exporter"): the same spans, attributes and ids as
//! `kerman.otel`'s Python builder over the SDK, made with no Python object per event or span.
//!
//! [`SpanFold`] folds events into finished [`Span`]s (`spans.rs`; its model requests grouped
//! as the usage ledger groups them, `requests.rs`); [`encode::protobuf`] and [`encode::json`]
//! write them as an OTLP `ExportTraceServiceRequest` (OTLP/HTTP's binary body, and OTLP/JSON).
//! It reads the log only: storage and the loop know nothing of it.

use std::sync::Arc;

#[cfg(test)]
mod bulk_tests;
pub mod encode;
mod ids;
mod read;
mod requests;
mod scan;
mod spans;
#[cfg(test)]
mod tests;

pub use ids::{span_id, trace_id};
pub use requests::{Outcome, Request, Requests, Usage};
pub use spans::{Options, SpanFold};

/// An attribute value (OTLP's `AnyValue`, the kinds spans and resources use). The string
/// kinds differ only in who owns the text: the fold makes no allocation for a constant or for
/// a text many spans share (the session id, a model's name).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Static(&'static str),
    Shared(Arc<str>),
    Bool(bool),
    Int(i64),
    Double(f64),
    Array(Vec<Value>),
    /// An array of constant strings.
    Strs(&'static [&'static str]),
}

impl Value {
    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(text) => Some(text),
            Value::Static(text) => Some(text),
            Value::Shared(text) => Some(text),
            _ => None,
        }
    }
}

impl From<&'static str> for Value {
    fn from(text: &'static str) -> Value {
        Value::Static(text)
    }
}

/// A span's kind (OTLP's `SpanKind` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Client = 3,
}

/// A span's status: unset, or an error with its description.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Status {
    pub error: bool,
    pub message: String,
}

impl Status {
    pub fn error(message: String) -> Status {
        Status { error: true, message }
    }
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: Arc<str>,
    pub kind: Kind,
    /// Epoch nanoseconds (the log's milliseconds).
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<(&'static str, Value)>,
    pub status: Status,
}

/// Who made the spans: the resource's attributes (`service.name`, ...) and the instrumentation
/// scope (`kerman.otel` and Kerman's version).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resource {
    pub attributes: Vec<(String, Value)>,
    pub scope_name: String,
    pub scope_version: String,
}
