//! Projections and the consumed-work fold (reference section 4).

use std::sync::Arc;

use kerman::agent_loop::consumed_work;
use kerman::event_log::Event;
use kerman::inbox::projection::InboxProjection;
use kerman::inbox::Target;

fn events(lines: &[&str]) -> Vec<Event> {
    lines
        .iter()
        .enumerate()
        .map(|(seq, body)| {
            let (kind, data) = body.split_once(' ').unwrap();
            let text = format!(r#"{{"type":"{kind}","seq":{seq},"time":0,"data":{data}}}"#);
            Event::from_json(&text, &mut |k: &str| Arc::from(k)).unwrap()
        })
        .collect()
}

const A: &str = r#"{"id":"a","role":"user","content":[],"source":{"kind":"user"}}"#;

#[test]
fn cw_02_last_stepped_turn_is_the_end() {
    let log = events(&[
        r#"turn/start {"turn":1}"#,
        r#"step/start {"turn":1,"step":1}"#,
        r#"step/end {"turn":1,"step":1}"#,
        r#"turn/end {"turn":1,"reason":{"kind":"completed"}}"#,
        r#"turn/start {"turn":2}"#,
        r#"step/start {"turn":2,"step":1}"#,
        r#"step/end {"turn":2,"step":1}"#,
        r#"turn/end {"turn":2,"reason":{"kind":"max-tokens"}}"#,
    ]);
    assert_eq!(consumed_work(&log).end.map(|e| e.seq), Some(7));
}

#[test]
fn cw_05_turns_that_claimed_nothing_are_ignored() {
    let log = events(&[
        r#"turn/start {"turn":1}"#,
        r#"step/start {"turn":1,"step":1}"#,
        r#"step/end {"turn":1,"step":1}"#,
        r#"turn/end {"turn":1,"reason":{"kind":"completed"}}"#,
        r#"turn/start {"turn":2}"#,
        r#"turn/end {"turn":2,"reason":{"kind":"blocked"}}"#,
    ]);
    assert_eq!(consumed_work(&log).end.map(|e| e.seq), Some(3));
}

#[test]
fn cw_09_and_cw_11_drops_and_their_absorption() {
    let insert = format!(r#"agent/inbox/spliced {{"target":"next-turn","start":0,"inserted":[{A}]}}"#);
    let drop = r#"agent/inbox/spliced {"target":"next-turn","start":0,"removedCount":1,"inserted":[],"outcome":"canceled"}"#;
    let log = events(&[&insert, drop]);
    assert!(consumed_work(&log).dropped_unrun);
    let later = events(&[
        &insert,
        drop,
        r#"turn/start {"turn":1}"#,
        r#"step/start {"turn":1,"step":1}"#,
        r#"turn/end {"turn":1,"reason":{"kind":"completed"}}"#,
    ]);
    let work = consumed_work(&later);
    assert!(!work.dropped_unrun);
    assert_eq!(work.end.map(|e| e.seq), Some(4));
}

#[test]
fn projection_folds_and_places_items() {
    let step = r#"{"id":"s","role":"user","content":[],"source":{"kind":"plugin","plugin":"x"}}"#;
    let log = events(&[
        &format!(r#"agent/inbox/spliced {{"target":"next-turn","start":0,"inserted":[{A}]}}"#),
        &format!(r#"agent/inbox/spliced {{"target":"next-step","start":0,"inserted":[{step}]}}"#),
        r"goal/change {}",
    ]);
    let p = InboxProjection::fold(&log).unwrap();
    assert_eq!(p.list(Target::NextTurn).len(), 1);
    let places: Vec<&str> = p.items().iter().map(|(place, _)| *place).collect();
    assert_eq!(places, ["queued", "context"]);
}

#[test]
fn projection_refuses_a_duplicate_with_its_seq() {
    let log = events(&[
        &format!(r#"agent/inbox/spliced {{"target":"next-turn","start":0,"inserted":[{A}]}}"#),
        &format!(r#"agent/inbox/spliced {{"target":"next-step","start":0,"inserted":[{A}]}}"#),
    ]);
    let err = InboxProjection::fold(&log).unwrap_err();
    assert_eq!(err.seq, 1);
    assert!(err.to_string().contains("message \"a\" is already pending"));
}
