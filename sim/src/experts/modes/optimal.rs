//! The offline optimum of each engine mode: the divisor of the modes table's `vs optimum` column
//! and its `offline optimum` rows, one per mode and bank scope where an exact optimum exists.
//!
//! Every optimum's map at step 0 is free (as the scoreboard's, `experts::optimum`
//! item 5), so it is at most every row of the same mode and bank scope, whichever map the row
//! boots from. Which optimum each mode's ratio uses:
//!
//! - **`in-place`**, per layer: the scoreboard's exact optimum (`experts::optimum`: Belady
//!   with bypass and copy costs, a min-cost flow per layer). Shared bank: the same flow jointly
//!   over every `(layer, expert)` cell with `layers × H` slots (one flow, one thread; computed
//!   below the same work bound as the per-layer one, [`crate::experts::shared_optimum_work`]).
//! - **`copy-on-miss`**: every miss is copied and served from HBM, whatever the bank keeps, so a
//!   step costs `copy_us` per distinct expert not in the bank at the step's start; afterwards the
//!   bank may hold any `H` (shared: `layers × H`) of what it held and what the step touched (a
//!   policy's map may also copy in an expert the step did not touch, at the same price when no
//!   copy time is hidden: never cheaper than copying it on its next miss). This is paging with
//!   uniform costs, for which **Belady's MIN** is exact (Belady 1966): keep the experts whose next
//!   touch is soonest, evict the one whose next touch is farthest (`belady`, proptested against
//!   a brute force over every bank schedule, prefetches included). Per layer it runs per step;
//!   the shared bank runs it over `(step, layer)` in layer order, as [`super::LruBank`]'s shared
//!   bank serves them. Exact, and fast (`O(touches × log slots)`): always computed.
//! - **`read-or-copy`**: where a copy costs at most a read (`copy_us ≤ read_us`, the H200 PCIe
//!   link), a miss costs one copy whichever way it is served, so the copy-on-miss optimum is
//!   read-or-copy's exact optimum too. Where a read is cheaper (GB300), a miss costs a read if
//!   the expert is dropped and a copy if kept: that two-price problem is not computed (`-`).
//! - **`cpu`**: a layer's cold experts split between two channels cost the longer channel's
//!   time, not linear in the cold experts: no optimum is computed (`-`).
//!
//! Copies hidden behind a step (`hide_us > 0` on a shared link) make the stall non-linear: no
//! optimum is computed there (`experts::optimum::unit_costs`).

use std::collections::BTreeSet;

use expert_residency::{Geometry, Result};

use super::{price, BankScope, EngineMode, ModeOptions, ModeRow, StepCost, Totals};
use crate::experts::optimum::{self, OptimumStep};
use crate::experts::scoreboard::OPTIMUM_LABEL;
use crate::experts::trace::Trace;

/// The optima of the modes table: one [`ModeRow`] per (mode, bank scope) computed, labelled
/// [`OPTIMUM_LABEL`] with boot `optimal`, and a note per optimum not computed.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModeOptima {
    /// The optimum rows (`vs_optimum` 1), in table order.
    pub rows: Vec<ModeRow>,
    /// Per (mode, bank) not computed: why.
    pub notes: Vec<String>,
}

impl ModeOptima {
    /// Sets each row's `vs_optimum`: its stall over the optimum of its mode and bank scope
    /// (`None` where that optimum is not computed or is 0).
    pub fn fill(&self, rows: &mut [ModeRow]) {
        for r in rows {
            r.vs_optimum = self
                .rows
                .iter()
                .find(|o| o.mode == r.mode && o.bank == r.bank)
                .and_then(|o| {
                    (o.stall_ms_per_step > 0.0).then(|| r.stall_ms_per_step / o.stall_ms_per_step)
                });
        }
    }
}

/// Computes the optimum of every mode of `modes` and both bank scopes where one exists (module
/// docs). The in-place min-cost flows run only where their work bound
/// ([`crate::experts::optimum_work`], [`crate::experts::shared_optimum_work`]) is at most
/// `max_flow_work` (`None`: always); the rest have a note.
///
/// Errors: trace errors of [`crate::experts::validate_trace`]; [`ModeOptions::validate`]'s.
pub fn mode_optima(
    trace: &Trace,
    geometry: &Geometry,
    modes: &[EngineMode],
    opts: &ModeOptions,
    max_flow_work: Option<u64>,
) -> Result<ModeOptima> {
    crate::experts::validate_trace(trace, geometry)?;
    opts.validate()?;
    let link = &opts.link;
    let b = geometry.expert_bytes;
    let mut out = ModeOptima::default();
    let linear = optimum::unit_costs(link, b).err().map(|e| e.to_string());
    let copy_is_cheaper = price::read_or_copy(link, b, 0.0) == price::Channel::Copy;
    let mut copy_rows: Option<Vec<(BankScope, Totals)>> = None;
    for &mode in &EngineMode::ALL {
        if !modes.contains(&mode) {
            continue;
        }
        for scope in [BankScope::PerLayer, BankScope::Shared] {
            let what = format!("{} {}", mode.name(), scope.name());
            if let Some(why) = &linear {
                out.notes.push(format!("{what}: not computed: {why}"));
                continue;
            }
            let totals = match mode {
                EngineMode::InPlace => {
                    let work = match scope {
                        BankScope::PerLayer => crate::experts::optimum_work(trace, geometry),
                        BankScope::Shared => crate::experts::shared_optimum_work(trace, geometry),
                    };
                    if max_flow_work.is_some_and(|m| work > m) {
                        out.notes.push(format!(
                            "{what}: not computed: its min-cost flow's work bound {work:.3e} is \
                             above {:.0e} (minutes, not seconds); --optimum always computes it",
                            max_flow_work.unwrap_or(0) as f64
                        ));
                        continue;
                    }
                    let steps = match scope {
                        BankScope::PerLayer => optimum::solve(trace, geometry, link)?,
                        BankScope::Shared => optimum::solve_shared(trace, geometry, link)?,
                    };
                    in_place_totals(trace, &steps, opts, b)
                }
                EngineMode::CopyOnMiss | EngineMode::ReadOrCopy => {
                    if mode == EngineMode::ReadOrCopy && !copy_is_cheaper {
                        out.notes.push(format!(
                            "{what}: not computed: on link {} a read is cheaper than a copy, so a \
                             miss costs a read if dropped and a copy if kept (not Belady's \
                             uniform cost)",
                            link.name
                        ));
                        continue;
                    }
                    let cached = copy_rows.get_or_insert_with(|| {
                        [BankScope::PerLayer, BankScope::Shared]
                            .iter()
                            .map(|&s| (s, copy_totals(trace, geometry, s, opts)))
                            .collect()
                    });
                    cached
                        .iter()
                        .find(|(s, _)| *s == scope)
                        .map(|(_, t)| *t)
                        .expect("both scopes computed")
                }
                EngineMode::Cpu => {
                    out.notes.push(format!(
                        "{what}: not computed: a layer's cold experts split between the link and \
                         the CPU cost the longer channel's time, not linear in them"
                    ));
                    continue;
                }
            };
            let mut row = totals.row(mode, OPTIMUM_LABEL, scope.name(), "optimal", b);
            row.vs_optimum = Some(1.0);
            out.rows.push(row);
        }
    }
    // vs in-place: over the in-place optimum of the same scope, where both are computed.
    let in_place: Vec<(String, f64)> = out
        .rows
        .iter()
        .filter(|r| r.mode == EngineMode::InPlace)
        .map(|r| (r.bank.clone(), r.stall_ms_per_step))
        .collect();
    for r in &mut out.rows {
        r.vs_in_place = in_place
            .iter()
            .find(|(bank, _)| *bank == r.bank)
            .and_then(|&(_, s)| (s > 0.0).then(|| r.stall_ms_per_step / s));
    }
    Ok(out)
}

/// The in-place optimum's schedule priced as the in-place rows are ([`StepCost::finish`]).
fn in_place_totals(trace: &Trace, steps: &[OptimumStep], opts: &ModeOptions, b: u64) -> Totals {
    let mut t = Totals::default();
    for (s, o) in trace.steps.iter().zip(steps) {
        let mut c = StepCost {
            picks: s.layers.iter().map(|p| p.len() as u64).sum(),
            miss_picks: o.cold_lookups,
            reads: o.cold_unique,
            boundary_copies: o.copies,
            ..StepCost::default()
        };
        c.finish(EngineMode::InPlace, &opts.link, b);
        t.add(&c);
    }
    t
}

/// Belady's MIN over the trace in copy-on-miss, priced as the copy-on-miss rows are: per layer
/// (time = step, cells = experts, `H` slots) or shared (time = `(step, layer)`, cells = `(layer,
/// expert)`, `layers × H` slots).
fn copy_totals(trace: &Trace, geometry: &Geometry, scope: BankScope, opts: &ModeOptions) -> Totals {
    let b = geometry.expert_bytes;
    let (layers, experts) = (
        geometry.layers as usize,
        geometry.experts_per_layer as usize,
    );
    let hot = geometry.hot_per_layer as usize;
    let steps = trace.steps.len();
    // Per step: misses (distinct experts) and missed picks, summed over layers.
    let mut per_step = vec![(0u64, 0u64); steps];
    match scope {
        BankScope::PerLayer => {
            for l in 0..layers {
                let units: Vec<&[u32]> =
                    trace.steps.iter().map(|s| s.layers[l].as_slice()).collect();
                for (acc, m) in per_step.iter_mut().zip(belady(&units, experts, hot)) {
                    acc.0 += m.0;
                    acc.1 += m.1;
                }
            }
        }
        BankScope::Shared => {
            let cells: Vec<Vec<u32>> = trace
                .steps
                .iter()
                .flat_map(|s| {
                    s.layers
                        .iter()
                        .enumerate()
                        .take(layers)
                        .map(|(l, p)| p.iter().map(|&e| (l * experts) as u32 + e).collect())
                })
                .collect();
            let units: Vec<&[u32]> = cells.iter().map(Vec::as_slice).collect();
            for (u, m) in belady(&units, layers * experts, layers * hot)
                .into_iter()
                .enumerate()
            {
                let acc = &mut per_step[u / layers];
                acc.0 += m.0;
                acc.1 += m.1;
            }
        }
    }
    let mut t = Totals::default();
    for (s, &(misses, miss_picks)) in trace.steps.iter().zip(&per_step) {
        let mut c = StepCost {
            picks: s.layers.iter().map(|p| p.len() as u64).sum(),
            miss_picks,
            serving_copies: misses,
            ..StepCost::default()
        };
        c.finish(EngineMode::CopyOnMiss, &opts.link, b);
        t.add(&c);
    }
    t
}

/// Belady's MIN with forced admission and a free initial bank: `units[u]` are the cells (ids `<
/// cells`, repeats allowed) requested at time `u`, served together by the bank as it is at `u`'s
/// start; a bank of `capacity` cells. At each `u` every distinct requested cell not in the bank
/// is a miss (copied in), then the bank keeps the `capacity` cells of what it held and what `u`
/// requested whose next request is soonest (never again: last). Before `u = 0` the bank holds the
/// `capacity` cells first requested soonest. Returns per `u`: (distinct misses, missed picks).
///
/// Optimal for the number of misses over every schedule that keeps at most `capacity` cells
/// between times, prefetches included (Belady 1966; the exchange argument: a bank that keeps a
/// cell needed later instead of one needed sooner can swap them and miss no more).
pub(crate) fn belady(units: &[&[u32]], cells: usize, capacity: usize) -> Vec<(u64, u64)> {
    const NEVER: usize = usize::MAX;
    // Distinct cells per unit with their picks, and each one's next request (backwards pass).
    let mut stamp = vec![NEVER; cells];
    let mut slot = vec![0usize; cells];
    let mut distinct: Vec<(u32, u64, usize)> = Vec::new(); // (cell, picks, next request)
    let mut start = Vec::with_capacity(units.len() + 1);
    for (u, picks) in units.iter().enumerate() {
        start.push(distinct.len());
        for &x in picks.iter() {
            let x = x as usize;
            if stamp[x] == u {
                distinct[slot[x]].1 += 1;
            } else {
                stamp[x] = u;
                slot[x] = distinct.len();
                distinct.push((x as u32, 1, NEVER));
            }
        }
    }
    start.push(distinct.len());
    let mut next = vec![NEVER; cells];
    for u in (0..units.len()).rev() {
        for d in &mut distinct[start[u]..start[u + 1]] {
            d.2 = next[d.0 as usize];
            next[d.0 as usize] = u;
        }
    }
    // `next` now holds each cell's first request: the free initial bank.
    let mut bank: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut key = vec![NEVER; cells];
    let mut resident = vec![false; cells];
    let mut first: Vec<(usize, u32)> = (0..cells)
        .filter(|&x| next[x] != NEVER)
        .map(|x| (next[x], x as u32))
        .collect();
    first.sort_unstable();
    for &(n, x) in first.iter().take(capacity) {
        bank.insert((n, x));
        key[x as usize] = n;
        resident[x as usize] = true;
    }
    let mut out = vec![(0u64, 0u64); units.len()];
    for (u, o) in out.iter_mut().enumerate() {
        for &(x, picks, nxt) in &distinct[start[u]..start[u + 1]] {
            let xi = x as usize;
            if resident[xi] {
                bank.remove(&(key[xi], x));
            } else {
                o.0 += 1;
                o.1 += picks;
                resident[xi] = true;
            }
            key[xi] = nxt;
            bank.insert((nxt, x));
        }
        while bank.len() > capacity {
            let (_, x) = bank.pop_last().expect("bank above capacity");
            resident[x as usize] = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The least misses over every schedule of banks of at most `capacity` cells (a bitmask of
    /// `cells ≤ 6`): a step costs its requested cells not in the bank; between steps the bank
    /// becomes any set, each cell added that the step did not request costing one (a prefetch).
    /// The bank before step 0 is free.
    fn brute_force(units: &[&[u32]], cells: usize, capacity: usize) -> u64 {
        let states: Vec<u32> = (0..1u32 << cells)
            .filter(|m| m.count_ones() as usize <= capacity)
            .collect();
        let mut best: Vec<u64> = states.iter().map(|_| 0).collect();
        for picks in units {
            let req = picks.iter().fold(0u32, |m, &x| m | 1 << x);
            best = states
                .iter()
                .map(|&to| {
                    states
                        .iter()
                        .zip(&best)
                        .map(|(&from, &cost)| {
                            let miss = (req & !from).count_ones() as u64;
                            let fetch = (to & !(from | req)).count_ones() as u64;
                            cost + miss + fetch
                        })
                        .min()
                        .expect("the empty bank is a state")
                })
                .collect();
        }
        // The last step's misses were charged on leaving its bank; nothing after.
        best.into_iter().min().unwrap_or(0)
    }

    /// By hand: 1 slot, requests a, b, a, c, a: MIN keeps a (free at the start), misses b, keeps
    /// a (next at 2, b never again), then c misses and a stays: 2 misses.
    #[test]
    fn belady_by_hand() {
        let u: Vec<&[u32]> = vec![&[0], &[1], &[0], &[2], &[0, 0]];
        let m = belady(&u, 3, 1);
        assert_eq!(m, [(0, 0), (1, 1), (0, 0), (1, 1), (0, 0)]);
        // Two cells at once in one slot: both paid, the sooner-needed one kept.
        let u: Vec<&[u32]> = vec![&[0], &[1, 2, 2], &[2], &[1]];
        assert_eq!(belady(&u, 3, 1), [(0, 0), (2, 3), (0, 0), (1, 1)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Belady's misses equal the brute force's on small traces.
        #[test]
        fn belady_matches_brute_force(
            cells in 1usize..6,
            capacity in 0usize..4,
            raw in prop::collection::vec(prop::collection::vec(0u32..6, 0..4), 0..9),
        ) {
            let units: Vec<Vec<u32>> = raw
                .iter()
                .map(|p| p.iter().map(|&x| x % cells as u32).collect())
                .collect();
            let refs: Vec<&[u32]> = units.iter().map(Vec::as_slice).collect();
            let got: u64 = belady(&refs, cells, capacity).iter().map(|m| m.0).sum();
            prop_assert_eq!(got, brute_force(&refs, cells, capacity));
        }
    }
}
