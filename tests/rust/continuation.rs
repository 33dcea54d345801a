//! Crashed turns are answered (`docs/durability.md#crashed-turns-are-answered`): the fold that
//! says a continuation is due, and the machine running one from the log alone.

use kerman::agent_loop::continuation::{self, Continuation};
use kerman::agent_loop::events::{self, append};
use kerman::agent_loop::{
    crash_closers, Ctx, Effect, Ending, Failure, FailureCode, Input, Machine, Reply, ReplyContent, Requested, Shared,
};
use kerman::event_log::{MemoryStore, SessionLog, Store};
use kerman::inbox::Inbox;
use kerman::message::{Message, MessageKind};
use serde_json::{json, Value};

/// What a crashed turn had logged when the process died.
#[derive(Clone, Copy)]
enum Died {
    /// Its user message entered, the model request in flight.
    InRequest,
    /// The model asked for a tool; its `tool/call` is logged (policy `fail`), its result not.
    InTool,
    /// The model's final answer is logged; the turn's closing events are not.
    AfterAnswer,
    /// Input claimed, nothing entered.
    BeforeEntry,
    /// A tool's result is logged (`concludes`: it concluded the turn), the next step is not.
    AfterResult { concludes: bool },
}

/// Appends turn `turn` (`continues`: a continuation of that turn) cut short as `died` says.
fn crashed_turn(log: &SessionLog, turn: u64, continues: Option<u64>, died: Died) {
    let start = match continues {
        Some(of) => events::turn_start_continuing(turn, of),
        None => events::turn_start(turn),
    };
    append(log, start).unwrap();
    if matches!(died, Died::BeforeEntry) {
        return;
    }
    append(log, events::step_start(turn, 1)).unwrap();
    if continues.is_none() {
        append(log, events::user_message(&Message::user_text(&format!("question {turn}")))).unwrap();
    }
    match died {
        Died::InRequest | Died::BeforeEntry => {}
        Died::InTool => {
            let message = Message::of_tool_calls(&[("c1".into(), "pay".into(), "{}".into())]);
            append(log, events::assistant_message(turn, 1, &message, false, None, Vec::new())).unwrap();
            append(log, events::tool_call(turn, 1, "c1", "pay", "{}", kerman::agent_loop::ToolInfo::default())).unwrap();
        }
        Died::AfterAnswer => {
            let message = Message::of_text(MessageKind::Assistant, "the answer", None);
            append(log, events::assistant_message(turn, 1, &message, false, None, Vec::new())).unwrap();
        }
        Died::AfterResult { concludes } => {
            let message = Message::of_tool_calls(&[("c1".into(), "pay".into(), "{}".into())]);
            append(log, events::assistant_message(turn, 1, &message, false, None, Vec::new())).unwrap();
            let call = append(log, events::tool_call(turn, 1, "c1", "pay", "{}", kerman::agent_loop::ToolInfo::default())).unwrap();
            let result = Message::tool_result_text("c1", "paid");
            append(log, events::tool_result(turn, 1, &result, None, None, Some(call), concludes)).unwrap();
        }
    }
}

/// A store whose open closes crashed turns, and a session `s` in it.
fn store() -> (MemoryStore, SessionLog) {
    let store = MemoryStore::new().with_open_hook(crash_closers());
    let log = store.create(Some("s")).unwrap();
    (store, log)
}

/// The session opened again after the crash (the closers run).
fn reopen(store: &MemoryStore, log: SessionLog) -> SessionLog {
    log.close().unwrap();
    drop(log);
    store.open("s").unwrap()
}

fn due(log: &SessionLog) -> Option<Continuation> {
    log.with_events(continuation::due)
}

fn data_of(log: &SessionLog, kind: &str) -> Vec<Value> {
    log.with_events(|events| events.iter().filter(|e| e.kind() == kind).map(kerman::event_log::Event::data).collect())
}

#[test]
fn an_interrupted_turn_with_unanswered_input_is_due() {
    for died in [Died::InRequest, Died::InTool, Died::AfterResult { concludes: false }] {
        let (store, log) = store();
        crashed_turn(&log, 1, None, died);
        let log = reopen(&store, log);
        assert_eq!(data_of(&log, "turn/end").last().unwrap()["reason"]["kind"], "interrupted");
        assert_eq!(due(&log), Some(Continuation { turn: 1, crashes: 1 }));
        assert_eq!(log.with_events(|e| continuation::next(e, 3)), Some(Continuation { turn: 1, crashes: 1 }));
        // `close` (limit 0) never continues.
        assert_eq!(continuation::next_of(&log, 0), None);
    }
}

#[test]
fn nothing_is_due_when_the_input_was_answered_or_never_entered() {
    // A tool result that concluded the turn answered it: the turn asked the model nothing more.
    for died in [Died::AfterAnswer, Died::BeforeEntry, Died::AfterResult { concludes: true }] {
        let (store, log) = store();
        crashed_turn(&log, 1, None, died);
        let log = reopen(&store, log);
        assert_eq!(data_of(&log, "turn/end").last().unwrap()["reason"]["kind"], "interrupted");
        assert_eq!(due(&log), None);
    }
}

#[test]
fn nothing_is_due_after_a_turn_that_ended_otherwise() {
    let (_, log) = store();
    append(&log, events::turn_start(1)).unwrap();
    append(&log, events::step_start(1, 1)).unwrap();
    append(&log, events::user_message(&Message::user_text("hi"))).unwrap();
    append(&log, events::step_end(1, 1)).unwrap();
    append(&log, events::turn_end(1, &Ending::Error(Failure::new(FailureCode::Unknown, "model down")))).unwrap();
    assert_eq!(due(&log), None);
    // An open turn (a held step, a step in doubt a resume settles) is not a continuation's.
    append(&log, events::turn_start(2)).unwrap();
    assert_eq!(due(&log), None);
}

#[test]
fn a_crashed_continuation_is_due_again_and_counts_the_chain() {
    let (store, log) = store();
    crashed_turn(&log, 1, None, Died::InRequest);
    let log = reopen(&store, log);
    crashed_turn(&log, 2, Some(1), Died::InRequest);
    let log = reopen(&store, log);
    assert_eq!(due(&log), Some(Continuation { turn: 2, crashes: 2 }));
    assert_eq!(continuation::next_of(&log, 2), None);
    assert_eq!(continuation::next_of(&log, 3), Some(Continuation { turn: 2, crashes: 2 }));
    crashed_turn(&log, 3, Some(2), Died::InTool);
    let log = reopen(&store, log);
    assert_eq!(due(&log), Some(Continuation { turn: 3, crashes: 3 }));
    // A continuation that logged the answer before it crashed: nothing left to answer.
    crashed_turn(&log, 4, Some(3), Died::AfterAnswer);
    let log = reopen(&store, log);
    assert_eq!(due(&log), None);
}

#[test]
fn a_new_turn_after_an_unanswered_one_starts_no_chain() {
    let (store, log) = store();
    crashed_turn(&log, 1, None, Died::InRequest);
    let log = reopen(&store, log);
    // Turn 2 (not a continuation) crashed too: only its own input counts, and the chain is one.
    crashed_turn(&log, 2, None, Died::InRequest);
    let log = reopen(&store, log);
    assert_eq!(due(&log), Some(Continuation { turn: 2, crashes: 1 }));
}

/// Drives a continuation: the model answers `answer`; the effects seen and the requests'
/// history lengths.
fn run_continuation(log: &SessionLog, limit: u32, answer: &str) -> Option<(Vec<String>, Vec<usize>)> {
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let shared = Shared::resume(log);
    shared.state().continue_crashes = limit;
    let lookup = |_: &str| -> Option<kerman::agent_loop::ToolInfo> { None };
    let ctx = Ctx { log, inbox: &inbox, shared: &shared, tools: &lookup, max_parallel: 4, gated: false };
    let (mut machine, mut effect) = Machine::continue_interrupted(&ctx)?;
    let mut seen = Vec::new();
    let mut histories = Vec::new();
    loop {
        seen.push(format!("{effect:?}").split([' ', '{', '(']).next().unwrap().to_string());
        let input = match &effect {
            Effect::BeforeRequest => {
                histories.push(shared.history.len());
                assert!(machine.entered().is_empty(), "a continuation enters nothing");
                Input::Requested(Requested::Request { options: Ok("{}".into()), canonical: "{}".into(), instructions: None })
            }
            Effect::CallModel => Input::Reply(Reply { content: ReplyContent::Text(answer.into()), usage: None, max_tokens: false }),
            Effect::Finished | Effect::NoTurn => break,
            Effect::Describe(e) => panic!("core error {e}"),
            Effect::PreStep { .. } | Effect::RunTools => panic!("unexpected {effect:?}"),
            _ => Input::Continue,
        };
        effect = machine.resume(&ctx, input);
    }
    Some((seen, histories))
}

#[test]
fn the_continuation_asks_the_model_again_and_ends_the_turn() {
    let (store, log) = store();
    crashed_turn(&log, 1, None, Died::InTool);
    let log = reopen(&store, log);
    let before = log.len();
    assert!(run_continuation(&log, 0, "no").is_none(), "limit 0 never continues");
    assert_eq!(log.len(), before);
    let (seen, histories) = run_continuation(&log, 3, "sorry, the payment's outcome is unknown").unwrap();
    assert_eq!(seen.first().map(String::as_str), Some("BeforeRequest"));
    // The request's history: the question, the call, its closer's result.
    assert_eq!(histories, [3]);
    let kinds: Vec<String> = log.range(before, None).iter().map(|e| e.kind().to_string()).collect();
    assert_eq!(kinds, ["turn/start", "step/start", "request/header", "assistant/message", "step/end", "turn/end"]);
    let starts = data_of(&log, "turn/start");
    assert_eq!(starts[1], json!({"turn": 2, "continues": 1}));
    assert_eq!(data_of(&log, "turn/end").last().unwrap(), &json!({"turn": 2, "reason": {"kind": "completed"}}));
    // Answered: nothing is due any more, and the one tool call has one result.
    assert_eq!(due(&log), None);
    assert_eq!(data_of(&log, "tool/result").len(), 1);
    assert!(run_continuation(&log, 3, "twice").is_none());
}

#[test]
fn a_loop_at_its_limit_starts_no_continuation() {
    let (store, log) = store();
    crashed_turn(&log, 1, None, Died::InRequest);
    let log = reopen(&store, log);
    crashed_turn(&log, 2, Some(1), Died::InRequest);
    let log = reopen(&store, log);
    assert!(run_continuation(&log, 2, "no").is_none());
    let (_, _) = run_continuation(&log, 3, "yes").unwrap();
    assert_eq!(data_of(&log, "turn/start")[2], json!({"turn": 3, "continues": 2}));
    assert_eq!(due(&log), None);
}
