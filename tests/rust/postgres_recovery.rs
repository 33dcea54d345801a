//! The PostgreSQL store when its connection drops: the server ends the store's backend (from
//! another session with `pg_terminate_backend`, or from inside through a test fault) and the
//! store must reconnect, retry reads, and settle appends whose outcome it never saw, with
//! nothing lost and nothing stored twice. Also: a dropped log gives its lease up.

use std::time::{Duration, Instant};

use kerman::event_log::postgres::{Fault, PgCore, PgOptions, Request, Response};
use kerman::event_log::{LogError, StagedOp, Store};
use serde_json::json;
use tokio_postgres::{Client, NoTls};

use super::postgres_store::{dsn, sample_events, store};

/// A second session on the server, for what an operator would do, on its own runtime. It may
/// hold a transaction open between calls.
pub(crate) struct Admin {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) client: Client,
}

impl Admin {
    pub(crate) fn new(dsn: &str) -> Admin {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(dsn, NoTls).await.unwrap();
            tokio::spawn(conn);
            client
        });
        Admin { rt, client }
    }

    pub(crate) fn exec(&self, sql: &str) {
        self.rt.block_on(self.client.batch_execute(sql)).unwrap();
    }

    /// The pids of the backends of the store whose owner id is `owner` (`extra` narrows them down).
    pub(crate) fn pids(&self, owner: &str, extra: &str) -> Vec<i32> {
        // Inside a transaction (a test holding a row lock on this connection) the activity
        // view is one snapshot, taken at its first read: a poll would never see a change.
        self.exec("SELECT pg_stat_clear_snapshot()");
        let sql = format!("SELECT pid FROM pg_stat_activity WHERE application_name = $1 {extra}");
        let rows = self.rt.block_on(self.client.query(&sql, &[&format!("kerman {owner}")])).unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// How many of `ids` hold a live lease by the server's clock.
    pub(crate) fn live_leases(&self, ids: &[String]) -> i64 {
        let sql = "SELECT count(*) FROM kerman_sessions WHERE id = ANY($1) AND expires_at > now()";
        self.rt.block_on(self.client.query_one(sql, &[&ids])).unwrap().get(0)
    }

    fn pid(&self, owner: &str) -> i32 {
        let pids = self.pids(owner, "");
        assert_eq!(pids.len(), 1, "one connection per store");
        pids[0]
    }

    /// Polls until `owner`'s backend waits on a lock (its append is blocked behind ours).
    fn await_lock_wait(&self, owner: &str) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let [pid] = self.pids(owner, "AND wait_event_type = 'Lock'")[..] {
                return pid;
            }
            assert!(Instant::now() < deadline, "the store's append never blocked on the row lock");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn terminate(&self, pid: i32) {
        let row = self.rt.block_on(self.client.query_one("SELECT pg_terminate_backend($1)", &[&pid])).unwrap();
        assert!(row.get::<_, bool>(0), "backend {pid} was not terminated");
    }
}

fn core(dsn: &str) -> PgCore {
    PgCore::connect(dsn, PgOptions::default()).unwrap()
}

fn records(core: &PgCore, id: &str) -> Vec<String> {
    match core.call(Request::Read { id: id.into() }).unwrap() {
        Response::Records(r) => r,
        other => panic!("{other:?}"),
    }
}

fn texts(events: &[kerman::event_log::Event]) -> Vec<String> {
    events.iter().map(kerman::Event::to_json).collect()
}

#[test]
fn reads_and_appends_carry_on_after_the_backend_is_terminated() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    let c = core(&dsn);
    let (lease, _) = c.create(None).unwrap();
    let events = sample_events(6);
    c.append(&lease, &events[..3]).unwrap();

    let first = admin.pid(c.owner());
    admin.terminate(first);
    // A read retried transparently on a new connection.
    assert_eq!(records(&c, &lease.session_id), texts(&events[..3]));
    let second = admin.pid(c.owner());
    assert_ne!(first, second, "the store reconnected");

    admin.terminate(second);
    c.append(&lease, &events[3..]).unwrap();
    assert_eq!(records(&c, &lease.session_id), texts(&events), "nothing lost, nothing twice");
}

#[test]
fn an_append_cut_off_before_it_was_sent_is_sent_once_more() {
    let Some(dsn) = dsn() else { return };
    let c = core(&dsn);
    let (lease, _) = c.create(None).unwrap();
    let events = sample_events(5);
    c.append(&lease, &events[..2]).unwrap();
    c.call(Request::InjectFault(Fault::LoseConnectionBeforeAppend)).unwrap();
    c.append(&lease, &events[2..]).unwrap();
    assert_eq!(records(&c, &lease.session_id), texts(&events));
}

#[test]
fn an_append_whose_reply_was_lost_after_commit_is_not_sent_again() {
    let Some(dsn) = dsn() else { return };
    let c = core(&dsn);
    let (lease, _) = c.create(None).unwrap();
    let events = sample_events(5);
    c.append(&lease, &events[..2]).unwrap();
    c.call(Request::InjectFault(Fault::LoseReplyAfterAppend)).unwrap();
    // Sent again, the conditional append would be refused as a seq conflict: the read-back
    // must find that it landed.
    c.append(&lease, &events[2..]).unwrap();
    assert_eq!(records(&c, &lease.session_id), texts(&events));
    c.append(&lease, &events[..0]).unwrap();
}

#[test]
fn an_open_whose_reply_was_lost_adopts_the_lease_it_took() {
    let Some(dsn) = dsn() else { return };
    let (a, b) = (core(&dsn), core(&dsn));
    let (lease, _) = a.create(None).unwrap();
    let events = sample_events(5);
    a.append(&lease, &events[..3]).unwrap();
    a.release(&lease).unwrap();
    b.call(Request::InjectFault(Fault::LoseReplyAfterOpen)).unwrap();
    // Retried blindly, the open would find the session held (by b itself) and say Locked.
    let opened = b.open(&lease.session_id).unwrap();
    assert_eq!(opened.lease.epoch, 2, "the lease the lost try took, not a second bump");
    assert_eq!(opened.events, events[..3]);
    assert!(matches!(a.open(&lease.session_id), Err(LogError::Locked { .. })));
    b.append(&opened.lease, &events[3..]).unwrap();
    assert_eq!(records(&b, &lease.session_id), texts(&events));
}

/// Holds the session row locked from another session, so the store's append blocks inside
/// the server; then ends the store's backend there, mid-statement.
fn append_cut_off_mid_statement(
    dsn: &str,
    meddle: impl FnOnce(&Admin, &str),
) -> (PgCore, String, Vec<kerman::event_log::Event>, Result<Response, LogError>) {
    let admin = Admin::new(dsn);
    let c = core(dsn);
    let (lease, _) = c.create(None).unwrap();
    let id = lease.session_id.clone();
    let events = sample_events(6);
    c.append(&lease, &events[..2]).unwrap();

    admin.exec(&format!("BEGIN; SELECT 1 FROM kerman_sessions WHERE id = '{id}' FOR UPDATE"));
    let (tx, rx) = std::sync::mpsc::channel();
    let rows = events[2..].iter().map(kerman::event_log::postgres::to_row).collect();
    c.submit(Request::Append { lease, rows }, Box::new(move |r| drop(tx.send(r))));
    let pid = admin.await_lock_wait(c.owner());
    admin.terminate(pid);
    meddle(&admin, &id);
    admin.exec("COMMIT");
    let result = rx.recv().unwrap();
    (c, id, events, result)
}

#[test]
fn an_append_cut_off_mid_statement_lands_exactly_once() {
    let Some(dsn) = dsn() else { return };
    let (c, id, events, result) = append_cut_off_mid_statement(&dsn, |_, _| ());
    assert!(result.is_ok(), "{:?}", result.err().map(|e| e.to_string()));
    assert_eq!(records(&c, &id), texts(&events));
}

#[test]
fn an_unknown_outcome_with_other_records_stored_is_an_error_not_a_success() {
    let Some(dsn) = dsn() else { return };
    // Rows that no real writer could store (same epoch, same seqs) stand in for a database
    // that does not hold what was sent: the read-back must not call that a success.
    let (c, id, events, result) = append_cut_off_mid_statement(&dsn, |admin, id| {
        admin.exec(&format!(
            "INSERT INTO kerman_events SELECT '{id}', s, 0, 'x/y', '{{}}' FROM generate_series(2, 5) s;
             UPDATE kerman_sessions SET last_seq = 5 WHERE id = '{id}'"
        ));
    });
    // Which error depends on whether the store read the session back before or after the
    // other rows committed ("differ" or, for a re-send refused, "does not follow"): either
    // way a failure, and nothing of ours stored twice.
    match result {
        Err(LogError::Write { detail }) => assert!(detail.contains("differ") || detail.contains("does not follow"), "{detail}"),
        other => panic!("expected an error, got {:?}", other.map_err(|e| e.to_string())),
    }
    let stored = records(&c, &id);
    assert_eq!(stored[..2], texts(&events[..2]));
    assert_eq!(stored[2..], vec!["{}".to_string(); 4]);
}

/// A DSN for `user` instead of the one in `dsn` (a URL).
fn as_user(dsn: &str, user: &str) -> String {
    let (scheme, rest) = dsn.split_once("://").expect("KERMAN_PG_DSN as a URL");
    let rest = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{rest}")
}

#[test]
fn reconnecting_gives_up_naming_the_host_and_the_last_error_then_recovers() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    let role = format!("kerman_t_{}", &kerman::message::new_id().replace('-', "")[16..]);
    admin.exec(&format!("CREATE ROLE {role} SUPERUSER LOGIN"));
    let options = PgOptions { reconnect_ms: 300, ..PgOptions::default() };
    let s = kerman::event_log::postgres::PostgresStore::connect(&as_user(&dsn, &role), options).unwrap();
    let c = s.core().clone();
    let log = s.create(None).unwrap();
    log.append("goal/change", &json!(1)).unwrap();
    log.flush_blocking().unwrap();
    // The server now refuses this role's new connections; then its live one goes.
    admin.exec(&format!("ALTER ROLE {role} NOLOGIN"));
    admin.terminate(admin.pid(c.owner()));
    let host = dsn.split_once('@').map(|(_, h)| h.split('/').next().unwrap().to_string()).unwrap();
    log.append("goal/change", &json!(2)).unwrap();
    match log.flush_blocking() {
        Err(LogError::Write { detail }) => {
            assert!(detail.contains(&format!("reconnect to {host}")), "{detail}");
            assert!(detail.contains("not permitted to log in"), "{detail}");
            assert_eq!(detail.matches("session \"").count(), 1, "{detail}");
        }
        other => panic!("expected the flush to fail, got {:?}", other.map_err(|e| e.to_string())),
    }
    // The next request tries once more, without a second round of backoff.
    match c.call(Request::List) {
        Err(LogError::Database { context, detail }) => {
            assert!(context.contains(&host), "{context}");
            assert!(detail.contains("not permitted to log in"), "{detail}");
        }
        other => panic!("expected a reconnect failure, got {other:?}"),
    }
    admin.exec(&format!("ALTER ROLE {role} LOGIN"));
    assert!(matches!(c.call(Request::List), Ok(Response::Ids(_))), "the store came back");
    assert!(log.close().is_err(), "the log stays poisoned until reopened");
    let reopened = s.open(log.id()).unwrap();
    assert_eq!(reopened.len(), 1);
    drop((reopened, log, s));
    drop(c);
    // The runtime thread closes its connection as it ends; end it here in case it has not yet.
    for pid in admin.pids("", &format!("OR usename = '{role}'")) {
        let _ = admin.rt.block_on(admin.client.query("SELECT pg_terminate_backend($1)", &[&pid]));
    }
    admin.exec(&format!("DROP ROLE {role}"));
}

#[test]
fn an_idle_owner_keeps_its_lease_across_a_reconnect() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    let ttl = Duration::from_millis(600);
    let owner = store(&dsn, u64::try_from(ttl.as_millis()).unwrap());
    let log = owner.create(None).unwrap();
    admin.terminate(admin.pid(owner.core().owner()));
    // Only the renewal tick touches the database now: it must reconnect and renew, or the
    // other store takes the session within a TTL.
    let other = store(&dsn, 30_000);
    let until = Instant::now() + 3 * ttl;
    while Instant::now() < until {
        match other.open(log.id()) {
            Err(LogError::Locked { .. }) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the lease lapsed across the reconnect"),
        }
        // Pacing, not synchronisation: the test is about wall-clock time passing.
        std::thread::sleep(Duration::from_millis(50));
    }
    log.append("goal/change", &json!("still mine")).unwrap();
    log.flush_blocking().unwrap();
}

/// Polls `open` until the lease is free, failing after `limit`.
fn open_when_free(s: &kerman::event_log::postgres::PostgresStore, id: &str, limit: Duration) -> kerman::event_log::SessionLog {
    let deadline = Instant::now() + limit;
    loop {
        match s.open(id) {
            Ok(log) => return log,
            Err(LogError::Locked { .. }) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("the dropped log's lease was never given up: {e}"),
        }
    }
}

#[test]
fn a_log_dropped_without_close_gives_its_lease_up() {
    let Some(dsn) = dsn() else { return };
    let a = store(&dsn, 30_000);
    let log = a.create(None).unwrap();
    log.append("goal/change", &json!(1)).unwrap();
    let id = log.id().to_string();
    let b = store(&dsn, 30_000);
    assert!(matches!(b.open(&id), Err(LogError::Locked { .. })));
    drop(log);
    // Far shorter than the 30 s TTL: only a release frees it this soon.
    let reopened = open_when_free(&b, &id, Duration::from_secs(10));
    assert_eq!(reopened.len(), 1, "the pending append committed before the release");
}

#[test]
fn a_log_dropped_inside_its_own_flush_callback_gives_its_lease_up() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    let a = store(&dsn, 30_000);
    let log = a.create(None).unwrap();
    let id = log.id().to_string();
    // Block the first append in the server, so the later ones are still pending when the
    // flush callback (on the reply thread) drops the last handle of the log.
    admin.exec(&format!("BEGIN; SELECT 1 FROM kerman_sessions WHERE id = '{id}' FOR UPDATE"));
    log.append("goal/change", &json!(0)).unwrap();
    admin.await_lock_wait(a.core().owner());
    let (tx, rx) = std::sync::mpsc::channel();
    let last = log.clone();
    log.flush(Box::new(move |r| {
        drop(last);
        let _ = tx.send(r.is_ok());
    }));
    for i in 1..5 {
        log.append("goal/change", &json!(i)).unwrap();
    }
    drop(log);
    admin.exec("COMMIT");
    assert!(rx.recv_timeout(Duration::from_secs(20)).expect("the reply thread hung in the drop"));
    let b = store(&dsn, 30_000);
    let reopened = open_when_free(&b, &id, Duration::from_secs(10));
    assert_eq!(reopened.len(), 5);
}

/// A session with three events and one staged message, its lease released: takeable.
fn takeable_session(c: &PgCore) -> (String, Vec<kerman::event_log::Event>) {
    let (lease, _) = c.create(None).unwrap();
    let events = sample_events(3);
    c.append(&lease, &events).unwrap();
    c.release(&lease).unwrap();
    let staged = kerman::event_log::StagedInput {
        id: kerman::message::new_id(),
        message: json!({"role": "user", "content": "hi"}).to_string(),
        target: "next-turn".into(),
        wakeup: true,
        op: StagedOp::default(),
    };
    assert!(c.enqueue(&lease.session_id, staged).unwrap());
    (lease.session_id, events)
}

fn take(c: &PgCore, limit: i64, ids: Option<Vec<String>>) -> Vec<(kerman::event_log::postgres::Lease, String, Vec<String>)> {
    match c.call(Request::Take { limit, name: "w1".into(), expiry: false, ids }).unwrap() {
        Response::Taken(taken, _) => taken,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_take_whose_reply_was_lost_hands_over_the_sessions_it_took() {
    let Some(dsn) = dsn() else { return };
    let (dsn, _) = super::postgres_store::fresh_schema(&dsn);
    let web = core(&dsn);
    let (id, events) = takeable_session(&web);
    let worker = core(&dsn);
    worker.call(Request::InjectFault(Fault::LoseReplyAfterTake)).unwrap();
    // Retried blindly, the take would find the session held (by this very store) and return
    // nothing: the session would sit unrenewed, unknown to the worker, until its lease lapsed.
    let taken = take(&worker, 10, None);
    assert_eq!(taken.len(), 1, "the session the lost try took is handed over");
    let (lease, _, taken_records) = &taken[0];
    assert_eq!((lease.session_id.as_str(), lease.epoch), (id.as_str(), 2), "the lost try's lease, not a second bump");
    assert_eq!(taken_records, &texts(&events));
    assert!(take(&worker, 10, None).is_empty(), "handed over once");
    // It is this store's now: held (another store cannot open it) and appendable.
    assert!(matches!(web.open(&id), Err(LogError::Locked { .. })));
    let more = sample_events(5);
    worker.append(lease, &more[3..]).unwrap();
    assert_eq!(records(&worker, &id).len(), 5);
}

#[test]
fn a_take_by_id_looks_only_at_the_sessions_named() {
    let Some(dsn) = dsn() else { return };
    let (dsn, _) = super::postgres_store::fresh_schema(&dsn);
    let web = core(&dsn);
    let (a, events) = takeable_session(&web);
    let (b, _) = takeable_session(&web);
    let worker = core(&dsn);
    assert!(take(&worker, 10, Some(vec!["nobody".into()])).is_empty());
    let taken = take(&worker, 10, Some(vec![a.clone(), "nobody".into()]));
    assert_eq!(taken.iter().map(|t| t.0.session_id.clone()).collect::<Vec<_>>(), vec![a.clone()]);
    assert_eq!(taken[0].2, texts(&events), "the records come with the take");
    // Held now, so named again it is not taken twice; the other one is still there for a sweep.
    assert!(take(&worker, 10, Some(vec![a.clone()])).is_empty());
    let swept = take(&worker, 10, None);
    assert_eq!(swept.iter().map(|t| t.0.session_id.clone()).collect::<Vec<_>>(), vec![b]);
}
