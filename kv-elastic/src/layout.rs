//! Layout: token rows, the per-session fixed region (hot cache, tail, scratch) and elastic pages
//! carved out of one contiguous device arena.

use crate::error::{KvError, Result};
use crate::groups::LayerGroups;

pub use crate::groups::MAX_LAYERS;

/// Most committed tokens one session's history may hold: positions are `int32` (the indexer's
/// top-k, FlashMLA's indices), so `i32::MAX`.
pub const MAX_HISTORY: u32 = i32::MAX as u32;

/// Most bytes of one token over all layers (`layers × row_bytes`), 16 MiB (DeepSeek-V3.2 fp8 MLA:
/// 40,016 B).
pub const MAX_TOKEN_BYTES: u64 = 1 << 24;

/// Most bytes of the whole arena over all layers (`layers × arena_pages × page_bytes`:
/// `layers × arena_rows × row_bytes` for contiguous rows, [`Geometry::page_bytes`]), 1 TiB. The
/// CPU pool keeps the arena in host memory (the GPU back-end mirrors it), so this also bounds that
/// allocation; a smaller arena that the host still cannot allocate gives `KvError::OutOfMemory`.
pub const MAX_ARENA_BYTES: u64 = 1 << 40;

/// How one layer's rows lie in an arena page ([`Geometry::row_format`]).
///
/// Units: bytes, except `page_rows` (rows). The host store holds every token as `value ‖ scale`
/// (`row_bytes = value + scale` bytes per layer) in both formats; only the arena's layout differs.
///
/// - `Contiguous { bytes }`: a row is `bytes` contiguous bytes, row `r` of a plane at `r × bytes`
///   (DeepSeek-V3.2's fp8 MLA row, 656 B; FlashMLA's V3.2 sparse path). The format when
///   [`Geometry::row_format`] is `None`.
/// - `PagedSplit { value, scale, page_rows, page_bytes }`: DeepSeek-V4's paged split row (SGLang
///   0.5.23, `sgl_kernel/deepseek_v4/kvcacheio.cuh`, the layout FlashMLA's DeepSeek-V4 path reads):
///   a page of `page_rows` rows holds the rows' values back to back (`value` bytes each), then
///   their scales (`scale` bytes each), padded to `page_bytes`. Row `r` (page `r / page_rows`,
///   slot `r % page_rows`) has its value at `page × page_bytes + slot × value` and its scale at
///   `page × page_bytes + page_rows × value + slot × scale` of its plane. DeepSeek-V4:
///   `{ value: 576, scale: 8, page_rows: 64, page_bytes: 37_440 }` (⌈64 × 584 / 576⌉ × 576 B).
///
/// Errors ([`Geometry::validate`], `KvError::InvalidGeometry`): `Contiguous.bytes != row_bytes`;
/// `value == 0`, `value + scale != row_bytes`, `page_rows != Geometry::page_rows` (an arena page
/// is a format page, so the resolve's `page × page_rows + slot` indices are the format's), or
/// `page_rows × (value + scale) > page_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum RowFormat {
    /// Rows of `bytes` contiguous bytes (`bytes == Geometry::row_bytes`).
    Contiguous {
        /// Bytes per row per layer.
        bytes: u32,
    },
    /// DeepSeek-V4's paged split row: values then scales per page, the page padded.
    PagedSplit {
        /// Value bytes per row (576 for DeepSeek-V4: 448 fp8 + 64 bf16 RoPE dims).
        value: u32,
        /// Scale bytes per row (8 for DeepSeek-V4).
        scale: u32,
        /// Rows per format page (must equal [`Geometry::page_rows`]; 64 for DeepSeek-V4).
        page_rows: u32,
        /// Bytes per format page per layer, padding included (37,440 for DeepSeek-V4).
        page_bytes: u32,
    },
}

impl RowFormat {
    /// DeepSeek-V4's row: 576 B value + 8 B scale, 64 rows per 37,440-byte page.
    pub const DEEPSEEK_V4: RowFormat = RowFormat::PagedSplit {
        value: 576,
        scale: 8,
        page_rows: 64,
        page_bytes: 37_440,
    };

    /// Bytes a token carries per layer (`bytes`, or `value + scale`, saturating).
    pub fn row_bytes(&self) -> u32 {
        match *self {
            RowFormat::Contiguous { bytes } => bytes,
            RowFormat::PagedSplit { value, scale, .. } => value.saturating_add(scale),
        }
    }

    /// `(value bytes, scale bytes)` of a row: `(bytes, 0)` for `Contiguous`.
    pub fn segment_bytes(&self) -> (u32, u32) {
        match *self {
            RowFormat::Contiguous { bytes } => (bytes, 0),
            RowFormat::PagedSplit { value, scale, .. } => (value, scale),
        }
    }
}

/// Most hot-cache rows per session, 16 Mi (HiSparse uses 2 × top-k = 4,096). Each admitted session
/// keeps 13 bytes of host-side CLOCK state per hot row ([`crate::HotCache`]).
pub const MAX_HOT_ROWS: u32 = 1 << 24;

/// The shape of one pool: row size, layers, page size, how the arena is carved, and which layers
/// share top-k picks.
///
/// The device arena is `arena_pages × page_rows` rows of `row_bytes` bytes, one plane per layer
/// (every layer uses the same row indices), laid out as [`Geometry::row_format`] says
/// (contiguous rows, or DeepSeek-V4's paged split row: [`RowFormat`]). It is one contiguous range because sparse-attention
/// kernels (FlashMLA) index a single array. Pages are the unit of allocation: each admitted
/// session takes [`Geometry::fixed_pages`] pages for its fixed rows (hot cache, tail, scratch),
/// and the rest is lent as elastic history pages. The hot rows serve every layer group: each
/// [`LayerGroups`] group maps its own positions to them, in its own layer planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// Bytes per token row per layer (656 for DeepSeek fp8 MLA, 1152 for bf16 576-dim, 584 for
    /// DeepSeek-V4's `value ‖ scale`): what a token carries per layer in the host store, and the
    /// arena row's size unless [`Geometry::row_format`] splits it.
    pub row_bytes: u32,
    /// Layers (arena planes); a token's KV is `layers × row_bytes` bytes.
    pub layers: u32,
    /// Rows per page (the elastic tier's unit; FlashMLA's block size is 64).
    pub page_rows: u32,
    /// Pages in the device arena.
    pub arena_pages: u32,
    /// Hot-cache rows per session (e.g. 2 × top-k).
    pub hot_rows: u32,
    /// Tail rows per session: the newest committed positions, always resident (ring buffer).
    pub tail_rows: u32,
    /// Scratch rows per session: speculative (draft) KV not yet accepted.
    pub scratch_rows: u32,
    /// Which layers share one indexer's picks (and so one hot cache per session); default
    /// [`LayerGroups::per_layer`] (every layer its own: exact for any order of resolves, as
    /// DeepSeek-V3.2's per-layer indexers need). See [`LayerGroups`].
    #[serde(default)]
    pub layer_groups: LayerGroups,
    /// How a row lies in an arena page ([`RowFormat`]); `None` (the default, and what a geometry
    /// serialized before the field reads as) is `Contiguous { bytes: row_bytes }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_format: Option<RowFormat>,
}

/// What [`Geometry::for_hbm_budget`] sizes a pool from, by name (seven integers a caller could
/// otherwise swap). Units: `budget_bytes` in bytes of HBM for the arena (the GPU back-end's
/// per-slot tables and the pinned host store come on top); `row_bytes` bytes per token row per
/// layer (656 for DeepSeek fp8 MLA); `layers` arena planes; `page_rows` rows per page; per session
/// `hot_rows` hot-cache rows, `tail_rows` newest-position rows and `scratch_rows` draft rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolSizing {
    /// HBM for the arena, bytes.
    pub budget_bytes: u64,
    /// Bytes per token row per layer.
    pub row_bytes: u32,
    /// Layers (arena planes).
    pub layers: u32,
    /// Rows per page.
    pub page_rows: u32,
    /// Hot-cache rows per session.
    pub hot_rows: u32,
    /// Tail rows (newest positions) per session.
    pub tail_rows: u32,
    /// Draft (speculative) rows per session.
    pub scratch_rows: u32,
}

impl Geometry {
    /// Checks every field; `KvError::InvalidGeometry` / `ArenaTooSmall` otherwise.
    ///
    /// Bounds: every count > 0 except `scratch_rows`; `layers <=` [`MAX_LAYERS`]; one token
    /// (`layers × row_bytes`) at most [`MAX_TOKEN_BYTES`]; arena rows (`arena_pages × page_rows`)
    /// fit in `int32` row indices; the whole arena (`layers × arena_rows × row_bytes` bytes) at most
    /// [`MAX_ARENA_BYTES`]; `hot_rows + tail_rows + scratch_rows` fits in `u32`, `hot_rows <=`
    /// [`MAX_HOT_ROWS`], one session's fixed pages fit in the arena, `layer_groups` partitions
    /// the layers ([`LayerGroups::validate`]), and `row_format` fits the rows and pages (see
    /// [`RowFormat`]'s errors).
    pub fn validate(&self) -> Result<()> {
        if self.row_bytes == 0 {
            return Err(KvError::InvalidGeometry("row_bytes must be > 0"));
        }
        if self.layers == 0 {
            return Err(KvError::InvalidGeometry("layers must be > 0"));
        }
        if self.layers > MAX_LAYERS {
            return Err(KvError::InvalidGeometry(
                "layers must be <= MAX_LAYERS (4096)",
            ));
        }
        if self.layers as u64 * self.row_bytes as u64 > MAX_TOKEN_BYTES {
            return Err(KvError::InvalidGeometry(
                "layers × row_bytes must be <= MAX_TOKEN_BYTES (16 MiB per token)",
            ));
        }
        if self.page_rows == 0 {
            return Err(KvError::InvalidGeometry("page_rows must be > 0"));
        }
        if self.hot_rows == 0 {
            return Err(KvError::InvalidGeometry("hot_rows must be > 0"));
        }
        if self.tail_rows == 0 {
            return Err(KvError::InvalidGeometry(
                "tail_rows must be > 0 (the newest token is pinned there)",
            ));
        }
        if self.arena_rows() > i32::MAX as u64 {
            return Err(KvError::InvalidGeometry(
                "arena rows must fit in int32 row indices",
            ));
        }
        self.validate_format()?;
        // arena_pages < 2^32, page_bytes < 2^56 (page_rows < 2^32, row_bytes <= 2^24) and
        // layers <= 4096: the product fits in u128.
        if self.layers as u128 * self.arena_pages as u128 * self.page_bytes() as u128
            > MAX_ARENA_BYTES as u128
        {
            return Err(KvError::InvalidGeometry(
                "layers × arena pages × page bytes must be <= MAX_ARENA_BYTES (1 TiB)",
            ));
        }
        if self
            .hot_rows
            .checked_add(self.tail_rows)
            .and_then(|r| r.checked_add(self.scratch_rows))
            .is_none()
        {
            return Err(KvError::InvalidGeometry(
                "hot_rows + tail_rows + scratch_rows must fit in u32",
            ));
        }
        if self.hot_rows > MAX_HOT_ROWS {
            return Err(KvError::InvalidGeometry(
                "hot_rows must be <= MAX_HOT_ROWS (16 Mi rows per session)",
            ));
        }
        self.layer_groups.validate(self.layers)?;
        if self.fixed_pages() > self.arena_pages {
            return Err(KvError::ArenaTooSmall {
                arena_pages: self.arena_pages,
                needed_pages: self.fixed_pages(),
            });
        }
        Ok(())
    }

    /// The [`RowFormat`] checks of [`Geometry::validate`] (`page_rows > 0` checked before).
    fn validate_format(&self) -> Result<()> {
        match self.row_format {
            None => Ok(()),
            Some(RowFormat::Contiguous { bytes }) if bytes != self.row_bytes => Err(
                KvError::InvalidGeometry("row_format Contiguous.bytes must equal row_bytes"),
            ),
            Some(RowFormat::Contiguous { .. }) => Ok(()),
            Some(RowFormat::PagedSplit {
                value,
                scale,
                page_rows,
                page_bytes,
            }) => {
                if value == 0 {
                    return Err(KvError::InvalidGeometry(
                        "row_format PagedSplit.value must be > 0",
                    ));
                }
                if value.checked_add(scale) != Some(self.row_bytes) {
                    return Err(KvError::InvalidGeometry(
                        "row_format PagedSplit: value + scale must equal row_bytes",
                    ));
                }
                if page_rows != self.page_rows {
                    return Err(KvError::InvalidGeometry(
                        "row_format PagedSplit.page_rows must equal the geometry's page_rows",
                    ));
                }
                if page_rows as u64 * self.row_bytes as u64 > page_bytes as u64 {
                    return Err(KvError::InvalidGeometry(
                        "row_format PagedSplit: page_rows × (value + scale) must be <= page_bytes",
                    ));
                }
                Ok(())
            }
        }
    }

    /// The row format in effect: [`Geometry::row_format`], or `Contiguous { bytes: row_bytes }`.
    pub fn format(&self) -> RowFormat {
        self.row_format.unwrap_or(RowFormat::Contiguous {
            bytes: self.row_bytes,
        })
    }

    /// Bytes of one arena page of one layer: `page_rows × row_bytes` for `Contiguous`, the
    /// format's `page_bytes` (padding included) for `PagedSplit`.
    pub fn page_bytes(&self) -> u64 {
        match self.format() {
            RowFormat::Contiguous { bytes } => self.page_rows as u64 * bytes as u64,
            RowFormat::PagedSplit { page_bytes, .. } => page_bytes as u64,
        }
    }

    /// Byte offsets of arena row `row`'s value and scale segments in its layer's plane: the one
    /// statement of the segment rule (the kernels' `kv_row_segs` is checked against it). Page
    /// `row / page_rows`, slot `row % page_rows`: value at `page × page_bytes + slot × value`,
    /// scale at `page × page_bytes + page_rows × value + slot × scale`; for `Contiguous` the value
    /// is the whole row at `row × row_bytes` and the scale is empty. A geometry with
    /// `page_rows = 0` (refused by `validate`) has no pages: its rows are taken as one page, so
    /// this never divides by zero.
    pub fn row_offsets(&self, row: u32) -> (u64, u64) {
        let (value, scale) = self.format().segment_bytes();
        let pr = (self.page_rows as u64).max(1);
        let (page, slot) = (row as u64 / pr, row as u64 % pr);
        let base = page * self.page_bytes();
        (
            base + slot * value as u64,
            base + pr * value as u64 + slot * scale as u64,
        )
    }

    /// Arena row `row` of `plane` (one layer's plane, [`Geometry::plane_bytes`] bytes) as the
    /// token's `value ‖ scale` bytes (`row_bytes` of them), or `None` when out of range.
    pub fn plane_row(&self, plane: &[u8], row: u32) -> Option<Vec<u8>> {
        let (value, scale) = self.format().segment_bytes();
        let (v, s) = self.row_offsets(row);
        if self.page_rows == 0 {
            return None;
        }
        let mut out = Vec::with_capacity(self.row_bytes as usize);
        let seg = |at: u64, n: u32| {
            plane.get(usize::try_from(at).ok()?..usize::try_from(at.checked_add(n as u64)?).ok()?)
        };
        out.extend_from_slice(seg(v, value)?);
        out.extend_from_slice(seg(s, scale)?);
        Some(out)
    }

    /// Sizes a pool from an HBM budget: the geometry with the most arena pages whose arena
    /// (`arena_pages × page_rows × layers × row_bytes` bytes) fits in `budget_bytes`, for rows of
    /// `row_bytes` bytes per layer, `layers` planes, `page_rows` rows per page, and per session
    /// `hot_rows` hot-cache rows, `tail_rows` tail rows and `scratch_rows` draft rows.
    ///
    /// Units: `budget_bytes` in bytes (the arena only: the GPU back-end's per-slot tables and the
    /// pinned host store come on top); every other argument in bytes or rows as named. The arena is
    /// capped at the largest valid one (`int32` row indices, [`MAX_ARENA_BYTES`]). Every admitted
    /// session takes [`Geometry::fixed_pages`] of these pages; the rest is lent as history pages
    /// (the elastic tier of Adaptive HiSparse). The result has per-layer [`LayerGroups`]; set
    /// `layer_groups` on it for layers that share picks (the arena's size does not depend on it).
    /// Its rows are contiguous (`row_format: None`); for a paged split format, whose pages are
    /// padded ([`Geometry::page_bytes`] ≥ `page_rows × row_bytes`), size with
    /// [`Geometry::for_hbm_budget_with_format`] (setting `row_format` on this result afterwards
    /// gives an arena over the budget).
    ///
    /// # Errors
    /// [`KvError::InvalidGeometry`] for a field [`Geometry::validate`] rejects;
    /// [`KvError::BudgetTooSmall`] when the budget cannot hold even one session's fixed rows.
    ///
    /// ```
    /// use kv_elastic::{Geometry, PoolSizing};
    /// // 1 GiB of HBM for DeepSeek fp8 MLA rows (656 B), 61 layers, pages of 64 rows.
    /// let sizing = PoolSizing {
    ///     budget_bytes: 1 << 30, row_bytes: 656, layers: 61, page_rows: 64,
    ///     hot_rows: 4096, tail_rows: 64, scratch_rows: 0,
    /// };
    /// let g = Geometry::for_hbm_budget(&sizing)?;
    /// assert_eq!(g.arena_pages, (1u64 << 30) as u32 / (64 * 61 * 656));
    /// assert!(Geometry::for_hbm_budget(&PoolSizing { budget_bytes: 1 << 20, ..sizing }).is_err());
    /// # Ok::<(), kv_elastic::KvError>(())
    /// ```
    pub fn for_hbm_budget(sizing: &PoolSizing) -> Result<Geometry> {
        Geometry::for_hbm_budget_with_format(sizing, None)
    }

    /// [`Geometry::for_hbm_budget`] for rows laid out as `row_format` (`None`: contiguous): the
    /// budget holds `budget_bytes / (layers × page_bytes)` pages of the format's
    /// [`Geometry::page_bytes`] (padding included), and the arena cap ([`MAX_ARENA_BYTES`],
    /// `int32` row indices) counts those padded pages too, so a padded format's arena is capped as
    /// a contiguous one is, never refused for a budget past the cap.
    ///
    /// # Errors
    /// As [`Geometry::for_hbm_budget`]; a `row_format` that does not fit the rows and pages
    /// ([`RowFormat`]'s errors) is [`KvError::InvalidGeometry`], and `BudgetTooSmall` counts the
    /// padded pages.
    ///
    /// ```
    /// use kv_elastic::{Geometry, PoolSizing, RowFormat};
    /// let sizing = PoolSizing {
    ///     budget_bytes: 1 << 30, row_bytes: 584, layers: 61, page_rows: 64,
    ///     hot_rows: 4096, tail_rows: 64, scratch_rows: 0,
    /// };
    /// let g = Geometry::for_hbm_budget_with_format(&sizing, Some(RowFormat::DEEPSEEK_V4))?;
    /// assert_eq!(g.arena_pages, (1u64 << 30) as u32 / (61 * 37_440));
    /// # Ok::<(), kv_elastic::KvError>(())
    /// ```
    pub fn for_hbm_budget_with_format(
        sizing: &PoolSizing,
        row_format: Option<RowFormat>,
    ) -> Result<Geometry> {
        let PoolSizing {
            budget_bytes,
            row_bytes,
            layers,
            page_rows,
            hot_rows,
            tail_rows,
            scratch_rows,
        } = *sizing;
        let mut g = Geometry {
            row_bytes,
            layers,
            page_rows,
            arena_pages: 1,
            hot_rows,
            tail_rows,
            scratch_rows,
            layer_groups: LayerGroups::per_layer(),
            row_format,
        };
        // Field checks first (with one page: only `ArenaTooSmall` may remain).
        match g.validate() {
            Ok(()) | Err(KvError::ArenaTooSmall { .. }) => {}
            Err(e) => return Err(e),
        }
        // validate() with one page bounds layers × page bytes (padding included) <= 2^40: no
        // overflow, and at least one page fits under MAX_ARENA_BYTES.
        let page_bytes = layers as u64 * g.page_bytes();
        let max_pages = (i32::MAX as u64 / page_rows as u64)
            .min(MAX_ARENA_BYTES / page_bytes)
            .min(u32::MAX as u64);
        let pages = (budget_bytes / page_bytes).min(max_pages) as u32;
        if pages < g.fixed_pages() {
            return Err(KvError::BudgetTooSmall {
                budget_bytes,
                needed_bytes: g.fixed_pages() as u64 * page_bytes,
            });
        }
        g.arena_pages = pages;
        g.validate()?;
        Ok(g)
    }

    /// Fixed rows per session: `hot_rows + tail_rows + scratch_rows` (saturating at `u32::MAX`;
    /// [`Geometry::validate`] rejects a sum that does not fit).
    pub fn fixed_rows(&self) -> u32 {
        self.hot_rows
            .saturating_add(self.tail_rows)
            .saturating_add(self.scratch_rows)
    }

    /// Pages one session's fixed rows take (rounded up; `u32::MAX` when `page_rows` is 0).
    pub fn fixed_pages(&self) -> u32 {
        match self.page_rows {
            0 => u32::MAX,
            pr => self.fixed_rows().div_ceil(pr),
        }
    }

    /// Arena row of a session's fixed local row `local` (hot-cache slots `0..hot_rows`, then the
    /// tail ring, then the scratch rows): row `local % page_rows` of its fixed page
    /// `fixed_pages[local / page_rows]` (the session's [`Geometry::fixed_pages`] physical pages).
    /// The one statement of the fixed-row rule; the device kernels follow the same layout
    /// (`cuda-kernels/DESIGN.md`, the KV resolve kernel contract).
    #[inline]
    pub(crate) fn fixed_row(&self, fixed_pages: &[u32], local: u32) -> u32 {
        let pr = self.page_rows;
        fixed_pages[(local / pr) as usize] * pr + local % pr
    }

    /// Arena row of history position `position` on its borrowed physical page `page`:
    /// `page × page_rows + position % page_rows`.
    #[inline]
    pub(crate) fn page_row(&self, page: u32, position: u32) -> u32 {
        page * self.page_rows + position % self.page_rows
    }

    /// Layer groups ([`LayerGroups::count`] of `layers`).
    pub fn groups(&self) -> u32 {
        self.layer_groups.count(self.layers)
    }

    /// The layer group holding `layer` (`layer < layers`).
    pub fn group_of(&self, layer: u32) -> u32 {
        self.layer_groups.group_of(layer)
    }

    /// The layers of the group holding `layer`: a resolve or prefetch at `layer` fetches its
    /// misses into all of them.
    pub fn group_layers(&self, layer: u32) -> std::ops::Range<u32> {
        self.layer_groups.group_layers(layer, self.layers)
    }

    /// Rows in the arena (`arena_pages × page_rows`).
    pub fn arena_rows(&self) -> u64 {
        self.arena_pages as u64 * self.page_rows as u64
    }

    /// Bytes of one token across all layers (`layers × row_bytes`; at most [`MAX_TOKEN_BYTES`] for
    /// a validated geometry).
    pub fn token_bytes(&self) -> usize {
        self.layers as usize * self.row_bytes as usize
    }

    /// Bytes of one arena plane (one layer): `arena_pages × page_bytes` ([`Geometry::page_bytes`];
    /// `arena_rows × row_bytes` for `Contiguous`; at most [`MAX_ARENA_BYTES`] for a validated
    /// geometry).
    pub fn plane_bytes(&self) -> usize {
        self.arena_pages as usize * self.page_bytes() as usize
    }
}

#[cfg(test)]
mod tests;
