//! The GPU bank's residency bookkeeping, with no CUDA in it (so it is unit-tested on a CPU).
//!
//! [`Placement`] keeps the executor's mirror of the controller's [`ResidencyMap`] (one
//! generation for map, executor and bank: the mirror applies exactly the swaps the bank flips,
//! in flip order, as the controller applies the swaps reported committed) and where each hot
//! expert physically sits: [`Geometry::slots_per_layer`] HBM slots per layer, one of them the
//! layer's spare. A swap copies its incoming expert into the spare; at the flip the incoming expert owns
//! that slot and the outgoing expert's old slot becomes the spare. The mirror's logical slots
//! (`PlannedSwap::slot`) and the physical slots differ once swaps rotate the spare.

use crate::error::{ExpertError, Result};
use crate::executor::PlannedSwap;
#[cfg(doc)]
use crate::geometry::Geometry;
use crate::rowmap::ResidencyMap;
use tier_core::alloc::try_filled;

/// Residency bookkeeping of a GPU bank (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Placement {
    map: ResidencyMap,
    experts: u32,
    slots_per_layer: u32,
    /// `[layers * experts]`: the physical slot of each hot expert.
    slot_of: Vec<Option<u32>>,
    /// `[layers * slots_per_layer]`: the expert in each physical slot (the spare holds none).
    expert_in_slot: Vec<Option<u32>>,
    /// `[layers]`: the spare slot of each layer.
    spare: Vec<u32>,
    /// `[layers]`: the swap copying into the layer's spare, if any.
    inflight: Vec<Option<PlannedSwap>>,
}

impl Placement {
    /// `map`'s hot slot `i` of every layer in physical slot `i`; [`Geometry::spare_slot`] is the
    /// spare; nothing in flight. Errors: `OutOfMemory` for tables the host cannot allocate.
    pub(crate) fn new(map: &ResidencyMap) -> Result<Self> {
        let g = *map.geometry();
        let (layers, experts) = (g.layers, g.experts_per_layer);
        let slots_per_layer = g.slots_per_layer();
        let what = "GPU bank placement tables";
        let mut slot_of = try_filled((layers * experts) as usize, None, what)?;
        let mut expert_in_slot = try_filled((layers * slots_per_layer) as usize, None, what)?;
        for (l, row) in map.layers().iter().enumerate() {
            for (s, &e) in row.hot_experts().iter().enumerate() {
                slot_of[l * experts as usize + e as usize] = Some(s as u32);
                expert_in_slot[l * slots_per_layer as usize + s] = Some(e);
            }
        }
        Ok(Placement {
            map: map.clone(),
            experts,
            slots_per_layer,
            slot_of,
            expert_in_slot,
            spare: vec![g.spare_slot(); layers as usize],
            inflight: vec![None; layers as usize],
        })
    }

    /// The mirror of the controller's map (as of the last flip).
    pub(crate) fn map(&self) -> &ResidencyMap {
        &self.map
    }

    /// The layer's generation in the mirror (0 for a layer out of range).
    pub(crate) fn generation(&self, layer: u32) -> u64 {
        self.map.layer(layer).map_or(0, |r| r.generation())
    }

    /// Physical slot of a hot `(layer, expert)`, `None` if cold or out of range.
    pub(crate) fn slot_of(&self, layer: u32, expert: u32) -> Option<u32> {
        if !self.map.is_hot(layer, expert) {
            return None;
        }
        self.slot_of[(layer * self.experts + expert) as usize]
    }

    /// The expert in physical slot `slot` of `layer` (`None` for the spare, or out of range).
    pub(crate) fn expert_in_slot(&self, layer: u32, slot: u32) -> Option<u32> {
        if layer as usize >= self.spare.len() || slot >= self.slots_per_layer {
            return None;
        }
        self.expert_in_slot[(layer * self.slots_per_layer + slot) as usize]
    }

    /// The layer's hot experts in physical slot order (empty if out of range).
    pub(crate) fn hot_experts(&self, layer: u32) -> Vec<u32> {
        (0..self.slots_per_layer)
            .filter_map(|s| self.expert_in_slot(layer, s))
            .collect()
    }

    /// The layer's spare slot (`None` if out of range).
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))] // the bank's `spare_slot` hook
    pub(crate) fn spare(&self, layer: u32) -> Option<u32> {
        self.spare.get(layer as usize).copied()
    }

    /// The swap copying into the layer's spare, if any.
    pub(crate) fn in_flight(&self, layer: u32) -> Option<&PlannedSwap> {
        self.inflight.get(layer as usize).and_then(|s| s.as_ref())
    }

    /// Whether `swap` may begin: it applies to the mirror now (layer and ids in range, planned
    /// at the mirror's generation, `outgoing` in logical slot `slot`, `incoming` cold) and the
    /// layer's spare is not taken by another copy. Returns the physical slot the copy lands in.
    ///
    /// Errors: [`ExpertError::LayerOutOfRange`], [`ExpertError::StaleSwap`], [`ExpertError::ExpertOutOfRange`],
    /// [`ExpertError::InvalidSwap`] (as [`ResidencyMap::check_swap`]); [`ExpertError::Executor`] if a copy
    /// is in flight on the layer.
    pub(crate) fn check_begin(&self, swap: &PlannedSwap) -> Result<u32> {
        self.map.check_swap(swap)?;
        if self.in_flight(swap.layer).is_some() {
            return Err(ExpertError::Executor(format!(
                "layer {}: a swap copy is already in flight on its spare slot",
                swap.layer
            )));
        }
        Ok(self.spare[swap.layer as usize])
    }

    /// Records `swap` as copying into its layer's spare (after [`Placement::check_begin`]).
    pub(crate) fn begin(&mut self, swap: &PlannedSwap) -> Result<u32> {
        let slot = self.check_begin(swap)?;
        self.inflight[swap.layer as usize] = Some(*swap);
        Ok(slot)
    }

    /// Drops the layer's in-flight swap without flipping; returns it.
    pub(crate) fn cancel(&mut self, layer: u32) -> Option<PlannedSwap> {
        self.inflight.get_mut(layer as usize).and_then(|s| s.take())
    }

    /// Checks that each of `layers` has a swap in flight that still applies to the mirror, and
    /// that no layer is listed twice. Returns, per layer in order, the swap and the physical
    /// slot it lands in.
    ///
    /// Errors: [`ExpertError::Executor`] for a layer with nothing in flight or listed twice; the
    /// errors of [`ResidencyMap::check_swap`] if a swap no longer applies.
    pub(crate) fn check_flips(&self, layers: &[u32]) -> Result<Vec<(PlannedSwap, u32)>> {
        let mut seen = vec![false; self.spare.len()];
        let mut out = Vec::with_capacity(layers.len());
        for &l in layers {
            let Some(swap) = self.in_flight(l) else {
                return Err(ExpertError::Executor(format!(
                    "layer {l}: no swap in flight to commit"
                )));
            };
            if std::mem::replace(&mut seen[l as usize], true) {
                return Err(ExpertError::Executor(format!("layer {l} listed twice")));
            }
            self.map.check_swap(swap)?;
            out.push((*swap, self.spare[l as usize]));
        }
        Ok(out)
    }

    /// Applies the flip of the layer's in-flight swap (checked by [`Placement::check_flips`]):
    /// the mirror applies the swap (generation + 1), the incoming expert owns the spare slot,
    /// the outgoing expert's old slot becomes the spare. Returns the swap and the old slot.
    ///
    /// Errors: as [`Placement::check_flips`] for this one layer (nothing changes).
    pub(crate) fn flip(&mut self, layer: u32) -> Result<(PlannedSwap, u32)> {
        let (swap, new_slot) = self.check_flips(&[layer])?[0];
        let (l, spl) = (layer as usize, self.slots_per_layer);
        let ci = (layer * self.experts + swap.incoming) as usize;
        let co = (layer * self.experts + swap.outgoing) as usize;
        let Some(old_slot) = self.slot_of[co] else {
            return Err(ExpertError::InvalidSwap(format!(
                "expert {} of layer {layer} holds no slot",
                swap.outgoing
            )));
        };
        self.map.apply(&swap)?;
        self.inflight[l] = None;
        self.slot_of[ci] = Some(new_slot);
        self.slot_of[co] = None;
        self.expert_in_slot[(layer * spl + new_slot) as usize] = Some(swap.incoming);
        self.expert_in_slot[(layer * spl + old_slot) as usize] = None;
        self.spare[l] = old_slot;
        Ok((swap, old_slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Geometry;

    fn placement() -> Placement {
        // 2 layers x 6 experts, 3 hot (slots 0..3, spare 3)
        let g = Geometry::new(2, 6, 3, 64).unwrap();
        Placement::new(&ResidencyMap::first_k("t", g).unwrap()).unwrap()
    }

    fn swap(p: &Placement, layer: u32, incoming: u32, outgoing: u32) -> PlannedSwap {
        PlannedSwap {
            layer,
            incoming,
            outgoing,
            slot: p.map().layer(layer).unwrap().slot_of(outgoing).unwrap_or(0),
            generation: p.generation(layer),
        }
    }

    #[test]
    fn boot_placement_follows_the_map() {
        let p = placement();
        assert_eq!(p.hot_experts(0), vec![0, 1, 2]);
        assert_eq!(
            (p.spare(0), p.spare(1), p.spare(2)),
            (Some(3), Some(3), None)
        );
        assert_eq!((p.slot_of(1, 2), p.slot_of(1, 3)), (Some(2), None));
        assert_eq!(
            (p.expert_in_slot(0, 3), p.expert_in_slot(0, 4)),
            (None, None)
        );
        assert_eq!(p.generation(0), 0);
    }

    #[test]
    fn a_flip_rotates_the_spare_and_bumps_the_one_generation() {
        let mut p = placement();
        let s = swap(&p, 0, 4, 1);
        assert_eq!(p.begin(&s).unwrap(), 3, "the copy lands in the spare");
        assert_eq!(p.in_flight(0), Some(&s));
        assert!(p.slot_of(0, 4).is_none(), "nothing changes before the flip");
        assert_eq!(p.flip(0).unwrap(), (s, 1));
        assert_eq!(p.generation(0), 1);
        assert_eq!(p.generation(1), 0);
        assert_eq!(
            (p.slot_of(0, 4), p.slot_of(0, 1), p.spare(0)),
            (Some(3), None, Some(1))
        );
        assert_eq!(p.hot_experts(0), vec![0, 2, 4]);
        // the mirror's logical slot is the controller's: 4 took logical slot 1 from 1
        assert_eq!(p.map().layer(0).unwrap().slot_of(4), Some(1));
        // the next swap lands in the new spare (physical 1), logical slot of 4 is 1
        let s2 = swap(&p, 0, 5, 4);
        assert_eq!((s2.slot, s2.generation), (1, 1));
        assert_eq!(p.begin(&s2).unwrap(), 1);
        p.flip(0).unwrap();
        assert_eq!((p.slot_of(0, 5), p.spare(0)), (Some(1), Some(3)));
        assert_eq!(p.hot_experts(0), vec![0, 5, 2]);
    }

    #[test]
    fn a_stale_swap_is_refused_at_begin_and_at_the_flip() {
        let mut p = placement();
        let planned_at_0 = swap(&p, 0, 4, 1);
        let other = swap(&p, 0, 5, 2);
        p.begin(&planned_at_0).unwrap();
        p.flip(0).unwrap();
        // planned at generation 0, the mirror is at 1: refused, nothing changes
        let before = p.clone();
        assert_eq!(
            p.begin(&other),
            Err(ExpertError::StaleSwap {
                layer: 0,
                expected: 0,
                actual: 1
            })
        );
        assert!(p.in_flight(0).is_none());
        assert_eq!(p.map(), before.map());
        // a wrong generation in the future is stale too
        let ahead = PlannedSwap {
            generation: 7,
            ..swap(&p, 0, 5, 2)
        };
        assert!(matches!(
            p.begin(&ahead),
            Err(ExpertError::StaleSwap { .. })
        ));
        // the same swap re-planned at the current generation goes through
        p.begin(&swap(&p, 0, 5, 2)).unwrap();
        assert_eq!(p.flip(0).unwrap().0.generation, 1);
        assert_eq!(p.generation(0), 2);
    }

    #[test]
    fn bad_begins_and_flips_are_typed_errors_and_change_nothing() {
        let mut p = placement();
        let g = p.generation(0);
        let bad = |p: &mut Placement, s: PlannedSwap| {
            let before = p.clone();
            let e = p.begin(&s).unwrap_err();
            assert!(p.in_flight(s.layer).is_none() || before.in_flight(s.layer).is_some());
            assert_eq!(p.map(), before.map());
            e
        };
        let s = |layer, incoming, outgoing, slot| PlannedSwap {
            layer,
            incoming,
            outgoing,
            slot,
            generation: g,
        };
        assert!(
            matches!(bad(&mut p, s(0, 1, 2, 2)), ExpertError::InvalidSwap(_)),
            "incoming hot"
        );
        assert!(
            matches!(bad(&mut p, s(0, 4, 5, 2)), ExpertError::InvalidSwap(_)),
            "outgoing cold"
        );
        assert!(matches!(
            bad(&mut p, s(2, 4, 1, 1)),
            ExpertError::LayerOutOfRange { .. }
        ));
        assert!(matches!(
            bad(&mut p, s(0, 6, 1, 1)),
            ExpertError::ExpertOutOfRange { .. }
        ));
        p.begin(&s(0, 4, 1, 1)).unwrap();
        assert!(
            matches!(bad(&mut p, s(0, 5, 2, 2)), ExpertError::Executor(_)),
            "spare busy"
        );
        assert!(
            matches!(p.check_flips(&[1]), Err(ExpertError::Executor(_))),
            "nothing in flight"
        );
        assert!(
            matches!(p.check_flips(&[0, 0]), Err(ExpertError::Executor(_))),
            "listed twice"
        );
        assert!(matches!(p.flip(1), Err(ExpertError::Executor(_))));
        assert_eq!(p.cancel(0), Some(s(0, 4, 1, 1)));
        assert_eq!(p.cancel(0), None);
        assert!(
            matches!(p.flip(0), Err(ExpertError::Executor(_))),
            "cancelled: nothing to flip"
        );
        assert_eq!((p.generation(0), p.hot_experts(0)), (0, vec![0, 1, 2]));
    }

    /// The executor's mirror and a controller-side map that apply the same swaps in the same
    /// order stay equal, generation included, over a long random run.
    #[test]
    fn mirror_matches_a_map_applying_the_same_swaps() {
        let mut p = placement();
        let mut ctl = p.map().clone();
        let mut x = 0x9E37_79B9u64;
        let mut next = |n: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as u32
        };
        for _ in 0..500 {
            let l = next(2);
            let hot = p.hot_experts(l);
            let cold: Vec<u32> = (0..6).filter(|e| !hot.contains(e)).collect();
            let s = swap(
                &p,
                l,
                cold[next(cold.len() as u32) as usize],
                hot[next(3) as usize],
            );
            p.begin(&s).unwrap();
            if next(4) == 0 {
                p.cancel(l);
                continue;
            }
            let (flipped, _) = p.flip(l).unwrap();
            ctl.apply(&flipped).unwrap();
            assert_eq!(p.map(), &ctl);
            let mut phys = p.hot_experts(l);
            phys.sort();
            let mut logical = ctl.layer(l).unwrap().hot_experts().to_vec();
            logical.sort();
            assert_eq!(phys, logical);
            assert!(p.expert_in_slot(l, p.spare(l).unwrap()).is_none());
        }
    }
}
