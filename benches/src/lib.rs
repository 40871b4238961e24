//! # tierkit-benches
//!
//! Criterion benches for the tierkit crates live in `benches/benches/*.rs`; run them with
//! `cargo bench -p tierkit-benches`. Recorded figures, with the command that produced them, are
//! in `benches/README.md`. This library target is empty. The GPU timing binaries are in `src/bin/`
//! (`cuda` feature): `cargo run --release -p tierkit-benches --features cuda --bin gpu_bench_experts`.
