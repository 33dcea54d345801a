//! OTLP `ExportTraceServiceRequest` encoders: protobuf (the OTLP/HTTP default body), written by
//! hand for the few messages spans need, and OTLP/JSON (protobuf's JSON mapping, with trace and
//! span ids in hex as OTLP/JSON requires). Fields are written in field-number order, as
//! protobuf's own serializers write them.
//!
//! The messages (opentelemetry-proto, `trace/v1`, `common/v1`, `resource/v1`):
//! `ExportTraceServiceRequest{resource_spans=1}`, `ResourceSpans{resource=1, scope_spans=2}`,
//! `Resource{attributes=1}`, `ScopeSpans{scope=1, spans=2}`, `InstrumentationScope{name=1,
//! version=2}`, `Span{trace_id=1, span_id=2, parent_span_id=4, name=5, kind=6,
//! start_time_unix_nano=7 (fixed64), end_time_unix_nano=8 (fixed64), attributes=9, status=15,
//! flags=16 (fixed32)}`, `Status{message=2, code=3}`, `KeyValue{key=1, value=2}`,
//! `AnyValue{string_value=1, bool_value=2, int_value=3, double_value=4, array_value=5}`,
//! `ArrayValue{values=1}`.

use std::fmt::Write as _;

use super::{Resource, Span, Value};
use crate::json::push_str_literal;

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: the parent is known not to be remote
/// (every parent here is a span of the same log).
const HAS_IS_REMOTE: u32 = 0x100;
/// `Status.StatusCode.STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        #[allow(clippy::cast_possible_truncation)] // the low seven bits
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)] // below 0x80
    out.push(value as u8);
}

#[inline]
fn tag(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push((field << 3) | wire);
}

#[inline]
fn bytes(out: &mut Vec<u8>, field: u8, value: &[u8]) {
    tag(out, field, LEN);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A string or bytes field of proto3: absent when empty.
fn optional_bytes(out: &mut Vec<u8>, field: u8, value: &[u8]) {
    if !value.is_empty() {
        bytes(out, field, value);
    }
}

/// A nested message of one to a few hundred bytes: see `nested_in`.
fn nested(out: &mut Vec<u8>, field: u8, f: impl FnOnce(&mut Vec<u8>)) {
    nested_in(out, field, 1, f);
}

/// A nested message: its bytes written by `f` after `guess` bytes kept for its length, moved
/// when the length takes another number of bytes (the length is written in as few bytes as it
/// needs, as protobuf's own serializers write it). A good guess saves the move.
fn nested_in(out: &mut Vec<u8>, field: u8, guess: usize, f: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, LEN);
    let at = out.len();
    for _ in 0..guess {
        out.push(0);
    }
    f(out);
    let len = out.len() - at - guess;
    let need = varint_len(len as u64);
    if need != guess {
        if need > guess {
            out.resize(out.len() + need - guess, 0);
        }
        out.copy_within(at + guess..at + guess + len, at + need);
        out.truncate(at + need + len);
    }
    let mut value = len as u64;
    for byte in &mut out[at..at + need - 1] {
        #[allow(clippy::cast_possible_truncation)] // the low seven bits
        {
            *byte = (value as u8) | 0x80;
        }
        value >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)] // below 0x80
    {
        out[at + need - 1] = value as u8;
    }
}

/// The bytes `varint` writes for `value`.
fn varint_len(value: u64) -> usize {
    // one byte per seven bits, at least one
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn any_value(out: &mut Vec<u8>, value: &Value) {
    // A oneof member is written even when it holds its type's default.
    match value {
        Value::Str(_) | Value::Static(_) | Value::Shared(_) => bytes(out, 1, value.as_str().unwrap_or_default().as_bytes()),
        Value::Bool(b) => {
            tag(out, 2, VARINT);
            out.push(u8::from(*b));
        }
        Value::Int(n) => {
            tag(out, 3, VARINT);
            #[allow(clippy::cast_sign_loss)] // int64 is written as its two's complement
            varint(out, *n as u64);
        }
        Value::Double(x) => {
            tag(out, 4, FIXED64);
            out.extend_from_slice(&x.to_le_bytes());
        }
        Value::Array(values) => nested(out, 5, |out| {
            for value in values {
                nested(out, 1, |out| any_value(out, value));
            }
        }),
        Value::Strs(texts) => nested(out, 5, |out| {
            for text in *texts {
                nested(out, 1, |out| bytes(out, 1, text.as_bytes()));
            }
        }),
    }
}

/// The bytes `any_value` writes for a value of a scalar kind (`None`: an array, whose size
/// is found by writing it).
fn any_value_len(value: &Value) -> Option<usize> {
    let len = match value {
        Value::Str(_) | Value::Static(_) | Value::Shared(_) => {
            let n = value.as_str().unwrap_or_default().len();
            1 + varint_len(n as u64) + n
        }
        Value::Bool(_) => 2,
        #[allow(clippy::cast_sign_loss)] // int64 is written as its two's complement
        Value::Int(n) => 1 + varint_len(*n as u64),
        Value::Double(_) => 9,
        Value::Array(_) | Value::Strs(_) => return None,
    };
    Some(len)
}

fn key_value(out: &mut Vec<u8>, field: u8, key: &str, value: &Value) {
    let Some(value_len) = any_value_len(value) else {
        return nested(out, field, |out| {
            optional_bytes(out, 1, key.as_bytes());
            nested(out, 2, |out| any_value(out, value));
        });
    };
    // A scalar's sizes are known before it is written: its lengths go first, with no
    // placeholder to fill or move.
    let key_len = if key.is_empty() { 0 } else { 1 + varint_len(key.len() as u64) + key.len() };
    tag(out, field, LEN);
    varint(out, (key_len + 1 + varint_len(value_len as u64) + value_len) as u64);
    optional_bytes(out, 1, key.as_bytes());
    tag(out, 2, LEN);
    varint(out, value_len as u64);
    any_value(out, value);
}

/// The encoded `KeyValue`s of a batch's attributes whose text is shared between spans (the
/// session id, the agent's name, models, tool names, constant texts and lists of them, such as
/// a completed request's `finish_reasons`): each encoded once per batch and copied after. An
/// entry is found by the addresses and length of the key and the text (or list): the spans are
/// borrowed for the whole encoding, so one address and length is one value.
#[derive(Default)]
struct Shared {
    entries: Vec<(usize, usize, usize, std::ops::Range<usize>)>,
    bytes: Vec<u8>,
}

/// At most this many entries: a batch has a few shared texts; more are encoded each time.
const SHARED_ENTRIES: usize = 32;

impl Shared {
    fn key_value(&mut self, out: &mut Vec<u8>, key: &'static str, value: &Value) {
        let id = match value {
            Value::Static(text) => (key.as_ptr() as usize, text.as_ptr() as usize, text.len()),
            Value::Shared(text) => (key.as_ptr() as usize, text.as_ptr() as usize, text.len()),
            Value::Strs(texts) => (key.as_ptr() as usize, texts.as_ptr() as usize, texts.len()),
            _ => return key_value(out, 9, key, value),
        };
        if let Some((.., range)) = self.entries.iter().find(|(k, t, n, _)| (*k, *t, *n) == id) {
            out.extend_from_slice(&self.bytes[range.clone()]);
            return;
        }
        let start = out.len();
        key_value(out, 9, key, value);
        if self.entries.len() < SHARED_ENTRIES {
            let at = self.bytes.len();
            self.bytes.extend_from_slice(&out[start..]);
            self.entries.push((id.0, id.1, id.2, at..self.bytes.len()));
        }
    }
}

/// The bytes kept for a span's length: a span with attributes takes 128 to 16,383 bytes.
const SPAN_LENGTH: usize = 2;

fn span(out: &mut Vec<u8>, span: &Span, shared: &mut Shared) {
    nested_in(out, 2, SPAN_LENGTH, |out| {
        bytes(out, 1, &span.trace_id);
        bytes(out, 2, &span.span_id);
        if let Some(parent) = &span.parent {
            bytes(out, 4, parent);
        }
        optional_bytes(out, 5, span.name.as_bytes());
        tag(out, 6, VARINT);
        varint(out, span.kind as u64);
        for (field, time) in [(7, span.start_ns), (8, span.end_ns)] {
            if time != 0 {
                tag(out, field, FIXED64);
                out.extend_from_slice(&time.to_le_bytes());
            }
        }
        for (key, value) in &span.attributes {
            shared.key_value(out, key, value);
        }
        let message = span.status.message.as_bytes();
        let message_len = if message.is_empty() { 0 } else { 1 + varint_len(message.len() as u64) + message.len() };
        tag(out, 15, LEN);
        varint(out, (message_len + if span.status.error { 2 } else { 0 }) as u64);
        optional_bytes(out, 2, message);
        if span.status.error {
            tag(out, 3, VARINT);
            varint(out, STATUS_ERROR); // one byte
        }
        out.extend_from_slice(&[0x85, 0x01]); // field 16, fixed32: a tag of two bytes
        out.extend_from_slice(&HAS_IS_REMOTE.to_le_bytes());
    });
}

/// An encoded `ExportTraceServiceRequest` in two parts, `head` then `spans`: the enclosing
/// messages' heads (tags and lengths, the resource, the scope) are written after the spans,
/// whose length they hold, and the caller joins the parts where the body goes (a Python
/// `bytes`), so the spans are copied once.
pub struct Request {
    pub head: Vec<u8>,
    pub spans: Vec<u8>,
}

/// `spans` as an OTLP `ExportTraceServiceRequest` in protobuf, appended to `out`.
pub fn protobuf(out: &mut Vec<u8>, resource: &Resource, spans: &[Span]) {
    let request = request(resource, spans);
    out.reserve(request.head.len() + request.spans.len());
    out.extend_from_slice(&request.head);
    out.extend_from_slice(&request.spans);
}

/// `spans` as an OTLP `ExportTraceServiceRequest` in protobuf, in two parts.
pub fn request(resource: &Resource, spans: &[Span]) -> Request {
    let mut body = Vec::with_capacity(spans.len() * 320);
    let mut shared = Shared::default();
    for s in spans {
        span(&mut body, s, &mut shared);
    }
    let mut inner = Vec::with_capacity(256);
    nested_in(&mut inner, 1, 2, |out| {
        for (key, value) in &resource.attributes {
            key_value(out, 1, key, value);
        }
    });
    let mut scope = Vec::with_capacity(64);
    nested(&mut scope, 1, |out| {
        optional_bytes(out, 1, resource.scope_name.as_bytes());
        optional_bytes(out, 2, resource.scope_version.as_bytes());
    });
    let scope_spans = scope.len() + body.len();
    tag(&mut inner, 2, LEN);
    varint(&mut inner, scope_spans as u64);
    let mut head = Vec::with_capacity(inner.len() + scope.len() + 12);
    tag(&mut head, 1, LEN);
    varint(&mut head, (inner.len() + scope_spans) as u64);
    head.extend_from_slice(&inner);
    head.extend_from_slice(&scope);
    Request { head, spans: body }
}

fn hex(out: &mut String, id: &[u8]) {
    for b in id {
        let _ = write!(out, "{b:02x}");
    }
}

fn json_value(out: &mut String, value: &Value) {
    match value {
        Value::Str(_) | Value::Static(_) | Value::Shared(_) => {
            out.push_str(r#"{"stringValue":"#);
            push_str_literal(out, value.as_str().unwrap_or_default());
        }
        Value::Bool(b) => {
            out.push_str(r#"{"boolValue":"#);
            out.push_str(if *b { "true" } else { "false" });
        }
        Value::Int(n) => {
            // int64 is a string in protobuf's JSON mapping
            let _ = write!(out, r#"{{"intValue":"{n}""#);
        }
        Value::Double(x) => {
            out.push_str(r#"{"doubleValue":"#);
            out.push_str(&serde_json::to_string(x).unwrap_or_else(|_| "0".into()));
        }
        Value::Array(values) => json_array(out, values.iter().cloned()),
        Value::Strs(texts) => json_array(out, texts.iter().map(|t| Value::Static(t))),
    }
    out.push('}');
}

fn json_array(out: &mut String, values: impl Iterator<Item = Value>) {
    out.push_str(r#"{"arrayValue":{"#);
    let mut any = false;
    for v in values {
        out.push_str(if any { "," } else { r#""values":["# });
        any = true;
        json_value(out, &v);
    }
    if any {
        out.push(']');
    }
    out.push('}');
}

fn json_attributes<'a>(out: &mut String, attributes: impl Iterator<Item = (&'a str, &'a Value)>) {
    out.push_str(r#""attributes":["#);
    for (i, (key, value)) in attributes.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(r#"{"key":"#);
        push_str_literal(out, key);
        out.push_str(r#","value":"#);
        json_value(out, value);
        out.push('}');
    }
    out.push(']');
}

fn json_span(out: &mut String, span: &Span) {
    out.push_str(r#"{"traceId":""#);
    hex(out, &span.trace_id);
    out.push_str(r#"","spanId":""#);
    hex(out, &span.span_id);
    out.push('"');
    if let Some(parent) = &span.parent {
        out.push_str(r#","parentSpanId":""#);
        hex(out, parent);
        out.push('"');
    }
    if !span.name.is_empty() {
        out.push_str(r#","name":"#);
        push_str_literal(out, &span.name);
    }
    let _ = write!(out, r#","kind":{},"startTimeUnixNano":"{}","endTimeUnixNano":"{}""#, span.kind as u8, span.start_ns, span.end_ns);
    if !span.attributes.is_empty() {
        out.push(',');
        json_attributes(out, span.attributes.iter().map(|(k, v)| (*k, v)));
    }
    out.push_str(r#","status":{"#);
    if !span.status.message.is_empty() {
        out.push_str(r#""message":"#);
        push_str_literal(out, &span.status.message);
    }
    if span.status.error {
        if !span.status.message.is_empty() {
            out.push(',');
        }
        let _ = write!(out, r#""code":{STATUS_ERROR}"#);
    }
    let _ = write!(out, r#"}},"flags":{HAS_IS_REMOTE}}}"#);
}

/// `spans` as an OTLP/JSON `ExportTraceServiceRequest`.
pub fn json(resource: &Resource, spans: &[Span]) -> String {
    let mut out = String::with_capacity(256 + spans.len() * 700);
    out.push_str(r#"{"resourceSpans":[{"resource":{"#);
    if !resource.attributes.is_empty() {
        json_attributes(&mut out, resource.attributes.iter().map(|(k, v)| (k.as_str(), v)));
    }
    out.push_str(r#"},"scopeSpans":[{"scope":{"#);
    let mut sep = "";
    if !resource.scope_name.is_empty() {
        out.push_str(r#""name":"#);
        push_str_literal(&mut out, &resource.scope_name);
        sep = ",";
    }
    if !resource.scope_version.is_empty() {
        out.push_str(sep);
        out.push_str(r#""version":"#);
        push_str_literal(&mut out, &resource.scope_version);
    }
    out.push_str(r#"},"spans":["#);
    for (i, s) in spans.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_span(&mut out, s);
    }
    out.push_str("]}]}]}");
    out
}
