//! The `Inbox`'s notification callbacks and the listener through which the core calls them.

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};

use super::super::convert::{to_py, to_value};
use super::super::errors::report_contained;
use super::super::gc::Held;
use super::super::message::wrap;
use super::super::runtime::exit::attach_unless_exiting;
use super::identity::Wrappers;
use crate::inbox::InboxListener;
use crate::message::Message;
use serde_json::Value;

/// Calls the Python notification callbacks; their failures are logged, never raised. The
/// callbacks are [`Held`] so the inbox that owns them can show them to the collector and drop
/// them in `__clear__` (the core keeps this listener as an opaque box).
pub(super) struct Callbacks {
    pub(super) on_inserted: Option<Held>,
    pub(super) on_discarded: Option<Held>,
    pub(super) on_claimed: Option<Held>,
    /// Private to the AgentLoop: `on_remote(wake)` after messages another process enqueued
    /// (`PostgresStore.enqueue`) were inserted, on the store's reply thread.
    pub(super) on_remote: Option<Held>,
    /// Private to the AgentLoop: `on_remote_cancel(cause, keep_inbox)` when another process
    /// asked to cancel (`PostgresStore.cancel`), on the store's reply thread; returns the
    /// outcome as a dict.
    pub(super) on_remote_cancel: Option<Held>,
    /// Private to the AgentLoop: `on_remote_requeue(turn)` when another process asked to send
    /// again what a turn claimed and never read (`PostgresStore.requeue`), on the store's reply
    /// thread; returns the outcome as a dict.
    pub(super) on_remote_requeue: Option<Held>,
    /// Private to the AgentLoop: `on_remote_decide(args)` when another process decided a
    /// pending request (`PostgresStore.decide`), on the store's reply thread; returns the
    /// outcome as a dict.
    pub(super) on_remote_decide: Option<Held>,
    /// Private to the AgentLoop: `on_remote_resolve(args)` when another process recorded the
    /// result of a call in doubt (`PostgresStore.resolve`), on the store's reply thread;
    /// returns the outcome as a dict.
    pub(super) on_remote_resolve: Option<Held>,
    /// Private to the AgentLoop: per callback, a list that must be non-empty for the callback
    /// to be called (the loop's live listeners of that event), so an inbox with nobody
    /// listening makes no Python call per message.
    pub(super) gates: Option<[Held<PyList>; 3]>,
    pub(super) wrappers: Arc<Wrappers>,
}

impl Callbacks {
    pub(super) fn held(&self) -> impl Iterator<Item = &Held> {
        [
            &self.on_inserted, &self.on_discarded, &self.on_claimed, &self.on_remote, &self.on_remote_cancel, &self.on_remote_requeue,
            &self.on_remote_decide, &self.on_remote_resolve,
        ]
        .into_iter()
        .flatten()
    }

    pub(super) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in self.held() {
            held.visit(visit)?;
        }
        for gate in self.gates.iter().flatten() {
            gate.visit(visit)?;
        }
        Ok(())
    }

    /// Drops every callback and gate (a cleared gate stays closed).
    pub(super) fn clear(&self) {
        let callbacks: Vec<_> = self.held().filter_map(Held::take).collect();
        let gates: Vec<_> = self.gates.iter().flatten().filter_map(Held::take).collect();
        drop((callbacks, gates));
    }

    fn open(&self, py: Python<'_>, which: usize) -> bool {
        match &self.gates {
            None => true,
            Some(gates) => gates[which].get(py).is_some_and(|gate| !gate.bind(py).is_empty()),
        }
    }

    /// Calls `callback` with the message's object (and `turn`) if it is set and its gate is
    /// open, with one attach for both.
    fn call(&self, which: usize, callback: Option<&Held>, what: &str, message: &Arc<Message>, turn: Option<u64>) {
        let Some(callback) = callback else { return };
        attach_unless_exiting(|py| {
            if !self.open(py, which) {
                return;
            }
            let Some(callback) = callback.get(py) else { return };
            let obj = match self.wrappers.lookup(py, message) {
                Some(obj) => Ok(obj),
                None => wrap(py, Arc::clone(message)),
            };
            let result = obj.and_then(|m| match turn {
                Some(turn) => callback.call1(py, (m, turn)),
                None => callback.call1(py, (m,)),
            });
            if let Err(err) = result {
                report_contained(py, what, &err);
            }
        });
    }
}

/// The core holds the listener; the Python inbox holds it too, to visit and clear it.
pub(super) struct Listener(pub(super) Arc<Callbacks>);

impl InboxListener for Listener {
    fn inserted(&self, message: &Arc<Message>) {
        self.0.call(0, self.0.on_inserted.as_ref(), "inbox on_inserted callback", message, None);
    }

    fn discarded(&self, message: &Arc<Message>) {
        self.0.call(1, self.0.on_discarded.as_ref(), "inbox on_discarded callback", message, None);
    }

    fn claimed(&self, message: &Arc<Message>, turn: u64) {
        self.0.call(2, self.0.on_claimed.as_ref(), "inbox on_claimed callback", message, Some(turn));
    }

    fn arrived(&self, wake: bool) {
        let Some(callback) = &self.0.on_remote else { return };
        attach_unless_exiting(|py| {
            let Some(callback) = callback.get(py) else { return };
            if let Err(err) = callback.call1(py, (wake,)) {
                report_contained(py, "inbox on_remote callback", &err);
            }
        });
    }

    fn cancel(&self, cause: &Value, keep_inbox: bool) -> Option<Value> {
        let callback = self.0.on_remote_cancel.as_ref()?;
        ask_loop(callback, "cancel", |py, callback| to_py(py, cause).and_then(|cause| callback.call1(py, (cause, keep_inbox))))
    }

    fn requeue(&self, turn: u64) -> Option<Value> {
        let callback = self.0.on_remote_requeue.as_ref()?;
        ask_loop(callback, "requeue", |py, callback| callback.call1(py, (turn,)))
    }

    fn decide(&self, args: &Value) -> Option<Value> {
        let callback = self.0.on_remote_decide.as_ref()?;
        ask_loop(callback, "decide", |py, callback| to_py(py, args).and_then(|args| callback.call1(py, (args,))))
    }

    fn resolve(&self, args: &Value) -> Option<Value> {
        let callback = self.0.on_remote_resolve.as_ref()?;
        ask_loop(callback, "resolve", |py, callback| to_py(py, args).and_then(|args| callback.call1(py, (args,))))
    }
}

/// Calls the loop's callback for staged operation `op` and converts its answer (a dict) to the
/// outcome; a callback that raises or answers something else is reported as any callback's
/// failure and the requester told (`"failed"`). `None`: the interpreter is exiting.
fn ask_loop(callback: &Held, op: &str, call: impl FnOnce(Python<'_>, &Py<PyAny>) -> PyResult<Py<PyAny>>) -> Option<Value> {
    let mut outcome = None;
    attach_unless_exiting(|py| {
        let Some(callback) = callback.get(py) else { return };
        let result =
            call(py, &callback).and_then(|answer| to_value(answer.bind(py), "outcome").map_err(|e| PyTypeError::new_err(e.describe())));
        outcome = Some(match result {
            Ok(answer) => answer,
            Err(err) => {
                let detail = err.to_string();
                report_contained(py, &format!("inbox on_remote_{op} callback"), &err);
                serde_json::json!({"applied": false, "op": op, "reason": "failed", "detail": detail})
            }
        });
    });
    outcome
}

pub(super) fn callable(obj: Option<Py<PyAny>>, name: &str, py: Python<'_>) -> PyResult<Option<Held>> {
    match obj {
        Some(o) if o.is_none(py) => Ok(None),
        Some(o) if !o.bind(py).is_callable() => {
            Err(PyTypeError::new_err(format!("{name} must be callable, got {}", o.bind(py).get_type().name()?)))
        }
        other => Ok(other.map(Held::new)),
    }
}
