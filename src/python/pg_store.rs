//! `PostgresStore`: sessions in a PostgreSQL database (feature `postgres`).
//!
//! Every call that talks to the server waits with the GIL released (`py.detach`): the wait is
//! a network round trip on the store's own thread, and other Python threads should run
//! meanwhile. Appends never wait here: they queue, and `log.flush()` completes on the loop.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::errors::{inbox_err, log_err, new_err};
use super::event_log::{id_arg, wrap_log, wrap_owned_log, PySessionLog};
use super::message::{user_message_arg, wrap, PyMessage};
use super::reopen::{locked_here, OpenLogs};
use super::runtime::aio::{Completion, Value};
use crate::agent_loop::{crash_closers, fork_session, ForkInbox};
use crate::event_log::postgres::{
    check_pool_size, Lease, PgOptions, PostgresStore, Request, Response, SessionInfo, WeakCore, DEFAULT_POOL_SIZE, MAX_POOL_SIZE,
};
use crate::event_log::{LogError, StagedInput, StagedOp, Store};
use crate::inbox::Target;

/// The takeable-session notifications of a store (`_takeable`), handed to one waiting future.
#[derive(Default)]
struct Takeable {
    subscribed: bool,
    /// A notification (or a re-LISTEN) arrived while nobody waited.
    pending: bool,
    /// The session ids notified since the last hand-over, in arrival order, once each.
    ids: Vec<String>,
    named: std::collections::HashSet<String>,
    /// A re-LISTEN (notifications may have been missed), or more ids than are worth naming:
    /// the worker should scan rather than take by id.
    scan: bool,
    waiter: Option<Completion>,
}

/// Past this many ids waiting, a scan is cheaper than naming them.
const MAX_NAMED: usize = 4096;

impl Takeable {
    fn note(&mut self, note: crate::event_log::postgres::Note) {
        match note {
            crate::event_log::postgres::Note::Notified(id) if !self.scan && self.ids.len() < MAX_NAMED => {
                if self.named.insert(id.clone()) {
                    self.ids.push(id);
                }
            }
            _ => {
                self.scan = true;
                self.ids.clear();
                self.named.clear();
            }
        }
    }

    /// What a waiting future resolves with: the ids named, or `None` (scan).
    fn hand_over(&mut self) -> Value {
        self.named.clear();
        let ids = std::mem::take(&mut self.ids);
        let scan = std::mem::take(&mut self.scan);
        Box::new(move |py: Python<'_>| match scan {
            true => Ok(py.None()),
            false => Ok(PyList::new(py, ids)?.into_any().unbind()),
        })
    }
}

fn lock(t: &Mutex<Takeable>) -> MutexGuard<'_, Takeable> {
    t.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sessions in one PostgreSQL database; each store is one lease owner with a bounded pool of
/// connections.
#[pyclass(name = "PostgresStore", module = "kerman", frozen)]
pub struct PyPostgresStore {
    inner: PostgresStore,
    lease_ttl: f64,
    reconnect_timeout: f64,
    request_timeout: f64,
    pool_size: usize,
    prepared_statements: bool,
    takeable: Arc<Mutex<Takeable>>,
    /// `open(id, reuse=True)` looks its sessions up in [`PG_LOGS`] under this DSN.
    dsn: String,
}

/// The sessions this process holds open through any `PostgresStore`, by DSN (as written) and
/// id: a notebook cell that makes a new store and opens its session again gets the live log
/// back with `reuse=True`, as from a new `FileStore` over the same folder.
static PG_LOGS: OpenLogs = OpenLogs::new();

fn key(dsn: &str, id: &str) -> String {
    format!("{dsn}\n{id}")
}

// The signature spells the default out (so `__text_signature__` shows it, for the stubs).
const _: () = assert!(DEFAULT_POOL_SIZE == 4, "update PostgresStore's pool_size default and _core.pyi");

/// `pool_size` as given: an int (not a bool) in `1..=MAX_POOL_SIZE`, else an error naming it.
fn pool_size_arg(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    use pyo3::types::{PyBool, PyInt};
    let shown = || value.repr().map(|r| r.to_string()).unwrap_or_default();
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        let what = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(pyo3::exceptions::PyTypeError::new_err(format!("pool_size must be an int, got {} ({what})", shown())));
    }
    let size = value.extract::<usize>().unwrap_or(0);
    check_pool_size(size)
        .map_err(|_| pyo3::exceptions::PyValueError::new_err(format!("pool_size must be from 1 to {MAX_POOL_SIZE}, got {}", shown())))?;
    Ok(size)
}

/// Submits `request` and returns a future on the running loop resolved with what `value`
/// makes of its response (on the loop thread).
fn submit_future<'py>(
    py: Python<'py>,
    store: &PostgresStore,
    request: Request,
    value: impl FnOnce(Response) -> Result<Option<Value>, LogError> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    let (completion, future) = Completion::new(py)?;
    store.core().submit(request, Box::new(move |result| completion.deliver_value(result.and_then(value))));
    Ok(future)
}

fn info_dict(py: Python<'_>, row: SessionInfo) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", row.id)?;
    d.set_item("owner", row.owner)?;
    d.set_item("owner_name", row.owner_name)?;
    d.set_item("epoch", row.epoch)?;
    d.set_item("owned_since", row.owned_since)?;
    d.set_item("expires_at", row.expires_at)?;
    d.set_item("status", row.status)?;
    d.set_item("status_detail", row.status_detail)?;
    d.set_item("events", row.last_seq + 1)?;
    d.set_item("staged", row.staged)?;
    d.set_item("runnable", row.runnable)?;
    d.set_item("now", row.now)?;
    d.set_item("last_ending", last_ending(row.last_of.as_ref()))?;
    Ok(d)
}

/// How a session's last turn ended (its `turn/end`'s reason kind: `"completed"`,
/// `"interrupted"`, `"error"`, ...), `"open"` when its last turn has not ended (running, or
/// left open by a dead owner), `None` before its first turn.
fn last_ending(last: Option<&(String, String)>) -> Option<String> {
    let (kind, record) = last?;
    if kind == crate::agent_loop::events::TURN_START {
        return Some("open".to_string());
    }
    let record: serde_json::Value = serde_json::from_str(record).ok()?;
    record.pointer("/data/reason/kind").and_then(serde_json::Value::as_str).map(str::to_string)
}

#[pymethods]
impl PyPostgresStore {
    /// Connects to `dsn` (a libpq-style URL or key=value string) and applies pending schema
    /// migrations. `lease_ttl` (seconds): how long a session stays owned without a renewal.
    /// `reconnect_timeout` (seconds): how long a request whose connection dropped keeps
    /// reconnecting (jittered backoff) before it fails with `LogError`. `request_timeout`
    /// (seconds, 0 for none): how long one try of a request waits for the server's reply
    /// before the connection is given up and the request settled as after a lost connection
    /// (a hung backend or a silent partition would otherwise wait for TCP). The connection
    /// shows in `pg_stat_activity` as `application_name` `kerman <owner id>` unless the DSN
    /// names one. `pool_size`: how many connections the store may open for its requests (1 to
    /// 64; the first at once, another only when that many requests are in flight together); a
    /// session's requests still run in submission order. `prepared_statements=False` sends every
    /// statement unnamed, for PgBouncer's transaction pooling; `listen_dsn` is a direct DSN for
    /// the LISTEN connection (followers, enqueue wake-ups), which such a pooler cannot carry.
    /// Bounds (`ValueError` outside them): `lease_ttl` 0 (never renewed) or 0.1 to
    /// 86400; `reconnect_timeout` 0 (one try) or 0.001 to 3600; `request_timeout` 0 (no limit)
    /// or 0.001 to 86400. A server that cannot be reached raises `LogError` naming host:port and
    /// the cause; a store inherited through `fork()` raises `LogError` on every call in the child.
    #[new]
    #[pyo3(signature = (
        dsn, *, lease_ttl=30.0, reconnect_timeout=10.0, request_timeout=30.0, pool_size=4,
        prepared_statements=true, listen_dsn=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dsn: &str,
        lease_ttl: f64,
        reconnect_timeout: f64,
        request_timeout: f64,
        #[pyo3(from_py_with = pool_size_arg)] pool_size: usize,
        prepared_statements: bool,
        listen_dsn: Option<String>,
    ) -> PyResult<Self> {
        let options = PgOptions::from_seconds(lease_ttl, reconnect_timeout, request_timeout).map_err(|(bounds, why)| {
            let value = match bounds.name {
                "lease_ttl" => lease_ttl,
                "reconnect_timeout" => reconnect_timeout,
                _ => request_timeout,
            };
            // The value as Python spells it (`nan`, `inf`, `1e+300`).
            let shown = pyo3::types::PyFloat::new(py, value).repr().map(|r| r.to_string()).unwrap_or_default();
            pyo3::exceptions::PyValueError::new_err(format!("{why}, got {shown}"))
        })?;
        let options = PgOptions { pool_size, prepared_statements, listen_dsn, ..options };
        let inner = py.detach(|| PostgresStore::connect(dsn, options)).map_err(|e| log_err(py, e))?.with_open_hook(crash_closers());
        Ok(PyPostgresStore {
            inner,
            lease_ttl,
            reconnect_timeout,
            request_timeout,
            pool_size,
            prepared_statements,
            takeable: Arc::default(),
            dsn: dsn.to_owned(),
        })
    }

    /// How many connections the store may open for its requests (the LISTEN one aside).
    #[getter]
    fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// False: every statement is sent unnamed (PgBouncer transaction pooling).
    #[getter]
    fn prepared_statements(&self) -> bool {
        self.prepared_statements
    }

    #[getter]
    fn lease_ttl(&self) -> f64 {
        self.lease_ttl
    }

    #[getter]
    fn reconnect_timeout(&self) -> f64 {
        self.reconnect_timeout
    }

    #[getter]
    fn request_timeout(&self) -> f64 {
        self.request_timeout
    }

    /// A new, empty session, owned by this store (id minted as a UUIDv7 when `None`).
    #[pyo3(signature = (id=None))]
    fn create<'py>(&self, py: Python<'py>, id: Option<&Bound<'_, PyAny>>) -> PyResult<Bound<'py, PySessionLog>> {
        let id = match id.filter(|i| !i.is_none()) {
            None => None,
            Some(id) => Some(id_arg(id)?),
        };
        let log = py.detach(|| self.inner.create(id.as_deref())).map_err(|e| log_err(py, e))?;
        let key = key(&self.dsn, log.id());
        let log = Bound::new(py, wrap_owned_log(log).in_store("PostgresStore"))?;
        PG_LOGS.remember(py, key, &log)?;
        Ok(log)
    }

    /// Takes the session's lease (a newer epoch fences any previous owner out) and reads it;
    /// a log ending inside an open turn gets crash closers. A session this process holds open
    /// (through a store with the same DSN) raises `SessionLockedError`, or with `reuse=True`
    /// gives back that same `SessionLog`; one held by another process is refused either way.
    #[pyo3(signature = (id, *, reuse=false))]
    fn open<'py>(&self, py: Python<'py>, id: &Bound<'_, PyAny>, reuse: bool) -> PyResult<Bound<'py, PySessionLog>> {
        let id = id_arg(id)?;
        let held = PG_LOGS.live(py, &key(&self.dsn, &id));
        if let Some(log) = held.as_ref().filter(|_| reuse) {
            return Ok(log.clone());
        }
        let log = py.detach(|| self.inner.open(&id)).map_err(|e| match (&e, held.is_some()) {
            // The lock is this store's own: say how to share the log it holds.
            (LogError::Locked { .. }, true) => locked_here(py, LogError::LockedHere { id: id.clone() }),
            _ => log_err(py, e),
        })?;
        let log = Bound::new(py, wrap_owned_log(log).in_store("PostgresStore"))?;
        PG_LOGS.remember(py, key(&self.dsn, &id), &log)?;
        Ok(log)
    }

    /// A read-only follower of session `id` (another process, or this store, owns it): its
    /// events so far, then each commit as it happens, so `tail()` and `subscribe()` follow the
    /// session live. Takes no lease. Appends raise `LogError`; `close()` stops following.
    fn follow(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<PySessionLog> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.follow(&id)).map(|l| wrap_log(l).in_store("PostgresStore (following)")).map_err(|e| log_err(py, e))
    }

    /// Queues `message` for session `id` without taking its lease (for web handlers): the
    /// session's owner inserts it into its inbox's `target` list, and with `wakeup` its idle
    /// AgentLoop starts a turn. Returns the stored message; its id is the receipt to look for
    /// (the owner's `agent/inbox/spliced` inserting it). With no owner running, a
    /// `kerman.Worker` is notified and takes the session (or the next `open` picks it up). An id
    /// already enqueued or in the log raises `DuplicateMessageError` (also for a retry racing
    /// the owner's claim of the first try); an unknown session `SessionNotFoundError`; a
    /// message id with NUL or over 1024 UTF-8 bytes `ValueError`.
    #[pyo3(signature = (id, message, target="next-turn", wakeup=true))]
    fn enqueue<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        message: &Bound<'py, PyAny>,
        target: &str,
        wakeup: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let target = Target::parse(target).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!("target must be \"next-turn\" or \"next-step\", got {target:?}"))
        })?;
        let stored = user_message_arg(message)?;
        let staged = StagedInput {
            id: stored.id().to_string(),
            message: stored.json().to_string(),
            target: target.as_str().to_string(),
            wakeup,
            op: StagedOp::Insert,
        };
        let fresh = py.detach(|| self.inner.enqueue(&id, staged)).map_err(|e| log_err(py, e))?;
        if !fresh {
            let text = format!("message \"{}\" is already enqueued for session \"{id}\" or in its log", stored.id());
            return Err(new_err(py, "DuplicateMessageError", (text, stored.id().to_string())));
        }
        if message.is_instance_of::<PyMessage>() {
            return Ok(message.clone());
        }
        wrap(py, stored)
    }

    /// Cancels session `id`'s running turn from any process, as its owner's
    /// `loop.cancel(cause, keep_inbox=...)` would: staged for the owner in order with the input
    /// enqueued before it, applied by the owner's AgentLoop, and answered. Returns the outcome
    /// dict (`{"applied": True, "cancelled": <a turn was running>, "discarded": [ids], ...}`, or
    /// `{"applied": False, "reason": ..., "detail": ...}`); waits at most `timeout` seconds,
    /// then withdraws it (`reason` `"timeout"`). Blocks: call it from a thread in async code
    /// (`asyncio.to_thread`). An unknown session raises `SessionNotFoundError`.
    #[pyo3(signature = (id, cause=None, *, keep_inbox=false, timeout=10.0))]
    fn cancel<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        cause: Option<&Bound<'py, PyAny>>,
        keep_inbox: bool,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let user = pyo3::types::PyString::new(py, "user");
        let cause = cause.unwrap_or(user.as_any());
        let cause = match cause.extract::<String>() {
            Ok(kind) => serde_json::Value::String(kind),
            Err(_) if cause.is_instance_of::<PyDict>() => {
                super::convert::to_value(cause, "cause").map_err(|e| pyo3::exceptions::PyTypeError::new_err(e.describe()))?
            }
            Err(_) => {
                let kind = cause.get_type().name()?;
                return Err(pyo3::exceptions::PyTypeError::new_err(format!("cause must be a str or a dict, got {kind}")));
            }
        };
        let args = serde_json::json!({"cause": cause, "keep_inbox": keep_inbox});
        self.apply_op(py, &id, StagedOp::Cancel, &args, timeout)
    }

    /// Replaces queued message `message_id` of session `id` from any process, as the owner's
    /// `inbox.replace(message_id, new_message)` would: a `str` replaces its text (same id and
    /// everything else; refused with `"not-text"` if it holds more than text), a `UserMessage`
    /// replaces it whole. Applied by the owner in order with the input enqueued before it;
    /// returns the outcome dict (`{"applied": True, "message": {...}}`, or refused with
    /// `reason` `"not-queued"` (claimed by a turn, or removed), `"message-not-found"`,
    /// `"not-text"`, `"timeout"`, ...). Blocks, as `cancel` does.
    #[pyo3(signature = (id, message_id, new_message, *, timeout=10.0))]
    fn replace<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        message_id: &str,
        new_message: &Bound<'py, PyAny>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let args = match new_message.extract::<String>() {
            Ok(text) => serde_json::json!({"message_id": message_id, "text": text}),
            Err(_) => serde_json::json!({"message_id": message_id, "message": user_message_arg(new_message)?.to_value()}),
        };
        self.apply_op(py, &id, StagedOp::Replace, &args, timeout)
    }

    /// Removes queued message `message_id` of session `id` from any process, as the owner's
    /// `inbox.remove(message_id)` would; returns the outcome dict (`{"applied": True,
    /// "removed": {...}}`, or refused as for `replace`). Blocks, as `cancel` does.
    #[pyo3(signature = (id, message_id, *, timeout=10.0))]
    fn remove<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>, message_id: &str, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let args = serde_json::json!({"message_id": message_id});
        self.apply_op(py, &id, StagedOp::Remove, &args, timeout)
    }

    /// Sends again, from any process, what ended turn `turn` of session `id` claimed and never
    /// read (a prompt cancelled between its claim and its entry), as the owner's
    /// `loop.requeue_claimed(turn)` would, after which the owner's loop wakes and runs it.
    /// Applied by the owner in order with the input enqueued before it; returns the outcome
    /// dict (`{"applied": True, "turn": turn, "requeued": [ids]}`, or refused with `reason`
    /// `"nothing-to-requeue"` (the turn left nothing unread, is not in the log or still
    /// runs), `"no-loop"`, `"fenced"`, `"timeout"`, ...). Blocks, as `cancel` does.
    #[pyo3(signature = (id, turn, *, timeout=10.0))]
    fn requeue<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>, turn: &Bound<'py, PyAny>, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let number = match turn.is_instance_of::<pyo3::types::PyBool>() {
            true => None,
            false => turn.extract::<u64>().ok().filter(|t| *t >= 1),
        };
        let Some(turn) = number else {
            let shown = turn.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
            return Err(pyo3::exceptions::PyValueError::new_err(format!("turn must be a turn number (an int from 1), got {shown}")));
        };
        self.apply_op(py, &id, StagedOp::Requeue, &serde_json::json!({"turn": turn}), timeout)
    }

    /// Decides pending request `decision_id` of session `id` from any process, as the owner's
    /// `loop.decide(decision_id, outcome, by=..., key=...)` would (`outcome`: `Approve()`,
    /// `Deny(reason)`, `Edit(arguments)`, `Answer(value)`): staged durably for the owner in
    /// order with the input enqueued before it, applied by its loop (one `decision/resolved`;
    /// the step resumes once every request of it is decided), and answered. Returns the outcome
    /// dict (`{"applied": True, "op": "decide", "decision_id": ..., "duplicate": <the same key
    /// was applied before>}`, or refused with `reason` `"unknown"`, `"resolved"`, `"expired"`,
    /// `"invalid"`, `"no-loop"`, `"fenced"`, `"timeout"`, ... and a `detail`). Blocks, as
    /// `cancel` does. A request of another framework's loop (pydantic-ai's deferred approvals)
    /// is decided in place, as `FileStore.decide` does, when no process owns the session, or
    /// when nobody applied it within `timeout` and the owner's lease has lapsed.
    #[pyo3(signature = (id, decision_id, outcome, *, by=None, key=None, timeout=10.0))]
    #[allow(clippy::too_many_arguments)] // the Python signature's arguments, one each
    fn decide<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        decision_id: &str,
        outcome: &Bound<'py, PyAny>,
        by: Option<&str>,
        key: Option<&str>,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let json = super::agent_loop::decide::decision_json(outcome)?;
        let args = serde_json::json!({"decision_id": decision_id, "outcome": json, "by": by, "key": key});
        let stage = || self.apply_op(py, &id, StagedOp::Decide, &args, timeout);
        if PG_LOGS.live(py, &self::key(&self.dsn, &id)).is_some() {
            return stage();
        }
        // Another framework's request may be decided in place when its owner is gone.
        super::agent_loop::decide::decide_on_store(py, &self.inner, &id, decision_id, outcome, by, key, stage)
    }

    /// Records `text` as the one result of call `call_id` in doubt in session `id` (an error
    /// result when `is_error`); nothing runs. With no live owner it takes the session's lease
    /// (a newer epoch, so an owner whose lease lapsed is fenced out), appends the `tool/result`
    /// and releases the lease. With a live owner in another process (a `Worker`'s loop, say)
    /// it is staged for that owner, as `decide` is, which records it as its `loop.resolve`
    /// would and answers; this call waits up to `timeout` seconds for the answer. A call not in
    /// doubt (or being run again by a resumed step) raises `ValueError` naming it, whoever
    /// applied it; an owner that does not apply it (no loop, fenced, no answer in time: then it
    /// is withdrawn) raises `SessionLockedError` saying why, with nothing recorded. A log this
    /// process holds open raises `SessionLockedError`: resolve there, with `loop.resolve`.
    /// Returns the result's seq.
    #[pyo3(signature = (id, call_id, text, *, is_error=false, timeout=10.0))]
    fn resolve(&self, py: Python<'_>, id: &Bound<'_, PyAny>, call_id: &str, text: &str, is_error: bool, timeout: f64) -> PyResult<u64> {
        let id = id_arg(id)?;
        if PG_LOGS.live(py, &key(&self.dsn, &id)).is_some() {
            return Err(locked_here(py, LogError::LockedHere { id }));
        }
        let log = match py.detach(|| self.inner.open(&id)) {
            Ok(log) => log,
            Err(LogError::Locked { .. }) => return self.resolve_by_owner(py, &id, call_id, text, is_error, timeout),
            Err(e) => return Err(log_err(py, e)),
        };
        let result = py.detach(|| crate::agent_loop::in_doubt::resolve(&log, call_id, text, is_error));
        let closed = py.detach(|| log.close());
        let seq = result.map_err(|e| super::agent_loop::resolve_err(py, e))?;
        closed.map_err(|e| log_err(py, e))?;
        Ok(seq)
    }

    /// Ids of every created session, sorted (`exists(id)` is true exactly for these).
    fn list(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.list()).map_err(|e| log_err(py, e))
    }

    fn exists(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.exists(&id)).map_err(|e| log_err(py, e))
    }

    /// A new session whose events up to `at_seq` are this session's, byte for byte, and which
    /// then goes its own way (the parent is not changed); returns its id (a UUIDv7 when
    /// `new_id` is `None`). `inbox="drop"` starts the child with an empty queue (one logged
    /// splice clears it); `"inherit"` keeps the queue as it stood at the cut. See
    /// docs/context.md, "Forks".
    #[pyo3(signature = (id, at_seq, new_id=None, *, inbox="inherit"))]
    fn fork(&self, py: Python<'_>, id: &Bound<'_, PyAny>, at_seq: u64, new_id: Option<&Bound<'_, PyAny>>, inbox: &str) -> PyResult<String> {
        let id = id_arg(id)?;
        let new_id = match new_id.filter(|i| !i.is_none()) {
            None => None,
            Some(i) => Some(id_arg(i)?),
        };
        let policy = inbox.parse::<ForkInbox>().map_err(pyo3::exceptions::PyValueError::new_err)?;
        py.detach(|| fork_session(&self.inner, &id, at_seq, new_id.as_deref(), policy)).map_err(|e| inbox_err(py, e))
    }

    /// Deletes a session nobody holds a live lease on; one that forks read their first events
    /// from raises `SessionHasForksError` naming them (delete them first).
    fn delete(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.delete(&id)).map_err(|e| log_err(py, e))
    }

    /// This store's owner id: what `kerman_sessions.owner` holds for the sessions it owns.
    #[getter]
    fn owner(&self) -> &str {
        self.inner.core().owner()
    }

    /// Every session as an operator sees it, by id (or only `id`: `SessionNotFoundError` if it
    /// does not exist): a dict with `id`, `owner` (owner id or `None`), `owner_name` (a
    /// worker's name), `epoch`, `owned_since` and `expires_at` (seconds since the epoch, server
    /// clock, or `None`), `status` (`"active"` or `"parked"`), `status_detail` (why it was
    /// parked), `events`, `staged` (messages enqueued and not yet taken), `runnable` (released
    /// with unclaimed input in its log), `now` (the server's clock) and `last_ending` (how its
    /// last turn ended: the `turn/end` reason kind, `"open"` while it has not ended, `None`
    /// before the first turn).
    #[pyo3(signature = (id=None))]
    fn sessions<'py>(&self, py: Python<'py>, id: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyList>> {
        let id = id.map(id_arg).transpose()?;
        let boundaries = [crate::agent_loop::events::TURN_START, crate::agent_loop::events::TURN_END];
        let rows = py.detach(|| self.inner.sessions(id.as_deref(), &boundaries)).map_err(|e| log_err(py, e))?;
        if let (Some(id), true) = (&id, rows.is_empty()) {
            return Err(log_err(py, LogError::NotFound { id: id.clone() }));
        }
        let list = PyList::empty(py);
        for row in rows {
            list.append(info_dict(py, row)?)?;
        }
        Ok(list)
    }

    /// Makes a parked session active again, so a worker takes it for the input it has (and
    /// at once, if input is staged). False if it was not parked; `SessionNotFoundError` for an
    /// unknown session.
    fn unpark(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.unpark(&id)).map_err(|e| log_err(py, e))
    }

    /// `kerman.Worker`'s take: an awaitable of `(taken, next_expiry)`. `taken`: up to `limit`
    /// `(log, epoch, closers)` triples, each a session this store now owns (opened as `open`
    /// does; `closers`: the crash closers that appended) that had input waiting and no live
    /// owner, or a dead one; `name` is recorded as their `owner_name`. With `ids` (a list of
    /// session ids), only those are looked at. `next_expiry`: seconds until another owner's
    /// lease next expires, or `None` (also without `expiry`: not read).
    #[pyo3(signature = (limit, name, expiry=true, ids=None))]
    fn _take<'py>(&self, py: Python<'py>, limit: i64, name: &str, expiry: bool, ids: Option<Vec<String>>) -> PyResult<Bound<'py, PyAny>> {
        if limit < 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("limit must be >= 1, got {limit}")));
        }
        let (completion, future) = Completion::new(py)?;
        self.inner.take(limit, name, expiry, ids, move |result| {
            completion.deliver_value(result.map(|(taken, expiry)| {
                let make: Value = Box::new(move |py: Python<'_>| {
                    let list = PyList::empty(py);
                    for (log, epoch, closers) in taken {
                        let log = Py::new(py, wrap_owned_log(log))?;
                        let epoch = epoch.into_pyobject(py)?.into_any().unbind();
                        let closers = closers.into_pyobject(py)?.into_any().unbind();
                        list.append(PyTuple::new(py, [log.into_any(), epoch, closers])?)?;
                    }
                    let expiry = expiry.into_pyobject(py)?.into_any();
                    Ok(PyTuple::new(py, [list.into_any(), expiry])?.into_any().unbind())
                });
                Some(make)
            }));
        });
        Ok(future)
    }

    /// `kerman.Worker`'s park: marks session `id`, taken at `epoch`, parked (releasing it) with
    /// `detail`; awaitable of whether it applied (false: the lease moved on).
    fn _park<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>, epoch: i64, detail: &str, runnable: bool) -> PyResult<Bound<'py, PyAny>> {
        let lease = Lease { session_id: id_arg(id)?, owner: self.inner.core().owner().to_string(), epoch };
        let request = Request::Park { lease, detail: detail.to_string(), runnable };
        submit_future(py, &self.inner, request, |response| match response {
            Response::Bool(b) => {
                Ok(Some(Box::new(move |py: Python<'_>| Ok(pyo3::types::PyBool::new(py, b).to_owned().into_any().unbind())) as Value))
            }
            other => Err(crate::event_log::postgres::unexpected(&other)),
        })
    }

    /// `kerman.Worker`'s hint that session `id` has unclaimed input in its log (it was let go
    /// as input arrived): awaitable of `None`.
    fn _mark_runnable<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let request = Request::MarkRunnable { id: id_arg(id)? };
        submit_future(py, &self.inner, request, |_| Ok(None))
    }

    /// `kerman.Worker`'s wake-up: an awaitable that resolves once a session became takeable
    /// (a NOTIFY on `kerman_takeable`) or the LISTEN connection (re)connected, since the
    /// previous one resolved: with the list of session ids notified meanwhile, or `None` when
    /// notifications may have been missed (a (re-)LISTEN) or too many came (take by scanning).
    /// The first call starts listening.
    fn _takeable<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (completion, future) = Completion::new(py)?;
        let (subscribe, ready) = {
            let mut st = lock(&self.takeable);
            let subscribe = !std::mem::replace(&mut st.subscribed, true);
            let ready = std::mem::take(&mut st.pending).then(|| st.hand_over());
            (subscribe, ready)
        };
        match ready {
            Some(value) => completion.deliver_value(Ok(Some(value))),
            // A future left waiting by an earlier call is dropped: it never resolves.
            None => drop(lock(&self.takeable).waiter.replace(completion)),
        }
        if subscribe {
            self.listen_takeable();
        }
        Ok(future)
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        let Ok(st) = self.takeable.try_lock() else { return Ok(()) };
        match &st.waiter {
            Some(waiter) => visit.call(waiter.future()),
            None => Ok(()),
        }
    }

    fn __clear__(&self) {
        let waiter = lock(&self.takeable).waiter.take();
        drop(waiter);
    }

    fn __repr__(&self) -> String {
        format!(
            "<PostgresStore lease_ttl={} reconnect_timeout={} request_timeout={} pool_size={}{}>",
            self.lease_ttl,
            self.reconnect_timeout,
            self.request_timeout,
            self.pool_size,
            if self.prepared_statements { "" } else { " prepared_statements=False" }
        )
    }
}

impl PyPostgresStore {
    /// Stages operation `op` for session `id`'s owner and waits for its outcome (a dict).
    fn apply_op<'py>(
        &self,
        py: Python<'py>,
        id: &str,
        op: StagedOp,
        args: &serde_json::Value,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("timeout must be a positive number of seconds, got {timeout}")));
        }
        let timeout = std::time::Duration::from_secs_f64(timeout);
        let outcome = py.detach(|| self.inner.apply_op(id, op, args, timeout)).map_err(|e| log_err(py, e))?;
        super::convert::json_to_py(py, &outcome)
    }

    /// `resolve` of a session another process owns: staged for the owner, whose answer is the
    /// result's seq or a refusal (`ValueError` for a call not in doubt, `SessionLockedError`
    /// for an owner that did not apply it).
    fn resolve_by_owner(&self, py: Python<'_>, id: &str, call_id: &str, text: &str, is_error: bool, timeout: f64) -> PyResult<u64> {
        let args = serde_json::json!({"call_id": call_id, "text": text, "is_error": is_error});
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("timeout must be a positive number of seconds, got {timeout}")));
        }
        let wait = std::time::Duration::from_secs_f64(timeout);
        let text = py.detach(|| self.inner.apply_op(id, StagedOp::Resolve, &args, wait)).map_err(|e| log_err(py, e))?;
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if answer.get("applied").and_then(serde_json::Value::as_bool) == Some(true) {
            if let Some(seq) = answer.get("seq").and_then(serde_json::Value::as_u64) {
                return Ok(seq);
            }
        }
        let field = |name: &str| answer.get(name).and_then(serde_json::Value::as_str).unwrap_or("?").to_owned();
        let (reason, detail) = (field("reason"), field("detail"));
        match reason.as_str() {
            "not-in-doubt" | "invalid" => Err(pyo3::exceptions::PyValueError::new_err(detail)),
            _ => Err(new_err(
                py,
                "SessionLockedError",
                (format!(
                    "session \"{id}\" is owned by another process, which did not record the result of call \"{call_id}\" \
                     ({reason}: {detail}); nothing was recorded"
                ),),
            )),
        }
    }

    /// Subscribes to `kerman_takeable` on the store's LISTEN connection. The subscriber runs on
    /// the runtime thread, which never touches Python: it hands the waiting future to the reply
    /// thread (a `Ping`), which delivers it.
    fn listen_takeable(&self) {
        let state = Arc::downgrade(&self.takeable);
        let core: WeakCore = self.inner.core().downgrade();
        let subscriber: crate::event_log::postgres::Subscriber = Arc::new(move |note| {
            let Some(state) = state.upgrade() else { return };
            let waiter = {
                let mut st = lock(&state);
                st.note(note);
                let waiter = st.waiter.take();
                st.pending = waiter.is_none();
                waiter
            };
            if let (Some(waiter), Some(core)) = (waiter, core.upgrade()) {
                // What arrived until the reply thread runs this goes with it.
                let state = Arc::downgrade(&state);
                core.submit(
                    Request::Ping,
                    Box::new(move |_| {
                        let Some(state) = state.upgrade() else { return };
                        let value = lock(&state).hand_over();
                        waiter.deliver_value(Ok(Some(value)));
                    }),
                );
            }
        });
        let id = crate::event_log::postgres::next_listen_id();
        let channel = crate::event_log::postgres::TAKEABLE.to_string();
        self.inner.core().submit(Request::Listen { id, channel, subscriber }, Box::new(|_| ()));
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPostgresStore>()
}
