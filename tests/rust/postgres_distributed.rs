//! The PostgreSQL store's cross-process parts (issue 6, part B) at the core level: followers,
//! staged input claimed by the owner's append transaction, and the channel names the server
//! and the client must agree on. Two stores in one process are two owners/processes as far as
//! the database is concerned. Skips like `postgres_store.rs` without `KERMAN_PG_DSN`.

use std::sync::mpsc;
use std::time::Duration;

use kerman::event_log::postgres::{channel_name, Channel, PgOptions, PostgresStore, Request};
use kerman::event_log::{LogError, StagedInput, StagedOp, Store};
use kerman::inbox::{Inbox, Target};
use kerman::message::Message;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

fn dsn() -> Option<String> {
    match std::env::var("KERMAN_PG_DSN") {
        Ok(dsn) if !dsn.is_empty() => Some(dsn),
        _ => {
            assert!(std::env::var("KERMAN_PG_REQUIRED").as_deref() != Ok("1"), "KERMAN_PG_REQUIRED=1 but KERMAN_PG_DSN is unset");
            eprintln!("skipped: KERMAN_PG_DSN is unset (run scripts/pg-test-server.sh)");
            None
        }
    }
}

fn store(dsn: &str) -> PostgresStore {
    PostgresStore::connect(dsn, PgOptions::default()).unwrap()
}

fn query_one(dsn: &str, sql: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.query_one(sql, &[]).await.unwrap().get(0)
    })
}

fn staged(message: &Message, target: Target, wakeup: bool) -> StagedInput {
    StagedInput { id: message.id().into(), message: message.json().into(), target: target.as_str().into(), wakeup, op: StagedOp::default() }
}

/// Waits (bounded) until `log` holds more than `len` events.
fn wait_beyond(log: &kerman::event_log::SessionLog, len: u64) {
    let (tx, rx) = mpsc::channel();
    log.wait_beyond(
        len,
        Box::new(move || {
            let _ = tx.send(());
        }),
    );
    rx.recv_timeout(DEADLINE).expect("the log did not grow in time");
}

#[test]
fn channel_names_match_the_servers_md5() {
    let Some(dsn) = dsn() else { return };
    let id = "é/a session id\u{1}with odd bytes, longer than sixty-three bytes in all, surely by now";
    let sql = format!("SELECT 'kerman_a_' || md5('{}')", id.replace('\'', "''"));
    assert_eq!(channel_name(Channel::Appends, id), query_one(&dsn, &sql));
    assert!(channel_name(Channel::Enqueued, id).starts_with("kerman_e_"));
}

#[test]
fn a_follower_grows_with_the_owners_commits_and_refuses_appends() {
    let Some(dsn) = dsn() else { return };
    let owner = store(&dsn).create(None).unwrap();
    owner.append("test/n", &json!({"i": 0})).unwrap();
    owner.flush_blocking().unwrap();
    let follower = store(&dsn).follow(owner.id()).unwrap();
    assert_eq!(follower.len(), 1);
    for i in 1..4 {
        owner.append("test/n", &json!({"i": i})).unwrap();
    }
    owner.flush_blocking().unwrap();
    while follower.len() < 4 {
        wait_beyond(&follower, follower.len());
    }
    let seen: Vec<u64> = follower.range(0, None).iter().map(|e| e.seq).collect();
    assert_eq!(seen, vec![0, 1, 2, 3]);
    assert_eq!(follower.range(0, None)[2].data(), json!({"i": 2}));
    assert!(matches!(follower.append("test/n", &json!({})), Err(LogError::ReadOnly { .. })));
    follower.close().unwrap();
    owner.close().unwrap();
}

#[test]
fn staged_input_is_inserted_once_and_its_row_deleted_with_the_splice() {
    let Some(dsn) = dsn() else { return };
    let owner_store = store(&dsn);
    let log = owner_store.create(None).unwrap();
    let web = store(&dsn);
    let a = Message::user_text("first");
    let b = Message::user_text("second");
    assert!(web.enqueue(log.id(), staged(&a, Target::NextTurn, true)).unwrap());
    assert!(!web.enqueue(log.id(), staged(&a, Target::NextTurn, true)).unwrap(), "a staged id is refused");
    assert!(matches!(web.enqueue("no such session", staged(&b, Target::NextTurn, true)), Err(LogError::NotFound { .. })));
    // Attaching the inbox reads what is staged; a later enqueue arrives through NOTIFY.
    let inbox = Inbox::new(log.clone(), None).unwrap();
    wait_beyond(&log, 0);
    assert!(web.enqueue(log.id(), staged(&b, Target::NextStep, false)).unwrap());
    wait_beyond(&log, 1);
    log.flush_blocking().unwrap();
    assert_eq!(inbox.list(Target::NextTurn).iter().map(|m| m.id().to_string()).collect::<Vec<_>>(), vec![a.id()]);
    assert_eq!(inbox.list(Target::NextStep).iter().map(|m| m.id().to_string()).collect::<Vec<_>>(), vec![b.id()]);
    let left = query_one(&dsn, &format!("SELECT count(*)::text FROM kerman_inbox_staged WHERE session_id = '{}'", log.id()));
    assert_eq!(left, "0");
    assert!(!web.enqueue(log.id(), staged(&a, Target::NextTurn, true)).unwrap(), "an id in the log is refused");
    log.close().unwrap();
}

#[test]
fn an_append_claiming_a_staged_message_already_claimed_commits_nothing() {
    let Some(dsn) = dsn() else { return };
    let s = store(&dsn);
    let log = s.create(None).unwrap();
    let m = Message::user_text("contended");
    assert!(s.enqueue(log.id(), staged(&m, Target::NextTurn, false)).unwrap());
    let inbox = Inbox::new(log.clone(), None).unwrap();
    wait_beyond(&log, 0);
    log.flush_blocking().unwrap();
    assert!(inbox.contains(m.id()));
    // The row is gone with that commit: a second claim of it (another owner's, say) fails
    // whole, leaving the log as it was.
    let lease = s.core().open(log.id()).map(|_| ()).err();
    assert!(matches!(lease, Some(LogError::Locked { .. })));
    let before = log.len();
    let rows = vec![kerman::event_log::postgres::to_row(&log.get(0).unwrap().clone())];
    // Take the lease over (as a new owner would), then try to claim the same id again.
    log.close().unwrap();
    let lease = s.core().open(log.id()).unwrap().lease;
    let mut row = rows.into_iter().next().unwrap();
    row.seq = before as i64;
    let result = s.core().call(Request::AppendStaged { lease: lease.clone(), rows: vec![row], claims: vec![m.id().to_string()] });
    match result {
        Err(LogError::Write { detail }) => assert!(detail.contains("already claimed"), "{detail}"),
        other => panic!("expected a refused claim, got {other:?}"),
    }
    let stored = query_one(&dsn, &format!("SELECT last_seq::text FROM kerman_sessions WHERE id = '{}'", log.id()));
    assert_eq!(stored, (before - 1).to_string());
    s.core().release(&lease).unwrap();
}
