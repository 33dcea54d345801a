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
//!
//! Staged input (`PostgresStore::enqueue` from other processes): once an inbox attaches
//! ([`Backend::attach_intake`]) the backend reads the session's staged rows (as soon as its
//! LISTEN is in place), then again on every NOTIFY of its enqueue channel (and after each
//! re-LISTEN; a notification that carries its row needs no read), and hands new ones to the
//! inbox, which inserts each with an ordinary splice.
//! Order: one producer's rows must enter in the order its `enqueue` calls returned, which is
//! their commit order, the order of their notifications and of their `n` (reads sort by it).
//! So every read and every notified row goes through the pool as a request of the session
//! (same connection, one after another, replies in submission order), submitted in the order
//! the LISTEN task heard the notifications, and each is handed over in its reply. A read asked
//! for while another is queued and not started is left to that one (it reads later, and sorts);
//! a read is never skipped for one already running, whose snapshot may predate the rows asked
//! for. After a failed read, notified rows are not handed over alone (an earlier row might be
//! missing): they ask for a read instead, until one succeeds.
//! The append transaction carrying such a splice also deletes the staged row
//! (`AppendStaged`), so exactly one splice per staged message can commit: a crash before that
//! commit leaves the row for the next owner.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use super::listen::{self, Channel, Note};
use super::{to_row, Lease, PgCore, Reply, Request, Response, Row};
use crate::event_log::{inserted_ids, Backend, Event, FlushCallback, Intake, LogError, StagedInput, SPLICED};

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
    /// Staged message ids handed to the inbox whose splice has not committed yet.
    staged: HashSet<String>,
    /// Staged ids whose splices are pending: deleted by the next transaction.
    claims: Vec<String>,
    /// The transaction in flight: how many rows it took, and the staged ids it claims.
    flight: (u64, Vec<String>),
    /// A staged-rows read is submitted and has not started yet (it will cover a new request).
    read_queued: bool,
    /// The last staged-rows read failed: notified rows ask for a read until one succeeds.
    reread: bool,
    /// The enqueue-channel subscription, once an inbox attached.
    subscription: Option<u64>,
    closed: bool,
}

struct Shared {
    core: PgCore,
    lease: Lease,
    state: Mutex<State>,
    /// Inboxes over this log, oldest first; staged input goes to the first one alive.
    intakes: Mutex<Vec<Weak<dyn Intake>>>,
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

/// The next transaction, if none is in flight and rows are pending. Its rows are taken when
/// the runtime thread gets to it, not now (`Request::Deferred`): a loop appends a step's
/// events one by one (a model reply, then `step/end` and `turn/end`), and those appended until
/// then go in this transaction instead of waiting for the next one. The caller submits it
/// after dropping the state lock: a stopped runtime replies at once, on the calling thread,
/// and that reply takes the lock.
fn next_batch(shared: &Arc<Shared>, st: &mut State) -> Option<(Request, Reply)> {
    if st.in_flight || st.pending.is_empty() || st.poison.is_some() {
        return None;
    }
    st.in_flight = true;
    let batch = Arc::clone(shared);
    let make = move || {
        let mut st = lock(&batch);
        let rows = std::mem::take(&mut st.pending);
        let claims = std::mem::take(&mut st.claims);
        st.flight = (rows.len() as u64, claims.clone());
        let lease = batch.lease.clone();
        // Never empty: only this takes the pending rows while the batch is in flight.
        (!rows.is_empty()).then(|| match claims.is_empty() {
            true => Request::Append { lease, rows },
            false => Request::AppendStaged { lease, rows, claims },
        })
    };
    let next = Arc::clone(shared);
    let reply: Reply = Box::new(move |result| {
        // What the batch took (nothing if it never ran: the runtime had stopped).
        let (n, claims) = std::mem::take(&mut lock(&next).flight);
        committed(&next, n, &claims, result);
    });
    Some((Request::Deferred { id: shared.lease.session_id.clone(), make: Box::new(make) }, reply))
}

fn submit(shared: &Shared, batch: Option<(Request, Reply)>) {
    if let Some((request, reply)) = batch {
        shared.core.submit(request, reply);
    }
}

/// Runs on the reply thread when a transaction ends: settles barriers, sends the next batch.
fn committed(shared: &Arc<Shared>, n: u64, claims: &[String], result: Result<Response, LogError>) {
    let (ready, outcome, batch) = {
        let mut st = lock(shared);
        st.in_flight = false;
        match result {
            Ok(_) => {
                st.committed += n;
                for id in claims {
                    st.staged.remove(id);
                }
            }
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

/// Reads the staged rows, in the session's order of requests, unless a read is queued that has
/// not started (it reads after this was asked for).
fn fetch(shared: &Arc<Shared>) {
    {
        let mut st = lock(shared);
        if st.closed || st.poison.is_some() || st.read_queued {
            return;
        }
        st.read_queued = true;
    }
    let (started, id) = (Arc::clone(shared), shared.lease.session_id.clone());
    let make = move || {
        lock(&started).read_queued = false;
        Some(Request::Staged { id })
    };
    let next = Arc::clone(shared);
    submit_in_order(shared, Box::new(make), Box::new(move |result| fetched(&next, result)));
}

/// A notification that carries its staged row: handed to the inbox without reading it back,
/// on the reply thread, in the session's order of requests (after the reads queued before it).
fn notified(shared: &Arc<Shared>, row: StagedInput) {
    let next = Arc::clone(shared);
    let reply: Reply = Box::new(move |_| {
        // A read failed before this row: an earlier one may be missing, so read them all.
        if lock(&next).reread {
            return fetch(&next);
        }
        hand_over(&next, vec![row]);
    });
    submit_in_order(shared, Box::new(|| None), reply);
}

/// Submits `make`'s request (or nothing, `None`) as a request of this session: the pool serves
/// a session's requests on one connection in submission order, and their replies run in that
/// order, so staged input is handed over in the order the notifications came.
fn submit_in_order(shared: &Shared, make: Box<dyn FnOnce() -> Option<Request> + Send + Sync>, reply: Reply) {
    let request = Request::Deferred { id: shared.lease.session_id.clone(), make };
    shared.core.submit(request, reply);
}

/// On the reply thread: hands the rows not already handed over to the inbox.
fn fetched(shared: &Arc<Shared>, result: Result<Response, LogError>) {
    // A failed read is not reported: the next notification (or re-LISTEN) reads again.
    let rows = match result {
        Ok(Response::Staged(rows)) => {
            lock(shared).reread = false;
            rows
        }
        _ => {
            let mut st = lock(shared);
            st.reread = true;
            // In case it never started (the runtime had stopped): at worst one read more.
            st.read_queued = false;
            Vec::new()
        }
    };
    hand_over(shared, rows);
}

/// Hands `rows` not already handed over to the inbox (ids in the log already are dropped by it).
fn hand_over(shared: &Arc<Shared>, rows: Vec<StagedInput>) {
    let fresh: Vec<StagedInput> = {
        let mut st = lock(shared);
        if st.closed {
            return;
        }
        let fresh: Vec<StagedInput> = rows.into_iter().filter(|r| !st.staged.contains(&r.id)).collect();
        // Marked before the inbox appends, so `enqueue` tags the splices as claims.
        st.staged.extend(fresh.iter().map(|r| r.id.clone()));
        fresh
    };
    if !fresh.is_empty() {
        let ids: Vec<String> = fresh.iter().map(|r| r.id.clone()).collect();
        let intake = lock_intakes(shared).iter().find_map(Weak::upgrade);
        // Outside every lock: the inbox appends to the log, which enqueues here.
        let taken = intake.map(|i| i.take(fresh)).unwrap_or_default();
        let mut st = lock(shared);
        // Operations stay marked until their answers are recorded, so no read hands them over again.
        let answered = |id: &String| taken.settled.iter().any(|(op, _)| op == id);
        for id in ids.iter().filter(|id| !taken.taken.contains(id) && !answered(id)) {
            st.staged.remove(id);
        }
        drop(st);
        if !taken.dropped.is_empty() {
            let request = Request::Unstage { lease: shared.lease.clone(), ids: taken.dropped };
            shared.core.submit(request, Box::new(|_| ()));
        }
        if !taken.settled.is_empty() {
            settle(shared, taken.settled);
        }
    }
}

/// Records the answers to staged operations once what they appended has committed (a flush
/// barrier), so a requester told "applied" finds the change in the log. A failed flush records
/// nothing: the operations stay staged for the session's next owner.
fn settle(shared: &Arc<Shared>, outcomes: Vec<(String, String)>) {
    let next = Arc::clone(shared);
    let done: FlushCallback = Box::new(move |flushed| {
        let ids: Vec<String> = outcomes.iter().map(|(id, _)| id.clone()).collect();
        if flushed.is_err() {
            return forget_staged(&next, &ids);
        }
        let request = Request::Settle { lease: next.lease.clone(), outcomes };
        let after = Arc::clone(&next);
        next.core.submit(request, Box::new(move |_| forget_staged(&after, &ids)));
    });
    PgBackend { shared: Arc::clone(shared) }.flush(done);
}

fn forget_staged(shared: &Shared, ids: &[String]) {
    let mut st = lock(shared);
    for id in ids {
        st.staged.remove(id);
    }
}

fn lock_intakes(shared: &Shared) -> MutexGuard<'_, Vec<Weak<dyn Intake>>> {
    shared.intakes.lock().unwrap_or_else(PoisonError::into_inner)
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
            staged: HashSet::new(),
            claims: Vec::new(),
            flight: (0, Vec::new()),
            read_queued: false,
            reread: false,
            subscription: None,
            closed: false,
        };
        let intakes = Mutex::new(Vec::new());
        PgBackend { shared: Arc::new(Shared { core, lease, state: Mutex::new(state), intakes }) }
    }
}

impl Backend for PgBackend {
    fn enqueue(&self, event: &Event) -> Result<(), LogError> {
        if let Some(e) = self.shared.core.forked() {
            return Err(e);
        }
        let mut st = lock(&self.shared);
        if let Some(poison) = &st.poison {
            return Err(self.shared.error(poison));
        }
        st.pending.push(to_row(event));
        st.enqueued += 1;
        // Only while staged input is being inserted: a splice of one of those ids claims it,
        // once (a later splice inserting the same id again, as a replacement does, while the
        // first one's transaction is in flight must not claim the deleted row a second time).
        if !st.staged.is_empty() && event.kind() == SPLICED {
            for id in inserted_ids(event.data_json()) {
                if st.staged.contains(&id) && !st.claims.contains(&id) && !st.flight.1.contains(&id) {
                    st.claims.push(id);
                }
            }
        }
        let batch = next_batch(&self.shared, &mut st);
        drop(st);
        submit(&self.shared, batch);
        Ok(())
    }

    fn flush(&self, done: FlushCallback) {
        // In a forked child the batch in flight (if any) is the parent's: it never completes here.
        if let Some(e) = self.shared.core.forked() {
            return done(Err(e));
        }
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

    fn close(&self, _events: Vec<Event>) -> Result<(), LogError> {
        // The lease is the parent's: nothing to release here, and nothing to wait for.
        if let Some(e) = self.shared.core.forked() {
            return Err(e);
        }
        let subscription = {
            let mut st = lock(&self.shared);
            st.closed = true;
            st.subscription.take()
        };
        if let Some(id) = subscription {
            self.shared.core.submit(Request::Unlisten { id }, Box::new(|_| ()));
        }
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

    /// Starts listening on the session's enqueue channel (first inbox only) and reads what is
    /// staged already (once listening): input enqueued while no owner ran is picked up here,
    /// after `open`.
    fn attach_intake(&self, intake: Weak<dyn Intake>) {
        {
            // Inboxes come and go over a long-lived log: forget the dropped ones.
            let mut intakes = lock_intakes(&self.shared);
            intakes.retain(|i| i.strong_count() > 0);
            intakes.push(intake);
        }
        let subscribe = {
            let mut st = lock(&self.shared);
            match st.subscription.is_none() && !st.closed {
                true => {
                    let id = listen::next_id();
                    st.subscription = Some(id);
                    Some(id)
                }
                false => None,
            }
        };
        if let Some(id) = subscribe {
            let weak = Arc::downgrade(&self.shared);
            let subscriber: listen::Subscriber = Arc::new(move |note: Note| {
                let Some(shared) = weak.upgrade() else { return };
                match note {
                    Note::Notified(payload) => match super::sql::staged_from_payload(&payload) {
                        Some(row) => notified(&shared, row),
                        None => fetch(&shared),
                    },
                    Note::Listening => fetch(&shared),
                }
            });
            let channel = listen::channel_name(Channel::Enqueued, &self.shared.lease.session_id);
            self.shared.core.submit(Request::Listen { id, channel, subscriber }, Box::new(|_| ()));
            // No read now: the subscriber hears `Note::Listening` once the LISTEN is in place
            // and reads then, which also covers input staged until then (a read before it
            // would be repeated by that one anyway: one round trip per take saved).
            return;
        }
        fetch(&self.shared);
    }
}
