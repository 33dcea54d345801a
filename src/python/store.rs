//! `MemoryStore` and `FileStore`.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::convert::map_to_py;
use super::errors::{inbox_err, log_err, warn};
use super::event_log::{id_arg, wrap_log, wrap_owned_log, PyEvent, PySessionLog};
use super::faults::PyFaultPlan;
use super::reopen::{locked_here, OpenLogs};
use crate::agent_loop::{crash_closers, fork_session, ForkInbox};
use crate::event_log::{Durability, FileStore, MemoryStore, RepairReport, Store};

fn create_arg(id: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match id.filter(|i| !i.is_none()) {
        None => Ok(None),
        Some(id) => id_arg(id).map(Some),
    }
}

/// Sessions kept in memory for the life of the process. A closed session can be reopened.
#[pyclass(name = "MemoryStore", module = "kerman", frozen)]
pub struct PyMemoryStore {
    inner: MemoryStore,
    /// Its sessions open in this process, for `open(id, reuse=True)`.
    open: OpenLogs,
}

#[pymethods]
impl PyMemoryStore {
    #[new]
    fn new() -> Self {
        PyMemoryStore { inner: MemoryStore::new().with_open_hook(crash_closers()), open: OpenLogs::new() }
    }

    /// A new, empty session (id minted as a UUIDv7 when `None`).
    #[pyo3(signature = (id=None))]
    fn create<'py>(&self, py: Python<'py>, id: Option<&Bound<'_, PyAny>>) -> PyResult<Bound<'py, PySessionLog>> {
        let id = create_arg(id)?;
        let log = self.inner.create(id.as_deref()).map_err(|e| log_err(py, e))?;
        let key = log.id().to_string();
        let log = Bound::new(py, wrap_log(log).in_store("MemoryStore"))?;
        self.open.remember(py, key, &log)?;
        Ok(log)
    }

    /// Reopens a closed session; a log ending inside an open turn gets crash closers. A session
    /// still open here raises `SessionLockedError`, or with `reuse=True` gives back that same
    /// `SessionLog`.
    #[pyo3(signature = (id, *, reuse=false))]
    fn open<'py>(&self, py: Python<'py>, id: &Bound<'_, PyAny>, reuse: bool) -> PyResult<Bound<'py, PySessionLog>> {
        let id = id_arg(id)?;
        if let Some(log) = reuse.then(|| self.open.live(py, &id)).flatten() {
            return Ok(log);
        }
        let log = self.inner.open(&id).map_err(|e| locked_here(py, e))?;
        let log = Bound::new(py, wrap_log(log).in_store("MemoryStore"))?;
        self.open.remember(py, id, &log)?;
        Ok(log)
    }

    /// Ids of every created session, sorted (`exists(id)` is true exactly for these).
    fn list(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.inner.list().map_err(|e| log_err(py, e))
    }

    fn exists(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.inner.exists(&id_arg(id)?).map_err(|e| log_err(py, e))
    }

    /// A new session whose events up to `at_seq` are this session's, byte for byte, and which
    /// then goes its own way (the parent is not changed); returns its id (a UUIDv7 when
    /// `new_id` is `None`). `inbox="drop"` starts the child with an empty queue (one logged
    /// splice clears it); `"inherit"` keeps the queue as it stood at the cut. See
    /// docs/context.md, "Forks".
    #[pyo3(signature = (id, at_seq, new_id=None, *, inbox="inherit"))]
    fn fork(&self, py: Python<'_>, id: &Bound<'_, PyAny>, at_seq: u64, new_id: Option<&Bound<'_, PyAny>>, inbox: &str) -> PyResult<String> {
        let id = id_arg(id)?;
        let new_id = create_arg(new_id)?;
        let policy = inbox.parse::<ForkInbox>().map_err(PyValueError::new_err)?;
        py.detach(|| fork_session(&self.inner, &id, at_seq, new_id.as_deref(), policy)).map_err(|e| inbox_err(py, e))
    }

    /// Deletes a session nobody has open; one with forks raises `SessionHasForksError` (the
    /// same rule as the stores that share records).
    fn delete(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.delete(&id_arg(id)?).map_err(|e| log_err(py, e))
    }

    fn __repr__(&self) -> String {
        format!("<MemoryStore sessions={}>", self.inner.list().map_or(0, |l| l.len()))
    }
}

fn durability_arg(name: &str) -> PyResult<Durability> {
    name.parse::<Durability>().map_err(PyValueError::new_err)
}

/// Sessions as files under `root`, one JSON-lines file each (see docs/format.md).
#[pyclass(name = "FileStore", module = "kerman", frozen)]
pub struct PyFileStore {
    inner: FileStore,
    root: PathBuf,
    durability: String,
}

#[pymethods]
impl PyFileStore {
    /// `_faults` (test-only, private): a `kerman._core._FaultPlan` consulted by the writers
    /// of the logs this store opens.
    #[new]
    #[pyo3(signature = (root, durability="checkpoint", *, _faults=None))]
    fn new(py: Python<'_>, root: PathBuf, durability: &str, _faults: Option<PyRef<'_, PyFaultPlan>>) -> PyResult<Self> {
        let mode = durability_arg(durability)?;
        let mut inner = FileStore::new(&root, mode).map_err(|e| log_err(py, e))?.with_open_hook(crash_closers());
        if let Some(plan) = _faults {
            inner = inner.with_fault(plan.hook());
        }
        Ok(PyFileStore { inner, root, durability: durability.to_string() })
    }

    /// The root folder.
    #[getter]
    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    /// `"strict"`, `"checkpoint"`, `"batch"` or `"none"`.
    #[getter]
    fn durability(&self) -> &str {
        &self.durability
    }

    /// A new, empty session file, created atomically (id minted as a UUIDv7 when `None`).
    #[pyo3(signature = (id=None))]
    fn create<'py>(&self, py: Python<'py>, id: Option<&Bound<'_, PyAny>>) -> PyResult<Bound<'py, PySessionLog>> {
        let id = create_arg(id)?;
        let log = self.inner.create(id.as_deref()).map_err(|e| log_err(py, e))?;
        let key = self.key(log.id());
        let log = Bound::new(py, wrap_owned_log(log).in_store(self.label(py)))?;
        FILE_LOGS.remember(py, key, &log)?;
        Ok(log)
    }

    /// Opens a session for appending: verifies every record, truncates a torn tail, refuses
    /// corruption, and closes a turn left open by a crash. A session another process holds
    /// raises `SessionLockedError`; so does one a `SessionLog` of this process holds, unless
    /// `reuse=True`, which gives back that same `SessionLog` (from any `FileStore` over the same
    /// folder: a notebook cell that opens the session running again).
    #[pyo3(signature = (id, *, reuse=false))]
    fn open<'py>(&self, py: Python<'py>, id: &Bound<'_, PyAny>, reuse: bool) -> PyResult<Bound<'py, PySessionLog>> {
        let id = id_arg(id)?;
        let key = self.key(&id);
        if let Some(log) = reuse.then(|| FILE_LOGS.live(py, &key)).flatten() {
            return Ok(log);
        }
        let (log, recovery) = self.inner.open_with_report(&id).map_err(|e| locked_here(py, e))?;
        if recovery.recreated {
            let bytes = recovery.truncated_bytes;
            warn(py, &format!("session {id:?}: its creation never reached the disk (a crash before its first sync left {bytes} bytes of its header); created it again, empty"));
        } else if recovery.truncated_bytes > 0 {
            let line = recovery.truncated_at_line.map(|l| format!(" from line {l}")).unwrap_or_default();
            warn(py, &format!("session {id:?}: truncated a torn tail of {} bytes{line}", recovery.truncated_bytes));
        }
        if recovery.closers > 0 {
            let n = recovery.closers;
            let events = if n == 1 { "event" } else { "events" };
            warn(py, &format!("session {id:?} ended inside an open turn; appended {n} closing {events}"));
        }
        let log = Bound::new(py, wrap_owned_log(log).in_store(self.label(py)))?;
        FILE_LOGS.remember(py, self.key(&id), &log)?;
        Ok(log)
    }

    /// Ids of every created session, sorted (`exists(id)` is true exactly for these).
    fn list(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.inner.list().map_err(|e| log_err(py, e))
    }

    fn exists(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.inner.exists(&id_arg(id)?).map_err(|e| log_err(py, e))
    }

    /// Decides pending request `decision_id` of session `id`, which no process has open: opens
    /// it (taking its lock, crash closers included), appends the decision as the owner's
    /// `loop.decide` would (one `decision/resolved`) and closes it; the step resumes when an
    /// `AgentLoop` next opens the session (at once if a request is still pending there, else at
    /// its `wake()`). A session another process holds, or a `SessionLog` of this one, raises
    /// `SessionLockedError`: decide there, with `loop.decide`. Returns what
    /// `PostgresStore.decide` returns (`{"applied": True, ..., "duplicate": ...}`, or refused
    /// with `reason` `"unknown"`, `"resolved"`, `"expired"` or `"invalid"`).
    #[pyo3(signature = (id, decision_id, outcome, *, by=None, key=None))]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        decision_id: &str,
        outcome: &Bound<'py, PyAny>,
        by: Option<&str>,
        key: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = id_arg(id)?;
        let decision = super::agent_loop::decide::decision(outcome)?;
        let (log, _) = self.inner.open_with_report(&id).map_err(|e| locked_here(py, e))?;
        let now = crate::event_log::now_ms();
        if let Err(refused) = super::agent_loop::decide::check_answer(py, &log, decision_id, &decision, now) {
            let closed = log.close();
            let answer = super::agent_loop::decide::refused_answer(py, decision_id, &refused);
            closed.map_err(|e| log_err(py, e))?;
            return answer;
        }
        let result = crate::agent_loop::decisions::decide(&log, decision_id, decision, by, key, now).map(|decided| decided.duplicate);
        let closed = log.close();
        let answer = super::agent_loop::decide::decide_answer(py, decision_id, result)?;
        closed.map_err(|e| log_err(py, e))?;
        Ok(answer)
    }

    /// Records `text` as the one result of call `call_id` in doubt in session `id`, which no
    /// process has open (an error result when `is_error`): opens it (crash closers included),
    /// appends the `tool/result`, closes it; nothing runs. A call not in doubt raises
    /// `ValueError` naming it; a session another process holds, `SessionLockedError`.
    #[pyo3(signature = (id, call_id, text, *, is_error=false))]
    fn resolve(&self, py: Python<'_>, id: &Bound<'_, PyAny>, call_id: &str, text: &str, is_error: bool) -> PyResult<u64> {
        let id = id_arg(id)?;
        let (log, _) = self.inner.open_with_report(&id).map_err(|e| locked_here(py, e))?;
        let result = crate::agent_loop::in_doubt::resolve(&log, call_id, text, is_error);
        let closed = log.close();
        let seq = result.map_err(|e| super::agent_loop::resolve_err(py, e))?;
        closed.map_err(|e| log_err(py, e))?;
        Ok(seq)
    }

    /// A read-only follower of session `id`: its events so far, then each record its owner (in
    /// this or another process) writes, as the file grows, so `tail()` and `subscribe()` follow
    /// the session live. Takes no lock and never writes. Appends raise `LogError`; `close()`
    /// stops following. A corrupt file raises `CorruptLogError`; an incomplete last record is
    /// simply not visible yet.
    fn follow(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<PySessionLog> {
        let id = id_arg(id)?;
        let label = format!("{} (following)", self.label(py));
        py.detach(|| self.inner.follow(&id)).map(|log| wrap_log(log).in_store(label)).map_err(|e| log_err(py, e))
    }

    /// A new session whose events up to `at_seq` are this session's, byte for byte, and which
    /// then goes its own way (the parent is not changed); returns its id (a UUIDv7 when
    /// `new_id` is `None`). `inbox="drop"` starts the child with an empty queue (one logged
    /// splice clears it); `"inherit"` keeps the queue as it stood at the cut. See
    /// docs/context.md, "Forks".
    #[pyo3(signature = (id, at_seq, new_id=None, *, inbox="inherit"))]
    fn fork(&self, py: Python<'_>, id: &Bound<'_, PyAny>, at_seq: u64, new_id: Option<&Bound<'_, PyAny>>, inbox: &str) -> PyResult<String> {
        let id = id_arg(id)?;
        let new_id = create_arg(new_id)?;
        let policy = inbox.parse::<ForkInbox>().map_err(PyValueError::new_err)?;
        py.detach(|| fork_session(&self.inner, &id, at_seq, new_id.as_deref(), policy)).map_err(|e| inbox_err(py, e))
    }

    /// Deletes a session file nobody has open; a session forks read their first events from
    /// raises `SessionHasForksError` naming them (delete them first).
    fn delete(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.delete(&id_arg(id)?).map_err(|e| log_err(py, e))
    }

    /// Checks a session without modifying it or taking its lock: returns `{"path", "events",
    /// "size_bytes", "torn_tail_bytes"}`; raises `CorruptLogError`/`UnsupportedFormatError`.
    fn verify<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let snap = self.inner.read(&id_arg(id)?).map_err(|e| log_err(py, e))?;
        let d = PyDict::new(py);
        d.set_item("path", snap.path.display().to_string())?;
        d.set_item("events", snap.events.len())?;
        d.set_item("size_bytes", snap.size_bytes)?;
        d.set_item("torn_tail_bytes", snap.torn_tail_bytes)?;
        Ok(d)
    }

    /// Repairs the session file (docs/format.md, "Repairing corruption"): truncates a torn
    /// tail; for a corrupt log copies the whole file to `<path>.corrupt`, sets the lines that
    /// do not verify aside in `<path>.damaged`, keeps every verified record at its seq with a
    /// `log/damaged` placeholder at each lost seq, and appends a `log/repaired` record. With
    /// `dry_run`, only reports what it would do (no lock taken, nothing written). Returns
    /// `{"kept_events", "events", "removed_bytes", "dropped": [{"line", "bytes", "seq",
    /// "detail"}], "lost_seqs": [[first, last]], "torn_tail_bytes", "torn_tail_line",
    /// "backup", "quarantine"}`.
    #[pyo3(signature = (id, *, dry_run=false))]
    fn repair<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>, dry_run: bool) -> PyResult<Bound<'py, PyDict>> {
        let id = id_arg(id)?;
        let report = if dry_run { self.inner.plan_repair(&id) } else { self.inner.repair(&id) };
        report_dict(py, &report.map_err(|e| log_err(py, e))?)
    }

    /// Read-only snapshot for tools: `(header, events, info)`; never modifies the file. With
    /// `allow_damaged`, a corrupt file gives the records that verify and `info["skipped"]`
    /// (the `repair` report of what was left out) instead of `CorruptLogError`.
    #[pyo3(signature = (id, allow_damaged=false))]
    fn _read<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        allow_damaged: bool,
    ) -> PyResult<(Bound<'py, PyDict>, Vec<PyEvent>, Bound<'py, PyDict>)> {
        let id = id_arg(id)?;
        let (snap, skipped) = if allow_damaged {
            let damaged = self.inner.read_damaged(&id).map_err(|e| log_err(py, e))?;
            (damaged.snapshot, damaged.skipped)
        } else {
            (self.inner.read(&id).map_err(|e| log_err(py, e))?, None)
        };
        let info = PyDict::new(py);
        if let Some(skipped) = skipped {
            info.set_item("skipped", report_dict(py, &skipped)?)?;
        }
        info.set_item("path", snap.path.display().to_string())?;
        info.set_item("size_bytes", snap.size_bytes)?;
        info.set_item("torn_tail_bytes", snap.torn_tail_bytes)?;
        let events = snap.events.into_iter().map(PyEvent::new).collect();
        Ok((map_to_py(py, &snap.header)?, events, info))
    }

    fn __repr__(&self) -> String {
        let root =
            Python::attach(|py| PyString::new(py, &self.root.display().to_string()).repr().map(|r| r.to_string())).unwrap_or_default();
        format!("<FileStore root={root} durability='{}'>", self.durability)
    }
}

/// The session files this process has open, from every `FileStore`.
static FILE_LOGS: OpenLogs = OpenLogs::new();

impl PyFileStore {
    /// Session `id`'s registry key: its file's canonical path (the same for every `FileStore`
    /// over the folder, however the root was spelled).
    fn key(&self, id: &str) -> String {
        let path = self.inner.path_of(id).unwrap_or_else(|_| self.root.join(id));
        std::fs::canonicalize(&path).unwrap_or(path).display().to_string()
    }

    /// How the logs of this store name it in their reprs.
    fn label(&self, py: Python<'_>) -> String {
        let root = PyString::new(py, &self.root.display().to_string()).repr().map(|r| r.to_string()).unwrap_or_default();
        format!("FileStore({root})")
    }
}

fn report_dict<'py>(py: Python<'py>, report: &RepairReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kept_events", report.kept_events)?;
    d.set_item("events", report.events)?;
    d.set_item("removed_bytes", report.removed_bytes)?;
    let dropped = PyList::empty(py);
    for line in &report.dropped {
        let item = PyDict::new(py);
        item.set_item("line", line.line)?;
        item.set_item("bytes", line.bytes.end - line.bytes.start)?;
        item.set_item("seq", line.claimed_seq)?;
        item.set_item("detail", &line.detail)?;
        dropped.append(item)?;
    }
    d.set_item("dropped", dropped)?;
    let lost: Vec<Vec<u64>> = report.lost.iter().map(|l| vec![l.seqs.start, l.seqs.end - 1]).collect();
    d.set_item("lost_seqs", lost)?;
    d.set_item("torn_tail_bytes", report.torn_tail_bytes)?;
    d.set_item("torn_tail_line", report.torn_tail_line)?;
    d.set_item("backup", report.backup.as_ref().map(|p| p.display().to_string()))?;
    d.set_item("quarantine", report.quarantine.as_ref().map(|p| p.display().to_string()))?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMemoryStore>()?;
    m.add_class::<PyFileStore>()?;
    Ok(())
}
