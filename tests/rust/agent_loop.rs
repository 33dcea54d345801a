//! The turn machine alone (`kerman::agent_loop`) against scripted inputs: the behaviours
//! `docs/loop.md` documents, each pinned by the effects the machine asked for and a snapshot of
//! the events the log holds afterwards (type and payload; message ids redacted as `<id>`).
//!
//! The scripted host ([`run`]) answers each effect with the next script item that names it.
//! Effects that need no decision (a flush, closing a stream, `turn_stopping` with no hook, a
//! report, an abort, a fence, a fresh signal) are answered `Continue` when the script has no item
//! for them; a core error to describe becomes an ordinary exception; a tool plan with no item is
//! run call by call in model order, each returning `"<name> ok"`.
// The helpers take their JSON by value so that each expected event reads as data at its call site.
#![allow(clippy::needless_pass_by_value)]

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use kerman::agent_loop::{
    close_open_turn, consumed_work, crash_closers, requeue_claimed, unentered_claims, AbortCause, AbortKind, Ctx, Decision, Effect,
    Failure, Input, Machine, Next, Outcome, Raised, RaisedKind, Reply, ReplyContent, Requested, RequeueError, Shared, Sink, ToolPlan,
    Transcript,
};
use kerman::event_log::file::{Durability, FileStore};
use kerman::event_log::{Event, MemoryStore, SessionLog, Store};
use kerman::inbox::{Inbox, Target};
use kerman::message::Message;
use serde_json::{json, Map, Value};

// ---- the world the machine works on ----------------------------------------------------------

struct World {
    store: Option<MemoryStore>,
    log: SessionLog,
    inbox: Inbox,
    shared: Shared,
    /// Registered tools: name → exclusive (`parallel=False`).
    tools: HashMap<String, bool>,
    max_parallel: usize,
    /// The history each request was built from (`source kind: text`), in request order.
    requests: RefCell<Vec<Vec<String>>>,
}

impl World {
    fn new() -> World {
        let store = MemoryStore::new().with_open_hook(crash_closers());
        let log = store.create(Some("s")).unwrap();
        World::over(Some(store), log)
    }

    /// A loop over `log`: a new inbox, the shared state a new `AgentLoop` restores from it.
    fn over(store: Option<MemoryStore>, log: SessionLog) -> World {
        let inbox = Inbox::new(log.clone(), None).unwrap();
        let shared = Shared::resume(&log);
        World { store, log, inbox, shared, tools: HashMap::new(), max_parallel: 10, requests: RefCell::default() }
    }

    /// The same log and inbox under a new loop (a new `AgentLoop` over it: fresh shared state).
    fn resumed(self) -> World {
        let shared = Shared::resume(&self.log);
        World { shared, requests: RefCell::default(), ..self }
    }

    fn tool(mut self, name: &str, exclusive: bool) -> World {
        self.tools.insert(name.into(), exclusive);
        self
    }

    fn max_parallel(mut self, n: usize) -> World {
        self.max_parallel = n;
        self
    }

    fn with_ctx<R>(&self, f: impl FnOnce(&Ctx<'_>) -> R) -> R {
        let lookup = |name: &str| self.tools.get(name).copied().map(kerman::agent_loop::ToolInfo::exclusive);
        let ctx =
            Ctx { log: &self.log, inbox: &self.inbox, shared: &self.shared, tools: &lookup, max_parallel: self.max_parallel, gated: false };
        f(&ctx)
    }

    fn sink(&self) -> Sink<'_> {
        Sink { log: &self.log, inbox: &self.inbox, history: &self.shared.history }
    }

    fn followup(&self, text: &str) -> Arc<Message> {
        let m = Arc::new(Message::user_text(text));
        self.inbox.append(Target::NextTurn, Arc::clone(&m)).unwrap();
        m
    }

    fn steer(&self, text: &str) -> Arc<Message> {
        let m = Arc::new(Message::user_text(text));
        self.inbox.append(Target::NextStep, Arc::clone(&m)).unwrap();
        m
    }

    /// `loop.cancel()` with the default cause.
    fn cancel(&self) {
        assert!(self.shared.state().abort(cause(json!({"kind": "user"}))));
    }

    fn aborted(&self) -> bool {
        self.shared.state().abort.is_some()
    }

    fn events(&self) -> Vec<Event> {
        self.log.range(0, None)
    }
}

// ---- the script -------------------------------------------------------------------------------

type Answer = Box<dyn FnOnce(&World, &Effect) -> Input>;
type DriveTools = Box<dyn FnOnce(&World, &mut ToolPlan)>;
type Die = Box<dyn FnOnce(&World, &mut Machine)>;
type Meanwhile = Box<dyn FnOnce(&World)>;

enum Act {
    /// Answer the effect.
    Answer(Answer),
    /// `RunTools`: drive the machine's plan, then answer `ToolsDone`.
    Tools(DriveTools),
    /// The process dies here: the run stops without an answer.
    Crash(Die),
}

/// One script item: the effect it answers, what happens meanwhile, and the answer.
struct Ans {
    on: &'static str,
    meanwhile: Vec<Meanwhile>,
    act: Act,
}

impl Ans {
    /// While the effect is awaited (before the answer), `f` happens (a steer, a cancel, ...).
    fn meanwhile(mut self, f: impl FnOnce(&World) + 'static) -> Ans {
        self.meanwhile.push(Box::new(f));
        self
    }
}

fn answer(on: &'static str, f: impl FnOnce(&World, &Effect) -> Input + 'static) -> Ans {
    Ans { on, meanwhile: Vec::new(), act: Act::Answer(Box::new(f)) }
}

/// `pre_step`'s default: `Enter(step.messages)`.
fn enter() -> Ans {
    answer("PreStep", |_, effect| match effect {
        Effect::PreStep { batch } => Input::Decided(Decision::Enter(batch.clone())),
        _ => unreachable!(),
    })
}

fn enter_with(messages: Vec<Arc<Message>>) -> Ans {
    answer("PreStep", move |_, _| Input::Decided(Decision::Enter(messages)))
}

fn reject(reason: Option<&str>) -> Ans {
    let reason = reason.map(str::to_owned);
    answer("PreStep", move |_, _| Input::Decided(Decision::Reject(reason)))
}

/// `before_request` leaves a request with these options.
fn request(options: Value) -> Ans {
    answer("BeforeRequest", move |_, _| {
        Input::Requested(Requested::Request { options: Ok(options.to_string()), canonical: canonical(&options), instructions: None })
    })
}

fn reply(content: Vec<Value>) -> Ans {
    answer("CallModel", move |_, _| Input::Reply(Reply { content: ReplyContent::Blocks(content), usage: None, max_tokens: false }))
}

fn reply_text(text: &str) -> Ans {
    reply(vec![block(text)])
}

fn reply_max_tokens(content: Vec<Value>) -> Ans {
    answer("CallModel", move |_, _| Input::Reply(Reply { content: ReplyContent::Blocks(content), usage: None, max_tokens: true }))
}

/// `before_request` leaves a request with no options and these instructions.
fn request_instructed(instructions: Option<&str>) -> Ans {
    let instructions = instructions.map(str::to_owned);
    answer("BeforeRequest", move |_, _| {
        Input::Requested(Requested::Request { options: Ok("{}".into()), canonical: "{}".into(), instructions })
    })
}

/// A reply of only tool calls, given as its calls (the binding's shortcut for that shape).
fn reply_calls(calls: &[(&str, &str, &str)], max_tokens: bool) -> Ans {
    let calls = calls.iter().map(|(id, name, arguments)| (id.to_string(), name.to_string(), arguments.to_string())).collect();
    answer("CallModel", move |_, _| Input::Reply(Reply { content: ReplyContent::Calls(calls), usage: None, max_tokens }))
}

fn stream() -> Ans {
    answer("CallModel", |_, _| Input::Streaming)
}

fn chunk(chunk: Value) -> Ans {
    let Value::Object(map) = chunk else { panic!("a chunk is an object") };
    answer("NextChunk", move |_, _| Input::Chunk(map))
}

fn stream_end() -> Ans {
    answer("NextChunk", |_, _| Input::StreamEnded)
}

/// A failure as the host builds it, from its JSON.
fn failure_of(value: Value) -> Failure {
    serde_json::from_value(value).expect("a failure is an object")
}

/// An abort cause, from its JSON.
fn cause(value: Value) -> AbortCause {
    AbortCause::from_value(value).expect("a cause is an object with a kind")
}

fn model_fails(failure: Value) -> Ans {
    let failure = failure_of(failure);
    answer("CallModel", move |_, _| Input::ModelFailed(failure.clone()))
}

fn retry(again: bool) -> Ans {
    answer("RequestError", move |_, _| Input::Retry(again))
}

/// The host code the effect awaited raised.
fn raise(on: &'static str, kind: RaisedKind, failure: Value) -> Ans {
    let failure = failure_of(failure);
    answer(on, move |_, _| Input::Raised(Raised::new(kind, failure.clone())))
}

/// The awaited call got the `CancelledError` of the loop's own cancel.
fn cancelled(on: &'static str) -> Ans {
    raise(on, RaisedKind::Cancelled, json!({"message": "", "code": "UNKNOWN"}))
}

fn proceed(on: &'static str) -> Ans {
    answer(on, |_, _| Input::Continue)
}

fn tools(f: impl FnOnce(&World, &mut ToolPlan) + 'static) -> Ans {
    Ans { on: "RunTools", meanwhile: Vec::new(), act: Act::Tools(Box::new(f)) }
}

fn crash(on: &'static str, f: impl FnOnce(&World, &mut Machine) + 'static) -> Ans {
    Ans { on, meanwhile: Vec::new(), act: Act::Crash(Box::new(f)) }
}

// ---- the host ---------------------------------------------------------------------------------

struct Run {
    effects: Vec<String>,
    machine: Machine,
}

/// One driver run over `w`, answering from `script`; every script item must be used.
fn run(w: &World, script: Vec<Ans>) -> Run {
    let mut script: VecDeque<Ans> = script.into();
    w.shared.state().reset_run();
    let (mut machine, first) = w.with_ctx(Machine::begin);
    let mut effect = match first {
        Some(effect) => effect,
        None => w.with_ctx(|ctx| machine.resume(ctx, Input::Continue)),
    };
    let mut effects = Vec::new();
    loop {
        if matches!(effect, Effect::BeforeRequest) {
            let history = w.shared.history.since(0).iter().map(|m| format!("{}: {}", m.source_kind(), m.text())).collect();
            w.requests.borrow_mut().push(history);
        }
        effects.push(label(&effect, &machine));
        if matches!(effect, Effect::Finished | Effect::NoTurn) {
            break;
        }
        let input = if script.front().is_some_and(|ans| ans.on == name(&effect)) {
            let ans = script.pop_front().unwrap();
            for f in ans.meanwhile {
                f(w);
            }
            match ans.act {
                Act::Answer(f) => f(w, &effect),
                Act::Tools(f) => {
                    let mut plan = machine.take_plan().expect("RunTools comes with a plan");
                    f(w, &mut plan);
                    Input::ToolsDone(plan)
                }
                Act::Crash(f) => {
                    f(w, &mut machine);
                    assert!(script.is_empty(), "script items after the crash: {:?}", script.iter().map(|a| a.on).collect::<Vec<_>>());
                    return Run { effects, machine };
                }
            }
        } else {
            match &effect {
                Effect::Flush
                | Effect::CloseStream
                | Effect::TurnStopping
                | Effect::Report { .. }
                | Effect::Abort(_)
                | Effect::Fence { .. }
                | Effect::NewTurn => Input::Continue,
                Effect::Describe(e) => {
                    Input::Raised(Raised::new(RaisedKind::Error, failure_of(json!({"message": e.to_string(), "code": "UNKNOWN"}))))
                }
                Effect::RunTools => {
                    let mut plan = machine.take_plan().expect("RunTools comes with a plan");
                    run_in_order(w, &mut plan);
                    Input::ToolsDone(plan)
                }
                other => panic!(
                    "the machine asked for {} but the script has {:?}; effects so far: {effects:?}",
                    name(other),
                    script.front().map(|a| a.on)
                ),
            }
        };
        effect = w.with_ctx(|ctx| machine.resume(ctx, input));
    }
    assert!(script.is_empty(), "script items left unused: {:?}; effects: {effects:?}", script.iter().map(|a| a.on).collect::<Vec<_>>());
    Run { effects, machine }
}

/// Runs the plan's calls one by one, each returning `"<name> ok"`.
fn run_in_order(w: &World, plan: &mut ToolPlan) {
    let sink = w.sink();
    loop {
        match plan.next(&sink, w.aborted()).unwrap() {
            Next::Start(i) => {
                let text = format!("{} ok", plan.call(i).name);
                plan.finish(&sink, i, Outcome::text(text)).unwrap();
            }
            Next::Wait => panic!("nothing is running"),
            Next::Done => break,
        }
    }
}

fn name(effect: &Effect) -> &'static str {
    match effect {
        Effect::PreStep { .. } => "PreStep",
        Effect::BeforeRequest => "BeforeRequest",
        Effect::Flush => "Flush",
        Effect::CallModel => "CallModel",
        Effect::NextChunk => "NextChunk",
        Effect::CloseStream => "CloseStream",
        Effect::RequestError { .. } => "RequestError",
        Effect::RunTools => "RunTools",
        Effect::BeforeTool { .. } => "BeforeTool",
        Effect::AwaitDecisions => "AwaitDecisions",
        Effect::TurnStopping => "TurnStopping",
        Effect::Describe(_) => "Describe",
        Effect::Report { .. } => "Report",
        Effect::Abort(_) => "Abort",
        Effect::Fence { .. } => "Fence",
        Effect::NewTurn => "NewTurn",
        Effect::NoTurn => "NoTurn",
        Effect::Finished => "Finished",
    }
}

fn texts(messages: &[Arc<Message>]) -> String {
    messages.iter().map(|m| m.text()).collect::<Vec<_>>().join(", ")
}

fn label(effect: &Effect, machine: &Machine) -> String {
    match effect {
        Effect::PreStep { batch } => format!("PreStep[{}]", texts(batch)),
        Effect::BeforeRequest => format!("BeforeRequest[{}]", texts(machine.entered())),
        Effect::RequestError { failure, .. } => format!("RequestError {}", failure.to_value()),
        Effect::Describe(e) => format!("Describe({e})"),
        Effect::Report { turn, step, failure, exception } => {
            format!("Report({turn}, {step}, exception={exception}) {}", failure.as_ref().map_or(Value::Null, Failure::to_value))
        }
        Effect::Abort(cause) => format!("Abort {}", cause.to_value()),
        Effect::Fence { turn, failure, cause } => {
            assert_eq!(cause.kind(), AbortKind::Fenced, "a fence aborts with cause fenced");
            format!("Fence({turn}) {}", failure.to_value())
        }
        other => name(other).to_owned(),
    }
}

/// Options as canonical JSON (keys sorted), as the binding compares them.
fn canonical(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect::<Map<_, _>>())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

// ---- snapshots --------------------------------------------------------------------------------

/// Message ids (the `id` of any object with a `role`) become `<id>`.
fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.contains_key("role") {
                if let Some(id) = map.get_mut("id") {
                    *id = Value::String("<id>".into());
                }
            }
            map.values_mut().for_each(redact);
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

fn line(event: &Event) -> String {
    let mut data = event.data();
    redact(&mut data);
    format!("{} {data}", event.kind())
}

fn snapshot(log: &SessionLog) -> Vec<String> {
    log.range(0, None).iter().map(line).collect()
}

fn snapshot_from(log: &SessionLog, start: u64) -> Vec<String> {
    log.range(start, None).iter().map(line).collect()
}

/// The seqs a surface event cites.
fn cites(log: &SessionLog, seq: u64) -> Option<Vec<u64>> {
    log.range(seq, Some(seq + 1))[0].surface().and_then(|s| s.source_event_seqs.clone())
}

fn seqs_of(log: &SessionLog, kind: &str) -> Vec<u64> {
    log.range(0, None).iter().filter(|e| e.kind() == kind).map(|e| e.seq).collect()
}

fn ev(kind: &str, data: Value) -> String {
    format!("{kind} {data}")
}

fn block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"type": "tool-call", "id": id, "name": name, "arguments": arguments})
}

fn user(text: &str) -> Value {
    json!({"id": "<id>", "role": "user", "content": [block(text)], "source": {"kind": "user"}})
}

fn assistant(content: Vec<Value>) -> Value {
    json!({"id": "<id>", "role": "assistant", "content": content, "source": {"kind": "model"}})
}

fn result(call_id: &str, text: &str) -> Value {
    json!({"id": "<id>", "role": "user", "content": [{"type": "tool-result", "toolCallId": call_id, "content": [block(text)]}],
           "source": {"kind": "tool", "callId": call_id}})
}

fn error_result(call_id: &str, text: &str) -> Value {
    json!({"id": "<id>", "role": "user", "content": [{"type": "tool-result", "toolCallId": call_id, "content": [block(text)], "isError": true}],
           "source": {"kind": "tool", "callId": call_id}})
}

fn inserted(target: &str, messages: Vec<Value>) -> String {
    ev("agent/inbox/spliced", json!({"target": target, "start": 0, "inserted": messages}))
}

fn claimed(target: &str, count: u64) -> String {
    ev("agent/inbox/spliced", json!({"target": target, "start": 0, "removedCount": count, "inserted": []}))
}

fn turn_start(turn: u64) -> String {
    ev("turn/start", json!({"turn": turn}))
}

fn turn_end(turn: u64, reason: Value) -> String {
    ev("turn/end", json!({"turn": turn, "reason": reason}))
}

fn step_start(turn: u64, step: u64) -> String {
    ev("step/start", json!({"turn": turn, "step": step}))
}

fn step_end(turn: u64, step: u64) -> String {
    ev("step/end", json!({"turn": turn, "step": step}))
}

fn user_message(text: &str) -> String {
    ev("user/message", user(text))
}

fn header(options: Value) -> String {
    ev("request/header", json!({"options": options}))
}

fn assistant_message(turn: u64, step: u64, content: Vec<Value>) -> String {
    ev("assistant/message", json!({"turn": turn, "step": step, "message": assistant(content)}))
}

fn tool_call(turn: u64, step: u64, id: &str, name: &str, arguments: &str) -> String {
    ev("tool/call", json!({"turn": turn, "step": step, "callId": id, "name": name, "arguments": arguments}))
}

fn tool_result(turn: u64, step: u64, call_id: &str, text: &str) -> String {
    ev("tool/result", json!({"turn": turn, "step": step, "message": result(call_id, text)}))
}

fn concluding_result(turn: u64, step: u64, call_id: &str, text: &str) -> String {
    ev("tool/result", json!({"turn": turn, "step": step, "message": result(call_id, text), "concludesTurn": true}))
}

fn tool_error(turn: u64, step: u64, call_id: &str, text: &str, name: &str, code: &str) -> String {
    ev("tool/result", json!({"turn": turn, "step": step, "message": error_result(call_id, text), "error": {"name": name, "code": code}}))
}

fn completed() -> Value {
    json!({"kind": "completed"})
}

fn aborted_by_user() -> Value {
    json!({"kind": "aborted", "reason": {"kind": "user"}})
}

const ABORTED_BEFORE: &str = "Error: tool call aborted before dispatch";
const ABORTED_DURING: &str = "Error: tool call aborted during dispatch";

// ---- a turn -----------------------------------------------------------------------------------

#[test]
fn a_normal_turn_logs_the_documented_sequence() {
    let w = World::new();
    let hello = w.followup("hello");
    let usage = r#"{"input":3,"output":4}"#.to_owned();
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            answer("CallModel", move |_, _| {
                Input::Reply(Reply { content: ReplyContent::Blocks(vec![block("you said: hello")]), usage: Some(usage), max_tokens: false })
            }),
        ],
    );
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "TurnStopping", "Finished"]);
    assert_eq!(
        snapshot(&w.log),
        [
            inserted("next-turn", vec![user("hello")]),
            turn_start(1),
            claimed("next-turn", 1),
            step_start(1, 1),
            user_message("hello"),
            header(json!({})),
            ev(
                "assistant/message",
                json!({"turn": 1, "step": 1, "message": assistant(vec![block("you said: hello")]), "usage": {"input": 3, "output": 4}})
            ),
            step_end(1, 1),
            turn_end(1, completed()),
        ]
    );
    // The claim moves the very message: the entered user/message keeps its id.
    assert_eq!(w.log.range(4, Some(5))[0].data()["id"], json!(hello.id()));
    assert_eq!(*w.requests.borrow(), [vec!["user: hello".to_owned()]]);
    let state = w.shared.state();
    assert_eq!((state.turn, state.step, state.requests), (1, 1, 1));
    assert!(r.machine.is_done() && !r.machine.propagates());
}

#[test]
fn a_completed_turn_runs_the_next_queued_turn_at_once() {
    let w = World::new();
    w.followup("first");
    w.followup("second");
    let r = run(&w, vec![enter(), request(json!({})), reply_text("one"), enter(), request(json!({})), reply_text("two")]);
    assert_eq!(
        r.effects,
        [
            "PreStep[first]", "BeforeRequest[first]", "CallModel", "TurnStopping", "NewTurn", "PreStep[second]", "BeforeRequest[second]",
            "CallModel", "TurnStopping", "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 2),
        [
            turn_start(1),
            claimed("next-turn", 1),
            step_start(1, 1),
            user_message("first"),
            header(json!({})),
            assistant_message(1, 1, vec![block("one")]),
            step_end(1, 1),
            turn_end(1, completed()),
            turn_start(2),
            claimed("next-turn", 1),
            step_start(2, 1),
            user_message("second"),
            // same options: no second request/header
            assistant_message(2, 1, vec![block("two")]),
            step_end(2, 1),
            turn_end(2, completed()),
        ]
    );
    // The second request carries the whole history.
    assert_eq!(w.requests.borrow()[1], ["user: first", "model: one", "user: second"]);
}

#[test]
fn the_first_claim_takes_all_of_next_step_then_the_head_of_next_turn() {
    let w = World::new();
    w.followup("t1");
    w.followup("t2");
    w.steer("s1");
    w.steer("s2");
    let r = run(&w, vec![reject(None)]);
    assert_eq!(r.effects, ["PreStep[s1, s2, t1]", "Finished"]);
    assert_eq!(
        snapshot_from(&w.log, 4),
        [turn_start(1), claimed("next-step", 2), claimed("next-turn", 1), turn_end(1, json!({"kind": "blocked"}))]
    );
    assert_eq!(texts(&w.inbox.list(Target::NextTurn)), "t2");
}

#[test]
fn a_steer_on_an_idle_loop_starts_a_turn_whose_batch_is_the_steer() {
    let w = World::new();
    w.steer("correction");
    let r = run(&w, vec![enter(), request(json!({})), reply_text("ok")]);
    assert_eq!(r.effects, ["PreStep[correction]", "BeforeRequest[correction]", "CallModel", "TurnStopping", "Finished"]);
    assert_eq!(snapshot_from(&w.log, 1)[..4], [turn_start(1), claimed("next-step", 1), step_start(1, 1), user_message("correction")]);
}

// ---- the pre-step decision --------------------------------------------------------------------

#[test]
fn reject_with_a_reason_ends_the_turn_blocked_and_the_loop_goes_idle() {
    let w = World::new();
    w.followup("rm -rf /");
    w.followup("later");
    let r = run(&w, vec![reject(Some("destructive command needs a human"))]);
    assert_eq!(r.effects, ["PreStep[rm -rf /]", "Finished"]);
    assert_eq!(
        snapshot_from(&w.log, 2),
        [turn_start(1), claimed("next-turn", 1), turn_end(1, json!({"kind": "blocked", "reason": "destructive command needs a human"}))]
    );
    // Nothing reached the model, and the pending input does not start a turn by itself.
    assert!(w.requests.borrow().is_empty());
    assert_eq!(texts(&w.inbox.list(Target::NextTurn)), "later");
}

#[test]
fn reject_without_a_reason_has_no_reason_key() {
    let w = World::new();
    w.followup("hello");
    let r = run(&w, vec![reject(None)]);
    assert_eq!(r.effects, ["PreStep[hello]", "Finished"]);
    assert_eq!(snapshot_from(&w.log, 1), [turn_start(1), claimed("next-turn", 1), turn_end(1, json!({"kind": "blocked"}))]);
}

#[test]
fn enter_with_other_messages_enters_them_in_that_order() {
    let w = World::new();
    let draft = w.followup("draft");
    let note = Arc::new(Message::user(vec![block("cwd is /srv")], Some(source("plugin", "workspace")), None).unwrap());
    w.inbox.append(Target::NextStep, Arc::clone(&note)).unwrap();
    let rewritten = Arc::new(draft.with_content(vec![block("final draft")]).unwrap());
    let context = Arc::new(Message::user(vec![block("Context: cwd is /srv")], Some(source("plugin", "context")), None).unwrap());
    let r = run(&w, vec![enter_with(vec![Arc::clone(&rewritten), Arc::clone(&context)]), request(json!({})), reply_text("ok")]);
    assert_eq!(
        r.effects,
        ["PreStep[cwd is /srv, draft]", "BeforeRequest[final draft, Context: cwd is /srv]", "CallModel", "TurnStopping", "Finished"]
    );
    let plugin = |text: &str, name: &str| json!({"id": "<id>", "role": "user", "content": [block(text)], "source": {"kind": "plugin", "plugin": name}});
    assert_eq!(
        snapshot_from(&w.log, 2),
        [
            turn_start(1),
            claimed("next-step", 1),
            claimed("next-turn", 1),
            step_start(1, 1),
            user_message("final draft"),
            ev("user/message", plugin("Context: cwd is /srv", "context")),
            header(json!({})),
            assistant_message(1, 1, vec![block("ok")]),
            step_end(1, 1),
            turn_end(1, completed()),
        ]
    );
    // The rewrite keeps the claimed message's id; the dropped note is gone from the queue.
    let entered: Vec<Value> = w.events().iter().filter(|e| e.kind() == "user/message").map(|e| e.data()["id"].clone()).collect();
    assert_eq!(entered, [json!(draft.id()), json!(context.id())]);
    assert_eq!(w.inbox.len(), 0);
    assert_eq!(*w.requests.borrow(), [vec!["user: final draft".to_owned(), "plugin: Context: cwd is /srv".to_owned()]]);
}

fn source(kind: &str, plugin: &str) -> Map<String, Value> {
    let Value::Object(map) = json!({"kind": kind, "plugin": plugin}) else { unreachable!() };
    map
}

#[test]
fn an_empty_entry_on_the_first_step_completes_the_turn_with_no_step_and_goes_idle() {
    let w = World::new();
    w.followup("a");
    w.followup("b");
    let r = run(&w, vec![enter_with(Vec::new())]);
    assert_eq!(r.effects, ["PreStep[a]", "Finished"]);
    assert_eq!(snapshot_from(&w.log, 2), [turn_start(1), claimed("next-turn", 1), turn_end(1, completed())]);
    assert_eq!(texts(&w.inbox.list(Target::NextTurn)), "b");
}

// ---- steering ---------------------------------------------------------------------------------

#[test]
fn input_steered_during_pre_step_waits_for_the_next_boundary_and_takes_a_step() {
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter().meanwhile(|w| {
                w.steer("also this");
            }),
            request(json!({})),
            reply_text("ok"),
            enter(),
            request(json!({})),
            reply_text("ok again"),
        ],
    );
    // No turn_stopping after step 1: next-step input was pending.
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "PreStep[also this]", "BeforeRequest[also this]", "CallModel",
            "TurnStopping", "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 1),
        [
            turn_start(1),
            claimed("next-turn", 1),
            inserted("next-step", vec![user("also this")]),
            step_start(1, 1),
            user_message("hello"),
            header(json!({})),
            assistant_message(1, 1, vec![block("ok")]),
            step_end(1, 1),
            claimed("next-step", 1),
            step_start(1, 2),
            user_message("also this"),
            assistant_message(1, 2, vec![block("ok again")]),
            step_end(1, 2),
            turn_end(1, completed()),
        ]
    );
    assert_eq!(w.requests.borrow()[1], ["user: hello", "model: ok", "user: also this"]);
}

#[test]
fn a_steer_during_the_tools_enters_right_after_their_results() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", "{}")]),
            tools(|w, plan| {
                let sink = w.sink();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
                w.steer("use staging");
                plan.finish(&sink, 0, Outcome::text("done")).unwrap();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
            }),
            enter(),
            request(json!({})),
            reply_text("ok"),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "RunTools", "PreStep[use staging]", "BeforeRequest[use staging]",
            "CallModel", "TurnStopping", "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 6),
        [
            assistant_message(1, 1, vec![call("c1", "t", "{}")]),
            tool_call(1, 1, "c1", "t", "{}"),
            inserted("next-step", vec![user("use staging")]),
            tool_result(1, 1, "c1", "done"),
            step_end(1, 1),
            claimed("next-step", 1),
            step_start(1, 2),
            user_message("use staging"),
            assistant_message(1, 2, vec![block("ok")]),
            step_end(1, 2),
            turn_end(1, completed()),
        ]
    );
    assert_eq!(w.requests.borrow()[1], ["user: hello", "model: ", "tool: done", "user: use staging"]);
}

#[test]
fn a_turn_stopping_hook_that_steers_takes_another_step() {
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply_text("ok"),
            proceed("TurnStopping").meanwhile(|w| {
                w.steer("keep going");
            }),
            enter(),
            request(json!({})),
            reply_text("went on"),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "TurnStopping", "PreStep[keep going]", "BeforeRequest[keep going]",
            "CallModel", "TurnStopping", "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 7),
        [
            step_end(1, 1),
            inserted("next-step", vec![user("keep going")]),
            claimed("next-step", 1),
            step_start(1, 2),
            user_message("keep going"),
            assistant_message(1, 2, vec![block("went on")]),
            step_end(1, 2),
            turn_end(1, completed()),
        ]
    );
}

// ---- tools ------------------------------------------------------------------------------------

#[test]
fn the_tool_pool_has_barriers_and_commits_results_in_model_order() {
    let w = World::new().tool("read", false).tool("deploy", true).max_parallel(2);
    w.followup("go");
    let calls = vec![
        call("c1", "read", r#"{"p":"a"}"#),
        call("c2", "read", r#"{"p":"b"}"#),
        call("c3", "deploy", "{}"),
        call("c4", "read", r#"{"p":"c"}"#),
    ];
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(calls.clone()),
            tools(|w, plan| {
                let sink = w.sink();
                let tail = |from: u64| snapshot_from(&w.log, from);
                let start = w.log.len();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(1));
                // The pool is full.
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Wait);
                assert_eq!(tail(start), [tool_call(1, 1, "c1", "read", r#"{"p":"a"}"#), tool_call(1, 1, "c2", "read", r#"{"p":"b"}"#)]);
                // c2 finishes first: its result waits for c1's.
                let mark = w.log.len();
                plan.finish(&sink, 1, Outcome::text("B")).unwrap();
                assert_eq!(w.log.len(), mark);
                // A slot is free, but c3 is a barrier: it waits for the running c1.
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Wait);
                assert_eq!(w.log.len(), mark);
                plan.finish(&sink, 0, Outcome::text("A")).unwrap();
                assert_eq!(tail(mark), [tool_result(1, 1, "c1", "A"), tool_result(1, 1, "c2", "B")]);
                // c3 runs alone: c4 waits although the pool has room.
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(2));
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Wait);
                assert_eq!(plan.running(), 1);
                plan.finish(&sink, 2, Outcome::text("deployed")).unwrap();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(3));
                plan.finish(&sink, 3, Outcome::text("C")).unwrap();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
            }),
            enter(),
            request(json!({})),
            reply_text("all done"),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[go]", "BeforeRequest[go]", "CallModel", "RunTools", "PreStep[]", "BeforeRequest[]", "CallModel", "TurnStopping",
            "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 6),
        [
            assistant_message(1, 1, calls),
            tool_call(1, 1, "c1", "read", r#"{"p":"a"}"#),
            tool_call(1, 1, "c2", "read", r#"{"p":"b"}"#),
            tool_result(1, 1, "c1", "A"),
            tool_result(1, 1, "c2", "B"),
            tool_call(1, 1, "c3", "deploy", "{}"),
            tool_result(1, 1, "c3", "deployed"),
            tool_call(1, 1, "c4", "read", r#"{"p":"c"}"#),
            tool_result(1, 1, "c4", "C"),
            step_end(1, 1),
            // a tool continuation: the pre_step waterfall still runs, over an empty batch
            step_start(1, 2),
            assistant_message(1, 2, vec![block("all done")]),
            step_end(1, 2),
            turn_end(1, completed()),
        ]
    );
    // Each result cites its tool/call.
    let calls = seqs_of(&w.log, "tool/call");
    let results = seqs_of(&w.log, "tool/result");
    for (call, result) in calls.iter().zip(&results) {
        assert_eq!(cites(&w.log, *result), Some(vec![*call]));
    }
    assert_eq!(w.requests.borrow()[1], ["user: go", "model: ", "tool: A", "tool: B", "tool: deployed", "tool: C"]);
}

#[test]
fn a_reply_given_as_its_calls_logs_what_the_same_blocks_log() {
    let calls = [("c1", "read", r#"{"p":"a"}"#), ("c2", "read", "{\"p\":\"\u{e9}\\n\"}")];
    let blocks: Vec<Value> = calls.iter().map(|(id, name, arguments)| call(id, name, arguments)).collect();
    let outcomes = |calls: Ans, blocks: Ans, tools_run: bool| {
        let (a, b) = (World::new().tool("read", false), World::new().tool("read", false));
        for (w, reply) in [(&a, calls), (&b, blocks)] {
            w.followup("go");
            let mut script = vec![enter(), request(json!({})), reply];
            if tools_run {
                script.extend([enter(), request(json!({})), reply_text("done")]);
            }
            let r = run(w, script);
            assert!(r.effects.last().is_some_and(|e| e == "Finished"), "{:?}", r.effects);
        }
        let (ra, rb) = (a.requests.borrow().clone(), b.requests.borrow().clone());
        (snapshot(&a.log), snapshot(&b.log), ra, rb)
    };
    let (as_calls, as_blocks, requests_calls, requests_blocks) = outcomes(reply_calls(&calls, false), reply(blocks.clone()), true);
    assert_eq!(as_calls, as_blocks);
    assert_eq!(requests_calls, requests_blocks);
    assert!(as_calls.contains(&assistant_message(1, 1, blocks.clone())), "{as_calls:#?}");
    // At the token limit the calls are dropped, as from blocks.
    let (as_calls, as_blocks, ..) = outcomes(reply_calls(&calls, true), reply_max_tokens(blocks), false);
    assert_eq!(as_calls, as_blocks);
    // A repeated id fails the turn before anything of the reply is logged, as from blocks.
    let repeated = [("c1", "read", "{}"), ("c1", "read", "{}")];
    let (a, b) = (World::new().tool("read", false), World::new().tool("read", false));
    a.followup("go");
    b.followup("go");
    let ra = run(&a, vec![enter(), request(json!({})), reply_calls(&repeated, false)]);
    let rb = run(&b, vec![enter(), request(json!({})), reply(repeated.iter().map(|(i, n, g)| call(i, n, g)).collect())]);
    assert_eq!(ra.effects, rb.effects);
    assert_eq!(snapshot(&a.log), snapshot(&b.log));
    assert!(ra.effects.iter().any(|e| e.contains("INVALID_REPLY")), "{:?}", ra.effects);
}

#[test]
fn an_exclusive_call_first_makes_the_later_ones_wait() {
    let log = MemoryStore::new().create(None).unwrap();
    let w = World::over(None, log);
    let sink = w.sink();
    let mk = |id: &str, exclusive: bool| kerman::agent_loop::Call {
        id: id.into(),
        name: "t".into(),
        arguments: "{}".into(),
        known: true,
        info: kerman::agent_loop::ToolInfo::exclusive(exclusive),
    };
    let mut plan = ToolPlan::new(1, 1, vec![mk("c1", true), mk("c2", false), mk("c3", false)], 4);
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Wait);
    plan.finish(&sink, 0, Outcome::text("x")).unwrap();
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(1));
    assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(2));
    assert_eq!(plan.running(), 2);
    // max_parallel 1 is serial.
    let mut serial = ToolPlan::new(1, 1, vec![mk("d1", false), mk("d2", false)], 1);
    assert_eq!(serial.next(&sink, false).unwrap(), Next::Start(0));
    assert_eq!(serial.next(&sink, false).unwrap(), Next::Wait);
}

#[test]
fn an_unknown_tool_gets_an_error_result_and_the_turn_continues() {
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "nope", "{}")]),
            tools(|w, plan| {
                // Nothing to run: the call is logged and answered at once.
                assert_eq!(plan.next(&w.sink(), false).unwrap(), Next::Done);
            }),
            enter(),
            request(json!({})),
            reply_text("sorry"),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "RunTools", "PreStep[]", "BeforeRequest[]", "CallModel", "TurnStopping",
            "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 6),
        [
            assistant_message(1, 1, vec![call("c1", "nope", "{}")]),
            tool_call(1, 1, "c1", "nope", "{}"),
            tool_error(1, 1, "c1", "unknown tool 'nope'", "UnknownToolError", "UNKNOWN_TOOL"),
            step_end(1, 1),
            step_start(1, 2),
            assistant_message(1, 2, vec![block("sorry")]),
            step_end(1, 2),
            turn_end(1, completed()),
        ]
    );
}

#[test]
fn a_result_that_concludes_the_turn_ends_it_without_another_request() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", "{}")]),
            tools(|w, plan| {
                let sink = w.sink();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
                plan.finish(&sink, 0, Outcome { concludes: true, ..Outcome::text("final") }).unwrap();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
            }),
        ],
    );
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "RunTools", "TurnStopping", "Finished"]);
    assert_eq!(snapshot_from(&w.log, 8), [concluding_result(1, 1, "c1", "final"), step_end(1, 1), turn_end(1, completed())]);
}

#[test]
fn a_concluding_result_with_contexts_takes_another_step_for_them() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    let context = Arc::new(Message::user(vec![block("file changed")], Some(source("plugin", "tool:t")), None).unwrap());
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", "{}")]),
            tools(move |w, plan| {
                let sink = w.sink();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
                plan.finish(&sink, 0, Outcome { concludes: true, contexts: vec![context], ..Outcome::text("final") }).unwrap();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
            }),
            enter(),
            request(json!({})),
            reply_text("noted"),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "RunTools", "PreStep[file changed]", "BeforeRequest[file changed]",
            "CallModel", "TurnStopping", "Finished"
        ]
    );
    let ctx = json!({"id": "<id>", "role": "user", "content": [block("file changed")], "source": {"kind": "plugin", "plugin": "tool:t"}});
    assert_eq!(
        snapshot_from(&w.log, 8),
        [
            concluding_result(1, 1, "c1", "final"),
            inserted("next-step", vec![ctx.clone()]),
            step_end(1, 1),
            claimed("next-step", 1),
            step_start(1, 2),
            ev("user/message", ctx),
            assistant_message(1, 2, vec![block("noted")]),
            step_end(1, 2),
            turn_end(1, completed()),
        ]
    );
}

// ---- cancellation -----------------------------------------------------------------------------

/// Cancelled while the machine awaited `script[at]`'s effect: the script up to it, the effects,
/// and what the log holds after the claim.
fn cancelled_at(script: Vec<Ans>, effects: &[&str], after_claim: Vec<String>) {
    let w = World::new().tool("t", false);
    w.followup("hello");
    w.followup("later");
    let r = run(&w, script);
    assert_eq!(r.effects, effects);
    let mut expected = vec![turn_start(1), claimed("next-turn", 1)];
    expected.extend(after_claim);
    expected.push(turn_end(1, aborted_by_user()));
    assert_eq!(snapshot_from(&w.log, 2), expected);
    // An aborted turn reports nothing and the loop goes idle although input is pending.
    assert!(!r.effects.iter().any(|e| e.starts_with("Report")));
    assert_eq!(texts(&w.inbox.list(Target::NextTurn)), "later");
    assert!(!r.machine.propagates());
}

fn cancel() -> impl FnOnce(&World) {
    |w: &World| w.cancel()
}

#[test]
fn cancelled_while_pre_step_runs() {
    cancelled_at(vec![cancelled("PreStep").meanwhile(cancel())], &["PreStep[hello]", "Finished"], vec![]);
}

#[test]
fn cancelled_from_inside_pre_step_which_then_enters() {
    // The listener returns normally after cancel(): nothing is entered.
    cancelled_at(vec![enter().meanwhile(cancel())], &["PreStep[hello]", "Finished"], vec![]);
}

#[test]
fn cancelled_while_before_request_runs() {
    cancelled_at(
        vec![enter(), cancelled("BeforeRequest").meanwhile(cancel())],
        &["PreStep[hello]", "BeforeRequest[hello]", "Finished"],
        vec![step_start(1, 1), user_message("hello"), step_end(1, 1)],
    );
}

/// The record of a request a cancellation cut before anything visible of it was logged: the
/// loop's `cancelled` finish (the request was made, so it is counted once; no message, CAN-22).
fn cut_before_its_first_chunk(turn: u64, step: u64) -> String {
    ev("assistant/chunk", json!({"turn": turn, "step": step, "chunk": {"type": "finish", "reason": "cancelled"}}))
}

#[test]
fn cancelled_while_the_model_runs() {
    cancelled_at(
        vec![enter(), request(json!({})), cancelled("CallModel").meanwhile(cancel())],
        &["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "Finished"],
        vec![step_start(1, 1), user_message("hello"), header(json!({})), cut_before_its_first_chunk(1, 1), step_end(1, 1)],
    );
}

#[test]
fn cancelled_while_awaiting_a_chunk() {
    cancelled_at(
        vec![enter(), request(json!({})), stream(), cancelled("NextChunk").meanwhile(cancel())],
        &["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "NextChunk", "CloseStream", "Finished"],
        // nothing was visible: no assistant/message, the request ends with a cancelled finish
        vec![step_start(1, 1), user_message("hello"), header(json!({})), cut_before_its_first_chunk(1, 1), step_end(1, 1)],
    );
}

#[test]
fn cancelled_during_the_checkpoint_flush_before_the_call_made_no_request() {
    // The line: a request is made when the model is called; a cancel before that logs none.
    let dir = tempfile::tempdir().unwrap();
    let log = FileStore::new(dir.path().join("store"), Durability::Checkpoint).unwrap().create(Some("s")).unwrap();
    let w = World::over(None, log);
    w.followup("hello");
    let r = run(&w, vec![enter(), request(json!({})), proceed("Flush").meanwhile(cancel())]);
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "Flush", "Finished"]);
    assert!(seqs_of(&w.log, "assistant/message").is_empty());
}

#[test]
fn a_stream_cancelled_with_nothing_visible_ends_its_chunks_with_a_cancelled_finish() {
    let w = World::new();
    w.followup("hello");
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "usage", "input": 9})),
            cancelled("NextChunk").meanwhile(cancel()),
        ],
    );
    assert_eq!(
        snapshot_from(&w.log, 6)[..3],
        [
            ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "usage", "input": 9}})),
            cut_before_its_first_chunk(1, 1),
            step_end(1, 1)
        ]
    );
    assert!(seqs_of(&w.log, "assistant/message").is_empty());
}

#[test]
fn a_stream_cancelled_after_an_attempt_ended_ends_the_next_attempt_it_awaited() {
    // Usage marked partial ends an attempt, a failed request; the stream went on, so the chunk
    // awaited is another attempt's (a Fallback's next model), cut before its first chunk. The
    // ended attempt's text is not logged again as an interrupted message: it is counted once.
    let w = World::new();
    w.followup("hello");
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "par"})),
            chunk(json!({"type": "usage", "input": 9, "partial": true})),
            cancelled("NextChunk").meanwhile(cancel()),
        ],
    );
    let chunks = seqs_of(&w.log, "assistant/chunk");
    assert_eq!(snapshot_from(&w.log, chunks[2])[..1], [cut_before_its_first_chunk(1, 1)]);
    assert!(seqs_of(&w.log, "assistant/message").is_empty());
}

#[test]
fn cancelled_while_request_error_runs() {
    cancelled_at(
        vec![
            enter(),
            request(json!({})),
            model_fails(json!({"message": "overloaded", "code": "OVERLOADED"})),
            retry(true).meanwhile(cancel()),
        ],
        &[
            "PreStep[hello]",
            "BeforeRequest[hello]",
            "CallModel",
            r#"RequestError {"message":"overloaded","code":"OVERLOADED"}"#,
            "Finished",
        ],
        // the failed request is in the log before request_error runs
        vec![
            step_start(1, 1),
            user_message("hello"),
            header(json!({})),
            failed_finish(1, 1, json!({"message": "overloaded", "code": "OVERLOADED"})),
            step_end(1, 1),
        ],
    );
}

#[test]
fn cancelled_while_a_tool_runs_the_unstarted_calls_are_aborted_before_dispatch() {
    let w = World::new().tool("t", false).max_parallel(1);
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", "{}"), call("c2", "t", "{}")]),
            tools(|w, plan| {
                let sink = w.sink();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
                w.cancel();
                plan.finish(&sink, 0, Outcome::aborted_during()).unwrap();
                assert_eq!(plan.next(&sink, w.aborted()).unwrap(), Next::Done);
            }),
        ],
    );
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "RunTools", "Finished"]);
    assert_eq!(
        snapshot_from(&w.log, 7),
        [
            tool_call(1, 1, "c1", "t", "{}"),
            tool_error(1, 1, "c1", ABORTED_DURING, "CancelledError", "ABORTED_DURING_DISPATCH"),
            tool_call(1, 1, "c2", "t", "{}"),
            tool_error(1, 1, "c2", ABORTED_BEFORE, "AbortError", "ABORTED_BEFORE_DISPATCH"),
            step_end(1, 1),
            turn_end(1, aborted_by_user()),
        ]
    );
}

#[test]
fn cancelled_while_turn_stopping_runs() {
    cancelled_at(
        vec![enter(), request(json!({})), reply_text("ok"), proceed("TurnStopping").meanwhile(cancel())],
        &["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "TurnStopping", "Finished"],
        vec![step_start(1, 1), user_message("hello"), header(json!({})), assistant_message(1, 1, vec![block("ok")]), step_end(1, 1)],
    );
}

#[test]
fn the_first_cause_wins() {
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            cancelled("BeforeRequest").meanwhile(|w| {
                assert!(w.shared.state().abort(cause(json!({"kind": "hook", "reason": "budget"}))));
                assert!(!w.shared.state().abort(cause(json!({"kind": "user"}))));
            }),
        ],
    );
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "Finished"]);
    assert_eq!(snapshot(&w.log).last().unwrap(), &turn_end(1, json!({"kind": "aborted", "reason": {"kind": "hook", "reason": "budget"}})));
}

#[test]
fn a_cancellation_from_outside_ends_the_turn_disposed_and_propagates() {
    let w = World::new();
    w.followup("hello");
    let r = run(&w, vec![enter(), request(json!({})), cancelled("CallModel")]);
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "CallModel", r#"Abort {"kind":"disposed"}"#, "Finished"]);
    assert_eq!(
        snapshot_from(&w.log, 5),
        [
            header(json!({})),
            // the request was made: a cancellation cut it, as the loop's own would
            cut_before_its_first_chunk(1, 1),
            step_end(1, 1),
            turn_end(1, json!({"kind": "aborted", "reason": {"kind": "disposed"}}))
        ]
    );
    assert!(r.machine.propagates());
}

// ---- fencing ----------------------------------------------------------------------------------

#[test]
fn a_lost_lease_fences_the_loop_and_appends_no_turn_end() {
    let w = World::new();
    w.followup("hello");
    w.followup("later");
    let r = run(&w, vec![raise("PreStep", RaisedKind::LeaseLost, json!({"message": "lease lost", "code": "UNKNOWN"}))]);
    assert_eq!(r.effects, ["PreStep[hello]", r#"Fence(1) {"message":"lease lost","code":"FENCED"}"#, "Finished"]);
    assert_eq!(snapshot_from(&w.log, 2), [turn_start(1), claimed("next-turn", 1)]);
    assert_eq!(w.shared.state().abort, Some(cause(json!({"kind": "fenced"}))));
    assert_eq!(w.inbox.count(Target::NextTurn), 1);
}

#[test]
fn a_lost_lease_during_the_model_call_with_appends_refused_appends_nothing_more() {
    // A fenced log refuses every later append (here: a closed log); the step's step/end fails,
    // the host describes that failure as the lost lease, and the loop is fenced.
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            raise("CallModel", RaisedKind::LeaseLost, json!({"message": "lease lost", "code": "UNKNOWN"}))
                .meanwhile(|w| w.log.close().unwrap()),
            raise("Describe", RaisedKind::LeaseLost, json!({"message": "lease lost on append", "code": "UNKNOWN"})),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]",
            "BeforeRequest[hello]",
            "CallModel",
            r#"Describe(session "s" is closed)"#,
            r#"Fence(1) {"message":"lease lost on append","code":"FENCED"}"#,
            "Finished"
        ]
    );
    assert_eq!(snapshot(&w.log).last().unwrap(), &header(json!({})));
}

// ---- max-tokens -------------------------------------------------------------------------------

#[test]
fn max_tokens_drops_the_tool_calls_and_ends_the_turn_max_tokens() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    let r = run(&w, vec![enter(), request(json!({})), reply_max_tokens(vec![block("partial"), call("c1", "t", "{}")])]);
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "TurnStopping", "Finished"]);
    assert_eq!(
        snapshot_from(&w.log, 6),
        [assistant_message(1, 1, vec![block("partial")]), step_end(1, 1), turn_end(1, json!({"kind": "max-tokens"}))]
    );
}

#[test]
fn max_tokens_is_sticky_only_as_the_ending_and_the_next_turn_still_starts() {
    let w = World::new().tool("t", false);
    w.followup("go");
    w.followup("second");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply_max_tokens(vec![block("part")]).meanwhile(|w| {
                w.steer("more");
            }),
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", "{}")]),
            enter(),
            request(json!({})),
            reply_text("done"),
            reject(None),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[go]", "BeforeRequest[go]", "CallModel", "PreStep[more]", "BeforeRequest[more]", "CallModel", "RunTools", "PreStep[]",
            "BeforeRequest[]", "CallModel", "TurnStopping", "NewTurn", "PreStep[second]", "Finished"
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 7),
        [
            inserted("next-step", vec![user("more")]),
            assistant_message(1, 1, vec![block("part")]),
            step_end(1, 1),
            claimed("next-step", 1),
            step_start(1, 2),
            user_message("more"),
            assistant_message(1, 2, vec![call("c1", "t", "{}")]),
            tool_call(1, 2, "c1", "t", "{}"),
            tool_result(1, 2, "c1", "t ok"),
            step_end(1, 2),
            step_start(1, 3),
            assistant_message(1, 3, vec![block("done")]),
            step_end(1, 3),
            turn_end(1, json!({"kind": "max-tokens"})),
            turn_start(2),
            claimed("next-turn", 1),
            turn_end(2, json!({"kind": "blocked"})),
        ]
    );
}

// ---- request errors ---------------------------------------------------------------------------

#[test]
fn a_retry_reissues_the_request_in_the_same_step() {
    let w = World::new();
    w.followup("hello");
    let failure = json!({"message": "overloaded", "code": "OVERLOADED", "status": 529, "retryAfterMs": 100});
    let r = run(&w, vec![enter(), request(json!({})), model_fails(failure.clone()), retry(true), request(json!({})), reply_text("ok")]);
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]".to_owned(),
            "BeforeRequest[hello]".to_owned(),
            "CallModel".to_owned(),
            format!("RequestError {failure}"),
            "BeforeRequest[hello]".to_owned(),
            "CallModel".to_owned(),
            "TurnStopping".to_owned(),
            "Finished".to_owned(),
        ]
    );
    // A retry is not logged as such (one step, one header); the failed request is, by the
    // failed finish that ends it.
    assert_eq!(
        snapshot_from(&w.log, 1),
        [
            turn_start(1),
            claimed("next-turn", 1),
            step_start(1, 1),
            user_message("hello"),
            header(json!({})),
            failed_finish(1, 1, failure),
            assistant_message(1, 1, vec![block("ok")]),
            step_end(1, 1),
            turn_end(1, completed())
        ]
    );
    assert_eq!(w.shared.state().requests, 2);
}

#[test]
fn no_retry_ends_the_turn_with_the_failure() {
    let w = World::new();
    w.followup("hello");
    w.followup("later");
    let failure = json!({"message": "bad key", "code": "AUTH", "status": 401});
    let r = run(&w, vec![enter(), request(json!({})), model_fails(failure.clone()), retry(false)]);
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]".to_owned(),
            "BeforeRequest[hello]".to_owned(),
            "CallModel".to_owned(),
            format!("RequestError {failure}"),
            format!("Report(1, 1, exception=true) {failure}"),
            "Finished".to_owned(),
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 7),
        [failed_finish(1, 1, failure.clone()), step_end(1, 1), turn_end(1, json!({"kind": "error", "error": failure}))]
    );
    assert_eq!(w.inbox.count(Target::NextTurn), 1);
}

#[test]
fn a_finish_chunk_with_an_error_is_a_request_failure_and_its_chunks_stay() {
    let w = World::new();
    w.followup("hello");
    let error = json!({"message": "stream broke", "code": "OVERLOADED", "extra": 1});
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "par"})),
            chunk(json!({"type": "finish", "reason": "error", "error": error.clone()})),
            stream_end(),
            retry(false),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]".to_owned(),
            "BeforeRequest[hello]".to_owned(),
            "CallModel".to_owned(),
            "NextChunk".to_owned(),
            "NextChunk".to_owned(),
            "NextChunk".to_owned(),
            format!("RequestError {error}"),
            // an in-band failure has no exception behind it
            format!("Report(1, 1, exception=false) {error}"),
            "Finished".to_owned(),
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 6),
        [
            ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "par"}})),
            ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "finish", "reason": "error", "error": error.clone()}})),
            step_end(1, 1),
            turn_end(1, json!({"kind": "error", "error": error})),
        ]
    );
}

#[test]
fn failures_of_the_rules_end_the_turn_with_their_codes() {
    let cases: Vec<(Vec<Ans>, Value, u64, bool)> = vec![
        (
            vec![answer("PreStep", |_, _| Input::Decided(Decision::Invalid("None".into())))],
            json!({"message": "pre-step listener returned None; expected Enter or Reject", "code": "INVALID_DECISION"}),
            0,
            false,
        ),
        (
            vec![raise("PreStep", RaisedKind::Error, json!({"message": "plugin broke", "code": "UNKNOWN"}))],
            json!({"message": "plugin broke", "code": "UNKNOWN"}),
            0,
            true,
        ),
        (
            vec![enter(), answer("BeforeRequest", |_, _| Input::Requested(Requested::NotARequest("None".into())))],
            json!({"message": "before_request listener returned None; expected a ModelRequest", "code": "INVALID_REQUEST"}),
            1,
            false,
        ),
        (
            vec![enter(), request(json!({})), answer("CallModel", |_, _| Input::NotAReply("None".into()))],
            json!({"message": "model returned None; expected a ModelReply", "code": "INVALID_REPLY"}),
            1,
            false,
        ),
        (
            vec![enter(), request(json!({})), stream(), answer("NextChunk", |_, _| Input::NotAChunk("5".into()))],
            json!({"message": "model stream yielded 5; expected a chunk dict", "code": "INVALID_REPLY"}),
            1,
            false,
        ),
    ];
    for (script, failure, step, exception) in cases {
        let w = World::new();
        w.followup("hello");
        w.followup("later");
        let r = run(&w, script);
        let report = r.effects.iter().rev().nth(1).unwrap();
        assert_eq!(report, &format!("Report(1, {step}, exception={exception}) {failure}"));
        assert_eq!(r.effects.last().unwrap(), "Finished");
        let log = snapshot(&w.log);
        assert_eq!(log.last().unwrap(), &turn_end(1, json!({"kind": "error", "error": failure})));
        // A step that was entered is closed; a failed pre-step enters none.
        assert_eq!(log.iter().filter(|l| l.starts_with("step/start")).count() as u64, step);
        assert_eq!(log.iter().filter(|l| l.starts_with("step/end")).count() as u64, step);
        assert_eq!(w.inbox.count(Target::NextTurn), 1, "an errored turn leaves the loop idle");
    }
}

// ---- failed requests are in the log -------------------------------------------------------------

/// The chunk the loop logs for an attempt that failed with nothing to end it in the log.
fn failed_finish(turn: u64, step: u64, error: Value) -> String {
    ev("assistant/chunk", json!({"turn": turn, "step": step, "chunk": {"type": "finish", "reason": "error", "error": error}}))
}

#[test]
fn a_request_that_fails_before_its_first_chunk_logs_a_failed_finish_once_per_attempt() {
    let w = World::new();
    w.followup("hello");
    let first = json!({"message": "overloaded", "code": "OVERLOADED", "status": 529});
    let second = json!({"message": "connection refused", "code": "CONNECTION"});
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            model_fails(first.clone()),
            retry(true),
            request(json!({})),
            // A stream whose HTTP request fails when it is first read: still nothing streamed.
            stream(),
            answer("NextChunk", {
                let failure = failure_of(second.clone());
                move |_, _| Input::ModelFailed(failure.clone())
            }),
            retry(true),
            request(json!({})),
            reply_text("ok"),
        ],
    );
    assert_eq!(
        snapshot_from(&w.log, 5),
        [
            header(json!({})),
            failed_finish(1, 1, first),
            failed_finish(1, 1, second),
            assistant_message(1, 1, vec![block("ok")]),
            step_end(1, 1),
            turn_end(1, completed())
        ]
    );
}

#[test]
fn a_failed_stream_is_ended_in_the_log_unless_its_own_chunks_end_it() {
    let failure = json!({"message": "stream cut", "code": "NETWORK"});
    // Text streamed, then the stream raised: the loop ends the attempt with a failed finish.
    let w = World::new();
    w.followup("hello");
    let cut = failure_of(failure.clone());
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "par"})),
            answer("NextChunk", move |_, _| Input::ModelFailed(cut.clone())),
            retry(false),
        ],
    );
    assert_eq!(
        snapshot_from(&w.log, 6)[..2],
        [
            ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "par"}})),
            failed_finish(1, 1, failure.clone())
        ]
    );
    // A provider that reported its partial usage before raising ended the attempt itself.
    let w = World::new();
    w.followup("hello");
    let cut = failure_of(failure.clone());
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "usage", "input": 7, "partial": true})),
            answer("NextChunk", move |_, _| Input::ModelFailed(cut.clone())),
            retry(false),
        ],
    );
    let log = snapshot_from(&w.log, 6);
    assert_eq!(
        log[..2],
        [ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": {"type": "usage", "input": 7, "partial": true}})), step_end(1, 1)]
    );
}

#[test]
fn a_model_that_raises_or_answers_wrongly_is_a_failed_request_but_a_cancelled_one_is_not() {
    let raised = json!({"message": "RuntimeError: boom", "code": "UNKNOWN"});
    let w = World::new();
    w.followup("hello");
    run(&w, vec![enter(), request(json!({})), raise("CallModel", RaisedKind::Error, raised.clone())]);
    assert_eq!(
        snapshot_from(&w.log, 6),
        [failed_finish(1, 1, raised.clone()), step_end(1, 1), turn_end(1, json!({"kind": "error", "error": raised}))]
    );
    let invalid = json!({"message": "model returned None; expected a ModelReply", "code": "INVALID_REPLY"});
    let w = World::new();
    w.followup("hello");
    run(&w, vec![enter(), request(json!({})), answer("CallModel", |_, _| Input::NotAReply("None".into()))]);
    assert_eq!(snapshot_from(&w.log, 6)[..2], [failed_finish(1, 1, invalid), step_end(1, 1)]);
    // Cancelled (by the loop or from outside) or a fatal exception: no failure of the model to
    // log; a cancelled request was made and ends with the loop's cancelled finish.
    for (kind, chunks) in [(RaisedKind::Cancelled, vec![cut_before_its_first_chunk(1, 1)]), (RaisedKind::Fatal, vec![])] {
        let w = World::new();
        w.followup("hello");
        run(&w, vec![enter(), request(json!({})), raise("CallModel", kind, json!({"message": "", "code": "UNKNOWN"}))]);
        let logged: Vec<String> = seqs_of(&w.log, "assistant/chunk").into_iter().map(|s| snapshot_from(&w.log, s)[0].clone()).collect();
        assert_eq!(logged, chunks, "{kind:?}");
    }
}

// ---- streams ----------------------------------------------------------------------------------

#[test]
fn a_stream_logs_its_chunks_and_the_message_cites_them() {
    let w = World::new();
    w.followup("hello");
    let chunks = [
        json!({"type": "reasoning-delta", "text": "think"}),
        json!({"type": "text-delta", "text": "he"}),
        json!({"type": "text-delta", "text": "llo"}),
        json!({"type": "usage", "input": 3}),
        json!({"type": "usage", "output": 2}),
        json!({"type": "finish", "reason": "stop"}),
    ];
    let mut script = vec![enter(), request(json!({})), stream()];
    script.extend(chunks.iter().cloned().map(chunk));
    script.push(stream_end());
    let r = run(&w, script);
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "NextChunk", "NextChunk", "NextChunk", "NextChunk", "NextChunk",
            "NextChunk", "NextChunk", "TurnStopping", "Finished"
        ]
    );
    let mut expected: Vec<String> = chunks.iter().map(|c| ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": c}))).collect();
    expected.push(ev(
        "assistant/message",
        json!({"turn": 1, "step": 1, "message": assistant(vec![json!({"type": "reasoning", "text": "think"}), block("hello")]), "usage": {"input": 3, "output": 2}}),
    ));
    expected.extend([step_end(1, 1), turn_end(1, completed())]);
    assert_eq!(snapshot_from(&w.log, 6), expected);
    let message = *seqs_of(&w.log, "assistant/message").last().unwrap();
    assert_eq!(cites(&w.log, message), Some(seqs_of(&w.log, "assistant/chunk")));
}

#[test]
fn an_aborted_stream_logs_what_was_visible_as_interrupted() {
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "he"})),
            chunk(json!({"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"})),
            chunk(json!({"type": "text-delta", "text": "llo"})),
            cancelled("NextChunk").meanwhile(cancel()),
        ],
    );
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]", "BeforeRequest[hello]", "CallModel", "NextChunk", "NextChunk", "NextChunk", "NextChunk", "CloseStream",
            "Finished"
        ]
    );
    let tail = snapshot_from(&w.log, 9);
    assert_eq!(
        tail,
        [
            // text and reasoning only: the tool call is not part of what was shown
            ev(
                "assistant/message",
                json!({"turn": 1, "step": 1, "message": assistant(vec![block("he"), block("llo")]), "interrupted": true})
            ),
            step_end(1, 1),
            turn_end(1, aborted_by_user()),
        ]
    );
    assert_eq!(cites(&w.log, 9), Some(seqs_of(&w.log, "assistant/chunk")));
    assert!(seqs_of(&w.log, "tool/call").is_empty());
}

#[test]
fn a_stream_that_holds_a_failed_attempt_then_another_answers_with_the_second_alone() {
    // A model that tries another model after the first failed before any output (Fallback)
    // yields the first one's failed finish, then the second's reply: two requests, and the
    // message is the second one's, citing only its chunks.
    let w = World::new();
    w.followup("hello");
    let failed = json!({"type": "finish", "reason": "error", "error": {"message": "busy", "code": "RATE_LIMITED"}, "model": "a"});
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "lost"})),
            chunk(failed.clone()),
            chunk(json!({"type": "text-delta", "text": "ok"})),
            chunk(json!({"type": "usage", "input": 4, "model": "b"})),
            chunk(json!({"type": "finish", "reason": "stop"})),
            stream_end(),
        ],
    );
    let chunks = seqs_of(&w.log, "assistant/chunk");
    let message = seqs_of(&w.log, "assistant/message")[0];
    assert_eq!(cites(&w.log, message), Some(chunks[2..].to_vec()));
    assert_eq!(
        snapshot_from(&w.log, message)[..1],
        [ev(
            "assistant/message",
            json!({"turn": 1, "step": 1, "message": assistant(vec![block("ok")]), "usage": {"input": 4, "model": "b"}})
        )]
    );
}

#[test]
fn a_stream_whose_last_attempt_ended_itself_gets_no_failed_finish_from_the_loop() {
    // Every model of a Fallback failed: each yielded its failed finish, the last failure is raised.
    let w = World::new();
    w.followup("hello");
    let second = json!({"message": "down", "code": "SERVER_ERROR"});
    let raised = failure_of(second.clone());
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "finish", "reason": "error", "error": {"message": "busy", "code": "RATE_LIMITED"}, "model": "a"})),
            chunk(json!({"type": "finish", "reason": "error", "error": second, "model": "b"})),
            answer("NextChunk", move |_, _| Input::ModelFailed(raised.clone())),
            retry(false),
        ],
    );
    assert_eq!(seqs_of(&w.log, "assistant/chunk").len(), 2);
}

/// The model's answer to `CallModel` after attempts of its own that failed (`failed`: their
/// failed finishes), as a non-streaming `Fallback` gives it.
fn after_failed(failed: Vec<Value>, outcome: impl FnOnce() -> Input + 'static) -> Ans {
    answer("CallModel", move |_, _| Input::AfterFailed { failed, outcome: Box::new(outcome()) })
}

fn fallback_finish(code: &str, model: &str) -> Value {
    json!({"type": "finish", "reason": "error", "error": {"message": "no", "code": code}, "model": model})
}

#[test]
fn a_reply_after_failed_attempts_logs_each_before_it_and_cites_none() {
    let w = World::new();
    w.followup("hello");
    let failed = vec![fallback_finish("RATE_LIMITED", "a"), fallback_finish("SERVER_ERROR", "b")];
    let reply = || Input::Reply(Reply { content: ReplyContent::Text("ok".into()), usage: None, max_tokens: false });
    run(&w, vec![enter(), request(json!({})), after_failed(failed.clone(), reply)]);
    let chunk = |c: &Value| ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": c}));
    assert_eq!(
        snapshot_from(&w.log, 6),
        [chunk(&failed[0]), chunk(&failed[1]), assistant_message(1, 1, vec![block("ok")]), step_end(1, 1), turn_end(1, completed())]
    );
    let message = seqs_of(&w.log, "assistant/message")[0];
    assert_eq!(cites(&w.log, message).unwrap_or_default(), Vec::<u64>::new());
}

#[test]
fn a_failure_after_failed_attempts_that_list_it_gets_no_failed_finish_from_the_loop() {
    let w = World::new();
    w.followup("hello");
    let failed = vec![fallback_finish("RATE_LIMITED", "a"), fallback_finish("SERVER_ERROR", "b")];
    let last = failure_of(json!({"message": "no", "code": "SERVER_ERROR"}));
    run(&w, vec![enter(), request(json!({})), after_failed(failed.clone(), move || Input::ModelFailed(last)), retry(false)]);
    let chunks: Vec<String> = seqs_of(&w.log, "assistant/chunk").into_iter().map(|s| snapshot_from(&w.log, s)[0].clone()).collect();
    assert_eq!(chunks, failed.iter().map(|c| ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": c}))).collect::<Vec<_>>());
}

#[test]
fn a_cancel_after_failed_attempts_logs_them_and_the_cancelled_request() {
    let w = World::new();
    w.followup("hello");
    let failed = vec![fallback_finish("RATE_LIMITED", "a")];
    let cancelled = || Input::Raised(Raised::new(RaisedKind::Cancelled, failure_of(json!({"message": "", "code": "UNKNOWN"}))));
    run(&w, vec![enter(), request(json!({})), after_failed(failed.clone(), cancelled).meanwhile(cancel())]);
    let chunks: Vec<String> = seqs_of(&w.log, "assistant/chunk").into_iter().map(|s| snapshot_from(&w.log, s)[0].clone()).collect();
    assert_eq!(chunks, [ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": failed[0]})), cut_before_its_first_chunk(1, 1)]);
}

#[test]
fn failed_attempts_that_are_not_failed_finishes_refuse_the_reply_and_log_none_of_them() {
    let w = World::new();
    w.followup("hello");
    let failed = vec![fallback_finish("RATE_LIMITED", "a"), json!({"type": "text-delta", "text": "x"})];
    let reply = || Input::Reply(Reply { content: ReplyContent::Text("ok".into()), usage: None, max_tokens: false });
    run(&w, vec![enter(), request(json!({})), after_failed(failed, reply)]);
    let refused = json!({
        "message": "model's failed_attempts[1] is {\"type\":\"text-delta\",\"text\":\"x\"}; expected a failed finish chunk {\"type\": \"finish\", \"reason\": \"error\", ...}",
        "code": "INVALID_REPLY"
    });
    assert_eq!(snapshot_from(&w.log, 6)[..2], [failed_finish(1, 1, refused), step_end(1, 1)]);
}

// ---- repeated tool-call ids -------------------------------------------------------------------

fn repeated_id_failure() -> Value {
    json!({"message": "model reply has two tool calls with id \"c1\"; tool-call ids must be unique within a reply", "code": "INVALID_REPLY"})
}

#[test]
fn a_reply_repeating_a_call_id_fails_before_anything_of_it_is_logged() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    let r = run(&w, vec![enter(), request(json!({})), reply(vec![call("c1", "t", "{}"), call("c1", "t", r#"{"n":2}"#)])]);
    assert_eq!(
        r.effects,
        [
            "PreStep[hello]".to_owned(),
            "BeforeRequest[hello]".to_owned(),
            "CallModel".to_owned(),
            format!("Report(1, 1, exception=false) {}", repeated_id_failure()),
            "Finished".to_owned()
        ]
    );
    assert_eq!(
        snapshot_from(&w.log, 5),
        [
            header(json!({})),
            // nothing of the reply; the refused request is a failed one, as any failed request
            failed_finish(1, 1, repeated_id_failure()),
            step_end(1, 1),
            turn_end(1, json!({"kind": "error", "error": repeated_id_failure()}))
        ]
    );
}

#[test]
fn a_stream_repeating_a_call_id_keeps_its_chunks_and_logs_no_message() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    let c = json!({"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"});
    let r = run(&w, vec![enter(), request(json!({})), stream(), chunk(c.clone()), chunk(c.clone()), stream_end()]);
    assert_eq!(r.effects.iter().rev().nth(1).unwrap(), &format!("Report(1, 1, exception=false) {}", repeated_id_failure()));
    assert_eq!(
        snapshot_from(&w.log, 6),
        [
            ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": c.clone()})),
            ev("assistant/chunk", json!({"turn": 1, "step": 1, "chunk": c})),
            failed_finish(1, 1, repeated_id_failure()),
            step_end(1, 1),
            turn_end(1, json!({"kind": "error", "error": repeated_id_failure()})),
        ]
    );
}

// ---- request/header ---------------------------------------------------------------------------

fn headers(log: &SessionLog) -> Vec<Value> {
    log.range(0, None).iter().filter(|e| e.kind() == "request/header").map(|e| e.data()["options"].clone()).collect()
}

#[test]
fn instructions_are_recorded_when_they_change_and_headers_carry_what_each_request_sent() {
    let w = World::new();
    w.shared.state().instructions = Some("base".into());
    w.followup("a");
    let r = run(&w, vec![enter(), request_instructed(Some("base")), reply_text("1")]);
    assert_eq!(r.effects.last().map(String::as_str), Some("Finished"));
    w.followup("b");
    // Same instructions, a listener's variant for this request: a header, no new record.
    run(&w, vec![enter(), request_instructed(Some("base, turn 2")), reply_text("2")]);
    w.shared.state().instructions = None;
    w.followup("c");
    run(&w, vec![enter(), request_instructed(None), reply_text("3")]);
    let recorded: Vec<String> =
        snapshot(&w.log).into_iter().filter(|l| l.starts_with("agent/instructions") || l.starts_with("request/header")).collect();
    assert_eq!(
        recorded,
        [
            ev("agent/instructions", json!({"instructions": "base"})),
            ev("request/header", json!({"options": {}, "instructions": "base"})),
            ev("request/header", json!({"options": {}, "instructions": "base, turn 2"})),
            ev("agent/instructions", json!({"instructions": null})),
            ev("request/header", json!({"options": {}})),
        ]
    );
    // A loop resumed over the log starts from the last recorded instructions.
    let log = w.log.clone();
    let resumed = Shared::resume(&log);
    assert_eq!(resumed.state().instructions, None);
    w.shared.state().instructions = Some("again".into());
    w.followup("d");
    run(&w, vec![enter(), request_instructed(Some("again")), reply_text("4")]);
    let resumed = Shared::resume(&log);
    let state = resumed.state();
    assert_eq!((state.instructions.as_deref(), state.logged_instructions.as_deref()), (Some("again"), Some("again")));
}

#[test]
fn request_header_is_logged_on_the_first_request_and_when_canonical_options_change() {
    let w = World::new();
    w.followup("a");
    run(&w, vec![enter(), request(json!({"model": "m", "temperature": 0})), reply_text("1")]);
    assert_eq!(headers(&w.log), [json!({"model": "m", "temperature": 0})]);
    // The same options in another key order are canonically equal: no header.
    w.followup("b");
    run(&w, vec![enter(), request(json!({"temperature": 0, "model": "m"})), reply_text("2")]);
    assert_eq!(headers(&w.log).len(), 1);
    // Changed options: a header before the request; a retry with other options logs one too.
    w.followup("c");
    run(
        &w,
        vec![
            enter(),
            request(json!({"model": "m", "temperature": 1})),
            model_fails(json!({"message": "x", "code": "UNKNOWN"})),
            retry(true),
            request(json!({"model": "m", "temperature": 2})),
            reply_text("3"),
        ],
    );
    assert_eq!(
        headers(&w.log),
        [json!({"model": "m", "temperature": 0}), json!({"model": "m", "temperature": 1}), json!({"model": "m", "temperature": 2})]
    );
    let header_seq = *seqs_of(&w.log, "request/header").last().unwrap();
    assert_eq!(w.log.range(header_seq + 1, Some(header_seq + 2))[0].kind(), "assistant/message");
    assert_eq!(w.shared.state().requests, 4);
    // A new loop over the same log: its first request logs the header again.
    let w = w.resumed();
    w.followup("d");
    run(&w, vec![enter(), request(json!({"model": "m", "temperature": 2})), reply_text("4")]);
    assert_eq!(headers(&w.log).len(), 4);
}

#[test]
fn checkpoint_durability_awaits_a_flush_before_the_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileStore::new(dir.path().join("store"), Durability::Checkpoint).unwrap().create(Some("s")).unwrap();
    let w = World::over(None, log);
    w.followup("hello");
    let r = run(&w, vec![enter(), request(json!({})), proceed("Flush"), reply_text("ok")]);
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "Flush", "CallModel", "TurnStopping", "Finished"]);
    // The header is logged before the barrier, so it is durable before the model runs.
    assert_eq!(
        snapshot_from(&w.log, 5),
        [header(json!({})), assistant_message(1, 1, vec![block("ok")]), step_end(1, 1), turn_end(1, completed())]
    );
    w.log.close().unwrap();
}

// ---- resume -----------------------------------------------------------------------------------

const OUTCOME_UNKNOWN: &str =
    "Tool call \"t\" was interrupted before its result was recorded; its side effects may or may not have happened. Do not retry blindly.";
const NOT_STARTED: &str = "Tool call \"t\" was not started before the session was interrupted; it is safe to retry.";

#[test]
fn closers_balance_a_log_that_ended_mid_step() {
    let w = World::new().tool("t", false).max_parallel(1);
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", r#"{"n":1}"#), call("c2", "t", r#"{"n":2}"#)]),
            // The process dies while c1 runs; c2 has not started.
            crash("RunTools", |w, machine| {
                let mut plan = machine.take_plan().unwrap();
                assert_eq!(plan.next(&w.sink(), false).unwrap(), Next::Start(0));
            }),
        ],
    );
    assert_eq!(r.effects, ["PreStep[hello]", "BeforeRequest[hello]", "CallModel", "RunTools"]);
    let end = w.log.len();
    let started = seqs_of(&w.log, "tool/call");
    assert_eq!(started.len(), 1);
    let last_time = w.events().last().unwrap().time;

    assert_eq!(close_open_turn(&w.log).unwrap(), 4);
    assert_eq!(
        snapshot_from(&w.log, end),
        [
            tool_error(1, 1, "c1", OUTCOME_UNKNOWN, "ToolOutcomeUnknownError", "TOOL_OUTCOME_UNKNOWN"),
            tool_error(1, 1, "c2", NOT_STARTED, "ToolNotStartedError", "TOOL_NOT_STARTED"),
            step_end(1, 1),
            turn_end(1, json!({"kind": "interrupted"})),
        ]
    );
    // The started call's result cites its tool/call; the unstarted one has none to cite.
    assert_eq!(cites(&w.log, end), Some(started));
    assert_eq!(cites(&w.log, end + 1), None);
    // Closers reuse the last event's time, and a balanced log gets none.
    assert!(w.log.range(end, None).iter().all(|e| e.time == last_time));
    assert_eq!(close_open_turn(&w.log).unwrap(), 0);

    // A loop over the resumed log restores the turn counter; its history is the whole log.
    let w = w.resumed();
    assert_eq!(w.shared.state().turn, 1);
    w.followup("next");
    let r = run(&w, vec![enter(), request(json!({})), reply_text("ok")]);
    assert_eq!(r.effects, ["PreStep[next]", "BeforeRequest[next]", "CallModel", "TurnStopping", "Finished"]);
    assert_eq!(snapshot(&w.log).last().unwrap(), &turn_end(2, completed()));
    assert_eq!(
        w.requests.borrow()[0],
        [
            "user: hello".to_owned(),
            "model: ".to_owned(),
            format!("tool: {OUTCOME_UNKNOWN}"),
            format!("tool: {NOT_STARTED}"),
            "user: next".to_owned()
        ]
    );
}

// ---- requeue_claimed --------------------------------------------------------------------------

#[test]
fn requeue_claimed_brings_back_what_a_rejected_turn_claimed() {
    let w = World::new();
    let t1 = w.followup("t1");
    w.followup("t2");
    let s = w.steer("s");
    run(&w, vec![reject(Some("later"))]);
    assert!(matches!(requeue_claimed(&w.inbox, 9), Err(RequeueError::NotInLog(9))));
    let end = w.log.len();
    let requeued = requeue_claimed(&w.inbox, 1).unwrap();
    assert_eq!(texts(&requeued), "s, t1");
    assert_eq!(requeued.iter().map(|m| m.id()).collect::<Vec<_>>(), [s.id(), t1.id()]);
    // One insertion splice per list, next-step first, each at the head of its list.
    assert_eq!(snapshot_from(&w.log, end), [inserted("next-step", vec![user("s")]), inserted("next-turn", vec![user("t1")])]);
    assert_eq!(texts(&w.inbox.list(Target::NextStep)), "s");
    assert_eq!(texts(&w.inbox.list(Target::NextTurn)), "t1, t2");
    // A message is requeued at most once.
    assert!(matches!(requeue_claimed(&w.inbox, 1), Err(RequeueError::NothingLeft(1))));
}

#[test]
fn requeue_claimed_skips_what_was_entered() {
    let w = World::new();
    let kept = w.followup("kept");
    let dropped = Arc::new(Message::user_text("dropped"));
    w.inbox.append(Target::NextStep, Arc::clone(&dropped)).unwrap();
    run(&w, vec![enter_with(vec![kept]), request(json!({})), reply_text("ok")]);
    let requeued = requeue_claimed(&w.inbox, 1).unwrap();
    assert_eq!(requeued.iter().map(|m| m.id()).collect::<Vec<_>>(), [dropped.id()]);
}

#[test]
fn a_crash_in_pre_step_is_closed_on_open_and_its_prompt_requeued() {
    // docs/loop.md, "Resume and requeue_claimed": the process dies while a pre_step plugin waits.
    let w = World::new();
    w.followup("deploy to staging");
    let r = run(&w, vec![crash("PreStep", |_, _| {})]);
    assert_eq!(r.effects, ["PreStep[deploy to staging]"]);
    assert!(matches!(requeue_claimed(&w.inbox, 1), Err(RequeueError::StillOpen(1))));
    let World { store, log, inbox, .. } = w;
    let store = store.unwrap();
    log.close().unwrap();
    drop(inbox);
    let log = store.open("s").unwrap();
    assert_eq!(snapshot_from(&log, 1), [turn_start(1), claimed("next-turn", 1), turn_end(1, json!({"kind": "interrupted"}))]);
    let w = World::over(Some(store), log);
    assert_eq!(w.shared.state().turn, 1);
    assert!(!w.inbox.has_pending(), "the crashed turn had claimed the prompt");
    assert_eq!(texts(&requeue_claimed(&w.inbox, 1).unwrap()), "deploy to staging");
    let r = run(&w, vec![enter(), request(json!({})), reply_text("done")]);
    assert_eq!(r.effects[0], "PreStep[deploy to staging]");
    assert_eq!(snapshot(&w.log).last().unwrap(), &turn_end(2, completed()));
}

// ---- consumed_work ----------------------------------------------------------------------------

#[test]
fn consumed_work_on_the_shapes_the_machine_writes() {
    let w = World::new();
    let work = |w: &World| consumed_work(&w.events());
    w.followup("a");
    assert_eq!(work(&w).end, None, "only an insertion");
    assert!(!work(&w).dropped_unrun);

    run(&w, vec![enter(), request(json!({})), reply_text("1")]);
    let first = *seqs_of(&w.log, "turn/end").last().unwrap();
    assert_eq!(work(&w).end.map(|e| e.seq), Some(first), "a stepped turn accounts");

    w.followup("b");
    run(&w, vec![reject(None)]);
    let blocked = *seqs_of(&w.log, "turn/end").last().unwrap();
    assert_eq!(work(&w).end.map(|e| e.seq), Some(blocked), "a blocked turn that claimed accounts");

    w.followup("c");
    run(&w, vec![enter_with(Vec::new())]);
    assert_eq!(work(&w).end.map(|e| e.seq), Some(blocked), "completed without a step: does not account");

    run(&w, vec![reject(None)]);
    assert_eq!(work(&w).end.map(|e| e.seq), Some(blocked), "a turn that claimed nothing does not account");

    w.followup("d");
    w.inbox.clear().unwrap();
    let after = work(&w);
    assert_eq!(after.end.map(|e| e.seq), Some(blocked));
    assert!(after.dropped_unrun, "input dropped unrun after the last accounting turn");
}

// ---- odds and ends ----------------------------------------------------------------------------

#[test]
fn an_empty_assistant_message_is_logged_but_left_out_of_the_history() {
    let w = World::new();
    w.followup("hello");
    let r = run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(Vec::new()).meanwhile(|w| {
                w.steer("well?");
            }),
            enter(),
            request(json!({})),
            reply_text("ok"),
        ],
    );
    assert_eq!(r.effects[3], "PreStep[well?]");
    assert_eq!(snapshot_from(&w.log, 7)[0], assistant_message(1, 1, Vec::new()));
    assert_eq!(w.requests.borrow()[1], ["user: hello", "user: well?"]);
}

#[test]
fn the_wake_latch_is_set_only_while_a_turn_is_being_cancelled_and_not_disposed() {
    let w = World::new();
    let latch = |given: Option<Value>, after_abort: bool| {
        let mut state = w.shared.state();
        state.reset_run();
        if let Some(given) = given {
            state.abort(cause(given));
        }
        state.latch_wake(after_abort);
        state.wake_latched
    };
    assert!(latch(Some(json!({"kind": "user"})), true));
    assert!(latch(Some(json!({"kind": "hook", "reason": "budget"})), true));
    assert!(!latch(Some(json!({"kind": "disposed"})), true));
    assert!(!latch(None, true), "not cancelling: the running turn takes the input");
    assert!(!latch(Some(json!({"kind": "user"})), false), "input that was not redirected to next-turn");
    // A new run starts with no latch and no cause.
    assert!(latch(Some(json!({"kind": "user"})), true));
    w.shared.state().reset_run();
    assert!(!w.shared.state().wake_latched && w.shared.state().abort.is_none());
}

#[test]
fn a_turn_start_that_cannot_be_appended_records_no_turn() {
    // An ordinary log failure: reported, no turn.
    let w = World::new();
    w.followup("hello");
    w.log.close().unwrap();
    let r = run(&w, vec![]);
    assert_eq!(r.effects.len(), 3, "{:?}", r.effects);
    assert_eq!(r.effects[0], r#"Describe(session "s" is closed)"#);
    assert!(
        r.effects[1].starts_with("Report(") && r.effects[1].ends_with(r#"{"message":"session \"s\" is closed","code":"UNKNOWN"}"#),
        "{:?}",
        r.effects
    );
    assert_eq!(r.effects[2], "NoTurn");
    assert_eq!(w.shared.state().turn, 0);
    assert_eq!(snapshot(&w.log).len(), 1);
    // A lost lease: fenced, no turn.
    let w = World::new();
    w.followup("hello");
    w.log.close().unwrap();
    let r = run(&w, vec![raise("Describe", RaisedKind::LeaseLost, json!({"message": "lease lost", "code": "UNKNOWN"}))]);
    assert_eq!(r.effects.len(), 3, "{:?}", r.effects);
    assert!(r.effects[1].starts_with("Fence(") && r.effects[1].ends_with(r#"{"message":"lease lost","code":"FENCED"}"#), "{:?}", r.effects);
    assert_eq!(r.effects[2], "NoTurn");
    assert_eq!(w.shared.state().turn, 0);
}

// ---- the transcript (log.transcript()) ----------------------------------------------------------

/// `(turn, step, mid_turn, interrupted, "source kind: text")` per transcript entry.
fn transcript_of(log: &SessionLog) -> (Vec<(u64, u64, bool, bool, String)>, Vec<(u64, Value)>) {
    let t = Transcript::of(log).unwrap();
    assert_eq!(t.stop, log.len());
    let entries = t
        .entries
        .iter()
        .map(|e| (e.turn, e.step, e.mid_turn(), e.interrupted, format!("{}: {}", e.message.source_kind(), e.message.text())));
    (entries.collect(), t.endings.iter().map(|e| (e.turn, e.reason.clone())).collect())
}

#[test]
fn the_transcript_is_the_history_with_steering_marked_and_every_ending() {
    let w = World::new().tool("t", false);
    w.followup("hello");
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply(vec![call("c1", "t", "{}")]),
            tools(|w, plan| {
                let sink = w.sink();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Start(0));
                w.steer("use staging");
                plan.finish(&sink, 0, Outcome::text("done")).unwrap();
                assert_eq!(plan.next(&sink, false).unwrap(), Next::Done);
            }),
            enter(),
            request(json!({})),
            reply_text("ok"),
        ],
    );
    w.followup("rm -rf /");
    run(&w, vec![reject(Some("needs a human"))]);
    let (entries, endings) = transcript_of(&w.log);
    // The assistant message with only a tool call has no text; the rejected prompt is no message.
    assert_eq!(
        entries,
        [
            (1, 1, false, false, "user: hello".to_string()),
            (1, 1, false, false, "model: ".to_string()),
            (1, 1, false, false, "tool: done".to_string()),
            (1, 2, true, false, "user: use staging".to_string()),
            (1, 2, false, false, "model: ok".to_string()),
        ]
    );
    assert_eq!(endings, [(1, completed()), (2, json!({"kind": "blocked", "reason": "needs a human"}))]);
    // The same messages, in the same order, as the history the next request is built from.
    let history: Vec<String> = w.shared.history.since(0).iter().map(|m| format!("{}: {}", m.source_kind(), m.text())).collect();
    assert_eq!(entries.iter().map(|e| e.4.clone()).collect::<Vec<_>>(), history);
}

#[test]
fn the_transcript_keeps_an_interrupted_reply_and_marks_it() {
    let w = World::new();
    w.followup("tell a story");
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "Once upon"})),
            cancelled("NextChunk").meanwhile(cancel()),
        ],
    );
    let (entries, endings) = transcript_of(&w.log);
    assert_eq!(entries, [(1, 1, false, false, "user: tell a story".to_string()), (1, 1, false, true, "model: Once upon".to_string())]);
    assert_eq!(endings, [(1, json!({"kind": "aborted", "reason": {"kind": "user"}}))]);
}

#[test]
fn a_claim_past_the_end_of_its_list_takes_the_rest_of_it() {
    // `start + removedCount` clamps to the list: with a count near 2^64 it once wrapped to an
    // end before the start, and replaying the log panicked.
    let log = MemoryStore::new().create(Some("s")).unwrap();
    let message = |id: &str| json!({"id": id, "role": "user", "content": [block(id)], "source": {"kind": "user"}});
    let append = |kind: &str, data: Value| log.append_loop_event(kind, &data, None).unwrap();
    append("agent/inbox/spliced", json!({"target": "next-turn", "start": 0, "removedCount": 0, "inserted": [message("a"), message("b")]}));
    append("turn/start", json!({"turn": 1}));
    append("agent/inbox/spliced", json!({"target": "next-turn", "start": 1, "removedCount": u64::MAX, "inserted": []}));
    append("turn/end", json!({"turn": 1, "reason": {"kind": "cancelled"}}));
    let unread = unentered_claims(&log.range(0, None));
    assert_eq!(unread.iter().map(|c| c.message["id"].clone()).collect::<Vec<_>>(), [json!("b")]);
}

// ---- rollback (on_busy="rollback") ------------------------------------------------------------

/// `loop.cancel({"kind": "rollback"})`: what a followup sent with `on_busy="rollback"` does.
fn roll_back() -> impl FnOnce(&World) {
    |w: &World| assert!(w.shared.state().abort(cause(json!({"kind": "rollback"}))))
}

#[test]
fn a_rolled_back_turn_leaves_the_history_but_stays_in_the_log() {
    let w = World::new();
    w.followup("first");
    run(&w, vec![enter(), request(json!({})), reply_text("one")]);
    // Turn 2 streams a partial reply, calls a tool, then is rolled back in its second step.
    w.followup("second");
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            reply_calls(&[("c1", "t", "{}")], false),
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "par"})),
            cancelled("NextChunk").meanwhile(roll_back()),
        ],
    );
    assert_eq!(
        snapshot(&w.log).last().unwrap(),
        &turn_end(2, json!({"kind": "aborted", "reason": {"kind": "rollback"}})),
        "the marker is the turn's own end"
    );
    assert_eq!(seqs_of(&w.log, "user/message").len(), 2, "the rolled-back turn's events stay in the log");
    w.followup("third");
    run(&w, vec![enter(), request(json!({})), reply_text("three")]);
    assert_eq!(w.requests.borrow().last().unwrap(), &["user: first", "model: one", "user: third"]);
    // A loop resumed over the log folds the same history from scratch.
    let w = w.resumed();
    w.shared.history.catch_up(&w.log, w.log.len()).unwrap();
    let texts: Vec<String> = w.shared.history.since(0).iter().map(|m| format!("{}: {}", m.source_kind(), m.text())).collect();
    assert_eq!(texts, ["user: first", "model: one", "user: third", "model: three"]);
}

#[test]
fn an_ordinary_cancel_keeps_the_turn_in_the_history() {
    let w = World::new();
    w.followup("first");
    run(
        &w,
        vec![
            enter(),
            request(json!({})),
            stream(),
            chunk(json!({"type": "text-delta", "text": "par"})),
            cancelled("NextChunk").meanwhile(cancel()),
        ],
    );
    w.followup("second");
    run(&w, vec![enter(), request(json!({})), reply_text("two")]);
    assert_eq!(w.requests.borrow().last().unwrap(), &["user: first", "model: par", "user: second"]);
}
