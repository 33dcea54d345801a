//! A store's pool of connections (`PgOptions::pool_size`) against a real server: a session's
//! requests keep their submission order across the pool, a request stuck on a row lock holds
//! up neither another session's append nor the lease renewals, and the recovery of an append
//! whose connection drops still settles it exactly once while another connection is busy.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use kerman::event_log::postgres::{to_row, Fault, PgCore, PgOptions, Request, Response};
use kerman::event_log::{LogError, StagedInput, StagedOp};

use crate::postgres_recovery::Admin;
use crate::postgres_store::{dsn, sample_events};

/// What the pool's tests ask of the operator's session (`postgres_recovery.rs`'s `Admin`).
impl Admin {
    /// Locks session `id`'s row until [`Admin::exec`]`("COMMIT")`.
    fn lock_row(&self, id: &str) {
        self.exec("BEGIN");
        let rows = self.rt.block_on(self.client.query("SELECT 1 FROM kerman_sessions WHERE id = $1 FOR UPDATE", &[&id])).unwrap();
        assert_eq!(rows.len(), 1);
    }

    /// Polls until `n` of `core`'s backends wait on a lock. Not on the connection holding the
    /// lock ([`Admin::lock_row`]): inside a transaction `pg_stat_activity` is one snapshot,
    /// taken at its first read, and `now()` the transaction's start.
    fn await_lock_waits(&self, core: &PgCore, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.pids(core.owner(), "AND wait_event_type = 'Lock'").len() != n {
            assert!(Instant::now() < deadline, "the store's requests never blocked on the row lock");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn pool(dsn: &str, pool_size: usize) -> PgCore {
    PgCore::connect(dsn, PgOptions { pool_size, ..PgOptions::default() }).unwrap()
}

fn records(core: &PgCore, id: &str) -> Vec<String> {
    match core.call(Request::Read { id: id.into() }).unwrap() {
        Response::Records(r) => r,
        other => panic!("{other:?}"),
    }
}

fn staged(text: &str) -> StagedInput {
    StagedInput {
        id: kerman::message::new_id(),
        message: format!("{{\"text\":\"{text}\"}}"),
        target: "next-turn".into(),
        wakeup: true,
        op: StagedOp::default(),
    }
}

/// Enqueues for `id` on another thread (it will wait on the row lock): its outcome arrives on
/// the receiver.
fn enqueue_in_background(core: &PgCore, id: &str) -> mpsc::Receiver<Result<Response, LogError>> {
    let (tx, rx) = mpsc::channel();
    core.submit(Request::Enqueue { id: id.into(), staged: staged("behind the lock") }, Box::new(move |r| drop(tx.send(r))));
    rx
}

#[test]
fn one_sessions_requests_run_in_submission_order_across_the_pool() {
    let Some(dsn) = dsn() else { return };
    let c = pool(&dsn, 4);
    let events = sample_events(20);
    let leases: Vec<_> = (0..12).map(|_| c.create(None).unwrap().0).collect();
    // Every append of every session submitted at once, interleaved, then each release: any
    // reordering within a session fails an append (seq continuity) or releases too early.
    let (tx, rx) = mpsc::channel();
    for event in &events {
        for lease in &leases {
            let tx = tx.clone();
            let request = Request::Append { lease: lease.clone(), rows: vec![to_row(event)] };
            c.submit(request, Box::new(move |r| drop(tx.send(r.map(|_| ())))));
        }
    }
    for lease in &leases {
        let tx = tx.clone();
        c.submit(Request::Release { lease: lease.clone() }, Box::new(move |r| drop(tx.send(r.map(|_| ())))));
    }
    drop(tx);
    let outcomes: Vec<_> = rx.iter().collect();
    assert_eq!(outcomes.len(), leases.len() * (events.len() + 1));
    assert!(outcomes.iter().all(Result::is_ok), "{:?}", outcomes.iter().find(|r| r.is_err()));
    let texts: Vec<String> = events.iter().map(kerman::Event::to_json).collect();
    let other = pool(&dsn, 1);
    for lease in &leases {
        assert_eq!(records(&c, &lease.session_id), texts);
        // Released after its last append: free at once for another owner.
        other.open(&lease.session_id).unwrap();
    }
    let admin = Admin::new(&dsn);
    assert!(admin.pids(c.owner(), "").len() <= 4, "never more connections than the pool size");
}

#[test]
fn a_request_waiting_on_a_row_lock_holds_up_neither_another_sessions_append_nor_the_renewals() {
    let Some(dsn) = dsn() else { return };
    let (admin, locker) = (Admin::new(&dsn), Admin::new(&dsn));
    let c = PgCore::connect(&dsn, PgOptions { pool_size: 2, lease_ttl_ms: 300, ..PgOptions::default() }).unwrap();
    let (owned, _) = c.create(None).unwrap();
    let (locked, _) = c.create(None).unwrap();
    locker.lock_row(&locked.session_id);
    let blocked = enqueue_in_background(&c, &locked.session_id);
    admin.await_lock_waits(&c, 1);
    // Served by the second connection while the first waits.
    let events = sample_events(3);
    c.append(&owned, &events).unwrap();
    assert_eq!(records(&c, &owned.session_id).len(), 3);
    // Several lease periods pass with the first connection still stuck: the renewals ran on
    // the other one (this wait is the subject of the test: leases lapse with time).
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(admin.live_leases(std::slice::from_ref(&owned.session_id)), 1, "the lease lapsed while a connection was stuck");
    if let Ok(early) = blocked.try_recv() {
        // Says what came back (an error under load would otherwise read as "not waiting").
        panic!("the enqueue returned before the lock was released: {:?}", early.map(|_| "a response").map_err(|e| e.to_string()));
    }
    locker.exec("COMMIT");
    assert!(matches!(blocked.recv().unwrap(), Ok(Response::Bool(true))));
    assert_eq!(admin.pids(c.owner(), "").len(), 2);
}

#[test]
fn an_append_whose_connection_drops_lands_once_while_another_connection_is_stuck() {
    let Some(dsn) = dsn() else { return };
    let (admin, locker) = (Admin::new(&dsn), Admin::new(&dsn));
    let c = pool(&dsn, 3);
    let (lease, _) = c.create(None).unwrap();
    let (locked, _) = c.create(None).unwrap();
    locker.lock_row(&locked.session_id);
    let blocked = enqueue_in_background(&c, &locked.session_id);
    admin.await_lock_waits(&c, 1);
    let events = sample_events(6);
    c.call(Request::InjectFault(Fault::LoseReplyAfterAppend)).unwrap();
    c.append(&lease, &events[..3]).unwrap();
    c.call(Request::InjectFault(Fault::LoseConnectionBeforeAppend)).unwrap();
    c.append(&lease, &events[3..]).unwrap();
    let texts: Vec<String> = events.iter().map(kerman::Event::to_json).collect();
    assert_eq!(records(&c, &lease.session_id), texts, "each batch exactly once, in order");
    locker.exec("COMMIT");
    assert!(matches!(blocked.recv().unwrap(), Ok(Response::Bool(true))));
}

#[test]
fn a_pool_of_one_is_one_connection_and_unused_connections_are_never_opened() {
    let Some(dsn) = dsn() else { return };
    let admin = Admin::new(&dsn);
    let (one, four) = (pool(&dsn, 1), pool(&dsn, 4));
    for c in [&one, &four] {
        let (lease, _) = c.create(None).unwrap();
        c.append(&lease, &sample_events(2)).unwrap();
        c.release(&lease).unwrap();
        assert_eq!(admin.pids(c.owner(), "").len(), 1, "one caller at a time needs one connection");
    }
    assert_eq!((one.pool_size(), four.pool_size()), (1, 4));
}
