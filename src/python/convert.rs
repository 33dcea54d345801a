//! Python values <-> JSON, losslessly: only exact `None`, `bool`, `int`, `float`, `str`, `list`
//! and `dict` with `str` keys pass, numbers as the core's number policy says
//! ([`crate::json::number`]: 64-bit integers, finite floats). Anything else (tuples, sets, NaN,
//! objects, subclasses) is refused with the path of the offending part, because it would not
//! come back as the same value.

use std::fmt::Write as _;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde_json::{Map, Number, Value};

use crate::json::number::{self, Num, NumberError};

/// Why a Python value is not lossless JSON, and where (`content[0].text`).
pub struct NotJson {
    pub path: String,
    pub reason: String,
}

impl NotJson {
    /// `"<path>: <reason>"`, or just the reason at the root.
    pub fn describe(&self) -> String {
        if self.path.is_empty() {
            self.reason.clone()
        } else {
            format!("{}: {}", self.path, self.reason)
        }
    }
}

/// A failure on its way out of the recursion: path segments are collected innermost first
/// while unwinding, so the success path never formats a path.
struct Failure {
    segments: Vec<Segment>,
    reason: String,
}

enum Segment {
    Index(usize),
    Key(String),
}

impl Failure {
    fn new(reason: String) -> Self {
        Failure { segments: Vec::new(), reason }
    }

    fn at(mut self, segment: Segment) -> Self {
        self.segments.push(segment);
        self
    }

    fn into_not_json(self, root: &str) -> NotJson {
        let mut path = root.to_string();
        for segment in self.segments.into_iter().rev() {
            match segment {
                Segment::Index(i) => {
                    let _ = write!(path, "[{i}]");
                }
                Segment::Key(k) if path.is_empty() => path.push_str(&k),
                Segment::Key(k) => {
                    path.push('.');
                    path.push_str(&k);
                }
            }
        }
        NotJson { path, reason: self.reason }
    }
}

/// How deep lists and dicts may nest in event data and message content. The log's reader parses
/// records with `serde_json`'s recursion limit of 128, and the envelope around a payload adds at
/// most six levels (record, data, inserted, message, content, tool-result block), so anything
/// accepted here reads back. It also turns cyclic data into a clear error instead of a stack
/// overflow.
pub const MAX_DEPTH: usize = 100;

fn too_deep() -> Failure {
    Failure::new(format!("nested deeper than {MAX_DEPTH} levels (the limit for event data and message content)"))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "object".into(), |n| n.to_string())
}

/// An exact `int` as a JSON number, if the number policy has it as one (the common 64-bit
/// signed case extracted first, as the cheapest).
fn int_number(obj: &Bound<'_, PyAny>) -> Result<Number, Failure> {
    let n = match obj.extract::<i64>() {
        Ok(i) => i128::from(i),
        // Beyond 128 bits is beyond the policy's range too.
        Err(_) => obj.extract::<i128>().map_err(|_| Failure::new(NumberError::IntegerRange.to_string()))?,
    };
    number::integer(n).map_err(|e| Failure::new(e.to_string()))
}

/// An exact `float` as a JSON number, if the number policy has it as one.
fn float_number(obj: &Bound<'_, PyAny>) -> Result<Number, Failure> {
    number::float(obj.extract().unwrap_or(f64::NAN)).map_err(|e| Failure::new(e.to_string()))
}

/// Converts `obj` to a JSON value; `path` names it in errors.
pub fn to_value(obj: &Bound<'_, PyAny>, path: &str) -> Result<Value, NotJson> {
    value(obj, 0).map_err(|f| f.into_not_json(path))
}

fn value(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, Failure> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast_exact::<PyString>() {
        let s = s.to_str().map_err(|_| Failure::new("string is not valid Unicode (lone surrogate)".into()))?;
        return Ok(Value::String(s.to_owned()));
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.is_truthy().unwrap_or(false)));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        return int_number(obj).map(Value::Number);
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        return float_number(obj).map(Value::Number);
    }
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if depth >= MAX_DEPTH {
            return Err(too_deep());
        }
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(value(&item, depth + 1).map_err(|f| f.at(Segment::Index(i)))?);
        }
        return Ok(Value::Array(out));
    }
    if let Ok(dict) = obj.cast_exact::<PyDict>() {
        if depth >= MAX_DEPTH {
            return Err(too_deep());
        }
        return map(dict, depth + 1).map(Value::Object);
    }
    let what = type_name(obj);
    let hint = match what.as_str() {
        "tuple" | "set" | "frozenset" => " (use a list)",
        _ => "",
    };
    Err(Failure::new(format!("{what} is not lossless JSON{hint}")))
}

/// Converts `obj` straight to compact JSON text (what `json::compact(&to_value(..))` gives,
/// without building the tree); `path` names it in errors, which are the same as `to_value`'s.
pub fn to_json_text(obj: &Bound<'_, PyAny>, path: &str) -> Result<String, NotJson> {
    let mut out = Vec::with_capacity(128);
    write_value(obj, &mut out, 0).map_err(|f| f.into_not_json(path))?;
    // Only UTF-8 was written: `str` parts come from `to_str`, the rest is ASCII.
    String::from_utf8(out).map_err(|_| NotJson { path: path.to_string(), reason: "string is not valid Unicode".into() })
}

fn write_dict(dict: &Bound<'_, PyDict>, out: &mut Vec<u8>, depth: usize) -> Result<(), Failure> {
    out.push(b'{');
    for (i, (key, item)) in dict.iter().enumerate() {
        let Ok(key) = key.cast_exact::<PyString>() else {
            return Err(Failure::new(format!("key {} of type {} is not a str", repr(&key), type_name(&key))));
        };
        let key = key.to_str().map_err(|_| Failure::new("key is not valid Unicode".into()))?;
        if i > 0 {
            out.push(b',');
        }
        write_scalar(key, out);
        out.push(b':');
        write_value(&item, out, depth + 1).map_err(|f| f.at(Segment::Key(key.to_owned())))?;
    }
    out.push(b'}');
    Ok(())
}

/// A JSON scalar as `serde_json` writes it (escaping, integer and float formatting).
fn write_scalar<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Writing a string or a finite number to a `Vec` cannot fail.
    let _ = serde_json::to_writer(out, value);
}

fn write_value(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> Result<(), Failure> {
    if obj.is_none() {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    if let Ok(s) = obj.cast_exact::<PyString>() {
        let s = s.to_str().map_err(|_| Failure::new("string is not valid Unicode (lone surrogate)".into()))?;
        write_scalar(s, out);
        return Ok(());
    }
    if obj.is_exact_instance_of::<PyBool>() {
        out.extend_from_slice(if obj.is_truthy().unwrap_or(false) { b"true" } else { b"false" });
        return Ok(());
    }
    if obj.is_exact_instance_of::<PyInt>() {
        write_scalar(&int_number(obj)?, out);
        return Ok(());
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        write_scalar(&float_number(obj)?, out);
        return Ok(());
    }
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if depth >= MAX_DEPTH {
            return Err(too_deep());
        }
        out.push(b'[');
        for (i, item) in list.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_value(&item, out, depth + 1).map_err(|f| f.at(Segment::Index(i)))?;
        }
        out.push(b']');
        return Ok(());
    }
    if let Ok(dict) = obj.cast_exact::<PyDict>() {
        if depth >= MAX_DEPTH {
            return Err(too_deep());
        }
        return write_dict(dict, out, depth);
    }
    let what = type_name(obj);
    let hint = match what.as_str() {
        "tuple" | "set" | "frozenset" => " (use a list)",
        _ => "",
    };
    Err(Failure::new(format!("{what} is not lossless JSON{hint}")))
}

/// Converts an exact `dict` with `str` keys.
pub fn dict_to_map(dict: &Bound<'_, PyDict>, path: &str) -> Result<Map<String, Value>, NotJson> {
    map(dict, 1).map_err(|f| f.into_not_json(path))
}

fn map(dict: &Bound<'_, PyDict>, depth: usize) -> Result<Map<String, Value>, Failure> {
    let mut out = Map::with_capacity(dict.len());
    for (key, item) in dict.iter() {
        let Ok(key) = key.cast_exact::<PyString>() else {
            return Err(Failure::new(format!("key {} of type {} is not a str", repr(&key), type_name(&key))));
        };
        let key = key.to_str().map_err(|_| Failure::new("key is not valid Unicode".into()))?;
        let item = value(&item, depth).map_err(|f| f.at(Segment::Key(key.to_owned())))?;
        out.insert(key.to_owned(), item);
    }
    Ok(out)
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map_or_else(|_| "?".into(), |r| r.to_string())
}

/// Converts a JSON value to fresh Python objects.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match Num::of(n) {
            Num::Int(i) => i.into_pyobject(py)?.into_any(),
            Num::UInt(u) => u.into_pyobject(py)?.into_any(),
            Num::Float(f) => f.into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => map_to_py(py, map)?.into_any(),
    })
}

pub fn map_to_py<'py>(py: Python<'py>, map: &Map<String, Value>) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (k, v) in map {
        dict.set_item(k, to_py(py, v)?)?;
    }
    Ok(dict)
}

/// Parses JSON text (known valid: it came from the log) into Python objects.
pub fn json_to_py<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    let value: Value = serde_json::from_str(text).map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("invalid JSON: {e}")))?;
    to_py(py, &value)
}
