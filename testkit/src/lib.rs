//! # tierkit-testkit
//!
//! Dev-only helpers for tierkit's tests, benches and GPU timing binaries; no library crate depends
//! on it. GPU skip ([`gpu_or_skip`]), byte patterns, invariant checkers, hostile bytes for the
//! loaders' property tests ([`hostile_bytes`]), and the stand-in kernels (routers, sparse
//! attention, readers) that only tests and benches compile.

mod experts;
mod gpu;
mod hostile;
mod kv;
mod routers;
mod sglang;

pub use experts::{
    check_expert_pattern, pattern_store, verify_store, write_expert_pattern, ExpertReaders,
    EXPERT_READERS_MODULE,
};
pub use gpu::{gpu_or_skip, TIMING_EVENT};
pub use hostile::hostile_bytes;
pub use kv::{pattern_row, pattern_tokens, KvStandins, KV_STANDINS, STREAM_READ_BLOCKS};
pub use routers::{launch_count_ids_striped, launch_standin_router, router_standins};
pub use sglang::{
    sglang_smem_bytes, SglangHisparse, SglangShape, SGLANG_BLOCK, SGLANG_HISPARSE, SGLANG_TOP_K,
};
