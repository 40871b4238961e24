//! An LRU expert bank with a deterministic tie-break, per layer or shared by all layers, served in
//! any [`EngineMode`].
//!
//! **Eviction order** (the documented tie-break): the resident expert used least recently goes
//! first; among those last used at the same time, the one with the fewest picks at that use;
//! then the lowest id (`layer × experts + expert` in a shared bank, the expert id in a per-layer
//! one). "Time" is the step in a per-layer bank and `(step, layer)` in a shared bank, whose layers
//! run in order. The order does not depend on the order of picks within a step (proptested), so
//! no arbitrary tie-break among one step's experts moves the result.
//!
//! Per step and layer, with `T` the distinct experts picked:
//! - [`EngineMode::CopyOnMiss`] and [`EngineMode::ReadOrCopy`]: layer by layer in step order (a
//!   shared bank's later layers see the earlier layers' admissions); a miss is copied into the
//!   bank and served from HBM in the same step (read-or-copy: copied or read in place,
//!   [`super::price`]'s rule with the reuse estimate below; a read miss is not admitted),
//!   then the bank evicts down to its capacity; every copy is paid, even one evicted again within
//!   the step (when `T` exceeds the bank).
//! - [`EngineMode::InPlace`] and [`EngineMode::Cpu`]: every layer is served with the bank as it
//!   was at the step's start (misses read in place, or split between the link and the CPU), then
//!   every miss is admitted at the step's end; the copies paid are the admitted experts still
//!   resident after the step's admissions (the scoreboard's `lru (uncapped)` rule).
//!
//! Read-or-copy's reuse estimate, per `(layer, expert)`: `p = (c + 1) / (n + 2)` (Laplace's rule)
//! from its `n` touched steps so far, `c` of them right after a touched step, and `reuse =
//! p / (1 − p)`, the expected further touched steps of a geometric run. Causal (a step decides
//! with the counts before it); it ignores the reuse the evicted expert loses.

use std::collections::BTreeSet;

use expert_residency::{Geometry, ResidencyMap, Result};

use super::mode::{EngineMode, StepCost};
use super::price::{self, Channel, CpuChannel};
use crate::experts::link::LinkModel;

/// Whether a bank belongs to one layer or is shared by all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BankScope {
    /// `hot_per_layer` slots per layer.
    PerLayer,
    /// `layers × hot_per_layer` slots shared by every layer (vLLM's expert pool design).
    Shared,
}

impl BankScope {
    /// `per-layer` or `shared`.
    pub fn name(self) -> &'static str {
        match self {
            BankScope::PerLayer => "per-layer",
            BankScope::Shared => "shared",
        }
    }
}

/// The reuse estimate of read-or-copy: per `(layer, expert)`, from the steps seen so far, the
/// chance `p` that a touched step is followed by another touched step (`(c + 1) / (n + 2)`: `n`
/// touched steps, `c` of them right after a touched step, Laplace's rule), and the expected
/// further touched steps of the run in progress, `p / (1 − p)` (a geometric run). Causal: a
/// step's decision uses the counts before it.
#[derive(Debug)]
pub(crate) struct Reuse {
    touched: Vec<u32>,
    continued: Vec<u32>,
    last: Vec<u64>,
}

impl Reuse {
    pub(crate) fn new(cells: usize) -> Self {
        Reuse {
            touched: vec![0; cells],
            continued: vec![0; cells],
            last: vec![0; cells],
        }
    }

    /// Expected further touched steps of cell `i`.
    pub(crate) fn estimate(&self, i: usize) -> f64 {
        let p = (self.continued[i] as f64 + 1.0) / (self.touched[i] as f64 + 2.0);
        p / (1.0 - p)
    }

    /// Records a touch of cell `i` at step `step` (0-based).
    pub(crate) fn touch(&mut self, i: usize, step: u64) {
        let now = step + 1;
        if self.last[i] != 0 && self.last[i] + 1 == now {
            self.continued[i] = self.continued[i].saturating_add(1);
        }
        self.touched[i] = self.touched[i].saturating_add(1);
        self.last[i] = now;
    }
}

/// The LRU bank (see the module docs).
#[derive(Debug)]
pub struct LruBank {
    mode: EngineMode,
    scope: BankScope,
    link: LinkModel,
    cpu: CpuChannel,
    layers: usize,
    experts: usize,
    expert_bytes: u64,
    capacity: usize,
    /// Resident cells per set (one set per layer, or one shared), ordered by eviction key.
    sets: Vec<BTreeSet<(u64, u32, u32)>>,
    /// Per cell (`layer × experts + expert`): resident, time and picks of the last use.
    resident: Vec<bool>,
    time: Vec<u64>,
    picks: Vec<u32>,
    reuse: Reuse,
    step: u64,
    /// Scratch: picks per expert of the layer in hand, and the distinct ones.
    count: Vec<u32>,
    distinct: Vec<u32>,
}

impl LruBank {
    /// A bank for `geometry` (`hot_per_layer` slots per layer, or `layers × hot_per_layer`
    /// shared), holding `boot`'s hot experts at time 0 (`None`: empty), in `mode`, priced with
    /// `link` and `cpu`.
    ///
    /// Errors: geometry errors; [`expert_residency::ExpertError::GeometryMismatch`] when `boot`
    /// has another geometry.
    pub fn new(
        geometry: &Geometry,
        scope: BankScope,
        mode: EngineMode,
        boot: Option<&ResidencyMap>,
        link: &LinkModel,
        cpu: &CpuChannel,
    ) -> Result<Self> {
        geometry.validate()?;
        let (layers, experts) = (
            geometry.layers as usize,
            geometry.experts_per_layer as usize,
        );
        let hot = geometry.hot_per_layer as usize;
        let (nsets, capacity) = match scope {
            BankScope::PerLayer => (layers, hot),
            BankScope::Shared => (1, layers * hot),
        };
        let mut bank = LruBank {
            mode,
            scope,
            link: link.clone(),
            cpu: *cpu,
            layers,
            experts,
            expert_bytes: geometry.expert_bytes,
            capacity,
            sets: vec![BTreeSet::new(); nsets],
            resident: vec![false; layers * experts],
            time: vec![0; layers * experts],
            picks: vec![0; layers * experts],
            reuse: Reuse::new(layers * experts),
            step: 0,
            count: vec![0; experts],
            distinct: Vec::new(),
        };
        if let Some(m) = boot {
            geometry.check_same(m.geometry())?;
            for (l, h) in m.hot_sets().iter().enumerate() {
                for &e in h {
                    bank.admit(l * experts + e as usize, 0, 0);
                }
            }
        }
        Ok(bank)
    }

    fn set_of(&self, cell: usize) -> usize {
        match self.scope {
            BankScope::PerLayer => cell / self.experts,
            BankScope::Shared => 0,
        }
    }

    fn id_of(&self, cell: usize) -> u32 {
        match self.scope {
            BankScope::PerLayer => (cell % self.experts) as u32,
            BankScope::Shared => cell as u32,
        }
    }

    /// Marks `cell` used at `time` with `picks` (admitting it if absent), without evicting.
    fn admit(&mut self, cell: usize, time: u64, picks: u32) {
        let (s, id) = (self.set_of(cell), self.id_of(cell));
        if self.resident[cell] {
            self.sets[s].remove(&(self.time[cell], self.picks[cell], id));
        }
        self.resident[cell] = true;
        self.time[cell] = time;
        self.picks[cell] = picks;
        self.sets[s].insert((time, picks, id));
    }

    /// Evicts set `s` down to capacity in eviction order.
    fn evict(&mut self, s: usize) {
        while self.sets[s].len() > self.capacity {
            let (_, _, id) = self.sets[s].pop_first().expect("set above capacity");
            let cell = match self.scope {
                BankScope::PerLayer => s * self.experts + id as usize,
                BankScope::Shared => id as usize,
            };
            self.resident[cell] = false;
        }
    }

    /// Whether `expert` of `layer` is resident now.
    pub fn is_resident(&self, layer: usize, expert: u32) -> bool {
        self.resident[layer * self.experts + expert as usize]
    }

    /// Resident experts, all layers.
    pub fn resident_count(&self) -> usize {
        self.sets.iter().map(|s| s.len()).sum()
    }

    /// Serves one step (`layers[l]`: the picks of layer `l`, ids checked by the caller) and
    /// returns its cost (see the module docs).
    pub fn step(&mut self, layers: &[Vec<u32>]) -> StepCost {
        let b = self.expert_bytes;
        let mut cost = StepCost::default();
        let in_step = matches!(self.mode, EngineMode::CopyOnMiss | EngineMode::ReadOrCopy);
        let mut admitted: Vec<usize> = Vec::new();
        let mut pending: Vec<(usize, u64, u32)> = Vec::new();
        for (l, picks) in layers.iter().enumerate().take(self.layers) {
            let time = match self.scope {
                BankScope::PerLayer => self.step + 1,
                BankScope::Shared => self.step * self.layers as u64 + l as u64 + 1,
            };
            self.distinct.clear();
            for &e in picks {
                let c = &mut self.count[e as usize];
                if *c == 0 {
                    self.distinct.push(e);
                }
                *c += 1;
            }
            // Ascending ids: the layer's work does not depend on the order of its picks.
            self.distinct.sort_unstable();
            let mut cold_here = 0u64;
            for i in 0..self.distinct.len() {
                let e = self.distinct[i];
                let cell = l * self.experts + e as usize;
                let n = std::mem::take(&mut self.count[e as usize]);
                if self.resident[cell] {
                    if in_step {
                        self.admit(cell, time, n);
                    } else {
                        pending.push((cell, time, n));
                    }
                } else {
                    cost.miss_picks += n as u64;
                    match self.mode {
                        EngineMode::CopyOnMiss => {
                            cost.serving_copies += 1;
                            self.admit(cell, time, n);
                        }
                        EngineMode::ReadOrCopy => {
                            match price::read_or_copy(&self.link, b, self.reuse.estimate(cell)) {
                                Channel::Copy => {
                                    cost.serving_copies += 1;
                                    self.admit(cell, time, n);
                                }
                                Channel::Read => cost.reads += 1,
                            }
                        }
                        EngineMode::InPlace | EngineMode::Cpu => {
                            cold_here += 1;
                            pending.push((cell, time, n));
                            admitted.push(cell);
                        }
                    }
                }
                self.reuse.touch(cell, self.step);
            }
            match self.mode {
                EngineMode::InPlace => cost.reads += cold_here,
                EngineMode::Cpu => {
                    let (on_link, us) = self.cpu.split(&self.link, cold_here, b);
                    cost.reads += on_link;
                    cost.cpu += cold_here - on_link;
                    cost.split_us += us;
                }
                _ => {}
            }
            if in_step {
                let s = self.set_of(l * self.experts);
                self.evict(s);
            }
        }
        if !in_step {
            for (cell, time, n) in pending {
                self.admit(cell, time, n);
            }
            for s in 0..self.sets.len() {
                self.evict(s);
            }
            cost.boundary_copies = admitted.iter().filter(|&&c| self.resident[c]).count() as u64;
        }
        cost.picks = layers.iter().map(|p| p.len() as u64).sum();
        cost.finish(self.mode, &self.link, b);
        self.step += 1;
        cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(layers: u32, experts: u32, hot: u32) -> Geometry {
        Geometry::new(layers, experts, hot, 47_000_000).unwrap()
    }

    fn bank(g: &Geometry, scope: BankScope, mode: EngineMode, boot: bool) -> LruBank {
        let m = ResidencyMap::first_k("t", *g).unwrap();
        LruBank::new(
            g,
            scope,
            mode,
            boot.then_some(&m),
            &LinkModel::h200_pcie(),
            &CpuChannel::h200(),
        )
        .unwrap()
    }

    fn run(b: &mut LruBank, steps: &[&[&[u32]]]) -> Vec<StepCost> {
        steps
            .iter()
            .map(|s| b.step(&s.iter().map(|l| l.to_vec()).collect::<Vec<_>>()))
            .collect()
    }

    /// 1 layer, 4 experts, 2 slots, first-K boot {0, 1}; by hand:
    /// step 0 picks [2, 2, 0]: miss 2 (copied), hit 0; bank {0, 1, 2} → evict 1 (time 0) → {0, 2}.
    /// step 1 picks [3, 1]: both miss (2 copies); bank {0, 2, 3, 1}: 0 and 2 at time 1, 3 and 1
    ///   at time 2 → evict 0 (1 pick at time 1), then 2 (2 picks) → {1, 3}.
    /// step 2 picks [1, 0]: 1 hits, 0 misses; bank {3 (t2), 1 (t3), 0 (t3)} → evict 3 → {0, 1}.
    #[test]
    fn copy_on_miss_by_hand() {
        let g = geom(1, 4, 2);
        let mut b = bank(&g, BankScope::PerLayer, EngineMode::CopyOnMiss, true);
        let c = run(&mut b, &[&[&[2, 2, 0]], &[&[3, 1]], &[&[1, 0]]]);
        assert_eq!(
            c.iter().map(|c| c.serving_copies).collect::<Vec<_>>(),
            [1, 2, 1]
        );
        assert_eq!(
            c.iter().map(|c| c.miss_picks).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        assert!(b.is_resident(0, 0) && b.is_resident(0, 1) && !b.is_resident(0, 3));
        // Each copy: 47e6 B at 55 GB/s = 854.545 µs + 26.2 µs, on the critical path.
        let one = 47e6 / 55e3 + 26.2;
        for (c, n) in c.iter().zip([1.0, 2.0, 1.0]) {
            assert!((c.stall_us - n * one).abs() < 1e-6, "{}", c.stall_us);
            assert_eq!(c.reads, 0);
        }
    }

    /// The same trace with the bank shared by 2 layers (4 slots): layer 1 of a step is more
    /// recent than layer 0. Boot: layer 0 {0, 1}, layer 1 {0, 1}.
    /// step 0: L0 [2] miss → {L0:0,1,2 L1:0,1} → evict the lowest id at time 0: L0:0 (cell 0).
    ///         L1 [2] miss → evict L0:1 (cell 1) → {L0:2, L1:0, L1:1, L1:2}.
    /// step 1: L0 [0] miss → evict L1:0 (cell 4, time 0) ; L1 [1] hit.
    #[test]
    fn shared_bank_by_hand() {
        let g = geom(2, 4, 2);
        let mut b = bank(&g, BankScope::Shared, EngineMode::CopyOnMiss, true);
        let c = run(&mut b, &[&[&[2], &[2]], &[&[0], &[1]]]);
        assert_eq!(c[0].serving_copies, 2);
        assert_eq!(c[1].serving_copies, 1);
        assert_eq!(b.resident_count(), 4);
        let res: Vec<(usize, u32)> = (0..2)
            .flat_map(|l| (0..4).map(move |e| (l, e)))
            .filter(|&(l, e)| b.is_resident(l, e))
            .collect();
        assert_eq!(res, [(0, 0), (0, 2), (1, 1), (1, 2)]);
    }

    /// In place: misses read at the step, admitted at its end. 1 layer, 3 experts, 1 slot {0}.
    /// step 0 [1, 2, 2]: 2 reads; admit 1 (1 pick) and 2 (2 picks) at time 1 → keep 2: 1 copy.
    /// step 1 [2]: hit, nothing.  step 2 [0]: 1 read, 1 copy.
    #[test]
    fn in_place_lru_by_hand() {
        let g = geom(1, 3, 1);
        let mut b = bank(&g, BankScope::PerLayer, EngineMode::InPlace, true);
        let c = run(&mut b, &[&[&[1, 2, 2]], &[&[2]], &[&[0]]]);
        assert_eq!(c.iter().map(|c| c.reads).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(
            c.iter().map(|c| c.boundary_copies).collect::<Vec<_>>(),
            [1, 0, 1]
        );
        assert!(b.is_resident(0, 0));
        let link = LinkModel::h200_pcie();
        let want = link.stall_us(2 * 47_000_000, 1, 47_000_000);
        assert!((c[0].stall_us - want).abs() < 1e-9);
        assert!((want - (2000.0 + 854.545_454 + 26.2)).abs() < 1e-3);
    }

    /// Read-or-copy on GB300 prices: a copy is 1.30 reads, so the first touch (reuse estimate
    /// p = 1/2 → 1.0) copies, and so does an expert whose runs continue; one never followed by a
    /// touch drops below 0.30 and is read.
    #[test]
    fn read_or_copy_by_hand() {
        let g = geom(1, 4, 1);
        let link = LinkModel::gb300_c2c();
        let m = ResidencyMap::first_k("t", g).unwrap();
        let mut b = LruBank::new(
            &g,
            BankScope::PerLayer,
            EngineMode::ReadOrCopy,
            Some(&m),
            &link,
            &CpuChannel::h200(),
        )
        .unwrap();
        // Expert 1 on steps 0, 2, 4, 6 (never twice in a row), expert 0 in between.
        // Touches of 1 before step 2k: k, none continued: p = 1/(k + 2), reuse = 1/(k + 1):
        // step 0: 1.0 → copy; step 2: 0.5 → copy; step 4: 0.33 → copy; step 6: 0.25 → read.
        // Expert 0 (odd steps; evicted by 1 at step 0, so a miss each time), the same counts one
        // step later: step 1: 1.0, step 3: 0.5, step 5: 0.33 → copies. Step 6 reads 1.
        let steps: Vec<Vec<Vec<u32>>> = (0..7).map(|t| vec![vec![(t % 2 == 0) as u32]]).collect();
        let c: Vec<StepCost> = steps.iter().map(|s| b.step(s)).collect();
        let kinds: Vec<(u64, u64)> = c.iter().map(|c| (c.serving_copies, c.reads)).collect();
        assert_eq!(
            kinds,
            [(1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (0, 1)]
        );
        let read = link.cost.read_us(47_000_000);
        assert!((c[6].stall_us - read).abs() < 1e-9);
    }

    /// CPU mode: misses split between link and CPU, then admitted as in place.
    #[test]
    fn cpu_lru_by_hand() {
        let g = geom(1, 4, 1);
        let mut b = bank(&g, BankScope::PerLayer, EngineMode::Cpu, true);
        let c = run(&mut b, &[&[&[1, 2]]]);
        // Two misses: one on each channel at 0.90: max(1000, 927.0) / 0.9; one copy after.
        assert_eq!((c[0].reads, c[0].cpu, c[0].boundary_copies), (1, 1, 1));
        let link = LinkModel::h200_pcie();
        let want = 1000.0 / 0.9 + link.stall_us(0, 1, 47_000_000);
        assert!((c[0].stall_us - want).abs() < 1e-9, "{}", c[0].stall_us);
    }
}
