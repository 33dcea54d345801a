//! Decisions in the turn machine alone: the `before_tool` gate, the wait, `decide`, expiry and
//! cancellation, and resuming a held step from the log in a new loop (`docs/decisions.md`).
//!
//! The host here answers every effect at once: `pre_step` enters the batch, the model replies
//! from a script, each tool call "runs" by recording its arguments in `ran` (so a test counts
//! executions), and the gate is a closure of the call.

use std::cell::RefCell;
use std::collections::VecDeque;

use kerman::agent_loop::decisions::{self, Decide, DecideError, Resolved};
use kerman::agent_loop::{
    crash_closers, AbortCause, Ask, Ctx, Decision, Effect, Gate, Input, Machine, Next, Outcome, Reply, ReplyContent, Requested, Shared,
};
use kerman::event_log::{Event, MemoryStore, SessionLog, Store};
use kerman::inbox::{Inbox, Target};
use kerman::message::Message;
use serde_json::{json, Value};
use std::sync::Arc;

type GateFn = Box<dyn Fn(usize, &str, &str) -> Gate>;

struct Host {
    store: MemoryStore,
    log: SessionLog,
    inbox: Inbox,
    shared: Shared,
    replies: RefCell<VecDeque<Vec<(String, String, String)>>>,
    /// Calls that ran: (id, arguments).
    ran: RefCell<Vec<(String, String)>>,
    gate: Option<GateFn>,
    requests: RefCell<usize>,
    /// The process "dies" when the machine asks to run tools (the run ends there).
    halt_at_tools: std::cell::Cell<bool>,
}

impl Host {
    fn new(gate: Option<GateFn>) -> Host {
        let store = MemoryStore::new().with_open_hook(crash_closers());
        let log = store.create(Some("s")).unwrap();
        Host::over(store, log, gate)
    }

    fn over(store: MemoryStore, log: SessionLog, gate: Option<GateFn>) -> Host {
        let inbox = Inbox::new(log.clone(), None).unwrap();
        let shared = Shared::resume(&log);
        Host {
            store,
            log,
            inbox,
            shared,
            replies: RefCell::default(),
            ran: RefCell::default(),
            gate,
            requests: RefCell::new(0),
            halt_at_tools: std::cell::Cell::new(false),
        }
    }

    /// The session closed and opened again by a new loop (the crash closers run on open).
    fn reopen(self, gate: Option<GateFn>) -> Host {
        let Host { store, log, inbox, .. } = self;
        drop(inbox);
        log.close().unwrap();
        drop(log);
        let log = store.open("s").unwrap();
        Host::over(store, log, gate)
    }

    fn reply(self, calls: &[(&str, &str, &str)]) -> Host {
        let calls = calls.iter().map(|(i, n, a)| (i.to_string(), n.to_string(), a.to_string())).collect();
        self.replies.borrow_mut().push_back(calls);
        self
    }

    fn with_ctx<R>(&self, f: impl FnOnce(&Ctx<'_>) -> R) -> R {
        let lookup = |name: &str| (name != "missing").then(kerman::agent_loop::ToolInfo::default);
        let ctx =
            Ctx { log: &self.log, inbox: &self.inbox, shared: &self.shared, tools: &lookup, max_parallel: 4, gated: self.gate.is_some() };
        f(&ctx)
    }

    /// Drives `machine` from `effect` until the run ends; the last effect.
    fn drive(&self, mut machine: Machine, mut effect: Effect) -> Effect {
        loop {
            let input = match &effect {
                Effect::PreStep { batch } => Input::Decided(Decision::Enter(batch.clone())),
                Effect::BeforeRequest => {
                    Input::Requested(Requested::Request { options: Ok("{}".into()), canonical: "{}".into(), instructions: None })
                }
                Effect::CallModel => {
                    *self.requests.borrow_mut() += 1;
                    let calls = self.replies.borrow_mut().pop_front();
                    let content = match calls {
                        Some(calls) => ReplyContent::Calls(calls),
                        None => ReplyContent::Text("done".into()),
                    };
                    Input::Reply(Reply { content, usage: None, max_tokens: false })
                }
                Effect::BeforeTool { index, name, arguments, .. } => {
                    Input::Gated((self.gate.as_ref().expect("gated without a gate"))(*index, name, arguments))
                }
                Effect::RunTools if self.halt_at_tools.get() => return effect,
                Effect::RunTools => {
                    let mut plan = machine.take_plan().unwrap();
                    let aborted = self.shared.state().abort.is_some();
                    self.with_ctx(|ctx| loop {
                        match plan.next(&ctx.sink(), aborted).unwrap() {
                            Next::Start(i) => {
                                let call = plan.call(i).clone();
                                self.ran.borrow_mut().push((call.id.clone(), call.arguments.clone()));
                                plan.finish(&ctx.sink(), i, Outcome::text(format!("ran {}", call.arguments))).unwrap();
                            }
                            Next::Wait => unreachable!("every call finishes at once"),
                            Next::Done => break,
                        }
                    });
                    Input::ToolsDone(plan)
                }
                Effect::AwaitDecisions | Effect::Finished | Effect::NoTurn => return effect,
                Effect::Describe(e) => panic!("core error {e}"),
                _ => Input::Continue,
            };
            effect = self.with_ctx(|ctx| machine.resume(ctx, input));
        }
    }

    /// A turn for `prompt`, run until it ends or waits.
    fn turn(&self, prompt: &str) -> Effect {
        self.inbox.append(Target::NextTurn, Arc::new(Message::user_text(prompt))).unwrap();
        let (machine, effect) = self.with_ctx(Machine::begin);
        assert!(effect.is_none());
        let first = self.with_ctx(|ctx| {
            let mut machine = machine;
            let effect = machine.resume(ctx, Input::Continue);
            (machine, effect)
        });
        self.drive(first.0, first.1)
    }

    /// Resumes the held step (`None`: nothing to resume).
    fn resume(&self) -> Option<Effect> {
        let (machine, effect) = self.with_ctx(Machine::resume_held)?;
        Some(self.drive(machine, effect))
    }

    fn events(&self) -> Vec<Event> {
        self.log.range(0, None)
    }

    fn kinds(&self) -> Vec<String> {
        self.events().iter().map(|e| e.kind().to_string()).collect()
    }

    fn of(&self, kind: &str) -> Vec<Value> {
        self.events().iter().filter(|e| e.kind() == kind).map(Event::data).collect()
    }

    fn results(&self) -> Vec<(String, Option<String>)> {
        self.of("tool/result")
            .iter()
            .map(|d| {
                let text = d.pointer("/message/content/0/content/0/text").and_then(Value::as_str).unwrap_or_default().to_string();
                (text, d.pointer("/error/code").and_then(Value::as_str).map(str::to_owned))
            })
            .collect()
    }

    /// The call ids of the tool results, in log order.
    fn result_ids(&self) -> Vec<String> {
        self.of("tool/result").iter().map(|d| d["message"]["source"]["callId"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// The call ids of the tool results the history holds, in its order (what a request sends).
    fn history_result_ids(&self) -> Vec<String> {
        self.shared.history.catch_up(&self.log, self.log.len()).unwrap();
        self.shared.history.since(0).iter().filter_map(|m| m.source().get("callId").and_then(Value::as_str).map(str::to_owned)).collect()
    }

    /// The types of the events from `start` on, each tool event with its call id.
    fn sequence_from(&self, start: usize) -> Vec<String> {
        self.events()[start..]
            .iter()
            .map(|e| {
                let data = e.data();
                let id = match e.kind() {
                    "tool/call" | "decision/requested" | "decision/resolved" => data["callId"].as_str().map(str::to_owned),
                    "tool/result" => data["message"]["source"]["callId"].as_str().map(str::to_owned),
                    _ => None,
                };
                id.map_or_else(|| e.kind().to_string(), |id| format!("{} {id}", e.kind()))
            })
            .collect()
    }

    fn pending_ids(&self) -> Vec<String> {
        decisions::pending(&self.log).into_iter().map(|r| r.decision_id).collect()
    }

    fn decide(&self, id: &str, decision: Decide, key: Option<&str>) -> Result<decisions::Decided, DecideError> {
        decisions::decide(&self.log, id, decision, Some("ann"), key, 1)
    }
}

fn ask_for(names: &'static [&'static str]) -> GateFn {
    Box::new(move |_, name, _| if names.contains(&name) { Gate::Ask(Ask::default()) } else { Gate::Run })
}

#[test]
fn a_gate_that_runs_changes_nothing_but_its_effect() {
    let h = Host::new(Some(Box::new(|_, _, _| Gate::Run))).reply(&[("c1", "t", r#"{"a":1}"#)]);
    assert_eq!(h.turn("go"), Effect::Finished);
    assert_eq!(*h.ran.borrow(), vec![("c1".to_string(), r#"{"a":1}"#.to_string())]);
    assert!(!h.kinds().iter().any(|k| k.starts_with("decision/")));
}

#[test]
fn deny_edit_and_a_failed_gate_never_run_what_they_stop() {
    let gate: GateFn = Box::new(|index, _, _| match index {
        0 => Gate::Deny(Some("not today".into())),
        1 => Gate::Edit(r#"{"a":2}"#.into()),
        2 => Gate::Invalid("None".into()),
        _ => Gate::Failed("boom".into()),
    });
    let h = Host::new(Some(gate)).reply(&[("c1", "t", "{}"), ("c2", "t", r#"{"a":1}"#), ("c3", "t", "{}"), ("c4", "t", "{}")]);
    assert_eq!(h.turn("go"), Effect::Finished);
    assert_eq!(*h.ran.borrow(), vec![("c2".to_string(), r#"{"a":2}"#.to_string())]);
    let results = h.results();
    assert_eq!(results[0], ("tool call 't' was denied: not today".to_string(), Some("TOOL_DENIED".into())));
    assert_eq!(results[1].1, None);
    assert_eq!(results[2].1.as_deref(), Some("GATE_ERROR"));
    assert!(results[2].0.contains("returned None"), "{:?}", results[2]);
    assert!(results[3].0.contains("boom"));
    // tool/call logs the arguments that ran.
    assert_eq!(h.of("tool/call")[1]["arguments"], r#"{"a":2}"#);
}

#[test]
fn a_rounds_requests_are_written_together_after_every_gate_the_last_marked() {
    // The asked calls are the first and third; the fourth needs no decision and is gated last,
    // so only a marker on the written requests can tell a reader that the step now waits.
    let h =
        Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", "{}"), ("c2", "read", "{}"), ("c3", "pay", "{}"), ("c4", "read", "{}")]);
    assert_eq!(h.turn("go"), Effect::AwaitDecisions);
    // Both requests, then the calls that need no decision, each result as soon as it is known.
    let start = h.kinds().iter().position(|k| k == "decision/requested").unwrap();
    assert_eq!(
        h.sequence_from(start),
        ["decision/requested c1", "decision/requested c3", "tool/call c2", "tool/result c2", "tool/call c4", "tool/result c4"]
    );
    let requests = h.of("decision/requested");
    assert_eq!(requests.iter().map(|r| r["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(requests[0].get("last"), None);
    assert_eq!(requests[1]["last"], true);
}

/// Issue 27 item 2: the calls that need no decision run while the step waits, each committing
/// its result as soon as it is known; the asked call runs once decided, and the model is asked
/// for the next step only then, with the step's results in call order.
#[test]
fn an_ask_holds_its_call_while_the_others_run_and_a_decision_resumes_it_without_the_model() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", r#"{"amount":5}"#), ("c2", "read", "{}")]);
    assert_eq!(h.turn("go"), Effect::AwaitDecisions);
    // The read ran and its result is logged; the pay waits; the turn is open.
    assert_eq!(*h.ran.borrow(), vec![("c2".to_string(), "{}".to_string())]);
    let start = h.kinds().iter().position(|k| k == "assistant/message").unwrap();
    assert_eq!(h.sequence_from(start), ["assistant/message", "decision/requested c1", "tool/call c2", "tool/result c2"]);
    let request = &h.of("decision/requested")[0];
    assert_eq!(request["callId"], "c1");
    assert_eq!(request["index"], 0);
    assert_eq!(request["kind"], "approval");
    assert_eq!(request["digest"], decisions::digest(r#"{"amount":5}"#));
    // Nothing more to do until the decision: no resume.
    assert_eq!(h.resume(), None);
    let requests_before = *h.requests.borrow();
    let id = h.pending_ids().pop().unwrap();
    let decided = h.decide(&id, Decide::Approve, Some("k1")).unwrap();
    assert!(decided.ready && !decided.duplicate);
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert_eq!(*h.ran.borrow(), vec![("c2".into(), "{}".into()), ("c1".into(), r#"{"amount":5}"#.into())]);
    assert_eq!(
        h.sequence_from(start),
        [
            "assistant/message", "decision/requested c1", "tool/call c2", "tool/result c2", "decision/resolved c1", "tool/call c1",
            "tool/result c1", "step/end", "step/start", "assistant/message", "step/end", "turn/end"
        ]
    );
    // The log holds the results as they were known; the history (what the model is sent) in
    // call order.
    assert_eq!(h.result_ids(), ["c2", "c1"]);
    assert_eq!(h.history_result_ids(), ["c1", "c2"]);
    // One more request: the one after the tool results, none for the decided call.
    assert_eq!(*h.requests.borrow(), requests_before + 1);
    let resolved = &h.of("decision/resolved")[0];
    assert_eq!(resolved["outcome"], "approved");
    assert_eq!(resolved["by"], "ann");
    assert_eq!(resolved["digest"], decisions::digest(r#"{"amount":5}"#));
    assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "completed");
}

/// Killed while a call that needs no decision runs: that call follows its in-doubt policy (here
/// `fail`: its outcome is unknown) at the next resume, the asked one stays pending, and the
/// turn stays open for it.
#[test]
fn a_crash_while_the_others_run_leaves_the_request_pending_and_the_running_call_in_doubt() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", "{}"), ("c2", "read", "{}"), ("c3", "read", r#"{"n":3}"#)]);
    h.halt_at_tools.set(true);
    assert_eq!(h.turn("go"), Effect::RunTools);
    // The process died after c2's tool/call, before its result.
    kerman::agent_loop::events::append(
        &h.log,
        kerman::agent_loop::events::tool_call(1, 1, "c2", "read", "{}", kerman::agent_loop::ToolInfo::default()),
    )
    .unwrap();
    let h = h.reopen(None);
    assert!(!h.kinds().iter().any(|k| k == "turn/end" || k == "tool/result"), "the closers leave the waiting step open");
    let id = h.pending_ids().pop().unwrap();
    // A resume settles c2 and runs c3 (its gate's logged verdict), then waits for c1.
    assert_eq!(h.resume(), Some(Effect::AwaitDecisions));
    assert_eq!(h.results()[0].1.as_deref(), Some("TOOL_OUTCOME_UNKNOWN"));
    assert_eq!(*h.ran.borrow(), vec![("c3".to_string(), r#"{"n":3}"#.to_string())]);
    assert_eq!(h.resume(), None);
    h.decide(&id, Decide::Approve, None).unwrap();
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert_eq!(h.ran.borrow().len(), 2);
    assert_eq!(h.result_ids(), ["c2", "c3", "c1"]);
    assert_eq!(h.history_result_ids(), ["c1", "c2", "c3"]);
    assert_eq!(*h.requests.borrow(), 1, "the model is asked once, after every result");
    assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "completed");
}

#[test]
fn several_requests_resolve_in_any_order_and_the_step_waits_for_all() {
    for order in [[0usize, 1, 2], [2, 0, 1], [1, 2, 0]] {
        let h = Host::new(Some(ask_for(&["a", "b", "c"]))).reply(&[("c1", "a", "{}"), ("c2", "b", "{}"), ("c3", "c", r#"{"x":1}"#)]);
        assert_eq!(h.turn("go"), Effect::AwaitDecisions);
        let ids = h.pending_ids();
        assert_eq!(ids.len(), 3);
        let decisions = [Decide::Deny(Some("no".into())), Decide::Approve, Decide::Edit(json!({"x": 2}))];
        for (n, &i) in order.iter().enumerate() {
            assert_eq!(h.resume(), None, "the step resumes only when every request is resolved");
            let decided = h.decide(&ids[i], decisions[i].clone(), None).unwrap();
            assert_eq!(decided.ready, n == 2);
        }
        assert_eq!(h.resume(), Some(Effect::Finished));
        assert_eq!(*h.ran.borrow(), vec![("c2".into(), "{}".into()), ("c3".into(), r#"{"x":2}"#.into())]);
        assert_eq!(h.results()[0].1.as_deref(), Some("TOOL_DENIED"));
    }
}

#[test]
fn a_request_resolves_at_most_once_and_a_repeated_key_applies_once() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", "{}"), ("c2", "pay", "{}")]);
    h.turn("go");
    let ids = h.pending_ids();
    h.decide(&ids[0], Decide::Approve, Some("click-1")).unwrap();
    let again = h.decide(&ids[0], Decide::Approve, Some("click-1")).unwrap();
    assert!(again.duplicate && !again.ready);
    let other = h.decide(&ids[0], Decide::Deny(None), Some("click-2")).unwrap_err();
    assert!(matches!(other, DecideError::Resolved(_, Resolved::Approved)), "{other}");
    assert!(other.to_string().contains("resolved already (approved)"));
    assert_eq!(h.of("decision/resolved").len(), 1);
    let unknown = h.decide("nope", Decide::Approve, None).unwrap_err();
    assert_eq!(unknown.reason(), "unknown");
    assert!(unknown.to_string().contains("no decision \"nope\""));
    // An answer to an approval does not fit.
    let invalid = h.decide(&ids[1], Decide::Answer(json!(1)), None).unwrap_err();
    assert_eq!(invalid.reason(), "invalid");
    h.decide(&ids[1], Decide::Approve, None).unwrap();
    h.resume();
    // Resolved in a finished turn: still refused, still idempotent by key.
    assert_eq!(h.decide(&ids[0], Decide::Approve, None).unwrap_err().reason(), "resolved");
    assert!(h.decide(&ids[0], Decide::Approve, Some("click-1")).unwrap().duplicate);
    assert_eq!(h.ran.borrow().len(), 2);
}

#[test]
fn an_expired_request_is_refused_and_its_call_never_runs() {
    let gate: GateFn = Box::new(|_, _, _| Gate::Ask(Ask { expires_at: Some(100), ..Ask::default() }));
    let h = Host::new(Some(gate)).reply(&[("c1", "pay", "{}")]);
    h.turn("go");
    assert_eq!(decisions::next_expiry(&h.log), Some(100));
    let id = h.pending_ids().pop().unwrap();
    let err = decisions::decide(&h.log, &id, Decide::Approve, None, None, 100).unwrap_err();
    assert_eq!(err.reason(), "expired");
    // Deciding again names the same reason; expiring again appends nothing.
    assert_eq!(decisions::decide(&h.log, &id, Decide::Approve, None, None, 5).unwrap_err().reason(), "expired");
    assert_eq!(decisions::expire(&h.log, 1000).unwrap(), 0);
    assert_eq!(h.of("decision/resolved")[0]["outcome"], "expired");
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert!(h.ran.borrow().is_empty());
    assert_eq!(h.results()[0].1.as_deref(), Some("TOOL_DENIED"));
}

#[test]
fn expire_resolves_only_what_is_due() {
    let gate: GateFn = Box::new(|index, _, _| Gate::Ask(Ask { expires_at: Some(if index == 0 { 10 } else { 20 }), ..Ask::default() }));
    let h = Host::new(Some(gate)).reply(&[("c1", "a", "{}"), ("c2", "b", "{}")]);
    h.turn("go");
    assert_eq!(decisions::expire(&h.log, 15).unwrap(), 1);
    assert_eq!(h.pending_ids().len(), 1);
    assert_eq!(decisions::next_expiry(&h.log), Some(20));
    assert_eq!(decisions::expire(&h.log, 20).unwrap(), 1);
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert!(h.ran.borrow().is_empty());
}

#[test]
fn cancel_while_waiting_resolves_cancelled_and_ends_the_turn_aborted() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", "{}"), ("c2", "read", "{}")]);
    h.turn("go");
    assert_eq!(decisions::cancel_pending(&h.log).unwrap(), 1);
    assert!(h.shared.state().abort(AbortCause::from_value(json!({"kind": "user"})).unwrap()));
    assert_eq!(h.resume(), Some(Effect::Finished));
    // The read ran while the step waited; the cancelled pay never runs.
    assert_eq!(*h.ran.borrow(), vec![("c2".to_string(), "{}".to_string())]);
    assert_eq!(h.of("decision/resolved")[0]["outcome"], "cancelled");
    let codes: Vec<_> = h.results().into_iter().map(|r| r.1).collect();
    assert_eq!(codes, vec![None, Some("ABORTED_BEFORE_DISPATCH".into())]);
    assert_eq!(h.result_ids(), ["c2", "c1"]);
    assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "aborted");
}

#[test]
fn a_held_turn_survives_reopening_and_runs_once_with_the_decided_arguments() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", r#"{"amount":5}"#)]);
    h.turn("go");
    let id = h.pending_ids().pop().unwrap();
    // Closed and reopened: the crash closers leave the held turn open.
    let h = h.reopen(Some(ask_for(&["pay"])));
    assert!(!h.kinds().iter().any(|k| k == "turn/end"));
    assert_eq!(h.pending_ids(), vec![id.clone()]);
    assert_eq!(h.shared.state().turn, 1);
    h.decide(&id, Decide::Edit(json!({"amount": 3})), Some("k")).unwrap();
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert_eq!(*h.ran.borrow(), vec![("c1".into(), r#"{"amount":3}"#.into())]);
    assert_eq!(*h.requests.borrow(), 1, "the model is asked once, after the result");
    // The decided call's gate did not run again (ask_for would have asked again).
    assert_eq!(h.of("decision/requested").len(), 1);
    // A held turn whose decisions are in, reopened before it resumed, still resumes.
}

/// The gate's verdicts on the calls that asked no one are logged with the round's requests: a
/// step resumed in a new loop (after a close or a crash) runs them as gated before the wait,
/// whatever the new loop's gate would say now, and without running it for them.
#[test]
fn a_resumed_step_keeps_the_verdicts_the_gate_gave_before_the_wait() {
    let first: GateFn = Box::new(|index, _, _| match index {
        0 => Gate::Run,
        1 => Gate::Ask(Ask::default()),
        2 => Gate::Edit(r#"{"a":30}"#.into()),
        3 => Gate::Deny(Some("not today".into())),
        _ => Gate::Invalid("None".into()),
    });
    let h = Host::new(Some(first)).reply(&[
        ("c1", "t", r#"{"a":1}"#),
        ("c2", "pay", r#"{"amount":5}"#),
        ("c3", "t", r#"{"a":3}"#),
        ("c4", "t", "{}"),
        ("c5", "t", "{}"),
    ]);
    // Killed once the round is logged, before any call started.
    h.halt_at_tools.set(true);
    assert_eq!(h.turn("go"), Effect::RunTools);
    let request = h.of("decision/requested").pop().unwrap();
    assert_eq!(request["last"], true);
    let gated = request["gated"].as_array().unwrap();
    let verdicts: Vec<_> = gated.iter().map(|g| (g["index"].as_u64().unwrap(), g["callId"].clone(), g["verdict"].clone())).collect();
    assert_eq!(
        verdicts,
        vec![
            (0, json!("c1"), json!("run")),
            (2, json!("c3"), json!("edit")),
            (3, json!("c4"), json!("deny")),
            (4, json!("c5"), json!("failed"))
        ]
    );
    assert_eq!(gated[0]["digest"], decisions::digest(r#"{"a":1}"#));
    assert_eq!(gated[1]["arguments"], r#"{"a":30}"#);
    assert_eq!(gated[1]["digest"], decisions::digest(r#"{"a":30}"#));
    assert_eq!(gated[2]["reason"], "not today");
    assert!(gated[3]["reason"].as_str().unwrap().contains("returned None"));
    let id = h.pending_ids().pop().unwrap();
    // A new loop whose gate would now deny everything, and counts how often it is asked.
    let asked = std::rc::Rc::new(std::cell::Cell::new(0));
    let counter = asked.clone();
    let h = h.reopen(Some(Box::new(move |_, _, _| {
        counter.set(counter.get() + 1);
        Gate::Deny(Some("changed my mind".into()))
    })));
    // The new loop runs what the first gate let run while the step waits, then the decided call.
    assert_eq!(h.resume(), Some(Effect::AwaitDecisions));
    h.decide(&id, Decide::Approve, None).unwrap();
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert_eq!(asked.get(), 0, "no call the first gate judged is gated again");
    assert_eq!(
        *h.ran.borrow(),
        vec![("c1".into(), r#"{"a":1}"#.into()), ("c3".into(), r#"{"a":30}"#.into()), ("c2".into(), r#"{"amount":5}"#.into())]
    );
    assert_eq!(h.result_ids(), ["c1", "c3", "c4", "c5", "c2"]);
    let results = h.results();
    assert_eq!(results[2], ("tool call 't' was denied: not today".to_string(), Some("TOOL_DENIED".into())));
    assert_eq!(results[3].1.as_deref(), Some("GATE_ERROR"));
    assert!(results[3].0.contains("returned None"), "{:?}", results[3]);
    // tool/call logs the edited arguments, as it did in one process.
    assert_eq!(h.of("tool/call")[1]["arguments"], r#"{"a":30}"#);
}

/// A logged gate verdict is bound to its call like a request: by position and id, and a call
/// to run by the digest of what the gate let run, checked when it starts.
#[test]
fn a_logged_verdict_that_does_not_match_its_call_fails_closed() {
    let gate: GateFn = Box::new(|index, _, _| if index == 0 { Gate::Ask(Ask::default()) } else { Gate::Run });
    let h = Host::new(Some(gate)).reply(&[("c1", "pay", "{}"), ("c2", "t", r#"{"a":1}"#), ("c3", "t", r#"{"a":2}"#)]);
    // Killed once the round is logged, before c2 and c3 started.
    h.halt_at_tools.set(true);
    assert_eq!(h.turn("go"), Effect::RunTools);
    h.halt_at_tools.set(false);
    let id = h.pending_ids().pop().unwrap();
    // A later round of the same step (forged here) logs an edit whose arguments are not the
    // ones its digest names, and a verdict naming another call's id.
    let mut forged = decisions::held(&h.log).unwrap().requests[0].clone();
    forged.decision_id = "forged".into();
    let edit = decisions::Gated {
        index: 1,
        call_id: "c2".into(),
        kind: decisions::GatedKind::Edit,
        arguments: Some(r#"{"a":500}"#.into()),
        digest: Some(decisions::digest(r#"{"a":5}"#)),
        reason: None,
    };
    let other =
        decisions::Gated { index: 2, call_id: "c2".into(), kind: decisions::GatedKind::Run, arguments: None, digest: None, reason: None };
    kerman::agent_loop::events::append(&h.log, kerman::agent_loop::events::decision_round(&forged, true, &[edit, other])).unwrap();
    h.decide(&id, Decide::Approve, None).unwrap();
    h.decide("forged", Decide::Approve, None).unwrap();
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert_eq!(*h.ran.borrow(), vec![("c1".to_string(), "{}".to_string())]);
    let codes: Vec<_> = h.results().into_iter().map(|r| r.1).collect();
    assert_eq!(codes, vec![None, Some("GATE_ERROR".into()), Some("GATE_ERROR".into())]);
}

#[test]
fn a_turn_resolved_but_not_resumed_is_left_open_on_reopen() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", "{}")]);
    h.turn("go");
    let id = h.pending_ids().pop().unwrap();
    h.decide(&id, Decide::Approve, None).unwrap();
    let h = h.reopen(None);
    assert!(!h.kinds().iter().any(|k| k == "turn/end"));
    // No gate in the new loop: the decided call runs all the same.
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert_eq!(h.ran.borrow().len(), 1);
}

/// A waiting step is taken up from the log whatever ran in it: a decided call that started
/// and was killed follows its in-doubt policy (here `fail`), and the step goes on.
#[test]
fn a_crash_after_a_decided_call_started_leaves_it_to_its_in_doubt_policy() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", "{}")]);
    h.turn("go");
    let id = h.pending_ids().pop().unwrap();
    h.decide(&id, Decide::Approve, None).unwrap();
    // The resumed step logged its tool/call, then the process died.
    kerman::agent_loop::events::append(
        &h.log,
        kerman::agent_loop::events::tool_call(1, 1, "c1", "pay", "{}", kerman::agent_loop::ToolInfo::default()),
    )
    .unwrap();
    let h = h.reopen(None);
    assert!(!h.kinds().iter().any(|k| k == "turn/end"));
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert!(h.ran.borrow().is_empty(), "a call in doubt whose policy is fail is not run again");
    assert_eq!(h.results()[0].1.as_deref(), Some("TOOL_OUTCOME_UNKNOWN"));
    assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "completed");
}

#[test]
fn a_crash_after_a_decided_call_that_does_not_run_gives_it_its_decision_not_an_unknown_outcome() {
    // pay is approved, wipe denied, ask answered; the resumed step logged every tool/call,
    // then the process died before any result. Only pay may have run: the others were
    // decided not to, and the resume gives them what was decided (not "outcome unknown").
    let gate: GateFn = Box::new(|_, name, _| {
        let schema = (name == "ask").then(|| r#"{"type":"string"}"#.to_string());
        Gate::Ask(Ask { schema, note: None, expires_at: None })
    });
    let h = Host::new(Some(gate)).reply(&[("c1", "pay", "{}"), ("c2", "wipe", "{}"), ("c3", "ask", "{}")]);
    h.turn("go");
    let ids = h.pending_ids();
    h.decide(&ids[0], Decide::Approve, None).unwrap();
    h.decide(&ids[1], Decide::Deny(Some("no".into())), None).unwrap();
    h.decide(&ids[2], Decide::Answer(json!("blue")), None).unwrap();
    for (id, name) in [("c1", "pay"), ("c2", "wipe"), ("c3", "ask")] {
        kerman::agent_loop::events::append(
            &h.log,
            kerman::agent_loop::events::tool_call(1, 1, id, name, "{}", kerman::agent_loop::ToolInfo::default()),
        )
        .unwrap();
    }
    let h = h.reopen(None);
    assert!(h.results().is_empty());
    assert_eq!(h.resume(), Some(Effect::Finished));
    let results = h.results();
    assert_eq!(results[0].1.as_deref(), Some("TOOL_OUTCOME_UNKNOWN"));
    assert_eq!(results[1], ("tool call 'wipe' was denied: no".to_string(), Some("TOOL_DENIED".to_string())));
    assert_eq!(results[2], ("blue".to_string(), None));
    // No tool/call was logged again: each result cites the one the killed process wrote.
    assert_eq!(h.of("tool/call").len(), 3);
    assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "completed");
    assert!(h.ran.borrow().is_empty());
}

#[test]
fn a_decision_is_bound_to_its_call_by_position_id_and_digest() {
    let h = Host::new(Some(ask_for(&["pay"]))).reply(&[("c1", "pay", r#"{"amount":5}"#)]);
    h.turn("go");
    let id = h.pending_ids().pop().unwrap();
    h.decide(&id, Decide::Approve, None).unwrap();
    // Forge a request of the same step for another position, with the first call's id: the
    // digest and position do not match the call it names, so it fails closed.
    let mut forged = decisions::held(&h.log).unwrap().requests[0].clone();
    forged.decision_id = "forged".into();
    forged.digest = decisions::digest(r#"{"amount":500}"#);
    kerman::agent_loop::events::append(&h.log, kerman::agent_loop::events::decision_requested(&forged, true)).unwrap();
    h.decide("forged", Decide::Approve, None).unwrap();
    assert_eq!(h.resume(), Some(Effect::Finished));
    assert!(h.ran.borrow().is_empty(), "{:?}", h.ran.borrow());
    assert_eq!(h.results()[0].1.as_deref(), Some("GATE_ERROR"));
}

#[test]
fn the_digest_is_checked_when_the_call_starts() {
    let log = MemoryStore::new().create(None).unwrap();
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let shared = Shared::default();
    let sink = kerman::agent_loop::Sink { log: &log, inbox: &inbox, history: &shared.history };
    let call = |id: &str| kerman::agent_loop::Call {
        id: id.into(),
        name: "t".into(),
        arguments: r#"{"a":1}"#.into(),
        known: true,
        info: kerman::agent_loop::ToolInfo::default(),
    };
    let mut plan = kerman::agent_loop::ToolPlan::new(1, 1, vec![call("c1"), call("c2")], 4);
    plan.decided(0, None, Some(decisions::digest(r#"{"a":1}"#)));
    plan.decided(1, None, Some(decisions::digest(r#"{"a":2}"#)));
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
    plan.finish(&sink, 0, Outcome::text("ok")).unwrap();
    // The second's arguments are not the decided ones: it gets its error without running.
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
    let last = log.range(0, None).pop().unwrap().data();
    assert_eq!(last["error"]["code"], "GATE_ERROR");
}

#[test]
fn an_answer_is_the_calls_result() {
    let gate: GateFn =
        Box::new(|_, _, _| Gate::Ask(Ask { schema: Some(r#"{"type":"string"}"#.into()), note: Some("which?".into()), expires_at: None }));
    let h = Host::new(Some(gate)).reply(&[("c1", "ask_user", "{}")]);
    h.turn("go");
    let request = &h.of("decision/requested")[0];
    assert_eq!(request["kind"], "answer");
    assert_eq!(request["schema"], json!({"type": "string"}));
    assert_eq!(request["note"], "which?");
    let id = h.pending_ids().pop().unwrap();
    assert_eq!(h.decide(&id, Decide::Approve, None).unwrap_err().reason(), "invalid");
    h.decide(&id, Decide::Answer(json!("blue")), None).unwrap();
    h.resume();
    assert!(h.ran.borrow().is_empty());
    assert_eq!(h.results()[0], ("blue".to_string(), None));
}

#[test]
fn a_gate_cancelled_by_an_abort_gives_every_call_its_aborted_result() {
    let h = Host::new(Some(ask_for(&["a"]))).reply(&[("c1", "a", "{}"), ("c2", "b", "{}")]);
    let shared = &h.shared;
    // The abort lands while the second call is being gated.
    let gate_calls = RefCell::new(0);
    let _ = &gate_calls;
    h.inbox.append(Target::NextTurn, Arc::new(Message::user_text("go"))).unwrap();
    let (machine, _) = h.with_ctx(Machine::begin);
    let mut machine = machine;
    let mut effect = h.with_ctx(|ctx| machine.resume(ctx, Input::Continue));
    loop {
        let input = match &effect {
            Effect::PreStep { batch } => Input::Decided(Decision::Enter(batch.clone())),
            Effect::BeforeRequest => {
                Input::Requested(Requested::Request { options: Ok("{}".into()), canonical: "{}".into(), instructions: None })
            }
            Effect::CallModel => Input::Reply(Reply {
                content: ReplyContent::Calls(h.replies.borrow_mut().pop_front().unwrap()),
                usage: None,
                max_tokens: false,
            }),
            Effect::BeforeTool { index: 0, .. } => Input::Gated(Gate::Ask(Ask::default())),
            Effect::BeforeTool { .. } => {
                shared.state().abort(AbortCause::from_value(json!({"kind": "user"})).unwrap());
                Input::Raised(kerman::agent_loop::Raised::bare(kerman::agent_loop::RaisedKind::Error))
            }
            Effect::RunTools => {
                let mut plan = machine.take_plan().unwrap();
                h.with_ctx(|ctx| assert_eq!(plan.next(&ctx.sink(), true).unwrap(), Next::Done));
                Input::ToolsDone(plan)
            }
            Effect::Finished => break,
            Effect::AwaitDecisions => panic!("an aborted step does not wait"),
            _ => Input::Continue,
        };
        effect = h.with_ctx(|ctx| machine.resume(ctx, input));
    }
    // The round's requests are written once every call is gated: one cut short by an abort
    // logs no request, so nothing is left to cancel.
    assert!(h.of("decision/requested").is_empty());
    assert!(h.of("decision/resolved").is_empty());
    assert_eq!(h.results().len(), 2);
    assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "aborted");
}

/// A small deterministic generator (xorshift), so the property below needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).expect("below n, a usize")
    }
}

#[test]
fn property_any_mix_of_asks_and_decisions_in_any_order_keeps_the_invariants() {
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let n = 1 + rng.below(6);
        // Which calls ask; of the others, index 4 is denied by the gate and the rest run.
        let asks: Vec<bool> = (0..n).map(|_| rng.below(2) == 0).collect();
        let asks_for_gate = asks.clone();
        let gate: GateFn = Box::new(move |index, _, _| match (asks_for_gate[index], index) {
            (true, _) => Gate::Ask(Ask::default()),
            (false, 4) => Gate::Deny(None),
            _ => Gate::Run,
        });
        let calls: Vec<(String, String, String)> = (0..n).map(|i| (format!("c{i}"), "t".to_string(), format!(r#"{{"i":{i}}}"#))).collect();
        let refs: Vec<(&str, &str, &str)> = calls.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
        // What each call should run with: its own arguments unless a gate or a person says else.
        let mut expected: Vec<Option<String>> =
            calls.iter().enumerate().map(|(i, (_, _, args))| (!asks[i] && i != 4).then(|| args.clone())).collect();
        let h = Host::new(Some(gate)).reply(&refs);
        let effect = h.turn("go");
        let asked = asks.iter().filter(|a| **a).count();
        if asked == 0 {
            assert_eq!(effect, Effect::Finished, "seed {seed}");
        } else {
            assert_eq!(effect, Effect::AwaitDecisions, "seed {seed}");
            // The calls that need no decision ran, in call order, and have their results.
            let free: Vec<(String, String)> = calls
                .iter()
                .zip(&expected)
                .enumerate()
                .filter(|(i, _)| !asks[*i])
                .filter_map(|(_, ((id, _, _), args))| args.clone().map(|a| (id.clone(), a)))
                .collect();
            assert_eq!(*h.ran.borrow(), free, "seed {seed}: the calls that need no decision run while the step waits");
            assert_eq!(h.of("tool/result").len(), n - asked, "seed {seed}");
            let pending = decisions::pending(&h.log);
            assert_eq!(pending.len(), asked, "seed {seed}");
            let mut order: Vec<usize> = (0..asked).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            for (done, &k) in order.iter().enumerate() {
                let request = &pending[k];
                let key = format!("key-{k}");
                let (decision, runs) = match rng.below(3) {
                    0 => (Decide::Approve, Some(request.arguments.clone())),
                    1 => (Decide::Deny(Some("no".into())), None),
                    _ => (Decide::Edit(json!({"edited": k})), Some(format!(r#"{{"edited":{k}}}"#))),
                };
                expected[request.index] = runs;
                let decided = h.decide(&request.decision_id, decision.clone(), Some(&key)).unwrap();
                assert_eq!(decided.ready, done + 1 == asked, "seed {seed}");
                // The same key again is applied once; another key is refused.
                assert!(h.decide(&request.decision_id, decision, Some(&key)).unwrap().duplicate, "seed {seed}");
                assert_eq!(h.decide(&request.decision_id, Decide::Approve, Some("other")).unwrap_err().reason(), "resolved");
                if done + 1 < asked {
                    assert_eq!(h.resume(), None, "seed {seed}: the step resumes only once every request is resolved");
                }
            }
            assert_eq!(h.of("decision/resolved").len(), asked, "seed {seed}: each request resolved exactly once");
            assert_eq!(h.resume(), Some(Effect::Finished), "seed {seed}");
        }
        // Exactly the decided (or gated) arguments ran, each call at most once: the calls that
        // need no decision first, then the decided ones, each group in call order.
        let ran_as = |asked: bool| -> Vec<(String, String)> {
            calls
                .iter()
                .zip(&expected)
                .enumerate()
                .filter(|(i, _)| asks[*i] == asked)
                .filter_map(|(_, ((id, _, _), args))| args.clone().map(|a| (id.clone(), a)))
                .collect()
        };
        let want: Vec<(String, String)> = ran_as(false).into_iter().chain(ran_as(true)).collect();
        assert_eq!(*h.ran.borrow(), want, "seed {seed}");
        let in_order: Vec<String> = calls.iter().map(|(id, _, _)| id.clone()).collect();
        assert_eq!(h.history_result_ids(), in_order, "seed {seed}: the history has the results in call order");
        assert_eq!(*h.requests.borrow(), 2, "seed {seed}: the model is asked twice: the calls, then after the results");
        assert_eq!(h.of("tool/result").len(), n, "seed {seed}: every call has exactly one result");
        assert_eq!(h.of("turn/end")[0]["reason"]["kind"], "completed", "seed {seed}");
    }
}
