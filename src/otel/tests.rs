//! The span fold over hand-written logs, and the protobuf encoder read back by a minimal
//! decoder. (Field-for-field equality with the OpenTelemetry SDK's spans and encoder is
//! checked from Python: `tests/python/otel/test_otel_native.py`.)

use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::encode;
use super::{span_id, trace_id, Kind, Options, Resource, Span, SpanFold, Value};
use crate::event_log::{Event, Surface};

fn event(seq: u64, kind: &str, data: &Json) -> Event {
    let surface = crate::event_log::is_surface_type(kind).then(Surface::append);
    Event::new(seq, 1000 + seq as i64, Arc::from(kind), Arc::from(data.to_string()), surface)
}

fn fold(events: &[(&str, Json)]) -> Vec<Span> {
    let mut fold = SpanFold::new(Options { session: "s".into(), agent_name: "kerman".into(), latest: true, ..Options::default() });
    for (seq, (kind, data)) in events.iter().enumerate() {
        fold.add(&event(seq as u64, kind, data));
    }
    fold.finish();
    fold.spans
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[test]
fn a_failed_attempt_its_retry_and_a_failing_tool_are_children_of_the_turn() {
    let tool_result = json!({"turn": 1, "step": 1, "message": {"role": "tool", "source": {"kind": "tool", "callId": "c1"},
        "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "bad"}], "isError": true}]}});
    let spans = fold(&[
        ("turn/start", json!({"turn": 1})),                                                               // 0
        ("step/start", json!({"turn": 1, "step": 1})),                                                    // 1
        ("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "a"}})), // 2
        ("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "usage", "input": 40, "output": 3, "partial": true}})), // 3
        ("assistant/message", json!({"turn": 1, "step": 1, "usage": {"input": 100, "cacheRead": 60, "output": 9, "model": "m1"}})), // 4
        ("tool/call", json!({"turn": 1, "step": 1, "callId": "c1", "name": "pay", "arguments": "{}"})),   // 5
        ("tool/result", tool_result),                                                                     // 6
        ("turn/end", json!({"turn": 1, "reason": {"kind": "error", "error": {"code": "BOOM", "message": "it broke"}}})), // 7
    ]);
    let names: Vec<&str> = spans.iter().map(|s| &*s.name).collect();
    assert_eq!(names, ["chat", "chat m1", "execute_tool pay", "invoke_agent kerman"]);
    let turn = &spans[3];
    assert_eq!((turn.trace_id, turn.span_id, turn.parent), (trace_id("s", 0), span_id("s", 0), None));
    assert!(spans[..3].iter().all(|s| s.parent == Some(turn.span_id) && s.trace_id == turn.trace_id));
    let [failed, completed, tool] = [&spans[0], &spans[1], &spans[2]];
    assert_eq!(failed.span_id, span_id("s", 2));
    assert_eq!(attr(failed, "kerman.request.outcome").and_then(Value::as_str), Some("failed"));
    assert_eq!(attr(failed, "gen_ai.usage.input_tokens"), Some(&Value::Int(40)));
    assert_eq!((failed.start_ns, failed.end_ns), (1_001_000_000, 1_003_000_000));
    assert!(failed.status.error && failed.kind == Kind::Client);
    // the retry starts where the failed attempt ended; its input is the whole prompt
    assert_eq!((completed.start_ns, completed.end_ns), (1_003_000_000, 1_004_000_000));
    assert_eq!(attr(completed, "gen_ai.usage.input_tokens"), Some(&Value::Int(100)));
    assert_eq!(attr(completed, "gen_ai.usage.cache_read.input_tokens"), Some(&Value::Int(60)));
    assert_eq!(attr(completed, "gen_ai.response.finish_reasons"), Some(&Value::Strs(&["stop"])));
    assert_eq!((tool.span_id, tool.status.message.as_str()), (span_id("s", 5), "bad"));
    assert_eq!(attr(tool, "error.type").and_then(Value::as_str), Some("tool_error"));
    assert_eq!((attr(turn, "error.type").and_then(Value::as_str), turn.status.message.as_str()), (Some("BOOM"), "it broke"));
}

#[test]
fn the_turn_after_an_interrupted_one_continues_its_trace() {
    let spans = fold(&[
        ("turn/start", json!({"turn": 1})),
        ("turn/end", json!({"turn": 1, "reason": {"kind": "interrupted"}})),
        ("turn/start", json!({"turn": 2, "continues": 1})),
        ("turn/end", json!({"turn": 2, "reason": {"kind": "completed"}})),
        ("turn/start", json!({"turn": 3})),
        ("turn/end", json!({"turn": 3, "reason": {"kind": "completed"}})),
    ]);
    assert_eq!(spans.len(), 3);
    assert_eq!((spans[1].trace_id, spans[1].parent), (spans[0].trace_id, Some(spans[0].span_id)));
    assert_eq!((spans[2].trace_id, spans[2].parent), (trace_id("s", 4), None));
    assert_eq!(spans[0].status.message, "interrupted");
}

/// `(field, wire type, payload)` of each field of one protobuf message.
fn fields(mut bytes: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    fn varint(bytes: &mut &[u8]) -> u64 {
        let (mut value, mut shift) = (0u64, 0);
        loop {
            let b = bytes[0];
            *bytes = &bytes[1..];
            value |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return value;
            }
            shift += 7;
        }
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let tag = varint(&mut bytes);
        let n = match tag & 7 {
            0 => {
                let v = varint(&mut bytes);
                out.push((tag >> 3, 0, v.to_le_bytes().to_vec()));
                continue;
            }
            1 => 8,
            5 => 4,
            2 => usize::try_from(varint(&mut bytes)).unwrap(),
            other => panic!("wire type {other}"),
        };
        out.push((tag >> 3, tag & 7, bytes[..n].to_vec()));
        bytes = &bytes[n..];
    }
    out
}

/// Checks that the fields of `bytes`, a message of length-delimited fields with one-byte tags,
/// have their lengths in as few bytes as they need: the message is as long as that makes it.
fn minimal(bytes: &[u8]) {
    let varint_len = |n: usize| format!("{n:b}").len().div_ceil(7);
    let expected: usize = fields(bytes)
        .iter()
        .map(|(_, wire, value)| {
            assert_eq!(*wire, 2);
            1 + varint_len(value.len()) + value.len()
        })
        .sum();
    assert_eq!(bytes.len(), expected);
}

#[test]
fn the_protobuf_nests_as_otlp_says_and_long_fields_get_long_lengths() {
    let long = "x".repeat(300);
    let span = Span {
        trace_id: [1; 16],
        span_id: [2; 8],
        parent: None,
        name: long.clone().into(),
        kind: Kind::Client,
        start_ns: 5,
        end_ns: 6,
        attributes: vec![("n", Value::Int(-1)), ("b", Value::Bool(false))],
        status: super::Status::error("e".into()),
    };
    let resource = Resource {
        attributes: vec![("service.name".into(), Value::from("svc"))],
        scope_name: "kerman.otel".into(),
        scope_version: "1".into(),
    };
    let mut out = Vec::new();
    encode::protobuf(&mut out, &resource, &[span.clone(), span]);
    let [(1, 2, resource_spans)] = &fields(&out)[..] else { panic!("one ResourceSpans") };
    let top = fields(resource_spans);
    assert_eq!(top.iter().map(|f| f.0).collect::<Vec<_>>(), [1, 2]);
    let scope_spans = fields(&top[1].2);
    assert_eq!(scope_spans.iter().map(|f| f.0).collect::<Vec<_>>(), [1, 2, 2]);
    let span = fields(&scope_spans[1].2);
    assert_eq!(span.iter().map(|f| f.0).collect::<Vec<_>>(), [1, 2, 5, 6, 7, 8, 9, 9, 15, 16]);
    assert_eq!(span[2].2, long.as_bytes());
    assert_eq!(span[9], (16, 5, 0x100u32.to_le_bytes().to_vec()));
    // a oneof member holding its default (false) is written
    let b = fields(&span[7].2);
    assert_eq!(fields(&b[1].2), [(2, 0, 0u64.to_le_bytes().to_vec())]);
    let n = fields(&span[6].2);
    assert_eq!(fields(&n[1].2), [(3, 0, u64::MAX.to_le_bytes().to_vec())]);
    // a span's length is written in one, two or three bytes as its size asks
    for size in [0, 100, 20_000] {
        let name = "y".repeat(size);
        let short = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: None,
            name: name.into(),
            kind: Kind::Internal,
            start_ns: 5,
            end_ns: 6,
            attributes: Vec::new(),
            status: super::Status::default(),
        };
        let mut out = Vec::new();
        encode::protobuf(&mut out, &resource, &[short]);
        let [(1, 2, resource_spans)] = &fields(&out)[..] else { panic!("one ResourceSpans") };
        // each length in as few bytes as it needs, as protobuf's serializers write it
        minimal(&out);
        minimal(&fields(resource_spans)[1].2);
        let scope_spans = fields(&fields(resource_spans)[1].2);
        let span = fields(&scope_spans[1].2);
        assert_eq!(
            span.iter().map(|f| f.0).collect::<Vec<_>>(),
            if size == 0 { vec![1, 2, 6, 7, 8, 15, 16] } else { vec![1, 2, 5, 6, 7, 8, 15, 16] }
        );
        assert_eq!(span.iter().find(|f| f.0 == 5).map_or(0, |f| f.2.len()), size);
    }
    let json: Json = serde_json::from_str(&encode::json(&resource, &[])).unwrap();
    assert_eq!(json["resourceSpans"][0]["scopeSpans"][0]["scope"], json!({"name": "kerman.otel", "version": "1"}));
}

#[test]
fn attributes_of_shared_texts_read_back_in_every_span_of_a_batch() {
    use std::sync::Arc;
    // more shared texts than the encoder keeps encoded (32), each in both spans
    let texts: Vec<Arc<str>> = (0..40).map(|i| Arc::from(format!("text {i}"))).collect();
    let span = |id: u8| Span {
        trace_id: [1; 16],
        span_id: [id; 8],
        parent: None,
        name: "s".into(),
        kind: Kind::Internal,
        start_ns: 5,
        end_ns: 6,
        attributes: texts
            .iter()
            .map(|t| ("k", Value::Shared(Arc::clone(t))))
            .chain([("c", Value::Static("constant")), ("o", Value::Str(format!("own {id}")))])
            .collect(),
        status: super::Status::default(),
    };
    let resource = Resource { attributes: Vec::new(), scope_name: "kerman.otel".into(), scope_version: "1".into() };
    let mut out = Vec::new();
    encode::protobuf(&mut out, &resource, &[span(1), span(2), span(3)]);
    let [(1, 2, resource_spans)] = &fields(&out)[..] else { panic!("one ResourceSpans") };
    let scope_spans = fields(&fields(resource_spans)[1].2);
    assert_eq!(scope_spans.len(), 4);
    for (n, encoded) in scope_spans[1..].iter().enumerate() {
        let read: Vec<(String, String)> = fields(&encoded.2)
            .iter()
            .filter(|f| f.0 == 9)
            .map(|f| {
                let kv = fields(&f.2);
                let value = fields(&kv[1].2);
                (String::from_utf8(kv[0].2.clone()).unwrap(), String::from_utf8(value[0].2.clone()).unwrap())
            })
            .collect();
        let mut expected: Vec<(String, String)> = (0..40).map(|i| ("k".into(), format!("text {i}"))).collect();
        expected.push(("c".into(), "constant".into()));
        expected.push(("o".into(), format!("own {}", n + 1)));
        assert_eq!(read, expected);
    }
}

#[test]
fn a_span_encodes_the_same_alone_and_in_a_batch_whose_values_are_encoded_once() {
    let span = |id: u8| Span {
        trace_id: [1; 16],
        span_id: [id; 8],
        parent: Some([3; 8]),
        name: "chat m".into(),
        kind: Kind::Client,
        start_ns: 5,
        end_ns: 6,
        attributes: vec![
            ("gen_ai.response.finish_reasons", Value::Strs(&["stop"])),
            ("gen_ai.operation.name", Value::Static("chat")),
            ("kerman.step", Value::Int(i64::from(id))),
            ("b", Value::Bool(true)),
            ("x", Value::Double(0.5)),
            ("", Value::Str(String::new())),
        ],
        status: super::Status::error("the request failed".into()),
    };
    let resource = Resource { attributes: Vec::new(), scope_name: "kerman.otel".into(), scope_version: "1".into() };
    let scope_spans = |spans: &[Span]| {
        let mut out = Vec::new();
        encode::protobuf(&mut out, &resource, spans);
        let [(1, 2, resource_spans)] = &fields(&out)[..] else { panic!("one ResourceSpans") };
        minimal(&out);
        fields(&fields(resource_spans)[1].2).into_iter().skip(1).map(|f| f.2).collect::<Vec<_>>()
    };
    let batch = scope_spans(&[span(1), span(2), span(3)]);
    assert_eq!(batch.len(), 3);
    for (n, encoded) in batch.iter().enumerate() {
        let id = u8::try_from(n + 1).unwrap();
        assert_eq!(encoded, &scope_spans(&[span(id)])[0]);
        let read = fields(encoded);
        let finish = fields(&read.iter().find(|f| f.0 == 9).unwrap().2);
        assert_eq!(finish[0].2, b"gen_ai.response.finish_reasons");
        let status = fields(&read.iter().find(|f| f.0 == 15).unwrap().2);
        assert_eq!(status, [(2, 2, b"the request failed".to_vec()), (3, 0, 2u64.to_le_bytes().to_vec())]);
    }
}

#[test]
fn integers_are_read_as_json_integers() {
    for raw in
        ["0", "7", "007", "42", "-3", "999999999999999999", "9223372036854775807", "9223372036854775808", "1.0", "1e3", "", "x", "+1", "-"]
    {
        assert_eq!(super::read::int(Some(raw)), raw.parse::<i64>().ok(), "{raw}");
    }
    assert_eq!(super::read::int(None), None);
}
