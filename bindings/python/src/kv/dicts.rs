//! The dicts the pools' calls return (`between_steps`, `admit`), for the CPU and GPU pools.

use kv_elastic::Admission;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// What `between_steps` did, as `{"handed_back", "collected", "grown"}`.
pub(crate) fn maintenance<'py>(
    py: Python<'py>,
    m: kv_elastic::StepMaintenance,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("handed_back", m.handed_back)?;
    d.set_item("collected", m.collected)?;
    d.set_item("grown", m.grown)?;
    d.set_item("imports_expired", m.imports_expired)?;
    Ok(d)
}

pub(crate) fn admission<'py>(py: Python<'py>, a: Admission) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match a {
        Admission::Admitted { borrowed_pages } => {
            d.set_item("admitted", true)?;
            d.set_item("borrowed_pages", borrowed_pages)?;
        }
        Admission::Waiting { pending } => {
            d.set_item("admitted", false)?;
            d.set_item("pending", pending)?;
        }
    }
    Ok(d)
}
