//! `_repr_html_` for the native classes: the HTML is built by one small Python module,
//! `kerman._html`, shared with the Python classes (`AgentLoop`), so escaping and the bounds on
//! what is shown are written once. Display only: nothing here runs on a hot path.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static HTML: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// `kerman._html.<name>(obj)`: the HTML view of `obj`.
pub fn render(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    let py = obj.py();
    let module = HTML.get_or_try_init(py, || py.import("kerman._html").map(Bound::unbind))?;
    module.bind(py).getattr(name)?.call1((obj,))?.extract()
}
