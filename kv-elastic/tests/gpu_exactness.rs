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
    ResolveInput, ResolveOptions, ResolveOutput, ResolvePlan, Resolver, RowFormat, StepOptions,
};
use tierkit_testkit::pattern_tokens;

#[path = "gpu_exactness/control.rs"]
mod control;
#[path = "gpu_exactness/shapes.rs"]
mod shapes;

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
                            let row = self.g.plane_row(&plane, i as u32).unwrap();
                            let p = picks
                                .by_ref()
                                .find(|&p| self.token(s, p, layer) == &row[..])
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
        // The planes of the same size (the same segment rule on both sides; padding is not compared:
        // no path writes it, and a device allocation is not zeroed) ...
        assert_eq!(plane.len(), cpu_plane.len());
        for &(i, s, p) in served {
            // ... and each served row as the token's `value ‖ scale`.
            let row = self.g.plane_row(&plane, i as u32).unwrap();
            assert_eq!(
                row,
                self.g.plane_row(cpu_plane, i as u32).unwrap(),
                "GPU vs CPU arena: session {s} position {p} layer {layer} row {i}"
            );
            assert_eq!(
                &row[..],
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
                        for c in &plan.copies {
                            assert_eq!(
                                g.plane_row(&pc, c.dst_row),
                                g.plane_row(&pg, c.dst_row),
                                "replayed row"
                            );
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
    let mut paged_split = 0u64;
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
            row_format: None,
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
        // Every other run of 2 × ALL.len() cases (each engine with each back-end) in DeepSeek-V4's
        // paged split row format, scaled down: an 8-byte scale after a `row_bytes - 8`-byte
        // value (24 + 8 B for 32-byte rows), the page padded to a multiple of the value size.
        if (case / (2 * ResolveEngine::ALL.len() as u64)) % 2 == 1 {
            let value = g.row_bytes - 8;
            g.row_format = Some(RowFormat::PagedSplit {
                value,
                scale: 8,
                page_rows: g.page_rows,
                page_bytes: (g.page_rows * g.row_bytes).div_ceil(value) * value
                    + below(&mut rng, 2) as u32 * value,
            });
            paged_split += 1;
        }
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
         {blocks} of block ids; {paged_split} cases in the paged split row format"
    );
    assert!(resolves > cases * 5, "too few resolves exercised");
    assert!(misses > 0, "no miss path exercised");
    assert!(unserved > 0, "no overflowing step exercised");
    assert!(
        packed > 0 && bounded > 0 && blocks > 0,
        "new modes not exercised"
    );
    assert!(written_back > 0, "no device write-back exercised");
    if cases >= 4 * ResolveEngine::ALL.len() as u64 {
        assert!(
            paged_split >= 2 * ResolveEngine::ALL.len() as u64,
            "every engine and back-end on paged split rows"
        );
    }
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
