//! # kv-elastic
//!
//! The elastic sparse-attention KV pool (after HiSparse and its adaptive variant). Every session's
//! committed history lives in host memory; one device arena (a single array of token rows, as
//! FlashMLA indexes) holds per session a small hot cache, a tail of the newest positions and a
//! draft scratch, and lends the HBM nobody needs right now as borrowed history pages (revocable
//! `tier-core` loans, taken back oldest history first in proportion to holdings, behind reader
//! fences). A [`Resolver`] maps the indexer's top-k positions (`int32 [rows, k]`) to arena rows
//! plus valid counts, the shape FlashMLA and vLLM take, deduplicating and fetching misses. It is
//! exact: the bytes at the returned rows are those a fully resident cache would hold. The
//! resolve semantics are the *KV resolve kernel contract* of `cuda-kernels/DESIGN.md`; the design
//! (control plane vs data plane, loans and fences, the GPU back-end) is in `kv-elastic/DESIGN.md`.
//!
//! ```
//! use kv_elastic::{ElasticPool, Geometry, PoolConfig, PoolSizing, ResolveInput, ResolveOutput, Resolver};
//! let g = Geometry::for_hbm_budget(&PoolSizing {
//!     budget_bytes: 16 * 4 * 16, row_bytes: 16, layers: 1, page_rows: 4, // 16 pages of 4 rows
//!     hot_rows: 8, tail_rows: 4, scratch_rows: 0,
//! })?;
//! let mut pool = ElasticPool::new(g, PoolConfig { elastic: true })?;
//! let history: Vec<u8> = (0..20 * 16).map(|i| (i / 16) as u8).collect(); // token t: bytes t
//! pool.admit(7, &history)?; // 20 tokens of history
//! let topk = [0, 5, 19, -1];
//! let (mut indices, mut valid) = ([0i32; 4], [0i32; 1]);
//! let input = ResolveInput { sessions: &[7], query_start_loc: &[0, 1], seq_lens: &[20], topk: &topk, k: 4, layer: 0 };
//! let done = pool.resolve(&input, &mut ResolveOutput { indices: &mut indices, valid_count: &mut valid })?;
//! assert_eq!(valid, [3]);
//! assert_eq!(done.stats.misses, 0); // the whole history fits in borrowed pages: direct path
//! assert_eq!(pool.arena_row(0, indices[1]).as_deref().unwrap(), &[5u8; 16]);
//! done.ticket.complete(); // the indices' pages may be reused from now on
//! # Ok::<(), kv_elastic::KvError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod control;
mod data;
mod error;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod gpu;
mod groups;
mod layout;
#[cfg(feature = "nixl")]
#[cfg_attr(docsrs, doc(cfg(feature = "nixl")))]
pub mod nixl;
mod pool;
mod resolve;
mod ticket;

pub use control::{HotCache, PageCounts};
pub use data::{
    page_size, CpuBytes, CpuData, DataPlane, HostBytes, HostMemory, HostRegion, HostStore, MemKind,
    RegionBytes, RegionDesc, RegionHold, SessionId, StoreConfig, StoreLayout, TeardownHook,
    VecBytes, REGION_CHUNK,
};
pub use error::{KvError, Result};
pub use groups::LayerGroups;
pub use layout::{
    Geometry, PoolSizing, RowFormat, MAX_ARENA_BYTES, MAX_HISTORY, MAX_HOT_ROWS, MAX_LAYERS,
    MAX_TOKEN_BYTES,
};
pub use pool::{
    Admission, AdmitOptions, ElasticPool, ImportInfo, PoolConfig, PoolCounters, Reserve, RowSpan,
    SessionPlacement, StepMaintenance, StepOptions, TransferCounters, DEFAULT_IMPORT_TIMEOUT_STEPS,
};
pub use resolve::{
    OutputLayout, ResolveInput, ResolveOptions, ResolveOutput, ResolvePlan, ResolveStats, Resolved,
    Resolver, RowCopy, MAX_BLOCK_POSITIONS, MAX_CANDIDATES,
};
pub use ticket::ReadTicket;
