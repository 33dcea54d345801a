//! `PgBackend`: a `SessionLog` backend that commits to PostgreSQL with group commit.
//!
//! `enqueue` only turns the event into a row and queues it (it runs under the log's state lock
//! and must not wait for the network). At most one append transaction per session is in
//! flight: when none is, the queued rows go out at once; while one is, rows accumulate and all
//! of them go out in the next transaction when it completes. So a burst of appends costs one
//! transaction per round trip, not one per event, with no timer. Flush barriers complete when
//! everything enqueued before them has committed.
//!
//! A failed transaction (lease lost, database error) poisons the backend: pending and later
//! barriers fail and later appends are refused, until the session is reopened.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{to_row, Lease, PgCore, Reply, Request, Response, Row};
use crate::event_log::{Backend, Event, FlushCallback, LogError};

/// Why the backend stopped accepting appends; rebuilt into a fresh `LogError` per caller.
#[derive(Clone)]
enum Poison {
    LeaseLost { epoch: i64, current: i64 },
    Failed(String),
}

struct State {
    pending: Vec<Row>,
    in_flight: bool,
    /// Events enqueued so far, and events committed (both counted from seq 0).
    enqueued: u64,
    committed: u64,
    waiters: Vec<(u64, FlushCallback)>,
    poison: Option<Poison>,
    /// Closed from the reply thread (the log dropped there): give the lease up once the last
    /// batch is done, without waiting for it.
    release_when_idle: bool,
}

struct Shared {
    core: PgCore,
    lease: Lease,
    state: Mutex<State>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn error(&self, poison: &Poison) -> LogError {
        let id = self.lease.session_id.clone();
        match poison {
            Poison::LeaseLost { epoch, current } => LogError::LeaseLost { id, epoch: *epoch, current: *current },
            Poison::Failed(detail) => LogError::Write { detail: detail.clone() },
        }
    }
}

/// Takes the pending rows as the next transaction if none is in flight. The caller submits it
/// after dropping the state lock: a stopped runtime replies at once, on the calling thread,
/// and that reply takes the lock.
fn next_batch(shared: &Arc<Shared>, st: &mut State) -> Option<(Request, Reply)> {
    if st.in_flight || st.pending.is_empty() || st.poison.is_some() {
        return None;
    }
    st.in_flight = true;
    let rows = std::mem::take(&mut st.pending);
    let n = rows.len() as u64;
    let next = Arc::clone(shared);
    let request = Request::Append { lease: shared.lease.clone(), rows };
    Some((request, Box::new(move |result| committed(&next, n, result))))
}

fn submit(shared: &Shared, batch: Option<(Request, Reply)>) {
    if let Some((request, reply)) = batch {
        shared.core.submit(request, reply);
    }
}

/// Runs on the reply thread when a transaction ends: settles barriers, sends the next batch.
fn committed(shared: &Arc<Shared>, n: u64, result: Result<Response, LogError>) {
    let (ready, outcome, batch) = {
        let mut st = lock(shared);
        st.in_flight = false;
        match result {
            Ok(_) => st.committed += n,
            Err(LogError::LeaseLost { epoch, current, .. }) => st.poison = Some(Poison::LeaseLost { epoch, current }),
            // Write errors from the store already name the session; others get it here.
            Err(LogError::Write { detail }) => st.poison = Some(Poison::Failed(detail)),
            Err(e) => st.poison = Some(Poison::Failed(format!("session \"{}\": {e}", shared.lease.session_id))),
        }
        let committed = st.committed;
        let ready: Vec<FlushCallback> = match &st.poison {
            Some(_) => st.waiters.drain(..).map(|(_, done)| done).collect(),
            None => {
                let (ready, wait) = std::mem::take(&mut st.waiters).into_iter().partition(|(target, _)| *target <= committed);
                st.waiters = wait;
                ready.into_iter().map(|(_, done)| done).collect()
            }
        };
        let outcome = st.poison.clone();
        let batch = next_batch(shared, &mut st).or_else(|| release_if_idle(shared, &mut st));
        (ready, outcome, batch)
    };
    submit(shared, batch);
    // Outside the lock: a callback may flush or append again.
    for done in ready {
        let result = match &outcome {
            Some(poison) => Err(shared.error(poison)),
            None => Ok(()),
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || done(result)));
    }
}

/// The release request, once, if a release was asked for and no batch is left to send.
fn release_if_idle(shared: &Shared, st: &mut State) -> Option<(Request, Reply)> {
    let idle = !st.in_flight && (st.pending.is_empty() || st.poison.is_some());
    if !(st.release_when_idle && idle) {
        return None;
    }
    st.release_when_idle = false;
    Some((Request::Release { lease: shared.lease.clone() }, Box::new(|_| ())))
}

pub struct PgBackend {
    shared: Arc<Shared>,
}

impl PgBackend {
    /// A backend for a session whose first `events` events are already stored under `lease`.
    pub fn new(core: PgCore, lease: Lease, events: u64) -> Self {
        let state = State {
            pending: Vec::new(),
            in_flight: false,
            enqueued: events,
            committed: events,
            waiters: Vec::new(),
            poison: None,
            release_when_idle: false,
        };
        PgBackend { shared: Arc::new(Shared { core, lease, state: Mutex::new(state) }) }
    }
}

impl Backend for PgBackend {
    fn enqueue(&self, event: &Event) -> Result<(), LogError> {
        let mut st = lock(&self.shared);
        if let Some(poison) = &st.poison {
            return Err(self.shared.error(poison));
        }
        st.pending.push(to_row(event));
        st.enqueued += 1;
        let batch = next_batch(&self.shared, &mut st);
        drop(st);
        submit(&self.shared, batch);
        Ok(())
    }

    fn flush(&self, done: FlushCallback) {
        let mut st = lock(&self.shared);
        if let Some(poison) = &st.poison {
            let err = self.shared.error(poison);
            drop(st);
            return done(Err(err));
        }
        if st.committed >= st.enqueued {
            drop(st);
            return done(Ok(()));
        }
        let target = st.enqueued;
        st.waiters.push((target, done));
    }

    fn close(&self, _events: &[Event]) -> Result<(), LogError> {
        if super::worker::on_reply_thread() {
            // The last handle of the log went away inside a reply (a flush callback owned it).
            // Waiting here for the flush would wait for this very thread: queue the release
            // behind the batches still to go instead. The pending rows still commit.
            let batch = {
                let mut st = lock(&self.shared);
                st.release_when_idle = true;
                release_if_idle(&self.shared, &mut st)
            };
            submit(&self.shared, batch);
            return Ok(());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.flush(Box::new(move |r| drop(tx.send(r))));
        let flushed = crate::blocking::wait(|| rx.recv()).unwrap_or_else(|_| Err(super::worker::stopped()));
        // Give the lease up even after a failed flush, so a reopen need not wait for expiry
        // (release is conditional on our epoch, so it cannot free a newer owner's lease).
        let released = crate::blocking::wait(|| self.shared.core.release(&self.shared.lease));
        flushed.and(released)
    }

    /// A remote store is as durable as its last commit: the loop awaits a barrier before each
    /// model request and tool body, as with the file store's `checkpoint` mode.
    fn checkpoints(&self) -> bool {
        true
    }
}
