//! Reading what Python code returned or raised into the machine's inputs: decisions,
//! requests, replies, chunks, and exceptions as failure dicts.

use std::sync::Arc;

use pyo3::exceptions::{PyException, PyRecursionError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

use super::super::convert::{to_json_text, to_value};
use super::super::errors::not_json;
use super::super::message::{content_arg, PyMessage};
use super::{classes, Parts};
use crate::agent_loop::events::{ASSISTANT_CHUNK, ASSISTANT_MESSAGE, REQUEST_HEADER};
use crate::agent_loop::{Decision, Failure, FailureCode, Finish, Raised, RaisedKind, Reply, ReplyContent, Requested};
use crate::message::Message;

/// `repr(value)`, or a placeholder when even that fails.
pub(super) fn repr(value: &Bound<'_, PyAny>) -> String {
    value.repr().map_or_else(|_| "<unrepresentable value>".to_owned(), |r| r.to_string())
}

/// The `Arc<Message>` of a `UserMessage`, or a new one from a `str`.
fn user_message(value: &Bound<'_, PyAny>) -> PyResult<Option<Arc<Message>>> {
    if let Ok(message) = value.cast::<PyMessage>() {
        if value.is_instance(classes(value.py())?.user_message.bind(value.py()))? {
            return Ok(Some(Arc::clone(&message.get().inner)));
        }
        return Ok(None);
    }
    match value.cast::<PyString>() {
        Ok(text) => Ok(Some(Arc::new(Message::user_text(text.to_str()?)))),
        Err(_) => Ok(None),
    }
}

/// The pre-step decision a waterfall returned, and the Python list of the entered messages
/// (the very objects, so `request.entered` holds them).
pub(super) fn decision<'py>(value: &Bound<'py, PyAny>) -> PyResult<(Decision, Option<Bound<'py, PyList>>)> {
    let py = value.py();
    let c = classes(py)?;
    if value.get_type().is(c.enter.bind(py)) {
        let messages = value.getattr(intern!(py, "messages"))?;
        if let Ok(list) = messages.cast_exact::<PyList>() {
            let user_message = c.user_message.bind(py);
            let mut arcs = Vec::with_capacity(list.len());
            for item in list.iter() {
                // Exactly a UserMessage; anything else takes the general reading below.
                let Some(message) = item.get_type().is(user_message).then(|| item.cast::<PyMessage>().ok()).flatten() else { break };
                arcs.push(Arc::clone(&message.get().inner));
            }
            if arcs.len() == list.len() {
                return Ok((Decision::Enter(arcs), Some(PyList::new(py, list.iter())?)));
            }
        }
    }
    let is_dict = value.is_instance_of::<PyDict>();
    let kind = if is_dict {
        value.call_method1(intern!(py, "get"), ("kind",))?
    } else {
        value.getattr_opt(intern!(py, "kind"))?.unwrap_or_else(|| py.None().into_bound(py))
    };
    if kind.eq(intern!(py, "enter"))? && (is_dict || value.is_instance(c.enter.bind(py))?) {
        let raw = if is_dict { value.call_method1(intern!(py, "get"), ("messages",))? } else { value.getattr(intern!(py, "messages"))? };
        if raw.is_instance_of::<PyList>() || raw.is_instance_of::<PyTuple>() {
            let objects = PyList::empty(py);
            let mut messages = Vec::new();
            for item in raw.try_iter()? {
                let item = item?;
                let Some(message) = user_message(&item)? else { return Ok((Decision::Invalid(repr(value)), None)) };
                if item.is_instance_of::<PyString>() {
                    objects.append(super::super::message::wrap(py, Arc::clone(&message))?)?;
                } else {
                    objects.append(&item)?;
                }
                messages.push(message);
            }
            return Ok((Decision::Enter(messages), Some(objects)));
        }
    } else if kind.eq(intern!(py, "reject"))? && (is_dict || value.is_instance(c.reject.bind(py))?) {
        let reason = if is_dict { value.call_method1(intern!(py, "get"), ("reason",))? } else { value.getattr(intern!(py, "reason"))? };
        if reason.is_none() {
            return Ok((Decision::Reject(None), None));
        }
        if let Ok(text) = reason.cast::<PyString>() {
            return Ok((Decision::Reject(Some(text.to_str()?.to_owned())), None));
        }
    }
    Ok((Decision::Invalid(repr(value)), None))
}

/// The request `before_request` left: its options' canonical text, their JSON text when a
/// header is due (`header_due`), and its instructions.
pub(super) fn request(value: &Bound<'_, PyAny>, header_due: impl FnOnce(&str, Option<&str>) -> bool) -> PyResult<Requested> {
    let py = value.py();
    if !value.is_instance(classes(py)?.model_request.bind(py))? {
        return Ok(Requested::NotARequest(repr(value)));
    }
    let instructions = value.getattr(intern!(py, "instructions"))?;
    let instructions = if instructions.is_none() {
        None
    } else if let Ok(text) = instructions.cast::<PyString>() {
        Some(text.to_str()?.to_owned())
    } else {
        return Ok(Requested::BadInstructions(instructions.get_type().name()?.to_string()));
    };
    let options = value.getattr(intern!(py, "options"))?;
    // The common request has no options: no canonicalising, no serialising.
    let empty = options.cast_exact::<PyDict>().is_ok_and(pyo3::types::PyDictMethods::is_empty);
    // Options the converter takes are compared by the core's canonical text; any others by
    // `json.dumps(options, sort_keys=True, separators=(",", ":"), allow_nan=False)`, the same
    // text for the same value, which refuses what is not JSON at all (NaN, a set) and takes
    // what is JSON but not lossless (a tuple, a subclass), refused only when it is logged.
    let (canonical, converted) = if empty {
        ("{}".to_owned(), None)
    } else if let Ok(converted) = to_value(&options, "data.options") {
        (crate::json::canonical(&converted), Some(converted))
    } else {
        let c = classes(py)?;
        match c.json_dumps.bind(py).call((&options,), Some(c.canonical.bind(py))) {
            Ok(text) => (text.extract::<String>()?, None),
            Err(e) => return Ok(Requested::NotJson(e.value(py).to_string())),
        }
    };
    let options = if !header_due(&canonical, instructions.as_deref()) {
        Ok(String::new())
    } else if empty {
        Ok("{}".to_owned())
    } else if let Some(converted) = converted {
        Ok(crate::json::compact(&converted))
    } else {
        to_json_text(&options, "data.options")
            .map_err(|e| crate::event_log::LogError::NotJson { event_type: REQUEST_HEADER.into(), detail: e.describe() })
    };
    Ok(Requested::Request { options, canonical, instructions })
}

/// A model's complete reply and the failed attempts it came after (`Ok(None)`: not a reply).
pub(super) fn reply(value: &Bound<'_, PyAny>) -> PyResult<Option<(Reply, Vec<Value>)>> {
    let py = value.py();
    let c = classes(py)?;
    let reply = if value.is_instance_of::<PyString>() { c.model_reply.bind(py).call1((value,))? } else { value.clone() };
    if !reply.is_instance(c.model_reply.bind(py))? {
        return Ok(None);
    }
    let content = reply.getattr(intern!(py, "content"))?;
    let content = match super::super::message::lone_text(&content)? {
        Some(text) => ReplyContent::Text(text),
        None => match super::super::message::lone_tool_calls(&content) {
            Some(calls) => ReplyContent::Calls(calls),
            None => ReplyContent::Blocks(content_arg(&content)?),
        },
    };
    let usage = reply.getattr(intern!(py, "usage"))?;
    let usage = if usage.is_none() {
        None
    } else {
        Some(to_json_text(&usage, "data.usage").map_err(|e| not_json(py, ASSISTANT_MESSAGE, e.describe()))?)
    };
    let finish = reply.getattr(intern!(py, "finish"))?;
    let finish = finish.cast::<PyString>().ok().and_then(|text| text.to_str().ok().and_then(Finish::parse));
    let max_tokens = finish == Some(Finish::MaxTokens);
    Ok(Some((Reply { content, usage, max_tokens }, failed_attempts(&reply)?)))
}

/// The failed `finish` chunks of the attempts a model's outcome came after: a reply's or an
/// exception's `failed_attempts` (a non-streaming `Fallback` sets it; empty for anything else).
/// The machine checks each is a failed `finish`.
pub(super) fn failed_attempts(outcome: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    let py = outcome.py();
    let Some(failed) = outcome.getattr_opt(intern!(py, "failed_attempts"))? else { return Ok(Vec::new()) };
    if failed.is_none() || !failed.is_truthy()? {
        return Ok(Vec::new());
    }
    let mut chunks = Vec::new();
    for (index, chunk) in failed.try_iter()?.enumerate() {
        chunks.push(to_value(&chunk?, &format!("failed_attempts[{index}]")).map_err(|e| not_json(py, ASSISTANT_CHUNK, e.describe()))?);
    }
    Ok(chunks)
}

/// One stream chunk (`Ok(None)`: not a chunk dict, a dict with a str `type`).
pub(super) fn chunk(value: &Bound<'_, PyAny>) -> PyResult<Option<Map<String, Value>>> {
    let py = value.py();
    let Ok(dict) = value.cast::<PyDict>() else { return Ok(None) };
    if !dict.call_method1(intern!(py, "get"), ("type",))?.is_instance_of::<PyString>() {
        return Ok(None);
    }
    match to_value(value, "data.chunk") {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Ok(None),
        Err(e) => Err(not_json(py, ASSISTANT_CHUNK, e.describe())),
    }
}

/// Whether a `request_error` action asks for a retry.
pub(super) fn is_retry(action: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = action.py();
    Ok(action.is_instance(classes(py)?.retry.bind(py))?
        || (action.is_instance_of::<PyDict>()
            && action.call_method1(intern!(py, "get"), (intern!(py, "kind"),))?.eq(intern!(py, "retry"))?))
}

// ---- exceptions -------------------------------------------------------------------------------

/// The exception's message (or class name), then its cause chain.
pub(super) fn error_chain(exc: &Bound<'_, PyAny>) -> String {
    let py = exc.py();
    let mut parts: Vec<String> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    let mut current = Some(exc.clone());
    while let Some(e) = current.filter(|e| !e.is_none()) {
        let addr = e.as_ptr() as usize;
        if seen.contains(&addr) {
            break;
        }
        seen.push(addr);
        let text = match e.str() {
            Ok(s) if !s.to_string_lossy().is_empty() => s.to_string_lossy().into_owned(),
            Ok(_) => e.get_type().name().map(|n| n.to_string()).unwrap_or_default(),
            Err(_) => "<unrenderable value>".to_owned(),
        };
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        current = e.getattr(intern!(py, "__cause__")).ok();
    }
    parts.join(": ")
}

/// A value as JSON, or its `str` when it is not JSON (a failure must always be loggable).
fn json_or_str(value: &Bound<'_, PyAny>) -> Value {
    to_value(value, "failure").unwrap_or_else(|_| Value::String(value.str().map(|s| s.to_string()).unwrap_or_default()))
}

/// `describe(exc, function, typed)`: the report fields of an exception raised in user code.
pub(super) fn describe(parts: &Parts, exc: &Bound<'_, PyAny>, function: Option<&str>, typed: bool) -> PyResult<Map<String, Value>> {
    let py = exc.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "typed"), typed)?;
    let described = parts.describe.bind(py).call((exc, function), Some(&kwargs))?;
    match to_value(&described, "failure") {
        Ok(Value::Object(map)) => Ok(map),
        _ => Ok(Map::new()),
    }
}

/// The failure dict of an exception (what `turn/end {kind: "error"}` carries): a
/// `ModelError`'s message, code and details, or any other exception's message chain with code
/// `UNKNOWN`; then its report fields.
pub(super) fn failure_of(parts: &Parts, exc: &Bound<'_, PyAny>) -> PyResult<Failure> {
    let py = exc.py();
    let mut failure;
    if exc.is_instance(classes(py)?.model_error.bind(py))? {
        let message = exc.getattr(intern!(py, "message"))?;
        let message = if message.is_truthy()? { json_or_str(&message) } else { Value::String(exc.get_type().name()?.to_string()) };
        failure = Failure::raised(message, json_or_str(&exc.getattr(intern!(py, "code"))?));
        for (key, attr) in [("status", "status"), ("retryAfterMs", "retry_after_ms"), ("requestId", "request_id")] {
            let value = exc.getattr(attr)?;
            if !value.is_none() {
                failure.insert(key, json_or_str(&value));
            }
        }
    } else {
        failure = Failure::new(FailureCode::Unknown, error_chain(exc));
    }
    failure.extend(describe(parts, exc, None, true)?);
    Ok(failure)
}

/// How an exception out of host code reads to the machine, and whether it propagates out of
/// the driver once the run ends.
pub(super) fn raised(parts: &Parts, py: Python<'_>, err: &PyErr) -> PyResult<(Raised, bool)> {
    let c = classes(py)?;
    let exc = &exception(py, err);
    if err.is_instance(py, c.cancelled_error.bind(py)) {
        return Ok((Raised::bare(RaisedKind::Cancelled), true));
    }
    if exc.is_instance(c.lease_lost.bind(py))? {
        // The machine reports it with its own code (FENCED); only the message is read.
        return Ok((Raised::new(RaisedKind::LeaseLost, Failure::new(FailureCode::Fenced, error_chain(exc))), false));
    }
    let fatal = !err.is_instance_of::<PyException>(py);
    let kind = if fatal { RaisedKind::Fatal } else { RaisedKind::Error };
    Ok((Raised::new(kind, failure_of(parts, exc)?), fatal))
}

/// The exception of `err` with its traceback attached (`__traceback__`): before Python 3.12 a
/// fetched error keeps its traceback beside the value, and a report of a user's bug without it
/// would not say where the bug is.
pub(super) fn exception<'py>(py: Python<'py>, err: &PyErr) -> Bound<'py, PyAny> {
    err.clone_ref(py).into_value(py).into_bound(py).into_any()
}

/// Whether `err` is a `ModelError`.
pub(super) fn is_model_error(py: Python<'_>, err: &PyErr) -> PyResult<bool> {
    err.value(py).is_instance(classes(py)?.model_error.bind(py))
}

// ---- tool arguments ---------------------------------------------------------------------------

/// `json.JSONDecoder(parse_constant=...)` refusing `NaN` and the infinities: one decoder for
/// every call (`json.loads` with a keyword builds a new one each time).
pub(super) fn arguments_decoder(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let reject = PyCFunction::new_closure(py, Some(c"reject_constant"), None, |args, _kwargs| -> PyResult<Py<PyAny>> {
        let name: String = args.get_item(0)?.extract()?;
        Err(PyValueError::new_err(format!("{name} is not valid JSON")))
    })?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("parse_constant", reject)?;
    py.import("json")?.getattr("JSONDecoder")?.call((), Some(&kwargs))
}

/// How deep tool arguments may nest: about what Python's own decoder manages under its default
/// recursion limit before 3.13, now the same on every version.
const MAX_ARGUMENT_DEPTH: usize = 1000;

/// The arguments' JSON text as Python values. `Err(detail)` for anything that is not JSON the
/// tool can receive, valid JSON nested deeper than the interpreter can decode included (an
/// `INVALID_ARGUMENTS` result, never a failed turn).
pub(super) fn decode_arguments<'py>(py: Python<'py>, text: &Bound<'py, PyString>) -> PyResult<Result<Bound<'py, PyAny>, String>> {
    if crate::json::nests_deeper_than(&text.to_cow()?, MAX_ARGUMENT_DEPTH) {
        return Ok(Err(format!("nested too deeply to decode (more than {MAX_ARGUMENT_DEPTH} levels of arrays and objects)")));
    }
    let decoder = classes(py)?.json_decoder.bind(py);
    match decoder.call_method1(intern!(py, "decode"), (text,)) {
        Ok(value) => Ok(Ok(value)),
        Err(e) if e.is_instance_of::<PyRecursionError>(py) => {
            let limit = classes(py)?.recursion_limit.bind(py).call0()?;
            Ok(Err(format!("nested too deeply to decode ({} characters; Python's recursion limit is {limit})", text.len()?)))
        }
        Err(e) if e.is_instance_of::<PyValueError>(py) => Ok(Err(e.value(py).to_string())),
        Err(e) => Err(e),
    }
}
