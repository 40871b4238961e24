//! The GPU back-end against the CPU reference: the same randomized sessions and operations
//! (admissions, some borrowing at most a few pages, appends, speculative drafts and accepts,
//! finishes, reclaims, caller-chosen revocations and lending, growth between steps (or none),
//! resolves with several query rows per session, duplicates and `-1` padding, replays, prefetches,
//! bad input) applied to an [`ElasticPool`] and a [`GpuElasticPool`] give identical results: indices,
//! valid counts, plans, stats and errors; and the bytes the GPU arena holds at every returned row equal
//! the fully resident reference (the committed or draft token at that position). Both copy back-ends
//! and every resolve kernel (`ResolveEngine::ALL`: classic, lean, lean with 512 threads).
//!
//! Prints `SKIP: no CUDA device` and passes where no device exists. Cases: `KV_GPU_CASES` (default 40).
#![cfg(feature = "test-hooks")]

use std::collections::BTreeMap;

use cuda_kernels::{CopyBackend, ResolveEngine};
use kv_elastic::gpu::{GpuElasticPool, GpuPoolConfig};
use kv_elastic::{
    AdmitOptions, ElasticPool, Geometry, KvError, LayerGroups, OutputLayout, PoolConfig,
    ResolveInput, ResolveOptions, ResolveOutput, ResolvePlan, Resolver, StepOptions,
};
use tierkit_testkit::pattern_tokens;

fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn below(x: &mut u64, n: u64) -> u64 {
    mix(x) % n.max(1)
}

/// Committed tokens and drafts of one session (each token `layers × row_bytes` bytes).
type Tokens = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Fully resident reference: committed tokens and drafts of each live session.
#[derive(Default)]
struct Model {
    sessions: BTreeMap<u64, Tokens>,
}

fn tokens(g: &Geometry, bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.chunks(g.token_bytes()).map(|c| c.to_vec()).collect()
}

struct Case {
    g: Geometry,
    cpu: ElasticPool,
    gpu: GpuElasticPool,
    model: Model,
    next_id: u64,
    last_plan: Option<(ResolvePlan, u32)>,
    resolves: u64,
    misses: u64,
    unserved: u64,
    packed: u64,
    bounded: u64,
    blocks: u64,
    written_back: u64,
}

const MAX_HISTORY: u32 = 96;
/// Session slots of the GPU pool (the test never admits more live sessions).
const MAX_SESSIONS: u32 = 8;

impl Case {
    /// The token a position of a session holds (committed or draft), one layer's row.
    fn token(&self, s: u64, p: i32, layer: u32) -> &[u8] {
        let (committed, drafts) = &self.model.sessions[&s];
        let tok = if (p as usize) < committed.len() {
            &committed[p as usize]
        } else {
            &drafts[p as usize - committed.len()]
        };
        let rb = self.g.row_bytes as usize;
        &tok[layer as usize * rb..(layer as usize + 1) * rb]
    }

    /// What each non `-1` output entry serves: `(arena row, session, position)`. In place: column
    /// `j` serves pick `j` (a valid pick may be `-1`: unserved by an overflowing step). Packed: the
    /// served picks in column order, matched greedily against the bytes at `layer` (each
    /// position's bytes are distinct). Checks the layout's shape on the way.
    #[allow(clippy::too_many_arguments)]
    fn served(
        &self,
        layer: u32,
        sessions: &[u64],
        qsl: &[i32],
        topk: &[i32],
        k: usize,
        idx: &[i32],
        layout: OutputLayout,
    ) -> Vec<(i32, u64, i32)> {
        let plane = self.gpu.device().download_plane(layer).unwrap();
        let rb = self.g.row_bytes as usize;
        let mut out = Vec::new();
        for (ri, &s) in sessions.iter().enumerate() {
            for row in qsl[ri] as usize..qsl[ri + 1] as usize {
                let cols = row * k..(row + 1) * k;
                match layout {
                    OutputLayout::InPlace => {
                        for j in cols {
                            if topk[j] < 0 {
                                assert_eq!(idx[j], -1);
                            } else if idx[j] >= 0 {
                                out.push((idx[j], s, topk[j]));
                            }
                        }
                    }
                    OutputLayout::Packed => {
                        let o = &idx[cols.clone()];
                        let n = o.iter().filter(|&&i| i >= 0).count();
                        assert!(o[..n].iter().all(|&i| i >= 0) && o[n..].iter().all(|&i| i == -1));
                        let mut picks = topk[cols].iter().copied().filter(|&p| p >= 0);
                        for &i in &o[..n] {
                            let at = i as usize * rb;
                            let p = picks
                                .by_ref()
                                .find(|&p| self.token(s, p, layer) == &plane[at..at + rb])
                                .expect("a packed entry serves a pick, in column order");
                            out.push((i, s, p));
                        }
                    }
                }
            }
        }
        out
    }

    fn check_bytes(&self, layer: u32, served: &[(i32, u64, i32)]) {
        let plane = self.gpu.device().download_plane(layer).unwrap();
        let cpu_plane = self.cpu.plane(layer).unwrap();
        let rb = self.g.row_bytes as usize;
        for &(i, s, p) in served {
            let at = i as usize * rb;
            assert_eq!(
                &plane[at..at + rb],
                &cpu_plane[at..at + rb],
                "GPU vs CPU arena: session {s} position {p} layer {layer} row {i}"
            );
            assert_eq!(
                &plane[at..at + rb],
                self.token(s, p, layer),
                "session {s} position {p} layer {layer} row {i}"
            );
        }
    }

    /// Replays a plan made at `layer` into every other layer on both pools: inside the layer's
    /// group a re-copy (the resolve filled the group already), outside it refused alike
    /// (`LayerOutsideGroup`).
    fn replay_others(&mut self, plan: &ResolvePlan, layer: u32) {
        for l in (0..self.g.layers).filter(|&l| l != layer) {
            let a = self.cpu.replay(plan, l);
            assert_eq!(a, self.gpu.replay(plan, l), "replay into layer {l}");
            if self.g.group_of(l) == self.g.group_of(layer) {
                a.unwrap();
            } else {
                assert!(matches!(a, Err(KvError::LayerOutsideGroup { .. })), "{a:?}");
            }
        }
    }

    /// The history lives once, in the pinned store: after the device passed every write-back,
    /// the GPU pool's host store holds every committed token of every live session.
    fn check_host_store(&self) {
        self.gpu.device().gpu().synchronize().unwrap();
        for (&s, (committed, _)) in &self.model.sessions {
            assert_eq!(
                self.gpu.cpu().committed_len(s).unwrap(),
                committed.len() as u32
            );
            for (p, tok) in committed.iter().enumerate() {
                assert_eq!(
                    self.gpu.cpu().host().token(s, p as u32).unwrap(),
                    &tok[..],
                    "pinned store: session {s} position {p}"
                );
            }
        }
    }

    fn step(&mut self, rng: &mut u64) {
        let g = self.g;
        let live: Vec<u64> = self.model.sessions.keys().copied().collect();
        let pick = |rng: &mut u64| live[below(rng, live.len() as u64) as usize];
        match below(rng, 12) {
            0 | 1 if live.len() < MAX_SESSIONS as usize => {
                let id = self.next_id;
                self.next_id += 1;
                let len = 1 + below(rng, 60) as u32;
                let h = pattern_tokens(g.row_bytes, g.layers, id, 0, len);
                // Now and then an admission that borrows at most a few pages (0: hot cache only).
                let o = AdmitOptions {
                    max_borrowed_pages: match below(rng, 4) {
                        0 => below(rng, 3) as u32,
                        _ => u32::MAX,
                    },
                };
                let a = self.cpu.admit_with(id, &h, o);
                let b = self.gpu.admit_with(id, &h, o);
                match (&a, &b) {
                    (Ok(x), Ok(y)) => assert_eq!(x, y),
                    (Err(KvError::NoRoom { .. }), Err(KvError::NoRoom { .. })) => {}
                    (Err(x), Err(y)) => assert_eq!(x, y),
                    _ => panic!("admit differs: {a:?} vs {b:?}"),
                }
                if matches!(a, Ok(kv_elastic::Admission::Admitted { .. })) {
                    self.model.sessions.insert(id, (tokens(&g, &h), Vec::new()));
                }
            }
            2 if !live.is_empty() => {
                let s = pick(rng);
                let n = below(rng, 5) as u32;
                let committed = self.model.sessions[&s].0.len() as u32;
                if committed + n + g.scratch_rows > MAX_HISTORY {
                    return;
                }
                let t = pattern_tokens(g.row_bytes, g.layers, s, committed, n);
                if n <= g.tail_rows && below(rng, 2) == 0 {
                    // The engine path: the step wrote the new rows into the tail rows on the
                    // device; a write-back kernel puts them into the pinned host store.
                    let tb = g.token_bytes();
                    let rb = g.row_bytes as usize;
                    for i in 0..n {
                        let row = self.gpu.tail_row_of(s, committed + i).unwrap();
                        assert_eq!(row, self.cpu.tail_row_of(s, committed + i).unwrap());
                        let tok = &t[i as usize * tb..(i as usize + 1) * tb];
                        for l in 0..g.layers {
                            let bytes = &tok[l as usize * rb..(l as usize + 1) * rb];
                            self.gpu.device_mut().upload_rows(l, row, bytes).unwrap();
                        }
                    }
                    assert_eq!(self.cpu.append(s, &t), self.gpu.append_written(s, n));
                    self.written_back += n as u64;
                } else {
                    assert_eq!(self.cpu.append(s, &t), self.gpu.append(s, &t));
                }
                let m = self.model.sessions.get_mut(&s).unwrap();
                m.0.extend(tokens(&g, &t));
                m.1.clear();
            }
            3 if !live.is_empty() && g.scratch_rows > 0 => {
                let s = pick(rng);
                let n = 1 + below(rng, 2) as u32;
                let m = &self.model.sessions[&s];
                let start = (m.0.len() + m.1.len()) as u32;
                let t = pattern_tokens(g.row_bytes, g.layers, s ^ (1 << 40), start, n);
                let a = self.cpu.write_scratch(s, &t);
                assert_eq!(a, self.gpu.write_scratch(s, &t));
                if a.is_ok() {
                    self.model
                        .sessions
                        .get_mut(&s)
                        .unwrap()
                        .1
                        .extend(tokens(&g, &t));
                }
            }
            4 if !live.is_empty() => {
                let s = pick(rng);
                let n = below(rng, 3) as u32;
                let a = self.cpu.accept(s, n);
                assert_eq!(a, self.gpu.accept(s, n));
                if a.is_ok() {
                    let m = self.model.sessions.get_mut(&s).unwrap();
                    let acc: Vec<Vec<u8>> = m.1.drain(..).take(n as usize).collect();
                    m.0.extend(acc);
                }
            }
            5 if !live.is_empty() => {
                let s = pick(rng);
                assert_eq!(self.cpu.finish(s), self.gpu.finish(s));
                self.model.sessions.remove(&s);
            }
            6 => {
                let n = 1 + below(rng, 6) as u32;
                if live.is_empty() || below(rng, 2) == 0 {
                    assert_eq!(self.cpu.reclaim(n), self.gpu.reclaim(n));
                } else {
                    // A caller's own order: named pages of one session back, some lent again.
                    let s = pick(rng);
                    let wanted = self
                        .cpu
                        .wanted_pages(self.model.sessions[&s].0.len() as u32);
                    let pages: Vec<u32> = (0..wanted).filter(|_| below(rng, 2) == 0).collect();
                    assert_eq!(self.cpu.revoke(s, &pages), self.gpu.revoke(s, &pages));
                    assert_eq!(self.cpu.lend(s, n), self.gpu.lend(s, n));
                }
            }
            7 => {
                let c = 1 + below(rng, 6) as u32;
                if below(rng, 3) == 0 {
                    let o = StepOptions { growth: false };
                    assert_eq!(
                        self.cpu.between_steps_with(c, o),
                        self.gpu.between_steps_with(c, o)
                    );
                } else {
                    assert_eq!(self.cpu.between_steps(c), self.gpu.between_steps(c));
                }
            }
            8 if !live.is_empty() => {
                let s = pick(rng);
                let committed = self.model.sessions[&s].0.len() as i64;
                let n = below(rng, 3 * g.hot_rows as u64) as usize;
                let cand: Vec<i32> = (0..n)
                    .map(|_| below(rng, committed as u64 + 1) as i32 - 1)
                    .collect();
                let layer = below(rng, g.layers as u64) as u32;
                let a = self.cpu.prefetch(s, &cand, layer);
                let b = self.gpu.prefetch(s, &cand, layer);
                assert_eq!(a, b, "prefetch plan");
                if let Ok(plan) = a {
                    self.replay_others(&plan, layer);
                }
            }
            9 => {
                if let Some((plan, layer)) = self.last_plan.take() {
                    let other = (layer + 1) % g.layers;
                    let a = self.cpu.replay(&plan, other);
                    let b = self.gpu.replay(&plan, other);
                    assert_eq!(a, b, "replay");
                    if a.is_ok() {
                        let pc = self.cpu.plane(other).unwrap().to_vec();
                        let pg = self.gpu.device().download_plane(other).unwrap();
                        let rb = g.row_bytes as usize;
                        for c in &plan.copies {
                            let at = c.dst_row as usize * rb;
                            assert_eq!(pc[at..at + rb], pg[at..at + rb], "replayed row");
                        }
                    }
                }
            }
            10 if !live.is_empty() => {
                // Bad input: unknown session, out-of-range position, bad layer.
                let s = pick(rng);
                let committed = self.model.sessions[&s].0.len() as i32;
                let kind = below(rng, 3);
                let sessions = if kind == 0 { vec![1 << 50] } else { vec![s] };
                let topk = if kind == 1 {
                    vec![0, committed + 7]
                } else {
                    vec![0, -1]
                };
                let layer = if kind == 2 { g.layers } else { 0 };
                let input = ResolveInput {
                    sessions: &sessions,
                    query_start_loc: &[0, 1],
                    seq_lens: &[committed],
                    topk: &topk,
                    k: 2,
                    layer,
                };
                let (mut i1, mut v1) = ([5i32; 2], [5i32; 1]);
                let (mut i2, mut v2) = ([7i32; 2], [7i32; 1]);
                let a = self.cpu.resolve(
                    &input,
                    &mut ResolveOutput {
                        indices: &mut i1,
                        valid_count: &mut v1,
                    },
                );
                let b = self.gpu.resolve(
                    &input,
                    &mut ResolveOutput {
                        indices: &mut i2,
                        valid_count: &mut v2,
                    },
                );
                assert_eq!(a.as_ref().err(), b.as_ref().err());
                assert!(a.is_err());
                assert_eq!((i1, v1), (i2, v2));
            }
            _ if !live.is_empty() => self.resolve(rng, &live),
            _ => {}
        }
        self.cpu.check_invariants().unwrap();
        self.gpu.cpu().check_invariants().unwrap();
        if below(rng, 16) == 0 {
            self.check_host_store();
        }
    }

    fn resolve(&mut self, rng: &mut u64, live: &[u64]) {
        let g = self.g;
        let reqs = 1 + below(rng, live.len().min(4) as u64) as usize;
        let mut sessions: Vec<u64> = Vec::new();
        while sessions.len() < reqs {
            let s = live[below(rng, live.len() as u64) as usize];
            if !sessions.contains(&s) {
                sessions.push(s);
            }
        }
        let k = 1 + below(rng, 12) as usize;
        // Sometimes block ids (`ResolveOptions::block_positions`), drawn from a side stream so that
        // the position-pick cases keep their draws; a few ids per row (each stands for `block`).
        let block = {
            let mut b = *rng ^ 0x0B10_C1D5;
            if below(&mut b, 3) == 0 {
                [2u32, 3, 4, 8][below(&mut b, 4) as usize]
            } else {
                1
            }
        };
        let k = if block > 1 { 1 + (k - 1) % 4 } else { k };
        let mut qsl = vec![0i32];
        let mut seq_lens = Vec::new();
        let mut topk = Vec::new();
        let layout = if below(rng, 2) == 0 {
            OutputLayout::InPlace
        } else {
            OutputLayout::Packed
        };
        let bounded = below(rng, 3) == 0;
        let mut row_bounds = Vec::new();
        for &s in &sessions {
            let (c, d) = &self.model.sessions[&s];
            let visible = c.len() + below(rng, d.len() as u64 + 1) as usize;
            seq_lens.push(visible as i32);
            let rows = 1 + below(rng, 3) as i32;
            for _ in 0..rows {
                // Per-query causal bound (speculative rows see fewer drafts).
                let bound = if bounded {
                    1 + below(rng, visible as u64) as usize
                } else {
                    visible
                };
                row_bounds.push(bound as i32);
                // Keep distinct non-resident picks within the hot cache often enough; the rest
                // exercise overflowing steps (served as far as hot rows last, same on both sides).
                let span = if below(rng, 4) == 0 {
                    bound as u64
                } else {
                    (g.hot_rows as u64).min(bound as u64)
                };
                let base = bound as u64 - span;
                // Block ids: the blocks overlapping the bound and one wholly past it.
                let blocks = (bound as u64).div_ceil(block as u64) + 1;
                for _ in 0..k {
                    let p = if below(rng, 8) == 0 {
                        -1
                    } else if block > 1 {
                        below(rng, blocks) as i32
                    } else {
                        (base + below(rng, span)) as i32
                    };
                    topk.push(p);
                }
            }
            qsl.push(qsl.last().unwrap() + rows);
        }
        let opts = ResolveOptions {
            layout,
            query_seq_lens: bounded.then_some(&row_bounds[..]),
            block_positions: block,
        };
        // Sometimes persistent max-size buffers (padding past rows × k and rows).
        let (pad, pad_rows) = if below(rng, 3) == 0 {
            (
                below(rng, 2 * k as u64 + 1) as usize,
                below(rng, 3) as usize,
            )
        } else {
            (0, 0)
        };
        let layer = below(rng, g.layers as u64) as u32;
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &qsl,
            seq_lens: &seq_lens,
            topk: &topk,
            k,
            layer,
        };
        // The positions the picks stand for (the test's own reading of block ids): what the
        // outputs' columns serve.
        let (rows, kk) = (topk.len() / k, k * block as usize);
        let picks = tierkit_testkit::expand_block_ids(&topk, k, block, &row_bounds);
        let n = picks.len();
        let (mut i1, mut v1) = (vec![-7i32; n + pad], vec![-7i32; rows + pad_rows]);
        let (mut i2, mut v2) = (vec![-9i32; n + pad], vec![-9i32; rows + pad_rows]);
        let a = self.cpu.resolve_with(
            &input,
            &opts,
            &mut ResolveOutput {
                indices: &mut i1,
                valid_count: &mut v1,
            },
        );
        let b = self.gpu.resolve_with(
            &input,
            &opts,
            &mut ResolveOutput {
                indices: &mut i2,
                valid_count: &mut v2,
            },
        );
        assert!(i2[n..].iter().all(|&i| i == -1) && v2[rows..].iter().all(|&v| v == 0));
        assert_eq!(i1, i2, "indices");
        assert_eq!(v1, v2, "valid_count");
        match (a, b) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.plan, b.plan, "plan");
                assert_eq!(a.stats, b.stats, "stats");
                self.resolves += 1;
                self.misses += a.stats.misses;
                self.unserved += a.stats.unserved;
                self.packed += u64::from(layout == OutputLayout::Packed);
                self.bounded += u64::from(bounded);
                self.blocks += u64::from(block > 1);
                let served = self.served(layer, &sessions, &qsl, &picks, kk, &i2, layout);
                let wanted = picks.iter().filter(|&&p| p >= 0).count();
                assert_eq!(served.len() as u64 + a.stats.unserved, wanted as u64);
                // The resolve filled every layer of its group: bytes right in each (other
                // groups' planes are theirs).
                for l in g.group_layers(layer) {
                    self.check_bytes(l, &served);
                }
                self.replay_others(&a.plan, layer);
                for l in g.group_layers(layer) {
                    self.check_bytes(l, &served);
                }
                if !a.plan.copies.is_empty() && g.layers > 1 {
                    self.last_plan = Some((a.plan, layer));
                }
            }
            (Err(x), Err(y)) => assert_eq!(x, y),
            (a, b) => panic!("resolve differs: {:?} vs {:?}", a.err(), b.err()),
        }
    }
}

#[test]
fn gpu_resolver_equals_cpu_reference() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let cases: u64 = std::env::var("KV_GPU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let (mut resolves, mut misses, mut unserved, mut packed, mut bounded) = (0, 0, 0, 0, 0);
    let mut blocks = 0;
    let mut written_back = 0;
    let mut engines = [0u64; ResolveEngine::ALL.len()];
    let (mut fills_dma, mut fills_gather) = (0u64, 0u64);
    for case in 0..cases {
        let mut rng = case * 7919 + 1;
        let rbs = [16u32, 24, 32, 656];
        let mut g = Geometry {
            row_bytes: rbs[below(&mut rng, 4) as usize],
            layers: 1 + below(&mut rng, 3) as u32,
            page_rows: 2 + below(&mut rng, 4) as u32,
            arena_pages: 0,
            hot_rows: 4 + below(&mut rng, 12) as u32,
            tail_rows: 1 + below(&mut rng, 4) as u32,
            scratch_rows: below(&mut rng, 3) as u32,
            layer_groups: LayerGroups::per_layer(),
        };
        // Per layer, one shared group, or a mixture (3 layers as [1, 2] or [2, 1]).
        g.layer_groups = match (below(&mut rng, 3), g.layers) {
            (0, _) => LayerGroups::per_layer(),
            (1, _) => LayerGroups::one(),
            (_, 3) if case % 2 == 0 => LayerGroups::from_sizes(&[1, 2]).unwrap(),
            (_, 3) => LayerGroups::from_sizes(&[2, 1]).unwrap(),
            _ => LayerGroups::every(1).unwrap(),
        };
        g.arena_pages = g.fixed_pages() * 3 + below(&mut rng, 24) as u32;
        let config = PoolConfig {
            elastic: below(&mut rng, 4) != 0,
        };
        let backend = if case % 2 == 0 {
            CopyBackend::Gather
        } else {
            CopyBackend::Dma
        };
        let gcfg = GpuPoolConfig {
            max_sessions: MAX_SESSIONS,
            max_history: MAX_HISTORY,
            backend,
        };
        let mut c = Case {
            g,
            cpu: ElasticPool::new(g, config).unwrap(),
            gpu: GpuElasticPool::new(&gpu, g, config, gcfg).unwrap(),
            model: Model::default(),
            next_id: 1,
            last_plan: None,
            resolves: 0,
            misses: 0,
            unserved: 0,
            packed: 0,
            bounded: 0,
            blocks: 0,
            written_back: 0,
        };
        c.gpu.set_settle_readers(true);
        // Cases 2e, 2e + 1 (mod 2 × ALL.len()): engine e of `ResolveEngine::ALL` (each with both back-ends).
        let ei = (case / 2 % ResolveEngine::ALL.len() as u64) as usize;
        let engine = ResolveEngine::ALL[ei];
        c.gpu.set_resolve_engine(engine);
        for _ in 0..120 {
            c.step(&mut rng);
        }
        c.check_host_store();
        engines[ei] += c.resolves;
        // Page fills: copy-engine runs where the store has one layer, the gather kernel otherwise.
        let fc = c.gpu.flush_counters();
        fills_dma += fc.rows_filled_dma;
        fills_gather += fc.rows_filled - fc.rows_filled_dma;
        written_back += c.written_back;
        resolves += c.resolves;
        misses += c.misses;
        unserved += c.unserved;
        packed += c.packed;
        bounded += c.bounded;
        blocks += c.blocks;
    }
    println!(
        "{cases} cases: {resolves} successful resolves, {misses} misses fetched, {unserved} picks \
         unserved by overflowing steps, {packed} packed, {bounded} with per-query bounds, \
         {blocks} of block ids"
    );
    assert!(resolves > cases * 5, "too few resolves exercised");
    assert!(misses > 0, "no miss path exercised");
    assert!(unserved > 0, "no overflowing step exercised");
    assert!(
        packed > 0 && bounded > 0 && blocks > 0,
        "new modes not exercised"
    );
    assert!(written_back > 0, "no device write-back exercised");
    if cases >= 2 * ResolveEngine::ALL.len() as u64 {
        assert!(
            engines.iter().all(|&n| n > 0),
            "every resolve kernel must be exercised: {engines:?}"
        );
        assert!(
            fills_dma > 0 && fills_gather > 0,
            "both page-fill paths must be exercised: {fills_dma} DMA rows, {fills_gather} gathered"
        );
    }
}

/// [`four_session_pools`] with `sessions` admitted (3000 pattern tokens each), readers settled
/// and `engine` resolving.
fn four_sessions_admitted(
    gpu: &std::sync::Arc<cuda_kernels::Gpu>,
    g: Geometry,
    engine: ResolveEngine,
    sessions: &[u64; 4],
) -> (ElasticPool, GpuElasticPool) {
    let (mut cpu, mut gp) = four_session_pools(gpu, g);
    gp.set_settle_readers(true);
    gp.set_resolve_engine(engine);
    for &s in sessions {
        let h = pattern_tokens(g.row_bytes, g.layers, s, 0, 3000);
        assert_eq!(cpu.admit(s, &h), gp.admit(s, &h));
    }
    (cpu, gp)
}

/// A CPU reference and a GPU pool of 4 sessions of up to 4096 positions (gather back-end).
fn four_session_pools(
    gpu: &std::sync::Arc<cuda_kernels::Gpu>,
    g: Geometry,
) -> (ElasticPool, GpuElasticPool) {
    let gcfg = GpuPoolConfig {
        max_sessions: 4,
        max_history: 4096,
        backend: CopyBackend::Gather,
    };
    (
        ElasticPool::new(g, PoolConfig::default()).unwrap(),
        GpuElasticPool::new(gpu, g, PoolConfig::default(), gcfg).unwrap(),
    )
}

#[test]
fn gpu_pool_large_geometry_matches_cpu() {
    // Realistic row size and top-k: 656-byte rows, k = 256, hot cache 512, 4 requests x 2 rows;
    // each resolve kernel on its own pool pair.
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    for engine in ResolveEngine::ALL {
        large_geometry_case(&gpu, engine);
    }
}

fn large_geometry_case(gpu: &std::sync::Arc<cuda_kernels::Gpu>, engine: ResolveEngine) {
    let g = Geometry {
        row_bytes: 656,
        layers: 2,
        page_rows: 64,
        arena_pages: 40,
        hot_rows: 512,
        tail_rows: 64,
        scratch_rows: 4,
        layer_groups: Default::default(),
    };
    let sessions = [11u64, 12, 13, 14];
    let (mut cpu, mut gp) = four_sessions_admitted(gpu, g, engine, &sessions);
    let mut rng = 5u64;
    for step in 0..12 {
        let k = 256;
        let mut topk = Vec::new();
        for _ in 0..sessions.len() * 2 * k {
            topk.push(if below(&mut rng, 50) == 0 {
                -1
            } else {
                below(&mut rng, 3000) as i32
            });
        }
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &[0, 2, 4, 6, 8],
            seq_lens: &[3000; 4],
            topk: &topk,
            k,
            layer: step % 2,
        };
        let (mut i1, mut v1) = (vec![0; topk.len()], vec![0; 8]);
        let (mut i2, mut v2) = (vec![0; topk.len()], vec![0; 8]);
        let a = cpu.resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut i1,
                valid_count: &mut v1,
            },
        );
        let b = gp.resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut i2,
                valid_count: &mut v2,
            },
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!((i1, v1), (i2.clone(), v2));
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        let plane = gp.device().download_plane(step % 2).unwrap();
        let cplane = cpu.plane(step % 2).unwrap();
        for &r in i2.iter().filter(|&&r| r >= 0) {
            let at = r as usize * 656;
            assert_eq!(plane[at..at + 656], cplane[at..at + 656]);
        }
    }
}

#[test]
fn gpu_block_ids_match_cpu_at_decode_widths() {
    // Block-id top-k at production widths (MiniMax-M3 style; SGLang's `TopKIsBlocks`): 656-byte
    // rows, a 2048-row hot cache, blocks of 64 (32 ids = 2048 positions: the lean512 engine's
    // widest entry), 16 and 5 (409 ids = 2045 positions: a block width that divides nothing);
    // decode steps, speculative steps of 2 rows with per-query bounds, and visible lengths that
    // end inside a block; every resolve kernel on its own pool pair.
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    for engine in ResolveEngine::ALL {
        for block in [64u32, 16, 5] {
            block_id_case(&gpu, engine, block);
        }
    }
}

fn block_id_case(gpu: &std::sync::Arc<cuda_kernels::Gpu>, engine: ResolveEngine, block: u32) {
    let g = Geometry {
        row_bytes: 656,
        layers: 2,
        page_rows: 64,
        arena_pages: 4 * 34 + 24,
        hot_rows: 2048,
        tail_rows: 64,
        scratch_rows: 4,
        layer_groups: Default::default(),
    };
    let sessions = [21u64, 22, 23, 24];
    let (mut cpu, mut gp) = four_sessions_admitted(gpu, g, engine, &sessions);
    let k = (2048 / block) as usize;
    let mut rng = 11u64 + block as u64;
    let (mut served, mut misses) = (0u64, 0u64);
    for step in 0..10u32 {
        // Even steps decode (one row per session), odd steps verify drafts (two rows each, the
        // first bounded one position short of the second).
        let rows_per = 1 + (step % 2) as usize;
        let seq_lens: Vec<i32> = sessions
            .iter()
            .map(|_| 2000 + below(&mut rng, 1001) as i32)
            .collect();
        let bounds: Vec<i32> = seq_lens
            .iter()
            .flat_map(|&l| (0..rows_per as i32).map(move |r| l - rows_per as i32 + 1 + r))
            .collect();
        let mut topk = Vec::new();
        for &bound in &bounds {
            // The blocks overlapping the bound, one wholly past it, and -1.
            let blocks = (bound as u64).div_ceil(block as u64) + 1;
            for _ in 0..k {
                topk.push(if below(&mut rng, 16) == 0 {
                    -1
                } else {
                    below(&mut rng, blocks) as i32
                });
            }
        }
        let qsl: Vec<i32> = (0..=sessions.len() as i32)
            .map(|r| r * rows_per as i32)
            .collect();
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &qsl,
            seq_lens: &seq_lens,
            topk: &topk,
            k,
            layer: step % 2,
        };
        let opts = ResolveOptions {
            layout: if step % 4 == 1 {
                OutputLayout::Packed
            } else {
                OutputLayout::InPlace
            },
            query_seq_lens: (rows_per > 1).then_some(&bounds[..]),
            block_positions: block,
        };
        let n = topk.len() * block as usize;
        let rows = bounds.len();
        let (mut i1, mut v1) = (vec![0; n], vec![0; rows]);
        let (mut i2, mut v2) = (vec![0; n], vec![0; rows]);
        let a = cpu.resolve_with(
            &input,
            &opts,
            &mut ResolveOutput {
                indices: &mut i1,
                valid_count: &mut v1,
            },
        );
        let b = gp.resolve_with(
            &input,
            &opts,
            &mut ResolveOutput {
                indices: &mut i2,
                valid_count: &mut v2,
            },
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            (&i1, &v1),
            (&i2, &v2),
            "block {block} step {step} {engine:?}"
        );
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        // Every in-place column serves the position it stands for, in both arenas.
        let picks = tierkit_testkit::expand_block_ids(&topk, k, block, &bounds);
        let plane = gp.device().download_plane(step % 2).unwrap();
        let cplane = cpu.plane(step % 2).unwrap();
        let mut want = vec![0u8; 656];
        for (j, &r) in i2.iter().enumerate().filter(|&(_, &r)| r >= 0) {
            let at = r as usize * 656;
            assert_eq!(plane[at..at + 656], cplane[at..at + 656]);
            if opts.layout == OutputLayout::InPlace {
                let s = sessions[j / (k * block as usize) / rows_per];
                tierkit_testkit::pattern_row(s, picks[j] as u32, step % 2, &mut want);
                assert_eq!(
                    plane[at..at + 656],
                    want[..],
                    "column {j}: position {}",
                    picks[j]
                );
            }
        }
        served += a.stats.picks;
        misses += a.stats.misses;
    }
    assert!(
        served > 0 && misses > 0,
        "block {block}: nothing served or fetched"
    );
}

/// A step after admissions, reclaims, growth and write-backs costs what a step without them
/// costs: each control operation publishes O(changed) work — rows copied, table words patched,
/// bytes staged for the device — never the arena, and waits for nothing on the host. The bytes
/// stay equal to the CPU reference's throughout (timing: the bench).
#[test]
fn publish_work_is_o_changed_and_exact() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let mut g = Geometry {
        row_bytes: 656,
        layers: 2,
        page_rows: 64,
        arena_pages: 0,
        hot_rows: 128,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
    };
    let history = 2048u32;
    g.arena_pages = 4 * (g.fixed_pages() + history / 64) + 16;
    let arena_bytes = g.arena_rows() * g.token_bytes() as u64;
    let (mut cpu, mut gp) = four_session_pools(&gpu, g);
    let sessions = [1u64, 2, 3, 4];
    let hists: Vec<Vec<u8>> = sessions
        .iter()
        .map(|&s| pattern_tokens(g.row_bytes, g.layers, s, 0, history))
        .collect();
    let batch: Vec<(u64, &[u8])> = sessions
        .iter()
        .zip(&hists)
        .map(|(&s, h)| (s, h.as_slice()))
        .collect();
    for &(s, h) in &batch {
        cpu.admit(s, h).unwrap();
    }
    let c0 = gp.flush_counters();
    gp.admit_batch(&batch).unwrap();
    let c1 = gp.flush_counters();
    let lent = gp.cpu().elastic_lent() as u64;
    assert_eq!(lent, cpu.elastic_lent() as u64);
    // Admissions: the lent pages and the tails, once, on the copy stream; one publish.
    assert_eq!(c1.rows_filled - c0.rows_filled, lent * 64 + 4 * 64);
    assert_eq!(c1.rows_copied - c0.rows_copied, 0);
    assert_eq!(c1.host_syncs - c0.host_syncs, 0);
    assert_eq!(c1.flushes - c0.flushes, 1);

    let mut rng = 9u64;
    let step = |gp: &mut GpuElasticPool, cpu: &mut ElasticPool, rng: &mut u64| {
        let k = 64;
        let len = cpu.committed_len(1).unwrap() as i32;
        let topk: Vec<i32> = (0..sessions.len() * k)
            .map(|_| below(rng, len as u64) as i32)
            .collect();
        let seq: Vec<i32> = sessions
            .iter()
            .map(|&s| cpu.committed_len(s).unwrap() as i32)
            .collect();
        let topk: Vec<i32> = topk
            .iter()
            .enumerate()
            .map(|(i, &p)| p.min(seq[i / k] - 1))
            .collect();
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &[0, 1, 2, 3, 4],
            seq_lens: &seq,
            topk: &topk,
            k,
            layer: 0,
        };
        let (mut i1, mut v1) = (vec![0; topk.len()], vec![0; 4]);
        let (mut i2, mut v2) = (vec![0; topk.len()], vec![0; 4]);
        let a = cpu
            .resolve(
                &input,
                &mut ResolveOutput {
                    indices: &mut i1,
                    valid_count: &mut v1,
                },
            )
            .unwrap();
        let b = gp
            .resolve(
                &input,
                &mut ResolveOutput {
                    indices: &mut i2,
                    valid_count: &mut v2,
                },
            )
            .unwrap();
        assert_eq!((&i1, &v1), (&i2, &v2));
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        let plane = gp.device().download_plane(0).unwrap();
        let cplane = cpu.plane(0).unwrap();
        for &r in i2.iter().filter(|&&r| r >= 0) {
            let at = r as usize * 656;
            assert_eq!(plane[at..at + 656], cplane[at..at + 656], "row {r}");
        }
    };
    step(&mut gp, &mut cpu, &mut rng);

    // A step's append through the device: one write-back row per session, one descriptor each.
    let c2 = gp.flush_counters();
    let mut appends = Vec::new();
    for &s in &sessions {
        let p = cpu.committed_len(s).unwrap();
        let t = pattern_tokens(g.row_bytes, g.layers, s, p, 1);
        let row = gp.tail_row_of(s, p).unwrap();
        for l in 0..g.layers {
            let at = l as usize * 656;
            gp.device_mut()
                .upload_rows(l, row, &t[at..at + 656])
                .unwrap();
        }
        cpu.append(s, &t).unwrap();
        appends.push((s, 1));
    }
    let direct_before = gp.device().direct_batch();
    gp.append_written_batch(&appends).unwrap();
    let c3 = gp.flush_counters();
    assert_eq!(c3.rows_written_back - c2.rows_written_back, 4);
    assert_eq!(c3.rows_copied - c2.rows_copied, 0);
    assert_eq!(c3.rows_filled - c2.rows_filled, 0);
    // Four descriptors, and the direct-batch word when the appends flipped it.
    let flip = u64::from(gp.device().direct_batch() != direct_before);
    assert_eq!(c3.words_patched - c2.words_patched, 4 * 8 + flip);
    assert_eq!(c3.ranges_reset - c2.ranges_reset, 0);
    assert_eq!(c3.host_syncs - c2.host_syncs, 0);
    assert!(c3.staged_bytes - c2.staged_bytes <= 1024);
    step(&mut gp, &mut cpu, &mut rng);

    // Reclaim: page-table entries and descriptors only, no row moves. (The test lets the step's
    // readers pass first so both pools free the reclaimed pages at the same call and lend the
    // same pages later; the pool itself does not wait.)
    gp.device().gpu().synchronize().unwrap();
    let c4 = gp.flush_counters();
    assert_eq!(gp.reclaim(6).unwrap(), cpu.reclaim(6).unwrap());
    let c5 = gp.flush_counters();
    assert_eq!(
        c5.rows_filled + c5.rows_copied,
        c4.rows_filled + c4.rows_copied
    );
    assert!(c5.words_patched - c4.words_patched <= 6 + 4 * 8 + 1); // + the direct-batch word
    assert!(c5.staged_bytes - c4.staged_bytes <= 2048);
    assert_eq!(c5.host_syncs - c4.host_syncs, 0);
    step(&mut gp, &mut cpu, &mut rng);

    // Growth between steps: the grown pages' rows, on the copy stream.
    gp.device().gpu().synchronize().unwrap();
    let c6 = gp.flush_counters();
    let m = gp.between_steps(4).unwrap();
    assert_eq!(m, cpu.between_steps(4).unwrap());
    let c7 = gp.flush_counters();
    assert_eq!(c7.rows_filled - c6.rows_filled, m.grown as u64 * 64);
    assert_eq!(c7.rows_copied - c6.rows_copied, 0);
    assert!(c7.words_patched - c6.words_patched <= m.grown as u64 + 4 * 8 + 1); // + the direct word
    assert_eq!(c7.host_syncs - c6.host_syncs, 0);
    step(&mut gp, &mut cpu, &mut rng);

    // Finish and re-admit: the slot reset is a few ranges, not an upload.
    let c8 = gp.flush_counters();
    gp.finish(4).unwrap();
    cpu.finish(4).unwrap();
    let c9 = gp.flush_counters();
    assert_eq!(
        c9.rows_filled + c9.rows_copied,
        c8.rows_filled + c8.rows_copied
    );
    assert!(c9.staged_bytes - c8.staged_bytes <= 1024);
    let total = c9.staged_bytes - c1.staged_bytes;
    assert!(
        total * 100 < arena_bytes,
        "{total} bytes staged after the admissions vs a {arena_bytes}-byte arena"
    );
    // The history lives once, in the pinned store, with the written-back rows.
    gp.device().gpu().synchronize().unwrap();
    for &s in &sessions[..3] {
        let n = cpu.committed_len(s).unwrap();
        for p in [0, n / 2, n - 1] {
            assert_eq!(
                gp.cpu().host().token(s, p).unwrap(),
                cpu.host().token(s, p).unwrap()
            );
        }
    }
}

/// Bug 1 (two fills into one page in one replay launch): in one `admit_batch`, A borrows every
/// free page (fills logged, not published); B's admission reclaims A's pages, `collect` frees
/// them at once (no reader) and B's fixed pages — its tail rows — are those pages. A's pending
/// fills into them must be dropped, so B's tail rows hold B's bytes, not A's history.
#[test]
fn admit_batch_reclaimed_page_holds_only_the_new_owners_fills() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let mut g = Geometry {
        row_bytes: 64,
        layers: 2,
        page_rows: 16,
        arena_pages: 0,
        hot_rows: 32,
        tail_rows: 16,
        scratch_rows: 0,
        layer_groups: Default::default(),
    };
    let f = g.fixed_pages();
    // A's fixed pages + every other page borrowed by A: B's fixed pages all come from A's loans.
    g.arena_pages = 2 * f + 2;
    let (mut cpu, mut gp) = four_session_pools(&gpu, g);
    let (a, b) = (21u64, 22u64);
    let ha = pattern_tokens(g.row_bytes, g.layers, a, 0, 32 * g.page_rows);
    let hb = pattern_tokens(g.row_bytes, g.layers, b, 0, 5 * g.page_rows - 3);
    let want = vec![cpu.admit(a, &ha), cpu.admit(b, &hb)];
    assert_eq!(
        want[0],
        Ok(kv_elastic::Admission::Admitted {
            borrowed_pages: f + 2
        })
    );
    let got = gp.admit_batch(&[(a, &ha[..]), (b, &hb[..])]).unwrap();
    assert_eq!(
        want.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        got
    );
    assert!(
        gp.cpu().counters().pages_reclaimed >= f as u64,
        "B reclaimed A's pages"
    );
    gpu.synchronize().unwrap();
    let tb = g.token_bytes();
    let rb = g.row_bytes as usize;
    let nb = (hb.len() / tb) as u32;
    for layer in 0..g.layers {
        let plane = gp.device().download_plane(layer).unwrap();
        let cplane = cpu.plane(layer).unwrap();
        for p in nb - g.tail_rows..nb {
            let row = gp.tail_row_of(b, p).unwrap() as usize;
            let at = p as usize * tb + layer as usize * rb;
            assert_eq!(
                plane[row * rb..(row + 1) * rb],
                hb[at..at + rb],
                "B's tail row {p}"
            );
            assert_eq!(
                plane[row * rb..(row + 1) * rb],
                cplane[row * rb..(row + 1) * rb]
            );
        }
    }
}

/// Resolves `positions` of one session on both pools and checks the GPU arena's bytes at every
/// returned row against the CPU reference's.
fn resolve_same(cpu: &mut ElasticPool, gp: &mut GpuElasticPool, s: u64, positions: &[i32]) {
    let seq = (cpu.committed_len(s).unwrap() + cpu.scratch_len(s).unwrap()) as i32;
    let input = ResolveInput {
        sessions: &[s],
        query_start_loc: &[0, 1],
        seq_lens: &[seq],
        topk: positions,
        k: positions.len(),
        layer: 0,
    };
    let (mut i1, mut v1) = (vec![0; positions.len()], vec![0; 1]);
    let (mut i2, mut v2) = (vec![0; positions.len()], vec![0; 1]);
    let mut o1 = ResolveOutput {
        indices: &mut i1,
        valid_count: &mut v1,
    };
    let mut o2 = ResolveOutput {
        indices: &mut i2,
        valid_count: &mut v2,
    };
    let (a, b) = (cpu.resolve(&input, &mut o1), gp.resolve(&input, &mut o2));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((i1.clone(), v1), (i2, v2));
    assert_eq!(a.stats, b.stats);
    let rb = cpu.geometry().row_bytes as usize;
    let plane = gp.device().download_plane(0).unwrap();
    let cplane = cpu.plane(0).unwrap();
    for &r in i1.iter().filter(|&&r| r >= 0) {
        let at = r as usize * rb;
        assert_eq!(plane[at..at + rb], cplane[at..at + rb], "row {r}");
    }
}

/// Bug 2 (host rewrites pinned draft bytes a queued step copy still reads): drafts, a partial
/// accept, then new drafts or an append at the rejected drafts' positions, with no host wait in
/// between; the scratch, tail and host store must hold what the CPU reference holds.
#[test]
fn drafts_after_partial_accept_keep_their_bytes() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let g = Geometry {
        row_bytes: 64,
        layers: 2,
        page_rows: 16,
        arena_pages: 64,
        hot_rows: 32,
        tail_rows: 16,
        scratch_rows: 8,
        layer_groups: Default::default(),
    };
    let (mut cpu, mut gp) = four_session_pools(&gpu, g);
    let s = 31u64;
    let h = pattern_tokens(g.row_bytes, g.layers, s, 0, 40);
    assert_eq!(cpu.admit(s, &h), gp.admit(s, &h));
    let mut seed = 100u32;
    for round in 0..24u64 {
        let c = cpu.committed_len(s).unwrap();
        let drafts = pattern_tokens(g.row_bytes, g.layers, s, seed, 6);
        seed += 6;
        assert_eq!(cpu.write_scratch(s, &drafts), gp.write_scratch(s, &drafts));
        assert_eq!(cpu.accept(s, 1), gp.accept(s, 1));
        if round % 2 == 0 {
            let more = pattern_tokens(g.row_bytes, g.layers, s, seed, 5);
            seed += 5;
            assert_eq!(cpu.write_scratch(s, &more), gp.write_scratch(s, &more));
        } else {
            let tok = pattern_tokens(g.row_bytes, g.layers, s, seed, 1);
            seed += 1;
            assert_eq!(cpu.append(s, &tok), gp.append(s, &tok));
        }
        let seq = cpu.committed_len(s).unwrap() + cpu.scratch_len(s).unwrap();
        let picks: Vec<i32> = (c as i32..seq as i32).collect();
        resolve_same(&mut cpu, &mut gp, s, &picks);
        gpu.synchronize().unwrap();
        for p in 0..cpu.committed_len(s).unwrap() {
            assert_eq!(
                cpu.host().token(s, p).unwrap(),
                gp.cpu().host().token(s, p).unwrap(),
                "committed token {p}"
            );
        }
    }
}

/// Bug 3 (a safe `&[u8]` over pinned bytes a queued write-back still writes): right after
/// `append_written` (no host wait), `cpu().host().token()` must return the rows the engine wrote.
#[test]
fn host_view_waits_for_queued_write_backs() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let g = small_geometry();
    let (_, mut gp) = four_session_pools(&gpu, g);
    let s = 41u64;
    let h = pattern_tokens(g.row_bytes, g.layers, s, 0, 40);
    gp.admit(s, &h).unwrap();
    let rb = g.row_bytes as usize;
    for round in 0..32u32 {
        let p = gp.cpu().committed_len(s).unwrap();
        let tok = pattern_tokens(g.row_bytes, g.layers, s + 1000, p, 1);
        let row = gp.tail_row_of(s, p).unwrap();
        for layer in 0..g.layers {
            let at = layer as usize * rb;
            gp.device_mut()
                .upload_rows(layer, row, &tok[at..at + rb])
                .unwrap();
        }
        assert_eq!(gp.append_written(s, 1).unwrap(), p + 1, "round {round}");
        assert_eq!(
            gp.cpu().host().token(s, p).unwrap(),
            &tok[..],
            "round {round}"
        );
    }
}

/// Bug 4 (a failed publish left the pool inconsistent): a publish failing after it took the
/// change log poisons the pool; that call returns the failure, every later call `Poisoned`.
#[test]
fn failed_publish_poisons_the_pool() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let g = small_geometry();
    let (_, mut gp) = four_session_pools(&gpu, g);
    let h = pattern_tokens(g.row_bytes, g.layers, 51, 0, 40);
    gp.admit(51, &h).unwrap();
    gp.inject_publish_failure();
    let tok = pattern_tokens(g.row_bytes, g.layers, 51, 40, 1);
    assert_eq!(
        gp.append(51, &tok),
        Err(KvError::Unsupported("injected publish failure"))
    );
    let poisoned =
        |r: Result<(), KvError>| assert!(matches!(r, Err(KvError::Poisoned(_))), "{r:?}");
    poisoned(gp.publish());
    poisoned(gp.append(51, &tok).map(drop));
    poisoned(gp.admit(52, &h).map(drop));
    poisoned(gp.admit_batch(&[(53, &h[..])]).map(drop));
    poisoned(gp.append_written(51, 1).map(drop));
    poisoned(gp.append_written_batch(&[(51, 1)]).map(drop));
    poisoned(gp.write_scratch(51, &tok));
    poisoned(gp.accept(51, 0).map(drop));
    poisoned(gp.reclaim(1).map(drop));
    poisoned(gp.between_steps(1).map(drop));
    poisoned(gp.slot_of(51).map(drop));
    poisoned(gp.tail_row_of(51, 0).map(drop));
    poisoned(gp.finish(51));
    let (mut idx, mut valid) = (vec![0; 1], vec![0; 1]);
    let r = gp.resolve(
        &ResolveInput {
            sessions: &[51],
            query_start_loc: &[0, 1],
            seq_lens: &[40],
            topk: &[0],
            k: 1,
            layer: 0,
        },
        &mut ResolveOutput {
            indices: &mut idx,
            valid_count: &mut valid,
        },
    );
    assert!(matches!(r, Err(KvError::Poisoned(_))));
    poisoned(gp.replay(&ResolvePlan::default(), 0));
    poisoned(gp.prefetch(51, &[0], 0).map(drop));
}

/// The 64-page, 2-layer geometry of the publish-window tests (4 draft rows per session).
fn small_geometry() -> Geometry {
    Geometry {
        row_bytes: 64,
        layers: 2,
        page_rows: 16,
        arena_pages: 64,
        hot_rows: 32,
        tail_rows: 16,
        scratch_rows: 4,
        layer_groups: Default::default(),
    }
}
