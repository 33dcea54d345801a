//! `_FaultPlan`: test-only fault injection for `FileStore` (private, not part of the API).
//!
//! The plan is plain Rust data consulted by the writer thread through the core's
//! [`FaultHook`]; it never calls into Python (the writer must not need the GIL to decide).

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::event_log::{Fault, FaultHook, FaultPoint, FaultSite};

/// Which occurrence of the planned operation fails.
#[derive(Clone, Copy)]
enum Trigger {
    /// The n-th (from 1) write, or sync, of every log the store opens.
    Nth(u64),
    /// The write, or sync, of the batch that holds this event seq.
    Seq(u64),
    /// A sync with no events in it: a session created and never synced, at `close` (or at a
    /// barrier with nothing pending).
    AtClose,
}

#[derive(Default)]
struct Seen {
    writes: u64,
    syncs: u64,
    /// Directory syncs (the first sync of a session `create` made).
    dir_syncs: u64,
    /// `(first seq, events, bytes)` of every write.
    batches: Vec<(u64, u64, usize)>,
    /// `(point, n-th of its kind, first seq, events)` once the fault was injected.
    fired: Option<(FaultPoint, u64, u64, u64)>,
}

struct Plan {
    op: Option<FaultPoint>,
    trigger: Trigger,
    short: Option<usize>,
    errno: i32,
    cut_back: bool,
    seen: Mutex<Seen>,
}

impl Plan {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn consult(&self, site: &FaultSite) -> Option<Fault> {
        let mut seen = self.seen();
        let nth = match site.point {
            FaultPoint::Write => {
                seen.writes += 1;
                seen.batches.push((site.seqs.start, site.seqs.end - site.seqs.start, site.bytes));
                seen.writes
            }
            FaultPoint::Sync => {
                seen.syncs += 1;
                seen.syncs
            }
            FaultPoint::SyncDirectory => {
                seen.dir_syncs += 1;
                seen.dir_syncs
            }
            // Only the cut-back that follows this plan's own fault fails.
            FaultPoint::CutBack => {
                return (self.cut_back && seen.fired.is_some()).then(|| Fault::Fail(io::Error::from_raw_os_error(self.errno)));
            }
        };
        if seen.fired.is_some() || self.op != Some(site.point) {
            return None;
        }
        let hit = match self.trigger {
            Trigger::Nth(n) => nth == n,
            Trigger::Seq(seq) => site.seqs.contains(&seq),
            Trigger::AtClose => site.seqs.is_empty(),
        };
        if !hit {
            return None;
        }
        seen.fired = Some((site.point, nth, site.seqs.start, site.seqs.end - site.seqs.start));
        let error = io::Error::from_raw_os_error(self.errno);
        Some(match self.short {
            Some(bytes) => Fault::Short { bytes, error },
            None => Fault::Fail(error),
        })
    }
}

fn point_name(point: FaultPoint) -> &'static str {
    match point {
        FaultPoint::Write => "write",
        FaultPoint::Sync => "sync",
        FaultPoint::SyncDirectory => "sync-dir",
        FaultPoint::CutBack => "cut-back",
    }
}

/// Test-only: fails one write or sync of the logs a `FileStore(..., _faults=plan)` opens, and
/// counts the write and sync points reached. Not part of the public API.
///
/// `_FaultPlan()` only counts. `_FaultPlan("write" | "sync" | "sync-dir", nth=N | seq=S |
/// at_close=True, short=None, errno=5, cut_back=False)` fails the N-th such operation, or the
/// one whose batch holds event seq S, or (sync only) a sync with no events (a session created
/// and never synced, at close), with `errno`. "sync-dir" is the directory's sync that follows
/// the file's at the first sync of a session `create` made. `short=B` (write
/// only) lets the first B bytes of the batch (at most all but one) reach the file first.
/// `cut_back=True` also fails the cleanup that cuts the file back after the fault.
#[pyclass(name = "_FaultPlan", module = "kerman._core", frozen)]
pub struct PyFaultPlan {
    plan: Arc<Plan>,
}

impl PyFaultPlan {
    pub fn hook(&self) -> FaultHook {
        let plan = Arc::clone(&self.plan);
        Arc::new(move |site: &FaultSite| plan.consult(site))
    }
}

#[pymethods]
impl PyFaultPlan {
    #[new]
    #[pyo3(signature = (op=None, *, nth=None, seq=None, at_close=false, short=None, errno=5, cut_back=false))]
    fn new(
        op: Option<&str>,
        nth: Option<u64>,
        seq: Option<u64>,
        at_close: bool,
        short: Option<usize>,
        errno: i32,
        cut_back: bool,
    ) -> PyResult<Self> {
        let op = match op {
            None => None,
            Some("write") => Some(FaultPoint::Write),
            Some("sync") => Some(FaultPoint::Sync),
            Some("sync-dir") => Some(FaultPoint::SyncDirectory),
            Some(other) => return Err(PyValueError::new_err(format!("op must be \"write\", \"sync\" or \"sync-dir\", got {other:?}"))),
        };
        let trigger = match (op, nth, seq, at_close) {
            (None, None, None, false) => Trigger::Nth(0),
            (Some(_), Some(n), None, false) if n >= 1 => Trigger::Nth(n),
            (Some(_), None, Some(s), false) => Trigger::Seq(s),
            (Some(FaultPoint::Sync), None, None, true) => Trigger::AtClose,
            _ => return Err(PyValueError::new_err("give an op and exactly one of nth>=1, seq, at_close (sync only)")),
        };
        if short.is_some() && op != Some(FaultPoint::Write) {
            return Err(PyValueError::new_err("short applies to writes only"));
        }
        let plan = Plan { op, trigger, short, errno, cut_back, seen: Mutex::new(Seen::default()) };
        Ok(PyFaultPlan { plan: Arc::new(plan) })
    }

    /// Write points reached so far (the failing one included).
    #[getter]
    fn writes(&self) -> u64 {
        self.plan.seen().writes
    }

    /// File sync points reached so far (the failing one included).
    #[getter]
    fn syncs(&self) -> u64 {
        self.plan.seen().syncs
    }

    /// Directory sync points reached so far (the failing one included).
    #[getter]
    fn dir_syncs(&self) -> u64 {
        self.plan.seen().dir_syncs
    }

    /// `(first_seq, events, bytes)` of every write point reached.
    #[getter]
    fn batches(&self) -> Vec<(u64, u64, usize)> {
        self.plan.seen().batches.clone()
    }

    /// `None`, or where the fault was injected: `{"op", "nth", "first_seq", "events"}`.
    #[getter]
    fn fired<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((point, nth, first, events)) = self.plan.seen().fired else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("op", point_name(point))?;
        d.set_item("nth", nth)?;
        d.set_item("first_seq", first)?;
        d.set_item("events", events)?;
        Ok(Some(d))
    }

    fn __repr__(&self) -> String {
        let seen = self.plan.seen();
        let op = self.plan.op.map_or("count", point_name);
        format!("<_FaultPlan {op} writes={} syncs={} fired={}>", seen.writes, seen.syncs, seen.fired.is_some())
    }
}

/// Set as a plain attribute, not through `add_class`, so the private name stays out of the
/// module's `__all__` (and out of the stub stubtest checks it against).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.as_any().setattr("_FaultPlan", m.py().get_type::<PyFaultPlan>())
}
