//! # tierkit-testkit
//!
//! Dev-only helpers for tierkit's tests, benches and GPU timing binaries; no library crate depends
//! on it. GPU skip ([`gpu_or_skip`]), byte patterns, invariant checkers, and the stand-in kernels
//! (routers, sparse attention, readers) that only tests and benches compile.

mod gpu;
mod kv;

pub use gpu::gpu_or_skip;
pub use kv::{pattern_row, pattern_tokens, KvStandins, KV_STANDINS};
