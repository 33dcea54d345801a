//! Session log and memory store behaviour through the public Rust API.

use std::sync::{Arc, Mutex};

use kerman::agent_loop::close_open_turn;
use kerman::event_log::{LogError, MemoryStore, Store};
use serde_json::json;

#[test]
fn append_assigns_contiguous_seqs_and_non_decreasing_times() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let events: Vec<_> = (0..50).map(|i| log.append("goal/change", &json!({"i": i})).unwrap()).collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64);
        assert_eq!(e.data(), json!({"i": i}));
    }
    assert!(events.windows(2).all(|w| w[0].time <= w[1].time));
    assert_eq!(log.len(), 50);
}

#[test]
fn seqs_beyond_the_log_read_nothing_however_large() {
    let log = MemoryStore::new().create(Some("s")).unwrap();
    for i in 0..3 {
        log.append("goal/change", &json!({"i": i})).unwrap();
    }
    assert_eq!(log.get(2).map(|e| e.seq), Some(2));
    // 2^32 would be seq 0 if a seq were cut to 32 bits.
    for seq in [3, 1 << 32, u64::MAX] {
        assert!(log.get(seq).is_none(), "seq {seq}");
        assert!(log.range(seq, None).is_empty(), "from seq {seq}");
    }
    assert_eq!(log.range(1, Some(u64::MAX)).len(), 2);
    assert_eq!(log.range(1 << 32, Some(1 << 33)).len(), 0);
}

#[test]
fn reserved_types_are_refused() {
    let log = MemoryStore::new().create(None).unwrap();
    for kind in ["turn/start", "step/end", "user/message", "assistant/chunk", "tool/result", "request/header", "agent/inbox/spliced"] {
        assert!(matches!(log.append(kind, &json!({})), Err(LogError::ReservedType(_))), "{kind}");
    }
    assert!(log.append("request/context", &json!({})).is_ok());
    assert!(matches!(log.append("", &json!({})), Err(LogError::InvalidType(_))));
}

#[test]
fn observers_run_in_order_and_reentrant_appends_are_refused() {
    let log = MemoryStore::new().create(None).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (inner, sink) = (log.clone(), Arc::clone(&seen));
    let id = log.subscribe(Arc::new(move |e| {
        let nested = inner.append("x/y", &json!(null));
        sink.lock().unwrap().push((e.seq, matches!(nested, Err(LogError::Reentrant))));
    }));
    log.append("a/b", &json!(1)).unwrap();
    log.append("a/b", &json!(2)).unwrap();
    assert!(log.unsubscribe(id));
    log.append("a/b", &json!(3)).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(0, true), (1, true)]);
    assert_eq!(log.len(), 3);
}

#[test]
fn closed_logs_refuse_appends_and_memory_sessions_reopen() {
    let store = MemoryStore::new();
    let log = store.create(Some("s")).unwrap();
    log.append("a/b", &json!({"k": 1})).unwrap();
    assert!(matches!(store.open("s"), Err(LogError::LockedHere { .. })));
    assert!(matches!(store.delete("s"), Err(LogError::LockedHere { .. })));
    log.close().unwrap();
    assert!(matches!(log.append("a/b", &json!(1)), Err(LogError::Closed { .. })));
    let again = store.open("s").unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again.get(0).unwrap().data(), json!({"k": 1}));
    assert!(matches!(store.create(Some("s")), Err(LogError::Exists { .. })));
    assert!(matches!(store.open("nope"), Err(LogError::NotFound { .. })));
}

#[test]
fn a_memory_session_dropped_without_close_reopens_with_its_events() {
    let store = MemoryStore::new();
    let log = store.create(Some("s")).unwrap();
    log.append("a/b", &json!({"k": 1})).unwrap();
    log.append("a/b", &json!({"k": 2})).unwrap();
    // The dropped log hands its events to the store (moved, not copied).
    drop(log);
    let again = store.open("s").unwrap();
    assert_eq!(again.range(0, None).iter().map(kerman::Event::data).collect::<Vec<_>>(), [json!({"k": 1}), json!({"k": 2})]);
    again.append("a/b", &json!({"k": 3})).unwrap();
    again.close().unwrap();
    // A closed log stays readable: the store got a copy.
    assert_eq!(again.len(), 3);
    assert_eq!(store.open("s").unwrap().len(), 3);
}

#[test]
fn empty_sessions_are_listed_as_they_exist() {
    let store = MemoryStore::new();
    let _empty = store.create(Some("empty")).unwrap();
    let full = store.create(Some("full")).unwrap();
    full.append("a/b", &json!(1)).unwrap();
    assert_eq!(store.list().unwrap(), ["empty", "full"]);
    assert!(store.exists("empty").unwrap());
}

#[test]
fn waiters_fire_on_growth_and_close() {
    let log = MemoryStore::new().create(None).unwrap();
    let fired = Arc::new(Mutex::new(0));
    let f = Arc::clone(&fired);
    log.wait_beyond(0, Box::new(move || *f.lock().unwrap() += 1));
    assert_eq!(*fired.lock().unwrap(), 0);
    log.append("a/b", &json!(1)).unwrap();
    assert_eq!(*fired.lock().unwrap(), 1);
    let f = Arc::clone(&fired);
    log.wait_beyond(5, Box::new(move || *f.lock().unwrap() += 10));
    log.close().unwrap();
    assert_eq!(*fired.lock().unwrap(), 11);
}

#[test]
fn a_forgotten_wait_is_dropped_at_once_and_never_called() {
    let log = MemoryStore::new().create(None).unwrap();
    let fired = Arc::new(Mutex::new(0));
    let held = Arc::new(());
    let (f, h) = (Arc::clone(&fired), Arc::clone(&held));
    let id = log
        .wait_beyond(
            0,
            Box::new(move || {
                let _ = &h;
                *f.lock().unwrap() += 1;
            }),
        )
        .expect("registered");
    let f = Arc::clone(&fired);
    let kept = log.wait_beyond(0, Box::new(move || *f.lock().unwrap() += 10)).expect("registered");
    assert_ne!(id, kept);
    assert_eq!(log.waiting(), 2);
    assert!(log.forget_wait(id));
    assert!(!log.forget_wait(id), "a wait is forgotten once");
    assert_eq!(Arc::strong_count(&held), 1, "the forgotten waiter was dropped, not kept until the next append");
    log.append("a/b", &json!(1)).unwrap();
    assert_eq!(*fired.lock().unwrap(), 10);
    assert!(!log.forget_wait(kept), "a wait that ran cannot be forgotten");
    // A wait that is already satisfied runs at once and has no id.
    assert!(log.wait_beyond(0, Box::new(|| {})).is_none());
    assert_eq!(log.waiting(), 0);
}

#[test]
fn closers_answer_each_call_of_a_repeated_id_once() {
    use kerman::event_log::Surface;
    let log = MemoryStore::new().create(None).unwrap();
    log.append_loop_event("turn/start", &json!({"turn": 1}), None).unwrap();
    log.append_loop_event("step/start", &json!({"turn": 1, "step": 1}), None).unwrap();
    let call = |id: &str| json!({"type": "tool-call", "id": id, "name": "t", "arguments": "{}"});
    let message = json!({"id": "m", "role": "assistant", "content": [call("c1"), call("c1"), call("c2")], "source": {"kind": "model"}});
    log.append_loop_event("assistant/message", &json!({"turn": 1, "step": 1, "message": message}), Some(Surface::append())).unwrap();
    let first =
        log.append_loop_event("tool/call", &json!({"turn": 1, "step": 1, "callId": "c1", "name": "t", "arguments": "{}"}), None).unwrap();
    let second =
        log.append_loop_event("tool/call", &json!({"turn": 1, "step": 1, "callId": "c1", "name": "t", "arguments": "{}"}), None).unwrap();
    let result = json!({"id": "r", "role": "tool", "content": [{"type": "tool-result", "callId": "c1", "content": [{"type": "text", "text": "ok"}]}], "source": {"kind": "tool", "callId": "c1"}});
    log.append_loop_event("tool/result", &json!({"turn": 1, "step": 1, "message": result}), Some(Surface::append_citing(vec![first.seq])))
        .unwrap();
    let before = log.len();
    // The second c1 (started, no result) and c2 (never started); then step/end and turn/end.
    assert_eq!(close_open_turn(&log).unwrap(), 4);
    let closers = log.range(before, None);
    let code = |e: &kerman::event_log::Event| e.data()["error"]["code"].as_str().map(str::to_string);
    assert_eq!(code(&closers[0]).as_deref(), Some("TOOL_OUTCOME_UNKNOWN"));
    assert_eq!(closers[0].surface().and_then(|s| s.source_event_seqs.clone()), Some(vec![second.seq]));
    assert_eq!(code(&closers[1]).as_deref(), Some("TOOL_NOT_STARTED"));
    assert_eq!(closers[1].data()["message"]["source"]["callId"], "c2");
    assert_eq!([closers[2].kind(), closers[3].kind()], ["step/end", "turn/end"]);
}

#[test]
fn closers_are_a_no_op_on_a_balanced_log() {
    let log = MemoryStore::new().create(None).unwrap();
    log.append("a/b", &json!(1)).unwrap();
    assert_eq!(close_open_turn(&log).unwrap(), 0);
    assert_eq!(log.len(), 1);
}

#[test]
fn loop_owned_events_with_nul_in_their_type_are_refused_before_taking_a_seq() {
    // The loop's own path refuses what `append` refuses (the Python suite pins `append` in
    // every store: tests/python/store/test_store_contract.py).
    let log = MemoryStore::new().create(None).unwrap();
    for kind in ["a\0b", "\0", "x/\0/y"] {
        let err = log.append_loop_event(kind, &json!({"n": 3}), None).unwrap_err();
        assert!(err.to_string().contains("contains NUL"), "{err}");
    }
    assert_eq!(log.len(), 0);
}
