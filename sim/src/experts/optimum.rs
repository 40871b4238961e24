//! The exact offline optimum of the scoreboard's stall: the `offline optimum` row
//! ([`crate::experts::PolicySpec::OfflineOptimum`]), Belady's problem with bypass and copy costs,
//! solved per layer as a min-cost flow.
//!
//! **The model it is optimal in** (the scoreboard's, [`crate::experts::replay_with`]):
//! 1. every layer has exactly `H` = `hot_per_layer` hot slots, not shared between layers;
//! 2. a step's lookups are served by the map in force at the step's start; a copy runs during a
//!    step and lands at its end boundary, so it serves the next step at the earliest;
//! 3. each distinct cold expert a step touches is read in place once, costing `r =
//!    read_us(expert_bytes)`;
//! 4. each copy (a net change of a layer's hot set at a boundary) costs `c = stall_us(0, 1,
//!    expert_bytes)`: `copy_link_us + copy_fixed_us` under [`CopyMode::SharesLink`] with
//!    `hide_us = 0` (the presets), `copy_link_us + copy_fixed_us` under [`CopyMode::StopsStep`].
//!    A step's stall is then linear in its reads and copies, so the whole trace's stall is the sum
//!    over layers of `r × reads + c × copies`, and each layer is optimised on its own. With
//!    `hide_us > 0` under `SharesLink` a step's copy stall `max(0, copy_us − hide_us)` is not
//!    linear and couples the layers: the optimum is not computed there ([`ExpertError::InvalidConfig`]);
//! 5. the map at step 0 is free (as the static, seed and hindsight rows' maps are): the optimum is
//!    at most every row of the scoreboard, whichever map a row boots from.
//!
//! **The flow** (one per layer; a unit of flow is a hot slot, `H` units from the start of step 0 to
//! the end of the trace): time nodes `0..=T` joined by `t → t+1` (capacity `H`, cost 0: a slot
//! holding nothing useful); for each distinct expert `e` touched at step `t` a pair `in → out`
//! (capacity 1, cost `−r`: the read that serving it hot saves), entered from time node `t` (cost
//! `c`: a copy landing at the boundary before `t`; not at `t = 0`) or, for `e`'s first touch, from
//! time node 0 (cost 0: hot from the start), or from `e`'s previous touch (cost 0: kept hot in
//! between), and left to time node `t + 1` (the slot is free after `t`) or to `e`'s next touch. A
//! slot's path is a sequence of experts held over intervals; every hot-set schedule that serves
//! the same touches hot with the same copies is one such flow of the same cost and back, so the
//! least-cost flow is the least stall: `r × touches + cost`. It is solved by successive shortest
//! paths (Dijkstra with potentials, started from the DAG's shortest distances; after each search
//! every tied shortest path a depth-first search finds is pushed too), stopping when no path of
//! negative cost is left. Layers are solved in parallel.
//!
//! **Why our own solver**: the crates that exist did not fit. `mcmf` (MIT) wraps LEMON's C++
//! through the deprecated `gcc` build crate and was last released in 2018; `rs-graph`'s network
//! simplex is GPL-3.0-or-later, which the workspace's `MIT OR Apache-2.0` cannot take; `petgraph`
//! and `pathfinding` have max-flow and assignment but no min-cost flow. The graph here is a DAG
//! with unit capacities off the time line and at most `H` augmentations, for which successive
//! shortest paths is short (the solver is ~120 lines) and fast enough: seconds on the traces of
//! `docs/experts.md` ([`OPTIMUM_AUTO_MAX_WORK`]).
//!
//! The idea (caching with bypass as a min-cost flow over request intervals) is the classic
//! offline-paging reduction (Belady 1966 for uniform costs; the interval/flow form for weighted
//! and bypass caching, e.g. Chrobak et al., "Caching is hard, even in the fault model", and the
//! k-server-on-intervals flows it cites).
//!
//! [`CopyMode::SharesLink`]: crate::experts::CopyMode::SharesLink
//! [`CopyMode::StopsStep`]: crate::experts::CopyMode::StopsStep

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use expert_residency::{ExpertError, Geometry, Result};

use crate::experts::link::{CopyMode, LinkModel};
use crate::experts::trace::Trace;

/// Cost units per µs in the solver (integer costs: exact, and Dijkstra's reduced costs never go
/// negative by rounding). 10⁶ per µs is a picosecond: a Mixtral expert's 7.5 ms read is 7.5 × 10⁹
/// units, and a million-step trace's total stays far inside `i64`.
const UNITS_PER_US: f64 = 1e6;

/// Above this [`optimum_work`], `--optimum auto` skips the `offline optimum` row: the solver's
/// work bound `Σ_layers min(H, touches) × (steps + 2 × touches)` (edges scanned by each of at most
/// `H` shortest-path searches). Measured on one core of the development machine, the solver runs
/// at 1.2–2.3 × 10⁻⁷ s per unit of work (OLMoE batch 1, 3.9 × 10⁷: 6.5 s; batch 32, 1.9 × 10⁸:
/// 44 s; 512 × top-10, 3.9 × 10⁸: 48 s), so 5 × 10⁷ is about 10 s at most on one core; layers
/// are solved in parallel on every core the machine has (the batch-1 case: 3.5 s on 2 cores).
pub const OPTIMUM_AUTO_MAX_WORK: u64 = 50_000_000;

/// One step of the optimum's schedule, summed over layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OptimumStep {
    /// Lookups of experts not hot at the step's start.
    pub cold_lookups: u64,
    /// Distinct cold `(layer, expert)` pairs (each read in place once).
    pub cold_unique: u64,
    /// Copies landing at the step's end boundary.
    pub copies: u64,
}

/// The solver's work bound for a trace (see [`OPTIMUM_AUTO_MAX_WORK`]); saturating.
pub fn optimum_work(trace: &Trace, geometry: &Geometry) -> u64 {
    let layers = trace.shape.layers as usize;
    let mut touches = vec![0u64; layers];
    let mut seen = vec![u64::MAX; layers * trace.shape.experts_per_layer as usize];
    for (t, s) in trace.steps.iter().enumerate() {
        for (l, picks) in s.layers.iter().enumerate().take(layers) {
            for &e in picks {
                if let Some(c) =
                    seen.get_mut(l * trace.shape.experts_per_layer as usize + e as usize)
                {
                    if *c != t as u64 {
                        *c = t as u64;
                        touches[l] += 1;
                    }
                }
            }
        }
    }
    let steps = trace.steps.len() as u64;
    touches.iter().fold(0u64, |acc, &n| {
        let h = u64::from(geometry.hot_per_layer).min(n);
        acc.saturating_add(h.saturating_mul(steps.saturating_add(n.saturating_mul(2))))
    })
}

/// Whether the offline optimum can be computed on `link`: its step's stall must be linear in
/// reads and copies (a link whose copies share it, [`CopyMode::SharesLink`], with `hide_us > 0`
/// couples the layers). Callers that promise the optimum (`--optimum always`) check it before
/// any work.
///
/// Errors: [`ExpertError::InvalidConfig`] naming the link and the fix.
pub fn check_optimum_link(link: &LinkModel) -> Result<()> {
    if link.copy_mode == CopyMode::SharesLink && link.hide_us > 0.0 {
        return Err(ExpertError::InvalidConfig(format!(
            "the offline optimum needs a stall linear in copies: link {} hides {} µs of copy time \
             per step (hide_us > 0 couples the layers); use hide_us = 0, as the presets do",
            link.name, link.hide_us
        )));
    }
    Ok(())
}

/// `(r, c)`: the stall of one in-place read and of one copy, µs, when the step's stall is linear
/// in them (module docs, item 4).
///
/// Errors: those of [`check_optimum_link`].
pub(crate) fn unit_costs(link: &LinkModel, expert_bytes: u64) -> Result<(f64, f64)> {
    check_optimum_link(link)?;
    let r = link.stall_us(expert_bytes, 0, 0);
    let c = link.stall_us(0, 1, expert_bytes);
    Ok((r, c))
}

/// The optimum's schedule, per step summed over layers (ids checked by `validate_trace`).
///
/// Errors: those of [`unit_costs`].
pub(crate) fn solve(
    trace: &Trace,
    geometry: &Geometry,
    link: &LinkModel,
) -> Result<Vec<OptimumStep>> {
    let (r, c) = unit_costs(link, geometry.expert_bytes)?;
    let (r, c) = (
        (r * UNITS_PER_US).round() as i64,
        (c * UNITS_PER_US).round() as i64,
    );
    let experts = geometry.experts_per_layer as usize;
    let layers = geometry.layers as usize;
    // Layers are independent: solved on up to `available_parallelism` threads, summed in order.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let solved: Vec<std::sync::Mutex<Vec<OptimumStep>>> = (0..layers)
        .map(|_| std::sync::Mutex::new(Vec::new()))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(layers)
        .max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                // Relaxed: the counter only hands out distinct layers; results go through mutexes.
                let l = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if l >= layers {
                    break;
                }
                let picks: Vec<&[u32]> =
                    trace.steps.iter().map(|s| s.layers[l].as_slice()).collect();
                let layer = solve_layer(&picks, experts, geometry.hot_per_layer as usize, r, c);
                *solved[l].lock().expect("no panic holds it") = layer;
            });
        }
    });
    let mut out = vec![OptimumStep::default(); trace.steps.len()];
    for layer in solved {
        for (o, s) in out
            .iter_mut()
            .zip(layer.into_inner().expect("no panic holds it"))
        {
            o.cold_lookups += s.cold_lookups;
            o.cold_unique += s.cold_unique;
            o.copies += s.copies;
        }
    }
    Ok(out)
}

/// The optimum of the same model with one bank of `layers × hot_per_layer` slots shared by every
/// layer (the modes table's shared LRU bank in place: a layer may hold more than `H` experts
/// while another holds fewer). Items 2–5 of the module docs hold as they are; the flow is
/// [`solve_layer`]'s over the trace's `(layer, expert)` cells (`layer × experts + expert`) with
/// `layers × H` units: a joint flow over all layers, on one thread. Per step summed over layers.
///
/// Errors: those of [`unit_costs`].
pub(crate) fn solve_shared(
    trace: &Trace,
    geometry: &Geometry,
    link: &LinkModel,
) -> Result<Vec<OptimumStep>> {
    let (r, c) = unit_costs(link, geometry.expert_bytes)?;
    let (r, c) = (
        (r * UNITS_PER_US).round() as i64,
        (c * UNITS_PER_US).round() as i64,
    );
    let experts = geometry.experts_per_layer as usize;
    let layers = geometry.layers as usize;
    let cells: Vec<Vec<u32>> = trace
        .steps
        .iter()
        .map(|s| {
            s.layers
                .iter()
                .enumerate()
                .take(layers)
                .flat_map(|(l, p)| p.iter().map(move |&e| (l * experts) as u32 + e))
                .collect()
        })
        .collect();
    let picks: Vec<&[u32]> = cells.iter().map(Vec::as_slice).collect();
    Ok(solve_layer(
        &picks,
        layers * experts,
        layers * geometry.hot_per_layer as usize,
        r,
        c,
    ))
}

/// `solve_shared`'s work bound, as [`optimum_work`]'s for one layer of every `(layer,
/// expert)` cell and `layers × H` slots: `min(L × H, touches) × (steps + 2 × touches)`;
/// saturating.
pub fn shared_optimum_work(trace: &Trace, geometry: &Geometry) -> u64 {
    let experts = trace.shape.experts_per_layer as usize;
    let mut seen = vec![u64::MAX; trace.shape.layers as usize * experts];
    let mut touches = 0u64;
    for (t, s) in trace.steps.iter().enumerate() {
        for (l, picks) in s.layers.iter().enumerate() {
            for &e in picks {
                if let Some(c) = seen.get_mut(l * experts + e as usize) {
                    if *c != t as u64 {
                        *c = t as u64;
                        touches += 1;
                    }
                }
            }
        }
    }
    let slots = u64::from(geometry.layers) * u64::from(geometry.hot_per_layer);
    slots
        .min(touches)
        .saturating_mul((trace.steps.len() as u64).saturating_add(touches.saturating_mul(2)))
}

/// One touch: a distinct expert of one step, with its picks.
struct Touch {
    step: usize,
    picks: u64,
}

/// The optimum of one layer (`picks[t]`: the layer's picks at step `t`, ids `< experts`), with
/// integer costs `r` per read and `c` per copy; per step its cold lookups, distinct cold experts
/// and copies at the step's end boundary.
pub(crate) fn solve_layer(
    picks: &[&[u32]],
    experts: usize,
    hot: usize,
    r: i64,
    c: i64,
) -> Vec<OptimumStep> {
    let steps = picks.len();
    // Touches in step order; per touch its node pair. Node ids in topological order: time node
    // t, then the (in, out) pairs of step t's touches; time node T last.
    let mut touches: Vec<Touch> = Vec::new();
    let mut last_touch = vec![usize::MAX; experts];
    let mut stamp = vec![usize::MAX; experts];
    let mut slot = vec![0usize; experts];
    let mut time_node = Vec::with_capacity(steps + 1);
    let mut g = FlowGraph::default();
    let mut serve_edge: Vec<usize> = Vec::new();
    let mut load_edge: Vec<Option<usize>> = Vec::new();
    // Edges are added once all node ids are known: collect (from, to, cap, cost) first.
    let mut pending: Vec<(usize, usize, i64, i64, u8)> = Vec::new(); // kind: 0 line, 1 load, 2 serve, 3 other
    let mut node = 0usize;
    let mut in_node: Vec<usize> = Vec::new();
    for (t, ps) in picks.iter().enumerate() {
        time_node.push(node);
        node += 1;
        for &e in ps.iter() {
            let e = e as usize;
            if stamp[e] == t {
                touches[slot[e]].picks += 1;
                continue;
            }
            // A new touch: its (in, out) pair, linked to the expert's previous touch.
            stamp[e] = t;
            let k = touches.len();
            slot[e] = k;
            touches.push(Touch { step: t, picks: 1 });
            let (i, o) = (node, node + 1);
            node += 2;
            in_node.push(i);
            pending.push((i, o, 1, -r, 2));
            match last_touch[e] {
                usize::MAX => pending.push((usize::MAX, i, 1, 0, 3)), // from time node 0
                prev => pending.push((in_node[prev] + 1, i, 1, 0, 3)),
            }
            pending.push((usize::MAX - t, i, 1, c, 1)); // load from time node t (t ≥ 1)
            pending.push((o, usize::MAX - (t + 1), 1, 0, 3)); // release to time node t + 1
            last_touch[e] = k;
        }
    }
    time_node.push(node);
    node += 1;
    let resolve = |x: usize| -> usize {
        if x == usize::MAX {
            time_node[0]
        } else if x > usize::MAX / 2 {
            time_node[usize::MAX - x]
        } else {
            x
        }
    };
    g.nodes = node;
    for t in 0..steps {
        g.add(time_node[t], time_node[t + 1], hot as i64, 0);
    }
    let mut touch_i = 0usize;
    for &(from, to, cap, cost, kind) in &pending {
        match kind {
            1 => {
                let t = usize::MAX - from;
                load_edge.push((t >= 1).then(|| g.add(resolve(from), resolve(to), cap, cost)));
            }
            2 => {
                serve_edge.push(g.add(from, to, cap, cost));
                touch_i += 1;
            }
            _ => {
                g.add(resolve(from), resolve(to), cap, cost);
            }
        }
    }
    debug_assert_eq!(touch_i, touches.len());
    g.min_cost_flow(time_node[0], time_node[steps], hot as i64);
    let mut out = vec![OptimumStep::default(); steps];
    for (k, tch) in touches.iter().enumerate() {
        if g.flow(serve_edge[k]) == 0 {
            out[tch.step].cold_lookups += tch.picks;
            out[tch.step].cold_unique += 1;
        }
        if let Some(e) = load_edge[k] {
            if g.flow(e) > 0 {
                // A copy landing before step t ran during step t − 1.
                out[tch.step - 1].copies += 1;
            }
        }
    }
    out
}

/// A residual graph in compressed rows: edge `2k` and its reverse `2k + 1`.
#[derive(Default)]
struct FlowGraph {
    nodes: usize,
    from: Vec<u32>,
    to: Vec<u32>,
    cap: Vec<i64>,
    cost: Vec<i64>,
}

impl FlowGraph {
    /// Adds `from → to` and its reverse; returns the forward edge's id.
    fn add(&mut self, from: usize, to: usize, cap: i64, cost: i64) -> usize {
        let id = self.to.len();
        for (a, b, k, w) in [(from, to, cap, cost), (to, from, 0, -cost)] {
            self.from.push(a as u32);
            self.to.push(b as u32);
            self.cap.push(k);
            self.cost.push(w);
        }
        id
    }

    /// Flow on forward edge `id` (its reverse's residual capacity).
    fn flow(&self, id: usize) -> i64 {
        self.cap[id ^ 1]
    }

    /// Pushes up to `amount` units from `s` to `t` along successive shortest paths, stopping when
    /// the shortest path costs ≥ 0. Node ids must be a topological order of the forward edges.
    fn min_cost_flow(&mut self, s: usize, t: usize, amount: i64) {
        let n = self.nodes;
        // Compressed rows: the edges leaving each node.
        let mut start = vec![0u32; n + 1];
        for &f in &self.from {
            start[f as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut rows = vec![0u32; self.from.len()];
        for (e, &f) in self.from.iter().enumerate() {
            rows[fill[f as usize] as usize] = e as u32;
            fill[f as usize] += 1;
        }
        let out = |u: usize| &rows[start[u] as usize..start[u + 1] as usize];
        // Potentials: shortest distances over the DAG of forward edges (ids in topological order).
        const INF: i64 = i64::MAX / 4;
        let mut pot = vec![INF; n];
        pot[s] = 0;
        for u in 0..n {
            if pot[u] == INF {
                continue;
            }
            for &e in out(u) {
                let e = e as usize;
                if e & 1 == 0 && self.cap[e] > 0 {
                    let v = self.to[e] as usize;
                    pot[v] = pot[v].min(pot[u] + self.cost[e]);
                }
            }
        }
        for p in pot.iter_mut() {
            if *p == INF {
                *p = 0;
            }
        }
        let mut dist = vec![INF; n];
        let mut prev = vec![u32::MAX; n];
        let mut done = vec![false; n];
        let mut heap = BinaryHeap::new();
        let mut arc = vec![0u32; n];
        let mut seen = vec![0u64; n];
        let mut epoch = 0u64;
        let mut path: Vec<u32> = Vec::new();
        let mut pushed = 0;
        while pushed < amount {
            dist.fill(INF);
            done.fill(false);
            dist[s] = 0;
            heap.clear();
            heap.push(Reverse((0i64, s as u32)));
            while let Some(Reverse((d, u))) = heap.pop() {
                let u = u as usize;
                if done[u] {
                    continue;
                }
                done[u] = true;
                if u == t {
                    break;
                }
                for &e in out(u) {
                    let e = e as usize;
                    if self.cap[e] == 0 {
                        continue;
                    }
                    let v = self.to[e] as usize;
                    let nd = d + self.cost[e] + pot[u] - pot[v];
                    debug_assert!(self.cost[e] + pot[u] - pot[v] >= 0, "negative reduced cost");
                    if nd < dist[v] {
                        dist[v] = nd;
                        prev[v] = e as u32;
                        heap.push(Reverse((nd, v as u32)));
                    }
                }
            }
            if !done[t] {
                break;
            }
            let dt = dist[t];
            for v in 0..n {
                pot[v] += dist[v].min(dt);
            }
            // The paths' true cost: stop once it is no longer negative.
            if pot[t] - pot[s] >= 0 {
                break;
            }
            // Every shortest path now has reduced cost 0 on each edge: push along as many of them
            // as a depth-first search with current arcs finds (many paths tie: the costs take few
            // values), before the next search.
            let before = pushed;
            arc.copy_from_slice(&start[..n]);
            while pushed < amount {
                epoch += 1;
                let Some(push) = self.admissible_path(
                    s,
                    t,
                    amount - pushed,
                    &pot,
                    &start,
                    &rows,
                    &mut arc,
                    &mut seen,
                    epoch,
                    &mut path,
                ) else {
                    break;
                };
                for &e in &path {
                    self.cap[e as usize] -= push;
                    self.cap[e as usize ^ 1] += push;
                }
                pushed += push;
            }
            if pushed == before {
                // Dijkstra's own path (always admissible) when the search found none.
                let mut push = amount - pushed;
                let mut v = t;
                while v != s {
                    let e = prev[v] as usize;
                    push = push.min(self.cap[e]);
                    v = self.from[e] as usize;
                }
                let mut v = t;
                while v != s {
                    let e = prev[v] as usize;
                    self.cap[e] -= push;
                    self.cap[e ^ 1] += push;
                    v = self.from[e] as usize;
                }
                pushed += push;
            }
        }
    }

    /// One path `s → t` over residual edges of reduced cost 0, by depth-first search from the
    /// current arcs `arc` (advanced past dead ends), visiting each node once per `epoch`; its edges
    /// in `path` and its bottleneck (at most `limit`).
    #[allow(clippy::too_many_arguments)]
    fn admissible_path(
        &self,
        s: usize,
        t: usize,
        limit: i64,
        pot: &[i64],
        start: &[u32],
        rows: &[u32],
        arc: &mut [u32],
        seen: &mut [u64],
        epoch: u64,
        path: &mut Vec<u32>,
    ) -> Option<i64> {
        path.clear();
        let mut u = s;
        seen[s] = epoch;
        loop {
            if u == t {
                let push = path
                    .iter()
                    .map(|&e| self.cap[e as usize])
                    .fold(limit, i64::min);
                return Some(push);
            }
            let mut advanced = false;
            while arc[u] < start[u + 1] {
                let e = rows[arc[u] as usize] as usize;
                let v = self.to[e] as usize;
                if self.cap[e] > 0 && seen[v] != epoch && self.cost[e] + pot[u] - pot[v] == 0 {
                    path.push(e as u32);
                    seen[v] = epoch;
                    u = v;
                    advanced = true;
                    break;
                }
                arc[u] += 1;
            }
            if !advanced {
                // Dead end: retreat, and skip the arc that led here.
                let e = path.pop()? as usize;
                u = self.from[e] as usize;
                arc[u] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hot-set schedule of one layer, enumerated: `M_0` free, then every `M_t` of exactly
    /// `hot` experts; cost `r × |S_t \ M_t| + c × |M_{t+1} \ M_t|`.
    pub(crate) fn brute_force(picks: &[&[u32]], experts: usize, hot: usize, r: i64, c: i64) -> i64 {
        let sets: Vec<u32> = (0u32..1 << experts)
            .filter(|m| m.count_ones() as usize == hot)
            .collect();
        let touched: Vec<u32> = picks
            .iter()
            .map(|ps| ps.iter().fold(0u32, |m, &e| m | 1 << e))
            .collect();
        fn go(t: usize, cur: u32, sets: &[u32], touched: &[u32], r: i64, c: i64) -> i64 {
            let read = r * (touched[t] & !cur).count_ones() as i64;
            if t + 1 == touched.len() {
                return read;
            }
            read + sets
                .iter()
                .map(|&next| {
                    c * (next & !cur).count_ones() as i64 + go(t + 1, next, sets, touched, r, c)
                })
                .min()
                .expect("at least one hot set")
        }
        sets.iter()
            .map(|&m0| go(0, m0, &sets, &touched, r, c))
            .min()
            .expect("at least one hot set")
    }

    fn cost(s: &[OptimumStep], r: i64, c: i64) -> i64 {
        s.iter()
            .map(|x| r * x.cold_unique as i64 + c * x.copies as i64)
            .sum()
    }

    #[test]
    fn small_cases_by_hand() {
        // One slot, experts 0 and 1 alternating in runs: keep 0 from the start, read 1 (a copy
        // costs more than the one read it would save).
        let p: [&[u32]; 4] = [&[0], &[0, 0], &[1], &[0]];
        let s = solve_layer(&p, 2, 1, 10, 12);
        assert_eq!(cost(&s, 10, 12), 10);
        assert_eq!(s[2].cold_lookups, 1);
        // Hold 1 from the start and read 0 twice rather than copy.
        let p: [&[u32]; 6] = [&[0], &[1], &[1], &[1], &[1], &[0]];
        let s = solve_layer(&p, 2, 1, 10, 12);
        assert_eq!(cost(&s, 10, 12), brute_force(&p, 2, 1, 10, 12));
        assert_eq!(cost(&s, 10, 12), 20);
        // Prefetch in hindsight: 0 hot from the start, 1 copied in during step 2 (landing at its
        // end boundary) to serve steps 3..7: one copy, no read.
        let p: [&[u32]; 7] = [&[0], &[0], &[0], &[1], &[1], &[1], &[1]];
        let s = solve_layer(&p, 2, 1, 10, 12);
        assert_eq!(cost(&s, 10, 12), 12);
        assert_eq!(s[2].copies, 1);
        assert!(s.iter().all(|x| x.cold_unique == 0));
        assert_eq!(cost(&s, 10, 12), brute_force(&p, 2, 1, 10, 12));
        // Hot slots cover every expert: nothing is cold, nothing copied.
        let p: [&[u32]; 3] = [&[0, 1], &[2], &[1, 0, 2]];
        let s = solve_layer(&p, 3, 3, 10, 1);
        assert_eq!(cost(&s, 10, 1), 0);
    }

    #[test]
    fn hide_us_makes_the_stall_nonlinear() {
        let mut link = LinkModel::h200_pcie();
        assert!(unit_costs(&link, 1 << 20).is_ok());
        link.hide_us = 10.0;
        assert!(matches!(
            unit_costs(&link, 1 << 20),
            Err(ExpertError::InvalidConfig(m)) if m.contains("hide_us")
        ));
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// The flow's optimum equals the least cost over every hot-set schedule.
        #[test]
        fn flow_matches_brute_force(
            experts in 2usize..=5,
            hot_frac in 0.0f64..1.0,
            steps in proptest::collection::vec(proptest::collection::vec(0u32..5, 0..4), 1..6),
            r in 1i64..40,
            c in 1i64..60,
        ) {
            let hot = 1 + ((experts - 1) as f64 * hot_frac) as usize;
            let steps: Vec<Vec<u32>> = steps
                .into_iter()
                .map(|s| s.into_iter().map(|e| e % experts as u32).collect())
                .collect();
            let picks: Vec<&[u32]> = steps.iter().map(|s| s.as_slice()).collect();
            let s = solve_layer(&picks, experts, hot, r, c);
            prop_assert_eq!(cost(&s, r, c), brute_force(&picks, experts, hot, r, c));
            // Cold lookups are the picks of the experts read.
            for (x, ps) in s.iter().zip(&picks) {
                prop_assert!(x.cold_lookups <= ps.len() as u64);
                prop_assert!(x.cold_unique <= x.cold_lookups);
            }
        }
    }
}
