//! The runtime thread: a pool of connections, each serving one request at a time.
//!
//! The store's `pool_size` connections are tasks on one current-thread runtime; `pool.rs` says
//! which serves a request (a session's requests run in submission order, on one connection at
//! a time). The first is opened by the constructor, the others when the first busy moment
//! needs them. Leases are renewed each tick by whichever connection is free (leases.rs).
//! A dropped connection is re-established with jittered exponential backoff, bounded by the
//! store's reconnect budget (then `LogError::Database` naming the host and the last error).
//! The request it interrupted is retried when that is safe (reads, conditional writes), and an
//! append whose outcome is unknown is settled by reading the session back, never re-sent
//! blindly. How: `reconnect.rs` (backoff, telling a dropped connection from a statement's own
//! error) and `recover.rs` (settling the interrupted request), this module's children.

mod leases;
mod pool;
mod reconnect;
mod recover;

use std::cell::Cell;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use tokio_postgres::Client;

use super::listen::{self, Subscriber};
use super::sql::Prepared;
use super::tls::Target;
use super::{db_err, schema, sql, Lease, PgOptions, Row};
use crate::event_log::{LogError, StagedInput, StagedOp};

/// How many times one request may see its connection drop before it fails.
const MAX_LOSSES: u32 = 3;

/// What the runtime thread can be asked to do.
pub enum Request {
    /// Create session `id` with this header, taking its lease.
    Create { id: String, header: String },
    /// Acquire the lease, then read the header and every record.
    Open { id: String },
    /// Create session `id` (unowned, with this header) as a copy of `parent` up to seq `at`.
    Fork { parent: String, at: i64, id: String, header: String },
    /// Append rows under the lease (refused if the lease moved on).
    Append { lease: Lease, rows: Vec<Row> },
    /// Every record of a session.
    Read { id: String },
    /// Give the lease up.
    Release { lease: Lease },
    /// Whether session `id` exists.
    Exists { id: String },
    /// Every session id.
    List,
    /// Delete session `id` and its records (refused while its lease is held).
    Delete { id: String },
    /// Subscribes to a NOTIFY channel on the store's LISTEN connection (opened on first use).
    Listen { id: u64, channel: String, subscriber: Subscriber },
    /// Ends subscription `id` (from `Listen`).
    Unlisten { id: u64 },
    /// Records with seq > `after` (a follower's catch-up read).
    ReadAfter { id: String, after: i64, incarnation: i64 },
    /// An append that also deletes the staged messages its splices insert.
    AppendStaged { lease: Lease, rows: Vec<Row>, claims: Vec<String> },
    /// Stages a message for the session's owner: `Bool(false)` if the id is taken.
    Enqueue { id: String, staged: StagedInput },
    /// The messages staged for a session.
    Staged { id: String },
    /// Deletes staged rows the owner dropped.
    Unstage { lease: Lease, ids: Vec<String> },
    /// Stages an operation for the session's owner (`sql::stage_op`): `Bool(false)` if there
    /// is no such session.
    StageOp { id: String, op_id: String, op: StagedOp, args: String },
    /// The owner's answers to staged operations (`sql::settle`).
    Settle { lease: Lease, outcomes: Vec<(String, String)> },
    /// Reads the answer to a staged operation (`Outcome(None)`: none yet), or with `forget`
    /// deletes it.
    Outcome { id: String, op_id: String, forget: bool },
    /// Withdraws a staged operation nobody answered: `Bool(false)` if it is no longer staged.
    Withdraw { id: String, op_id: String },
    /// The header and records of a session, without its lease.
    Peek { id: String },
    /// Acquires up to `limit` takeable sessions for a worker named `name` (`sql::take`): only
    /// those of `ids` if given (a notification named them), else any (a sweep). With
    /// `expiry`, also reads when another owner's lease next expires (`sql::next_expiry`).
    Take { limit: i64, name: String, expiry: bool, ids: Option<Vec<String>> },
    /// Parks the session under `lease`, releasing it (`Bool(false)`: the lease moved on).
    Park { lease: Lease, detail: String, runnable: bool },
    /// Makes a parked session active again (`Bool(false)`: it was not parked).
    Unpark { id: String },
    /// Flags a session as having unclaimed input in its log, for the workers.
    MarkRunnable { id: String },
    /// What an operator sees of every session, or of one.
    Sessions { id: Option<String>, last_of: Vec<String> },
    /// Does nothing: its reply runs on the reply thread (a LISTEN subscriber's hand-off there).
    Ping,
    /// A request made when the runtime thread gets to it rather than when it was submitted
    /// (`None`: nothing to do): a session's next append batch, so rows appended meanwhile
    /// join it, and its staged-input reads and hand-overs (`backend.rs`). Runs on the runtime
    /// thread: it must not block or call Python. `id` is the session's, so the pool keeps it
    /// in that session's order (and its reply after those of the session's earlier requests).
    Deferred { id: String, make: Box<dyn FnOnce() -> Option<Request> + Send + Sync> },
    /// Tests only: make the next append or open lose its connection (see [`Fault`]).
    #[doc(hidden)]
    InjectFault(Fault),
}

/// A connection loss at a chosen point of the next append, for tests of the recovery path
/// (the server ends the backend, as `pg_terminate_backend` from another session would).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Before the append statement is sent: it must be sent again, once.
    LoseConnectionBeforeAppend,
    /// After it committed, before its reply is seen: it must not be sent again.
    LoseReplyAfterAppend,
    /// After the next open took the lease and read the session: the retry must adopt that
    /// lease rather than find the session locked (by itself).
    LoseReplyAfterOpen,
    /// After the next take committed, before its reply is seen: the retry must hand over the
    /// sessions it took (held by this store, unknown to its caller) rather than strand them.
    LoseReplyAfterTake,
}

#[derive(Debug)]
pub enum Response {
    Lease(Lease),
    /// Lease, header text, record texts.
    Opened(Lease, String, Vec<String>),
    Records(Vec<String>),
    Bool(bool),
    Ids(Vec<String>),
    Done,
    Staged(Vec<StagedInput>),
    /// The answer to a staged operation, if there is one yet.
    Outcome(Option<String>),
    /// Header text, incarnation, record texts.
    Session(String, i64, Vec<String>),
    /// A followed session is gone, or was deleted and created again.
    Replaced,
    /// The sessions taken, and the seconds until another owner's lease next expires.
    Taken(Vec<sql::Taken>, Option<f64>),
    Sessions(Vec<sql::SessionInfo>),
}

/// Runs on the store's reply thread, never on the runtime thread: a reply may wait (for the
/// GIL, to complete an asyncio future) without stalling other sessions' database I/O. Replies
/// run one at a time in completion order, so they should hand off rather than work.
pub type Reply = Box<dyn FnOnce(Result<Response, LogError>) + Send>;

/// A request, its reply, and its routing key (`pool::key`), to release when it is served.
type Job = (Request, Reply, Option<String>);

/// What the pool's connections share. Its locks are held for a few instructions, never
/// across an await, and nothing runs caller code under them.
pub(super) struct Shared {
    routing: Mutex<pool::Routing>,
    /// Leases this store holds, renewed every third of the TTL unless an append extended them.
    held: Mutex<leases::Leases>,
    fault: Mutex<Option<Fault>>,
    /// The LISTEN connection, opened on first use (followers, enqueue wake-ups).
    listener: Mutex<listen::Lazy>,
    /// When the leases are next due for renewal (`None`: a TTL of 0, never).
    next_renewal: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct Handle {
    /// One sender per connection of the pool.
    lanes: Vec<UnboundedSender<Job>>,
    shared: Arc<Shared>,
    pub owner: String,
    pub applied: Vec<i32>,
    /// The process that started the threads: a child inherits the handle through `fork()`
    /// but not the threads, so a request sent there would wait forever.
    pid: u32,
}

impl Handle {
    pub fn submit(&self, request: Request, reply: Reply) {
        if self.forked() {
            return reply(Err(forked(self.pid)));
        }
        let key = pool::key(&request).map(String::from);
        // Sent under the routing lock, so two requests of one session submitted by two threads
        // reach their connection in the order they were routed.
        let refused = {
            let mut routing = lock(&self.shared.routing);
            let lane = routing.pick(key.as_deref());
            self.lanes[lane].send((request, reply, key)).err()
        };
        if let Some(e) = refused {
            (e.0 .1)(Err(stopped()));
        }
    }

    /// How many connections the pool may open.
    pub fn pool_size(&self) -> usize {
        self.lanes.len()
    }

    /// Whether this is a copy inherited through `fork()` (its threads stayed in the parent).
    pub fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    pub fn fork_error(&self) -> LogError {
        forked(self.pid)
    }
}

/// The error of every use of a store in a process it was inherited by.
pub fn forked(parent: u32) -> LogError {
    LogError::Database {
        context: "postgres store".into(),
        detail: format!(
            "this store was created in process {parent} and inherited by process {} through fork(); \
             its connection threads stay in the parent: create the PostgresStore in the child",
            std::process::id()
        ),
    }
}

pub fn stopped() -> LogError {
    LogError::Database { context: "postgres store".into(), detail: "the connection thread has stopped".into() }
}

pub fn unexpected(response: &Response) -> LogError {
    LogError::Database { context: "postgres store".into(), detail: format!("unexpected response {response:?}") }
}

/// Starts the thread, connects and migrates; returns once the store is usable (or why not).
pub fn start(dsn: &str, owner: String, options: PgOptions) -> Result<Handle, LogError> {
    let mut target = Target::from_dsn(dsn)?;
    // The LISTEN connection names itself (listen.rs); it shares the TLS setup, read once,
    // unless it has a DSN of its own (the store's goes through a transaction-pooling proxy).
    let listen_target = match options.listen_dsn {
        Some(listen_dsn) => Target::from_dsn(&listen_dsn)?,
        None => target.clone(),
    };
    // Named per store so an operator (or a test) can find this store's backend in
    // pg_stat_activity; a DSN that names one keeps it.
    if target.config.get_application_name().is_none() {
        target.config.application_name(format!("kerman {owner}"));
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(Reply, Result<Response, LogError>)>();
    std::thread::Builder::new()
        .name("kerman-postgres-replies".into())
        .spawn(move || {
            ON_REPLY_THREAD.with(|on| on.set(true));
            for (reply, result) in done_rx {
                // A panicking reply must not take the other replies down with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || reply(result)));
            }
        })
        .map_err(|e| LogError::io("spawn the postgres reply thread", e))?;
    let size = options.pool_size.max(1);
    let shared = Arc::new(Shared {
        routing: Mutex::new(pool::Routing::new(size)),
        held: Mutex::new(leases::Leases::default()),
        fault: Mutex::new(None),
        listener: Mutex::new(listen::Lazy::new(listen_target)),
        next_renewal: Mutex::new(None),
    });
    let (mut lanes, mut workers) = (Vec::with_capacity(size), Vec::with_capacity(size));
    for index in 0..size {
        let (tx, rx) = unbounded_channel();
        lanes.push(tx);
        workers.push(Worker {
            index,
            host: reconnect::host_of(&target.config),
            target: target.clone(),
            owner: owner.clone(),
            ttl_ms: options.lease_ttl_ms as f64,
            reconnect_budget: Duration::from_millis(options.reconnect_ms),
            request_timeout: (options.request_ms > 0).then(|| Duration::from_millis(options.request_ms)),
            named: options.prepared_statements,
            conn: None,
            gave_up: false,
            shared: Arc::clone(&shared),
            rx,
        });
    }
    std::thread::Builder::new()
        .name("kerman-postgres".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(LogError::io("start the postgres runtime", e)))),
            };
            rt.block_on(run(workers, ready_tx, done_tx));
        })
        .map_err(|e| LogError::io("spawn the postgres thread", e))?;
    let applied = ready_rx.recv().unwrap_or_else(|_| Err(stopped()))?;
    Ok(Handle { lanes, shared, owner, applied, pid: std::process::id() })
}

/// The runtime thread's work: open the first connection (migrating), then serve on every
/// connection of the pool until the store is dropped.
async fn run(
    mut workers: Vec<Worker>,
    ready: SyncSender<Result<Vec<i32>, LogError>>,
    done: std::sync::mpsc::Sender<(Reply, Result<Response, LogError>)>,
) {
    // The first connect is not retried: a wrong DSN or a server that is down should fail
    // the constructor at once.
    let migrated = workers[0].open_first().await;
    let failed = migrated.is_err();
    let _ = ready.send(migrated);
    if failed {
        return;
    }
    // A busy store still renews its idle sessions: the deadline is checked before every
    // request too. A TTL of 0 is never renewed.
    if let Some(p) = workers[0].renewal_period() {
        *lock(&workers[0].shared.next_renewal) = Some(Instant::now() + p);
    }
    let tasks: Vec<_> = workers.into_iter().map(|w| tokio::spawn(w.run(done.clone()))).collect();
    drop(done);
    for task in tasks {
        let _ = task.await;
    }
}

thread_local! {
    static ON_REPLY_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the caller is a store's reply thread, where nothing may wait for another reply.
pub fn on_reply_thread() -> bool {
    ON_REPLY_THREAD.with(std::cell::Cell::get)
}

/// One live connection and the statements prepared on it.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) prepared: Prepared,
    /// The task driving the socket: aborted with the connection, so a connection given up on
    /// (no reply in time) closes its socket instead of waiting for a reply that never comes.
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Conn {
    pub(super) fn new(client: Client, prepared: Prepared, task: tokio::task::JoinHandle<()>) -> Conn {
        Conn { client, prepared, task }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Drives a connection's socket until it closes (its error is seen by the client's requests).
pub(super) fn drive<S, T>(connection: tokio_postgres::Connection<S, T>) -> tokio::task::JoinHandle<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _ = connection.await;
    })
}

/// One connection of the pool, and the requests routed to it.
pub(super) struct Worker {
    /// Its place in the pool (0 is opened by the constructor).
    index: usize,
    /// The DSN's settings and TLS connector: every connection is made through it.
    pub(super) target: Target,
    /// host:port, for errors.
    pub(super) host: String,
    pub(super) owner: String,
    pub(super) ttl_ms: f64,
    pub(super) reconnect_budget: Duration,
    /// How long one try of a request may wait for its reply (`PgOptions::request_ms`).
    pub(super) request_timeout: Option<Duration>,
    /// Named prepared statements for `Prepared` (`PgOptions::prepared_statements`).
    pub(super) named: bool,
    pub(super) conn: Option<Conn>,
    /// The last reconnect ran out of budget: the next request tries once, without backoff,
    /// so a long outage fails each request fast instead of stalling every one for the budget.
    pub(super) gave_up: bool,
    pub(super) shared: Arc<Shared>,
    rx: UnboundedReceiver<Job>,
}

impl Worker {
    /// Connects, migrates and prepares: the constructor's connection.
    async fn open_first(&mut self) -> Result<Vec<i32>, LogError> {
        let context = format!("connect to {}", self.host);
        let (mut client, connection) = self.target.connect().await.map_err(|detail| LogError::Database { context, detail })?;
        let task = drive(connection);
        let applied = schema::migrate(&mut client).await?;
        let prepared = Prepared::new(&client, self.named).await?;
        self.conn = Some(Conn::new(client, prepared, task));
        Ok(applied)
    }

    fn renewal_period(&self) -> Option<Duration> {
        (self.ttl_ms > 0.0).then(|| Duration::from_secs_f64(self.ttl_ms / 3000.0).max(Duration::from_millis(10)))
    }

    /// When this connection should look at a renewal due at `at`: then, if it is open; half a
    /// period later if it is not, so a renewal opens a connection only when the open ones have
    /// been busy that long (a store used by one caller at a time keeps one connection).
    fn renewal_at(&self, at: Instant) -> Instant {
        match (self.conn.is_some() || self.index == 0, self.renewal_period()) {
            (false, Some(period)) => at + period / 2,
            _ => at,
        }
    }

    /// Claims the renewal if it is due and this connection should run it (the next one is
    /// then a period away), so one connection runs it per tick: the one a request would be
    /// routed to, so a connection stuck in a slow request does not hold the leases up.
    /// Marked renewing until [`pool::Routing::renewed`].
    fn claim_renewal(&self) -> bool {
        let Some(period) = self.renewal_period() else { return false };
        let mut next = lock(&self.shared.next_renewal);
        if !matches!(*next, Some(at) if Instant::now() >= self.renewal_at(at)) {
            return false;
        }
        if !lock(&self.shared.routing).claim_renewal(self.index) {
            return false;
        }
        *next = Some(Instant::now() + period);
        true
    }

    async fn run(mut self, done: std::sync::mpsc::Sender<(Reply, Result<Response, LogError>)>) {
        loop {
            if self.claim_renewal() {
                self.renew().await;
                lock(&self.shared.routing).renewed(self.index);
            }
            let wake = lock(&self.shared.next_renewal).map(|at| self.renewal_at(at));
            let job = match wake {
                Some(at) => match tokio::time::timeout_at(at, self.rx.recv()).await {
                    Ok(job) => job,
                    Err(_) => continue,
                },
                None => self.rx.recv().await,
            };
            let Some((request, reply, key)) = job else { break };
            let result = self.serve(request).await;
            // Released before the reply runs: a request the reply submits may go anywhere.
            lock(&self.shared.routing).finished(self.index, key.as_deref());
            // The reply thread outlives this loop (it ends when `done` is dropped), so this
            // send fails only if it panicked outside a reply, and then there is nobody to tell.
            let _ = done.send((reply, result));
        }
    }

    /// Extends the leases held. A failure is not reported: the next append of a session whose
    /// lease lapsed meanwhile is refused (or, if nobody took it, succeeds: the epoch decides).
    async fn renew(&mut self) {
        if lock(&self.shared.held).is_empty() || self.connection().await.is_err() {
            return;
        }
        // A lease an append extended within half a period is left for the next round: it
        // still has more than half the TTL then.
        let fresh = self.renewal_period().unwrap_or_default() / 2;
        if !self.renew_held(fresh).await && self.lost().await {
            // Reconnect now rather than at the next request: an idle owner must keep renewing
            // (a reconnect renews).
            let _ = self.connection().await;
        }
    }

    /// Runs one request, reconnecting when the connection drops under it. Reads are simply
    /// retried; a write whose outcome is unknown is settled from what the database now holds.
    async fn serve(&mut self, request: Request) -> Result<Response, LogError> {
        let request = match request {
            Request::Deferred { make, .. } => match make() {
                Some(request) => request,
                None => return Ok(Response::Done),
            },
            other => other,
        };
        if let Request::InjectFault(fault) = request {
            *lock(&self.shared.fault) = Some(fault);
            return Ok(Response::Done);
        }
        if let Request::Release { lease } | Request::Park { lease, .. } = &request {
            // Given up locally first, whatever the server says: a release that cannot reach it
            // (an outage) must still stop the renewals, or the lease would be renewed as soon
            // as the server is back and outlive the log. Unrenewed, it lapses after the TTL.
            unhold(&self.shared, lease);
        }
        let mut losses = 0;
        let mut resent = false;
        loop {
            self.connection().await?;
            let limit = self.request_timeout;
            let tried = async {
                match losses {
                    0 => self.attempt(&request).await,
                    _ => self.after_loss(&request, &mut resent).await,
                }
            };
            let Some(result) = within(limit, tried).await else {
                // No reply: give the connection up (its socket closes with it) and settle the
                // request as after a lost connection.
                self.conn = None;
                losses += 1;
                if losses > MAX_LOSSES {
                    return Err(no_reply(&request, &self.host, limit.unwrap_or_default(), losses));
                }
                continue;
            };
            match result {
                Err(e @ LogError::Database { .. }) if self.lost().await => {
                    losses += 1;
                    if losses > MAX_LOSSES {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    /// The request's first try.
    pub(super) async fn attempt(&mut self, request: &Request) -> Result<Response, LogError> {
        let Some(Conn { client: c, prepared, .. }) = self.conn.as_mut() else { return Err(stopped()) };
        let (owner, ttl_ms) = (self.owner.as_str(), self.ttl_ms);
        Ok(match request {
            Request::Create { id, header } => {
                let sent = Instant::now();
                let lease = sql::create(c, id, header, owner, ttl_ms).await?;
                lock(&self.shared.held).hold(id, lease.epoch, sent);
                Response::Lease(lease)
            }
            Request::Open { id } => {
                let sent = Instant::now();
                let (lease, header) = sql::acquire(c, id, owner, ttl_ms).await?;
                let records = sql::read(c, id).await?;
                if fault_is(&self.shared, Fault::LoseReplyAfterOpen) {
                    return Err(terminate_self(c).await);
                }
                // Only now: if the read fails, a retry must be able to adopt this lease, and if
                // no retry succeeds the lease lapses unrenewed.
                lock(&self.shared.held).hold(id, lease.epoch, sent);
                Response::Opened(lease, header, records)
            }
            Request::Append { lease, rows } | Request::AppendStaged { lease, rows, .. } => {
                if fault_is(&self.shared, Fault::LoseConnectionBeforeAppend) {
                    return Err(terminate_self(c).await);
                }
                let claims = match request {
                    Request::AppendStaged { claims, .. } => claims.as_slice(),
                    _ => &[],
                };
                let sent = Instant::now();
                let result = sql::append(c, prepared, lease, rows, ttl_ms, claims).await;
                match result {
                    Err(LogError::LeaseLost { .. }) => lock(&self.shared.held).remove(&lease.session_id),
                    // The append extended the lease: no renewal needed for a while.
                    Ok(()) => lock(&self.shared.held).extended(lease, sent),
                    Err(_) => {}
                }
                result?;
                if fault_is(&self.shared, Fault::LoseReplyAfterAppend) {
                    return Err(terminate_self(c).await);
                }
                Response::Done
            }
            Request::Read { id } => Response::Records(sql::read(c, id).await?),
            Request::Fork { parent, at, id, header } => {
                sql::fork(c, parent, *at, id, header).await?;
                Response::Done
            }
            Request::Release { lease } => {
                unhold(&self.shared, lease);
                sql::release(c, lease).await?;
                Response::Done
            }
            Request::Exists { id } => Response::Bool(sql::exists(c, id).await?),
            Request::List => Response::Ids(sql::list(c).await?),
            Request::Delete { id } => {
                sql::delete(c, id).await?;
                Response::Done
            }
            Request::InjectFault(_) | Request::Ping | Request::Deferred { .. } => Response::Done,
            Request::Listen { id, channel, subscriber } => {
                lock(&self.shared.listener).get().subscribe(*id, channel.clone(), subscriber.clone());
                Response::Done
            }
            Request::Unlisten { id } => {
                if let Some(l) = lock(&self.shared.listener).started() {
                    l.unsubscribe(*id);
                }
                Response::Done
            }
            Request::ReadAfter { id, after, incarnation } => match sql::read_after(c, id, *after, *incarnation).await? {
                Some(records) => Response::Records(records),
                None => Response::Replaced,
            },
            Request::Enqueue { id, staged } => match sql::enqueue(c, prepared, staged, id).await? {
                Ok(()) => Response::Bool(true),
                Err(sql::Refused::Duplicate) => Response::Bool(false),
                Err(sql::Refused::NoSession) => return Err(LogError::NotFound { id: id.clone() }),
            },
            Request::Staged { id } => Response::Staged(sql::staged(c, prepared, id).await?),
            Request::StageOp { id, op_id, op, args } => Response::Bool(sql::stage_op(c, id, op_id, *op, args).await?),
            Request::Settle { lease, outcomes } => {
                sql::settle(c, lease, outcomes).await?;
                Response::Done
            }
            Request::Outcome { id, op_id, forget } => Response::Outcome(sql::outcome(c, id, op_id, *forget).await?),
            Request::Withdraw { id, op_id } => Response::Bool(sql::withdraw(c, id, op_id).await?),
            Request::Unstage { lease, ids } => {
                sql::unstage(c, lease, ids).await?;
                Response::Done
            }
            Request::Take { limit, name, expiry, ids } => {
                let sent = Instant::now();
                let taken = sql::take(c, prepared, *limit, owner, name, ttl_ms, ids.as_deref()).await?;
                if fault_is(&self.shared, Fault::LoseReplyAfterTake) && !taken.is_empty() {
                    return Err(terminate_self(c).await);
                }
                {
                    let mut held = lock(&self.shared.held);
                    for (lease, _, _) in &taken {
                        held.hold(&lease.session_id, lease.epoch, sent);
                    }
                }
                let expiry = match expiry {
                    true => sql::next_expiry(c, owner).await?,
                    false => None,
                };
                Response::Taken(taken, expiry)
            }
            Request::Park { lease, detail, runnable } => Response::Bool(sql::park(c, lease, detail, *runnable).await?),
            Request::Unpark { id } => Response::Bool(sql::unpark(c, id).await?),
            Request::MarkRunnable { id } => {
                sql::mark_runnable(c, id).await?;
                Response::Done
            }
            Request::Sessions { id, last_of } => Response::Sessions(sql::sessions(c, id.as_deref(), last_of).await?),
            Request::Peek { id } => {
                let (header, incarnation, records) = sql::peek(c, id).await?.ok_or(LogError::NotFound { id: id.clone() })?;
                Response::Session(header, incarnation, records)
            }
        })
    }
}

/// Stops renewing `lease` if it is the one held.
fn unhold(shared: &Shared, lease: &Lease) {
    lock(&shared.held).release(lease);
}

/// Whether the injected fault is `fault`, clearing it if so (it fires once, on whichever
/// connection serves the next append or open).
fn fault_is(shared: &Shared, fault: Fault) -> bool {
    let mut f = lock(&shared.fault);
    let hit = *f == Some(fault);
    if hit {
        *f = None;
    }
    hit
}

/// `work`'s output, or `None` if `limit` passed first (with no limit, always its output).
pub(super) async fn within<F: std::future::Future>(limit: Option<Duration>, work: F) -> Option<F::Output> {
    match limit {
        None => Some(work.await),
        Some(limit) => tokio::time::timeout(limit, work).await.ok(),
    }
}

/// A request that got no reply in time, `times` times. An append's connection was dropped
/// with the statement possibly sent, and its server process may still commit it (a backend
/// waiting on a lock does not notice its client leaving): its outcome is unknown.
fn no_reply(request: &Request, host: &str, limit: Duration, times: u32) -> LogError {
    let what = format!("no reply from {host} within {:.1} s, {times} times", limit.as_secs_f64());
    match request {
        Request::Append { lease, rows } | Request::AppendStaged { lease, rows, .. } => {
            recover::unknown_outcome(&lease.session_id, rows, &what)
        }
        _ => LogError::Database { context: format!("postgres request to {host}"), detail: what },
    }
}

/// Ends this connection's server process from inside (the test faults): the client sees the
/// connection drop exactly as after an operator's `pg_terminate_backend`.
async fn terminate_self(c: &mut Client) -> LogError {
    match c.simple_query("SELECT pg_terminate_backend(pg_backend_pid())").await {
        Err(e) => db_err("injected connection loss")(e),
        Ok(_) => LogError::Database { context: "injected connection loss".into(), detail: "the backend survived".into() },
    }
}
