//! `Message`, `UserMessage`, `AssistantMessage`, `ToolResultMessage`: frozen Python views of
//! core messages.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use pyo3::basic::CompareOp;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::PyClassInitializer;
use serde_json::{Map, Value};

use super::convert::{dict_to_map, map_to_py, to_py, to_value};
use super::errors::message_err;
use crate::message::{Message, MessageError, MessageKind};

/// Base class of every message value. Immutable; compares and hashes by value.
#[pyclass(name = "Message", module = "kerman", subclass, frozen)]
pub struct PyMessage {
    pub inner: Arc<Message>,
}

#[pyclass(name = "UserMessage", module = "kerman", extends = PyMessage, frozen)]
pub struct PyUserMessage;

#[pyclass(name = "AssistantMessage", module = "kerman", extends = PyMessage, frozen)]
pub struct PyAssistantMessage;

#[pyclass(name = "ToolResultMessage", module = "kerman", extends = PyMessage, frozen)]
pub struct PyToolResultMessage;

/// Wraps a core message in the Python class of its kind.
pub fn wrap(py: Python<'_>, message: Arc<Message>) -> PyResult<Bound<'_, PyAny>> {
    let kind = message.kind();
    let base = PyClassInitializer::from(PyMessage { inner: message });
    Ok(match kind {
        MessageKind::User => Bound::new(py, base.add_subclass(PyUserMessage))?.into_any(),
        MessageKind::Assistant => Bound::new(py, base.add_subclass(PyAssistantMessage))?.into_any(),
        MessageKind::ToolResult => Bound::new(py, base.add_subclass(PyToolResultMessage))?.into_any(),
    })
}

fn invalid(py: Python<'_>, field: &str, reason: String) -> PyErr {
    message_err(py, MessageError::new(field, reason))
}

/// `content` as given to a constructor: a `str` (one text block) or a list of block dicts.
pub fn content_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    let py = obj.py();
    if obj.is_exact_instance_of::<PyString>() {
        let text = text_arg(obj, "content[0].text")?;
        return Ok(vec![serde_json::json!({"type": "text", "text": text})]);
    }
    match to_value(obj, "content") {
        Ok(Value::Array(items)) => Ok(items),
        Ok(_) => Err(invalid(py, "content", format!("expected a str or a list of blocks, got {}", obj.get_type().name()?))),
        Err(e) => Err(invalid(py, &e.path, e.reason)),
    }
}

/// The message `kind` builds from content that is one text block (a `str`, or a list holding
/// just `{"type": "text", "text": str}` with its keys in that order, as `ModelReply` makes it)
/// and no source, written as JSON text at once (`Message::of_text`, the same bytes as the
/// general path); `None` for any other arguments, which take the general path (and its
/// errors: an empty id, say).
pub fn text_message(
    kind: MessageKind,
    content: &Bound<'_, PyAny>,
    source: Option<&Bound<'_, PyAny>>,
    id: Option<String>,
) -> PyResult<Option<Message>> {
    if source.is_some_and(|s| !s.is_none()) || id.as_deref() == Some("") {
        return Ok(None);
    }
    let text = if content.is_exact_instance_of::<PyString>() {
        content.clone()
    } else {
        match lone_text_block(content) {
            Some(text) => text,
            None => return Ok(None),
        }
    };
    let text = text_arg(&text, "content[0].text")?;
    Ok(Some(Message::of_text(kind, &text, id)))
}

/// The text of content that is one text block (`[{"type": "text", "text": str}]`, exact types,
/// nothing else in the dict, as `ModelReply` makes it from a `str`), when it is valid Unicode.
pub fn lone_text(content: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    match lone_text_block(content) {
        Some(text) => match text.cast::<PyString>().map(|s| s.to_str()) {
            Ok(Ok(text)) => Ok(Some(text.to_owned())),
            _ => Ok(None),
        },
        None => Ok(None),
    }
}

/// The text of `[{"type": "text", "text": str}]` (exact types, nothing else in the dict).
fn lone_text_block<'py>(content: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let list = content.cast_exact::<PyList>().ok()?;
    if list.len() != 1 {
        return None;
    }
    let block = list.get_item(0).ok()?;
    let block = block.cast_exact::<PyDict>().ok()?;
    if block.len() != 2 {
        return None;
    }
    let mut items = block.iter();
    let (k0, v0) = items.next()?;
    let (k1, v1) = items.next()?;
    let is = |obj: &Bound<'py, PyAny>, want: &str| obj.cast_exact::<PyString>().is_ok_and(|s| s.to_str().is_ok_and(|s| s == want));
    (is(&k0, "type") && is(&v0, "text") && is(&k1, "text") && v1.is_exact_instance_of::<PyString>()).then_some(v1)
}

/// The calls of content that is only tool-call blocks, `[{"type": "tool-call", "id": str,
/// "name": str, "arguments": str}, ...]` (exact types, those keys in that order and nothing
/// else, as a provider adapter or `ModelReply` user writes them), as `(id, name, arguments)`;
/// `None` for any other content (empty, other blocks, extra keys, a str subclass, text that is
/// not valid Unicode), which takes the general path and its checks.
pub fn lone_tool_calls(content: &Bound<'_, PyAny>) -> Option<Vec<(String, String, String)>> {
    let list = content.cast_exact::<PyList>().ok()?;
    if list.is_empty() {
        return None;
    }
    let text = |obj: &Bound<'_, PyAny>| obj.cast_exact::<PyString>().ok().and_then(|s| s.to_str().ok().map(str::to_owned));
    let mut calls = Vec::with_capacity(list.len());
    for block in list.iter() {
        let block = block.cast_exact::<PyDict>().ok()?;
        if block.len() != 4 {
            return None;
        }
        let mut items = block.iter();
        let mut field = |key: &str| -> Option<String> {
            let (k, v) = items.next()?;
            (text(&k)? == key).then_some(())?;
            text(&v)
        };
        if field("type")? != "tool-call" {
            return None;
        }
        calls.push((field("id")?, field("name")?, field("arguments")?));
    }
    Some(calls)
}

fn source_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Map<String, Value>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    let py = obj.py();
    let Ok(dict) = obj.cast_exact::<PyDict>() else {
        return Err(invalid(py, "source", format!("expected a dict, got {}", obj.get_type().name()?)));
    };
    dict_to_map(dict, "source").map(Some).map_err(|e| invalid(py, &e.path, e.reason))
}

fn id_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    if !obj.is_exact_instance_of::<PyString>() {
        return Err(invalid(obj.py(), "id", format!("expected a str, got {}", obj.get_type().name()?)));
    }
    text_arg(obj, "id").map(Some)
}

/// A `str` that must be valid Unicode (no lone surrogates) to be stored; `field` names it.
fn text_arg(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| invalid(obj.py(), field, "string is not valid Unicode (lone surrogate)".into()))
}

/// A user message from a `str` or a `UserMessage`; anything else is a `TypeError`.
pub fn user_message_arg(obj: &Bound<'_, PyAny>) -> PyResult<Arc<Message>> {
    if obj.is_exact_instance_of::<PyString>() {
        return Ok(Arc::new(Message::user_text(&text_arg(obj, "content[0].text")?)));
    }
    if let Ok(m) = obj.cast::<PyMessage>() {
        let inner = &m.get().inner;
        if inner.kind() == MessageKind::User {
            return Ok(Arc::clone(inner));
        }
    }
    Err(PyTypeError::new_err(format!("expected a str or a UserMessage, got {}", obj.get_type().name()?)))
}

fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(max - 1).collect();
        s.push('…');
        s
    }
}

fn py_repr(py: Python<'_>, s: &str) -> String {
    PyString::new(py, s).repr().map(|r| r.to_string()).unwrap_or_default()
}

#[pymethods]
impl PyMessage {
    /// The message id (an opaque string; minted ids are UUIDv7).
    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// `"user"` or `"assistant"`.
    #[getter]
    fn role(&self) -> &'static str {
        self.inner.role()
    }

    /// A fresh copy of the content blocks.
    #[getter]
    fn content<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &Value::Array(self.inner.content().to_vec()))
    }

    /// A fresh copy of the source dict.
    #[getter]
    fn source<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        map_to_py(py, self.inner.source())
    }

    /// The text blocks joined with a newline; for a `ToolResultMessage`, those of the result's
    /// content (what the tool returned), not of the `tool-result` block wrapping it.
    #[getter]
    fn text(&self) -> String {
        self.inner.text()
    }

    /// The same message (same id and source) with new content: a rewrite of this message.
    fn with_content<'py>(&self, py: Python<'py>, content: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let content = content_arg(content)?;
        let m = self.inner.with_content(content).map_err(|e| message_err(py, e))?;
        wrap(py, Arc::new(m))
    }

    /// `{"id", "role", "content", "source"}` as fresh Python objects.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner.to_value())
    }

    /// Imports a message dict, keeping its id; returns the class its role and source imply.
    #[staticmethod]
    fn from_dict<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let value = to_value(data, "").map_err(|e| invalid(py, if e.path.is_empty() { "message" } else { &e.path }, e.reason))?;
        let m = Message::from_value(&value).map_err(|e| message_err(py, e))?;
        wrap(py, Arc::new(m))
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyMessage>() else { return Ok(py.NotImplemented()) };
        let equal = *self.inner == *other.get().inner;
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "a hash: any 64 bits will do")]
    fn __hash__(&self) -> isize {
        let mut h = DefaultHasher::new();
        self.inner.hash(&mut h);
        h.finish() as isize
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let py = slf.py();
        let m = &slf.get().inner;
        let cls = slf.get_type().name()?;
        let mut parts = vec![format!("id={}", py_repr(py, m.id()))];
        if m.kind() == MessageKind::ToolResult {
            if let Some(Value::String(call)) = m.source().get("callId") {
                parts.push(format!("call_id={}", py_repr(py, call)));
            }
        }
        let text = m.text();
        if !text.is_empty() || m.content().is_empty() {
            parts.push(format!("text={}", py_repr(py, &short(&text, 60))));
        } else {
            let kinds: Vec<&str> = m.content().iter().filter_map(|b| b.get("type").and_then(Value::as_str)).collect();
            parts.push(format!("content=[{}]", kinds.join(", ")));
        }
        let calls: Vec<String> = m
            .content()
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool-call"))
            .map(|b| py_repr(py, b.get("name").and_then(Value::as_str).unwrap_or("?")))
            .collect();
        if !calls.is_empty() && !text.is_empty() {
            parts.push(format!("tool_calls=[{}]", calls.join(", ")));
        }
        if m.kind() == MessageKind::User && m.source_kind() != "user" {
            parts.push(format!("source={}", map_to_py(py, m.source())?.repr()?));
        }
        Ok(format!("{cls}({})", parts.join(", ")))
    }

    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        super::html::render(slf.as_any(), "message")
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let from_dict = py.get_type::<PyMessage>().getattr("from_dict")?;
        let d = slf.get().to_dict(py)?;
        Ok((from_dict, PyTuple::new(py, [d])?))
    }

    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }
}

#[pymethods]
impl PyUserMessage {
    #[new]
    #[pyo3(signature = (content, source=None, id=None))]
    fn new(
        py: Python<'_>,
        content: &Bound<'_, PyAny>,
        source: Option<&Bound<'_, PyAny>>,
        id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let id = id_arg(id)?;
        let m = match text_message(MessageKind::User, content, source, id.clone())? {
            Some(m) => m,
            None => Message::user(content_arg(content)?, source_arg(source)?, id).map_err(|e| message_err(py, e))?,
        };
        Ok(PyClassInitializer::from(PyMessage { inner: Arc::new(m) }).add_subclass(PyUserMessage))
    }
}

#[pymethods]
impl PyAssistantMessage {
    #[new]
    #[pyo3(signature = (content, source=None, id=None))]
    fn new(
        py: Python<'_>,
        content: &Bound<'_, PyAny>,
        source: Option<&Bound<'_, PyAny>>,
        id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let id = id_arg(id)?;
        let m = match text_message(MessageKind::Assistant, content, source, id.clone())? {
            Some(m) => m,
            None => Message::assistant(content_arg(content)?, source_arg(source)?, id).map_err(|e| message_err(py, e))?,
        };
        Ok(PyClassInitializer::from(PyMessage { inner: Arc::new(m) }).add_subclass(PyAssistantMessage))
    }

    /// The `tool-call` blocks of the content, as fresh dicts.
    #[getter]
    #[allow(clippy::needless_pass_by_value, reason = "pyo3 hands a subclass its receiver as a PyRef, by value")]
    fn tool_calls<'py>(self_: PyRef<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let calls: Vec<Value> = self_
            .as_super()
            .inner
            .content()
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool-call"))
            .cloned()
            .collect();
        to_py(py, &Value::Array(calls))
    }
}

#[pymethods]
impl PyToolResultMessage {
    #[new]
    #[pyo3(signature = (call_id, content, is_error=false, id=None))]
    fn new(
        py: Python<'_>,
        call_id: &Bound<'_, PyAny>,
        content: &Bound<'_, PyAny>,
        is_error: bool,
        id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let Ok(call_id) = call_id.extract::<String>() else {
            return Err(invalid(py, "call_id", "expected a str".into()));
        };
        let m = Message::tool_result(&call_id, content_arg(content)?, is_error, id_arg(id)?).map_err(|e| message_err(py, e))?;
        Ok(PyClassInitializer::from(PyMessage { inner: Arc::new(m) }).add_subclass(PyToolResultMessage))
    }

    /// The id of the tool call this answers.
    #[getter]
    #[allow(clippy::needless_pass_by_value, reason = "pyo3 hands a subclass its receiver as a PyRef, by value")]
    fn call_id(self_: PyRef<'_, Self>) -> String {
        self_.as_super().inner.source().get("callId").and_then(Value::as_str).unwrap_or_default().to_string()
    }

    /// Whether the tool failed.
    #[getter]
    #[allow(clippy::needless_pass_by_value, reason = "pyo3 hands a subclass its receiver as a PyRef, by value")]
    fn is_error(self_: PyRef<'_, Self>) -> bool {
        self_.as_super().inner.content().first().and_then(|b| b.get("isError")).and_then(Value::as_bool).unwrap_or(false)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMessage>()?;
    m.add_class::<PyUserMessage>()?;
    m.add_class::<PyAssistantMessage>()?;
    m.add_class::<PyToolResultMessage>()?;
    Ok(())
}
