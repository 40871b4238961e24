//! `tierkit.kv`: pool sizing, the elastic pool's session lifecycle, the exact CPU resolver.
//!
//! `geometry` (`KvGeometry`), `pool` (`ElasticPool`), `resolved` (`Resolved`, `ResolvePlan`),
//! `dicts` (the dicts pool calls return, shared with the GPU pool).

use pyo3::prelude::*;

use crate::kv_transfer;

mod dicts;
mod geometry;
mod pool;
mod resolved;

pub(crate) use dicts::{admission, maintenance};
pub(crate) use geometry::PyKvGeometry;
pub(crate) use pool::PyElasticPool;
pub(crate) use resolved::{PyResolvePlan, PyResolved};

/// The Python type name of `obj`, for messages.
pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvGeometry>()?;
    m.add_class::<PyElasticPool>()?;
    m.add_class::<PyResolved>()?;
    m.add_class::<PyResolvePlan>()?;
    m.add_class::<kv_transfer::PyRegionHold>()?;
    // `kv.MAX_BLOCK_POSITIONS`: the most positions per block id of `resolve(block_positions=)`.
    m.add("KV_MAX_BLOCK_POSITIONS", kv_elastic::MAX_BLOCK_POSITIONS)?;
    Ok(())
}
