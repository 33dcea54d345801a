//! Python values <-> JSON, losslessly: only exact `None`, `bool`, `int` (64-bit), finite
//! `float`, `str`, `list` and `dict` with `str` keys pass. Anything else (tuples, sets, NaN,
//! objects, subclasses) is refused with the path of the offending part, because it would not
//! come back as the same value.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde_json::{Map, Number, Value};

/// Why a Python value is not lossless JSON, and where (`content[0].text`).
pub struct NotJson {
    pub path: String,
    pub reason: String,
}

impl NotJson {
    fn at(path: &str, reason: String) -> Self {
        NotJson { path: path.to_string(), reason }
    }

    /// `"<path>: <reason>"`, or just the reason at the root.
    pub fn describe(&self) -> String {
        if self.path.is_empty() {
            self.reason.clone()
        } else {
            format!("{}: {}", self.path, self.reason)
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}

/// Converts `obj` to a JSON value; `path` names it in errors.
pub fn to_value(obj: &Bound<'_, PyAny>, path: &str) -> Result<Value, NotJson> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if obj.is_exact_instance_of::<PyString>() {
        let s = obj.extract::<String>().map_err(|_| NotJson::at(path, "string is not valid Unicode (lone surrogate)".into()))?;
        return Ok(Value::String(s));
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.is_truthy().unwrap_or(false)));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        return Err(NotJson::at(path, "integer out of the 64-bit range is not lossless JSON (use a string)".into()));
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        let f: f64 = obj.extract().unwrap_or(f64::NAN);
        return Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| NotJson::at(path, format!("{} is not lossless JSON", float_repr(f))));
    }
    if let Ok(list) = obj.cast_exact::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(to_value(&item, &format!("{path}[{i}]"))?);
        }
        return Ok(Value::Array(out));
    }
    if let Ok(dict) = obj.cast_exact::<PyDict>() {
        return dict_to_map(dict, path).map(Value::Object);
    }
    let what = type_name(obj);
    let hint = match what.as_str() {
        "tuple" => " (use a list)",
        "set" | "frozenset" => " (use a list)",
        _ => "",
    };
    Err(NotJson::at(path, format!("{what} is not lossless JSON{hint}")))
}

/// Converts an exact `dict` with `str` keys.
pub fn dict_to_map(dict: &Bound<'_, PyDict>, path: &str) -> Result<Map<String, Value>, NotJson> {
    let mut out = Map::with_capacity(dict.len());
    for (key, value) in dict.iter() {
        if !key.is_exact_instance_of::<PyString>() {
            return Err(NotJson::at(path, format!("key {} of type {} is not a str", repr(&key), type_name(&key))));
        }
        let key: String = key.extract().map_err(|_| NotJson::at(path, "key is not valid Unicode".into()))?;
        let here = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        let value = to_value(&value, &here)?;
        out.insert(key, value);
    }
    Ok(out)
}

fn float_repr(f: f64) -> &'static str {
    if f.is_nan() {
        "NaN"
    } else if f > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
}

/// Converts a JSON value to fresh Python objects.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
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
    let value: Value = serde_json::from_str(text)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("invalid JSON: {e}")))?;
    to_py(py, &value)
}
