//! Decisions about a call that started (`docs/decisions.md#calls-that-started`): the crash
//! closers ask about a call in doubt whose policy is `ask`, the turn waits, a decision is
//! refused or applied by the same rules as the gate's, and the resumed plan gives the call
//! exactly one result (run again under its logged `tool/call`, or the recorded one).

use kerman::agent_loop::decisions::{self, Decide};
use kerman::agent_loop::events::{self, append};
use kerman::agent_loop::in_doubt::{self, Logged};
use kerman::agent_loop::{call_decisions, crash_closers, Call, InDoubt, Next, Outcome, Shared, SideEffect, Sink, ToolInfo, ToolPlan};
use kerman::event_log::{MemoryStore, SessionLog, Store};
use kerman::inbox::Inbox;
use kerman::message::Message;
use serde_json::{json, Value};

const ASK_WRITE: ToolInfo = ToolInfo { exclusive: false, effect: SideEffect::Write, in_doubt: InDoubt::Ask };
const ASK_READ: ToolInfo = ToolInfo { exclusive: false, effect: SideEffect::Read, in_doubt: InDoubt::Ask };

/// A turn whose one step started `calls` (`(id, name, info)`) and died before any result.
fn crashed_log(calls: &[(&str, &str, ToolInfo)]) -> SessionLog {
    let log = MemoryStore::new().create(None).unwrap();
    append(&log, events::turn_start(1)).unwrap();
    append(&log, events::step_start(1, 1)).unwrap();
    let blocks = calls.iter().map(|(id, name, _)| json!({"type": "tool-call", "id": id, "name": name, "arguments": "{}"})).collect();
    let message = Message::assistant(blocks, None, None).unwrap();
    append(&log, events::assistant_message(1, 1, &message, false, None, Vec::new())).unwrap();
    for (id, name, info) in calls {
        append(&log, events::tool_call(1, 1, id, name, "{}", *info)).unwrap();
    }
    log
}

fn of(log: &SessionLog, kind: &str) -> Vec<Value> {
    log.with_events(|events| events.iter().filter(|e| e.kind() == kind).map(kerman::event_log::Event::data).collect())
}

fn open(log: &SessionLog) -> usize {
    crash_closers()(log).unwrap()
}

#[test]
fn the_closers_ask_once_about_each_ask_call_and_leave_the_turn_open() {
    let log = crashed_log(&[("c1", "pay", ASK_WRITE), ("c2", "look", ASK_READ), ("c3", "send", ToolInfo::default())]);
    assert_eq!(open(&log), 2);
    let requests = of(&log, "decision/requested");
    assert_eq!(requests.len(), 2);
    assert_eq!((requests[0]["kind"].as_str(), requests[0]["callId"].as_str()), (Some("in-doubt"), Some("c1")));
    assert_eq!(requests[0]["options"], json!(["record-result", "record-failure"]));
    assert_eq!(requests[1]["options"], json!(["run-again", "record-result", "record-failure"]));
    assert_eq!(requests[1]["last"], json!(true));
    assert!(requests[0].get("last").is_none());
    let call_seqs: Vec<u64> = log.with_events(|e| e.iter().filter(|e| e.kind() == "tool/call").map(|e| e.seq).collect());
    assert_eq!(requests[0]["callSeq"], json!(call_seqs[0]));
    // Opening again asks nothing more; the turn stays open and waits.
    assert_eq!(open(&log), 0);
    assert!(of(&log, "turn/end").is_empty());
    assert_eq!(decisions::pending(&log).len(), 2);
    assert!(in_doubt::crashed_step(&log).is_none(), "not resumable while a person is asked");
}

#[test]
fn a_write_tool_is_not_run_again_and_each_request_is_resolved_once() {
    let log = crashed_log(&[("c1", "pay", ASK_WRITE)]);
    open(&log);
    let [request] = decisions::pending(&log).try_into().unwrap();
    let id = request.decision_id.as_str();
    let refused = decisions::decide(&log, id, Decide::Approve, None, None, 0).unwrap_err();
    assert_eq!(refused.reason(), "invalid");
    assert!(refused.to_string().contains("write tool"), "{refused}");
    assert_eq!(decisions::decide(&log, id, Decide::Edit(json!({})), None, None, 0).unwrap_err().reason(), "invalid");
    let decided = decisions::decide(&log, id, Decide::Answer(json!("receipt 7")), Some("ops"), Some("k"), 0).unwrap();
    assert!(decided.ready && !decided.duplicate);
    assert!(decisions::decide(&log, id, Decide::Answer(json!("again")), None, Some("k"), 0).unwrap().duplicate);
    assert_eq!(decisions::decide(&log, id, Decide::Deny(None), None, Some("other"), 0).unwrap_err().reason(), "resolved");
    assert_eq!(of(&log, "decision/resolved").len(), 1);
    assert!(decisions::pending(&log).is_empty());
    // Decided: the step can be taken up, and the closers still leave it open.
    assert!(in_doubt::crashed_step(&log).is_some());
    assert_eq!(open(&log), 0);
}

/// The plan a resume builds (what `Machine::resume_in_doubt` does, with the decisions applied).
fn resumed(log: &SessionLog) -> ToolPlan {
    let crashed = in_doubt::crashed_step(log).unwrap();
    let calls = crashed
        .calls
        .into_iter()
        .map(|(id, name, logged)| {
            let info = match &logged {
                Logged::InDoubt { effect, policy, .. } => ToolInfo { exclusive: false, effect: *effect, in_doubt: *policy },
                _ => ToolInfo::default(),
            };
            (Call { id, name, arguments: "{}".into(), known: true, info }, logged)
        })
        .collect();
    let mut plan = ToolPlan::resumed(1, 1, calls, 4);
    let requests = log.with_events(call_decisions::requests);
    for index in 0..plan.calls().len() {
        let seq = plan.call_seq(index);
        if let Some((ask, Some(resolution))) = requests.iter().find(|(r, _)| r.call_seq == seq) {
            match decisions::started_outcome(ask.request.kind, resolution, &plan.call(index).name.clone()) {
                Some(outcome) => plan.preset(index, outcome),
                None => plan.run_again(index, None),
            }
        }
    }
    plan
}

#[test]
fn the_resumed_step_gives_each_call_exactly_one_result() {
    let log = crashed_log(&[("c1", "pay", ASK_WRITE), ("c2", "look", ASK_READ), ("c3", "pay", ASK_WRITE)]);
    open(&log);
    let pending = decisions::pending(&log);
    decisions::decide(&log, &pending[0].decision_id, Decide::Deny(Some("no record".into())), None, None, 0).unwrap();
    decisions::decide(&log, &pending[1].decision_id, Decide::Approve, None, None, 0).unwrap();
    let last = decisions::decide(&log, &pending[2].decision_id, Decide::Answer(json!({"id": 7})), None, None, 0).unwrap();
    assert!(last.ready);
    let mut plan = resumed(&log);
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let shared = Shared::default();
    let sink = Sink { log: &log, inbox: &inbox, history: &shared.history };
    let before = log.len();
    // Only the read call runs again, under its logged tool/call.
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(1));
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Wait);
    plan.finish(&sink, 1, Outcome::text("looked")).unwrap();
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
    let added: Vec<(String, Value)> =
        log.with_events(|events| events[usize::try_from(before).unwrap()..].iter().map(|e| (e.kind().to_owned(), e.data())).collect());
    assert!(added.iter().all(|(kind, _)| kind == "tool/result"), "{added:?}");
    let texts: Vec<String> =
        added.iter().map(|(_, d)| d["message"]["content"][0]["content"][0]["text"].as_str().unwrap().to_owned()).collect();
    assert!(texts[0].contains("failed (recorded by a person): no record"), "{texts:?}");
    assert_eq!(added[0].1["error"]["code"], "TOOL_ERROR");
    assert_eq!(texts[1], "looked");
    assert_eq!(texts[2], r#"{"id":7}"#);
    // With every call answered, nothing is pending and nothing is asked on open.
    assert!(log.with_events(call_decisions::requests).is_empty());
    assert!(decisions::pending(&log).is_empty());
}

#[test]
fn a_call_that_needs_input_waits_and_runs_again_with_the_answer() {
    let log = crashed_log(&[("c1", "transfer", ToolInfo::default())]);
    let request = decisions::Request {
        turn: 1,
        step: 1,
        decision_id: "d1".into(),
        call_id: "c1".into(),
        index: 0,
        name: "transfer".into(),
        arguments: "{}".into(),
        digest: decisions::digest("{}"),
        kind: decisions::RequestKind::Input,
        note: Some("Transfer 5?".into()),
        schema: Some(r#"{"type":"object"}"#.into()),
        expires_at: None,
        requester: None,
    };
    let call_seq = log.len() - 1; // the tool/call is the last event
    call_decisions::request_input(&log, request, call_seq, Some(r#"{"requestState":"t"}"#.into()), true).unwrap();
    // A crash now: the closers leave the turn open (the call waits for input, not in doubt).
    assert_eq!(open(&log), 0);
    assert!(of(&log, "turn/end").is_empty());
    assert_eq!(decisions::decide(&log, "d1", Decide::Approve, None, None, 0).unwrap_err().reason(), "invalid");
    decisions::decide(&log, "d1", Decide::Answer(json!({"ok": true})), None, None, 0).unwrap();
    let requests = log.with_events(call_decisions::requests);
    let (ask, resolution) = &requests[0];
    assert_eq!(ask.payload.as_deref(), Some(r#"{"requestState":"t"}"#));
    assert!(decisions::started_outcome(ask.request.kind, resolution.as_ref().unwrap(), "transfer").is_none());
}

/// An in-doubt request that expired (the closers write none with a deadline; a request with
/// `expiresAt` is read all the same) gives the call what `fail` gives it: the model sees an
/// outcome-unknown error result, and the step goes on.
#[test]
fn an_expired_in_doubt_request_fails_the_call_as_fail_does() {
    let log = crashed_log(&[("c1", "pay", ASK_WRITE)]);
    let call_seq = log.len() - 1;
    let ask = call_decisions::CallRequest {
        request: decisions::Request {
            turn: 1,
            step: 1,
            decision_id: "d1".into(),
            call_id: "c1".into(),
            index: 0,
            name: "pay".into(),
            arguments: "{}".into(),
            digest: decisions::digest("{}"),
            kind: decisions::RequestKind::InDoubt,
            note: None,
            schema: None,
            expires_at: Some(10),
            requester: None,
        },
        call_seq,
        options: vec!["record-result".into(), "record-failure".into()],
        payload: None,
    };
    append(&log, events::call_decision_requested(&ask, true)).unwrap();
    assert_eq!(open(&log), 0, "asked already");
    assert_eq!(decisions::expire(&log, 11).unwrap(), 1);
    assert_eq!(of(&log, "decision/resolved")[0]["outcome"], "expired");
    let mut plan = resumed(&log);
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let shared = Shared::default();
    let sink = Sink { log: &log, inbox: &inbox, history: &shared.history };
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
    let [result] = of(&log, "tool/result").try_into().unwrap();
    assert_eq!(result["error"]["code"], "TOOL_OUTCOME_UNKNOWN");
    let text = result["message"]["content"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("may or may not have happened") && text.contains("Do not retry blindly"), "{text}");
}

/// Cancelled while it waited (the step resumed aborted), a call that needs input gets the
/// result its resolution gives it, as when the step resumes after a crash: an interruption.
#[test]
fn a_cancelled_request_for_input_gives_its_call_the_same_result_when_aborted() {
    for aborted in [false, true] {
        let log = crashed_log(&[("c1", "transfer", ToolInfo::default())]);
        let request = decisions::Request {
            turn: 1,
            step: 1,
            decision_id: "d1".into(),
            call_id: "c1".into(),
            index: 0,
            name: "transfer".into(),
            arguments: "{}".into(),
            digest: decisions::digest("{}"),
            kind: decisions::RequestKind::Input,
            note: None,
            schema: None,
            expires_at: None,
            requester: None,
        };
        call_decisions::request_input(&log, request, log.len() - 1, None, true).unwrap();
        assert_eq!(decisions::cancel_pending(&log).unwrap(), 1);
        let mut plan = resumed(&log);
        let inbox = Inbox::new(log.clone(), None).unwrap();
        let shared = Shared::default();
        let sink = Sink { log: &log, inbox: &inbox, history: &shared.history };
        assert_eq!(plan.next(&sink, aborted).unwrap(), Next::Done);
        let [result] = of(&log, "tool/result").try_into().unwrap();
        assert_eq!(result["error"]["code"], "ABORTED_DURING_DISPATCH", "aborted: {aborted}");
    }
}
