//! `PostgresStore`: sessions in a PostgreSQL database (feature `postgres`).
//!
//! Every call that talks to the server waits with the GIL released (`py.detach`): the wait is
//! a network round trip on the store's own thread, and other Python threads should run
//! meanwhile. Appends never wait here: they queue, and `log.flush()` completes on the loop.

use pyo3::prelude::*;

use super::errors::{log_err, new_err};
use super::event_log::{id_arg, wrap_log, wrap_owned_log, PySessionLog};
use super::message::{user_message_arg, wrap, PyMessage};
use crate::event_log::postgres::{PgOptions, PostgresStore};
use crate::event_log::{StagedInput, Store};
use crate::inbox::Target;

/// Sessions in one PostgreSQL database; each store is one lease owner on one connection.
#[pyclass(name = "PostgresStore", module = "kerman", frozen)]
pub struct PyPostgresStore {
    inner: PostgresStore,
    lease_ttl: f64,
    reconnect_timeout: f64,
    request_timeout: f64,
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
    /// names one. Bounds (`ValueError` outside them): `lease_ttl` 0 (never renewed) or 0.1 to
    /// 86400; `reconnect_timeout` 0 (one try) or 0.001 to 3600; `request_timeout` 0 (no limit)
    /// or 0.001 to 86400. A server that cannot be reached raises `LogError` naming host:port and
    /// the cause; a store inherited through `fork()` raises `LogError` on every call in the child.
    #[new]
    #[pyo3(signature = (dsn, *, lease_ttl=30.0, reconnect_timeout=10.0, request_timeout=30.0))]
    fn new(py: Python<'_>, dsn: &str, lease_ttl: f64, reconnect_timeout: f64, request_timeout: f64) -> PyResult<Self> {
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
        let inner = py.detach(|| PostgresStore::connect(dsn, options)).map_err(|e| log_err(py, e))?;
        Ok(PyPostgresStore { inner, lease_ttl, reconnect_timeout, request_timeout })
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
    fn create(&self, py: Python<'_>, id: Option<&Bound<'_, PyAny>>) -> PyResult<PySessionLog> {
        let id = match id.filter(|i| !i.is_none()) {
            None => None,
            Some(id) => Some(id_arg(id)?),
        };
        py.detach(|| self.inner.create(id.as_deref())).map(|l| wrap_owned_log(l).in_store("PostgresStore")).map_err(|e| log_err(py, e))
    }

    /// Takes the session's lease (a newer epoch fences any previous owner out) and reads it;
    /// a log ending inside an open turn gets crash closers.
    fn open(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<PySessionLog> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.open(&id)).map(|l| wrap_owned_log(l).in_store("PostgresStore")).map_err(|e| log_err(py, e))
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
    /// (the owner's `agent/inbox/spliced` inserting it). With no owner running, the next `open`
    /// picks it up. An id already enqueued or in the log raises `DuplicateMessageError` (also
    /// for a retry racing the owner's claim of the first try); an unknown session
    /// `SessionNotFoundError`; a message id with NUL or over 1024 UTF-8 bytes `ValueError`.
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
        let staged =
            StagedInput { id: stored.id().to_string(), message: stored.json().to_string(), target: target.as_str().to_string(), wakeup };
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

    /// Ids of every created session, sorted (`exists(id)` is true exactly for these).
    fn list(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.list()).map_err(|e| log_err(py, e))
    }

    fn exists(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.exists(&id)).map_err(|e| log_err(py, e))
    }

    /// Deletes a session nobody holds a live lease on.
    fn delete(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = id_arg(id)?;
        py.detach(|| self.inner.delete(&id)).map_err(|e| log_err(py, e))
    }

    fn __repr__(&self) -> String {
        format!(
            "<PostgresStore lease_ttl={} reconnect_timeout={} request_timeout={}>",
            self.lease_ttl, self.reconnect_timeout, self.request_timeout
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPostgresStore>()
}
