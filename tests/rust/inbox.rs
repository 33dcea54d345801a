//! Inbox behaviour through the public Rust API (reference sections 3 and 7.1).

use std::sync::{Arc, Mutex};

use kerman::event_log::{MemoryStore, SessionLog, Store};
use kerman::inbox::{Inbox, InboxError, InboxListener, Target};
use kerman::message::Message;
use serde_json::{json, Value};

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
}

struct Listener(Arc<Recorder>);

impl InboxListener for Listener {
    fn inserted(&self, m: &Arc<Message>) {
        self.0.seen.lock().unwrap().push(format!("+{}", m.id()));
    }
    fn discarded(&self, m: &Arc<Message>) {
        self.0.seen.lock().unwrap().push(format!("-{}", m.id()));
    }
    fn claimed(&self, m: &Arc<Message>, turn: u64) {
        self.0.seen.lock().unwrap().push(format!("claim{turn}:{}", m.id()));
    }
}

fn msg(id: &str) -> Arc<Message> {
    Arc::new(Message::user(vec![json!({"type": "text", "text": id})], None, Some(id.into())).unwrap())
}

fn setup() -> (SessionLog, Inbox, Arc<Recorder>) {
    let log = MemoryStore::new().create(None).unwrap();
    let recorder = Arc::new(Recorder::default());
    let inbox = Inbox::new(log.clone(), Some(Box::new(Listener(Arc::clone(&recorder))))).unwrap();
    (log, inbox, recorder)
}

fn payloads(log: &SessionLog) -> Vec<Value> {
    log.range(0, None).iter().map(kerman::Event::data).collect()
}

fn ids(list: &[Arc<Message>]) -> Vec<&str> {
    list.iter().map(|m| m.id()).collect()
}

#[test]
fn inb_02_replace_semantics() {
    let (log, inbox, recorder) = setup();
    inbox.append(Target::NextTurn, msg("O")).unwrap();
    inbox.append(Target::NextStep, msg("S")).unwrap();
    assert!(!inbox.replace("missing", msg("R")).unwrap());
    let before = log.len();
    assert!(inbox.replace("O", msg("R")).unwrap());
    assert!(inbox.replace("S", msg("S")).unwrap());
    assert_eq!(ids(&inbox.list(Target::NextTurn)), ["R"]);
    assert_eq!(log.len(), before + 2);
    let err = inbox.replace("S", msg("R")).unwrap_err();
    assert_eq!(err.to_string(), "message \"R\" is already pending");
    assert_eq!(*recorder.seen.lock().unwrap(), ["+O", "+S", "-O", "+R", "-S", "+S"]);
}

#[test]
fn inb_04_clear_logs_two_splices_then_nothing() {
    let (log, inbox, _) = setup();
    inbox.append(Target::NextTurn, msg("T")).unwrap();
    inbox.append(Target::NextStep, msg("S")).unwrap();
    let removed = inbox.clear().unwrap();
    assert_eq!(ids(&removed), ["S", "T"]);
    let p = payloads(&log);
    assert_eq!(p[2], json!({"target": "next-step", "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"}));
    assert_eq!(p[3], json!({"target": "next-turn", "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"}));
    inbox.clear().unwrap();
    assert_eq!(log.len(), 4);
}

#[test]
fn inb_06_claim_is_pure_deletion_then_claimed() {
    let (log, inbox, recorder) = setup();
    for id in ["X", "Y"] {
        inbox.append(Target::NextStep, msg(id)).unwrap();
    }
    for id in ["P", "Q"] {
        inbox.append(Target::NextTurn, msg(id)).unwrap();
    }
    recorder.seen.lock().unwrap().clear();
    let batch = inbox.claim(Target::NextTurn, 7).unwrap();
    assert_eq!(ids(&batch), ["X", "Y", "P"]);
    assert_eq!(ids(&inbox.list(Target::NextTurn)), ["Q"]);
    let p = payloads(&log);
    assert_eq!(p[4], json!({"target": "next-step", "start": 0, "removedCount": 2, "inserted": []}));
    assert_eq!(p[5], json!({"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}));
    assert_eq!(*recorder.seen.lock().unwrap(), ["claim7:X", "claim7:Y", "claim7:P"]);
}

#[test]
fn a_claim_by_a_foreign_loop_names_its_claimant_in_the_one_splice() {
    // A framework's loop (pydantic-ai under KermanDurability) claims at its own step boundaries:
    // the claim and the record of who claimed it for what must be one append, so a crash cannot
    // leave a message claimed with nobody knowing where it went.
    let (log, inbox, recorder) = setup();
    inbox.append(Target::NextStep, msg("S")).unwrap();
    inbox.append(Target::NextTurn, msg("P")).unwrap();
    recorder.seen.lock().unwrap().clear();
    let by = json!({"kind": "pydantic-ai", "run": 2, "n": 0});
    let batch = inbox.claim_by(Target::NextTurn, 0, Some(&by)).unwrap();
    assert_eq!(ids(&batch), ["S", "P"]);
    let p = payloads(&log);
    assert_eq!(p[2], json!({"target": "next-step", "start": 0, "removedCount": 1, "inserted": [], "by": by}));
    assert_eq!(p[3], json!({"target": "next-turn", "start": 0, "removedCount": 1, "inserted": [], "by": by}));
    assert_eq!(*recorder.seen.lock().unwrap(), ["claim0:S", "claim0:P"]);
    // An empty claim logs nothing, claimant or not; the splices replay as ordinary claims.
    assert!(inbox.claim_by(Target::NextStep, 0, Some(&by)).unwrap().is_empty());
    assert_eq!(log.len(), 4);
    drop(inbox);
    let again = Inbox::new(log.clone(), None).unwrap();
    assert!(again.is_empty());
    // A claimant must be a JSON object (it is read back as one).
    let err = again.claim_by(Target::NextStep, 0, Some(&json!("run 2"))).unwrap_err();
    assert!(err.to_string().contains("claimant must be a JSON object"), "{err}");
}

#[test]
fn inb_07_empty_claim_logs_nothing() {
    let (log, inbox, recorder) = setup();
    assert!(inbox.claim(Target::NextTurn, 1).unwrap().is_empty());
    assert_eq!(log.len(), 0);
    assert!(recorder.seen.lock().unwrap().is_empty());
}

#[test]
fn splice_uses_python_slice_semantics() {
    let (log, inbox, _) = setup();
    inbox.splice(Target::NextTurn, i64::MIN, i64::MIN, vec![msg("A"), msg("B")]).unwrap();
    let removed = inbox.splice(Target::NextTurn, -1, 1, vec![]).unwrap();
    assert_eq!(ids(&removed), ["B"]);
    assert_eq!(payloads(&log)[1], json!({"target": "next-turn", "start": 1, "removedCount": 1, "inserted": [], "outcome": "canceled"}));
    assert!(inbox.splice(Target::NextTurn, 5, 5, vec![]).unwrap().is_empty());
    assert_eq!(log.len(), 2);
}

#[test]
fn duplicates_are_refused_and_nothing_is_logged() {
    let (log, inbox, _) = setup();
    inbox.append(Target::NextTurn, msg("A")).unwrap();
    let err = inbox.append(Target::NextStep, msg("A")).unwrap_err();
    assert!(matches!(err, InboxError::Duplicate(ref id) if id == "A"));
    assert_eq!(log.len(), 1);
    inbox.remove("A").unwrap();
    inbox.append(Target::NextStep, msg("A")).unwrap();
    assert_eq!(ids(&inbox.list(Target::NextStep)), ["A"]);
}

#[test]
fn replay_rebuilds_the_lists() {
    let (log, inbox, _) = setup();
    inbox.append(Target::NextTurn, msg("A")).unwrap();
    inbox.append(Target::NextStep, msg("B")).unwrap();
    inbox.append(Target::NextTurn, msg("C")).unwrap();
    inbox.claim(Target::NextTurn, 1).unwrap();
    drop(inbox);
    let again = Inbox::new(log, None).unwrap();
    assert_eq!(ids(&again.list(Target::NextTurn)), ["C"]);
    assert!(again.list(Target::NextStep).is_empty());
}

#[test]
fn inb_01_bad_persisted_splice_fails_replay_with_its_seq() {
    use kerman::event_log::{Backend, Event, FlushCallback, LogError};
    struct Null;
    impl Backend for Null {
        fn enqueue(&self, _: &Event) -> Result<(), LogError> {
            Ok(())
        }
        fn flush(&self, done: FlushCallback) {
            done(Ok(()));
        }
        fn close(&self, _: Vec<Event>) -> Result<(), LogError> {
            Ok(())
        }
    }
    let text = r#"{"type":"agent/inbox/spliced","seq":0,"time":1,"data":{"target":"next-turn","start":1,"inserted":[]}}"#;
    let event = Event::from_json(text, &mut |k: &str| Arc::from(k)).unwrap();
    let log = SessionLog::from_parts("s".into(), serde_json::Map::new(), vec![event], Box::new(Null));
    let err = Inbox::new(log.clone(), None).unwrap_err();
    assert!(matches!(&err, InboxError::Projection(e) if e.seq == 0), "{err}");
    assert!(err.to_string().starts_with("invalid persisted inbox splice at session seq 0"));
    // A refused inbox does not count as the log's inbox.
    assert!(matches!(Inbox::new(log, None), Err(InboxError::Projection(_))));
}

#[test]
fn observers_see_pre_splice_lists() {
    let (log, inbox, _) = setup();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (probe, sink) = (inbox.clone(), Arc::clone(&seen));
    log.subscribe(Arc::new(move |_| sink.lock().unwrap().push(probe.len())));
    inbox.append(Target::NextTurn, msg("A")).unwrap();
    inbox.append(Target::NextTurn, msg("B")).unwrap();
    assert_eq!(*seen.lock().unwrap(), [0, 1]);
}

#[test]
fn an_observer_mutating_the_inbox_is_refused_as_reentrant() {
    let (log, inbox, _) = setup();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (probe, sink) = (inbox.clone(), Arc::clone(&errors));
    log.subscribe(Arc::new(move |e| {
        if e.kind() == "agent/inbox/spliced" && probe.is_empty() {
            sink.lock().unwrap().push(probe.append(Target::NextTurn, msg("inner")).unwrap_err().to_string());
        }
    }));
    inbox.append(Target::NextTurn, msg("outer")).unwrap();
    assert_eq!(ids(&inbox.list(Target::NextTurn)), ["outer"]);
    assert_eq!(*errors.lock().unwrap(), ["session append cannot reenter while another append is being published"]);
}

#[test]
fn concurrent_mutations_stay_consistent_with_the_log() {
    let (log, inbox, _) = setup();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let inbox = inbox.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    let id = format!("{t}-{i}");
                    inbox.append(Target::NextTurn, msg(&id)).unwrap();
                    if i % 3 == 0 {
                        inbox.remove(&id).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    inbox.close();
    let replayed = Inbox::new(log, None).unwrap();
    assert_eq!(ids(&replayed.list(Target::NextTurn)), ids(&inbox.list(Target::NextTurn)));
    assert_eq!(inbox.len(), 4 * (200 - 67));
}

#[test]
fn a_log_has_at_most_one_inbox() {
    let (log, inbox, _) = setup();
    inbox.append(Target::NextTurn, msg("A")).unwrap();
    let err = Inbox::new(log.clone(), None).unwrap_err();
    assert!(matches!(&err, InboxError::Attached(id) if id == log.id()), "{err}");
    assert!(err.to_string().contains("already has an inbox"), "{err}");
    // A clone is the same inbox, not a second one.
    let clone = inbox.clone();
    drop(inbox);
    assert!(matches!(Inbox::new(log.clone(), None), Err(InboxError::Attached(_))));
    // Closing gives the log up: the closed inbox refuses mutations, a new one replays.
    clone.close();
    clone.close();
    assert!(clone.is_closed());
    let err = clone.append(Target::NextTurn, msg("B")).unwrap_err();
    assert!(matches!(&err, InboxError::Closed(_)), "{err}");
    assert!(matches!(clone.clear(), Err(InboxError::Closed(_))), "clearing pending input is a change");
    assert!(clone.remove("nope").is_ok(), "a no-op writes nothing and is not refused");
    let again = Inbox::new(log.clone(), None).unwrap();
    assert_eq!(ids(&again.list(Target::NextTurn)), ["A"]);
    // Dropping gives it up too.
    drop(again);
    Inbox::new(log, None).unwrap();
}

/// An insertion hook that rewrites `secret` and refuses `refuse`, counting its calls.
struct Redactor(Arc<Mutex<Vec<String>>>);

impl kerman::inbox::InsertHook for Redactor {
    fn admit(&self, target: Target, m: Arc<Message>) -> Result<Arc<Message>, kerman::inbox::Refusal> {
        self.0.lock().unwrap().push(format!("{target}:{}", m.id()));
        match m.id() {
            "refuse" => Err(kerman::inbox::Refusal::new("refused by the test")),
            "rename" => Ok(msg("renamed")),
            "secret" => Ok(Arc::new(m.with_content(vec![json!({"type": "text", "text": "[redacted]"})]).unwrap())),
            _ => Ok(m),
        }
    }
}

#[test]
fn insert_hook_rewrites_refuses_and_is_skipped_by_reinsert() {
    let log = MemoryStore::new().create(None).unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let inbox = Inbox::with_hook(log.clone(), None, Some(Box::new(Redactor(Arc::clone(&asked))))).unwrap();
    let spliced = inbox.insert(Target::NextTurn, 0, 0, vec![msg("a"), msg("secret")]).unwrap();
    assert_eq!(spliced.inserted[1].text(), "[redacted]");
    assert!(!log.range(0, None)[0].data_json().contains("\"text\":\"secret\""));
    let before = payloads(&log);
    for refused in [vec![msg("b"), msg("refuse")], vec![msg("rename")]] {
        let err = inbox.insert(Target::NextStep, 0, 0, refused).unwrap_err();
        assert!(matches!(err, InboxError::Refused(_)), "{err:?}");
    }
    assert_eq!(inbox.replace("a", msg("refuse")).unwrap_err().to_string(), "refused by the test");
    assert_eq!(payloads(&log), before);
    assert_eq!(ids(&inbox.list(Target::NextTurn)), ["a", "secret"]);
    assert!(inbox.list(Target::NextStep).is_empty());
    let asked_before = asked.lock().unwrap().len();
    inbox.reinsert(Target::NextStep, 0, 0, vec![msg("refuse")]).unwrap();
    assert_eq!(asked.lock().unwrap().len(), asked_before, "a reinsert is not passed to the hook");
    assert_eq!(ids(&inbox.list(Target::NextStep)), ["refuse"]);
}
