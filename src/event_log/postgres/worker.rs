//! The runtime thread: one connection, one request at a time.

use std::collections::HashMap;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_postgres::{Client, NoTls};

use super::listen::{self, Subscriber};
use super::{db_err, schema, sql, Lease, Row};
use crate::event_log::{LogError, StagedInput};

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
    /// Subscribes to a NOTIFY channel on the store's LISTEN connection (opened on first use).
    Listen { id: u64, channel: String, subscriber: Subscriber },
    Unlisten { id: u64 },
    /// Records with seq > `after` (a follower's catch-up read).
    ReadAfter { id: String, after: i64 },
    /// An append that also deletes the staged messages its splices insert.
    AppendStaged { lease: Lease, rows: Vec<Row>, claims: Vec<String> },
    /// Stages a message for the session's owner: `Bool(false)` if the id is taken.
    Enqueue { id: String, staged: StagedInput },
    /// The messages staged for a session.
    Staged { id: String },
    /// Deletes staged rows the owner dropped.
    Unstage { lease: Lease, ids: Vec<String> },
    /// The header and records of a session, without its lease.
    Peek { id: String },
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
    /// Header text, record texts.
    Session(String, Vec<String>),
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
pub fn start(dsn: String, owner: String, ttl_ms: f64) -> Result<Handle, LogError> {
    let (tx, rx) = unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let thread_owner = owner.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(Reply, Result<Response, LogError>)>();
    std::thread::Builder::new()
        .name("kerman-postgres-replies".into())
        .spawn(move || {
            for (reply, result) in done_rx {
                // A panicking reply must not take the other replies down with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || reply(result)));
            }
        })
        .map_err(|e| LogError::io("spawn the postgres reply thread", e))?;
    std::thread::Builder::new()
        .name("kerman-postgres".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(LogError::io("start the postgres runtime", e)))),
            };
            rt.block_on(run(dsn, thread_owner, ttl_ms, rx, ready_tx, done_tx));
        })
        .map_err(|e| LogError::io("spawn the postgres thread", e))?;
    let applied = ready_rx.recv().unwrap_or_else(|_| Err(stopped()))?;
    Ok(Handle { tx, owner, applied })
}

async fn run(
    dsn: String,
    owner: String,
    ttl_ms: f64,
    mut rx: UnboundedReceiver<Job>,
    ready: SyncSender<Result<Vec<i32>, LogError>>,
    done: std::sync::mpsc::Sender<(Reply, Result<Response, LogError>)>,
) {
    let mut listener = listen::Lazy::new(dsn.clone());
    let (mut client, connection) = match tokio_postgres::connect(&dsn, NoTls).await {
        Ok(pair) => pair,
        Err(e) => return drop(ready.send(Err(db_err("connect")(e)))),
    };
    // The connection task does the socket I/O; if it dies, requests fail with its error.
    tokio::spawn(connection);
    match schema::migrate(&mut client).await {
        Ok(applied) => drop(ready.send(Ok(applied))),
        Err(e) => return drop(ready.send(Err(e))),
    }
    // Leases this store holds, renewed every third of the TTL so an owner that appends
    // nothing for a while (a long model call) keeps its sessions. A TTL of 0 is never renewed.
    let mut held: HashMap<String, i64> = HashMap::new();
    let period = (ttl_ms > 0.0).then(|| Duration::from_secs_f64(ttl_ms / 3000.0).max(Duration::from_millis(10)));
    let mut next_renewal = period.map(|p| Instant::now() + p);
    loop {
        // Checked before every request too, so a busy store still renews its idle sessions.
        if let (Some(p), Some(at)) = (period, next_renewal) {
            if Instant::now() >= at {
                // A failed renewal is not reported: the next append of that session will be.
                let _ = sql::renew(&mut client, &held, &owner, ttl_ms).await;
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
        let result = handle(&mut client, request, &owner, ttl_ms, &mut held, &mut listener).await;
        // The reply thread outlives this loop (it ends when `done` is dropped), so this send
        // fails only if it panicked outside a reply, and then there is nobody to tell.
        let _ = done.send((reply, result));
    }
}

async fn handle(
    c: &mut Client,
    request: Request,
    owner: &str,
    ttl_ms: f64,
    held: &mut HashMap<String, i64>,
    listener: &mut listen::Lazy,
) -> Result<Response, LogError> {
    Ok(match request {
        Request::Create { id, header } => {
            let lease = sql::create(c, &id, &header, owner, ttl_ms).await?;
            held.insert(id, lease.epoch);
            Response::Lease(lease)
        }
        Request::Open { id } => {
            let (lease, header) = sql::acquire(c, &id, owner, ttl_ms).await?;
            held.insert(id.clone(), lease.epoch);
            Response::Opened(lease, header, sql::read(c, &id).await?)
        }
        Request::Append { lease, rows } => {
            let result = sql::append(c, &lease, &rows, ttl_ms).await;
            if let Err(LogError::LeaseLost { .. }) = result {
                held.remove(&lease.session_id);
            }
            result?;
            Response::Done
        }
        Request::Read { id } => Response::Records(sql::read(c, &id).await?),
        Request::Release { lease } => {
            if held.get(&lease.session_id) == Some(&lease.epoch) {
                held.remove(&lease.session_id);
            }
            sql::release(c, &lease).await?;
            Response::Done
        }
        Request::Exists { id } => Response::Bool(sql::exists(c, &id).await?),
        Request::List => Response::Ids(sql::list(c).await?),
        Request::Delete { id } => {
            sql::delete(c, &id).await?;
            Response::Done
        }
        Request::Listen { id, channel, subscriber } => {
            listener.get().subscribe(id, channel, subscriber);
            Response::Done
        }
        Request::Unlisten { id } => {
            if let Some(l) = listener.started() {
                l.unsubscribe(id);
            }
            Response::Done
        }
        Request::ReadAfter { id, after } => Response::Records(sql::read_after(c, &id, after).await?),
        Request::AppendStaged { lease, rows, claims } => {
            let result = sql::append_claiming(c, &lease, &rows, ttl_ms, &claims).await;
            if let Err(LogError::LeaseLost { .. }) = result {
                held.remove(&lease.session_id);
            }
            result?;
            Response::Done
        }
        Request::Enqueue { id, staged } => match sql::enqueue(c, &staged, &id).await? {
            Ok(()) => Response::Bool(true),
            Err(sql::Refused::Duplicate) => Response::Bool(false),
            Err(sql::Refused::NoSession) => return Err(LogError::NotFound { id }),
        },
        Request::Staged { id } => Response::Staged(sql::staged(c, &id).await?),
        Request::Unstage { lease, ids } => {
            sql::unstage(c, &lease, &ids).await?;
            Response::Done
        }
        Request::Peek { id } => {
            let header = sql::header(c, &id).await?.ok_or(LogError::NotFound { id: id.clone() })?;
            Response::Session(header, sql::read(c, &id).await?)
        }
    })
}
