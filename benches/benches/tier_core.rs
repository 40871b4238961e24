//! Criterion benches for `tier-core`: page-map lookup, lend + reclaim of 100k
//! pages, reader-fence enter + leave, EMA fold.
//!
//! Run: `cargo bench -p tierkit-benches --bench tier_core -- --warm-up-time 1 --measurement-time 3`
//! Recorded figures: `benches/README.md`.
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tier_core::{BorrowerId, DecayingCounters, EpochFence, Lender, PageId, PageMap, Retired, Tier};

/// Lookups of random logical ids in maps of 1 Mi and 16 Mi entries (half
/// mapped): ns per lookup, independent of how many entries are mapped.
fn map_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("map_lookup");
    for len in [1u32 << 20, 1 << 24] {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut map = PageMap::new(len).unwrap();
        for i in (0..len).step_by(2) {
            map.set(i, PageId(i / 2)).unwrap();
        }
        let ids: Vec<u32> = (0..1 << 16).map(|_| rng.random_range(0..len)).collect();
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("random_get/{len}"), |b| {
            let mut k = 0usize;
            b.iter(|| {
                k = (k + 1) & (ids.len() - 1);
                black_box(map.get(black_box(ids[k])))
            })
        });
    }
    g.finish();
}

const PAGES: u32 = 100_000;
const BORROWERS: u64 = 8;

fn lend_all(l: &mut Lender) {
    let per = PAGES / BORROWERS as u32;
    let logical: Vec<u32> = (0..per).collect();
    for b in 0..BORROWERS {
        l.lend(BorrowerId(b), &logical).unwrap();
    }
}

/// 100k pages lent to 8 borrowers, all reclaimed (proportional,
/// oldest-first) and collected through the fence.
fn lend_reclaim(c: &mut Criterion) {
    let mut g = c.benchmark_group("lender_100k");
    g.sample_size(20);
    g.throughput(Throughput::Elements(u64::from(PAGES)));
    g.bench_function("lend", |b| {
        b.iter_batched_ref(
            || Lender::new(Tier::DeviceHbm, PAGES).unwrap(),
            lend_all,
            BatchSize::LargeInput,
        )
    });
    g.bench_function("reclaim+collect", |b| {
        b.iter_batched_ref(
            || {
                let mut l = Lender::new(Tier::DeviceHbm, PAGES).unwrap();
                lend_all(&mut l);
                l
            },
            |l| {
                let got = l.reclaim(PAGES).unwrap();
                assert_eq!(got.len(), PAGES as usize);
                assert_eq!(l.collect(), PAGES);
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("lend+reclaim+collect", |b| {
        let mut l = Lender::new(Tier::DeviceHbm, PAGES).unwrap();
        b.iter(|| {
            lend_all(&mut l);
            black_box(l.reclaim(PAGES).unwrap());
            l.collect()
        })
    });
    g.finish();
}

/// One CPU reader entering and leaving the fence (uncontended), with and
/// without another reader inside; and one retire + collect round.
fn fence(c: &mut Criterion) {
    let mut g = c.benchmark_group("fence");
    let f = EpochFence::new();
    g.bench_function("enter+leave", |b| b.iter(|| drop(black_box(f.enter()))));
    let other = f.enter();
    g.bench_function("enter+leave/1_other_inside", |b| {
        b.iter(|| drop(black_box(f.enter())))
    });
    drop(other);
    let mut r = Retired::new();
    g.bench_function("retire+collect/1_item", |b| {
        b.iter(|| {
            r.retire(&f, black_box(1u32));
            black_box(r.collect(&f))
        })
    });
    g.finish();
}

/// One EMA fold of 64 layers x 256 experts (16 Ki counters).
fn ema(c: &mut Criterion) {
    let mut g = c.benchmark_group("ema");
    let n = 64 * 256;
    let mut e = DecayingCounters::new(n, 32.0).unwrap();
    let deltas: Vec<u64> = (0..n as u64).map(|i| i % 17).collect();
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("fold/16384", |b| {
        b.iter(|| e.fold(black_box(&deltas), 4).unwrap())
    });
    g.finish();
}

criterion_group!(benches, map_lookup, lend_reclaim, fence, ema);
criterion_main!(benches);
