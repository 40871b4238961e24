//! The resolver interface: top-k positions in, physical arena rows out, plus the plan of host →
//! arena copies that other layers of the group replay.

use crate::data::SessionId;
use crate::error::Result;
use crate::ticket::ReadTicket;

/// Most prefetch candidates one session may announce at a group's first layer.
pub const MAX_CANDIDATES: usize = 16_384;

/// One step's selections, in the shapes FlashMLA sparse decode and vLLM's sparse-MLA path use.
#[derive(Clone, Copy, Debug)]
pub struct ResolveInput<'a> {
    /// Session of each session in the batch, `[reqs]` (each at most once).
    pub sessions: &'a [SessionId],
    /// Query rows of each session, `int32 [reqs + 1]`: batch entry `r` owns rows
    /// `query_start_loc[r]..query_start_loc[r + 1]` (several under speculative decoding).
    pub query_start_loc: &'a [i32],
    /// Positions visible to each session this step, `int32 [reqs]`: committed history plus the
    /// draft tokens in scratch it may attend to (`1..=committed + scratch`).
    pub seq_lens: &'a [i32],
    /// The indexer's top-k positions, `int32 [rows, k]` row-major; `-1` = padding.
    pub topk: &'a [i32],
    /// Picks per row (top-k); any `k >= 1` (nothing is compiled for a fixed k).
    pub k: usize,
    /// The layer whose arena plane the misses are copied into now; other layers of the group
    /// replay the returned plan.
    pub layer: u32,
}

/// Where the resolver writes; every element is written on every call (also on error, when the
/// lengths are right: `-1` and `0`), so no stale index survives.
#[derive(Debug)]
pub struct ResolveOutput<'a> {
    /// Physical row indices into the device arena, `int32 [rows, k]`, same order as the input;
    /// `-1` for padding.
    pub indices: &'a mut [i32],
    /// Valid (non `-1`) entries per row, `int32 [rows]` (FlashMLA's `topk_length`).
    pub valid_count: &'a mut [i32],
}

/// One host → arena row copy of a plan (Pod: a GPU back-end takes the list as-is).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    bytemuck::Pod,
    bytemuck::Zeroable,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct RowCopy {
    /// Source session in the host store.
    pub session: SessionId,
    /// Source position in that session's history.
    pub position: u32,
    /// Destination row in the device arena (a hot-cache row).
    pub dst_row: u32,
}

/// The copies one resolve or prefetch made (the deduplicated miss list), to replay for the other
/// layers of a layer group that shares indices.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvePlan {
    /// Copies, deduplicated per session.
    pub copies: Vec<RowCopy>,
}

/// What one resolve found, counted per pick unless said otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolveStats {
    /// Valid (non `-1`) picks.
    pub picks: u64,
    /// Picks served by the tail (newest committed positions).
    pub tail_hits: u64,
    /// Picks served by the session's scratch (draft tokens).
    pub scratch_hits: u64,
    /// Picks served by borrowed elastic pages.
    pub page_hits: u64,
    /// Picks served by the hot cache (including picks of positions fetched this call).
    pub hot_hits: u64,
    /// Distinct positions fetched from host (demand misses, deduplicated per session).
    pub misses: u64,
    /// Sessions that took the direct path (whole history resident: no hot-cache bookkeeping).
    pub direct_sessions: u64,
}

/// One resolve's result besides the outputs.
#[derive(Debug)]
pub struct Resolved {
    /// Copies made into `input.layer`; replay them for the group's other layers.
    pub plan: ResolvePlan,
    /// Counts.
    pub stats: ResolveStats,
    /// The reader registration for the returned indices.
    pub ticket: ReadTicket,
}

/// Resolves top-k positions to physical arena rows, as the *KV resolve kernel contract* of
/// `cuda-kernels/DESIGN.md` specifies (after HiSparse). [`crate::ElasticPool`] is the exact CPU
/// reference; the GPU back-end (feature `cuda`) implements the same trait with the same
/// inputs and outputs (plain `int32` slices and Pod copy lists).
pub trait Resolver {
    /// Resolves one step: for each position, tail → scratch → borrowed page → hot cache → miss;
    /// misses are deduplicated per session across its rows and copied from the host store into
    /// victim hot-cache rows of `input.layer`. Writes every element of `out`.
    ///
    /// Errors (nothing changes, `out` is filled with `-1` / `0` when its lengths are right):
    /// `LengthMismatch`, `BadQueryStartLoc`, `UnknownSession`, `SessionFinished`,
    /// `DuplicateSession`, `SeqLenOutOfRange`, `PositionOutOfRange`, `LayerOutOfRange`,
    /// `HotCacheOverflow`.
    fn resolve(
        &mut self,
        input: &ResolveInput<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved>;

    /// Applies a plan's copies to another layer's plane. Errors: `LayerOutOfRange`, `StalePlan`
    /// (a later resolve or prefetch reassigned a destination row), session errors; nothing is
    /// copied on error.
    fn replay(&mut self, plan: &ResolvePlan, layer: u32) -> Result<()>;

    /// Prefetches up to [`MAX_CANDIDATES`] candidate positions of one session into its hot cache
    /// (in the given order, as far as rows not pinned by the current step allow), so that later
    /// layers' picks find them resident. Returns the copies made into `layer` (replay for others).
    fn prefetch(
        &mut self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<ResolvePlan>;
}
