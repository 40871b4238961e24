//! Layer groups: every layer group keeps its own hot cache, and a resolve or prefetch at any layer
//! of a group fills all the group's layers, so per-layer picks (DeepSeek-V3.2: every layer its own
//! indexer), shared picks and mixtures of both all read the bytes a fully resident cache holds.
//!
//! The engine loop at the end runs on the CPU pool here and on the GPU pool (feature `cuda`; it
//! prints `SKIP` without a device): continuous batching, two layer groups each with its own picks,
//! every picked row of every layer checked, `TIERKIT_GROUP_LOOP_STEPS` steps (default 10,000).

use kv_elastic::{
    ElasticPool, Geometry, KvError, LayerGroups, PoolConfig, ResolveInput, ResolveOutput,
    ResolvePlan, ResolveStats, Resolver,
};
use tierkit_testkit::{pattern_row, pattern_tokens};

/// The reproducer of the reliability issue: 16-byte rows, 2 layers, history bytes `t` at layer 0
/// and `100 + t` at layer 1 for token `t`.
fn reproducer_history() -> Vec<u8> {
    (0..40u8)
        .flat_map(|t| std::iter::repeat_n(t, 16).chain(std::iter::repeat_n(100 + t, 16)))
        .collect()
}

fn geometry(layers: u32, groups: LayerGroups) -> Geometry {
    Geometry {
        row_bytes: 16,
        layers,
        page_rows: 4,
        arena_pages: 16,
        hot_rows: 8,
        tail_rows: 4,
        scratch_rows: 0,
        layer_groups: groups,
        row_format: None,
    }
}

/// Resolves `picks` of session `s` (one row) at `layer`; the arena rows and the stats.
fn resolve_at(
    pool: &mut ElasticPool,
    s: u64,
    seq_len: i32,
    picks: &[i32],
    layer: u32,
) -> (Vec<i32>, ResolveStats, ResolvePlan) {
    let mut idx = vec![0; picks.len()];
    let mut valid = [0];
    let done = Resolver::resolve(
        pool,
        &ResolveInput {
            sessions: &[s],
            query_start_loc: &[0, 1],
            seq_lens: &[seq_len],
            topk: picks,
            k: picks.len(),
            layer,
        },
        &mut ResolveOutput {
            indices: &mut idx,
            valid_count: &mut valid,
        },
    )
    .unwrap();
    (idx, done.stats, done.plan)
}

#[test]
fn per_layer_picks_read_their_own_layer_on_the_default_geometry() {
    // The issue's reproducer: no layer groups declared; layer 1 used to read zeros.
    let g = geometry(2, LayerGroups::default());
    assert_eq!(g.layer_groups, LayerGroups::per_layer());
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &reproducer_history()).unwrap();
    for layer in 0..2 {
        let (idx, st, plan) = resolve_at(&mut pool, 1, 40, &[5], layer);
        let want = if layer == 0 { 5 } else { 105 };
        assert_eq!(
            pool.arena_row(layer, idx[0]).as_deref().unwrap(),
            &[want; 16],
            "layer {layer}"
        );
        // Each layer's own hot cache: position 5 misses in both.
        assert_eq!((st.misses, st.hot_hits), (1, 1), "layer {layer}");
        assert_eq!(plan.group, layer);
        pool.check_invariants().unwrap();
    }
    // Different picks per layer, then each layer again: hits in its own cache, right bytes.
    resolve_at(&mut pool, 1, 40, &[7, 9], 0);
    resolve_at(&mut pool, 1, 40, &[11, 13], 1);
    let (idx, st, _) = resolve_at(&mut pool, 1, 40, &[7, 9], 0);
    assert_eq!((st.misses, st.hot_hits), (0, 2));
    assert_eq!(pool.arena_row(0, idx[1]).as_deref().unwrap(), &[9; 16]);
    let (idx, st, _) = resolve_at(&mut pool, 1, 40, &[11, 13], 1);
    assert_eq!((st.misses, st.hot_hits), (0, 2));
    assert_eq!(pool.arena_row(1, idx[0]).as_deref().unwrap(), &[111; 16]);
    assert!(pool.hot_cache(1, 0).unwrap().lookup(11).is_none());
    assert!(pool.hot_cache(1, 1).unwrap().lookup(7).is_none());
    pool.check_invariants().unwrap();
}

#[test]
fn a_shared_group_is_filled_by_one_resolve_at_any_of_its_layers() {
    let g = geometry(2, LayerGroups::one());
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &reproducer_history()).unwrap();
    // Resolved at the group's second layer: both planes hold position 5.
    let (idx, st, plan) = resolve_at(&mut pool, 1, 40, &[5], 1);
    assert_eq!((st.misses, plan.group), (1, 0));
    assert_eq!(pool.arena_row(0, idx[0]).as_deref().unwrap(), &[5; 16]);
    assert_eq!(pool.arena_row(1, idx[0]).as_deref().unwrap(), &[105; 16]);
    // The other layer of the group hits, with its own bytes already there (no replay).
    let (idx2, st, _) = resolve_at(&mut pool, 1, 40, &[5], 0);
    assert_eq!((st.misses, st.hot_hits, idx2[0]), (0, 1, idx[0]));
    // A replay inside the group re-copies the same bytes.
    pool.replay(&plan, 0).unwrap();
    assert_eq!(pool.arena_row(0, idx[0]).as_deref().unwrap(), &[5; 16]);
    pool.check_invariants().unwrap();
}

#[test]
fn mixed_groups_keep_their_own_hot_caches_and_planes() {
    // Layer 0 alone, layers 1..3 share picks.
    let g = geometry(3, LayerGroups::from_sizes(&[1, 2]).unwrap());
    assert_eq!((g.groups(), g.group_of(2), g.group_layers(2)), (2, 1, 1..3));
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &pattern_tokens(16, 3, 1, 0, 40)).unwrap();
    let row = |l: u32, p: u32| {
        let mut b = vec![0u8; 16];
        pattern_row(1, p, l, &mut b);
        b
    };
    let (a, _, _) = resolve_at(&mut pool, 1, 40, &[3, 4], 0);
    let (b, _, plan) = resolve_at(&mut pool, 1, 40, &[20, 3], 2);
    assert_eq!(plan.group, 1);
    // The two groups chose the same hot rows for different positions, each in its own planes.
    assert_eq!(pool.arena_row(0, a[0]).as_deref().unwrap(), &row(0, 3)[..]);
    for l in 1..3 {
        assert_eq!(pool.arena_row(l, b[0]).as_deref().unwrap(), &row(l, 20)[..]);
        assert_eq!(pool.arena_row(l, b[1]).as_deref().unwrap(), &row(l, 3)[..]);
    }
    pool.check_invariants().unwrap();
}

#[test]
fn a_replay_outside_its_group_is_refused_and_changes_nothing() {
    let g = geometry(2, LayerGroups::per_layer());
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &reproducer_history()).unwrap();
    let (_, _, plan) = resolve_at(&mut pool, 1, 40, &[5, 6], 0);
    let before = pool.plane(1).unwrap().to_vec();
    assert_eq!(
        pool.replay(&plan, 1),
        Err(KvError::LayerOutsideGroup {
            layer: 1,
            group: 0,
            first: 0,
            end: 1
        })
    );
    assert_eq!(pool.plane(1).unwrap(), &before[..]);
    // A prefetch fills only its group too.
    let plan = pool.prefetch(1, &[21, 22], 1).unwrap();
    assert_eq!((plan.group, plan.copies.len()), (1, 2));
    assert!(matches!(
        pool.replay(&plan, 0),
        Err(KvError::LayerOutsideGroup { group: 1, .. })
    ));
    assert!(pool.hot_cache(1, 0).unwrap().lookup(21).is_none());
    pool.check_invariants().unwrap();
}

#[test]
fn layer_groups_that_do_not_partition_the_layers_are_refused() {
    let g = geometry(3, LayerGroups::from_sizes(&[1, 1]).unwrap());
    assert!(matches!(g.validate(), Err(KvError::InvalidGeometry(_))));
    assert!(matches!(
        ElasticPool::new(g, PoolConfig::default()),
        Err(KvError::InvalidGeometry(_))
    ));
    // Serialized geometries without the field read as per layer (the default).
    let json = r#"{"row_bytes":16,"layers":2,"page_rows":4,"arena_pages":16,"hot_rows":8,"tail_rows":4,"scratch_rows":0}"#;
    let g: Geometry = serde_json::from_str(json).unwrap();
    assert_eq!(g.layer_groups, LayerGroups::per_layer());
}

/// What the engine loop drives: the CPU pool here, the GPU pool under `cuda`.
trait LoopPool {
    fn geometry(&self) -> Geometry;
    fn admit(&mut self, s: u64, history: &[u8]) -> bool;
    fn append(&mut self, s: u64, token: &[u8]);
    fn finish(&mut self, s: u64);
    /// Maintenance between steps; `check`: also the pool's invariant checks.
    fn between_steps(&mut self, check: bool);
    /// Resolves at `layer`; returns the indices and keeps the reader alive until `check`.
    fn resolve(&mut self, input: &ResolveInput<'_>) -> Vec<i32>;
    /// Plane `layer` as the arena holds it now.
    fn plane(&self, layer: u32) -> Vec<u8>;
    /// Ends the readers of the last resolves.
    fn end_step(&mut self);
}

impl LoopPool for ElasticPool {
    fn geometry(&self) -> Geometry {
        *ElasticPool::geometry(self)
    }
    fn admit(&mut self, s: u64, history: &[u8]) -> bool {
        matches!(
            ElasticPool::admit(self, s, history),
            Ok(kv_elastic::Admission::Admitted { .. })
        )
    }
    fn append(&mut self, s: u64, token: &[u8]) {
        ElasticPool::append(self, s, token).unwrap();
    }
    fn finish(&mut self, s: u64) {
        ElasticPool::finish(self, s).unwrap();
    }
    fn between_steps(&mut self, check: bool) {
        ElasticPool::between_steps(self, 4).unwrap();
        if check {
            self.check_invariants().unwrap();
        }
    }
    fn resolve(&mut self, input: &ResolveInput<'_>) -> Vec<i32> {
        let mut idx = vec![0; input.topk.len()];
        let mut valid = vec![0; input.sessions.len()];
        let done = Resolver::resolve(
            self,
            input,
            &mut ResolveOutput {
                indices: &mut idx,
                valid_count: &mut valid,
            },
        )
        .unwrap();
        done.ticket.complete(); // the CPU arena is read below, before any other call
        idx
    }
    fn plane(&self, layer: u32) -> Vec<u8> {
        ElasticPool::plane(self, layer).unwrap().to_vec()
    }
    fn end_step(&mut self) {}
}

/// A tiny deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A continuous-batching decode loop: sessions arrive and finish, each step appends one token per
/// session, and each layer group resolves its own picks (the indexer of the group, run at a random
/// layer of it, with temporal locality) for the whole batch; every returned row of every layer of
/// the group is checked against the pattern bytes. Returns (rows checked, valid picks).
fn engine_loop(pool: &mut dyn LoopPool, steps: u32, seed: u64) -> (u64, u64) {
    let g = pool.geometry();
    let rb = g.row_bytes as usize;
    let mut rng = Rng(seed);
    let mut live: Vec<(u64, u32)> = Vec::new(); // (session, committed)
                                                // Per session and group: the picks of the last step (reused in part: temporal locality).
    let mut last: std::collections::HashMap<(u64, u32), Vec<i32>> = Default::default();
    let mut next_id = 1u64;
    let (mut checked, mut picks) = (0u64, 0u64);
    let k = 6usize;
    for step in 0..steps {
        // Arrivals and finishes.
        if live.len() < 6 && rng.below(3) == 0 {
            let len = 4 + rng.below(90) as u32;
            let s = next_id;
            next_id += 1;
            if pool.admit(s, &pattern_tokens(g.row_bytes, g.layers, s, 0, len)) {
                live.push((s, len));
            }
        }
        // Random finishes, and sessions at the longest history the loop allows.
        if let Some(i) = live.iter().position(|&(_, c)| c >= MAX_LEN) {
            let (s, _) = live.swap_remove(i);
            pool.finish(s);
            last.retain(|&(x, _), _| x != s);
        }
        if !live.is_empty() && rng.below(25) == 0 {
            let i = rng.below(live.len() as u64) as usize;
            let (s, _) = live.swap_remove(i);
            pool.finish(s);
            last.retain(|&(x, _), _| x != s);
        }
        if live.is_empty() {
            pool.between_steps(step % 64 == 0);
            continue;
        }
        // Each group's indexer picks its own positions for every session in the batch.
        let sessions: Vec<u64> = live.iter().map(|&(s, _)| s).collect();
        let seq_lens: Vec<i32> = live.iter().map(|&(_, c)| c as i32).collect();
        let qsl: Vec<i32> = (0..=live.len() as i32).collect();
        for group in 0..g.groups() {
            let mut topk = Vec::with_capacity(live.len() * k);
            for &(s, c) in &live {
                let prev = last.entry((s, group)).or_default();
                let mut row = Vec::with_capacity(k);
                for j in 0..k {
                    let keep = j < prev.len() && rng.below(3) != 0;
                    let p = if keep && (prev[j] as u32) < c {
                        prev[j]
                    } else if rng.below(8) == 0 {
                        -1
                    } else {
                        rng.below(c as u64) as i32
                    };
                    row.push(p);
                }
                *prev = row.clone();
                topk.extend(row);
            }
            let layers = g.layer_groups.layers(group, g.layers);
            let layer = layers.start + rng.below(layers.len() as u64) as u32;
            let input = ResolveInput {
                sessions: &sessions,
                query_start_loc: &qsl,
                seq_lens: &seq_lens,
                topk: &topk,
                k,
                layer,
            };
            let idx = pool.resolve(&input);
            for l in layers {
                let plane = pool.plane(l);
                let mut want = vec![0u8; rb];
                for (j, (&p, &at)) in topk.iter().zip(&idx).enumerate() {
                    if p < 0 {
                        assert_eq!(at, -1, "step {step}: padding");
                        continue;
                    }
                    assert!(at >= 0, "step {step}: pick {j} unserved ({k} picks fit)");
                    let s = sessions[j / k];
                    pattern_row(s, p as u32, l, &mut want);
                    let got = &plane[at as usize * rb..(at as usize + 1) * rb];
                    assert_eq!(
                        got,
                        &want[..],
                        "step {step}, group {group} at layer {layer}: session {s} position {p} layer {l}"
                    );
                    checked += 1;
                }
            }
            picks += topk.iter().filter(|&&p| p >= 0).count() as u64;
        }
        pool.end_step();
        // Decode: one new token per session.
        for (s, c) in live.iter_mut() {
            pool.append(*s, &pattern_tokens(g.row_bytes, g.layers, *s, *c, 1));
            *c += 1;
        }
        // The invariants (every mapped row's bytes, on the CPU) every 64 steps: the rows a step
        // reads are checked every step above.
        pool.between_steps(step % 64 == 0);
    }
    (checked, picks)
}

/// Longest history a session of the loop reaches (it finishes there).
const MAX_LEN: u32 = 400;

/// The loop's geometry: 4 layers in two groups of two, an arena too small for every history
/// (elastic pages reclaimed under pressure), hot caches of 16 rows.
fn loop_geometry() -> Geometry {
    Geometry {
        row_bytes: 32,
        layers: 4,
        page_rows: 4,
        arena_pages: 80,
        hot_rows: 16,
        tail_rows: 4,
        scratch_rows: 0,
        layer_groups: LayerGroups::every(2).unwrap(),
        row_format: None,
    }
}

fn loop_steps() -> u32 {
    std::env::var("TIERKIT_GROUP_LOOP_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

#[test]
fn engine_loop_with_two_layer_groups_reads_exact_bytes_on_the_cpu() {
    let mut pool = ElasticPool::new(loop_geometry(), PoolConfig { elastic: true }).unwrap();
    let (checked, picks) = engine_loop(&mut pool, loop_steps(), 7);
    eprintln!("checked {checked} picked rows over {} steps", loop_steps());
    assert!(
        checked > picks,
        "every pick checked in every layer of its group"
    );
    assert!(pool.counters().miss_tokens > 0 && pool.counters().pages_reclaimed > 0);
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use kv_elastic::gpu::{GpuElasticPool, GpuPoolConfig};
    use kv_elastic::ReadTicket;

    struct Gpu {
        pool: GpuElasticPool,
        tickets: Vec<ReadTicket>,
    }

    impl LoopPool for Gpu {
        fn geometry(&self) -> Geometry {
            *self.pool.cpu().geometry()
        }
        fn admit(&mut self, s: u64, history: &[u8]) -> bool {
            matches!(
                self.pool.admit(s, history),
                Ok(kv_elastic::Admission::Admitted { .. })
            )
        }
        fn append(&mut self, s: u64, token: &[u8]) {
            self.pool.append(s, token).unwrap();
        }
        fn finish(&mut self, s: u64) {
            self.pool.finish(s).unwrap();
        }
        fn between_steps(&mut self, check: bool) {
            self.pool.between_steps(4).unwrap();
            if check {
                self.pool.cpu().check_invariants().unwrap();
            }
        }
        fn resolve(&mut self, input: &ResolveInput<'_>) -> Vec<i32> {
            let mut idx = vec![0; input.topk.len()];
            let mut valid = vec![0; input.sessions.len()];
            let done = Resolver::resolve(
                &mut self.pool,
                input,
                &mut ResolveOutput {
                    indices: &mut idx,
                    valid_count: &mut valid,
                },
            )
            .unwrap();
            self.tickets.push(done.ticket);
            idx
        }
        fn plane(&self, layer: u32) -> Vec<u8> {
            self.pool.device().download_plane(layer).unwrap()
        }
        fn end_step(&mut self) {
            for t in self.tickets.drain(..) {
                t.complete();
            }
        }
    }

    /// The HBM the per-group hot-cache tables take, measured (free device memory before and after
    /// building an arena) for 61 per-layer groups against one group, beside
    /// `GpuArena::hot_table_bytes`.
    #[test]
    fn per_group_hot_tables_cost_what_hot_table_bytes_says() {
        use cuda_kernels::KvDims;
        use kv_elastic::gpu::GpuArena;
        let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
            return;
        };
        // DeepSeek-V3.2's 61 layers and 2 × top-k hot rows; small rows and slots keep the pinned
        // store (4 × 16,384 × 61 × 16 B) small.
        let dims = KvDims {
            row_bytes: 16,
            layers: 61,
            page_rows: 64,
            hot_rows: 4096,
            tail_rows: 64,
            scratch_rows: 0,
            fixed_pages: 65,
            max_slots: 4,
            max_history: 16384,
            max_pages: 256,
            arena_rows: 64 * 512,
            ..KvDims::default()
        }
        .contiguous();
        let used = |groups: LayerGroups| {
            gpu.synchronize().unwrap();
            let (free0, _) = gpu.ctx().mem_get_info().unwrap();
            let arena = GpuArena::new(&gpu, dims, groups).unwrap();
            gpu.synchronize().unwrap();
            let (free1, _) = gpu.ctx().mem_get_info().unwrap();
            (free0 as i64 - free1 as i64, arena.hot_table_bytes() as i64)
        };
        let (one, one_tables) = used(LayerGroups::one());
        let (per, per_tables) = used(LayerGroups::per_layer());
        let (measured, counted) = (per - one, per_tables - one_tables);
        println!(
            "HBM of the hot-cache tables, 4 slots x 16,384 positions x 4,096 hot rows: one group \
             {one_tables} B, 61 groups {per_tables} B (counted); 61 groups take {measured} B more \
             device memory than one (measured), {counted} B counted"
        );
        assert_eq!(
            per_tables,
            61 * 4 * (4 * 16384 + 20 * 4096 + 12),
            "the documented formula"
        );
        // Allocation granularity (2 MiB pages) per table: within 16 MiB.
        assert!(
            (measured - counted).abs() <= 16 << 20,
            "{measured} vs {counted}"
        );
    }

    #[test]
    fn engine_loop_with_two_layer_groups_reads_exact_bytes_on_the_gpu() {
        let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
            return;
        };
        let pool = GpuElasticPool::new(
            &gpu,
            loop_geometry(),
            PoolConfig { elastic: true },
            GpuPoolConfig {
                max_sessions: 8,
                max_history: MAX_LEN + 1,
                backend: cuda_kernels::CopyBackend::Gather,
            },
        )
        .unwrap();
        let mut p = Gpu {
            pool,
            tickets: Vec::new(),
        };
        let (checked, picks) = engine_loop(&mut p, loop_steps(), 7);
        eprintln!(
            "GPU: checked {checked} picked rows over {} steps",
            loop_steps()
        );
        assert!(checked > picks);
        assert!(p.pool.device().errors().unwrap().is_clean());
    }
}
