//! # kv-elastic
//!
//! The elastic sparse-attention KV pool (after HiSparse, and its adaptive variant): every session's
//! committed history lives in host memory; the device arena (one contiguous array of token rows, as
//! FlashMLA needs) holds a small fixed hot cache, a tail of the newest positions and a speculative
//! scratch per request; HBM nobody needs right now is lent to requests as borrowed history pages
//! (`tier-core` loans) and taken back, oldest history first and in proportion to holdings, when a
//! new request needs room. The [`Resolver`] maps the indexer's top-k positions (`int32 [rows, k]`)
//! to physical arena rows: tail → scratch → borrowed page → hot cache → miss (deduplicated per
//! request, copied from host into victim hot rows). It is a placement change, never an
//! approximation: the bytes at the resolved rows equal a fully resident cache's bytes.
//! [`sim`] compares fully resident, fixed hot cache and elastic serving on an arrival trace.
//!
//! ```
//! use kv_elastic::{pattern_tokens, ElasticPool, Geometry, PoolConfig, ResolveInput, ResolveOutput, Resolver};
//! let g = Geometry { row_bytes: 16, layers: 1, page_rows: 4, arena_pages: 16, hot_rows: 8, tail_rows: 4, scratch_rows: 0 };
//! let mut pool = ElasticPool::new(g, PoolConfig { elastic: true })?;
//! pool.admit(7, &pattern_tokens(&g, 7, 0, 20))?; // 20 tokens of history
//! let topk = [0, 5, 19, -1];
//! let (mut indices, mut valid) = ([0i32; 4], [0i32; 1]);
//! let input = ResolveInput { sessions: &[7], query_start_loc: &[0, 1], seq_lens: &[20], topk: &topk, k: 4, layer: 0 };
//! let done = pool.resolve(&input, &mut ResolveOutput { indices: &mut indices, valid_count: &mut valid })?;
//! assert_eq!(valid, [3]);
//! assert_eq!(done.stats.misses, 0); // the whole history fits in borrowed pages: direct path
//! let mut want = [0u8; 16];
//! kv_elastic::pattern_row(7, 5, 0, &mut want);
//! assert_eq!(pool.arena_row(0, indices[1]).unwrap(), &want);
//! # Ok::<(), kv_elastic::KvError>(())
//! ```

mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
mod host;
mod hot;
mod layout;
mod pool;
mod resolve;

pub use error::{KvError, Result};
pub use host::{HostStore, SessionId};
pub use hot::HotCache;
pub use layout::{
    pattern_row, pattern_tokens, Geometry, MAX_ARENA_BYTES, MAX_HOT_ROWS, MAX_LAYERS,
    MAX_TOKEN_BYTES,
};
pub use pool::{
    Admission, ElasticPool, ElasticReclaim, PoolConfig, PoolCounters, SessionPlacement,
    StepMaintenance, FIXED_TAG,
};
pub use resolve::{
    ReadTicket, ResolveInput, ResolveOutput, ResolvePlan, ResolveStats, Resolved, Resolver,
    RowCopy, MAX_CANDIDATES,
};
