//! The policy seam: which experts of a layer to swap, given their drained heat.
//!
//! The [`Controller`](crate::Controller) owns everything around a decision (counting, the EMA
//! drain, the shift response, generation stamps, caps, one swap in flight per layer); a
//! [`SwapPolicy`] only answers "which cold experts should replace which hot ones in this layer
//! now". Three policies come with the crate:
//! - `CostPolicy` (`cost.rs`, the default): swap when the host bytes an expert is expected to
//!   save over its expected residency exceed what the copy costs on the link; heat in touched
//!   steps, the unit the link pays for;
//! - `RatioPolicy` (`ratio.rs`): the published GB300 recipe's "EMA drain + ratio hysteresis";
//! - `RecencyPolicy` (`recency.rs`): capped LRU on the drained touches, for comparison and for
//!   traffic where recency wins.
//!
//! Each policy has its own config beside it ([`CostConfig`], [`RatioConfig`], [`RecencyConfig`]),
//! validated once, by the policy's constructor; [`PolicyConfig`] is the one a
//! [`ControllerConfig`](crate::ControllerConfig) carries and builds.

mod cost;
mod ratio;
mod recency;
#[cfg(test)]
mod reference;

pub use cost::CostConfig;
pub(crate) use cost::CostPolicy;
pub use ratio::RatioConfig;
pub(crate) use ratio::RatioPolicy;
pub use recency::RecencyConfig;
pub(crate) use recency::RecencyPolicy;

use crate::error::Result;
use crate::rowmap::RowMap;

/// Which [`crate::SwapPolicy`]: the `kind` of a [`PolicyConfig`]. JSON: `"cost"`, `"ratio"`,
/// `"recency"`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub(crate) enum PolicyKind {
    /// `CostPolicy`: swap when the host bytes saved over the expected residency exceed
    /// the copy's cost on the link (tierkit's default).
    #[default]
    Cost,
    /// `RatioPolicy`: the published GB300 recipe's "EMA drain + ratio hysteresis".
    Ratio,
    /// `RecencyPolicy`: capped LRU on the drained touches (at most
    /// `max_swaps_per_step` swaps per step).
    Recency,
}

impl PolicyKind {
    /// The name used in configs and reports (`cost`, `ratio`, `recency`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            PolicyKind::Cost => "cost",
            PolicyKind::Ratio => "ratio",
            PolicyKind::Recency => "recency",
        }
    }
}

/// The swap policy a [`Controller::new`](crate::Controller::new) builds, with that policy's own
/// config (the controller's shared knobs, cadence, caps and budget, are
/// [`ControllerConfig`](crate::ControllerConfig)'s).
///
/// JSON: an object tagged by `kind` holding the policy's fields, `{"kind": "cost", "payback":
/// 1.5, "z": 1.0, "link": {...}}`, `{"kind": "ratio", "ratio": 1.5}`, `{"kind": "recency"}`;
/// missing fields take their defaults, an unknown field is an error. In a controller config the
/// name alone (`"policy": "ratio"`) is that policy at its defaults.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PolicyConfig {
    /// `CostPolicy` (the default): a swap must save more host bytes than its copy costs.
    Cost(CostConfig),
    /// `RatioPolicy`: the published GB300 recipe's "EMA drain + ratio hysteresis".
    Ratio(RatioConfig),
    /// `RecencyPolicy`: capped LRU on the drained touches.
    Recency(RecencyConfig),
}

named_fields!(PolicyConfig, "a policy config");

impl Default for PolicyConfig {
    /// The cost-aware policy at its defaults.
    fn default() -> Self {
        PolicyConfig::Cost(CostConfig::default())
    }
}

impl PolicyConfig {
    /// The policy `kind` at its defaults.
    pub(crate) fn default_for(kind: PolicyKind) -> Self {
        match kind {
            PolicyKind::Cost => PolicyConfig::Cost(CostConfig::default()),
            PolicyKind::Ratio => PolicyConfig::Ratio(RatioConfig::default()),
            PolicyKind::Recency => PolicyConfig::Recency(RecencyConfig::default()),
        }
    }

    /// Which policy.
    pub(crate) fn kind(&self) -> PolicyKind {
        match self {
            PolicyConfig::Cost(_) => PolicyKind::Cost,
            PolicyConfig::Ratio(_) => PolicyKind::Ratio,
            PolicyConfig::Recency(_) => PolicyKind::Recency,
        }
    }

    /// The name used in configs and reports (`cost`, `ratio`, `recency`).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Checks the policy's config (its own `validate`), for callers that check a config without
    /// building the policy ([`ControllerConfig::validate`](crate::ControllerConfig::validate)).
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        match self {
            PolicyConfig::Cost(c) => c.validate(),
            PolicyConfig::Ratio(c) => c.validate(),
            PolicyConfig::Recency(_) => Ok(()),
        }
    }

    /// Builds the policy; its constructor validates the config (once).
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] naming the field.
    pub fn build(&self) -> Result<Box<dyn SwapPolicy>> {
        Ok(match self {
            PolicyConfig::Cost(c) => Box::new(CostPolicy::new(c.clone())?),
            PolicyConfig::Ratio(c) => Box::new(RatioPolicy::new(*c)?),
            PolicyConfig::Recency(_) => Box::new(RecencyPolicy::new()),
        })
    }
}

impl std::fmt::Display for PolicyConfig {
    /// The policy and its knobs, for reports: `cost (payback 1.5, z 1)`, `ratio 1.5`, `recency`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyConfig::Cost(c) => write!(f, "cost (payback {}, z {})", c.payback, c.z),
            PolicyConfig::Ratio(c) => write!(f, "ratio {}", c.ratio),
            PolicyConfig::Recency(_) => f.write_str("recency"),
        }
    }
}

/// What a policy sees of one layer at a drain.
#[derive(Clone, Copy, Debug)]
pub struct LayerHeat<'a> {
    /// The MoE layer (`0..layers`).
    pub layer: u32,
    /// The drained EMA of the layer's picks, `[experts]` f64, indexed by expert id: picks per
    /// step boundary, decayed with the controller's half-life (a pick `h` steps ago weighs `½`;
    /// finite, ≥ 0). Only ratios and order between experts matter to a policy.
    pub heat: &'a [f64],
    /// The drained EMA of the layer's **touched steps**, `[experts]` f64: steps in which the
    /// expert was picked at least once (the unit the link pays for: a cold expert is read once
    /// per step however many tokens picked it), decayed with the same half-life as `heat`
    /// (finite, ≥ 0). Estimated from the picks of each drain interval (see `CostPolicy`).
    pub touch: &'a [f64],
    /// Per expert, the step count of the last drain whose interval touched it (0: never),
    /// `[experts]`: the recency a `RecencyPolicy` ranks by.
    pub last_touch: &'a [u64],
    /// Step count at this drain.
    pub step: u64,
    /// The EMA half-life in force, steps (finite, > 0).
    pub half_life_steps: f64,
    /// Bytes of one expert (the geometry's): what a swap copies and a cold touch reads.
    pub expert_bytes: u64,
    /// The layer's rowmap as confirmed by the executor (which experts are hot, in which slot).
    pub row: &'a RowMap,
    /// Most swaps the controller takes from this layer at this drain (the per-layer cap in force:
    /// [`ControllerConfig::max_swaps_per_layer`](crate::ControllerConfig::max_swaps_per_layer), or
    /// the shift response's boosted cap); ≥ 1.
    pub max_swaps: u32,
    /// Most swaps begun per step, all layers together
    /// ([`ControllerConfig::max_swaps_per_step`](crate::ControllerConfig::max_swaps_per_step)):
    /// information only, the controller enforces it when it begins swaps.
    pub max_swaps_per_step: u32,
}

/// One swap a policy asks for: cold expert `incoming` takes the hot slot of `outgoing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SwapChoice {
    /// A cold expert of the layer (moves into HBM).
    pub incoming: u32,
    /// A hot expert of the layer (leaves HBM; its host copy stays valid).
    pub outgoing: u32,
}

/// Decides which experts of a layer to swap at a drain.
///
/// The controller calls [`SwapPolicy::plan`] once per layer at every drain, after folding the
/// interval's picks into the EMA, for layers that have no swap queued or in flight, and never
/// while frozen. The policy appends its choices to `out` (empty on entry), most wanted first.
///
/// The controller then, in order: keeps at most `layer.max_swaps` choices; stops at the first
/// choice whose `incoming` is not a cold expert of the layer, whose `outgoing` is not hot, or that
/// repeats an expert of an earlier choice (it and the choices after it are ignored: a policy
/// cannot corrupt the map); turns each kept choice into a [`PlannedSwap`](crate::PlannedSwap)
/// (`slot` = the outgoing expert's slot, `generation` = the layer's generation + its index, as
/// the choices apply one after the other); and queues them, to be begun under the per-step cap.
/// Stale, failed and cancelled swaps are the controller's business too.
///
/// A policy holds whatever state it likes (`&mut self`), e.g. scratch buffers; it must not panic
/// on any heat (all-zero, ties, huge values).
pub trait SwapPolicy: std::fmt::Debug + Send {
    /// A short name for reports and telemetry (e.g. `"ratio"`).
    fn name(&self) -> &str;

    /// Appends to `out` the swaps wanted in `layer` now (see the trait docs for what the
    /// controller does with them).
    fn plan(&mut self, layer: &LayerHeat<'_>, out: &mut Vec<SwapChoice>);

    /// Whether the policy reads [`LayerHeat::touch`] (default true). A policy that answers
    /// false (the ratio policy) spares the drain the touched-step estimate when the cadence is
    /// fixed; its `touch` is then all zeros.
    fn uses_touch(&self) -> bool {
        true
    }
}

/// Runs `$scan` with `$list` bound to a `&mut` [`ShortList`] of room `$cap` (≥ 1): a [`Pair`] for
/// caps ≤ 2, else a [`SliceList`] over `$out`'s buffer; `$out` (empty) then holds the list.
macro_rules! in_short_list {
    ($out:expr, $cap:expr, $list:ident => $scan:expr) => {{
        let (out, cap): (&mut Vec<(f64, u32)>, usize) = ($out, $cap);
        if cap <= 2 {
            let mut pair = Pair::new(cap);
            let $list = &mut pair;
            $scan;
            pair.append_to(out);
        } else {
            out.resize(cap, (0.0, 0));
            let mut slice = SliceList {
                buf: &mut out[..],
                len: 0,
            };
            let $list = &mut slice;
            $scan;
            let len = slice.len;
            out.truncate(len);
        }
    }};
}

/// The busiest cold experts (`table[e] < 0`) with heat ≥ `needed` and > `floor`, descending by
/// heat (ties: lower id first, as ids are scanned in order), at most `cap`, into `out` (cleared
/// by the caller). Insertion sort into the short list; once full, `floor` rises to its smallest
/// heat. Shared by the ratio and cost-aware policies.
///
/// The scan tests a chunk of experts at a time without branching and looks at the chunk one
/// expert at a time only if one of them passes (`floor` only rises, so a chunk that fails as a
/// whole fails expert by expert too). The short list lives in registers for the default per-layer
/// cap (≤ 2), otherwise in `out`'s buffer, sized once: the same insertions either way, only where
/// the list is kept differs.
pub(crate) fn rank_cold(
    out: &mut Vec<(f64, u32)>,
    vals: &[f64],
    table: &[i32],
    needed: f64,
    floor: f64,
    cap: usize,
) {
    let n = vals.len().min(table.len());
    let (vals, table) = (&vals[..n], &table[..n]);
    out.clear();
    // The list never holds more than `cap` nor more than `n` entries.
    let cap = cap.min(n);
    if cap == 0 {
        return;
    }
    in_short_list!(out, cap, list => scan_cold(list, vals, table, needed, floor));
}

/// A short list of (heat, id) with room for `cap` entries, filled by [`ShortList::place`]: the
/// two homes of [`rank_cold`]'s and [`rank_least`]'s lists.
trait ShortList {
    /// Entries held.
    fn len(&self) -> usize;
    /// The room (the ranking's `cap`, ≥ 1).
    fn cap(&self) -> usize;
    /// Entry `i < len`.
    fn get(&self, i: usize) -> (f64, u32);
    /// Writes `x` at `i` (the end of the list if it has room, else its last entry), then moves it
    /// up past every entry `x` goes `before` (the insertion sort's step): `while i > 0 &&
    /// before(x, list[i − 1]) { list[i] = list[i − 1]; i −= 1 } list[i] = x`, with `len` grown
    /// by one if it had room.
    fn place(&mut self, x: (f64, u32), before: impl Fn((f64, u32), (f64, u32)) -> bool);
}

/// [`ShortList`] for `cap ≤ 2` (the default per-layer cap) in locals: the list stays in
/// registers and an insertion is a compare and two moves, with no store and reload per candidate.
struct Pair {
    first: (f64, u32),
    second: (f64, u32),
    len: usize,
    cap: usize,
}

impl Pair {
    fn new(cap: usize) -> Self {
        debug_assert!((1..=2).contains(&cap));
        Pair {
            first: (0.0, 0),
            second: (0.0, 0),
            len: 0,
            cap,
        }
    }

    fn append_to(&self, out: &mut Vec<(f64, u32)>) {
        if self.len >= 1 {
            out.push(self.first);
        }
        if self.len == 2 {
            out.push(self.second);
        }
    }
}

impl ShortList for Pair {
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn cap(&self) -> usize {
        self.cap
    }

    #[inline(always)]
    fn get(&self, i: usize) -> (f64, u32) {
        if i == 0 {
            self.first
        } else {
            self.second
        }
    }

    #[inline(always)]
    fn place(&mut self, x: (f64, u32), before: impl Fn((f64, u32), (f64, u32)) -> bool) {
        let i = if self.len < self.cap {
            self.len += 1;
            self.len - 1
        } else {
            self.cap - 1
        };
        if i == 0 {
            self.first = x;
        } else if before(x, self.first) {
            self.second = self.first;
            self.first = x;
        } else {
            self.second = x;
        }
    }
}

/// [`ShortList`] in a caller's buffer (`buf.len()` = the cap), for caps past [`Pair`]'s.
struct SliceList<'a> {
    buf: &'a mut [(f64, u32)],
    len: usize,
}

impl ShortList for SliceList<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn cap(&self) -> usize {
        self.buf.len()
    }

    fn get(&self, i: usize) -> (f64, u32) {
        self.buf[i]
    }

    fn place(&mut self, x: (f64, u32), before: impl Fn((f64, u32), (f64, u32)) -> bool) {
        let cap = self.buf.len();
        let mut i = if self.len < cap {
            self.len += 1;
            self.len - 1
        } else {
            cap - 1
        };
        while i > 0 && before(x, self.buf[i - 1]) {
            self.buf[i] = self.buf[i - 1];
            i -= 1;
        }
        self.buf[i] = x;
    }
}

/// [`rank_cold`]'s scan into `list` (empty, `cap ≥ 1`).
#[inline(always)]
fn scan_cold<L: ShortList>(list: &mut L, vals: &[f64], table: &[i32], needed: f64, mut floor: f64) {
    const CHUNK: usize = 8;
    let cap = list.cap();
    // Descending by heat; an equal heat stays below (the lower id, scanned first, stays first).
    let before = |x: (f64, u32), y: (f64, u32)| y.0 < x.0;
    let visit = |list: &mut L, floor: &mut f64, base: usize, vc: &[f64], tc: &[i32]| {
        for (j, (&v, &slot)) in vc.iter().zip(tc).enumerate() {
            if slot >= 0 || v <= *floor || v < needed {
                continue;
            }
            list.place((v, (base + j) as u32), before);
            if list.len() == cap {
                *floor = list.get(cap - 1).0;
            }
        }
    };
    let chunks = vals.chunks_exact(CHUNK).zip(table.chunks_exact(CHUNK));
    let tail = vals.len() / CHUNK * CHUNK;
    for (c, (vc, tc)) in chunks.enumerate() {
        let mut any = false;
        for k in 0..CHUNK {
            // The per-expert test, without short-circuits.
            any |= !((tc[k] >= 0) | (vc[k] <= floor) | (vc[k] < needed));
        }
        if any {
            visit(list, &mut floor, c * CHUNK, vc, tc);
        }
    }
    visit(list, &mut floor, tail, &vals[tail..], &table[tail..]);
}

/// The least busy hot experts whose heat `beatable` accepts, ascending by (heat, id), at most
/// `cap`, into `out` (cleared by the caller).
pub(crate) fn rank_hot(
    out: &mut Vec<(f64, u32)>,
    vals: &[f64],
    hot_experts: &[u32],
    cap: usize,
    beatable: impl Fn(f64) -> bool,
) {
    rank_least(out, vals, hot_experts, cap, beatable);
}

/// The least busy hot experts of a layer in one pass, for a policy whose "beatable" test is
/// monotone in the heat (`h + price ≤ c` with a finite price, `h × ratio ≤ c` with a finite ratio
/// ≥ 0): the `cap` least busy by (heat, id) into `out`, and the least hot heat, NaN heats left
/// out (+∞ if none: the policies' `hot_min`; its sign is unspecified when it is a zero, which no
/// policy's test can tell: `hot_min + price` with `price > 0`, `ratio × hot_min` compared with
/// `≤`). Returns `(hot_min, exact)`; when `exact` (no hot heat is NaN), [`keep_beatable`] then
/// leaves exactly what [`rank_hot`] would (the beatable experts are a prefix of the list ordered
/// by heat), sparing a second pass over the hot set.
pub(crate) fn rank_least_hot(
    out: &mut Vec<(f64, u32)>,
    vals: &[f64],
    hot_experts: &[u32],
    cap: usize,
) -> (f64, bool) {
    let mut nan = false;
    rank_least(out, vals, hot_experts, cap, |h| {
        nan |= h.is_nan();
        true
    });
    if nan || (out.is_empty() && !hot_experts.is_empty()) {
        // Rare (heats are finite by the controller's contract; no policy asks with cap 0): the
        // minimum over the others.
        let m = hot_experts
            .iter()
            .map(|&e| vals[e as usize])
            .fold(f64::INFINITY, f64::min);
        return (m, false);
    }
    // Without NaN the list's first entry is a least hot heat (every hot heat was accepted).
    (out.first().map_or(f64::INFINITY, |x| x.0), true)
}

/// Keeps the beatable prefix of the list [`rank_least_hot`] made.
pub(crate) fn keep_beatable(out: &mut Vec<(f64, u32)>, beatable: impl Fn(f64) -> bool) {
    let k = out.iter().take_while(|&&(h, _)| beatable(h)).count();
    out.truncate(k);
}

/// [`rank_hot`]'s scan (`beatable` may keep state: it sees every hot heat once, in order). The
/// list lives where [`rank_cold`]'s does.
fn rank_least(
    out: &mut Vec<(f64, u32)>,
    vals: &[f64],
    hot_experts: &[u32],
    cap: usize,
    beatable: impl FnMut(f64) -> bool,
) {
    out.clear();
    let cap = cap.min(hot_experts.len());
    if cap == 0 {
        // Every hot heat is still shown to `beatable` (its side effects), none is kept.
        let mut beatable = beatable;
        for &e in hot_experts {
            beatable(vals[e as usize]);
        }
        return;
    }
    in_short_list!(out, cap, list => scan_least(list, vals, hot_experts, beatable));
}

/// [`rank_least`]'s scan into `list` (empty, `cap ≥ 1`).
#[inline(always)]
fn scan_least<L: ShortList>(
    list: &mut L,
    vals: &[f64],
    hot_experts: &[u32],
    mut beatable: impl FnMut(f64) -> bool,
) {
    let cap = list.cap();
    // Ascending by (heat, id), the tuple order: `(a, i) < (b, j)` iff `a < b`, or `a == b` and
    // `i < j` (false whenever a heat is NaN).
    let lt = |x: (f64, u32), y: (f64, u32)| x.0 < y.0 || (x.0 == y.0 && x.1 < y.1);
    for &e in hot_experts {
        let x = (vals[e as usize], e);
        if !beatable(x.0) {
            continue;
        }
        if list.len() == cap && !lt(x, list.get(cap - 1)) {
            continue;
        }
        list.place(x, lt);
    }
}

#[cfg(test)]
mod tests {
    use super::reference::{rank_cold_ref, rank_hot_ref};
    use super::*;

    fn bits(v: &[(f64, u32)]) -> Vec<(u64, u32)> {
        v.iter().map(|&(h, e)| (h.to_bits(), e)).collect()
    }

    #[test]
    fn ranking_matches_the_plain_insertion_sort() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..4000 {
            // Mostly short layers; now and then one past the chunked path's reach.
            let n = if round % 50 == 7 {
                1020 + (rnd() % 20) as usize
            } else {
                (rnd() % 70) as usize + (round % 3) * 100
            };
            // Every other round without NaN (NaN heats take other paths through the ranking).
            let odd = if round % 2 == 0 { f64::NAN } else { 4.0 };
            let palette = [0.0, -0.0, 1.0, 2.5, 3.0, odd, 7.0, f64::INFINITY];
            let vals: Vec<f64> = (0..n)
                .map(|i| match rnd() % 4 {
                    0 => palette[(rnd() % palette.len() as u64) as usize],
                    1 => i as f64 * 0.5,
                    2 => (n - i) as f64,
                    _ => (rnd() % 1000) as f64 / 10.0,
                })
                .collect();
            let table: Vec<i32> = (0..n)
                .map(|_| {
                    if rnd() % 3 == 0 {
                        (rnd() % 50) as i32
                    } else {
                        -1
                    }
                })
                .collect();
            let hot: Vec<u32> = (0..n as u32).filter(|&e| table[e as usize] >= 0).collect();
            let cap = if round % 7 == 3 {
                15 + (rnd() % 5) as usize
            } else {
                // 1..=9: the list in registers (≤ 2) and in the buffer.
                (rnd() % 9) as usize + 1
            };
            let needed = [f64::NEG_INFINITY, 0.0, 2.0, 30.0][(rnd() % 4) as usize];
            let floor = [f64::NEG_INFINITY, 0.0, 1.0][(rnd() % 3) as usize];
            a.clear();
            rank_cold_ref(&mut a, &vals, &table, needed, floor, cap);
            rank_cold(&mut b, &vals, &table, needed, floor, cap);
            assert_eq!(bits(&a), bits(&b), "cold, round {round}");
            let bound = (rnd() % 100) as f64;
            a.clear();
            rank_hot_ref(&mut a, &vals, &hot, cap, |h| h + 0.5 <= bound);
            rank_hot(&mut b, &vals, &hot, cap, |h| h + 0.5 <= bound);
            assert_eq!(bits(&a), bits(&b), "hot, round {round}");
            // One pass: the same list when no hot heat is NaN, and the same `hot_min`.
            let (hot_min, exact) = rank_least_hot(&mut b, &vals, &hot, cap);
            let m = hot
                .iter()
                .map(|&e| vals[e as usize])
                .fold(f64::INFINITY, f64::min);
            // Equal as numbers (the sign of a zero minimum is unspecified: see rank_least_hot).
            assert!(hot_min == m, "hot_min {hot_min} vs {m}, round {round}");
            assert_eq!(exact, !hot.iter().any(|&e| vals[e as usize].is_nan()));
            if exact {
                keep_beatable(&mut b, |h| h + 0.5 <= bound);
                assert_eq!(bits(&a), bits(&b), "one pass, round {round}");
                for ratio in [1.0, 1.5] {
                    a.clear();
                    rank_hot_ref(&mut a, &vals, &hot, cap, |h| h * ratio <= bound);
                    rank_least_hot(&mut b, &vals, &hot, cap);
                    keep_beatable(&mut b, |h| h * ratio <= bound);
                    assert_eq!(bits(&a), bits(&b), "one pass × {ratio}, round {round}");
                }
            }
        }
    }
}
