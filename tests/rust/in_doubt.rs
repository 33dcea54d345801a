//! Calls in doubt (`docs/durability.md#calls-in-doubt`): the policy written into `tool/call`,
//! the closers leaving a step with a call a resume settles open, and the resumed plan giving
//! each call exactly one result.

use kerman::agent_loop::events::{self, append};
use kerman::agent_loop::in_doubt::{self, Logged};
use kerman::agent_loop::{close_open_turn, Call, InDoubt, Next, Outcome, Shared, SideEffect, Sink, ToolInfo, ToolPlan};
use kerman::event_log::{MemoryStore, SessionLog, Store};
use kerman::inbox::Inbox;
use kerman::message::Message;
use serde_json::{json, Value};

const READ_RETRY: ToolInfo = ToolInfo { exclusive: false, effect: SideEffect::Read, in_doubt: InDoubt::Retry };

/// A turn whose step asked for `calls` (`(id, name)`), of which `started` logged their
/// `tool/call` with `info`, and `finished` their result; then the process died.
fn crashed_log(calls: &[(&str, &str)], started: &[(&str, ToolInfo)], finished: &[&str]) -> SessionLog {
    let log = MemoryStore::new().create(None).unwrap();
    append(&log, events::turn_start(1)).unwrap();
    append(&log, events::step_start(1, 1)).unwrap();
    let blocks = calls.iter().map(|(id, name)| json!({"type": "tool-call", "id": id, "name": name, "arguments": "{}"})).collect();
    let message = Message::assistant(blocks, None, None).unwrap();
    append(&log, events::assistant_message(1, 1, &message, false, None, Vec::new())).unwrap();
    for (id, info) in started {
        let name = calls.iter().find(|(i, _)| i == id).unwrap().1;
        let seq = append(&log, events::tool_call(1, 1, id, name, "{}", *info)).unwrap();
        if finished.contains(id) {
            let message = Message::tool_result_text(id, "done");
            append(&log, events::tool_result(1, 1, &message, None, None, Some(seq), false)).unwrap();
        }
    }
    log
}

fn of(log: &SessionLog, kind: &str) -> Vec<Value> {
    log.with_events(|events| events.iter().filter(|e| e.kind() == kind).map(kerman::event_log::Event::data).collect())
}

#[test]
fn the_call_record_carries_what_is_not_the_default() {
    let log = crashed_log(&[("c1", "look"), ("c2", "send")], &[("c1", READ_RETRY), ("c2", ToolInfo::default())], &["c1", "c2"]);
    let calls = of(&log, "tool/call");
    assert_eq!((calls[0]["effect"].as_str(), calls[0]["onInDoubt"].as_str()), (Some("read"), Some("retry")));
    assert!(calls[1].get("effect").is_none() && calls[1].get("onInDoubt").is_none());
    assert_eq!(events::call_policy(&calls[1]), (SideEffect::Write, InDoubt::Fail));
    // An unknown word reads as the default: it fails closed.
    assert_eq!(events::call_policy(&json!({"effect": "delete", "onInDoubt": "shrug"})), (SideEffect::Write, InDoubt::Fail));
}

#[test]
fn a_step_with_a_retry_call_in_doubt_stays_open() {
    let log = crashed_log(&[("c1", "look"), ("c2", "send"), ("c3", "look")], &[("c1", READ_RETRY), ("c2", ToolInfo::default())], &["c1"]);
    // c1 (retry) has its result, c2 (fail) is in doubt, c3 never started: nothing a resume
    // settles, so the closers close it as they always did.
    assert!(log.with_events(in_doubt::crashed).is_none());
    assert_eq!(close_open_turn(&log).unwrap(), 4);
    let log = crashed_log(&[("c1", "look"), ("c2", "send")], &[("c1", READ_RETRY)], &[]);
    assert_eq!(close_open_turn(&log).unwrap(), 0);
    let crashed = in_doubt::crashed_step(&log).unwrap();
    assert_eq!((crashed.turn, crashed.step), (1, 1));
    assert!(matches!(crashed.calls[0].2, Logged::InDoubt { policy: InDoubt::Retry, effect: SideEffect::Read, .. }));
    assert_eq!(crashed.calls[1].2, Logged::NotStarted);
}

#[test]
fn a_step_whose_calls_in_doubt_all_fail_is_closed_as_today() {
    let log = crashed_log(&[("c1", "send")], &[("c1", ToolInfo::default())], &[]);
    assert!(log.with_events(in_doubt::open_step).is_some());
    assert!(in_doubt::crashed_step(&log).is_none());
    assert_eq!(close_open_turn(&log).unwrap(), 3);
    assert_eq!(of(&log, "tool/result")[0]["error"]["code"], "TOOL_OUTCOME_UNKNOWN");
}

#[test]
fn the_resumed_plan_gives_each_call_exactly_one_result() {
    let reconcile = ToolInfo { in_doubt: InDoubt::Reconcile, ..ToolInfo::default() };
    let calls = [("c1", "look"), ("c2", "look"), ("c3", "pay"), ("c4", "send"), ("c5", "look")];
    let started = [("c1", READ_RETRY), ("c2", READ_RETRY), ("c3", reconcile), ("c4", ToolInfo::default())];
    let log = crashed_log(&calls, &started, &["c1"]);
    let crashed = in_doubt::crashed_step(&log).unwrap();
    let call_seqs: Vec<u64> = log.with_events(|events| events.iter().filter(|e| e.kind() == "tool/call").map(|e| e.seq).collect());
    let plan_calls = crashed
        .calls
        .into_iter()
        .map(|(id, name, logged)| (Call { id, name, arguments: "{}".into(), known: true, info: ToolInfo::default() }, logged))
        .collect();
    let mut plan = ToolPlan::resumed(1, 1, plan_calls, 4);
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let shared = Shared::default();
    let sink = Sink { log: &log, inbox: &inbox, history: &shared.history };
    let before = log.len();
    // c1 has its result; c2 runs again under its logged call, c3 reconciles.
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(1));
    assert_eq!(plan.call_seq(1), call_seqs[1]);
    assert!(!plan.reconciling(1));
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(2));
    assert!(plan.reconciling(2));
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Wait);
    plan.finish(&sink, 2, Outcome::text("found")).unwrap();
    plan.finish(&sink, 1, Outcome::text("again")).unwrap();
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
    // No tool/call was written again; one result per call without one, in model order.
    let added: Vec<(String, Value)> =
        log.with_events(|events| events[usize::try_from(before).unwrap()..].iter().map(|e| (e.kind().to_owned(), e.data())).collect());
    assert!(added.iter().all(|(kind, _)| kind == "tool/result"));
    let ids: Vec<_> = added.iter().map(|(_, d)| d["message"]["source"]["callId"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, ["c2", "c3", "c4", "c5"]);
    let codes: Vec<_> = added.iter().map(|(_, d)| d["error"]["code"].as_str().map(str::to_owned)).collect();
    assert_eq!(codes, [None, None, Some("TOOL_OUTCOME_UNKNOWN".into()), Some("TOOL_NOT_STARTED".into())]);
}
