//! The resolver interface: top-k positions in, physical arena rows out, plus the plan of host →
//! arena copies that other layers of the group replay.

use crate::data::SessionId;
use crate::error::Result;
use crate::ticket::ReadTicket;

/// Most prefetch candidates one session may announce for a layer group.
pub const MAX_CANDIDATES: usize = 16_384;

/// Most positions per block id ([`ResolveOptions::block_positions`]), 2^16. Block-sparse
/// indexers score blocks of 64 positions (SGLang's `SPARSE_BLOCK_SIZE`, MiniMax-M3, NSA's
/// selection blocks) up to 4,096 (MoBA's largest); the outputs are `rows × k × B` entries, so `B`
/// is what a resolve's output size multiplies its top-k by, and a block id standing for more
/// positions than 16× the largest block in use is a slip (a byte count, a history length), refused
/// as [`crate::KvError::BlockPositionsOutOfRange`] before anything is sized from it.
pub const MAX_BLOCK_POSITIONS: u32 = 1 << 16;

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
    /// The indexer's top-k, `int32 [rows, k]` row-major; `-1` = padding: positions, or block ids
    /// with [`ResolveOptions::block_positions`].
    pub topk: &'a [i32],
    /// Picks per row (top-k; block ids per row with [`ResolveOptions::block_positions`]); any
    /// `k >= 1` (nothing is compiled for a fixed k).
    pub k: usize,
    /// The layer being resolved: its layer group's hot cache serves the picks, and the misses are
    /// copied into every layer of that group ([`crate::LayerGroups`]; per layer by default).
    pub layer: u32,
}

/// How a row of [`ResolveOutput::indices`] is laid out (the *KV resolve kernel contract*,
/// "Outputs").
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum OutputLayout {
    /// Each arena row stays in its pick's column, `-1` where the pick was `-1` (or could not be
    /// served); `valid_count[row]` counts the non `-1` entries. Engines that read the whole row and
    /// skip `-1` (FlashMLA's sparse decode without `topk_length`, vLLM's sparse-MLA path) take it
    /// as is. `valid_count` is *not* FlashMLA's `topk_length` here: a `-1` may sit before a valid
    /// entry.
    #[default]
    InPlace,
    /// The valid entries of each row are packed to the front in column order, `-1` after them;
    /// `valid_count[row]` is the packed length: FlashMLA's `topk_length` ("use the first N
    /// entries of the row"), and vLLM's packed sparse-MLA indices with their valid count.
    Packed,
}

/// Optional inputs of [`Resolver::resolve_with`]; the default is [`Resolver::resolve`]'s behaviour
/// (in-place rows, per-session causal bound).
#[derive(Clone, Copy, Debug, Default)]
pub struct ResolveOptions<'a> {
    /// Row layout of the outputs.
    pub layout: OutputLayout,
    /// Per-query causal bound, `int32 [rows]`: query row `row` may see positions
    /// `0..query_seq_lens[row]` (speculative decoding: the draft at position `committed + i` sees
    /// `committed + i + 1` positions, as vLLM's per-token `seq_lens` of a spec-decode batch). Each
    /// value in `1..=seq_lens[r]` of the row's batch entry. `None`: every row of entry `r` sees
    /// `seq_lens[r]` positions.
    pub query_seq_lens: Option<&'a [i32]>,
    /// Positions per block id (0 or 1: `topk` holds positions). `B > 1`: `topk` holds *block
    /// ids*, as indexers that score fixed blocks of consecutive positions return them (MiniMax-M3;
    /// SGLang's `TopKIsBlocks` with `SPARSE_BLOCK_SIZE = B`): block id `b` stands for positions
    /// `b × B .. b × B + B`, and each row of `k` block ids is read as the `k × B` positions
    /// `topk[row][c] × B + i` in block-major order (column `c × B + i`), each then resolved
    /// exactly as a position pick (lookup order, dedup, CLOCK). The outputs have `k × B`
    /// columns (`indices int32 [rows, k × B]`). A block id `-1` is padding (`B` columns of `-1`);
    /// a block id `< -1` is invalid (`PositionOutOfRange`). A position of a block at or beyond its
    /// row's bound is written `-1` and is *not* invalid: the block straddles the end of the
    /// visible history (or lies past it: an indexer's top-k over masked blocks), as SGLang reads
    /// it. At most [`MAX_BLOCK_POSITIONS`] (`BlockPositionsOutOfRange`), and `k × B` must fit an
    /// `int32`.
    pub block_positions: u32,
}

impl ResolveOptions<'_> {
    /// Positions per top-k entry: [`ResolveOptions::block_positions`], at least 1.
    pub fn block(&self) -> usize {
        self.block_positions.max(1) as usize
    }
}

/// The positions one top-k row stands for, as every resolver reads them (`row`: the row's `k`
/// entries, `block`: [`ResolveOptions::block`], `bound`: the row's causal bound): with `block ==
/// 1` the picks themselves; with block ids, `block` positions per id in block-major order, `-1`
/// for a `-1` id and for a position at or beyond `bound`, the id itself for an id `< -1` (left
/// for the validation to refuse).
pub(crate) fn row_positions(
    row: &[i32],
    block: usize,
    bound: i32,
) -> impl Iterator<Item = i32> + '_ {
    row.iter().flat_map(move |&id| {
        (0..block as i64).map(move |i| {
            if block == 1 || id < 0 {
                return id;
            }
            let p = id as i64 * block as i64 + i;
            if p >= bound as i64 {
                -1
            } else {
                p as i32
            }
        })
    })
}

/// Where the resolver writes; every element is written on every call (also on error, when the
/// lengths suffice: `-1` and `0`), so no stale index survives.
///
/// Buffers may be longer than the call needs (a persistent max-size buffer, CUDA-graph style):
/// `indices` holds `rows × k` entries row-major with row stride `k` (`rows × k × B` with stride
/// `k × B` for block ids, [`ResolveOptions::block_positions`]), every entry past them is padding
/// and written `-1`; `valid_count` entries past `rows` are padding and written `0`.
#[derive(Debug)]
pub struct ResolveOutput<'a> {
    /// Physical row indices into the device arena, `int32 [>= rows × k × B]` (row stride `k × B`;
    /// `B` = [`ResolveOptions::block`], 1 for position picks), laid
    /// out as [`ResolveOptions::layout`] says; `-1` for padding, invalid and unserved picks.
    pub indices: &'a mut [i32],
    /// Valid (non `-1`) entries per row, `int32 [>= rows]`. FlashMLA's `topk_length` only with
    /// [`OutputLayout::Packed`] (see [`OutputLayout::InPlace`]).
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

/// The copies one resolve or prefetch made (the deduplicated miss list), already applied to every
/// layer of its layer group ([`crate::LayerGroups`]). [`Resolver::replay`] copies them again into
/// one layer of the same group (never needed for exactness; refused for another group's layer).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvePlan {
    /// Copies, deduplicated per session.
    pub copies: Vec<RowCopy>,
    /// The layer group whose hot rows the copies filled.
    #[serde(default)]
    pub group: u32,
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
    /// Valid picks written `-1` because their position found no evictable hot row (a speculative
    /// step whose rows together need more distinct positions than the hot cache holds; see the
    /// contract's "Overflow"). Not counted in `picks`.
    pub unserved: u64,
}

/// One resolve's result besides the outputs.
#[derive(Debug)]
pub struct Resolved {
    /// Copies made (into every layer of `input.layer`'s group).
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
    /// Resolves one step at one layer: for each position, tail → scratch → borrowed page → the
    /// hot cache of `input.layer`'s layer group → miss; misses are deduplicated per session across
    /// its rows and copied from the host store into victim hot-cache rows of every layer of the
    /// group ([`crate::LayerGroups`]), so the returned rows hold `input.layer`'s bytes whatever
    /// the group's other layers resolved before. Writes every element of `out`.
    ///
    /// In-place rows and per-session causal bounds: [`Resolver::resolve_with`] with
    /// [`ResolveOptions::default`].
    ///
    /// Errors (nothing changes, `out` is filled with `-1` / `0` when its lengths suffice):
    /// `LengthMismatch`, `BadQueryStartLoc`, `UnknownSession`, `SessionFinished`,
    /// `DuplicateSession`, `SeqLenOutOfRange`, `PositionOutOfRange`, `LayerOutOfRange`.
    fn resolve(
        &mut self,
        input: &ResolveInput<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved> {
        self.resolve_with(input, &ResolveOptions::default(), out)
    }

    /// Resolves one step as [`Resolver::resolve`] does, with the output layout, per-query causal
    /// bounds and block ids ([`ResolveOptions::block_positions`]) of `opts`. A step whose distinct non-resident positions exceed a session's hot cache
    /// is served as far as evictable rows last (misses placed in first-appearance order); the
    /// remaining picks come out `-1` and are counted in [`ResolveStats::unserved`] — never an error.
    ///
    /// Errors (nothing changes, `out` filled as above): [`Resolver::resolve`]'s, plus
    /// `LengthMismatch` (`query_seq_lens` not `[rows]`), `QuerySeqLenOutOfRange` (a row bound
    /// outside `1..=seq_len` of its entry), `PositionOutOfRange` (a pick at or beyond its row's
    /// bound; with block ids, a block id `< -1`), `BlockPositionsOutOfRange` (`block_positions`
    /// over [`MAX_BLOCK_POSITIONS`]), `LengthMismatch` (`k × block_positions` over
    /// `i32::MAX`, or outputs below `rows × k × block_positions` / `rows`).
    fn resolve_with(
        &mut self,
        input: &ResolveInput<'_>,
        opts: &ResolveOptions<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved>;

    /// Copies a plan's rows again into one layer of its layer group. Resolves and prefetches
    /// already fill every layer of their group, so this is never needed for exactness; it is kept
    /// for engines written against the per-layer replay of earlier versions. Errors:
    /// `LayerOutOfRange`, `LayerOutsideGroup` (`layer` is not in `plan.group`: the rows belong to
    /// that group's hot cache), `StalePlan` (a later resolve or prefetch reassigned a destination
    /// row), session errors; nothing is copied on error.
    fn replay(&mut self, plan: &ResolvePlan, layer: u32) -> Result<()>;

    /// Prefetches up to [`MAX_CANDIDATES`] candidate positions of one session into the hot cache
    /// of `layer`'s layer group (in the given order, as far as rows not pinned by the current step
    /// allow), copying them into every layer of the group, so that the group's later picks find
    /// them resident. "Pinned" means by the group's last resolve of the session (or an earlier
    /// prefetch since it): calls are numbered per session and group, so a session left out of the
    /// latest resolve keeps its last resolve's rows pinned until its next one. Returns the copies
    /// made.
    fn prefetch(
        &mut self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<ResolvePlan>;
}
