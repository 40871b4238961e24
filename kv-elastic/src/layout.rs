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
mod tests {
    use super::*;

    fn g() -> Geometry {
        Geometry {
            row_bytes: 16,
            layers: 2,
            page_rows: 4,
            arena_pages: 8,
            hot_rows: 6,
            tail_rows: 4,
            scratch_rows: 2,
            layer_groups: Default::default(),
            row_format: None,
        }
    }

    #[test]
    fn fixed_pages_round_up() {
        assert_eq!(g().fixed_rows(), 12);
        assert_eq!(g().fixed_pages(), 3);
        assert_eq!(g().arena_rows(), 32);
        assert_eq!(g().token_bytes(), 32);
        g().validate().unwrap();
        // Fixed local rows 0..12 over fixed pages [5, 1, 7] of 4 rows; a borrowed page's rows.
        let fixed = [5, 1, 7];
        let rows: Vec<u32> = (0..12).map(|l| g().fixed_row(&fixed, l)).collect();
        assert_eq!(rows, [20, 21, 22, 23, 4, 5, 6, 7, 28, 29, 30, 31]);
        assert_eq!((g().page_row(3, 0), g().page_row(3, 13)), (12, 13));
    }

    #[test]
    fn arena_too_small_is_typed() {
        let small = Geometry {
            arena_pages: 2,
            ..g()
        };
        assert_eq!(
            small.validate(),
            Err(KvError::ArenaTooSmall {
                arena_pages: 2,
                needed_pages: 3
            })
        );
        assert!(matches!(
            Geometry {
                row_bytes: 0,
                ..g()
            }
            .validate(),
            Err(KvError::InvalidGeometry(_))
        ));
    }

    #[test]
    fn huge_fields_are_typed_errors_not_panics() {
        let bad = |g: Geometry| matches!(g.validate(), Err(KvError::InvalidGeometry(_)));
        // hot + tail + scratch would wrap to 0 fixed rows (the breaker's `--tail-rows 4294967232`).
        assert!(bad(Geometry {
            hot_rows: 64,
            tail_rows: 4_294_967_232,
            ..g()
        }));
        assert!(bad(Geometry {
            scratch_rows: u32::MAX,
            ..g()
        }));
        assert_eq!(
            Geometry {
                scratch_rows: u32::MAX,
                ..g()
            }
            .fixed_rows(),
            u32::MAX
        );
        // A 2 TB plane, u32::MAX layers, 4 GiB tokens.
        assert!(bad(Geometry {
            row_bytes: 1000,
            page_rows: 1 << 20,
            arena_pages: 2000,
            ..g()
        }));
        assert!(bad(Geometry {
            layers: u32::MAX,
            ..g()
        }));
        assert!(bad(Geometry {
            row_bytes: u32::MAX,
            layers: 1,
            ..g()
        }));
        assert!(bad(Geometry {
            page_rows: 0,
            ..g()
        }));
        assert_eq!(
            Geometry {
                page_rows: 0,
                ..g()
            }
            .fixed_pages(),
            u32::MAX
        );
        // A 2^31-row hot cache (28 GB of CLOCK state per session) in a valid 2 GiB arena.
        assert!(bad(Geometry {
            row_bytes: 1,
            layers: 1,
            page_rows: 1 << 16,
            arena_pages: 32_767,
            hot_rows: (1 << 31) - (1 << 17),
            tail_rows: 1,
            scratch_rows: 0,
            layer_groups: Default::default(),
            row_format: None,
        }));
        // At the bounds: still valid.
        Geometry {
            row_bytes: 656,
            layers: 61,
            page_rows: 64,
            arena_pages: 10_000,
            hot_rows: 4096,
            tail_rows: 64,
            scratch_rows: 0,
            layer_groups: Default::default(),
            row_format: None,
        }
        .validate()
        .unwrap();
    }

    fn sizing(
        budget_bytes: u64,
        row_bytes: u32,
        layers: u32,
        page_rows: u32,
        hot_rows: u32,
        tail_rows: u32,
        scratch_rows: u32,
    ) -> PoolSizing {
        PoolSizing {
            budget_bytes,
            row_bytes,
            layers,
            page_rows,
            hot_rows,
            tail_rows,
            scratch_rows,
        }
    }

    #[test]
    fn for_hbm_budget_fills_the_budget_and_types_the_errors() {
        // 16-byte rows, 2 layers, 4-row pages: 128 bytes a page; fixed rows 6 + 4 + 2 = 3 pages.
        let g = Geometry::for_hbm_budget(&sizing(1000, 16, 2, 4, 6, 4, 2)).unwrap();
        assert_eq!(g.arena_pages, 7);
        assert_eq!(g.fixed_pages(), 3);
        g.validate().unwrap();
        assert_eq!(
            Geometry::for_hbm_budget(&sizing(383, 16, 2, 4, 6, 4, 2)),
            Err(KvError::BudgetTooSmall {
                budget_bytes: 383,
                needed_bytes: 384
            })
        );
        assert_eq!(
            Geometry::for_hbm_budget(&sizing(384, 16, 2, 4, 6, 4, 2)).map(|g| g.arena_pages),
            Ok(3)
        );
        assert!(matches!(
            Geometry::for_hbm_budget(&sizing(1 << 30, 0, 2, 4, 6, 4, 2)),
            Err(KvError::InvalidGeometry(_))
        ));
        assert!(matches!(
            Geometry::for_hbm_budget(&sizing(1 << 30, 16, 2, 4, 6, 0, 2)),
            Err(KvError::InvalidGeometry(_))
        ));
        // A huge budget is capped at the largest valid arena (int32 row indices).
        let big = Geometry::for_hbm_budget(&sizing(u64::MAX, 1, 1, 1, 1, 1, 0)).unwrap();
        assert_eq!(big.arena_rows(), i32::MAX as u64);
        big.validate().unwrap();
    }

    fn v4() -> Geometry {
        Geometry {
            row_bytes: 584,
            layers: 2,
            page_rows: 64,
            arena_pages: 4,
            hot_rows: 64,
            tail_rows: 64,
            scratch_rows: 0,
            layer_groups: Default::default(),
            row_format: Some(RowFormat::DEEPSEEK_V4),
        }
    }

    #[test]
    fn deepseek_v4_rows_lie_where_sglang_puts_them() {
        let g = v4();
        g.validate().unwrap();
        assert_eq!(RowFormat::DEEPSEEK_V4.row_bytes(), 584);
        // kPageBytes = ceil(64 × 584 / 576) × 576 = 37,440 (64 B of padding).
        assert_eq!(g.page_bytes(), (64u64 * 584).div_ceil(576) * 576);
        assert_eq!(g.plane_bytes(), 4 * 37_440);
        assert_eq!(g.token_bytes(), 2 * 584);
        for row in [0u32, 1, 63, 64, 65, 200, 255] {
            let (page, slot) = (row as u64 / 64, row as u64 % 64);
            assert_eq!(
                g.row_offsets(row),
                (
                    page * 37_440 + slot * 576,
                    page * 37_440 + 64 * 576 + slot * 8
                ),
                "row {row}"
            );
        }
        // A row read back from a plane is value ‖ scale.
        let mut plane = vec![0u8; g.plane_bytes()];
        let (v, s) = g.row_offsets(70);
        plane[v as usize..v as usize + 576].fill(1);
        plane[s as usize..s as usize + 8].fill(2);
        let row = g.plane_row(&plane, 70).unwrap();
        assert_eq!((&row[..576], &row[576..]), (&[1u8; 576][..], &[2u8; 8][..]));
        assert_eq!(g.plane_row(&plane, 256), None);
        // An unvalidated geometry without pages reads nothing and divides by nothing.
        let no_pages = Geometry { page_rows: 0, ..g };
        assert_eq!(no_pages.plane_row(&plane, 70), None);
        assert_eq!(no_pages.row_offsets(3).0, 3 * no_pages.page_bytes());
        // Contiguous: one segment at row × row_bytes, as before the format existed.
        for fmt in [None, Some(RowFormat::Contiguous { bytes: 16 })] {
            let c = Geometry {
                row_format: fmt,
                ..self::g()
            };
            c.validate().unwrap();
            assert_eq!(c.plane_bytes(), 32 * 16);
            assert_eq!(c.row_offsets(13).0, 13 * 16);
            assert_eq!(c.format(), RowFormat::Contiguous { bytes: 16 });
        }
    }

    #[test]
    fn bad_row_formats_are_typed_errors() {
        let bad = |f: RowFormat| {
            matches!(
                Geometry {
                    row_format: Some(f),
                    ..v4()
                }
                .validate(),
                Err(KvError::InvalidGeometry(_))
            )
        };
        assert!(bad(RowFormat::Contiguous { bytes: 583 }));
        let ok = |value, scale, page_rows, page_bytes| RowFormat::PagedSplit {
            value,
            scale,
            page_rows,
            page_bytes,
        };
        assert!(bad(ok(0, 584, 64, 37_440)));
        assert!(bad(ok(576, 16, 64, 37_440))); // value + scale != row_bytes
        assert!(bad(ok(u32::MAX, 8, 64, 37_440))); // value + scale overflows
        assert!(bad(ok(576, 8, 32, 37_440))); // not the geometry's page_rows
        assert!(bad(ok(576, 8, 64, 64 * 584 - 1))); // the rows do not fit the page
        assert!(!bad(ok(576, 8, 64, 64 * 584)));
        // A padded page counts against MAX_ARENA_BYTES.
        assert!(!bad(ok(576, 8, 64, u32::MAX)));
        assert!(matches!(
            Geometry {
                arena_pages: 1 << 20,
                layers: 64,
                row_format: Some(ok(576, 8, 64, u32::MAX)),
                ..v4()
            }
            .validate(),
            Err(KvError::InvalidGeometry(_))
        ));
    }

    #[test]
    fn a_geometry_without_the_format_reads_as_contiguous() {
        let mut json = serde_json::to_value(g()).unwrap();
        assert!(json.get("row_format").is_none(), "{json}");
        json.as_object_mut().unwrap().remove("row_format");
        let back: Geometry = serde_json::from_value(json).unwrap();
        assert_eq!(back, g());
        let v = serde_json::to_string(&v4()).unwrap();
        assert_eq!(serde_json::from_str::<Geometry>(&v).unwrap(), v4());
    }

    #[test]
    fn for_hbm_budget_counts_padded_pages_and_caps_them() {
        let sizing = |budget_bytes| PoolSizing {
            budget_bytes,
            row_bytes: 584,
            layers: 2,
            page_rows: 64,
            hot_rows: 128,
            tail_rows: 64,
            scratch_rows: 0,
        };
        let v4 = Some(RowFormat::DEEPSEEK_V4);
        // A budget fills with padded pages: never an arena over the budget.
        let g = Geometry::for_hbm_budget_with_format(&sizing(1 << 26), v4).unwrap();
        assert_eq!(g.row_format, v4);
        assert_eq!(g.arena_pages as u64, (1 << 26) / (2 * 37_440));
        assert!(g.arena_pages as u64 * g.page_bytes() * 2 <= 1 << 26);
        assert_eq!(
            Geometry::for_hbm_budget_with_format(&sizing(3 * 2 * 37_440 - 1), v4),
            Err(KvError::BudgetTooSmall {
                budget_bytes: 3 * 2 * 37_440 - 1,
                needed_bytes: 3 * 2 * 37_440
            })
        );
        // A budget past MAX_ARENA_BYTES caps the padded arena as it caps a contiguous one.
        for budget in [1 << 40, (1 << 40) + 1, 1 << 41, u64::MAX] {
            let g = Geometry::for_hbm_budget_with_format(&sizing(budget), v4).unwrap();
            assert_eq!(
                g.arena_pages as u64,
                MAX_ARENA_BYTES / (2 * 37_440),
                "{budget}"
            );
            g.validate().unwrap();
        }
        // A huge padded page: a small budget is too small (not an invalid geometry), a huge one
        // caps at the pages 1 TiB holds.
        let huge = Some(RowFormat::PagedSplit {
            value: 576,
            scale: 8,
            page_rows: 64,
            page_bytes: u32::MAX,
        });
        assert!(matches!(
            Geometry::for_hbm_budget_with_format(&sizing(1 << 20), huge),
            Err(KvError::BudgetTooSmall { .. })
        ));
        let g = Geometry::for_hbm_budget_with_format(&sizing(1 << 45), huge).unwrap();
        assert_eq!(
            g.arena_pages as u64,
            MAX_ARENA_BYTES / (2 * u32::MAX as u64)
        );
        // A format that does not fit the rows is refused; None is for_hbm_budget.
        let bad = Some(RowFormat::PagedSplit {
            value: 576,
            scale: 8,
            page_rows: 32,
            page_bytes: 37_440,
        });
        assert!(matches!(
            Geometry::for_hbm_budget_with_format(&sizing(1 << 26), bad),
            Err(KvError::InvalidGeometry(_))
        ));
        assert_eq!(
            Geometry::for_hbm_budget_with_format(&sizing(1 << 26), None),
            Geometry::for_hbm_budget(&sizing(1 << 26))
        );
    }

    #[test]
    fn serde_reads_weird_formats_as_errors_or_validate_refuses_them() {
        let with = |fmt: &str| {
            let mut json = serde_json::to_value(v4()).unwrap();
            json["row_format"] = serde_json::from_str(fmt).unwrap();
            serde_json::from_value::<Geometry>(json)
        };
        // Not a format: serde errors, never a panic.
        for fmt in [
            r#"{"PagedSplit": {"value": -1, "scale": 8, "page_rows": 64, "page_bytes": 37440}}"#,
            r#"{"PagedSplit": {"value": 4294967296, "scale": 8, "page_rows": 64, "page_bytes": 1}}"#,
            r#"{"PagedSplit": {"value": 576.5, "scale": 8, "page_rows": 64, "page_bytes": 37440}}"#,
            r#"{"PagedSplit": {"value": 576, "scale": 8, "page_rows": 64}}"#,
            r#"{"PagedSplit": {"value": "576", "scale": 8, "page_rows": 64, "page_bytes": 37440}}"#,
            r#"{"Contiguous": {}}"#,
            r#"{"Paged": {"bytes": 584}}"#,
            r#""DeepSeekV4""#,
            r#"[576, 8, 64, 37440]"#,
            r#"7"#,
        ] {
            assert!(with(fmt).is_err(), "{fmt}");
        }
        // Formats that parse but do not fit the geometry: validate refuses them.
        for fmt in [
            r#"{"Contiguous": {"bytes": 0}}"#,
            r#"{"PagedSplit": {"value": 0, "scale": 584, "page_rows": 64, "page_bytes": 37440}}"#,
            r#"{"PagedSplit": {"value": 4294967295, "scale": 585, "page_rows": 64, "page_bytes": 37440}}"#,
            r#"{"PagedSplit": {"value": 576, "scale": 8, "page_rows": 0, "page_bytes": 37440}}"#,
            r#"{"PagedSplit": {"value": 576, "scale": 8, "page_rows": 64, "page_bytes": 0}}"#,
        ] {
            let g = with(fmt).unwrap();
            assert!(
                matches!(g.validate(), Err(KvError::InvalidGeometry(_))),
                "{fmt}"
            );
            // Never a division by zero or an out-of-range slice on the unvalidated geometry.
            let _ = (
                g.page_bytes(),
                g.row_offsets(u32::MAX),
                g.plane_row(&[0; 64], 3),
            );
        }
        // null is the default (contiguous); an explicit Contiguous of row_bytes is valid.
        assert_eq!(with("null").unwrap().row_format, None);
        with(r#"{"Contiguous": {"bytes": 584}}"#)
            .unwrap()
            .validate()
            .unwrap();
    }
}
