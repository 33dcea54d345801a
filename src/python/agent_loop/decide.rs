//! Decisions across the binding: reading a `before_tool` gate's verdict and a person's
//! decision, and the pending requests as dicts. Every rule (what is pending, what may be
//! decided, expiry) is the core's (`crate::agent_loop::decisions`).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::super::convert::{to_py, to_value};
use super::super::errors::{log_err, new_err};
use super::{classes, read};
use crate::agent_loop::decisions::{self, Decide, DecideError, Request};
use crate::agent_loop::{Ask, Gate};
use crate::event_log::SessionLog;

fn optional_text(value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if value.is_none() {
        return Ok(None);
    }
    Ok(Some(match value.cast::<PyString>() {
        Ok(text) => text.to_str()?.to_owned(),
        Err(_) => value.str()?.to_string(),
    }))
}

/// A gate's verdict; what is not one (or does not hold JSON) fails closed as `Invalid`.
pub(super) fn gate(value: &Bound<'_, PyAny>) -> PyResult<Gate> {
    let py = value.py();
    let c = classes(py)?;
    if value.is_instance(c.approve.bind(py))? {
        return Ok(Gate::Run);
    }
    if value.is_instance(c.deny.bind(py))? {
        return Ok(Gate::Deny(optional_text(&value.getattr(intern!(py, "reason"))?)?));
    }
    if value.is_instance(c.edit.bind(py))? {
        return Ok(match to_value(&value.getattr(intern!(py, "arguments"))?, "arguments") {
            Ok(arguments) if arguments.is_object() => Gate::Edit(crate::json::canonical(&arguments)),
            Ok(_) => Gate::Invalid(format!("{} (edited arguments must be a JSON object)", read::repr(value))),
            Err(e) => Gate::Invalid(format!("{} (edited arguments are not JSON: {})", read::repr(value), e.describe())),
        });
    }
    if value.is_instance(c.ask.bind(py))? {
        let schema = value.getattr(intern!(py, "schema"))?;
        let schema = if schema.is_none() {
            None
        } else {
            match to_value(&schema, "schema") {
                Ok(schema) => Some(crate::json::compact(&schema)),
                Err(e) => return Ok(Gate::Invalid(format!("{} (its schema is not JSON: {})", read::repr(value), e.describe()))),
            }
        };
        return Ok(Gate::Ask(Ask {
            note: optional_text(&value.getattr(intern!(py, "note"))?)?,
            schema,
            expires_at: value.getattr(intern!(py, "deadline_ms"))?.extract()?,
        }));
    }
    Ok(Gate::Invalid(read::repr(value)))
}

/// A person's decision (`Approve`, `Deny`, `Edit`, `Answer`), by its `kind`.
pub(crate) fn decision(value: &Bound<'_, PyAny>) -> PyResult<Decide> {
    let py = value.py();
    let kind = value.getattr_opt(intern!(py, "kind"))?.map(|k| k.extract::<String>()).transpose().ok().flatten();
    let json = |attr: &Bound<'_, PyString>| -> PyResult<serde_json::Value> {
        to_value(&value.getattr(attr)?, attr.to_str()?).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.describe()))
    };
    Ok(match kind.as_deref() {
        Some("approve") => Decide::Approve,
        Some("deny") => Decide::Deny(optional_text(&value.getattr(intern!(py, "reason"))?)?),
        Some("edit") => Decide::Edit(json(intern!(py, "arguments"))?),
        Some("answer") => Decide::Answer(json(intern!(py, "value"))?),
        _ => {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "a decision is kerman.Approve(), Deny(reason), Edit(arguments) or Answer(value), got {}",
                read::repr(value)
            )))
        }
    })
}

/// A person's decision as the JSON object `PostgresStore.decide` stages for the session's
/// owner (`{"kind": "approve"}`, `{"kind": "deny", "reason": …}`, `{"kind": "edit",
/// "arguments": …}`, `{"kind": "answer", "value": …}`); the owner's loop reads it back.
pub(crate) fn decision_json(value: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    Ok(match decision(value)? {
        Decide::Approve => serde_json::json!({"kind": "approve"}),
        Decide::Deny(reason) => serde_json::json!({"kind": "deny", "reason": reason}),
        Decide::Edit(arguments) => serde_json::json!({"kind": "edit", "arguments": arguments}),
        Decide::Answer(value) => serde_json::json!({"kind": "answer", "value": value}),
    })
}

/// Refuses an answer to a pending request of `log` that does not match the request's schema
/// (`kerman.decisions.check_answer` raises `DecisionError`, reason `invalid`). Only a pending,
/// unexpired answer request with a schema is checked: anything else is the core's to refuse or
/// accept (unknown, resolved, expired, an answer to an approval, a duplicate key). Runs before
/// the core's `decide`, with no lock held: a request's schema never changes, so a decision
/// that lands in between changes nothing of the check.
pub(crate) fn check_answer(py: Python<'_>, log: &SessionLog, decision_id: &str, decision: &Decide, now: i64) -> PyResult<()> {
    let Decide::Answer(value) = decision else { return Ok(()) };
    let request = decisions::pending(log).into_iter().find(|r| r.decision_id == decision_id);
    let Some(request) = request.filter(|r| r.kind.takes_answer() && r.expires_at.is_none_or(|t| t > now)) else {
        return Ok(());
    };
    let Some(schema) = request.schema.as_deref().and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok()) else {
        return Ok(());
    };
    py.import(intern!(py, "kerman.decisions"))?
        .call_method1(intern!(py, "check_answer"), (decision_id, to_py(py, &schema)?, to_py(py, value)?))?;
    Ok(())
}

/// `kerman.errors.DecisionError(message, reason)`, or the log's own error.
pub(super) fn decide_err(py: Python<'_>, e: DecideError) -> PyErr {
    match e {
        DecideError::Log(e) => log_err(py, e),
        e => new_err(py, "DecisionError", (e.to_string(), e.reason())),
    }
}

/// What `store.decide` answers for a decision applied in this process (a `FileStore`'s),
/// shaped as the owner's answer to `PostgresStore.decide`: applied (`duplicate` for a key
/// applied before) or refused with `DecisionError`'s reason; a log failure raises.
pub(crate) fn decide_answer<'py>(py: Python<'py>, decision_id: &str, result: Result<bool, DecideError>) -> PyResult<Bound<'py, PyAny>> {
    let answer = match result {
        Ok(duplicate) => serde_json::json!({"applied": true, "op": "decide", "decision_id": decision_id, "duplicate": duplicate}),
        Err(DecideError::Log(e)) => return Err(log_err(py, e)),
        Err(e) => {
            serde_json::json!({"applied": false, "op": "decide", "decision_id": decision_id, "reason": e.reason(), "detail": e.to_string()})
        }
    };
    to_py(py, &answer)
}

/// What `store.decide` answers when [`check_answer`] refused the decision: the refusal dict
/// for a `DecisionError` (its reason and message), any other error raised.
pub(crate) fn refused_answer<'py>(py: Python<'py>, decision_id: &str, error: &PyErr) -> PyResult<Bound<'py, PyAny>> {
    let value = error.value(py);
    if !value.is_instance(super::super::errors::class(py, "DecisionError")?.as_any())? {
        return Err(error.clone_ref(py));
    }
    let reason: String = value.getattr(intern!(py, "reason"))?.extract()?;
    let detail = value.str()?.to_string();
    let answer = serde_json::json!({"applied": false, "op": "decide", "decision_id": decision_id, "reason": reason, "detail": detail});
    to_py(py, &answer)
}

/// A pending request as the dict `PendingDecision` is built from.
pub(super) fn request_dict<'py>(py: Python<'py>, r: &Request) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("decision_id", &r.decision_id)?;
    d.set_item("call_id", &r.call_id)?;
    d.set_item("name", &r.name)?;
    d.set_item("arguments", &r.arguments)?;
    d.set_item("digest", &r.digest)?;
    d.set_item("kind", r.kind.as_str())?;
    d.set_item("note", &r.note)?;
    let schema = match &r.schema {
        Some(text) => to_py(py, &serde_json::from_str(text).unwrap_or(serde_json::Value::Null))?,
        None => py.None().into_bound(py),
    };
    d.set_item("schema", schema)?;
    d.set_item("expires_at", r.expires_at)?;
    d.set_item("turn", r.turn)?;
    d.set_item("step", r.step)?;
    let requester = match &r.requester {
        Some(text) => to_py(py, &serde_json::from_str(text).unwrap_or(serde_json::Value::Null))?,
        None => py.None().into_bound(py),
    };
    d.set_item("requester", requester)?;
    Ok(d)
}

pub(super) fn request_list<'py>(py: Python<'py>, requests: &[Request]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for r in requests {
        list.append(request_dict(py, r)?)?;
    }
    Ok(list)
}

/// The requests of session `log` waiting for a person, oldest first, as dicts (the core's fold:
/// what `loop.decisions` lists), for a process that follows the session without a loop of its
/// own (`kerman serve` over a PostgresStore, whose workers own the sessions).
#[pyfunction]
pub(super) fn pending_decisions<'py>(py: Python<'py>, log: &Bound<'py, super::PySessionLog>) -> PyResult<Bound<'py, PyList>> {
    request_list(py, &crate::agent_loop::decisions::pending(&log.get().inner))
}

/// Asks a person about calls of a loop other than Kerman's (a framework's deferred tool calls):
/// one `decision/requested` per `(call_id, name, arguments, expires_at)` of `calls` (the
/// deadline in epoch milliseconds, or `None`), outside any turn, with `for` the `requester` (a
/// dict). Returns the requests as dicts, in order (their `decision_id`s are new). The core
/// writes and folds them (`crate::agent_loop::foreign_decisions`).
#[pyfunction]
pub(super) fn request_foreign_decisions<'py>(
    py: Python<'py>,
    log: &Bound<'py, super::PySessionLog>,
    requester: &Bound<'py, PyAny>,
    calls: Vec<(String, String, String, Option<i64>)>,
) -> PyResult<Bound<'py, PyList>> {
    if !requester.is_instance_of::<PyDict>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!("requester must be a dict, got {}", requester.repr()?)));
    }
    let requester = to_value(requester, "requester").map_err(|e| pyo3::exceptions::PyTypeError::new_err(e.describe()))?;
    let calls: Vec<_> = calls
        .into_iter()
        .map(|(call_id, name, arguments, expires_at)| crate::agent_loop::foreign_decisions::ForeignCall {
            call_id,
            name,
            arguments,
            expires_at,
        })
        .collect();
    let requests = crate::agent_loop::foreign_decisions::request(&log.get().inner, &requester, &calls).map_err(|e| log_err(py, e))?;
    request_list(py, &requests)
}

/// Resolves the pending requests of `log` past their deadline at `now` (epoch milliseconds;
/// the clock when `None`) as `expired`, as a loop does when it looks (`loop.decisions`' fold);
/// for a process that holds the session without an `AgentLoop` (a framework's loop under
/// `KermanDurability`). Returns how many.
#[pyfunction]
#[pyo3(signature = (log, now=None))]
pub(super) fn expire_decisions(py: Python<'_>, log: &Bound<'_, super::PySessionLog>, now: Option<i64>) -> PyResult<usize> {
    let now = now.unwrap_or_else(crate::event_log::now_ms);
    decisions::expire(&log.get().inner, now).map_err(|e| log_err(py, e))
}

/// Resolves the pending requests of a loop other than Kerman's as `cancelled`: those of
/// `requester` (a dict, as `request_foreign_decisions` took it), or all of them when `None`.
/// Returns how many (`crate::agent_loop::foreign_decisions::cancel`).
#[pyfunction]
#[pyo3(signature = (log, requester=None))]
pub(super) fn cancel_foreign_decisions(
    py: Python<'_>,
    log: &Bound<'_, super::PySessionLog>,
    requester: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let requester = match requester {
        Some(value) if !value.is_instance_of::<PyDict>() => {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!("requester must be a dict, got {}", value.repr()?)))
        }
        Some(value) => Some(to_value(value, "requester").map_err(|e| pyo3::exceptions::PyTypeError::new_err(e.describe()))?),
        None => None,
    };
    crate::agent_loop::foreign_decisions::cancel(&log.get().inner, requester.as_ref()).map_err(|e| log_err(py, e))
}

/// Applies a person's decision (`Approve`, `Deny`, `Edit`, `Answer`) to pending request
/// `decision_id` of `log`, which this process owns without an `AgentLoop` (a framework's loop
/// under `KermanDurability`, answering `PostgresStore.decide`): one `decision/resolved`, as the
/// core's `decide` writes it. Returns what `store.decide` returns (applied, `duplicate`, or
/// refused with `reason` `"unknown"`, `"resolved"`, `"expired"` or `"invalid"`).
#[pyfunction]
#[pyo3(signature = (log, decision_id, outcome, *, by=None, key=None))]
pub(super) fn decide_on_log<'py>(
    py: Python<'py>,
    log: &Bound<'py, super::PySessionLog>,
    decision_id: &str,
    outcome: &Bound<'py, PyAny>,
    by: Option<&str>,
    key: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let decision = decision(outcome)?;
    let log = &log.get().inner;
    let now = crate::event_log::now_ms();
    if let Err(refused) = check_answer(py, log, decision_id, &decision, now) {
        return refused_answer(py, decision_id, &refused);
    }
    decide_answer(py, decision_id, decisions::decide(log, decision_id, decision, by, key, now).map(|d| d.duplicate))
}

/// `PostgresStore.decide` from a process that does not hold session `id`: `stage()` stages the
/// decision for the session's owner and waits for its answer, as for any request. Another
/// framework's request (`foreign_decisions`: no Kerman loop runs its call, so no worker would
/// ever take a staged decision up) is decided in place instead, as `FileStore.decide` does,
/// when no process owns the session (its owner closed it), or when nobody applied the staged
/// one in time (`timeout`: its owner died) and its lease has lapsed: the lease taken (a newer
/// epoch fences a late owner out), the one `decision/resolved` appended, the lease released.
/// A live owner, even one whose lease nobody renews, applies it as before.
#[cfg(feature = "postgres")]
#[allow(clippy::too_many_arguments)] // the store, the session, `decide`'s own arguments and the staging
pub(crate) fn decide_on_store<'py>(
    py: Python<'py>,
    store: &crate::event_log::postgres::PostgresStore,
    id: &str,
    decision_id: &str,
    outcome: &Bound<'py, PyAny>,
    by: Option<&str>,
    key: Option<&str>,
    stage: impl FnOnce() -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    // Whether the request is another framework's takes a read of the whole session: asked only
    // when the decision may be made in place (no owner, or a staged one nobody applied), not
    // before every decision a live owner applies.
    let foreign = || -> PyResult<bool> {
        let events = py.detach(|| store.core().read(id)).map_err(|e| log_err(py, e))?;
        Ok(crate::agent_loop::foreign_decisions::find(&events, decision_id).is_some())
    };
    let owned = py.detach(|| store.sessions(Some(id), &[])).map_err(|e| log_err(py, e))?.iter().any(|s| s.owner.is_some());
    if !owned {
        if !foreign()? {
            return stage();
        }
        if let Some(answer) = decide_in_place(py, store, id, decision_id, outcome, by, key)? {
            return Ok(answer);
        }
    }
    let answer = stage()?;
    let reason = answer.get_item(intern!(py, "reason")).ok().and_then(|r| r.extract::<String>().ok());
    // Not owned here means foreign already (the other requests returned above).
    if reason.as_deref() == Some("timeout") && (!owned || foreign()?) {
        if let Some(decided) = decide_in_place(py, store, id, decision_id, outcome, by, key)? {
            return Ok(decided);
        }
    }
    Ok(answer)
}

/// Decides `decision_id` in session `id` under a lease of its own; `None` when another process
/// holds the session.
#[cfg(feature = "postgres")]
fn decide_in_place<'py>(
    py: Python<'py>,
    store: &crate::event_log::postgres::PostgresStore,
    id: &str,
    decision_id: &str,
    outcome: &Bound<'py, PyAny>,
    by: Option<&str>,
    key: Option<&str>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    use crate::event_log::{LogError, Store};

    let log = match py.detach(|| store.open(id)) {
        Ok(log) => log,
        Err(LogError::Locked { .. }) => return Ok(None),
        Err(e) => return Err(log_err(py, e)),
    };
    let decision = decision(outcome)?;
    let now = crate::event_log::now_ms();
    let result = py.detach(|| decisions::decide(&log, decision_id, decision, by, key, now).map(|d| d.duplicate));
    let closed = py.detach(|| log.close());
    let answer = decide_answer(py, decision_id, result)?;
    closed.map_err(|e| log_err(py, e))?;
    Ok(Some(answer))
}
