//! The exactness property: for any selection, the bytes at the resolved rows equal the bytes a fully
//! resident cache holds at those positions — over random sessions, selections, admissions, appends,
//! speculative drafts, reclaims (also in the middle of a step, with readers in flight), finishes and
//! hand-backs, and random layer groups (per layer, one shared group, mixtures) resolved at random
//! layers with their own picks; bad input gets typed errors with the pool unchanged; no page leaks.
//!
//! Case count: `PROPTEST_CASES` (default 10,000; tiny geometries keep that cheap in debug builds).

use std::collections::BTreeMap;

use kv_elastic::{
    Admission, ElasticPool, Geometry, KvError, LayerGroups, OutputLayout, PoolConfig, ResolveInput,
    ResolveOptions, ResolveOutput, Resolver, RowFormat,
};
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tierkit_testkit::pattern_row;

#[path = "exactness/bad_input.rs"]
mod bad_input;
use bad_input::bad_input;

/// Coverage counters (checked by `the_property_reaches_every_path`).
static PAGE_HITS: AtomicU64 = AtomicU64::new(0);
static HOT_HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static SCRATCH_HITS: AtomicU64 = AtomicU64::new(0);
static TAIL_HITS: AtomicU64 = AtomicU64::new(0);
static DIRECT: AtomicU64 = AtomicU64::new(0);
/// Pages reclaimed while a step's readers were in flight and still pending when checked.
static RECLAIMED_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
static PENDING_AT_CHECK: AtomicU64 = AtomicU64::new(0);
static WAITING_ADMISSIONS: AtomicU64 = AtomicU64::new(0);
/// Picks left unserved by an overflowing step, packed-layout resolves, resolves with per-query
/// bounds, resolves into oversized (padded) outputs.
static UNSERVED: AtomicU64 = AtomicU64::new(0);
static PACKED: AtomicU64 = AtomicU64::new(0);
static ROW_BOUNDS: AtomicU64 = AtomicU64::new(0);
/// Resolves of block ids (`ResolveOptions::block_positions > 1`).
static BLOCK_IDS: AtomicU64 = AtomicU64::new(0);
/// Resolves on an arena in DeepSeek-V4's paged split row format.
static PAGED_SPLIT: AtomicU64 = AtomicU64::new(0);
static PADDED: AtomicU64 = AtomicU64::new(0);
/// Resolves at a layer other than its group's first (the per-layer-picks case), in a geometry of
/// several groups, of which one holds several layers (a mixture); replays inside a group.
static NOT_FIRST_LAYER: AtomicU64 = AtomicU64::new(0);
static MIXED_GROUPS: AtomicU64 = AtomicU64::new(0);
static REPLAYS: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug)]
enum Op {
    Admit {
        len: u16,
    },
    Append {
        who: u8,
        n: u8,
    },
    Draft {
        who: u8,
        n: u8,
    },
    Accept {
        who: u8,
        n: u8,
    },
    Finish {
        who: u8,
    },
    Reclaim {
        n: u8,
    },
    /// Revokes some pages of one session (a caller's own order) and lends it some back.
    Revoke {
        who: u8,
        seed: u64,
        lend: u8,
    },
    Between {
        chunk: u8,
    },
    Resolve {
        reqs: u8,
        rows: u8,
        k: u8,
        seed: u64,
        mid: Vec<MidOp>,
    },
    Prefetch {
        who: u8,
        seed: u64,
        n: u8,
    },
    Bad {
        kind: u8,
        seed: u64,
    },
}

/// Operations allowed while a step's readers are in flight (the engine's scheduler runs them
/// between launching a step and its completion).
#[derive(Clone, Debug)]
enum MidOp {
    Reclaim { n: u8 },
    Revoke { who: u8, seed: u64 },
    Admit { len: u16 },
    Finish { who: u8 },
    Between { chunk: u8 },
}

/// Revokes a seed-chosen set of session `s`'s history page indices (held or not: unheld ones
/// are skipped), as an engine's own revocation order would; returns the pages taken back.
fn revoke_some(pool: &mut ElasticPool, s: u64, seed: u64) -> Result<u32, TestCaseError> {
    let wanted = pool.wanted_pages(pool.committed_len(s).unwrap_or(0));
    let pages: Vec<u32> = (0..wanted)
        .filter(|j| (seed >> (j % 64)) & 1 == 1)
        .collect();
    pool.revoke(s, &pages)
        .map_err(|e| TestCaseError::fail(format!("revoke: {e}")))
}

fn mid_op() -> impl Strategy<Value = MidOp> {
    prop_oneof![
        (1u8..8).prop_map(|n| MidOp::Reclaim { n }),
        (any::<u8>(), any::<u64>()).prop_map(|(who, seed)| MidOp::Revoke { who, seed }),
        (1u16..40).prop_map(|len| MidOp::Admit { len }),
        any::<u8>().prop_map(|who| MidOp::Finish { who }),
        (1u8..8).prop_map(|chunk| MidOp::Between { chunk }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u16..48).prop_map(|len| Op::Admit { len }),
        3 => (any::<u8>(), 0u8..6).prop_map(|(who, n)| Op::Append { who, n }),
        2 => (any::<u8>(), 1u8..3).prop_map(|(who, n)| Op::Draft { who, n }),
        1 => (any::<u8>(), 0u8..3).prop_map(|(who, n)| Op::Accept { who, n }),
        1 => any::<u8>().prop_map(|who| Op::Finish { who }),
        2 => (1u8..10).prop_map(|n| Op::Reclaim { n }),
        1 => (any::<u8>(), any::<u64>(), 0u8..4).prop_map(|(who, seed, lend)| Op::Revoke { who, seed, lend }),
        2 => (1u8..10).prop_map(|chunk| Op::Between { chunk }),
        6 => (1u8..4, 1u8..3, 1u8..7, any::<u64>(), prop::collection::vec(mid_op(), 0..4))
            .prop_map(|(reqs, rows, k, seed, mid)| Op::Resolve { reqs, rows, k, seed, mid }),
        1 => (any::<u8>(), any::<u64>(), 1u8..12).prop_map(|(who, seed, n)| Op::Prefetch { who, seed, n }),
        1 => (0u8..15, any::<u64>()).prop_map(|(kind, seed)| Op::Bad { kind, seed }),
    ]
}

/// Layer groups for `layers` layers: per layer, one group, or a random partition (`cuts` bit `l`
/// set: a group starts at layer `l + 1`).
fn layer_groups(layers: u32, kind: u8, cuts: u8) -> LayerGroups {
    match kind % 3 {
        0 => LayerGroups::per_layer(),
        1 => LayerGroups::one(),
        _ => {
            let mut sizes = vec![1u32];
            for l in 1..layers {
                if cuts & (1 << (l - 1)) != 0 {
                    sizes.push(1);
                } else {
                    *sizes.last_mut().unwrap() += 1;
                }
            }
            LayerGroups::from_sizes(&sizes).unwrap()
        }
    }
}

/// The arena's row format: `None` (contiguous), contiguous named, or (half the cases) paged
/// split as DeepSeek-V4 lays it out, scaled down: an 8-byte scale after a `row_bytes - 8`-byte
/// value (8 + 8 B up to 56 + 8 B), the page padded to a multiple of the value size (plus `pad`
/// more values).
fn row_format(row_bytes: u32, page_rows: u32, kind: u8, pad: u32) -> Option<RowFormat> {
    match kind {
        0 => None,
        1 => Some(RowFormat::Contiguous { bytes: row_bytes }),
        _ => {
            let (value, scale) = (row_bytes - 8, 8);
            Some(RowFormat::PagedSplit {
                value,
                scale,
                page_rows,
                page_bytes: (page_rows * row_bytes).div_ceil(value) * value + pad * value,
            })
        }
    }
}

fn geometry() -> impl Strategy<Value = Geometry> {
    (
        prop::sample::select(vec![16u32, 24, 32, 64]),
        1u32..5,
        2u32..5,
        2u32..9,
        1u32..5,
        0u32..3,
        0u32..12,
        (any::<u8>(), any::<u8>()),
        (0u8..4, 0u32..2),
    )
        .prop_map(
            |(
                row_bytes,
                layers,
                page_rows,
                hot_rows,
                tail_rows,
                scratch_rows,
                extra,
                (kind, cuts),
                (format, pad),
            )| {
                let mut g = Geometry {
                    row_bytes,
                    layers,
                    page_rows,
                    arena_pages: 0,
                    hot_rows,
                    tail_rows,
                    scratch_rows,
                    layer_groups: layer_groups(layers, kind, cuts),
                    row_format: row_format(row_bytes, page_rows, format, pad),
                };
                g.arena_pages = g.fixed_pages() * 2 + extra;
                g
            },
        )
}

/// splitmix64, for deriving picks from a seed.
fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One session of the reference: committed tokens and drafts (each token `layers × row_bytes`).
type RefSession = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The fully resident reference: every session's committed tokens and drafts, as bytes.
struct Model {
    g: Geometry,
    sessions: BTreeMap<u64, RefSession>,
    next_id: u64,
    version: u64,
}

impl Model {
    fn token(&mut self, session: u64, position: u32) -> Vec<u8> {
        self.version += 1;
        let rb = self.g.row_bytes as usize;
        let mut t = vec![0u8; self.g.token_bytes()];
        for l in 0..self.g.layers as usize {
            // Distinct per write (`version`), so a draft, its replacement and a stale row differ.
            pattern_row(
                session ^ (self.version << 40),
                position,
                l as u32,
                &mut t[l * rb..(l + 1) * rb],
            );
        }
        t
    }

    fn pick(&self, who: u8) -> Option<u64> {
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        (!ids.is_empty()).then(|| ids[who as usize % ids.len()])
    }

    fn admit(&mut self, pool: &mut ElasticPool, len: u16) -> Result<(), TestCaseError> {
        let id = self.next_id;
        self.next_id += 1;
        let toks: Vec<Vec<u8>> = (0..len as u32).map(|p| self.token(id, p)).collect();
        match pool.admit(id, &toks.concat()) {
            Ok(Admission::Admitted { .. }) => {
                self.sessions.insert(id, (toks, Vec::new()));
            }
            Ok(Admission::Waiting { .. }) | Err(KvError::NoRoom { .. }) => {
                WAITING_ADMISSIONS.fetch_add(1, Relaxed);
                prop_assert!(pool.committed_len(id).is_err());
            }
            Err(e) => return Err(TestCaseError::fail(format!("admit: {e}"))),
        }
        Ok(())
    }

    fn finish(&mut self, pool: &mut ElasticPool, who: u8) -> Result<(), TestCaseError> {
        if let Some(s) = self.pick(who) {
            pool.finish(s)
                .map_err(|e| TestCaseError::fail(format!("finish: {e}")))?;
            self.sessions.remove(&s);
            prop_assert_eq!(pool.finish(s), Err(KvError::SessionFinished(s)));
        }
        Ok(())
    }

    fn expected(&self, s: u64, p: u32) -> &[u8] {
        let (c, d) = &self.sessions[&s];
        if (p as usize) < c.len() {
            &c[p as usize]
        } else {
            &d[p as usize - c.len()]
        }
    }
}

/// A digest of everything an erroring call must leave unchanged.
fn digest(pool: &ElasticPool) -> String {
    let l = pool.pages();
    let per: Vec<String> = pool
        .sessions()
        .map(|s| {
            format!(
                "{s}:{}+{}:{}",
                pool.committed_len(s).unwrap(),
                pool.scratch_len(s).unwrap(),
                pool.borrowed_pages(s).unwrap()
            )
        })
        .collect();
    format!(
        "{} {} {} {} {:?} {per:?} {}",
        l.free,
        l.fixed + l.history,
        l.pending,
        l.queued,
        pool.counters(),
        (0..pool.geometry().layers)
            .map(|x| pool
                .plane(x)
                .unwrap()
                .iter()
                .map(|&b| b as u64)
                .sum::<u64>())
            .sum::<u64>()
    )
}

fn check_books(pool: &ElasticPool) -> Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)
}

fn run(g: Geometry, elastic: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut pool = ElasticPool::new(g, PoolConfig { elastic }).unwrap();
    let mut m = Model {
        g,
        sessions: BTreeMap::new(),
        next_id: 1,
        version: 0,
    };
    for op in ops {
        match op {
            Op::Admit { len } => m.admit(&mut pool, len)?,
            Op::Append { who, n } => {
                if let Some(s) = m.pick(who) {
                    let base = m.sessions[&s].0.len() as u32;
                    let toks: Vec<Vec<u8>> = (0..n as u32).map(|i| m.token(s, base + i)).collect();
                    pool.append(s, &toks.concat())
                        .map_err(|e| TestCaseError::fail(format!("append: {e}")))?;
                    let e = m.sessions.get_mut(&s).unwrap();
                    e.0.extend(toks);
                    e.1.clear();
                }
            }
            Op::Draft { who, n } => {
                if let Some(s) = m.pick(who) {
                    let base = (m.sessions[&s].0.len() + m.sessions[&s].1.len()) as u32;
                    let toks: Vec<Vec<u8>> = (0..n as u32).map(|i| m.token(s, base + i)).collect();
                    match pool.write_scratch(s, &toks.concat()) {
                        Ok(()) => m.sessions.get_mut(&s).unwrap().1.extend(toks),
                        Err(KvError::ScratchOverflow { .. }) => {}
                        Err(e) => return Err(TestCaseError::fail(format!("draft: {e}"))),
                    }
                }
            }
            Op::Accept { who, n } => {
                if let Some(s) = m.pick(who) {
                    match pool.accept(s, n as u32) {
                        Ok(_) => {
                            let e = m.sessions.get_mut(&s).unwrap();
                            let acc: Vec<Vec<u8>> = e.1.drain(..n as usize).collect();
                            e.0.extend(acc);
                            e.1.clear();
                        }
                        Err(KvError::ScratchOverflow { .. }) => {
                            prop_assert!(m.sessions[&s].1.len() < n as usize)
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("accept: {e}"))),
                    }
                }
            }
            Op::Finish { who } => m.finish(&mut pool, who)?,
            Op::Reclaim { n } => {
                pool.reclaim(n as u32)
                    .map_err(|e| TestCaseError::fail(format!("reclaim: {e}")))?;
            }
            Op::Revoke { who, seed, lend } => {
                if let Some(s) = m.pick(who) {
                    revoke_some(&mut pool, s, seed)?;
                    match pool.lend(s, lend as u32) {
                        Ok(_) if pool.config().elastic => {}
                        Err(KvError::Unsupported(_)) if !pool.config().elastic => {}
                        r => return Err(TestCaseError::fail(format!("lend: {r:?}"))),
                    }
                }
            }
            Op::Between { chunk } => {
                pool.between_steps(chunk as u32)
                    .map_err(|e| TestCaseError::fail(format!("between: {e}")))?;
            }
            Op::Prefetch { who, seed, n } => {
                if let Some(s) = m.pick(who) {
                    let mut x = seed;
                    let len = m.sessions[&s].0.len() as u64;
                    let cands: Vec<i32> = (0..n)
                        .map(|_| (mix(&mut x) % (len + 1)) as i32 - 1)
                        .collect();
                    // Into a random layer's group (it fills every layer of the group).
                    let layer = (mix(&mut x) % g.layers as u64) as u32;
                    let plan = pool
                        .prefetch(s, &cands, layer)
                        .map_err(|e| TestCaseError::fail(format!("prefetch: {e}")))?;
                    prop_assert_eq!(plan.group, g.group_of(layer));
                    replay_checked(&mut pool, &g, &plan, mix(&mut x))?;
                }
            }
            Op::Resolve {
                reqs,
                rows,
                k,
                seed,
                mid,
            } => {
                let ids: Vec<u64> = m.sessions.keys().copied().collect();
                if ids.is_empty() {
                    continue;
                }
                let mut x = seed;
                let start = (mix(&mut x) % ids.len() as u64) as usize;
                let batch: Vec<u64> = (0..(reqs as usize).min(ids.len()))
                    .map(|i| ids[(start + i) % ids.len()])
                    .collect();
                let k = k as usize;
                // Sometimes block ids: each of a row's k entries stands for `block` positions.
                let block = if mix(&mut x).is_multiple_of(3) {
                    [2u32, 3, 4, 8][(mix(&mut x) % 4) as usize]
                } else {
                    1
                };
                let mut qsl = vec![0i32];
                let mut seq_lens = Vec::new();
                let mut topk = Vec::new();
                let layout = if mix(&mut x).is_multiple_of(2) {
                    OutputLayout::InPlace
                } else {
                    OutputLayout::Packed
                };
                let bounded = mix(&mut x).is_multiple_of(3);
                let mut row_bounds = Vec::new();
                for &s in &batch {
                    let (c, d) = &m.sessions[&s];
                    let nrows = 1 + (mix(&mut x) % rows as u64) as usize;
                    let seq = c.len() + (mix(&mut x) % (d.len() as u64 + 1)) as usize;
                    seq_lens.push(seq as i32);
                    qsl.push(qsl.last().unwrap() + nrows as i32);
                    for _ in 0..nrows {
                        // Per-query causal bound: row i of a speculative entry sees fewer positions.
                        let bound = if bounded {
                            1 + (mix(&mut x) % seq as u64) as usize
                        } else {
                            seq
                        };
                        row_bounds.push(bound as i32);
                        // Block ids: those overlapping the bound, one wholly past it, and -1.
                        let span = (bound as u64).div_ceil(block as u64) + u64::from(block > 1);
                        for _ in 0..k {
                            topk.push((mix(&mut x) % (span + 1)) as i32 - 1);
                        }
                    }
                }
                // A random layer: its group's hot cache serves the picks (each layer of a group
                // may pick its own positions: every resolve fills all the group's layers).
                let layer = (mix(&mut x) % g.layers as u64) as u32;
                NOT_FIRST_LAYER.fetch_add(u64::from(g.group_layers(layer).start != layer), Relaxed);
                MIXED_GROUPS.fetch_add(
                    u64::from(
                        g.groups() > 1 && g.layer_groups.sizes(g.layers).iter().any(|&n| n > 1),
                    ),
                    Relaxed,
                );
                let n_rows = topk.len() / k;
                // The positions the picks stand for (the test's own reading of block ids).
                let kk = k * block as usize;
                let etopk = tierkit_testkit::expand_block_ids(&topk, k, block, &row_bounds);
                // Sometimes a persistent max-size buffer: the extra entries are padding.
                let (pad_idx, pad_rows) = if mix(&mut x).is_multiple_of(3) {
                    (
                        (mix(&mut x) % (2 * k as u64 + 1)) as usize,
                        (mix(&mut x) % 3) as usize,
                    )
                } else {
                    (0, 0)
                };
                let mut idx = vec![i32::MIN; etopk.len() + pad_idx];
                let mut valid = vec![i32::MIN; n_rows + pad_rows];
                let opts = ResolveOptions {
                    layout,
                    query_seq_lens: bounded.then_some(&row_bounds[..]),
                    block_positions: block,
                };
                let input = ResolveInput {
                    sessions: &batch,
                    query_start_loc: &qsl,
                    seq_lens: &seq_lens,
                    topk: &topk,
                    k,
                    layer,
                };
                let res = pool.resolve_with(
                    &input,
                    &opts,
                    &mut ResolveOutput {
                        indices: &mut idx,
                        valid_count: &mut valid,
                    },
                );
                prop_assert!(
                    idx.iter()
                        .all(|&i| i >= -1 && (i as i64) < g.arena_rows() as i64),
                    "every index defined"
                );
                // Overflow is served, never an error.
                let done = match res {
                    Err(e) => return Err(TestCaseError::fail(format!("resolve: {e}"))),
                    Ok(d) => d,
                };
                prop_assert!(idx[etopk.len()..].iter().all(|&i| i == -1), "index padding");
                prop_assert!(valid[n_rows..].iter().all(|&v| v == 0), "valid padding");
                PACKED.fetch_add(u64::from(layout == OutputLayout::Packed), Relaxed);
                ROW_BOUNDS.fetch_add(u64::from(bounded), Relaxed);
                BLOCK_IDS.fetch_add(u64::from(block > 1), Relaxed);
                PAGED_SPLIT.fetch_add(
                    u64::from(matches!(g.row_format, Some(RowFormat::PagedSplit { .. }))),
                    Relaxed,
                );
                PADDED.fetch_add(u64::from(pad_idx + pad_rows > 0), Relaxed);
                UNSERVED.fetch_add(done.stats.unserved, Relaxed);
                // Unserved picks only when some entry needs more distinct positions than hot rows.
                let fits = batch.iter().enumerate().all(|(ri, _)| {
                    let mut d: Vec<i32> = etopk[qsl[ri] as usize * kk..qsl[ri + 1] as usize * kk]
                        .iter()
                        .copied()
                        .filter(|&p| p >= 0)
                        .collect();
                    d.sort_unstable();
                    d.dedup();
                    d.len() <= g.hot_rows as usize
                });
                if fits {
                    prop_assert_eq!(done.stats.unserved, 0);
                }
                PAGE_HITS.fetch_add(done.stats.page_hits, Relaxed);
                HOT_HITS.fetch_add(done.stats.hot_hits, Relaxed);
                MISSES.fetch_add(done.stats.misses, Relaxed);
                SCRATCH_HITS.fetch_add(done.stats.scratch_hits, Relaxed);
                TAIL_HITS.fetch_add(done.stats.tail_hits, Relaxed);
                DIRECT.fetch_add(done.stats.direct_sessions, Relaxed);
                prop_assert_eq!(done.plan.group, g.group_of(layer));
                replay_checked(&mut pool, &g, &done.plan, mix(&mut x))?;
                // Expected bytes, captured before mid-step operations change the model: per output
                // entry, the bytes of the pick it serves. In place: column j serves pick j (or is
                // -1: padding or unserved). Packed: the served picks in column order, matched
                // greedily (each position's bytes are distinct); the skipped picks are unserved.
                let mut expect = Vec::new();
                let mut unserved = 0u64;
                let rb = g.row_bytes as usize;
                let l0 = layer as usize;
                for (ri, &s) in batch.iter().enumerate() {
                    for row in qsl[ri] as usize..qsl[ri + 1] as usize {
                        let picks: Vec<(usize, i32)> = (row * kk..(row + 1) * kk)
                            .map(|j| (j, etopk[j]))
                            .filter(|&(_, p)| p >= 0)
                            .collect();
                        let out = &idx[row * kk..(row + 1) * kk];
                        let served = out.iter().filter(|&&i| i >= 0).count();
                        prop_assert_eq!(valid[row] as usize, served);
                        unserved += (picks.len() - served) as u64;
                        match layout {
                            OutputLayout::InPlace => {
                                for j in row * kk..(row + 1) * kk {
                                    if etopk[j] < 0 {
                                        prop_assert_eq!(idx[j], -1);
                                    } else if idx[j] >= 0 {
                                        expect.push((j, m.expected(s, etopk[j] as u32).to_vec()));
                                    }
                                }
                            }
                            OutputLayout::Packed => {
                                prop_assert!(out[..served].iter().all(|&i| i >= 0), "packed front");
                                prop_assert!(out[served..].iter().all(|&i| i == -1), "packed tail");
                                let mut next = picks.iter();
                                for (e, &at) in out[..served].iter().enumerate() {
                                    let got = pool.arena_row(layer, at).expect("in range");
                                    let got = &*got;
                                    let hit = next.by_ref().find(|&&(_, p)| {
                                        &m.expected(s, p as u32)[l0 * rb..(l0 + 1) * rb] == got
                                    });
                                    let Some(&(_, p)) = hit else {
                                        return Err(TestCaseError::fail(format!(
                                            "packed entry {e} of row {row} serves no pick"
                                        )));
                                    };
                                    expect.push((row * kk + e, m.expected(s, p as u32).to_vec()));
                                }
                            }
                        }
                    }
                }
                prop_assert_eq!(unserved, done.stats.unserved, "unserved picks");
                // Readers in flight: reclaim, admit, finish, hand back while the indices are read.
                for mo in mid {
                    match mo {
                        MidOp::Reclaim { n } => {
                            let got = pool
                                .reclaim(n as u32)
                                .map_err(|e| TestCaseError::fail(format!("reclaim: {e}")))?;
                            RECLAIMED_IN_FLIGHT.fetch_add(got as u64, Relaxed);
                        }
                        MidOp::Revoke { who, seed } => {
                            if let Some(s) = m.pick(who) {
                                let got = revoke_some(&mut pool, s, seed)?;
                                RECLAIMED_IN_FLIGHT.fetch_add(got as u64, Relaxed);
                            }
                        }
                        MidOp::Admit { len } => m.admit(&mut pool, len)?,
                        MidOp::Finish { who } => m.finish(&mut pool, who)?,
                        MidOp::Between { chunk } => {
                            pool.between_steps(chunk as u32)
                                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                        }
                    }
                    check_books(&pool)?;
                }
                PENDING_AT_CHECK.fetch_add(pool.pages().pending as u64, Relaxed);
                // Every layer of the resolved layer's group holds the picks' bytes (the resolve
                // filled them all); other groups' planes are theirs.
                let rb = g.row_bytes as usize;
                for (j, want) in &expect {
                    for l in g.group_layers(layer).map(|l| l as usize) {
                        let got = pool.arena_row(l as u32, idx[*j]).expect("index in range");
                        prop_assert_eq!(
                            &*got,
                            &want[l * rb..(l + 1) * rb],
                            "pick {} layer {}",
                            j,
                            l
                        );
                    }
                }
                drop(done.ticket);
            }
            Op::Bad { kind, seed } => bad_input(&mut pool, &m, kind, seed)?,
        }
        check_books(&pool)?;
    }
    // Finish everything: every page comes back (no leak).
    let ids: Vec<u64> = m.sessions.keys().copied().collect();
    for s in ids {
        pool.finish(s).unwrap();
    }
    for _ in 0..10_000 {
        if pool.pages().queued == 0 && pool.pages().pending == 0 {
            break;
        }
        pool.between_steps(7).unwrap();
    }
    prop_assert_eq!(pool.pages().free, g.arena_pages);
    Ok(())
}

/// Replays `plan` into a layer picked by `x`: inside the plan's group it copies the same bytes
/// again (the pool unchanged but for a re-copy); outside it is refused with `LayerOutsideGroup`
/// and nothing changes.
fn replay_checked(
    pool: &mut ElasticPool,
    g: &Geometry,
    plan: &kv_elastic::ResolvePlan,
    x: u64,
) -> Result<(), TestCaseError> {
    if !x.is_multiple_of(3) {
        return Ok(());
    }
    let layer = ((x / 3) % g.layers as u64) as u32;
    let before = digest(pool);
    match pool.replay(plan, layer) {
        Ok(()) => {
            prop_assert_eq!(g.group_of(layer), plan.group);
            prop_assert_eq!(
                before,
                digest(pool),
                "a replay inside its group re-copies the same bytes"
            );
            REPLAYS.fetch_add(1, Relaxed);
        }
        Err(KvError::LayerOutsideGroup { group, .. }) => {
            prop_assert!(g.group_of(layer) != plan.group && group == plan.group);
            prop_assert_eq!(before, digest(pool), "a refused replay changes nothing");
        }
        Err(e) => return Err(TestCaseError::fail(format!("replay: {e}"))),
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn resolved_rows_hold_the_fully_resident_bytes(
        g in geometry(),
        elastic in prop::bool::weighted(0.8),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(g, elastic, ops)?;
    }
}

/// The property above is only as good as the paths it reaches: run a fixed-seed batch of cases and
/// require that every resolution path and reclaim-with-readers-in-flight actually occurred.
#[test]
fn the_property_reaches_every_path() {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 400,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    runner
        .run(
            &(
                geometry(),
                prop::bool::weighted(0.8),
                prop::collection::vec(op(), 1..40),
            ),
            |(g, e, ops)| run(g, e, ops),
        )
        .unwrap();
    let c = [
        ("page hits", PAGE_HITS.load(Relaxed)),
        ("hot hits", HOT_HITS.load(Relaxed)),
        ("misses", MISSES.load(Relaxed)),
        ("scratch hits", SCRATCH_HITS.load(Relaxed)),
        ("tail hits", TAIL_HITS.load(Relaxed)),
        ("direct-path requests", DIRECT.load(Relaxed)),
        (
            "pages reclaimed with readers in flight",
            RECLAIMED_IN_FLIGHT.load(Relaxed),
        ),
        (
            "pages pending at the readers' check",
            PENDING_AT_CHECK.load(Relaxed),
        ),
        (
            "admissions waiting or refused",
            WAITING_ADMISSIONS.load(Relaxed),
        ),
        (
            "picks unserved by overflowing steps",
            UNSERVED.load(Relaxed),
        ),
        ("packed-layout resolves", PACKED.load(Relaxed)),
        ("resolves with per-query bounds", ROW_BOUNDS.load(Relaxed)),
        ("resolves of block ids", BLOCK_IDS.load(Relaxed)),
        ("resolves on paged split rows", PAGED_SPLIT.load(Relaxed)),
        ("resolves into padded buffers", PADDED.load(Relaxed)),
        (
            "resolves at a layer other than its group's first",
            NOT_FIRST_LAYER.load(Relaxed),
        ),
        (
            "resolves with mixed layer groups",
            MIXED_GROUPS.load(Relaxed),
        ),
        ("replays inside a group", REPLAYS.load(Relaxed)),
    ];
    eprintln!("{c:?}");
    for (what, n) in c {
        assert!(n > 0, "the property never reached: {what}");
    }
}
