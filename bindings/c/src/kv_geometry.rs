//! The KV tier's arena shape in C: `tierkit_kv_geometry` (by value, its layer groups and row
//! format) and the two sizers that fill it from an HBM budget.

use kv_elastic::{Geometry, LayerGroups, RowFormat};

use tierkit_bindings::Code;

use crate::ffi::{call, fail, out, view, writable, TierkitCode, TierkitError, R};

/// The pool's arena shape, by value (see `tierkit_kv_geometry_for_hbm_budget`). The last three
/// fields say which layers share one indexer's picks (one hot cache per *layer group*, and a
/// resolve at any layer fills every layer of its group; `kv_elastic::LayerGroups`): all zero (the
/// default, as a zero-initialized struct has them) is one group per layer, for per-layer indexers
/// (DeepSeek-V3.2); `group_layers = n` makes groups of `n` consecutive layers (`n >= layers`: one
/// group); `group_count > 0` gives the group sizes explicitly (`group_sizes[group_count]`, summing
/// to `layers`, read only during the call that takes the geometry).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TierkitKvGeometry {
    /// Bytes of one token's row in one layer.
    pub row_bytes: u32,
    /// Layers (arena planes).
    pub layers: u32,
    /// Rows per page.
    pub page_rows: u32,
    /// Pages in the arena.
    pub arena_pages: u32,
    /// Hot-cache rows per session.
    pub hot_rows: u32,
    /// Tail rows (newest positions) per session.
    pub tail_rows: u32,
    /// Draft (scratch) rows per session.
    pub scratch_rows: u32,
    /// Layers per layer group (0: one group per layer), unless `group_count > 0`.
    pub group_layers: u32,
    /// Explicit layer groups: their number (0: none, `group_layers` decides).
    pub group_count: u32,
    /// Explicit layer groups: `group_count` sizes in layer order (NULL when `group_count` is 0).
    pub group_sizes: *const u32,
    /// How a row lies in an arena page: `TIERKIT_KV_FMT_CONTIGUOUS` (0, the default of a
    /// zero-initialized struct: `row_bytes` contiguous bytes, the `fmt_*` fields ignored) or
    /// `TIERKIT_KV_FMT_PAGED_SPLIT` (DeepSeek-V4's paged split row, SGLang 0.5.23
    /// `kvcacheio.cuh` / FlashMLA: a page's `page_rows` values of `fmt_value_bytes`, then their
    /// scales of `fmt_scale_bytes`, padded to `fmt_page_bytes`; `fmt_value_bytes +
    /// fmt_scale_bytes == row_bytes`, `page_rows × row_bytes <= fmt_page_bytes`, else
    /// `TIERKIT_ERR_INVALID_ARGUMENT`). DeepSeek-V4: 576, 8, 37440 with `row_bytes = 584` and
    /// `page_rows = 64`. Host-side tokens stay `value ‖ scale` (`row_bytes` per layer).
    pub row_format: u32,
    /// Value bytes per row (`TIERKIT_KV_FMT_PAGED_SPLIT`).
    pub fmt_value_bytes: u32,
    /// Scale bytes per row (`TIERKIT_KV_FMT_PAGED_SPLIT`).
    pub fmt_scale_bytes: u32,
    /// Bytes of one arena page per layer, padding included (`TIERKIT_KV_FMT_PAGED_SPLIT`).
    pub fmt_page_bytes: u32,
}

/// `tierkit_kv_geometry::row_format`: rows of `row_bytes` contiguous bytes (the default).
pub const TIERKIT_KV_FMT_CONTIGUOUS: u32 = 0;
/// `tierkit_kv_geometry::row_format`: DeepSeek-V4's paged split row (see the field).
pub const TIERKIT_KV_FMT_PAGED_SPLIT: u32 = 1;

impl Default for TierkitKvGeometry {
    fn default() -> Self {
        TierkitKvGeometry {
            row_bytes: 0,
            layers: 0,
            page_rows: 0,
            arena_pages: 0,
            hot_rows: 0,
            tail_rows: 0,
            scratch_rows: 0,
            group_layers: 0,
            group_count: 0,
            group_sizes: std::ptr::null(),
            row_format: TIERKIT_KV_FMT_CONTIGUOUS,
            fmt_value_bytes: 0,
            fmt_scale_bytes: 0,
            fmt_page_bytes: 0,
        }
    }
}

impl TierkitKvGeometry {
    /// A geometry with one layer group per layer (what `tierkit_kv_geometry_for_hbm_budget`
    /// returns).
    fn per_layer(g: &Geometry) -> Self {
        TierkitKvGeometry {
            row_bytes: g.row_bytes,
            layers: g.layers,
            page_rows: g.page_rows,
            arena_pages: g.arena_pages,
            hot_rows: g.hot_rows,
            tail_rows: g.tail_rows,
            scratch_rows: g.scratch_rows,
            ..TierkitKvGeometry::default()
        }
        .with_format(g.row_format)
    }

    /// These fields with `format` (`None`: contiguous) in the `row_format` / `fmt_*` fields.
    fn with_format(self, format: Option<RowFormat>) -> Self {
        match format {
            Some(RowFormat::PagedSplit {
                value,
                scale,
                page_bytes,
                ..
            }) => TierkitKvGeometry {
                row_format: TIERKIT_KV_FMT_PAGED_SPLIT,
                fmt_value_bytes: value,
                fmt_scale_bytes: scale,
                fmt_page_bytes: page_bytes,
                ..self
            },
            _ => self,
        }
    }

    /// The geometry, its layer groups read from `group_sizes` when `group_count > 0`.
    ///
    /// # Safety
    /// When `group_count > 0`, `group_sizes` points to `group_count` readable `u32`.
    pub(crate) unsafe fn read_geometry(&self) -> R<Geometry> {
        let layer_groups = if self.group_count > 0 {
            // SAFETY: the caller's contract (checked for NULL and alignment by `view`).
            let sizes =
                unsafe { view(self.group_sizes, self.group_count as usize, "group_sizes")? };
            LayerGroups::from_sizes(sizes)?
        } else {
            match self.group_layers {
                0 => LayerGroups::per_layer(),
                n => LayerGroups::every(n)?,
            }
        };
        Ok(Geometry {
            row_bytes: self.row_bytes,
            layers: self.layers,
            page_rows: self.page_rows,
            arena_pages: self.arena_pages,
            hot_rows: self.hot_rows,
            tail_rows: self.tail_rows,
            scratch_rows: self.scratch_rows,
            layer_groups,
            row_format: match self.row_format {
                TIERKIT_KV_FMT_CONTIGUOUS => None,
                TIERKIT_KV_FMT_PAGED_SPLIT => Some(RowFormat::PagedSplit {
                    value: self.fmt_value_bytes,
                    scale: self.fmt_scale_bytes,
                    page_rows: self.page_rows,
                    page_bytes: self.fmt_page_bytes,
                }),
                f => {
                    return Err(fail(
                        Code::InvalidArgument,
                        format!(
                            "row_format {f}: TIERKIT_KV_FMT_CONTIGUOUS (0) or \
                             TIERKIT_KV_FMT_PAGED_SPLIT (1)"
                        ),
                    ))
                }
            },
        })
    }
}

/// Sizes a pool from an HBM budget (bytes of arena), as `Geometry::for_hbm_budget`: contiguous
/// rows and one layer group per layer. For a paged split row format (DeepSeek-V4) size with
/// `tierkit_kv_geometry_fit_budget`, which counts the format's padded pages: setting the
/// `row_format` / `fmt_*` fields on this function's result gives an arena over the budget.
///
/// # Safety
/// `out_geometry` valid for a write; `err` NULL or valid for a pointer write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tierkit_kv_geometry_for_hbm_budget(
    budget_bytes: u64,
    row_bytes: u32,
    layers: u32,
    page_rows: u32,
    hot_rows: u32,
    tail_rows: u32,
    scratch_rows: u32,
    out_geometry: *mut TierkitKvGeometry,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let g = Geometry::for_hbm_budget(&kv_elastic::PoolSizing {
                budget_bytes,
                row_bytes,
                layers,
                page_rows,
                hot_rows,
                tail_rows,
                scratch_rows,
            })?;
            out(
                out_geometry,
                TierkitKvGeometry::per_layer(&g),
                "out_geometry",
            )
        })
    }
}

/// Sizes `shape`'s arena from an HBM budget (bytes of arena): `*out_geometry` is `*shape` with
/// `arena_pages` set to the most pages of its row format (`layers × fmt_page_bytes` bytes each
/// for `TIERKIT_KV_FMT_PAGED_SPLIT`, padding included; `layers × page_rows × row_bytes` for
/// contiguous rows) that fit in `budget_bytes`, capped as `tierkit_kv_geometry_for_hbm_budget`
/// caps (1 TiB, `int32` row indices). `shape.arena_pages` is ignored; every other field
/// (layer groups and row format included) is checked as `tierkit_kv_pool_new` checks it
/// (`TIERKIT_ERR_INVALID_ARGUMENT`), and `TIERKIT_ERR_INVALID_ARGUMENT` names a budget below one
/// session's fixed pages. `group_sizes` is copied as a pointer (the caller's array).
///
/// # Safety
/// `shape` points to a readable geometry (and, when its `group_count > 0`, its `group_sizes` to
/// `group_count` readable `uint32_t`); `out_geometry` valid for a write; `err` NULL or valid for
/// a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_kv_geometry_fit_budget(
    budget_bytes: u64,
    shape: *const TierkitKvGeometry,
    out_geometry: *mut TierkitKvGeometry,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_geometry, "out_geometry")?;
            let shape = view(shape, 1, "shape")?[0];
            let want = shape.read_geometry()?;
            let mut g = Geometry::for_hbm_budget_with_format(
                &kv_elastic::PoolSizing {
                    budget_bytes,
                    row_bytes: want.row_bytes,
                    layers: want.layers,
                    page_rows: want.page_rows,
                    hot_rows: want.hot_rows,
                    tail_rows: want.tail_rows,
                    scratch_rows: want.scratch_rows,
                },
                want.row_format,
            )?;
            g.layer_groups = want.layer_groups;
            g.validate()?;
            out(
                out_geometry,
                TierkitKvGeometry {
                    arena_pages: g.arena_pages,
                    ..shape
                },
                "out_geometry",
            )
        })
    }
}
