//! The default policy as copy-on-miss admission and eviction: the policy's map protects the
//! experts it wants hot, recency decides among the rest, and a per-layer duel between two shadow
//! banks says which of the two rules evicts.
//!
//! A copy-on-miss bank pays one copy per miss, whatever it keeps: admitting the missed expert
//! is free (it is already in HBM), so the only decision is which expert of the layer's `H + m`
//! (`m` misses of the step) leaves. Two rules, per layer (`H` slots):
//!
//! - **recency** (`L`): evict the least recently used, then the fewest picks at that use, then
//!   the lowest id ([`super::LruBank`]'s order): a miss is always kept;
//! - **policy** (`P`): evict first the experts the policy's map does not hold hot, in recency
//!   order, then the map's own in recency order: a miss the map wants is kept; one it does not
//!   want takes the slot of an older expert the map does not want either (recency among the
//!   unprotected), and is dropped when every other slot holds a map expert.
//!
//! Each layer keeps a shadow bank per rule (which experts would be resident had the rule always
//! evicted) and a decayed count of each shadow's misses (`× 2^(−1/half_life)` per step). The real
//! bank evicts with the rule whose shadow missed less; `L` on a tie, so with no evidence (the
//! boot, a layer never missed) the bank is an LRU bank. Causal: a step uses the counts of the
//! steps before it.
//!
//! The map is the library's [`Controller`] with its default config, fed the step's picks through
//! [`PickCounters`] as in the in-place replay; its swaps are not copied (a copy-on-miss engine
//! copies on a miss only), they only move which experts the map protects. What an engine runs:
//! the `Controller` (drain + decide as today, its `map()` read as "protected"), one recency stamp
//! per slot (the LRU planner of vLLM PR #56177 has it), and per layer two shadow tag sets of `H`
//! entries with their stamps and two miss counters: O(H) integers per layer, updated from the
//! same ids the planner sees.

use expert_residency::{
    Controller, ControllerConfig, Geometry, NullExecutor, PickCounters, ResidencyMap, Result,
    StepPicks,
};

use super::mode::{EngineMode, StepCost};
use crate::experts::link::LinkModel;

/// Steps over which a shadow's miss count halves.
pub const DUEL_HALF_LIFE_STEPS: f64 = 32.0;

/// Which rule evicts (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    Recency,
    Policy,
}

/// One bank of `H` slots of one layer: resident experts with the stamp of their last use.
#[derive(Clone, Debug)]
struct Slots {
    /// `(expert, time, picks at that use)`.
    held: Vec<(u32, u64, u32)>,
}

impl Slots {
    fn find(&self, e: u32) -> Option<usize> {
        self.held.iter().position(|h| h.0 == e)
    }

    /// Serves the layer's distinct experts `distinct` (`(expert, picks)`, ascending ids) at
    /// `time`, then evicts down to `cap` with `rule` under `protected`; returns the misses
    /// `(distinct experts, picks)`.
    fn serve(
        &mut self,
        distinct: &[(u32, u32)],
        time: u64,
        cap: usize,
        rule: Rule,
        protected: impl Fn(u32) -> bool,
    ) -> (u64, u64) {
        let (mut miss, mut miss_picks) = (0, 0);
        for &(e, n) in distinct {
            match self.find(e) {
                Some(i) => self.held[i] = (e, time, n),
                None => {
                    miss += 1;
                    miss_picks += n as u64;
                    self.held.push((e, time, n));
                }
            }
        }
        while self.held.len() > cap {
            let key = |&(e, t, n): &(u32, u64, u32)| {
                let keep = rule == Rule::Policy && protected(e);
                (keep, t, n, e)
            };
            let (i, _) = self
                .held
                .iter()
                .enumerate()
                .min_by_key(|(_, h)| key(h))
                .expect("above capacity");
            self.held.swap_remove(i);
        }
        (miss, miss_picks)
    }
}

/// The default policy's copy-on-miss bank, per layer (see the module docs).
#[derive(Debug)]
pub struct DuelBank {
    link: LinkModel,
    expert_bytes: u64,
    experts: usize,
    cap: usize,
    ctl: Controller,
    counters: PickCounters,
    null: NullExecutor,
    real: Vec<Slots>,
    shadow: Vec<[Slots; 2]>,
    /// Decayed misses of the recency and the policy shadow, per layer.
    score: Vec<[f64; 2]>,
    decay: f64,
    step: u64,
    count: Vec<u32>,
    distinct: Vec<(u32, u32)>,
    /// Layer-steps evicted by the policy rule, for the report.
    policy_layer_steps: u64,
}

impl DuelBank {
    /// A bank for `geometry` (`hot_per_layer` slots per layer) holding `boot`'s hot experts, its
    /// map driven by a [`Controller`] with `config` from `boot`, priced with `link`.
    ///
    /// Errors: geometry errors; [`expert_residency::ExpertError::GeometryMismatch`] when `boot`
    /// has another geometry; controller config errors.
    pub fn new(
        geometry: &Geometry,
        boot: &ResidencyMap,
        config: ControllerConfig,
        link: &LinkModel,
    ) -> Result<Self> {
        geometry.validate()?;
        geometry.check_same(boot.geometry())?;
        let slots = Slots {
            held: Vec::with_capacity(geometry.hot_per_layer as usize + 1),
        };
        let real: Vec<Slots> = boot
            .hot_sets()
            .iter()
            .map(|h| {
                let mut s = slots.clone();
                s.held.extend(h.iter().map(|&e| (e, 0, 0)));
                s
            })
            .collect();
        let layers = geometry.layers as usize;
        Ok(DuelBank {
            link: link.clone(),
            expert_bytes: geometry.expert_bytes,
            experts: geometry.experts_per_layer as usize,
            cap: geometry.hot_per_layer as usize,
            ctl: Controller::new(boot.clone(), config)?,
            counters: PickCounters::new(geometry)?,
            null: NullExecutor::new(),
            shadow: real.iter().map(|s| [s.clone(), s.clone()]).collect(),
            real,
            score: vec![[0.0; 2]; layers],
            decay: 0.5f64.powf(1.0 / DUEL_HALF_LIFE_STEPS),
            step: 0,
            count: vec![0; geometry.experts_per_layer as usize],
            distinct: Vec::new(),
            policy_layer_steps: 0,
        })
    }

    /// Whether `expert` of `layer` is resident now.
    pub fn is_resident(&self, layer: usize, expert: u32) -> bool {
        self.real[layer].find(expert).is_some()
    }

    /// Layer-steps whose eviction followed the policy rule (the rest followed recency).
    pub fn policy_layer_steps(&self) -> u64 {
        self.policy_layer_steps
    }

    /// Serves one step in copy-on-miss (ids checked by the caller) and returns its cost: every
    /// miss one serving copy, no boundary copy. Then feeds the step to the controller.
    ///
    /// Errors: counter and controller errors (none for a validated trace).
    pub fn step(&mut self, step: &StepPicks) -> Result<StepCost> {
        let mut cost = StepCost::default();
        let time = self.step + 1;
        for (l, picks) in step.layers.iter().enumerate().take(self.real.len()) {
            self.distinct.clear();
            for &e in picks {
                let c = &mut self.count[e as usize];
                if *c == 0 {
                    self.distinct.push((e, 0));
                }
                *c += 1;
            }
            for d in &mut self.distinct {
                d.1 = std::mem::take(&mut self.count[d.0 as usize]);
            }
            self.distinct.sort_unstable();
            let row = &self.ctl.map().layers()[l];
            let protected = |e: u32| row.table()[e as usize] >= 0;
            let [s, p] = self.score[l];
            let rule = if p < s { Rule::Policy } else { Rule::Recency };
            if rule == Rule::Policy {
                self.policy_layer_steps += 1;
            }
            let (miss, miss_picks) =
                self.real[l].serve(&self.distinct, time, self.cap, rule, protected);
            cost.serving_copies += miss;
            cost.miss_picks += miss_picks;
            for (k, r) in [Rule::Recency, Rule::Policy].into_iter().enumerate() {
                let (m, _) = self.shadow[l][k].serve(&self.distinct, time, self.cap, r, protected);
                self.score[l][k] = self.score[l][k] * self.decay + m as f64;
            }
        }
        debug_assert!(self.experts > 0);
        cost.picks = step.layers.iter().map(|p| p.len() as u64).sum();
        cost.finish(EngineMode::CopyOnMiss, &self.link, self.expert_bytes);
        self.counters.record_step(step)?;
        self.ctl.step(&self.counters, &mut self.null)?;
        self.step += 1;
        Ok(cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 47_000_000;

    fn bank(layers: u32, experts: u32, hot: u32) -> DuelBank {
        let g = Geometry::new(layers, experts, hot, B).unwrap();
        let m = ResidencyMap::first_k("t", g).unwrap();
        DuelBank::new(&g, &m, ControllerConfig::default(), &LinkModel::h200_pcie()).unwrap()
    }

    fn step(l: &[&[u32]]) -> StepPicks {
        StepPicks {
            layers: l.iter().map(|p| p.to_vec()).collect(),
        }
    }

    /// The policy rule by hand: 1 layer, 4 experts, 2 slots {0 (t0), 1 (t0)}, map protecting
    /// {1}: serving [2] at t1 holds {0, 1, 2}; the unprotected 0 and 2 go first in recency
    /// order → 0 leaves. Serving [3] at t2: unprotected {2 (t1), 3 (t2)} → 2 leaves: {1, 3}.
    /// The recency rule on the same: [2] evicts 0 (t0, lower id than 1), [3] evicts 1 → {2, 3}.
    #[test]
    fn rules_by_hand() {
        let boot = Slots {
            held: vec![(0, 0, 0), (1, 0, 0)],
        };
        let prot = |e: u32| e == 1;
        let (mut p, mut r) = (boot.clone(), boot);
        assert_eq!(p.serve(&[(2, 1)], 1, 2, Rule::Policy, prot), (1, 1));
        assert_eq!(p.serve(&[(3, 2)], 2, 2, Rule::Policy, prot), (1, 2));
        let mut held: Vec<u32> = p.held.iter().map(|h| h.0).collect();
        held.sort_unstable();
        assert_eq!(held, [1, 3]);
        r.serve(&[(2, 1)], 1, 2, Rule::Recency, prot);
        r.serve(&[(3, 1)], 2, 2, Rule::Recency, prot);
        let mut held: Vec<u32> = r.held.iter().map(|h| h.0).collect();
        held.sort_unstable();
        assert_eq!(held, [2, 3]);
        // A step touching more experts than slots pays every copy and keeps the capacity.
        assert_eq!(
            r.serve(&[(0, 1), (1, 1), (2, 1)], 3, 2, Rule::Recency, prot),
            (2, 2)
        );
        assert_eq!(r.held.len(), 2);
    }

    /// With no evidence the bank is an LRU bank: 1 layer, 4 experts, 2 slots, boot {0, 1}; the
    /// trace of `LruBank`'s `copy_on_miss_by_hand` ([2, 2, 0], [3, 1], [1, 0]): 1, 2, 1 copies,
    /// each 47e6 B / 55 GB/s + 26.2 µs, ending on {0, 1}. The shadows miss alike until the
    /// controller's map differs from the boot, so the recency rule evicts throughout.
    #[test]
    fn no_evidence_is_lru_by_hand() {
        let mut b = bank(1, 4, 2);
        let c: Vec<StepCost> = [&[2u32, 2, 0][..], &[3, 1], &[1, 0]]
            .iter()
            .map(|p| b.step(&step(&[p])).unwrap())
            .collect();
        assert_eq!(
            c.iter().map(|c| c.serving_copies).collect::<Vec<_>>(),
            [1, 2, 1]
        );
        assert_eq!(
            c.iter().map(|c| c.miss_picks).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        let one = B as f64 / 55e3 + 26.2;
        for (c, n) in c.iter().zip([1.0, 2.0, 1.0]) {
            assert!((c.stall_us - n * one).abs() < 1e-6);
            assert_eq!((c.reads, c.boundary_copies), (0, 0));
        }
        assert!(b.is_resident(0, 0) && b.is_resident(0, 1));
    }

    /// The duel follows the shadow that misses less. 1 layer, 3 experts, 1 slot, boot {0}.
    /// Expert 0 every even step, experts 1 and 2 alternately on odd steps: 0, 1, 0, 2, 0, 1, …
    /// Recency misses every step after the first (each expert evicts the previous one); the
    /// map protects 0 (first-K boot, and 0 stays the hottest), so the policy shadow misses only
    /// on the odd steps, leads from step 2 on, and the real bank stops evicting 0: from then on
    /// it misses on odd steps only.
    #[test]
    fn duel_follows_the_better_shadow() {
        let mut b = bank(1, 3, 1);
        let seq: Vec<u32> = (0..400)
            .map(|t| if t % 2 == 0 { 0 } else { 1 + (t / 2 % 2) })
            .collect();
        let copies: Vec<u64> = seq
            .iter()
            .map(|&e| b.step(&step(&[&[e]])).unwrap().serving_copies)
            .collect();
        // Step 0 hits (boot {0}); the last 100 steps: only the 50 odd ones miss.
        assert_eq!(copies[0], 0);
        assert_eq!(copies[300..].iter().sum::<u64>(), 50);
        assert!(copies[300..].iter().step_by(2).all(|&c| c == 0));
        assert!(b.policy_layer_steps() > 0);
        // An LRU bank misses 399 of the 400 steps; this one about half.
        let total: u64 = copies.iter().sum();
        assert!(total <= 202, "{total}");
    }
}
