//! `tierkit.kv.KvGeometry`: the pool's geometry, sized directly or from an HBM budget.

use kv_elastic::{Geometry, LayerGroups};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::type_name;
use crate::ints::{int_arg, int_args};
use crate::{guard, kv_err};

/// `layer_groups` as Python gives it: `None` or `"per_layer"` (every layer its own group, the
/// default), `"one"` (one group of every layer), an `int` n (groups of n layers) or a sequence of
/// group sizes summing to `layers`.
fn layer_groups_arg(arg: Option<&Bound<'_, PyAny>>) -> PyResult<LayerGroups> {
    let Some(a) = arg.filter(|a| !a.is_none()) else {
        return Ok(LayerGroups::per_layer());
    };
    let groups = if let Ok(name) = a.extract::<String>() {
        match name.as_str() {
            "per_layer" => Ok(LayerGroups::per_layer()),
            "one" => Ok(LayerGroups::one()),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "layer_groups: unknown name {name:?} (\"per_layer\" or \"one\")"
                )))
            }
        }
    } else if a.is_instance_of::<pyo3::types::PyInt>() {
        LayerGroups::every(int_arg::<u32>(a, "layer_groups")?)
    } else if a.is_instance_of::<pyo3::types::PyBool>()
        || a.is_instance_of::<pyo3::types::PyBytes>()
        || a.is_instance_of::<pyo3::types::PyByteArray>()
        || a.is_instance_of::<PyDict>()
        || a.is_instance_of::<pyo3::types::PySet>()
        || a.is_instance_of::<pyo3::types::PyFrozenSet>()
    {
        // A bool is no group size, and these iterate as something else than group sizes in
        // layer order (bytes as ints, a dict as its keys, a set in hash order).
        return Err(PyTypeError::new_err(format!(
            "layer_groups must be None, \"per_layer\", \"one\", an int (layers per group) or a \
             list of group sizes, not {}",
            type_name(a)
        )));
    } else if let Ok(seq) = a.try_iter() {
        let mut sizes = Vec::new();
        for item in seq {
            if sizes.len() == kv_elastic::MAX_LAYERS as usize {
                return Err(PyValueError::new_err(
                    "layer_groups: more groups than MAX_LAYERS (4096)",
                ));
            }
            let i = sizes.len();
            sizes.push(int_arg::<u32>(&item?, &format!("layer_groups[{i}]"))?);
        }
        LayerGroups::from_sizes(&sizes)
    } else {
        return Err(PyTypeError::new_err(
            "layer_groups must be None, \"per_layer\", \"one\", an int (layers per group) or a sequence of group sizes",
        ));
    };
    groups.map_err(kv_err)
}

/// The pool's arena shape. Build it with `Geometry.for_hbm_budget(...)` (or the constructor,
/// which validates the fields). `layer_groups` says which layers share one indexer's picks (one
/// hot cache per group; a resolve at a layer fills every layer of its group): `None` /
/// `"per_layer"` (default: every layer its own, as DeepSeek-V3.2's per-layer indexers),
/// `"one"`, an `int` n (groups of n layers) or a list of group sizes.
#[pyclass(name = "KvGeometry", module = "tierkit.kv", frozen, eq)]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyKvGeometry(pub(crate) Geometry);

#[pymethods]
impl PyKvGeometry {
    #[new]
    #[pyo3(
        signature = (row_bytes, layers, page_rows, arena_pages, hot_rows, tail_rows, scratch_rows = None, layer_groups = None),
        text_signature = "(row_bytes, layers, page_rows, arena_pages, hot_rows, tail_rows, scratch_rows=0, layer_groups=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        row_bytes: &Bound<'_, PyAny>,
        layers: &Bound<'_, PyAny>,
        page_rows: &Bound<'_, PyAny>,
        arena_pages: &Bound<'_, PyAny>,
        hot_rows: &Bound<'_, PyAny>,
        tail_rows: &Bound<'_, PyAny>,
        scratch_rows: Option<&Bound<'_, PyAny>>,
        layer_groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        int_args!(
            row_bytes: u32,
            layers: u32,
            page_rows: u32,
            arena_pages: u32,
            hot_rows: u32,
            tail_rows: u32,
            scratch_rows: u32 = 0
        );
        let g = Geometry {
            row_bytes,
            layers,
            page_rows,
            arena_pages,
            hot_rows,
            tail_rows,
            scratch_rows,
            layer_groups: layer_groups_arg(layer_groups)?,
            row_format: None,
        };
        guard(|| g.validate().map(|()| PyKvGeometry(g)).map_err(kv_err))
    }
    /// Sizes the arena from an HBM budget in bytes (`budget_bytes`), as many pages of
    /// `page_rows × layers × row_bytes` bytes as fit; `layer_groups` as in the constructor.
    /// The arena is capped at the largest one `int32` row indices address (and 1 TiB,
    /// `kv_elastic::MAX_ARENA_BYTES`): a larger budget gives that arena and a `UserWarning`
    /// naming the bytes left unused (`arena_rows × layers × row_bytes` is what the pool takes).
    #[staticmethod]
    #[pyo3(
        signature = (budget_bytes, row_bytes, layers, page_rows, hot_rows, tail_rows, scratch_rows = None, layer_groups = None),
        text_signature = "(budget_bytes, row_bytes, layers, page_rows, hot_rows, tail_rows, scratch_rows=0, layer_groups=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn for_hbm_budget(
        py: Python<'_>,
        budget_bytes: &Bound<'_, PyAny>,
        row_bytes: &Bound<'_, PyAny>,
        layers: &Bound<'_, PyAny>,
        page_rows: &Bound<'_, PyAny>,
        hot_rows: &Bound<'_, PyAny>,
        tail_rows: &Bound<'_, PyAny>,
        scratch_rows: Option<&Bound<'_, PyAny>>,
        layer_groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        int_args!(
            budget_bytes: u64,
            row_bytes: u32,
            layers: u32,
            page_rows: u32,
            hot_rows: u32,
            tail_rows: u32,
            scratch_rows: u32 = 0
        );
        let layer_groups = layer_groups_arg(layer_groups)?;
        guard(|| {
            let mut g = Geometry::for_hbm_budget(&kv_elastic::PoolSizing {
                budget_bytes,
                row_bytes,
                layers,
                page_rows,
                hot_rows,
                tail_rows,
                scratch_rows,
            })
            .map_err(kv_err)?;
            g.layer_groups = layer_groups;
            g.validate().map_err(kv_err)?;
            Ok(PyKvGeometry(g))
        })
        .and_then(|g| {
            // validate() bounded layers × row_bytes × page_rows: no overflow.
            let page_bytes = g.0.page_rows as u64 * g.0.layers as u64 * g.0.row_bytes as u64;
            if budget_bytes / page_bytes > g.0.arena_pages as u64 {
                let arena = g.0.arena_pages as u64 * page_bytes;
                let msg = format!(
                    "budget_bytes = {budget_bytes}: the arena is capped at {arena} bytes \
                     ({} pages, the most int32 row indices and MAX_ARENA_BYTES allow); {} bytes \
                     of the budget stay unused",
                    g.0.arena_pages,
                    budget_bytes - arena
                );
                let warn = py.get_type::<pyo3::exceptions::PyUserWarning>();
                PyErr::warn(py, &warn, &std::ffi::CString::new(msg)?, 1)?;
            }
            Ok(g)
        })
    }
    #[getter]
    fn row_bytes(&self) -> u32 {
        self.0.row_bytes
    }
    #[getter]
    fn layers(&self) -> u32 {
        self.0.layers
    }
    #[getter]
    fn page_rows(&self) -> u32 {
        self.0.page_rows
    }
    #[getter]
    fn arena_pages(&self) -> u32 {
        self.0.arena_pages
    }
    #[getter]
    fn hot_rows(&self) -> u32 {
        self.0.hot_rows
    }
    #[getter]
    fn tail_rows(&self) -> u32 {
        self.0.tail_rows
    }
    #[getter]
    fn scratch_rows(&self) -> u32 {
        self.0.scratch_rows
    }
    /// The layer groups' sizes, in layer order (one hot cache per group and session).
    #[getter]
    fn layer_groups(&self) -> Vec<u32> {
        self.0.layer_groups.sizes(self.0.layers)
    }
    /// The layer group holding `layer` (`ValueError` past the last layer or for a negative or
    /// huge int, `TypeError` for a non-int).
    fn group_of(&self, layer: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(layer: u32);
        if layer >= self.0.layers {
            return Err(PyValueError::new_err(format!(
                "layer = {layer} is out of range: the geometry has layers 0..{}",
                self.0.layers
            )));
        }
        Ok(self.0.group_of(layer))
    }
    /// Bytes of one token over all layers (`layers × row_bytes`): history is whole tokens.
    #[getter]
    fn token_bytes(&self) -> usize {
        self.0.token_bytes()
    }
    /// Pages one session's fixed rows (hot cache + tail + scratch) take.
    #[getter]
    fn fixed_pages(&self) -> u32 {
        self.0.fixed_pages()
    }
    /// Rows in the arena.
    #[getter]
    fn arena_rows(&self) -> u64 {
        self.0.arena_rows()
    }
    fn __repr__(&self) -> String {
        let g = self.0;
        format!(
            "Geometry(row_bytes={}, layers={}, page_rows={}, arena_pages={}, hot_rows={}, tail_rows={}, scratch_rows={}, layer_groups={:?})",
            g.row_bytes, g.layers, g.page_rows, g.arena_pages, g.hot_rows, g.tail_rows, g.scratch_rows,
            g.layer_groups.sizes(g.layers)
        )
    }
}
