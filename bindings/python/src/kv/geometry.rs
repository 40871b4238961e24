//! `tierkit.kv.KvGeometry`: the pool's geometry, sized directly or from an HBM budget.

use kv_elastic::{Geometry, LayerGroups, RowFormat};
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

/// `row_format` as Python gives it (the geometry's `page_rows` completes it): `None` or
/// `"contiguous"` (rows of `row_bytes` contiguous bytes, the default), `"deepseek_v4"`
/// (`RowFormat::DEEPSEEK_V4`: 576 + 8 B, 64 rows per 37,440-byte page), or a dict
/// `{"value": int, "scale": int, "page_bytes": int}` (a paged split row; `"page_rows"` may be
/// given and must then equal the geometry's).
fn row_format_arg(arg: Option<&Bound<'_, PyAny>>, page_rows: u32) -> PyResult<Option<RowFormat>> {
    let Some(a) = arg.filter(|a| !a.is_none()) else {
        return Ok(None);
    };
    if let Ok(name) = a.extract::<String>() {
        return match name.as_str() {
            "contiguous" => Ok(None),
            "deepseek_v4" => Ok(Some(RowFormat::DEEPSEEK_V4)),
            _ => Err(PyValueError::new_err(format!(
                "row_format: unknown name {name:?} (\"contiguous\" or \"deepseek_v4\")"
            ))),
        };
    }
    let Ok(d) = a.cast::<PyDict>() else {
        return Err(PyTypeError::new_err(format!(
            "row_format must be None, \"contiguous\", \"deepseek_v4\" or a dict with value, \
             scale and page_bytes, not {}",
            type_name(a)
        )));
    };
    for key in d.keys() {
        let k: String = key.extract().unwrap_or_default();
        if !["value", "scale", "page_bytes", "page_rows"].contains(&k.as_str()) {
            // repr, not str: a key whose __str__ raises is named without an unraisable error.
            let name = key
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| format!("<a {} key>", type_name(&key)));
            return Err(PyValueError::new_err(format!(
                "row_format: unknown key {name} (value, scale, page_bytes, page_rows)"
            )));
        }
    }
    let field = |name: &str| -> PyResult<Option<u32>> {
        match d.get_item(name)? {
            Some(v) => Ok(Some(int_arg::<u32>(&v, &format!("row_format[{name:?}]"))?)),
            None => Ok(None),
        }
    };
    let need = |name: &str| -> PyResult<u32> {
        field(name)?.ok_or_else(|| PyValueError::new_err(format!("row_format: {name} missing")))
    };
    Ok(Some(RowFormat::PagedSplit {
        value: need("value")?,
        scale: need("scale")?,
        page_rows: field("page_rows")?.unwrap_or(page_rows),
        page_bytes: need("page_bytes")?,
    }))
}

/// The pool's arena shape. Build it with `Geometry.for_hbm_budget(...)` (or the constructor,
/// which validates the fields). `layer_groups` says which layers share one indexer's picks (one
/// hot cache per group; a resolve at a layer fills every layer of its group): `None` /
/// `"per_layer"` (default: every layer its own, as DeepSeek-V3.2's per-layer indexers),
/// `"one"`, an `int` n (groups of n layers) or a list of group sizes. `row_format` says how a
/// row lies in an arena page: `None` / `"contiguous"` (default: `row_bytes` contiguous bytes),
/// `"deepseek_v4"` (DeepSeek-V4's paged split row, SGLang 0.5.23 `kvcacheio.cuh` / FlashMLA:
/// 576 B values then 8 B scales per 64-row page of 37,440 B; `row_bytes = 584`,
/// `page_rows = 64`) or `{"value": v, "scale": s, "page_bytes": p}`; host-side tokens stay
/// `value ‖ scale` (`row_bytes = v + s` bytes per layer) and `arena_row` returns them that way.
/// A format that does not fit the geometry raises `ValueError`.
#[pyclass(name = "KvGeometry", module = "tierkit.kv", frozen, eq)]
#[derive(Clone, Copy)]
pub(crate) struct PyKvGeometry(pub(crate) Geometry);

/// `==` compares what the pool does with the geometry: the fields, the layer groups' sizes (so
/// `layer_groups=[1, 1]` equals the default per-layer groups of 2 layers, and `eval(repr(g)) ==
/// g`, repr giving the sizes) and the row format in effect (an explicit contiguous format equals
/// `None`).
impl PartialEq for PyKvGeometry {
    fn eq(&self, other: &Self) -> bool {
        let key = |g: &Geometry| {
            (
                Geometry {
                    layer_groups: LayerGroups::per_layer(),
                    row_format: Some(g.format()),
                    ..*g
                },
                g.layer_groups.sizes(g.layers),
            )
        };
        key(&self.0) == key(&other.0)
    }
}

#[pymethods]
impl PyKvGeometry {
    #[new]
    #[pyo3(
        signature = (row_bytes, layers, page_rows, arena_pages, hot_rows, tail_rows, scratch_rows = None, layer_groups = None, *, row_format = None),
        text_signature = "(row_bytes, layers, page_rows, arena_pages, hot_rows, tail_rows, scratch_rows=0, layer_groups=None, *, row_format=None)"
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
        row_format: Option<&Bound<'_, PyAny>>,
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
            row_format: row_format_arg(row_format, page_rows)?,
        };
        guard(|| g.validate().map(|()| PyKvGeometry(g)).map_err(kv_err))
    }
    /// Sizes the arena from an HBM budget in bytes (`budget_bytes`), as many pages of
    /// `page_rows × layers × row_bytes` bytes as fit; `layer_groups` as in the constructor.
    /// The arena is capped at the largest one `int32` row indices address (and 1 TiB,
    /// `kv_elastic::MAX_ARENA_BYTES`): a larger budget gives that arena and a `UserWarning`
    /// naming the bytes left unused (`arena_rows × layers × row_bytes` is what the pool takes).
    /// `row_format` as in the constructor: a padded format's pages (`page_bytes` each per layer)
    /// are what the budget holds.
    #[staticmethod]
    #[pyo3(
        signature = (budget_bytes, row_bytes, layers, page_rows, hot_rows, tail_rows, scratch_rows = None, layer_groups = None, *, row_format = None),
        text_signature = "(budget_bytes, row_bytes, layers, page_rows, hot_rows, tail_rows, scratch_rows=0, layer_groups=None, *, row_format=None)"
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
        row_format: Option<&Bound<'_, PyAny>>,
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
        let row_format = row_format_arg(row_format, page_rows)?;
        guard(|| {
            // The Rust sizer counts the format's padded pages against the budget and the arena
            // cap (a padded arena past 1 TiB is capped, as a contiguous one is).
            let mut g = Geometry::for_hbm_budget_with_format(
                &kv_elastic::PoolSizing {
                    budget_bytes,
                    row_bytes,
                    layers,
                    page_rows,
                    hot_rows,
                    tail_rows,
                    scratch_rows,
                },
                row_format,
            )
            .map_err(kv_err)?;
            g.layer_groups = layer_groups;
            g.validate().map_err(kv_err)?;
            Ok(PyKvGeometry(g))
        })
        .and_then(|g| {
            // validate() bounded layers × page bytes × arena pages: no overflow.
            let page_bytes = g.0.page_bytes() * g.0.layers as u64;
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
    /// The arena's row format: `None` for contiguous rows, else a dict `{"value", "scale",
    /// "page_rows", "page_bytes"}` (bytes, except `page_rows`) of the paged split row.
    #[getter]
    fn row_format<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match self.0.format() {
            RowFormat::Contiguous { .. } => Ok(None),
            RowFormat::PagedSplit {
                value,
                scale,
                page_rows,
                page_bytes,
            } => {
                let d = PyDict::new(py);
                d.set_item("value", value)?;
                d.set_item("scale", scale)?;
                d.set_item("page_rows", page_rows)?;
                d.set_item("page_bytes", page_bytes)?;
                Ok(Some(d))
            }
        }
    }
    /// Bytes of one arena page of one layer (`page_rows × row_bytes`, or the paged split
    /// format's padded `page_bytes`).
    #[getter]
    fn page_bytes(&self) -> u64 {
        self.0.page_bytes()
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
            "Geometry(row_bytes={}, layers={}, page_rows={}, arena_pages={}, hot_rows={}, tail_rows={}, scratch_rows={}, layer_groups={:?}{})",
            g.row_bytes, g.layers, g.page_rows, g.arena_pages, g.hot_rows, g.tail_rows, g.scratch_rows,
            g.layer_groups.sizes(g.layers),
            match g.format() {
                RowFormat::Contiguous { .. } => String::new(),
                RowFormat::PagedSplit { value, scale, page_bytes, .. } => format!(
                    ", row_format={{'value': {value}, 'scale': {scale}, 'page_bytes': {page_bytes}}}"
                ),
            }
        )
    }
}
