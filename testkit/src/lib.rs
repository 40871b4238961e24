//! # tierkit-testkit
//!
//! Dev-only helpers for tierkit's tests, benches and GPU timing binaries; no library crate depends
//! on it. GPU skip ([`gpu_or_skip`]), allocation-failure runs under an address-space limit
//! ([`under_memory_limit`]), byte patterns, invariant checkers, hostile bytes for the loaders'
//! property tests ([`hostile_bytes`]), and the stand-in kernels (routers, sparse attention,
//! readers) that only tests and benches compile.

mod experts;
mod gpu;
mod hostile;
mod kv;
mod memlimit;
mod routers;
mod sglang;

pub use experts::{
    check_expert_pattern, pattern_table, write_expert_pattern, ExpertReaders, EXPERT_READERS_MODULE,
};
pub use gpu::{gpu_or_skip, TIMING_EVENT};
pub use hostile::hostile_bytes;
pub use kv::{
    expand_block_ids, pattern_row, pattern_tokens, KvLab, KvStandins, KV_LAB, KV_STANDINS,
    STREAM_READ_BLOCKS,
};
pub use memlimit::under_memory_limit;
pub use routers::{launch_count_ids_striped, launch_standin_router, router_standins};
pub use sglang::{
    assemble as assemble_sglang_peer, sha256_hex, SglangHisparse, SglangShape, SglangSource,
    SGLANG_BLOCK, SGLANG_SPARSE_BLOCK, SGLANG_TOP_K,
};
