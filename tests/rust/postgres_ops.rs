//! Operations staged for a session's owner (`PgCore::apply_op`: cancel, replace, remove, requeue, decide) at the
//! core level: staged in one ordered stream with `enqueue`'s messages, delivered to the owner's
//! inbox in that order (by NOTIFY or by the staged read), applied there and answered; withdrawn
//! when nobody answers; and the schema migration that added them. Skips like
//! `postgres_store.rs` without `KERMAN_PG_DSN`.

use std::fmt::Write as _;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use kerman::event_log::postgres::{PgCore, PgOptions, PostgresStore, MIGRATIONS};
use kerman::event_log::{StagedInput, StagedOp, Store};
use kerman::inbox::{Inbox, InboxListener, Target};
use kerman::message::Message;
use serde_json::{json, Value};

use super::postgres_store::fresh_schema;

const DEADLINE: Duration = Duration::from_secs(30);

fn dsn() -> Option<String> {
    std::env::var("KERMAN_PG_DSN").ok().filter(|d| !d.is_empty())
}

pub fn store(dsn: &str) -> PostgresStore {
    PostgresStore::connect(dsn, PgOptions::default()).unwrap()
}

/// Runs `sql` (statements separated by `;`); the first column of the last one when it is a `SELECT`.
pub fn query(dsn: &str, sql: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
        let last = sql.rsplit(';').find(|s| !s.trim().is_empty()).unwrap();
        match last.trim_start().to_lowercase().starts_with("select") {
            true => client.query_one(last, &[]).await.unwrap().get(0),
            false => String::new(),
        }
    })
}

fn staged(message: &Message) -> StagedInput {
    StagedInput { id: message.id().into(), message: message.json().into(), target: "next-turn".into(), wakeup: false, op: StagedOp::Insert }
}

fn staged_count(dsn: &str, id: &str) -> String {
    query(dsn, &format!("SELECT count(*)::text FROM kerman_inbox_staged WHERE session_id = '{id}'"))
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn outcome(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn ids(inbox: &Inbox) -> Vec<String> {
    inbox.list(Target::NextTurn).iter().map(|m| m.id().to_string()).collect()
}

#[test]
fn replace_and_remove_are_applied_by_the_owners_inbox_and_answered() {
    let Some(dsn) = dsn() else { return };
    let owner = store(&dsn);
    let log = owner.create(None).unwrap();
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let web = store(&dsn);
    let (a, b) = (Message::user_text("a"), Message::user_text("b"));
    assert!(web.enqueue(log.id(), staged(&a)).unwrap());
    assert!(web.enqueue(log.id(), staged(&b)).unwrap());
    // Staged after the two messages, so applied after they are in: no wait needed for them.
    let wait = Duration::from_secs(10);
    let removed = outcome(&web.apply_op(log.id(), StagedOp::Remove, &json!({"message_id": b.id()}), wait).unwrap());
    assert_eq!(removed["applied"], true, "{removed}");
    assert_eq!(removed["removed"]["id"], b.id());
    let replaced = outcome(&web.apply_op(log.id(), StagedOp::Replace, &json!({"message_id": a.id(), "text": "a2"}), wait).unwrap());
    assert_eq!(replaced["applied"], true, "{replaced}");
    assert_eq!(replaced["message"]["id"], a.id());
    assert_eq!(ids(&inbox), vec![a.id().to_string()]);
    assert_eq!(inbox.get(a.id()).unwrap().text(), "a2");

    let again = outcome(&web.apply_op(log.id(), StagedOp::Remove, &json!({"message_id": b.id()}), wait).unwrap());
    assert_eq!((again["applied"].clone(), again["reason"].clone()), (json!(false), json!("not-queued")), "{again}");
    let unknown = outcome(&web.apply_op(log.id(), StagedOp::Remove, &json!({"message_id": "nope"}), wait).unwrap());
    assert_eq!(unknown["reason"], "message-not-found", "{unknown}");
    // No loop over this inbox: a cancel is refused, not dropped.
    let cancel = outcome(&web.apply_op(log.id(), StagedOp::Cancel, &json!({"cause": "user", "keep_inbox": true}), wait).unwrap());
    assert_eq!(cancel["reason"], "no-loop", "{cancel}");
    assert!(matches!(
        web.apply_op("no such session", StagedOp::Remove, &json!({"message_id": "x"}), wait),
        Err(kerman::event_log::LogError::NotFound { .. })
    ));
    // Answered only after the owner's splices committed, and nothing is left staged or unread.
    let follower = web.follow(log.id()).unwrap();
    assert_eq!(follower.len(), log.len());
    assert_eq!(staged_count(&dsn, log.id()), "0");
    until("the answers to be forgotten", || {
        query(&dsn, &format!("SELECT count(*)::text FROM kerman_inbox_outcomes WHERE session_id = '{}'", log.id())) == "0"
    });
    follower.close().unwrap();
    log.close().unwrap();
}

/// Stands in for the owner's loop: records, in order, the messages inserted and the requeues
/// asked of it, and answers a requeue of turn 1 as applied and any other turn as refused.
#[derive(Clone, Default)]
struct LoopStandIn(Arc<Mutex<Vec<String>>>);

impl InboxListener for LoopStandIn {
    fn inserted(&self, message: &Arc<Message>) {
        self.0.lock().unwrap().push(format!("inserted {}", message.text()));
    }

    fn requeue(&self, turn: u64) -> Option<Value> {
        self.0.lock().unwrap().push(format!("requeue {turn}"));
        Some(match turn {
            1 => json!({"applied": true, "op": "requeue", "turn": turn, "requeued": ["m-1"]}),
            _ => {
                json!({"applied": false, "op": "requeue", "reason": "nothing-to-requeue", "detail": format!("turn {turn} left nothing unread")})
            }
        })
    }
}

#[test]
fn a_requeue_is_staged_in_order_applied_by_the_owners_loop_and_answered() {
    let Some(dsn) = dsn() else { return };
    let owner = store(&dsn);
    let log = owner.create(None).unwrap();
    let seen = LoopStandIn::default();
    let inbox = Inbox::new(log.clone(), Some(Box::new(seen.clone()))).unwrap();
    let web = store(&dsn);
    let wait = Duration::from_secs(10);
    let (a, b) = (Message::user_text("a"), Message::user_text("b"));
    assert!(web.enqueue(log.id(), staged(&a)).unwrap());
    let applied = outcome(&web.apply_op(log.id(), StagedOp::Requeue, &json!({"turn": 1}), wait).unwrap());
    assert_eq!(applied, json!({"applied": true, "op": "requeue", "turn": 1, "requeued": ["m-1"]}));
    assert!(web.enqueue(log.id(), staged(&b)).unwrap());
    until("b to arrive", || inbox.contains(b.id()));
    assert_eq!(*seen.0.lock().unwrap(), ["inserted a", "requeue 1", "inserted b"], "one ordered stream");

    // The loop's refusal reaches the requester as it gave it.
    let refused = outcome(&web.apply_op(log.id(), StagedOp::Requeue, &json!({"turn": 7}), wait).unwrap());
    assert_eq!((refused["applied"].clone(), refused["reason"].clone()), (json!(false), json!("nothing-to-requeue")), "{refused}");
    // Not a turn number: refused before the loop is asked, naming the value.
    for bad in [json!({"turn": 0}), json!({"turn": "1"}), json!({})] {
        let invalid = outcome(&web.apply_op(log.id(), StagedOp::Requeue, &bad, wait).unwrap());
        assert_eq!(invalid["reason"], "invalid", "{invalid}");
        assert!(invalid["detail"].as_str().unwrap().contains("turn"), "{invalid}");
    }
    assert_eq!(seen.0.lock().unwrap().iter().filter(|s| s.starts_with("requeue")).count(), 2);
    assert_eq!(staged_count(&dsn, log.id()), "0");
    inbox.close();
    log.close().unwrap();
}

#[test]
fn a_requeue_reaching_an_inbox_without_a_loop_is_refused() {
    let Some(dsn) = dsn() else { return };
    let owner = store(&dsn);
    let log = owner.create(None).unwrap();
    let _inbox = Inbox::new(log.clone(), None).unwrap();
    let web = store(&dsn);
    let out = outcome(&web.apply_op(log.id(), StagedOp::Requeue, &json!({"turn": 1}), Duration::from_secs(10)).unwrap());
    assert_eq!(
        (out["applied"].clone(), out["op"].clone(), out["reason"].clone()),
        (json!(false), json!("requeue"), json!("no-loop")),
        "{out}"
    );
    log.close().unwrap();
}

#[test]
fn operations_staged_while_no_inbox_is_attached_are_read_in_order_with_the_messages() {
    let Some(dsn) = dsn() else { return };
    let owner = store(&dsn);
    let log = owner.create(None).unwrap();
    let id = log.id().to_string();
    let (m1, m2, m3) = (Message::user_text("m1"), Message::user_text("m2"), Message::user_text("m3"));
    let (tx, rx) = mpsc::channel();
    let producer = {
        let (dsn, id, m1, m2, m3) = (dsn.clone(), id.clone(), m1.clone(), m2.clone(), m3.clone());
        std::thread::spawn(move || {
            let web = store(&dsn);
            let wait = Duration::from_secs(20);
            // One producer: message, removal of it, message, replacement of it, message.
            web.enqueue(&id, staged(&m1)).unwrap();
            tx.send(outcome(&web.apply_op(&id, StagedOp::Remove, &json!({"message_id": m1.id()}), wait).unwrap())).unwrap();
            web.enqueue(&id, staged(&m2)).unwrap();
            tx.send(outcome(&web.apply_op(&id, StagedOp::Replace, &json!({"message_id": m2.id(), "text": "m2'"}), wait).unwrap())).unwrap();
            web.enqueue(&id, staged(&m3)).unwrap();
        })
    };
    // The removal waits, staged behind m1, until an inbox attaches.
    until("m1 and its removal to be staged", || staged_count(&dsn, &id) == "2");
    let inbox = Inbox::new(log.clone(), None).unwrap();
    let removed = rx.recv_timeout(DEADLINE).unwrap();
    assert_eq!((removed["applied"].clone(), removed["message_id"].clone()), (json!(true), json!(m1.id())), "{removed}");
    let replaced = rx.recv_timeout(DEADLINE).unwrap();
    assert_eq!(replaced["applied"], true, "{replaced}");
    producer.join().unwrap();
    until("m3 to arrive", || inbox.contains(m3.id()));
    assert_eq!(ids(&inbox), vec![m2.id().to_string(), m3.id().to_string()]);
    assert_eq!(inbox.get(m2.id()).unwrap().text(), "m2'");
    log.close().unwrap();
}

#[test]
fn an_operation_nobody_answers_is_withdrawn() {
    let Some(dsn) = dsn() else { return };
    let s = store(&dsn);
    let log = s.create(None).unwrap();
    let id = log.id().to_string();
    log.close().unwrap();
    let out = outcome(&s.apply_op(&id, StagedOp::Remove, &json!({"message_id": "m"}), Duration::from_millis(300)).unwrap());
    assert_eq!((out["applied"].clone(), out["reason"].clone()), (json!(false), json!("timeout")), "{out}");
    assert_eq!(staged_count(&dsn, &id), "0", "withdrawn: no later owner applies it");
}

#[test]
fn schema_version_5_migrates_a_version_4_database_keeping_its_staged_messages() {
    let Some(dsn) = dsn() else { return };
    let (dsn, schema) = fresh_schema(&dsn);
    // A database as kerman left it at version 4, with a message staged for an unowned session.
    let mut setup =
        String::from("CREATE TABLE kerman_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());");
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 <= 4) {
        setup.push_str(sql);
        let _ = write!(setup, ";INSERT INTO kerman_schema (version) VALUES ({version});");
    }
    let m = Message::user_text("staged at version 4");
    let text = m.json().replace('\'', "''");
    let _ = write!(
        setup,
        "INSERT INTO kerman_sessions (id, header) VALUES ('old', '{{\"kerman\":1,\"id\":\"old\",\"createdAt\":0}}');
         INSERT INTO kerman_inbox_staged (session_id, message_id, message, target, wakeup) VALUES ('old', '{}', '{text}', 'next-turn', true);",
        m.id()
    );
    query(&dsn, &format!("SET search_path TO {schema};{setup}"));
    let core = PgCore::connect(&dsn, PgOptions::default()).unwrap();
    assert_eq!(core.applied_migrations(), &[5, 6, 7, 8, 9]);
    assert_eq!(query(&dsn, &format!("SELECT op FROM {schema}.kerman_inbox_staged")), "insert");
    drop(core);
    let log = store(&dsn).open("old").unwrap();
    let inbox = Inbox::new(log.clone(), None).unwrap();
    until("the old staged message", || inbox.contains(m.id()));
    log.close().unwrap();
}

#[test]
fn schema_version_6_lets_a_version_5_database_stage_requeues() {
    let Some(dsn) = dsn() else { return };
    let (dsn, schema) = fresh_schema(&dsn);
    let mut setup =
        String::from("CREATE TABLE kerman_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());");
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 <= 5) {
        setup.push_str(sql);
        let _ = write!(setup, ";INSERT INTO kerman_schema (version) VALUES ({version});");
    }
    query(&dsn, &format!("SET search_path TO {schema};{setup}"));
    let core = PgCore::connect(&dsn, PgOptions::default()).unwrap();
    assert_eq!(core.applied_migrations(), &[6, 7, 8, 9]);
    drop(core);
    let s = store(&dsn);
    let log = s.create(None).unwrap();
    let id = log.id().to_string();
    log.close().unwrap();
    // Staged (the column accepts the name), then withdrawn: nobody owns the session.
    let out = outcome(&s.apply_op(&id, StagedOp::Requeue, &json!({"turn": 1}), Duration::from_millis(300)).unwrap());
    assert_eq!(out["reason"], "timeout", "{out}");
}

#[test]
fn schema_version_8_lets_a_version_7_database_stage_resolves() {
    let Some(dsn) = dsn() else { return };
    let (dsn, schema) = fresh_schema(&dsn);
    let mut setup =
        String::from("CREATE TABLE kerman_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());");
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 <= 7) {
        setup.push_str(sql);
        let _ = write!(setup, ";INSERT INTO kerman_schema (version) VALUES ({version});");
    }
    query(&dsn, &format!("SET search_path TO {schema};{setup}"));
    let core = PgCore::connect(&dsn, PgOptions::default()).unwrap();
    assert_eq!(core.applied_migrations(), &[8, 9]);
    drop(core);
    let s = store(&dsn);
    let log = s.create(None).unwrap();
    let id = log.id().to_string();
    log.close().unwrap();
    // Staged (the column accepts the name), then withdrawn: nobody owns the session.
    let args = json!({"call_id": "c1", "text": "done by hand", "is_error": false});
    let out = outcome(&s.apply_op(&id, StagedOp::Resolve, &args, Duration::from_millis(300)).unwrap());
    assert_eq!(out["reason"], "timeout", "{out}");
}

#[test]
fn a_staged_message_replaced_while_its_insertion_commits_is_claimed_once() {
    let Some(dsn) = dsn() else { return };
    let owner = store(&dsn);
    let log = owner.create(None).unwrap();
    let a = Message::user_text("a");
    assert!(store(&dsn).enqueue(log.id(), staged(&a)).unwrap());
    // Another transaction holds the session row: the owner's append claiming `a` waits in flight.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.batch_execute(&format!("BEGIN; SELECT 1 FROM kerman_sessions WHERE id = '{}' FOR UPDATE", log.id())).await.unwrap();
        client
    });
    let inbox = Inbox::new(log.clone(), None).unwrap();
    until("a to be inserted", || inbox.contains(a.id()));
    // Replaced (same id) while that insertion is in flight: its splice inserts `a` again.
    assert!(inbox.replace(a.id(), std::sync::Arc::new(a.with_content(vec![json!({"type": "text", "text": "a2"})]).unwrap())).unwrap());
    rt.block_on(client.batch_execute("COMMIT")).unwrap();
    log.flush_blocking().expect("the replacement's splice commits: it claims nothing a second time");
    assert_eq!(staged_count(&dsn, log.id()), "0");
    assert_eq!(inbox.get(a.id()).unwrap().text(), "a2");
    log.close().unwrap();
}
