//! The runtime thread: one connection, one request at a time.
//!
//! A dropped connection is re-established with jittered exponential backoff, bounded by the
//! store's reconnect budget (then `LogError::Database` naming the host and the last error).
//! The request it interrupted is retried when that is safe (reads, conditional writes), and an
//! append whose outcome is unknown is settled by reading the session back, never re-sent
//! blindly.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use super::sql::Prepared;
use super::{db_err, schema, sql, Lease, PgOptions, Row};
use crate::event_log::LogError;

/// What the runtime thread can be asked to do.
pub enum Request {
    Create { id: String, header: String },
    /// Acquire the lease, then read the header and every record.
    Open { id: String },
    Append { lease: Lease, rows: Vec<Row> },
    Read { id: String },
    Release { lease: Lease },
    Exists { id: String },
    List,
    Delete { id: String },
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
}

/// Runs on the store's reply thread, never on the runtime thread: a reply may wait (for the
/// GIL, to complete an asyncio future) without stalling other sessions' database I/O. Replies
/// run one at a time in completion order, so they should hand off rather than work.
pub type Reply = Box<dyn FnOnce(Result<Response, LogError>) + Send>;

type Job = (Request, Reply);

pub struct Handle {
    tx: UnboundedSender<Job>,
    pub owner: String,
    pub applied: Vec<i32>,
}

impl Handle {
    pub fn submit(&self, request: Request, reply: Reply) {
        if let Err(e) = self.tx.send((request, reply)) {
            (e.0 .1)(Err(stopped()));
        }
    }
}

pub fn stopped() -> LogError {
    LogError::Database { context: "postgres store".into(), detail: "the connection thread has stopped".into() }
}

pub fn unexpected(response: Response) -> LogError {
    LogError::Database { context: "postgres store".into(), detail: format!("unexpected response {response:?}") }
}

/// Starts the thread, connects and migrates; returns once the store is usable (or why not).
pub fn start(dsn: String, owner: String, options: PgOptions) -> Result<Handle, LogError> {
    let mut config: Config = dsn.parse().map_err(db_err("parse the DSN"))?;
    // Named per store so an operator (or a test) can find this store's backend in
    // pg_stat_activity; a DSN that names one keeps it.
    if config.get_application_name().is_none() {
        config.application_name(format!("kerman {owner}"));
    }
    let (tx, rx) = unbounded_channel();
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
    let worker = Worker {
        host: host_of(&config),
        config,
        owner: owner.clone(),
        ttl_ms: options.lease_ttl_ms as f64,
        reconnect_budget: Duration::from_millis(options.reconnect_ms),
        conn: None,
        gave_up: false,
        held: HashMap::new(),
        fault: None,
    };
    std::thread::Builder::new()
        .name("kerman-postgres".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(LogError::io("start the postgres runtime", e)))),
            };
            rt.block_on(worker.run(rx, ready_tx, done_tx));
        })
        .map_err(|e| LogError::io("spawn the postgres thread", e))?;
    let applied = ready_rx.recv().unwrap_or_else(|_| Err(stopped()))?;
    Ok(Handle { tx, owner, applied })
}

thread_local! {
    static ON_REPLY_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the caller is a store's reply thread, where nothing may wait for another reply.
pub fn on_reply_thread() -> bool {
    ON_REPLY_THREAD.with(|on| on.get())
}

fn host_of(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    match config.get_ports().first() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

/// One live connection and the statements prepared on it.
struct Conn {
    client: Client,
    prepared: Prepared,
}

/// How many times one request may see its connection drop before it fails.
const MAX_LOSSES: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

struct Worker {
    config: Config,
    /// host:port, for errors.
    host: String,
    owner: String,
    ttl_ms: f64,
    reconnect_budget: Duration,
    conn: Option<Conn>,
    /// The last reconnect ran out of budget: the next request tries once, without backoff,
    /// so a long outage fails each request fast instead of stalling every one for the budget.
    gave_up: bool,
    /// Leases this store holds (session id -> epoch), renewed every third of the TTL.
    held: HashMap<String, i64>,
    fault: Option<Fault>,
}

impl Worker {
    async fn run(
        mut self,
        mut rx: UnboundedReceiver<Job>,
        ready: SyncSender<Result<Vec<i32>, LogError>>,
        done: std::sync::mpsc::Sender<(Reply, Result<Response, LogError>)>,
    ) {
        // The first connect is not retried: a wrong DSN or a server that is down should fail
        // the constructor at once.
        let migrated = async {
            let (mut client, connection) = self.config.connect(NoTls).await.map_err(db_err("connect"))?;
            tokio::spawn(connection);
            let applied = schema::migrate(&mut client).await?;
            let prepared = Prepared::new(&client).await?;
            self.conn = Some(Conn { client, prepared });
            Ok(applied)
        }
        .await;
        let failed = migrated.is_err();
        let _ = ready.send(migrated);
        if failed {
            return;
        }
        // A busy store still renews its idle sessions: the deadline is checked before every
        // request too. A TTL of 0 is never renewed.
        let period = (self.ttl_ms > 0.0)
            .then(|| Duration::from_secs_f64(self.ttl_ms / 3000.0).max(Duration::from_millis(10)));
        let mut next_renewal = period.map(|p| Instant::now() + p);
        loop {
            if let (Some(p), Some(at)) = (period, next_renewal) {
                if Instant::now() >= at {
                    self.renew().await;
                    next_renewal = Some(Instant::now() + p);
                }
            }
            let job = match next_renewal {
                Some(at) => match tokio::time::timeout_at(at, rx.recv()).await {
                    Ok(job) => job,
                    Err(_) => continue,
                },
                None => rx.recv().await,
            };
            let Some((request, reply)) = job else { break };
            let result = self.serve(request).await;
            // The reply thread outlives this loop (it ends when `done` is dropped), so this
            // send fails only if it panicked outside a reply, and then there is nobody to tell.
            let _ = done.send((reply, result));
        }
    }

    /// Extends the leases held. A failure is not reported: the next append of a session whose
    /// lease lapsed meanwhile is refused (or, if nobody took it, succeeds: the epoch decides).
    async fn renew(&mut self) {
        if self.held.is_empty() || self.connection().await.is_err() {
            return;
        }
        let Some(conn) = self.conn.as_mut() else { return };
        if sql::renew(&mut conn.client, &self.held, &self.owner, self.ttl_ms).await.is_err() && self.lost().await {
            // Reconnect now rather than at the next request: an idle owner must keep renewing.
            if self.connection().await.is_ok() {
                if let Some(conn) = self.conn.as_mut() {
                    let _ = sql::renew(&mut conn.client, &self.held, &self.owner, self.ttl_ms).await;
                }
            }
        }
    }

    /// Runs one request, reconnecting when the connection drops under it. Reads are simply
    /// retried; a write whose outcome is unknown is settled from what the database now holds.
    async fn serve(&mut self, request: Request) -> Result<Response, LogError> {
        if let Request::InjectFault(fault) = request {
            self.fault = Some(fault);
            return Ok(Response::Done);
        }
        let mut losses = 0;
        let mut resent = false;
        loop {
            self.connection().await?;
            let result = match losses {
                0 => self.attempt(&request).await,
                _ => self.after_loss(&request, &mut resent).await,
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

    /// The connection, reconnecting with jittered exponential backoff (bounded by the
    /// reconnect budget) if it is gone.
    async fn connection(&mut self) -> Result<(), LogError> {
        if self.conn.as_ref().is_some_and(|c| !c.client.is_closed()) {
            return Ok(());
        }
        self.conn = None;
        let started = Instant::now();
        let deadline = started + self.reconnect_budget;
        let mut delay = FIRST_BACKOFF;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let last = match tokio::time::timeout_at(deadline.max(Instant::now() + FIRST_BACKOFF), self.reconnect()).await {
                Ok(Ok(conn)) => {
                    self.conn = Some(conn);
                    self.gave_up = false;
                    if !self.held.is_empty() {
                        // Leases may have run down while the connection was away.
                        let conn = self.conn.as_mut().expect("just set");
                        let _ = sql::renew(&mut conn.client, &self.held, &self.owner, self.ttl_ms).await;
                    }
                    return Ok(());
                }
                Ok(Err(e)) => e,
                Err(_) => "connect timed out".to_string(),
            };
            let pause = jitter(delay);
            if self.gave_up || Instant::now() + pause >= deadline {
                self.gave_up = true;
                return Err(LogError::Database {
                    context: format!("reconnect to {}", self.host),
                    detail: format!(
                        "gave up after {attempts} attempt(s) over {:.1} s; last error: {last}",
                        started.elapsed().as_secs_f64()
                    ),
                });
            }
            tokio::time::sleep(pause).await;
            delay = (delay * 2).min(MAX_BACKOFF);
        }
    }

    async fn reconnect(&self) -> Result<Conn, String> {
        let detail = |e: LogError| match e {
            LogError::Database { detail, .. } => detail,
            other => other.to_string(),
        };
        let (client, connection) = self.config.connect(NoTls).await.map_err(|e| detail(db_err("")(e)))?;
        tokio::spawn(connection);
        let prepared = Prepared::new(&client).await.map_err(detail)?;
        Ok(Conn { client, prepared })
    }

    /// Whether the connection is gone (after a database error: the error may be the server's
    /// own, such as a constraint, on a healthy connection). Costs a round trip only then.
    async fn lost(&mut self) -> bool {
        let Some(conn) = &self.conn else { return true };
        let gone = conn.client.is_closed() || conn.client.simple_query("").await.is_err();
        if gone {
            self.conn = None;
        }
        gone
    }

    /// The request's first try.
    async fn attempt(&mut self, request: &Request) -> Result<Response, LogError> {
        let Some(Conn { client: c, prepared }) = self.conn.as_mut() else { return Err(stopped()) };
        let (owner, ttl_ms) = (self.owner.as_str(), self.ttl_ms);
        Ok(match request {
            Request::Create { id, header } => {
                let lease = sql::create(c, id, header, owner, ttl_ms).await?;
                self.held.insert(id.clone(), lease.epoch);
                Response::Lease(lease)
            }
            Request::Open { id } => {
                let (lease, header) = sql::acquire(c, id, owner, ttl_ms).await?;
                let records = sql::read(c, id).await?;
                if self.fault == Some(Fault::LoseReplyAfterOpen) {
                    self.fault = None;
                    return Err(terminate_self(c).await);
                }
                // Only now: if the read fails, a retry must be able to adopt this lease, and if
                // no retry succeeds the lease lapses unrenewed.
                self.held.insert(id.clone(), lease.epoch);
                Response::Opened(lease, header, records)
            }
            Request::Append { lease, rows } => {
                if self.fault == Some(Fault::LoseConnectionBeforeAppend) {
                    self.fault = None;
                    return Err(terminate_self(c).await);
                }
                let result = sql::append(c, prepared, lease, rows, ttl_ms).await;
                if let Err(LogError::LeaseLost { .. }) = result {
                    self.held.remove(&lease.session_id);
                }
                result?;
                if self.fault == Some(Fault::LoseReplyAfterAppend) {
                    self.fault = None;
                    return Err(terminate_self(c).await);
                }
                Response::Done
            }
            Request::Read { id } => Response::Records(sql::read(c, id).await?),
            Request::Release { lease } => {
                if self.held.get(&lease.session_id) == Some(&lease.epoch) {
                    self.held.remove(&lease.session_id);
                }
                sql::release(c, lease).await?;
                Response::Done
            }
            Request::Exists { id } => Response::Bool(sql::exists(c, id).await?),
            Request::List => Response::Ids(sql::list(c).await?),
            Request::Delete { id } => {
                sql::delete(c, id).await?;
                Response::Done
            }
            Request::InjectFault(_) => Response::Done,
        })
    }

    /// A retry after the connection dropped during an earlier try, whose effect may or may
    /// not have been committed.
    async fn after_loss(&mut self, request: &Request, resent: &mut bool) -> Result<Response, LogError> {
        match request {
            Request::Append { lease, rows } => self.settle_append(lease, rows, resent).await,
            // An earlier try may have taken the lease (open) or inserted the row (create): the
            // retry then finds it held by this very owner under an epoch no log of ours has.
            Request::Open { id } => match self.attempt(request).await {
                Err(LogError::Locked { .. }) => match self.adopt(id, None).await? {
                    Some((lease, header)) => {
                        let Some(conn) = self.conn.as_mut() else { return Err(stopped()) };
                        let records = sql::read(&mut conn.client, id).await?;
                        Ok(Response::Opened(lease, header, records))
                    }
                    None => Err(LogError::Locked { id: id.clone() }),
                },
                other => other,
            },
            Request::Create { id, header } => match self.attempt(request).await {
                Err(LogError::Exists { .. }) => match self.adopt(id, Some(header)).await? {
                    Some((lease, _)) => Ok(Response::Lease(lease)),
                    None => Err(LogError::Exists { id: id.clone() }),
                },
                other => other,
            },
            // The earlier try deleted it.
            Request::Delete { .. } => match self.attempt(request).await {
                Err(LogError::NotFound { .. }) => Ok(Response::Done),
                other => other,
            },
            // Reads, and writes that are idempotent (release).
            _ => self.attempt(request).await,
        }
    }

    /// Takes over a lease an interrupted open/create of ours acquired: held by this owner,
    /// under an epoch none of our logs holds (and, for create, at epoch 1 with our header).
    async fn adopt(&mut self, id: &str, header: Option<&String>) -> Result<Option<(Lease, String)>, LogError> {
        if self.held.contains_key(id) {
            return Ok(None);
        }
        let Some(conn) = self.conn.as_mut() else { return Err(stopped()) };
        let Some((owner, epoch, stored)) = sql::lease_of(&mut conn.client, id).await? else { return Ok(None) };
        let ours = owner.as_deref() == Some(self.owner.as_str())
            && header.is_none_or(|h| epoch == 1 && *h == stored);
        if !ours {
            return Ok(None);
        }
        self.held.insert(id.to_string(), epoch);
        Ok(Some((Lease { session_id: id.to_string(), owner: self.owner.clone(), epoch }, stored)))
    }

    /// An append whose reply never came: it committed or it did not. The session's `last_seq`
    /// says which; never append blindly, or the batch could land twice.
    async fn settle_append(&mut self, lease: &Lease, rows: &[Row], resent: &mut bool) -> Result<Response, LogError> {
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return Ok(Response::Done) };
        let id = lease.session_id.as_str();
        let Some(Conn { client: c, .. }) = self.conn.as_mut() else { return Err(stopped()) };
        let (epoch, last_seq) = sql::session_state(c, id).await?.ok_or_else(|| LogError::NotFound { id: id.into() })?;
        let unknown = |what: String| LogError::Write {
            detail: format!("session \"{id}\": the outcome of appending seqs {}..={} is unknown: {what}", first.seq, last.seq),
        };
        if last_seq >= last.seq {
            // It landed, unless somebody else's rows did: compare what is stored with what was sent.
            let stored = sql::read_seqs(c, id, first.seq, last.seq).await?;
            let same = stored.len() == rows.len()
                && stored.iter().zip(rows).all(|((seq, record), row)| *seq == row.seq && *record == row.record);
            return match same {
                true => Ok(Response::Done),
                false => Err(unknown("the stored records for those seqs differ from the ones sent".into())),
            };
        }
        if last_seq != first.seq - 1 {
            return Err(unknown(format!("the stored last seq is {last_seq}")));
        }
        if epoch != lease.epoch {
            self.held.remove(id);
            return Err(LogError::LeaseLost { id: id.into(), epoch: lease.epoch, current: epoch });
        }
        if *resent {
            return Err(unknown("it did not land after being sent twice".into()));
        }
        // It did not land: send it once more, under the same epoch and seq conditions.
        *resent = true;
        let Some(Conn { client: c, prepared }) = self.conn.as_mut() else { return Err(stopped()) };
        let result = sql::append(c, prepared, lease, rows, self.ttl_ms).await;
        if let Err(LogError::LeaseLost { .. }) = result {
            self.held.remove(id);
        }
        result.map(|()| Response::Done)
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

/// A pause between `delay / 2` and `delay`, so stores cut off together do not reconnect in step.
fn jitter(delay: Duration) -> Duration {
    let r = getrandom::u64().unwrap_or(0) % 1000;
    delay / 2 + delay * (r as u32) / 2000
}
