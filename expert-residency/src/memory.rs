//! The in-memory swap executor: byte buffers standing in for HBM and pinned host memory, every
//! move checked with checksums.

use std::hash::{Hash, Hasher};

use crate::error::{ExpertError, Result};
use crate::executor::{check_layer_idle, PlannedSwap, SwapCompletion, SwapExecutor, SwapOutcome};
use crate::geometry::Geometry;
use crate::rowmap::ResidencyMap;
use tier_core::alloc::{try_collect, try_filled};
use tier_core::NOT_RESIDENT;

/// An executor over plain byte buffers that proves every move lossless: the executor of the
/// reference examples (`examples/examples/experts_engine_loop.rs`, the C ABI's `engine_loop.c`)
/// and the object behind Python's `MemoryExecutor` and C's `tierkit_executor_new_memory`,
/// standing in for the GPU expert bank (`gpu::GpuExecutor`, feature `cuda`) in a CPU-only
/// integration; the lab's replays use it too.
///
/// - host: `[layers][experts][bytes]`, every expert's weights (cold experts are read in place);
///   filled with seeded random bytes and never written after.
/// - HBM: `[layers][slots_per_layer][bytes]` ([`Geometry::slots_per_layer`]): the hot slots plus
///   one spare per layer.
/// - table: `[layers][experts]` i32, the physical HBM slot an expert is read from, or [`NOT_RESIDENT`].
///
/// `begin` copies the incoming expert host → the layer's spare slot; `commit_ready` checks the
/// copy's checksum against the host copy's, flips the table (incoming → spare, outgoing → host)
/// and makes the outgoing slot the new spare. `bytes` per expert is a stand-in size (the
/// geometry's `expert_bytes` may be megabytes).
#[derive(Debug)]
pub struct MemoryExecutor {
    geometry: Geometry,
    bytes: usize,
    host: Vec<u8>,
    hbm: Vec<u8>,
    table: Vec<i32>,
    spare: Vec<u32>,
    host_sums: Vec<u64>,
    pending: Vec<PlannedSwap>,
    verified: u64,
}

/// Fills `bytes` with a deterministic pseudo-random stream of `seed` (SplitMix64, Steele et al.
/// 2014): distinct bytes per expert, so a misplaced copy shows in the checksums.
fn fill_pseudo_random(bytes: &mut [u8], seed: u64) {
    let mut state = seed;
    for chunk in bytes.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

/// Checksum of a byte run (SipHash-1-3 with fixed keys, from `std`; stable within one build).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl MemoryExecutor {
    /// Most bytes (host plus HBM buffers) one executor allocates: 1 GiB.
    pub const MAX_BYTES: usize = 1 << 30;

    /// An executor holding `map`'s hot experts in HBM slots `0..hot` (slot
    /// [`Geometry::spare_slot`] is the spare), with `bytes` random bytes per expert drawn from
    /// `seed`.
    ///
    /// It allocates `layers × (experts + slots_per_layer) × bytes` bytes, at most
    /// [`MemoryExecutor::MAX_BYTES`] (1 GiB): it stands in for the real bank in the reference examples, tests and replays.
    ///
    /// Errors: [`ExpertError::InvalidConfig`] for `bytes == 0`, for buffers above
    /// [`MemoryExecutor::MAX_BYTES`] (or overflowing `usize`); [`ExpertError::OutOfMemory`] if
    /// they cannot be allocated; geometry errors of [`Geometry::validate`].
    pub fn new(map: &ResidencyMap, bytes: usize, seed: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(ExpertError::InvalidConfig(
                "bytes per expert must be ≥ 1".into(),
            ));
        }
        let g = *map.geometry();
        g.validate()?;
        let (layers, experts, slots) = (
            g.layers as usize,
            g.experts_per_layer as usize,
            g.slots_per_layer() as usize,
        );
        let too_big = || {
            ExpertError::InvalidConfig(format!(
                "{bytes} stand-in bytes per expert for {layers} layers × {experts} experts exceed \
                 the in-memory executor's limit of {} bytes",
                Self::MAX_BYTES
            ))
        };
        let host_len = (layers * experts).checked_mul(bytes).ok_or_else(too_big)?;
        let hbm_len = (layers * slots).checked_mul(bytes).ok_or_else(too_big)?;
        if host_len
            .checked_add(hbm_len)
            .is_none_or(|t| t > Self::MAX_BYTES)
        {
            return Err(too_big());
        }
        let mut host = try_filled(host_len, 0, "in-memory executor host bytes")?;
        let hbm = try_filled(hbm_len, 0, "in-memory executor HBM bytes")?;
        fill_pseudo_random(&mut host, seed);
        let host_sums = try_collect(
            layers * experts,
            host.chunks_exact(bytes).map(checksum),
            "in-memory executor checksums",
        )?;
        let mut ex = MemoryExecutor {
            geometry: g,
            bytes,
            hbm,
            table: try_filled(layers * experts, NOT_RESIDENT, "in-memory executor table")?,
            spare: try_filled(layers, g.spare_slot(), "in-memory executor table")?,
            host,
            host_sums,
            pending: Vec::new(),
            verified: 0,
        };
        for (l, row) in map.layers().iter().enumerate() {
            for (slot, &e) in row.hot_experts().iter().enumerate() {
                ex.copy_in(l, e as usize, slot);
                ex.table[l * experts + e as usize] = slot as i32;
            }
        }
        Ok(ex)
    }

    fn copy_in(&mut self, layer: usize, expert: usize, phys: usize) {
        let (experts, slots) = (
            self.geometry.experts_per_layer as usize,
            self.geometry.slots_per_layer() as usize,
        );
        let src = (layer * experts + expert) * self.bytes;
        let dst = (layer * slots + phys) * self.bytes;
        self.hbm[dst..dst + self.bytes].copy_from_slice(&self.host[src..src + self.bytes]);
    }

    fn hbm_slot(&self, layer: usize, phys: usize) -> &[u8] {
        let slots = self.geometry.slots_per_layer() as usize;
        let at = (layer * slots + phys) * self.bytes;
        &self.hbm[at..at + self.bytes]
    }

    /// The `(layer, expert) → HBM slot or NOT_RESIDENT` table, `[layers × experts]` i32.
    pub fn table(&self) -> &[i32] {
        &self.table
    }

    /// The weights an engine would read for `expert` of `layer` now (HBM slot or host copy).
    pub fn read(&self, layer: u32, expert: u32) -> Result<&[u8]> {
        self.geometry.check_layer(layer)?;
        self.geometry.check_expert(expert)?;
        let (l, e) = (layer as usize, expert as usize);
        let experts = self.geometry.experts_per_layer as usize;
        Ok(match self.table[l * experts + e] {
            NOT_RESIDENT => &self.host[(l * experts + e) * self.bytes..][..self.bytes],
            phys => self.hbm_slot(l, phys as usize),
        })
    }

    /// Moves whose checksum was verified at commit.
    pub fn verified_moves(&self) -> u64 {
        self.verified
    }

    /// Digest of what an engine would read for every `(layer, expert)`, in id order: equal before
    /// and after any sequence of committed swaps iff no byte was lost or misplaced.
    pub fn read_digest(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        for l in 0..self.geometry.layers {
            for e in 0..self.geometry.experts_per_layer {
                self.read(l, e).expect("ids in range").hash(&mut h);
            }
        }
        h.finish()
    }

    /// Checks every invariant: the host bytes are untouched (checksums), every HBM-resident
    /// expert's slot holds exactly its host bytes, each layer's slots are distinct and the spare
    /// is unused, and the table's hot sets equal `map`'s.
    ///
    /// Errors: [`ExpertError::Executor`] naming the first violation.
    pub fn verify(&self, map: &ResidencyMap) -> Result<()> {
        let g = self.geometry;
        g.check_same(map.geometry())?;
        let experts = g.experts_per_layer as usize;
        for (i, chunk) in self.host.chunks_exact(self.bytes).enumerate() {
            if checksum(chunk) != self.host_sums[i] {
                return Err(ExpertError::Executor(format!(
                    "host copy of cell {i} changed"
                )));
            }
        }
        for (l, row) in map.layers().iter().enumerate() {
            let mut used = vec![false; g.slots_per_layer() as usize];
            for e in 0..experts {
                let t = self.table[l * experts + e];
                if (t != NOT_RESIDENT) != row.is_hot(e as u32) {
                    return Err(ExpertError::Executor(format!(
                        "layer {l} expert {e}: table {t} disagrees with the rowmap"
                    )));
                }
                if t != NOT_RESIDENT {
                    let p = t as usize;
                    if p == self.spare[l] as usize || std::mem::replace(&mut used[p], true) {
                        return Err(ExpertError::Executor(format!(
                            "layer {l}: slot {p} used twice"
                        )));
                    }
                    if checksum(self.hbm_slot(l, p)) != self.host_sums[l * experts + e] {
                        return Err(ExpertError::Executor(format!(
                            "layer {l} expert {e}: HBM slot {p} checksum differs from host"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

impl SwapExecutor for MemoryExecutor {
    fn geometry(&self) -> Option<Geometry> {
        Some(self.geometry)
    }

    fn can_begin(&self, layer: u32) -> bool {
        check_layer_idle(&self.pending, layer).is_ok()
    }

    fn begin(&mut self, swap: &PlannedSwap) -> Result<()> {
        let g = self.geometry;
        g.check_layer(swap.layer)?;
        g.check_expert(swap.incoming)?;
        g.check_expert(swap.outgoing)?;
        check_layer_idle(&self.pending, swap.layer)?;
        let experts = g.experts_per_layer as usize;
        let (l, inc, out) = (
            swap.layer as usize,
            swap.incoming as usize,
            swap.outgoing as usize,
        );
        if self.table[l * experts + inc] != NOT_RESIDENT
            || self.table[l * experts + out] == NOT_RESIDENT
        {
            return Err(ExpertError::Executor(format!(
                "layer {l}: incoming {inc} must be on host and outgoing {out} in HBM"
            )));
        }
        self.copy_in(l, inc, self.spare[l] as usize);
        self.pending.push(*swap);
        Ok(())
    }

    fn commit_ready(
        &mut self,
        accept: &mut dyn FnMut(&PlannedSwap) -> bool,
    ) -> Result<Vec<SwapCompletion>> {
        let experts = self.geometry.experts_per_layer as usize;
        let mut out = Vec::with_capacity(self.pending.len());
        for swap in std::mem::take(&mut self.pending) {
            let l = swap.layer as usize;
            let spare = self.spare[l] as usize;
            let outcome = if !accept(&swap) {
                SwapOutcome::Discarded
            } else if checksum(self.hbm_slot(l, spare))
                != self.host_sums[l * experts + swap.incoming as usize]
            {
                SwapOutcome::Failed
            } else {
                let old = self.table[l * experts + swap.outgoing as usize];
                self.table[l * experts + swap.incoming as usize] = spare as i32;
                self.table[l * experts + swap.outgoing as usize] = NOT_RESIDENT;
                // No reader can still see the old slot: commits happen at step boundaries.
                self.spare[l] = old as u32;
                self.verified += 1;
                SwapOutcome::Committed
            };
            out.push(SwapCompletion { swap, outcome });
        }
        Ok(out)
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_commit_and_discard() {
        let g = Geometry::new(2, 6, 2, 1 << 20).unwrap();
        let mut map = ResidencyMap::first_k("t", g).unwrap();
        let mut ex = MemoryExecutor::new(&map, 32, 7).unwrap();
        let d0 = ex.read_digest();
        ex.verify(&map).unwrap();
        let s = PlannedSwap {
            layer: 1,
            incoming: 4,
            outgoing: 0,
            slot: 0,
            generation: 0,
        };
        ex.begin(&s).unwrap();
        assert!(ex
            .begin(&PlannedSwap {
                incoming: 5,
                outgoing: 1,
                slot: 1,
                ..s
            })
            .is_err());
        let done = ex.commit_ready(&mut |_| true).unwrap();
        assert_eq!(done[0].outcome, SwapOutcome::Committed);
        map.apply(&s).unwrap();
        ex.verify(&map).unwrap();
        assert_eq!(ex.read_digest(), d0);
        // Discarded: nothing flips.
        let s2 = PlannedSwap {
            incoming: 5,
            outgoing: 1,
            slot: 1,
            generation: 1,
            ..s
        };
        ex.begin(&s2).unwrap();
        let done = ex.commit_ready(&mut |_| false).unwrap();
        assert_eq!(done[0].outcome, SwapOutcome::Discarded);
        ex.verify(&map).unwrap();
        assert!(ex.begin(&PlannedSwap { incoming: 1, ..s2 }).is_err());
        assert!(MemoryExecutor::new(&map, 0, 1).is_err());
    }

    #[test]
    fn huge_stand_in_sizes_are_config_errors() {
        let g = Geometry::new(2, 6, 2, 1 << 20).unwrap();
        let map = ResidencyMap::first_k("t", g).unwrap();
        // usize::MAX overflows, 2^60 wraps the product to 0 unchecked, 10^10 is 10 TB.
        for b in [
            usize::MAX,
            1 << 60,
            10_000_000_000,
            MemoryExecutor::MAX_BYTES,
        ] {
            let e = MemoryExecutor::new(&map, b, 1).unwrap_err();
            assert!(matches!(e, ExpertError::InvalidConfig(_)), "{b}: {e}");
        }
        // 18 cells of 1 MiB fit.
        assert!(MemoryExecutor::new(&map, 1 << 20, 1).is_ok());
    }
}
