//! The request options' canonical JSON, compared between requests to decide whether a
//! `request/header` is due: `json.dumps(options, sort_keys=True, separators=(",", ":"),
//! allow_nan=False)`, written here for plain JSON values and left to `json.dumps` otherwise
//! (subclasses, non-str keys, tuples, non-finite floats, lone surrogates, deep nesting), so both
//! paths give the same string for the same value.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

use super::classes;

/// Deeper values go to `json.dumps` (which also detects cycles).
const MAX_DEPTH: usize = 32;

/// The canonical JSON text of `value`.
pub(super) fn canonical<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    let mut out = String::new();
    if write(value, &mut out, 0)? {
        return Ok(PyString::new(py, &out).into_any());
    }
    let h = classes(py)?;
    h.json_dumps.bind(py).call((value,), Some(h.canonical.bind(py)))
}

/// Writes `value`; `Ok(false)` when it is not a plain JSON value this writer handles.
fn write(value: &Bound<'_, PyAny>, out: &mut String, depth: usize) -> PyResult<bool> {
    if depth > MAX_DEPTH {
        return Ok(false);
    }
    if value.is_none() {
        out.push_str("null");
    } else if let Ok(b) = value.cast_exact::<PyBool>() {
        out.push_str(if b.is_true() { "true" } else { "false" });
    } else if let Ok(s) = value.cast_exact::<PyString>() {
        let Ok(s) = s.to_str() else { return Ok(false) };
        write_str(s, out);
    } else if value.is_exact_instance_of::<PyInt>() {
        out.push_str(value.str()?.to_str()?);
    } else if let Ok(f) = value.cast_exact::<PyFloat>() {
        if !f.value().is_finite() {
            return Ok(false);
        }
        out.push_str(value.repr()?.to_str()?);
    } else if let Ok(list) = value.cast_exact::<PyList>() {
        out.push('[');
        for (i, item) in list.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if !write(&item, out, depth + 1)? {
                return Ok(false);
            }
        }
        out.push(']');
    } else if let Ok(dict) = value.cast_exact::<PyDict>() {
        let mut items = Vec::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            let Ok(k) = k.cast_exact::<PyString>() else { return Ok(false) };
            let Ok(key) = k.to_str() else { return Ok(false) };
            items.push((key.to_owned(), v));
        }
        items.sort_by(|a, b| a.0.cmp(&b.0));
        out.push('{');
        for (i, (k, v)) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_str(k, out);
            out.push(':');
            if !write(v, out, depth + 1)? {
                return Ok(false);
            }
        }
        out.push('}');
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// A JSON string as `json.dumps` writes it with `ensure_ascii=True`.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}
