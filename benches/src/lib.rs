//! # tierkit-benches
//!
//! Criterion benches for the tierkit crates live in `benches/benches/*.rs`; run them with
//! `cargo bench -p tierkit-benches`. Recorded figures, with the command that produced them, are
//! in `benches/README.md`. This library target is empty.
