//! The PostgreSQL store's core (feature `postgres`): sessions and events in two tables, every
//! append conditional on the lease epoch (the fencing token) and on seq continuity.
//!
//! All database work happens on one private thread running a current-thread tokio runtime,
//! which drives the store's pool of connections; callers hand it requests over channels and get
//! each result through a callback run on a second, reply thread ([`PgCore::submit`], which never
//! blocks: the path of `PgBackend`) or by waiting ([`PgCore::call`] and the typed helpers, for
//! open/create/tests). The runtime thread never runs caller code, so never touches a Python
//! object or waits for the GIL. A session's requests run one at a time in submission order (on
//! one connection at a time, `worker/pool.rs`), so its appends reach the server in seq order;
//! requests of different sessions run side by side, up to the pool size.
//!
//! [`PostgresStore`] implements the `Store` contract on top, with [`PgBackend`] (group commit)
//! behind each `SessionLog`; the Python binding is `src/python/pg_store.rs`. Other processes:
//! read-only followers ([`Follower`], fed through the LISTEN connection of `listen.rs`) and
//! `enqueue` (staged rows the owner's [`PgBackend`] claims); see docs/distributed.md. Every
//! connection is made by [`Target::connect`] (`tls.rs`: the DSN's sslmode and certificates).

mod backend;
mod follow;
mod listen;
mod ops;
mod schema;
mod sql;
mod store;
mod tls;
mod worker;

use std::sync::Arc;

use serde_json::{Map, Value};

pub use backend::PgBackend;
pub use follow::Follower;
pub use listen::{channel_name, next_id as next_listen_id, Channel, Note, Subscriber};
pub use schema::{latest as latest_schema_version, MIGRATIONS};
pub use sql::{Row, SessionInfo, TAKEABLE};
pub use store::PostgresStore;
pub use tls::{split_dsn, SslMode, SslParams, Target};
pub use worker::{unexpected, Fault, Reply, Request, Response};

use crate::event_log::{check_id, new_header, resolve_id, storable, Event, LogError, StagedInput};

/// The right to append to one session: valid while `epoch` is the session's current epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub session_id: String,
    /// Who holds it: one id per [`PgCore`], so two cores in one process are two owners.
    pub owner: String,
    pub epoch: i64,
}

/// A session just opened: its lease, header and committed events.
pub struct Opened {
    pub lease: Lease,
    pub header: Map<String, Value>,
    pub events: Vec<Event>,
}

/// Connection settings beyond the DSN.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// How long a lease lasts without an append renewing it; after that another owner may take
    /// the session over (bumping the epoch, which fences the old holder out).
    pub lease_ttl_ms: u64,
    /// How long the runtime thread keeps trying (with backoff) to reconnect after the
    /// connection drops, before the request waiting for it fails.
    pub reconnect_ms: u64,
    /// How long one try of a request may wait for the server's reply (0: no limit). A server
    /// that stops answering without closing the connection (a hung or stopped backend, a
    /// partition without a reset) is otherwise only noticed by TCP, after minutes or hours;
    /// past this, the connection is dropped and the request settled as after a lost connection.
    pub request_ms: u64,
    /// How many connections the store may open for its requests (the LISTEN one aside): the
    /// first at once, the others when that many requests are in flight together.
    pub pool_size: usize,
    /// Whether the hot statements are named prepared statements (parsed and planned once per
    /// connection). False sends every statement unnamed, as PgBouncer's transaction pooling
    /// needs (before 1.21): a named statement does not follow the client to the next server
    /// connection.
    pub prepared_statements: bool,
    /// A DSN of its own for the LISTEN connection (followers and enqueue wake-ups), for a store
    /// whose DSN goes through a transaction-pooling proxy, which cannot carry LISTEN.
    pub listen_dsn: Option<String>,
}

/// The largest `PgOptions::pool_size`: connections are a server resource (`max_connections`
/// is 100 by default), and a pool this big already outruns the server's cores.
pub const MAX_POOL_SIZE: usize = 64;
/// `PgOptions::pool_size` unless given (measured in docs/postgres.md).
pub const DEFAULT_POOL_SIZE: usize = 4;

/// The bounds of one duration option, in seconds: 0 has its own meaning (`zero`); anything
/// else must lie in `min..=max`, so that it neither rounds to 0 (1e-9 s would turn a lease or
/// a limit into its 0 meaning) nor overflows the server's interval arithmetic (1e300 s).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub name: &'static str,
    pub zero: &'static str,
    pub min: f64,
    pub max: f64,
}

/// `PgOptions::lease_ttl_ms`, in seconds.
pub const LEASE_TTL: Bounds = Bounds { name: "lease_ttl", zero: "no renewal", min: 0.1, max: 86_400.0 };
/// `PgOptions::reconnect_ms`, in seconds.
pub const RECONNECT_TIMEOUT: Bounds = Bounds { name: "reconnect_timeout", zero: "one try", min: 0.001, max: 3_600.0 };
/// `PgOptions::request_ms`, in seconds.
pub const REQUEST_TIMEOUT: Bounds = Bounds { name: "request_timeout", zero: "no limit", min: 0.001, max: 86_400.0 };

impl Bounds {
    /// `seconds` as whole milliseconds, or what it must be (the caller adds the value as its
    /// user spelled it: "…, got 1e+300").
    pub fn millis(&self, seconds: f64) -> Result<u64, String> {
        let name = self.name;
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(format!("{name} must be a finite number of seconds >= 0"));
        }
        if seconds != 0.0 && !(self.min..=self.max).contains(&seconds) {
            return Err(self.must());
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "finite, >= 0 and at most `max` seconds, checked above")]
        Ok((seconds * 1000.0).round() as u64)
    }

    /// Whether `ms` (as in [`PgOptions`]) is within bounds.
    pub fn check_ms(&self, ms: u64) -> Result<(), LogError> {
        let seconds = ms as f64 / 1000.0;
        match ms == 0 || (self.min..=self.max).contains(&seconds) {
            true => Ok(()),
            false => Err(LogError::Unstorable(format!("{}, got {ms} ms", self.must()))),
        }
    }

    fn must(&self) -> String {
        format!("{} must be 0 ({}) or from {} to {} seconds", self.name, self.zero, self.min, self.max)
    }
}

impl PgOptions {
    /// Options from durations in seconds, each checked against its [`Bounds`].
    pub fn from_seconds(lease_ttl: f64, reconnect_timeout: f64, request_timeout: f64) -> Result<PgOptions, (Bounds, String)> {
        let ms = |b: Bounds, v: f64| b.millis(v).map_err(|why| (b, why));
        Ok(PgOptions {
            lease_ttl_ms: ms(LEASE_TTL, lease_ttl)?,
            reconnect_ms: ms(RECONNECT_TIMEOUT, reconnect_timeout)?,
            request_ms: ms(REQUEST_TIMEOUT, request_timeout)?,
            ..PgOptions::default()
        })
    }

    /// Refuses a duration outside its [`Bounds`].
    pub fn check(&self) -> Result<(), LogError> {
        LEASE_TTL.check_ms(self.lease_ttl_ms)?;
        RECONNECT_TIMEOUT.check_ms(self.reconnect_ms)?;
        REQUEST_TIMEOUT.check_ms(self.request_ms)?;
        check_pool_size(self.pool_size).map_err(LogError::Unstorable)
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            lease_ttl_ms: 30_000,
            reconnect_ms: 10_000,
            request_ms: 30_000,
            pool_size: DEFAULT_POOL_SIZE,
            prepared_statements: true,
            listen_dsn: None,
        }
    }
}

/// Refuses a pool size outside `1..=MAX_POOL_SIZE`, naming it.
pub fn check_pool_size(size: usize) -> Result<(), String> {
    match (1..=MAX_POOL_SIZE).contains(&size) {
        true => Ok(()),
        false => Err(format!("pool_size must be from 1 to {MAX_POOL_SIZE}, got {size}")),
    }
}

/// A connection to one database, on its own runtime thread. Dropping the last clone ends the
/// thread once the requests already submitted have run.
#[derive(Clone)]
pub struct PgCore {
    inner: Arc<worker::Handle>,
}

/// A [`PgCore`] that does not keep its threads running (for callbacks the runtime thread
/// itself holds, such as LISTEN subscribers).
#[derive(Clone)]
pub struct WeakCore(std::sync::Weak<worker::Handle>);

impl WeakCore {
    pub fn upgrade(&self) -> Option<PgCore> {
        self.0.upgrade().map(|inner| PgCore { inner })
    }
}

impl PgCore {
    pub fn downgrade(&self) -> WeakCore {
        WeakCore(Arc::downgrade(&self.inner))
    }

    /// Connects and applies any pending migrations before returning.
    pub fn connect(dsn: &str, options: PgOptions) -> Result<PgCore, LogError> {
        options.check()?;
        let owner = crate::message::new_id();
        let handle = worker::start(dsn, owner, options)?;
        Ok(PgCore { inner: Arc::new(handle) })
    }

    /// The schema versions this core's connect applied (empty when the database was current).
    pub fn applied_migrations(&self) -> &[i32] {
        &self.inner.applied
    }

    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// How many connections this core may open for requests.
    pub fn pool_size(&self) -> usize {
        self.inner.pool_size()
    }

    /// `Some(error)` in a process that inherited this core through `fork()`, where it cannot
    /// work (its threads stayed in the parent): every use fails at once instead of waiting.
    pub fn forked(&self) -> Option<LogError> {
        self.inner.forked().then(|| self.inner.fork_error())
    }

    /// Queues `request`; `reply` runs on the runtime thread with its outcome. Must not block.
    pub fn submit(&self, request: Request, reply: Reply) {
        self.inner.submit(request, reply);
    }

    /// Runs `request` and waits for its outcome.
    pub fn call(&self, request: Request) -> Result<Response, LogError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit(request, Box::new(move |r| drop(tx.send(r))));
        rx.recv().unwrap_or_else(|_| Err(worker::stopped()))
    }

    /// Creates a session (minting a UUIDv7 id for `None`) and holds its lease.
    pub fn create(&self, id: Option<&str>) -> Result<(Lease, Map<String, Value>), LogError> {
        let id = resolve_id(id)?;
        storable::check_pg_id("the id", &id).map_err(LogError::InvalidId)?;
        let header = new_header(&id);
        let text = serde_json::to_string(&header).map_err(|e| LogError::Write { detail: e.to_string() })?;
        match self.call(Request::Create { id, header: text })? {
            Response::Lease(lease) => Ok((lease, header)),
            other => Err(worker::unexpected(&other)),
        }
    }

    /// Takes the lease of an existing session (epoch + 1) and reads it back.
    pub fn open(&self, id: &str) -> Result<Opened, LogError> {
        check_id(id)?;
        let (lease, header, records) = match self.call(Request::Open { id: id.into() })? {
            Response::Opened(lease, header, records) => (lease, header, records),
            other => return Err(worker::unexpected(&other)),
        };
        let Ok(Value::Object(header)) = serde_json::from_str(&header) else {
            return Err(corrupt(id, -1, "the header is not a JSON object"));
        };
        let events = parse_records(id, &records)?;
        Ok(Opened { lease, header, events })
    }

    /// Appends `events` (consecutive seqs following the stored ones) in one transaction.
    pub fn append(&self, lease: &Lease, events: &[Event]) -> Result<(), LogError> {
        let rows = events.iter().map(to_row).collect();
        match self.call(Request::Append { lease: lease.clone(), rows })? {
            Response::Done => Ok(()),
            other => Err(worker::unexpected(&other)),
        }
    }

    /// Every committed event of a session, without taking its lease.
    pub fn read(&self, id: &str) -> Result<Vec<Event>, LogError> {
        match self.call(Request::Read { id: id.into() })? {
            Response::Records(records) => parse_records(id, &records),
            other => Err(worker::unexpected(&other)),
        }
    }

    /// Stages `message` (a user message as JSON text, with id `message_id`) for the owner of
    /// session `id`, without taking its lease. `Ok(false)`: that id is already staged or in the
    /// session's log. An unknown session is `NotFound`.
    pub fn enqueue(&self, id: &str, staged: StagedInput) -> Result<bool, LogError> {
        check_id(id)?;
        storable::check_text("message id", &staged.id)?;
        storable::check_pg_id("message id", &staged.id).map_err(LogError::Unstorable)?;
        match self.call(Request::Enqueue { id: id.into(), staged })? {
            Response::Bool(b) => Ok(b),
            other => Err(worker::unexpected(&other)),
        }
    }

    /// The header, incarnation and events of a session, without taking its lease (for
    /// followers).
    pub fn read_session(&self, id: &str) -> Result<(Map<String, Value>, i64, Vec<Event>), LogError> {
        check_id(id)?;
        let (header, incarnation, records) = match self.call(Request::Peek { id: id.into() })? {
            Response::Session(header, incarnation, records) => (header, incarnation, records),
            other => return Err(worker::unexpected(&other)),
        };
        let Ok(Value::Object(header)) = serde_json::from_str(&header) else {
            return Err(corrupt(id, -1, "the header is not a JSON object"));
        };
        Ok((header, incarnation, parse_records(id, &records)?))
    }

    pub fn release(&self, lease: &Lease) -> Result<(), LogError> {
        match self.call(Request::Release { lease: lease.clone() })? {
            Response::Done => Ok(()),
            other => Err(worker::unexpected(&other)),
        }
    }
}

/// The row of one event: seq, time and type as columns (for queries), the record as text.
pub fn to_row(event: &Event) -> Row {
    Row { seq: event.seq as i64, time: event.time, kind: event.kind().to_string(), record: event.to_json() }
}

fn parse_records(id: &str, records: &[String]) -> Result<Vec<Event>, LogError> {
    parse_records_from(id, records, 0)
}

/// Parses records that should carry seqs `first`, `first + 1`, ...
pub(crate) fn parse_records_from(id: &str, records: &[String], first: u64) -> Result<Vec<Event>, LogError> {
    let mut intern = |s: &str| Arc::<str>::from(s);
    let mut events = Vec::with_capacity(records.len());
    for (i, text) in records.iter().enumerate() {
        let i = first + i as u64;
        let event = Event::from_json(text, &mut intern).map_err(|detail| corrupt(id, i as i64, &detail))?;
        // The primary key makes gaps impossible unless rows were edited by hand.
        if event.seq != i {
            return Err(corrupt(id, i as i64, &format!("record at position {i} carries seq {}", event.seq)));
        }
        events.push(event);
    }
    Ok(events)
}

pub(crate) fn corrupt(id: &str, seq: i64, detail: &str) -> LogError {
    LogError::Database { context: format!("session \"{id}\" seq {seq}"), detail: format!("corrupt record: {detail}") }
}

/// Maps a driver error to `LogError::Database`, keeping the server's message when there is one
/// (the driver's own `Display` says only "db error").
pub(crate) fn db_err(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> LogError {
    let context = context.into();
    move |e| {
        let detail = match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => with_causes(&e),
        };
        LogError::Database { context, detail }
    }
}

/// `e` and its chain of causes: the driver's own message is only the kind ("error connecting
/// to server", "invalid connection string"); the OS error or the part of the DSN that is wrong
/// is in its source. (No cause quotes a DSN value, so no password shows.)
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// One read of a kind in flight at a time (a follower's catch-up, an owner's staged-input
/// read); asks made while it runs fold into one more read after it, so a burst of
/// notifications costs two reads, not one each.
#[derive(Default)]
pub(crate) struct OneInFlight {
    running: bool,
    again: bool,
}

impl OneInFlight {
    /// True: start the read now. False: one is running, and another will follow it.
    pub(crate) fn start(&mut self) -> bool {
        if self.running {
            self.again = true;
            return false;
        }
        self.running = true;
        true
    }

    /// The read ended: true if another was asked for meanwhile (the caller starts it).
    pub(crate) fn finish(&mut self) -> bool {
        self.running = false;
        std::mem::take(&mut self.again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_and_never_round_to_zero() {
        assert_eq!(LEASE_TTL.millis(0.0), Ok(0));
        assert_eq!(LEASE_TTL.millis(0.1), Ok(100));
        assert_eq!(REQUEST_TIMEOUT.millis(0.001), Ok(1));
        for bad in [1e-9, 0.05, 1e300, 86_400.5] {
            assert_eq!(LEASE_TTL.millis(bad), Err("lease_ttl must be 0 (no renewal) or from 0.1 to 86400 seconds".into()));
        }
        assert!(REQUEST_TIMEOUT.millis(f64::NAN).unwrap_err().contains("finite number of seconds >= 0"));
        assert!(PgOptions { request_ms: u64::MAX, ..PgOptions::default() }.check().is_err());
        assert!(PgOptions::default().check().is_ok());
        for bad in [0, MAX_POOL_SIZE + 1] {
            let e = PgOptions { pool_size: bad, ..PgOptions::default() }.check().unwrap_err().to_string();
            assert!(e.contains(&format!("pool_size must be from 1 to 64, got {bad}")), "{e}");
        }
    }
}
