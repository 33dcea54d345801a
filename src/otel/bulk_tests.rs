//! The span fold with the bulk ranges the core's writer records (`Event::bulk`): the same
//! fields and spans as without them, the range jumped over rather than walked, and a range
//! the text does not bear out ignored.

use std::sync::Arc;

use super::read::{self, Reply};
use super::{encode, Options, Resource, Span, SpanFold};
use crate::agent_loop::events;
use crate::agent_loop::Ending;
use crate::event_log::{Event, MemoryStore, SessionLog, Store};
use crate::message::{Message, MessageKind};

const MESSAGE: &str = r#"{"id":"m","role":"assistant","content":[{"type":"text","text":"a } b"},{"x":{}}],"source":{"kind":"model"}}"#;

/// `{"turn":1,"step":2,"message":MESSAGE<tail>}` and the message's range.
fn payload(tail: &str) -> (String, std::ops::Range<usize>) {
    let head = r#"{"turn":1,"step":2,"message":"#;
    (format!("{head}{MESSAGE}{tail}}}"), head.len()..head.len() + MESSAGE.len())
}

#[test]
fn a_range_that_fits_reads_what_the_walk_reads() {
    for tail in ["", r#","interrupted":true"#, r#","usage":{"input":3,"output":4,"model":"m1"}"#, r#","interrupted":true,"usage":{}"#] {
        let (text, range) = payload(tail);
        let walked: Option<Reply<'_>> = read::object(&text);
        assert!(walked.is_some());
        assert_eq!(read::object_skipping::<Reply<'_>>(&text, Some(range)), walked, "{text}");
        assert_eq!(read::object_skipping::<Reply<'_>>(&text, None), walked, "{text}");
    }
}

#[test]
fn the_range_is_jumped_over_not_walked() {
    // Brackets the scanner could not match: the walk fails, the jump reads the fields after.
    let head = r#"{"turn":4,"message":"#;
    let message = "{ ]] [ }";
    let text = format!(r#"{head}{message},"interrupted":true}}"#);
    assert_eq!(read::object::<Reply<'_>>(&text), None);
    let reply: Reply<'_> = read::object_skipping(&text, Some(head.len()..head.len() + message.len())).unwrap();
    assert_eq!((reply.turn, reply.interrupted), (Some("4"), Some("true")));
}

#[test]
fn a_range_that_does_not_fit_the_text_is_ignored() {
    let (text, good) = payload(r#","usage":{"input":3,"output":4}"#);
    let walked: Option<Reply<'_>> = read::object(&text);
    // inside the message, after the `}` of a nested object
    let inner = good.start + MESSAGE.find("}],").unwrap();
    let bad = [
        good.start + 1..good.end,
        good.start - 1..good.end,
        good.start..good.end - 1,
        good.start..good.end + 1,
        good.start..inner,
        good.start..text.len() + 10,
        good.start..good.start,
        0..text.len(),
        3..9,
    ];
    for range in bad {
        assert_eq!(read::object_skipping::<Reply<'_>>(&text, Some(range.clone())), walked, "{range:?}");
    }
}

/// A session of two turns as the loop writes it: a tool call, an interrupted reply with usage.
fn session() -> SessionLog {
    let log = MemoryStore::new().create(None).unwrap();
    let reply = |text: &str| Message::of_text(MessageKind::Assistant, text, None);
    let usage = Some(r#"{"input":12,"output":3,"model":"m1","provider":"p"}"#);
    let appended = [
        events::turn_start(1),
        events::step_start(1, 1),
        events::assistant_message(1, 1, &reply("calling } {"), false, usage, Vec::new()),
        events::step_end(1, 1),
        events::turn_end(1, &Ending::Completed),
        events::turn_start(2),
        events::step_start(2, 1),
        events::assistant_message(2, 1, &reply("cut"), true, None, Vec::new()),
        events::turn_end(2, &Ending::Interrupted),
    ];
    for event in appended {
        events::append(&log, event).unwrap();
    }
    log
}

fn spans(events: &[Event]) -> Vec<Span> {
    let mut fold = SpanFold::new(Options { session: "s".into(), agent_name: "kerman".into(), latest: true, ..Options::default() });
    for event in events {
        fold.add(event);
    }
    fold.finish();
    fold.spans
}

#[test]
fn events_with_their_writers_ranges_and_read_back_without_give_the_same_spans() {
    let log = session();
    let live: Vec<Event> = log.with_events(<[Event]>::to_vec);
    let replies: Vec<&Event> = live.iter().filter(|e| e.kind() == events::ASSISTANT_MESSAGE).collect();
    assert_eq!(replies.len(), 2);
    for reply in replies {
        let range = reply.bulk().expect("the writer records the message's range");
        let message: serde_json::Value = serde_json::from_str(&reply.data_json()[range]).unwrap();
        assert_eq!(message, reply.data()["message"]);
    }
    // Read back from the record: equal events, with no range.
    let mut intern = |kind: &str| Arc::from(kind);
    let read_back: Vec<Event> = live.iter().map(|e| Event::from_json(&e.to_json(), &mut intern).unwrap()).collect();
    assert_eq!(read_back, live);
    assert!(read_back.iter().all(|e| e.bulk().is_none()));
    let (with, without) = (spans(&live), spans(&read_back));
    assert_eq!(with.len(), 4);
    assert_eq!(with, without);
    let resource = Resource { attributes: Vec::new(), scope_name: "kerman.otel".into(), scope_version: "1".into() };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    encode::protobuf(&mut a, &resource, &with);
    encode::protobuf(&mut b, &resource, &without);
    assert_eq!(a, b);
}
