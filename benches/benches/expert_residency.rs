//! Criterion benches for `expert-residency`: drain + decide at a large geometry (40 layers × 384
//! experts, 96 hot per layer; goal ≤ 100 µs) with the default cost-aware policy and with the
//! published ratio recipe (`_ratio`), and one counted pick, uncontended (goal ≤ 5 ns).
//!
//! `drain_decide_40x384_cpu` is the default's drain + decide timed in the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) instead of wall time: on a machine shared with other jobs it leaves
//! out the time the bench thread waits for a core (cache pollution by the other jobs stays in),
//! so it reads close to the quiet figure at a load where the wall-time one is inflated.
//!
//! `cargo bench -p tierkit-benches --bench expert_residency`; figures in
//! `benches/README.md`.
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use expert_residency::{Controller, ControllerConfig, Geometry, PickCounters, ResidencyMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` cumulative counter snapshots: each adds a drain's worth (64 steps × 64 tokens × top-8
/// picks per layer, divided by `thin`) of Zipf-like traffic whose ranking rotates slowly, so the
/// policy keeps finding swaps to plan. The cost-aware policy ranks by touched steps, and
/// `drain_now` folds a drain as one step: its bench thins the traffic (`thin` 256, ~1 pick per
/// expert per drain in the tail) so that experts differ in touched steps, not only in picks.
fn snapshots(g: &Geometry, n: usize, thin: f64) -> Vec<Vec<u32>> {
    let e = g.experts_per_layer as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut cur = vec![0u32; g.cells()];
    (0..n)
        .map(|k| {
            for l in 0..g.layers as usize {
                for x in 0..e {
                    let rank = (x + k * 3 + l) % e;
                    let mean = 32_768.0 / thin / (rank + 1) as f64;
                    let d = (mean * rng.random_range(0.8..1.2)) as u32;
                    cur[l * e + x] = cur[l * e + x].wrapping_add(d);
                }
            }
            cur.clone()
        })
        .collect()
}

fn drain_decide(c: &mut Criterion) {
    // The default (cost-aware) policy, then the published ratio recipe.
    drain_decide_with(c, "", ControllerConfig::default(), 256.0);
    drain_decide_with(c, "_ratio", ControllerConfig::published_recipe(), 1.0);
}

fn drain_decide_with(c: &mut Criterion, suffix: &str, cfg: ControllerConfig, thin: f64) {
    let g = Geometry::new(40, 384, 96, 1 << 20).unwrap();
    let snaps = snapshots(&g, 64, thin);
    let mut ctl = Controller::new(ResidencyMap::first_k("bench", g).unwrap(), cfg).unwrap();
    // Warm the EMA over one cycle of snapshots and check that drains do plan swaps.
    let mut planned = 0u64;
    for s in &snaps {
        planned += ctl.drain_now(s).unwrap().planned as u64;
        ctl.cancel_queued();
    }
    eprintln!(
        "drain_decide_40x384{suffix}: {:.1} swaps planned per drain (of at most 80)",
        planned as f64 / snaps.len() as f64
    );
    assert!(planned > 0, "the bench must exercise planning");
    let mut i = 0;
    c.bench_function(&format!("drain_decide_40x384{suffix}"), |b| {
        b.iter(|| {
            i = (i + 1) % snaps.len();
            let t = ctl.drain_now(black_box(&snaps[i])).unwrap();
            // Drop the plan so every drain plans in every layer again (worst case).
            ctl.cancel_queued();
            black_box(t.cold_share)
        })
    });
    if suffix.is_empty() {
        c.bench_function("drain_decide_40x384_cpu", |b| {
            b.iter_custom(|iters| {
                let t0 = thread_cpu_ns();
                for _ in 0..iters {
                    i = (i + 1) % snaps.len();
                    let t = ctl.drain_now(black_box(&snaps[i])).unwrap();
                    ctl.cancel_queued();
                    black_box(t.cold_share);
                }
                Duration::from_nanos(thread_cpu_ns().saturating_sub(t0))
            })
        });
    }
    // The same drain with planning off (frozen): the split between counting work and policy.
    ctl.freeze();
    c.bench_function(&format!("drain_only_frozen_40x384{suffix}"), |b| {
        b.iter(|| {
            i = (i + 1) % snaps.len();
            black_box(ctl.drain_now(black_box(&snaps[i])).unwrap().cold_share)
        })
    });
}

/// The calling thread's CPU time, ns (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; the clock id is a
    // constant Linux defines for every thread.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pick(c: &mut Criterion) {
    let g = Geometry::new(40, 384, 96, 1 << 20).unwrap();
    let counters = PickCounters::new(&g).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let picks: Vec<(u32, u32)> = (0..4096)
        .map(|_| (rng.random_range(0..40), rng.random_range(0..384)))
        .collect();
    let mut i = 0;
    c.bench_function("pick_record_1", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            let (l, e) = picks[i];
            counters.record(black_box(l), black_box(e)).unwrap();
        })
    });
    // Baseline: a bare relaxed fetch_add on the same cells, no checks (the floor `record` pays).
    let cells = counters.cells();
    let mut j = 0;
    c.bench_function("atomic_fetch_add_baseline", |b| {
        b.iter(|| {
            j = (j + 1) & 4095;
            let (l, e) = picks[j];
            cells[black_box(l) as usize * 384 + black_box(e) as usize]
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })
    });
    let mut group = c.benchmark_group("pick_record_batch");
    group.throughput(Throughput::Elements(picks.len() as u64));
    group.bench_function("4096_picks", |b| {
        b.iter(|| {
            for &(l, e) in &picks {
                counters.record(black_box(l), black_box(e)).unwrap();
            }
        })
    });
    group.finish();
}

criterion_group!(benches, drain_decide, pick);
criterion_main!(benches);
