//! The PostgreSQL store core against a real server: `KERMAN_PG_DSN` names it (`make test` starts
//! one with scripts/pg-test-server.sh). Without it each test says so and passes, unless
//! `KERMAN_PG_REQUIRED=1` (set by `make test`), where a missing server is a failure.
//!
//! Tests share one database: each works in a fresh schema (migrations) or on fresh session ids.

use kerman::event_log::postgres::{PgCore, PgOptions, Request, Response};
use kerman::event_log::{LogError, MemoryStore, Store, Surface};
use serde_json::json;

pub fn dsn() -> Option<String> {
    match std::env::var("KERMAN_PG_DSN") {
        Ok(dsn) if !dsn.is_empty() => Some(dsn),
        _ => {
            assert!(std::env::var("KERMAN_PG_REQUIRED").as_deref() != Ok("1"), "KERMAN_PG_REQUIRED=1 but KERMAN_PG_DSN is unset");
            eprintln!("skipped: KERMAN_PG_DSN is unset (run scripts/pg-test-server.sh)");
            None
        }
    }
}

/// Runs SQL directly (outside the store) on a throwaway runtime.
fn admin(dsn: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
    });
}

/// A DSN whose connections see only a new, empty schema (so migrations start from nothing).
pub fn fresh_schema(dsn: &str) -> (String, String) {
    let schema = format!("t_{}", kerman::message::new_id().replace('-', ""));
    admin(dsn, &format!("CREATE SCHEMA {schema}"));
    let sep = if dsn.contains('?') { '&' } else { '?' };
    (format!("{dsn}{sep}options=-csearch_path%3D{schema}"), schema)
}

fn versions(dsn: &str, schema: &str) -> Vec<i32> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let rows = client.query(&format!("SELECT version FROM {schema}.kerman_schema ORDER BY version"), &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    })
}

fn core(dsn: &str) -> PgCore {
    PgCore::connect(dsn, PgOptions::default()).unwrap()
}

/// Events minted by a memory log, so they are exactly what a `SessionLog` would hand a backend.
pub fn sample_events(n: usize) -> Vec<kerman::event_log::Event> {
    let log = MemoryStore::new().create(None).unwrap();
    for i in 0..n {
        if i % 3 == 1 {
            log.append_loop_event("user/message", &json!({"message": {"id": format!("m{i}"), "x": 1.5e-7}}), Some(Surface::append()))
                .unwrap();
        } else {
            log.append("goal/change", &json!({"i": i, "z": "é\u{0}"})).unwrap();
        }
    }
    log.range(0, None)
}

#[test]
fn migrations_apply_once_even_when_two_connect_at_once() {
    let Some(dsn) = dsn() else { return };
    let (dsn, schema) = fresh_schema(&dsn);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| core(&dsn).applied_migrations().to_vec());
        let b = s.spawn(|| core(&dsn).applied_migrations().to_vec());
        (a.join().unwrap(), b.join().unwrap())
    });
    let all: Vec<i32> = (1..=kerman::event_log::postgres::latest_schema_version()).collect();
    // Exactly one of the two applied everything; the other found the schema current.
    let mut seen = [a, b];
    seen.sort();
    assert_eq!(seen, [vec![], all.clone()]);
    assert!(core(&dsn).applied_migrations().is_empty(), "a third connect applies nothing");
    assert_eq!(versions(&dsn, &schema), all);
}

#[test]
fn a_schema_from_a_newer_kerman_is_refused() {
    let Some(dsn) = dsn() else { return };
    let (dsn, schema) = fresh_schema(&dsn);
    core(&dsn);
    admin(&dsn, &format!("INSERT INTO {schema}.kerman_schema (version) VALUES (999)"));
    match PgCore::connect(&dsn, PgOptions::default()) {
        Err(LogError::Database { detail, .. }) => assert!(detail.contains("999"), "{detail}"),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a newer schema was accepted"),
    }
}

#[test]
fn create_append_reopen_round_trip() {
    let Some(dsn) = dsn() else { return };
    let store = core(&dsn);
    let (lease, header) = store.create(None).unwrap();
    assert_eq!(lease.epoch, 1);
    let events = sample_events(7);
    store.append(&lease, &events[..3]).unwrap();
    store.append(&lease, &events[3..]).unwrap();
    assert!(matches!(store.create(Some(&lease.session_id)), Err(LogError::Exists { .. })));
    store.release(&lease).unwrap();

    let opened = core(&dsn).open(&lease.session_id).unwrap();
    assert_eq!(opened.lease.epoch, 2, "open takes the lease with the next epoch");
    assert_eq!(opened.header, header);
    assert_eq!(opened.events, events);
    let texts: Vec<String> = opened.events.iter().map(kerman::Event::to_json).collect();
    assert_eq!(texts, events.iter().map(kerman::Event::to_json).collect::<Vec<_>>(), "records come back byte for byte");
    match store.call(Request::List).unwrap() {
        Response::Ids(ids) => assert!(ids.contains(&lease.session_id)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_held_session_is_locked_and_a_missing_one_not_found() {
    let Some(dsn) = dsn() else { return };
    let (a, b) = (core(&dsn), core(&dsn));
    let (lease, _) = a.create(None).unwrap();
    assert!(matches!(b.open(&lease.session_id), Err(LogError::Locked { .. })));
    assert!(matches!(b.call(Request::Delete { id: lease.session_id.clone() }), Err(LogError::Locked { .. })));
    assert!(matches!(b.open("no-such-session-ever"), Err(LogError::NotFound { .. })));
    a.release(&lease).unwrap();
    assert_eq!(b.open(&lease.session_id).unwrap().lease.epoch, 2);
}

#[test]
fn an_append_under_a_stale_epoch_is_fenced_out() {
    let Some(dsn) = dsn() else { return };
    // A zero TTL: the lease expires at once, so a second owner may take over while the first
    // still believes it holds the session (a paused process, a partition).
    let options = PgOptions { lease_ttl_ms: 0, ..PgOptions::default() };
    let old = PgCore::connect(&dsn, options.clone()).unwrap();
    let new = PgCore::connect(&dsn, options).unwrap();
    let (stale, _) = old.create(None).unwrap();
    let events = sample_events(4);
    old.append(&stale, &events[..2]).unwrap();

    let taken = new.open(&stale.session_id).unwrap();
    assert_eq!(taken.lease.epoch, stale.epoch + 1);
    match old.append(&stale, &events[2..]) {
        Err(LogError::LeaseLost { epoch, current, .. }) => assert_eq!((epoch, current), (1, 2)),
        other => panic!("stale append was not fenced: {:?}", other.err().map(|e| e.to_string())),
    }
    // Releasing with the stale lease must not free the new holder's lease either.
    old.release(&stale).unwrap();
    new.append(&taken.lease, &events[2..]).unwrap();
    assert_eq!(new.read(&stale.session_id).unwrap(), events, "nothing of the refused append landed");
}

#[test]
fn an_append_that_does_not_follow_the_last_seq_is_refused() {
    let Some(dsn) = dsn() else { return };
    let store = core(&dsn);
    let (lease, _) = store.create(None).unwrap();
    let events = sample_events(5);
    store.append(&lease, &events[..2]).unwrap();
    for bad in [&events[..2], &events[3..], &events[1..3]] {
        match store.append(&lease, bad) {
            Err(LogError::Write { detail }) => assert!(detail.contains("does not follow"), "{detail}"),
            other => panic!("out-of-order append accepted: {:?}", other.err().map(|e| e.to_string())),
        }
    }
    store.append(&lease, &events[2..]).unwrap();
    assert_eq!(store.read(&lease.session_id).unwrap(), events);
}

// ---- The Store contract, through SessionLog and PgBackend ----

use kerman::event_log::postgres::PostgresStore;

pub fn store(dsn: &str, lease_ttl_ms: u64) -> PostgresStore {
    PostgresStore::connect(dsn, PgOptions { lease_ttl_ms, ..PgOptions::default() }).unwrap()
}

#[test]
fn a_session_log_commits_to_postgres_and_reopens_elsewhere() {
    let Some(dsn) = dsn() else { return };
    let a = store(&dsn, 30_000);
    let log = a.create(None).unwrap();
    let id = log.id().to_string();
    assert!(a.exists(&id).unwrap());
    assert!(a.list().unwrap().contains(&id), "an empty session is listed, as it exists");
    // A burst: rows queue while a transaction is in flight and go out together.
    for i in 0..300 {
        log.append("goal/change", &json!({"i": i})).unwrap();
    }
    log.flush_blocking().unwrap();
    assert_eq!(a.core().read(&id).unwrap().len(), 300, "flush returned before everything committed");
    log.append("goal/change", &json!({"last": true})).unwrap();
    let written = log.range(0, None);
    log.close().unwrap();

    let b = store(&dsn, 30_000);
    assert!(b.list().unwrap().contains(&id));
    let reopened = b.open(&id).unwrap();
    assert_eq!(reopened.range(0, None), written, "close commits what is pending");
    assert_eq!(reopened.header(), log.header());
    assert!(matches!(a.delete(&id), Err(LogError::Locked { .. })));
    reopened.close().unwrap();
    a.delete(&id).unwrap();
    assert!(!a.exists(&id).unwrap());
    assert!(matches!(a.open(&id), Err(LogError::NotFound { .. })));
}

#[test]
fn a_log_whose_lease_was_taken_over_fails_its_flush_and_later_appends() {
    let Some(dsn) = dsn() else { return };
    let (old, new) = (store(&dsn, 0), store(&dsn, 0));
    let log = old.create(None).unwrap();
    log.append("goal/change", &json!(1)).unwrap();
    log.flush_blocking().unwrap();

    let taken = new.open(log.id()).unwrap();
    log.append("goal/change", &json!(2)).unwrap(); // queued; its transaction is refused
    assert!(matches!(log.flush_blocking(), Err(LogError::LeaseLost { .. })));
    assert!(matches!(log.append("goal/change", &json!(3)), Err(LogError::LeaseLost { .. })));
    taken.append("goal/change", &json!("new owner")).unwrap();
    taken.flush_blocking().unwrap();
    let data: Vec<_> = new.core().read(log.id()).unwrap().iter().map(kerman::Event::data).collect();
    assert_eq!(data, [json!(1), json!("new owner")]);
}

#[test]
fn an_idle_owner_keeps_its_lease_past_the_ttl() {
    let Some(dsn) = dsn() else { return };
    // The owner appends nothing; only the store's background renewal (every ttl/3) keeps the
    // lease. Another store keeps trying to take it for three TTLs: it must never succeed.
    let ttl = std::time::Duration::from_millis(600);
    let owner = store(&dsn, u64::try_from(ttl.as_millis()).unwrap());
    let log = owner.create(None).unwrap();
    let other = store(&dsn, 30_000);
    let until = std::time::Instant::now() + 3 * ttl;
    let mut tries = 0;
    while std::time::Instant::now() < until {
        match other.open(log.id()) {
            Err(LogError::Locked { .. }) => tries += 1,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the idle owner's lease lapsed after {tries} tries"),
        }
        // Pacing, not synchronisation: the test is about wall-clock time passing.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    log.append("goal/change", &json!("still mine")).unwrap();
    log.flush_blocking().unwrap();
}
