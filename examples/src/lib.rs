//! # tierkit-examples
//!
//! Reference integrations of the tierkit tiers live in `examples/examples/*.rs`; run one with
//! `cargo run --release -p tierkit-examples --example NAME`. This library target is empty.
