//! Pick counters: a `layers × experts` table of u32 counts, bumped once per routed pick.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::error::{ExpertError, Result};
use crate::geometry::Geometry;
use crate::picks::StepPicks;
use crate::router_ids::{out_of_range, RouterIds};

/// What kind of forward pass produced a step's picks. Only [`PassKind::Prefill`] and
/// [`PassKind::Decode`] are counted: warm-up, dummy profiling and speculative draft passes route
/// identical or throw-away tokens and poison the counts (a fault seen in real engines' expert-load
/// recorders).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PassKind {
    /// A prefill pass of real requests (counted).
    Prefill,
    /// A decode pass of real requests (counted).
    Decode,
    /// Engine warm-up / CUDA-graph capture (not counted).
    Warmup,
    /// Dummy profiling run, e.g. to size the KV cache (not counted).
    Profile,
    /// Speculative draft pass (not counted; the verify pass is a `Decode`).
    Draft,
}

impl PassKind {
    /// Whether picks of this kind of pass are counted.
    pub fn is_counted(self) -> bool {
        matches!(self, PassKind::Prefill | PassKind::Decode)
    }
}

/// Per-`(layer, expert)` pick counts, `[layers][experts]` row-major u32 — the layout the GPU
/// counting kernel writes (cell `layer * experts + expert`), so a device table copied to host is
/// drained the same way ([`crate::Controller::step_with`]).
///
/// Counting is one relaxed `fetch_add` per pick and is safe from several threads (`&self`).
/// Counts wrap at 2^32; drains work on wrap-around-safe deltas (`new.wrapping_sub(old)`), so
/// counting never stops or resets. Relaxed ordering suffices: a drain only needs every add to
/// land eventually, not any order between cells.
///
/// Counting can be paused ([`PickCounters::pause`]) for passes that must not count. The device
/// counter (`cuda_kernels::PickCounterGpu`) has the same exclusion on the GPU: an enable flag and
/// a valid-token count in device memory, read by the counting kernels (graph-capturable).
#[derive(Debug)]
pub struct PickCounters {
    layers: u32,
    experts: u32,
    cells: Box<[AtomicU32]>,
    paused: AtomicBool,
}

/// While alive, [`PickCounters::record`] and friends count nothing (see [`PickCounters::pause`]).
#[derive(Debug)]
pub struct PauseGuard<'a> {
    counters: &'a PickCounters,
    was_paused: bool,
}

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        self.counters
            .paused
            .store(self.was_paused, Ordering::Relaxed);
    }
}

impl PickCounters {
    /// Zeroed counters for `geometry` (`layers × experts_per_layer` cells, at most
    /// [`crate::MAX_CELLS`]).
    ///
    /// Errors: the errors of [`Geometry::validate`] (a geometry built by hand may be invalid or
    /// too large); [`ExpertError::OutOfMemory`] if the table cannot be allocated.
    pub fn new(geometry: &Geometry) -> Result<Self> {
        geometry.validate()?;
        let (layers, experts) = (geometry.layers, geometry.experts_per_layer);
        let n = geometry.cells();
        let cells = tier_core::alloc::try_collect(
            n,
            std::iter::repeat_with(|| AtomicU32::new(0)),
            "pick counters",
        )?;
        Ok(PickCounters {
            layers,
            experts,
            cells: cells.into_boxed_slice(),
            paused: AtomicBool::new(false),
        })
    }

    /// Layers of the table.
    pub fn layers(&self) -> u32 {
        self.layers
    }

    /// Experts per layer of the table.
    pub fn experts_per_layer(&self) -> u32 {
        self.experts
    }

    /// Cells of the table (`layers × experts`).
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Always false for a valid geometry (kept for the `len` convention).
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Errors with [`ExpertError::GeometryMismatch`] unless the table has `geometry`'s shape.
    pub(crate) fn check_geometry(&self, geometry: &Geometry) -> Result<()> {
        if self.layers == geometry.layers && self.experts == geometry.experts_per_layer {
            Ok(())
        } else {
            Err(ExpertError::GeometryMismatch {
                expected: format!(
                    "{} layers × {} experts",
                    geometry.layers, geometry.experts_per_layer
                ),
                found: format!("{} layers × {} experts", self.layers, self.experts),
            })
        }
    }

    /// Counts one pick of `expert` in `layer` (one relaxed atomic add), unless paused.
    ///
    /// Errors: [`ExpertError::LayerOutOfRange`], [`ExpertError::ExpertOutOfRange`] (nothing counted).
    #[inline]
    pub fn record(&self, layer: u32, expert: u32) -> Result<()> {
        if layer >= self.layers {
            return Err(ExpertError::LayerOutOfRange {
                layer,
                layers: self.layers,
            });
        }
        if expert >= self.experts {
            return Err(ExpertError::ExpertOutOfRange {
                expert,
                experts: self.experts,
            });
        }
        if !self.paused.load(Ordering::Relaxed) {
            let i = layer as usize * self.experts as usize + expert as usize;
            self.cells[i].fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Counts every pick of one layer (`picks`: `[tokens × top_k]` expert ids, as `u32`, `i32` or
    /// `i64`: a router's int32/int64 output needs no conversion). All ids are checked first: on
    /// error nothing is counted.
    ///
    /// The table does not know token boundaries, so a repeated id is counted each time (two
    /// tokens may pick the same expert); the trace readers reject a token that picks one expert
    /// twice.
    ///
    /// Errors: [`ExpertError::LayerOutOfRange`]; [`ExpertError::ExpertOutOfRange`] for an id at
    /// or above the experts per layer; [`ExpertError::ExpertIdOutOfRange`] for a negative one
    /// (or one above `u32`).
    pub fn record_layer<T: Copy + Into<i64>>(&self, layer: u32, picks: &[T]) -> Result<()> {
        let row = self.layer_row(layer)?;
        for (i, &e) in picks.iter().enumerate() {
            let e: i64 = e.into();
            if !(0..self.experts as i64).contains(&e) {
                return Err(out_of_range(e, self.experts, || format!("element {i}")));
            }
        }
        if self.paused.load(Ordering::Relaxed) {
            return Ok(());
        }
        for &e in picks {
            row[Into::<i64>::into(e) as usize].fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Counts one layer's routing given as a strided `[tokens, k]` view ([`RouterIds`]: a
    /// router's `topk_ids` in place, e.g. llama.cpp's `ffn_moe_topk` rows of stride
    /// `nb[1] / 4`). All ids are checked first: on error nothing is counted. No allocation.
    ///
    /// Errors: [`ExpertError::LayerOutOfRange`]; as [`RouterIds::check`].
    pub fn record_layer_strided<T: Copy + Into<i64>>(
        &self,
        layer: u32,
        ids: RouterIds<'_, T>,
    ) -> Result<()> {
        let row = self.layer_row(layer)?;
        ids.check(self.experts)?;
        if self.paused.load(Ordering::Relaxed) {
            return Ok(());
        }
        for r in ids.rows() {
            for &e in r {
                row[Into::<i64>::into(e) as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The cells of `layer`, or [`ExpertError::LayerOutOfRange`].
    fn layer_row(&self, layer: u32) -> Result<&[AtomicU32]> {
        if layer >= self.layers {
            return Err(ExpertError::LayerOutOfRange {
                layer,
                layers: self.layers,
            });
        }
        Ok(&self.cells[layer as usize * self.experts as usize..][..self.experts as usize])
    }

    /// Counts a whole step (`step.layers` must have one row per layer). Everything is checked
    /// first: on error nothing is counted.
    ///
    /// Errors: [`ExpertError::LengthMismatch`] for a wrong number of layers, [`ExpertError::ExpertOutOfRange`].
    pub fn record_step(&self, step: &StepPicks) -> Result<()> {
        if step.layers.len() != self.layers as usize {
            return Err(ExpertError::LengthMismatch {
                expected: self.layers as usize,
                found: step.layers.len(),
            });
        }
        for picks in &step.layers {
            self.check_ids(picks)?;
        }
        if self.paused.load(Ordering::Relaxed) {
            return Ok(());
        }
        for (l, picks) in step.layers.iter().enumerate() {
            let row = &self.cells[l * self.experts as usize..][..self.experts as usize];
            for &e in picks {
                row[e as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Counts a step produced by a pass of `kind`; returns whether it was counted (false for
    /// warm-up, profiling and draft passes, or while paused). Checks as [`PickCounters::record_step`].
    pub fn record_pass(&self, kind: PassKind, step: &StepPicks) -> Result<bool> {
        if !kind.is_counted() {
            return Ok(false);
        }
        self.record_step(step)?;
        Ok(!self.is_paused())
    }

    fn check_ids(&self, picks: &[u32]) -> Result<()> {
        match picks.iter().find(|&&e| e >= self.experts) {
            Some(&e) => Err(ExpertError::ExpertOutOfRange {
                expert: e,
                experts: self.experts,
            }),
            None => Ok(()),
        }
    }

    /// Pauses counting until the guard drops (warm-up, profiling, draft passes counted through
    /// [`PickCounters::record`]).
    pub fn pause(&self) -> PauseGuard<'_> {
        let was_paused = self.paused.swap(true, Ordering::Relaxed);
        PauseGuard {
            counters: self,
            was_paused,
        }
    }

    /// Whether counting is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Copies the table into `out` (`[layers × experts]` u32, row-major). Counting may go on
    /// meanwhile; each cell is read atomically.
    ///
    /// Errors: [`ExpertError::LengthMismatch`] if `out` has the wrong length.
    pub fn snapshot_into(&self, out: &mut [u32]) -> Result<()> {
        if out.len() != self.cells.len() {
            return Err(ExpertError::LengthMismatch {
                expected: self.cells.len(),
                found: out.len(),
            });
        }
        for (o, c) in out.iter_mut().zip(self.cells.iter()) {
            *o = c.load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// A copy of the table (`[layers × experts]` u32, row-major).
    ///
    /// # Panics
    /// When the host cannot allocate the copy ([`PickCounters::try_snapshot`] returns the error).
    pub fn snapshot(&self) -> Vec<u32> {
        self.try_snapshot().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`PickCounters::snapshot`], or [`ExpertError::OutOfMemory`] when the host cannot allocate
    /// the copy.
    pub fn try_snapshot(&self) -> Result<Vec<u32>> {
        Ok(tier_core::alloc::try_collect(
            self.cells.len(),
            self.cells.iter().map(|c| c.load(Ordering::Relaxed)),
            "pick counter snapshot",
        )?)
    }

    /// The raw cells, row-major `[layers][experts]`.
    pub fn cells(&self) -> &[AtomicU32] {
        &self.cells
    }
}

/// Smallest wrap-around delta (`new.wrapping_sub(old)`) of one cell that a drain reads as the
/// table going backwards rather than as counting: 2^31. Counts only go up, so a cell below its
/// previous snapshot shows up as a delta of 2^32 minus the drop, ≥ 2^31 for any drop up to
/// 2^31; and 2^31 real picks of one expert in one drain interval (drain_every steps) is beyond
/// any engine. A table re-created, zeroed or swapped for another under the controller is caught
/// at the first drain where any cell is below its previous value (see
/// [`ControllerConfig::on_counter_reset`](crate::ControllerConfig::on_counter_reset)).
pub(crate) const COUNTER_RESET_DELTA: u32 = 1 << 31;

/// The first cell (row-major `layer * experts + expert`) whose wrap-around delta `new - old` is
/// at least [`COUNTER_RESET_DELTA`], i.e. that went backwards between the two snapshots; `None`
/// if every cell moved forward (or not at all). A table that was reset and then overtook every
/// old value before the drain is indistinguishable from counting and is not detected (that
/// interval's deltas are then too small, never phantom).
///
/// Errors: [`ExpertError::LengthMismatch`] unless `new` and `old` have the same length.
pub(crate) fn first_backwards_cell(new: &[u32], old: &[u32]) -> Result<Option<usize>> {
    if new.len() != old.len() {
        return Err(ExpertError::LengthMismatch {
            expected: old.len(),
            found: new.len(),
        });
    }
    Ok(new
        .iter()
        .zip(old)
        .position(|(&n, &o)| n.wrapping_sub(o) >= COUNTER_RESET_DELTA))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry::new(2, 4, 1, 8).unwrap()
    }

    #[test]
    fn signed_and_strided_router_ids_count_in_place() {
        let c = PickCounters::new(&geo()).unwrap();
        c.record_layer(0, &[1i32, 2]).unwrap();
        c.record_layer(0, &[3i64, 2]).unwrap();
        let from_vec: Vec<u32> = std::iter::once(0).collect();
        c.record_layer(1, &from_vec).unwrap();
        // A [2, 2] view of a [2, 3] int32 array (row stride 3): the 9s are never read.
        let wide = [1i32, 3, 9, 0, 1, 9];
        c.record_layer_strided(1, RouterIds::new(&wide, 2, 2, 3).unwrap())
            .unwrap();
        assert_eq!(c.snapshot(), vec![0, 1, 2, 1, 2, 2, 0, 1]);
        // Checked first: nothing counted on error.
        let e = c.record_layer(0, &[1i64, -1]).unwrap_err();
        assert!(
            matches!(&e, ExpertError::ExpertIdOutOfRange { id: -1, at, .. } if at == "element 1"),
            "{e}"
        );
        let bad = [1i32, 2, 9, 4, 0, 9];
        let e = c
            .record_layer_strided(0, RouterIds::new(&bad, 2, 2, 3).unwrap())
            .unwrap_err();
        assert!(
            matches!(&e, ExpertError::ExpertIdOutOfRange { id: 4, at, .. } if at == "[1, 0]"),
            "{e}"
        );
        assert!(c.record_layer(2, &[0i32]).is_err());
        assert_eq!(c.snapshot(), vec![0, 1, 2, 1, 2, 2, 0, 1]);
    }

    #[test]
    fn counts_and_rejects() {
        let c = PickCounters::new(&geo()).unwrap();
        c.record(1, 3).unwrap();
        c.record(1, 3).unwrap();
        assert!(matches!(
            c.record(2, 0),
            Err(ExpertError::LayerOutOfRange { .. })
        ));
        assert!(matches!(
            c.record(0, 4),
            Err(ExpertError::ExpertOutOfRange { .. })
        ));
        let bad = StepPicks {
            layers: vec![vec![0, 1], vec![2, 9]],
        };
        assert!(c.record_step(&bad).is_err());
        assert_eq!(c.snapshot(), vec![0, 0, 0, 0, 0, 0, 0, 2]);
        let ok = StepPicks {
            layers: vec![vec![0, 1], vec![2, 2]],
        };
        c.record_step(&ok).unwrap();
        assert_eq!(c.snapshot(), vec![1, 1, 0, 0, 0, 0, 2, 2]);
        assert!(!c.record_pass(PassKind::Warmup, &ok).unwrap());
        {
            let _g = c.pause();
            c.record(0, 0).unwrap();
            assert!(!c.record_pass(PassKind::Decode, &ok).unwrap());
        }
        assert!(c.record_pass(PassKind::Decode, &ok).unwrap());
        assert_eq!(c.snapshot(), vec![2, 2, 0, 0, 0, 0, 4, 2]);
    }

    #[test]
    fn threads_count_everything() {
        let c = PickCounters::new(&geo()).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..1000u32 {
                        c.record((i + t) % 2, i % 4).unwrap();
                    }
                });
            }
        });
        assert_eq!(c.snapshot().iter().map(|&x| x as u64).sum::<u64>(), 4000);
    }

    #[test]
    fn unvalidated_geometry_is_an_error_not_an_abort() {
        let huge = Geometry {
            layers: u32::MAX,
            experts_per_layer: u32::MAX,
            hot_per_layer: 1,
            expert_bytes: 1,
        };
        assert!(matches!(
            PickCounters::new(&huge),
            Err(ExpertError::InvalidGeometry(_))
        ));
        let zero = Geometry { layers: 0, ..geo() };
        assert!(PickCounters::new(&zero).is_err());
    }

    #[test]
    fn backwards_cells_are_found_and_wraps_are_not() {
        // a wrap past 2^32 is counting, not a reset
        assert_eq!(
            first_backwards_cell(&[5, 3], &[u32::MAX - 1, 1]).unwrap(),
            None
        );
        assert_eq!(first_backwards_cell(&[7, 7], &[7, 7]).unwrap(), None);
        // one pick lost (a re-created table that has not caught up) is found
        assert_eq!(
            first_backwards_cell(&[9, 3, 0], &[9, 4, 100]).unwrap(),
            Some(1)
        );
        // a jump of 2^31 or more is implausible: read as backwards
        assert_eq!(
            first_backwards_cell(&[COUNTER_RESET_DELTA], &[0]).unwrap(),
            Some(0)
        );
        assert_eq!(
            first_backwards_cell(&[COUNTER_RESET_DELTA - 1], &[0]).unwrap(),
            None
        );
        assert!(matches!(
            first_backwards_cell(&[1], &[1, 2]),
            Err(ExpertError::LengthMismatch { .. })
        ));
    }
}
