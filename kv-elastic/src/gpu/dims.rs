//! The one conversion of the tier's [`Geometry`] (validated once, by the pool's constructor)
//! and the GPU pool's capacity ([`GpuPoolConfig`]) into the kernel crate's launch terms,
//! [`KvDims`]. Nothing is validated again in kernel terms on the pool's path: every extent
//! `KvDims::validate` checks follows from `Geometry::validate` and the capacity checks here.

use cuda_kernels::{KvDims, KV_FMT_CONTIGUOUS, KV_FMT_PAGED_SPLIT};

use super::GpuPoolConfig;
use crate::error::{KvError, Result};
use crate::layout::{Geometry, RowFormat, MAX_HISTORY};

impl GpuPoolConfig {
    /// The device tables' dims for a **validated** `geometry` at this capacity: `max_slots =
    /// max_sessions`, `max_pages = ceil(max_history / page_rows)`, the geometry's rows and pages.
    ///
    /// # Errors
    /// [`KvError::InvalidConfig`] for a zero `max_sessions` or `max_history`, or a `max_history`
    /// above [`MAX_HISTORY`] (positions are `int32`).
    pub(crate) fn kv_dims(&self, geometry: &Geometry) -> Result<KvDims> {
        if self.max_sessions == 0 || self.max_history == 0 {
            return Err(KvError::InvalidConfig(format!(
                "GPU pool capacity: max_sessions ({}) and max_history ({}) must be > 0",
                self.max_sessions, self.max_history
            )));
        }
        if self.max_history > MAX_HISTORY {
            return Err(KvError::InvalidConfig(format!(
                "GPU pool capacity: max_history {} above MAX_HISTORY ({MAX_HISTORY}, int32 positions)",
                self.max_history
            )));
        }
        // The geometry is validated: fixed rows fit its fixed pages, arena rows fit int32 and
        // hot rows are at most MAX_HOT_ROWS.
        Ok(KvDims {
            row_bytes: geometry.row_bytes,
            layers: geometry.layers,
            page_rows: geometry.page_rows,
            hot_rows: geometry.hot_rows,
            tail_rows: geometry.tail_rows,
            scratch_rows: geometry.scratch_rows,
            fixed_pages: geometry.fixed_pages(),
            max_slots: self.max_sessions,
            max_history: self.max_history,
            max_pages: self.max_history.div_ceil(geometry.page_rows),
            arena_rows: geometry.arena_rows() as u32,
            fmt: match geometry.format() {
                RowFormat::Contiguous { .. } => KV_FMT_CONTIGUOUS,
                RowFormat::PagedSplit { .. } => KV_FMT_PAGED_SPLIT,
            },
            value_bytes: geometry.format().segment_bytes().0,
            scale_bytes: geometry.format().segment_bytes().1,
            fmt_page_bytes: geometry.page_bytes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::CopyBackend;
    use crate::layout::MAX_HOT_ROWS;

    fn gcfg(max_sessions: u32, max_history: u32) -> GpuPoolConfig {
        GpuPoolConfig {
            max_sessions,
            max_history,
            backend: CopyBackend::Gather,
        }
    }

    /// What the conversion relies on: whatever `Geometry::validate` accepts converts to dims the
    /// kernels' own check accepts, so the pool's path need not run it.
    #[test]
    fn validated_geometries_convert_to_valid_dims() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let (mut converted, mut split) = (0, 0);
        for _ in 0..20_000 {
            let hot_bound = if next(8) == 0 {
                MAX_HOT_ROWS as u64
            } else {
                4096
            };
            let g = Geometry {
                row_bytes: 1 + next(2048) as u32,
                layers: 1 + next(64) as u32,
                page_rows: 1 + next(128) as u32,
                arena_pages: 1 + next(1 << 16) as u32,
                hot_rows: 1 + next(hot_bound) as u32,
                tail_rows: 1 + next(256) as u32,
                scratch_rows: next(16) as u32,
                layer_groups: Default::default(),
                row_format: None,
            };
            // Half the geometries in a paged split format (an 8-byte scale, the page padded).
            let g = match (g.row_bytes > 8, next(2)) {
                (true, 0) => {
                    let value = g.row_bytes - 8;
                    Geometry {
                        row_format: Some(RowFormat::PagedSplit {
                            value,
                            scale: 8,
                            page_rows: g.page_rows,
                            page_bytes: g.page_rows * g.row_bytes + next(3) as u32 * value,
                        }),
                        ..g
                    }
                }
                _ => g,
            };
            if g.validate().is_err() {
                continue;
            }
            let history = [1, 1 + next(1 << 20) as u32, MAX_HISTORY][next(3) as usize];
            let d = gcfg(1 + next(64) as u32, history).kv_dims(&g).unwrap();
            d.validate()
                .unwrap_or_else(|e| panic!("{g:?} -> {d:?}: {e}"));
            // The kernels' segment rule (KvDims::row_segs, kv_row_segs) is the geometry's.
            assert_eq!(d.plane_bytes(), g.plane_bytes());
            let rows = g.arena_rows() as u32;
            for row in [0, 1, g.page_rows - 1, g.page_rows, rows / 2, rows - 1] {
                let row = row.min(rows - 1);
                assert_eq!(d.row_segs(row), g.row_offsets(row), "{g:?} row {row}");
            }
            converted += 1;
            split += usize::from(matches!(g.row_format, Some(RowFormat::PagedSplit { .. })));
        }
        assert!(converted > 1000, "{converted}");
        assert!(
            split > 100,
            "only {split} paged split geometries of {converted}"
        );
    }

    #[test]
    fn a_capacity_out_of_range_is_a_config_error() {
        let g = Geometry::for_hbm_budget(&crate::PoolSizing {
            budget_bytes: 1 << 20,
            row_bytes: 64,
            layers: 2,
            page_rows: 16,
            hot_rows: 64,
            tail_rows: 16,
            scratch_rows: 0,
        })
        .unwrap();
        for bad in [gcfg(0, 64), gcfg(4, 0), gcfg(4, MAX_HISTORY + 1)] {
            assert!(matches!(bad.kv_dims(&g), Err(KvError::InvalidConfig(_))));
        }
        let d = gcfg(4, 100).kv_dims(&g).unwrap();
        assert_eq!((d.max_slots, d.max_pages, d.fixed_pages), (4, 7, 5));
    }
}
