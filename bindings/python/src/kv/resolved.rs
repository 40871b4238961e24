//! `tierkit.kv.Resolved` and `ResolvePlan`: one resolve's result and the copies it made.

use std::sync::Mutex;

use kv_elastic::{ReadTicket, ResolvePlan};
use pyo3::prelude::*;

/// The copies one resolve or prefetch made (the deduplicated miss list), already in every layer of
/// its layer group (`group`); `ElasticPool.replay` copies them again into one layer of that group.
#[pyclass(name = "ResolvePlan", module = "tierkit.kv", frozen)]
pub(crate) struct PyResolvePlan(pub(super) ResolvePlan);

#[pymethods]
impl PyResolvePlan {
    fn __len__(&self) -> usize {
        self.0.copies.len()
    }
    /// The copies as `(session, position, dst_row)` tuples.
    fn copies(&self) -> Vec<(u64, u32, u32)> {
        self.0
            .copies
            .iter()
            .map(|c| (c.session, c.position, c.dst_row))
            .collect()
    }
    /// The layer group whose hot rows the copies filled.
    #[getter]
    fn group(&self) -> u32 {
        self.0.group
    }
    fn __repr__(&self) -> String {
        format!(
            "ResolvePlan({} copies, group {})",
            self.0.copies.len(),
            self.0.group
        )
    }
}

/// One resolve's result: `indices` (`int32 [rows, k]`, or the caller's array), `valid_count`
/// (`int32 [rows]`), `stats` (a dict), `plan` (the misses fetched, into every layer of the
/// resolved layer's group). The
/// rows stay valid (their pages are not reused) until `complete()` (or the end of a `with`
/// block, or garbage collection): call it once the attention that reads them is done.
#[pyclass(name = "Resolved", module = "tierkit.kv", frozen)]
pub(crate) struct PyResolved {
    #[pyo3(get)]
    pub(super) indices: Py<PyAny>,
    #[pyo3(get)]
    pub(super) valid_count: Py<PyAny>,
    #[pyo3(get)]
    pub(super) stats: Py<PyAny>,
    #[pyo3(get)]
    pub(super) plan: Py<PyResolvePlan>,
    pub(super) ticket: Mutex<Option<ReadTicket>>,
}

#[pymethods]
impl PyResolved {
    /// Ends the read: the rows' pages may be reused from now on (idempotent).
    fn complete(&self) {
        let t = self.ticket.lock().ok().and_then(|mut g| g.take());
        drop(t);
    }
    /// Whether `complete()` was called.
    #[getter]
    fn completed(&self) -> bool {
        self.ticket.lock().map(|g| g.is_none()).unwrap_or(true)
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.complete()
    }
    /// `indices, valid_count, stats = pool.resolve(...)` also works.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let t = (
            self.indices.clone_ref(py),
            self.valid_count.clone_ref(py),
            self.stats.clone_ref(py),
        );
        t.into_pyobject(py)?
            .into_any()
            .try_iter()
            .map(|i| i.into_any())
    }
}
