//! Criterion benches for `expert-residency` (placeholder: the real benches land with the crate).
use criterion::{criterion_group, criterion_main, Criterion};

fn noop(c: &mut Criterion) {
    c.bench_function("expert_residency_noop", |b| b.iter(|| 1 + 1));
}

criterion_group!(benches, noop);
criterion_main!(benches);
