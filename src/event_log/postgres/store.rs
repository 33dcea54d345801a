//! `PostgresStore`: the `Store` contract over [`PgCore`] and [`PgBackend`].

use serde_json::Value;

use super::backend::PgBackend;
use super::follow::Follower;
use super::sql::{SessionInfo, Taken};
use super::{corrupt, parse_records_from, PgCore, PgOptions, Request, Response};
use crate::event_log::{
    check_id, fork_beyond, fork_header, resolve_id, run_open_hook, storable, LogError, OpenHook, SessionLog, StagedInput, StagedOp, Store,
};

/// A session a worker took: its log, the lease epoch, and how many crash closers its open
/// appended (with the loop's closers installed: a turn its dead owner left open was closed as
/// interrupted).
pub type TakenLog = (SessionLog, i64, usize);

/// Sessions in one PostgreSQL database. Each store is one lease owner with one connection.
#[derive(Clone)]
pub struct PostgresStore {
    core: PgCore,
    on_open: Option<OpenHook>,
}

impl PostgresStore {
    pub fn connect(dsn: &str, options: PgOptions) -> Result<Self, LogError> {
        Ok(PostgresStore { core: PgCore::connect(dsn, options)?, on_open: None })
    }

    /// Runs `hook` on every log `open` and `take` hand out from now on (see [`OpenHook`]).
    #[must_use]
    pub fn with_open_hook(mut self, hook: OpenHook) -> Self {
        self.on_open = Some(hook);
        self
    }

    pub fn core(&self) -> &PgCore {
        &self.core
    }

    /// A read-only follower of session `id`: every committed event now, then each commit of
    /// its writer (in any process) as NOTIFY-driven catch-up reads bring it. Takes no lease;
    /// appends fail with `LogError::ReadOnly`; `close` stops following.
    pub fn follow(&self, id: &str) -> Result<SessionLog, LogError> {
        let (header, incarnation, events) = self.core.read_session(id)?;
        Ok(Follower::open(&self.core, id, incarnation, header, events))
    }

    /// Stages a user message for session `id`'s owner (see [`PgCore::enqueue`]).
    pub fn enqueue(&self, id: &str, staged: StagedInput) -> Result<bool, LogError> {
        self.core.enqueue(id, staged)
    }

    /// Stages an operation on session `id`'s queue or loop for its owner and waits for the
    /// answer (see [`PgCore::apply_op`]).
    pub fn apply_op(&self, id: &str, op: StagedOp, args: &serde_json::Value, timeout: std::time::Duration) -> Result<String, LogError> {
        self.core.apply_op(id, op, args, timeout)
    }

    /// Takes up to `limit` sessions that have input waiting and no live owner (or whose owner
    /// died), for a worker named `name`; `done` runs on the reply thread with their logs, each
    /// opened as `open` would (the open hook run). Never blocks. A session whose records
    /// cannot be read is parked (its detail says why) instead of being handed over.
    /// With `expiry`, the logs come with the number of seconds until another owner's lease next
    /// expires (when to look again, as a dead owner's lease lapses without a notification).
    /// With `ids`, only those sessions are looked at (the ones a notification named).
    pub fn take(
        &self,
        limit: i64,
        name: &str,
        expiry: bool,
        ids: Option<Vec<String>>,
        done: impl FnOnce(Result<(Vec<TakenLog>, Option<f64>), LogError>) + Send + 'static,
    ) {
        let core = self.core.clone();
        let on_open = self.on_open.clone();
        let request = Request::Take { limit, name: name.into(), expiry, ids };
        self.core.submit(
            request,
            Box::new(move |result| {
                done(match result {
                    Ok(Response::Taken(taken, expiry)) => {
                        Ok((taken.into_iter().filter_map(|t| open_taken(&core, on_open.as_ref(), t)).collect(), expiry))
                    }
                    Ok(other) => unexpected(&other),
                    Err(e) => Err(e),
                });
            }),
        );
    }

    /// Every session (or only `id`: empty if it does not exist) as an operator sees it, with
    /// the last record of one of the types `last_of`.
    pub fn sessions(&self, id: Option<&str>, last_of: &[&str]) -> Result<Vec<SessionInfo>, LogError> {
        if let Some(id) = id {
            check_id(id)?;
        }
        let last_of = last_of.iter().map(ToString::to_string).collect();
        match self.core.call(Request::Sessions { id: id.map(String::from), last_of })? {
            Response::Sessions(rows) => Ok(rows),
            other => unexpected(&other),
        }
    }

    /// Makes a parked session active again; false if it was not parked.
    pub fn unpark(&self, id: &str) -> Result<bool, LogError> {
        check_id(id)?;
        match self.core.call(Request::Unpark { id: id.into() })? {
            Response::Bool(b) => Ok(b),
            other => unexpected(&other),
        }
    }
}

/// The log of a taken session, or `None` (parked) if it cannot be read.
fn open_taken(core: &PgCore, on_open: Option<&OpenHook>, (lease, header, records): Taken) -> Option<TakenLog> {
    let id = lease.session_id.clone();
    let epoch = lease.epoch;
    let opened = match serde_json::from_str(&header) {
        Ok(Value::Object(map)) => parse_records_from(&id, &records, 0).map(|events| (map, events)),
        _ => Err(corrupt(&id, -1, "the header is not a JSON object")),
    };
    let (header, events) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            let request = Request::Park { lease, detail: format!("unreadable: {e}"), runnable: false };
            core.submit(request, Box::new(|_| ()));
            return None;
        }
    };
    let backend = PgBackend::new(core.clone(), lease, events.len() as u64);
    let log = SessionLog::from_parts(id, header, events, Box::new(backend));
    // A failed closer append poisons the log; the worker learns it at its first flush.
    let closers = run_open_hook(on_open, &log).unwrap_or(0);
    Some((log, epoch, closers))
}

fn unexpected<T>(response: &Response) -> Result<T, LogError> {
    Err(super::worker::unexpected(response))
}

impl Store for PostgresStore {
    fn create(&self, id: Option<&str>) -> Result<SessionLog, LogError> {
        let (lease, header) = self.core.create(id)?;
        let id = lease.session_id.clone();
        let backend = PgBackend::new(self.core.clone(), lease, 0);
        Ok(SessionLog::from_parts(id, header, Vec::new(), Box::new(backend)))
    }

    fn open(&self, id: &str) -> Result<SessionLog, LogError> {
        let opened = self.core.open(id)?;
        let backend = PgBackend::new(self.core.clone(), opened.lease, opened.events.len() as u64);
        let log = SessionLog::from_parts(id.to_string(), opened.header, opened.events, Box::new(backend));
        run_open_hook(self.on_open.as_ref(), &log)?;
        Ok(log)
    }

    fn list(&self) -> Result<Vec<String>, LogError> {
        match self.core.call(Request::List)? {
            Response::Ids(ids) => Ok(ids),
            other => unexpected(&other),
        }
    }

    fn exists(&self, id: &str) -> Result<bool, LogError> {
        check_id(id)?;
        match self.core.call(Request::Exists { id: id.into() })? {
            Response::Bool(b) => Ok(b),
            other => unexpected(&other),
        }
    }

    fn delete(&self, id: &str) -> Result<(), LogError> {
        check_id(id)?;
        match self.core.call(Request::Delete { id: id.into() })? {
            Response::Done => Ok(()),
            other => unexpected(&other),
        }
    }

    /// The child is its session row alone, naming the parent and the cut: it reads the
    /// parent's rows up to the cut (`kerman_session_events`); it starts unowned, like a
    /// released session.
    fn fork(&self, id: &str, at_seq: u64, new_id: Option<&str>) -> Result<String, LogError> {
        check_id(id)?;
        let child = resolve_id(new_id)?;
        storable::check_pg_id("the id", &child).map_err(LogError::InvalidId)?;
        let at = i64::try_from(at_seq).map_err(|_| fork_beyond(id, at_seq, 0))?;
        let header = fork_header(&child, id, at_seq);
        let header = serde_json::to_string(&header).map_err(|e| LogError::Write { detail: e.to_string() })?;
        match self.core.call(Request::Fork { parent: id.into(), at, id: child.clone(), header })? {
            Response::Done => Ok(child),
            other => unexpected(&other),
        }
    }
}
