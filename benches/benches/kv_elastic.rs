//! Criterion benches for `kv-elastic`: the exact CPU resolver on 64 requests × 2048 picks (fixed
//! hot cache with misses, and the direct path of fully held histories), and reclaiming 10,000
//! borrowed pages. Figures: `benches/README.md`.
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kv_elastic::{ElasticPool, Geometry, PoolConfig, ResolveInput, ResolveOutput, Resolver};
use tierkit_sim::kv::selection::{SelectionGen, SelectionParams};

const REQS: usize = 64;
const K: usize = 2048;
const HISTORY: u32 = 16_384;
const STEPS: usize = 32;

/// A pool with `REQS` sessions of `HISTORY` tokens and `STEPS` precomputed steps of calibrated picks.
fn setup(elastic: bool) -> (ElasticPool, Vec<Vec<i32>>) {
    let fixed_rows = 2 * K as u32 + 64;
    let extra = if elastic {
        REQS as u32 * HISTORY / 64
    } else {
        0
    };
    let g = Geometry {
        row_bytes: 64,
        layers: 1,
        page_rows: 64,
        arena_pages: REQS as u32 * fixed_rows.div_ceil(64) + extra,
        hot_rows: 2 * K as u32,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    };
    let mut pool = ElasticPool::new(g, PoolConfig { elastic }).unwrap();
    let history = vec![7u8; HISTORY as usize * 64];
    for s in 0..REQS as u64 {
        pool.admit(s, &history).unwrap();
    }
    let mut gens: Vec<SelectionGen> = (0..REQS as u64)
        .map(|s| SelectionGen::new(SelectionParams::calibrated(K as u32), s, HISTORY).unwrap())
        .collect();
    let mut one = Vec::new();
    let steps = (0..STEPS)
        .map(|_| {
            let mut topk = Vec::with_capacity(REQS * K);
            for g in gens.iter_mut() {
                g.step(HISTORY, &mut one);
                topk.extend_from_slice(&one);
            }
            topk
        })
        .collect();
    (pool, steps)
}

fn resolve_bench(c: &mut Criterion) {
    let sessions: Vec<u64> = (0..REQS as u64).collect();
    let qsl: Vec<i32> = (0..=REQS as i32).collect();
    let seq_lens = vec![HISTORY as i32; REQS];
    let mut group = c.benchmark_group("kv_resolve_64x2048");
    for (name, elastic) in [("fixed_hot_cache", false), ("direct_all_resident", true)] {
        let (mut pool, steps) = setup(elastic);
        let (mut indices, mut valid) = (vec![0i32; REQS * K], vec![0i32; REQS]);
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                let input = ResolveInput {
                    sessions: &sessions,
                    query_start_loc: &qsl,
                    seq_lens: &seq_lens,
                    topk: &steps[i % STEPS],
                    k: K,
                    layer: 0,
                };
                i += 1;
                let done = pool
                    .resolve(
                        &input,
                        &mut ResolveOutput {
                            indices: &mut indices,
                            valid_count: &mut valid,
                        },
                    )
                    .unwrap();
                black_box(done.stats.misses)
            })
        });
    }
    group.finish();
}

fn reclaim_bench(c: &mut Criterion) {
    // 100 sessions each holding 100 borrowed pages (16-byte rows keep the copy-in setup cheap).
    let g = Geometry {
        row_bytes: 16,
        layers: 1,
        page_rows: 64,
        arena_pages: 100 * 2 + 10_000,
        hot_rows: 64,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    };
    let history = vec![1u8; (100 * 64 + 64) * 16];
    c.bench_function("kv_reclaim_10000_pages", |b| {
        b.iter_batched(
            || {
                let mut pool = ElasticPool::new(g, PoolConfig { elastic: true }).unwrap();
                for s in 0..100 {
                    pool.admit(s, &history).unwrap();
                }
                assert_eq!(pool.elastic_lent(), 10_000);
                pool
            },
            |mut pool| {
                let n = pool.reclaim(10_000).unwrap();
                assert_eq!(n, 10_000);
                pool
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = resolve_bench, reclaim_bench
}
criterion_main!(benches);
