//! The crate's error type.

/// Everything that can go wrong in `kv-elastic`. Every fallible call leaves the pool unchanged
/// when it returns one of these (see each method for the rare documented exception).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// A [`crate::Geometry`] field is zero or out of range.
    #[error("invalid geometry: {0}")]
    InvalidGeometry(&'static str),
    /// The device arena cannot hold even one session's fixed rows (hot cache + tail + scratch).
    #[error("arena of {arena_pages} pages is too small for one session's fixed rows ({needed_pages} pages)")]
    ArenaTooSmall {
        /// Pages in the arena.
        arena_pages: u32,
        /// Pages one session's hot cache + tail + scratch need.
        needed_pages: u32,
    },
    /// An HBM budget cannot hold even one session's fixed rows ([`crate::Geometry::for_hbm_budget`]).
    #[error("HBM budget of {budget_bytes} bytes is below one session's fixed rows ({needed_bytes} bytes)")]
    BudgetTooSmall {
        /// The budget given, bytes.
        budget_bytes: u64,
        /// Bytes of one session's fixed pages over all layers.
        needed_bytes: u64,
    },
    /// No session with this id exists.
    #[error("unknown session {0}")]
    UnknownSession(u64),
    /// The session has finished; it cannot be appended to, resolved or finished again.
    #[error("session {0} has already finished")]
    SessionFinished(u64),
    /// A session with this id already exists (or existed).
    #[error("session {0} already exists")]
    SessionExists(u64),
    /// A session's history would pass [`crate::MAX_HISTORY`] tokens (positions are `int32`, as
    /// the indexer's top-k and FlashMLA's indices are).
    #[error("history of {tokens} tokens, at most {max}")]
    HistoryTooLong {
        /// Tokens the history would hold.
        tokens: u64,
        /// The limit.
        max: u32,
    },
    /// A session must be admitted with at least one committed token.
    #[error("zero-length history")]
    EmptyHistory,
    /// A byte buffer is not a whole number of tokens (`layers × row_bytes` bytes each).
    #[error("buffer of {actual} bytes is not a whole number of {token_bytes}-byte tokens")]
    RaggedRows {
        /// Bytes per token (`layers × row_bytes`).
        token_bytes: usize,
        /// Bytes given.
        actual: usize,
    },
    /// A slice has the wrong length.
    #[error("{what}: expected length {expected}, got {actual}")]
    LengthMismatch {
        /// Which argument.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        actual: usize,
    },
    /// `query_start_loc` is not a non-decreasing `[reqs + 1]` array starting at 0 and ending at `rows`.
    #[error("invalid query_start_loc: {0}")]
    BadQueryStartLoc(&'static str),
    /// A selected position is `< -1` or `>= seq_len` of its session.
    #[error("row {row}: position {position} out of range for seq_len {seq_len}")]
    PositionOutOfRange {
        /// Query row.
        row: usize,
        /// The offending position.
        position: i32,
        /// The session's `seq_len` this step.
        seq_len: i32,
    },
    /// A session's `seq_len` is `< 1` or exceeds its committed + scratch length.
    #[error("session {session}: seq_len {seq_len} outside 1..={available}")]
    SeqLenOutOfRange {
        /// Session.
        session: u64,
        /// The given `seq_len`.
        seq_len: i32,
        /// Committed + scratch tokens.
        available: u32,
    },
    /// A per-query causal bound (`ResolveOptions::query_seq_lens`) is `< 1` or exceeds its batch
    /// entry's `seq_len`.
    #[error("row {row}: query_seq_len {query_seq_len} outside 1..={seq_len}")]
    QuerySeqLenOutOfRange {
        /// Query row.
        row: usize,
        /// The given bound.
        query_seq_len: i32,
        /// The row's batch entry's `seq_len`.
        seq_len: i32,
    },
    /// The same session appears twice in one batch.
    #[error("session {0} appears twice in one batch")]
    DuplicateSession(u64),
    /// One session's distinct non-resident positions in a step exceed its hot cache. No longer
    /// returned by a resolve (such a step is served as far as the hot cache allows, the rest
    /// counted in `ResolveStats::unserved`); kept so matching code still compiles.
    #[error("session {session}: {needed} distinct positions need the hot cache this step, it has {hot_rows} rows")]
    HotCacheOverflow {
        /// Session.
        session: u64,
        /// Distinct positions that need a hot row.
        needed: usize,
        /// Hot-cache rows per session.
        hot_rows: u32,
    },
    /// More draft rows than the session's scratch holds, or accepting more than were written.
    #[error("session {session}: scratch holds {scratch_rows} rows, asked for {requested}")]
    ScratchOverflow {
        /// Session.
        session: u64,
        /// Scratch capacity (rows).
        scratch_rows: u32,
        /// Rows asked for.
        requested: u32,
    },
    /// Too many prefetch candidates for one session.
    #[error("{given} prefetch candidates, at most {max}")]
    TooManyCandidates {
        /// Given.
        given: usize,
        /// Maximum ([`crate::MAX_CANDIDATES`]).
        max: usize,
    },
    /// [`crate::ResolveOptions::block_positions`] above [`crate::MAX_BLOCK_POSITIONS`].
    #[error("block_positions = {block_positions} is out of range: expected 0..={max} positions per block id (0 or 1: topk holds positions; block-sparse indexers use 64)")]
    BlockPositionsOutOfRange {
        /// Given.
        block_positions: u32,
        /// Maximum ([`crate::MAX_BLOCK_POSITIONS`]).
        max: u32,
    },
    /// A layer index `>= layers`.
    #[error("layer {layer} out of range ({layers} layers)")]
    LayerOutOfRange {
        /// Given layer.
        layer: u32,
        /// Layers in the geometry.
        layers: u32,
    },
    /// A plan replayed into a layer of another layer group: its rows are hot rows of its own group,
    /// which in another group's planes hold other positions ([`crate::LayerGroups`]).
    #[error("layer {layer} is outside the plan's layer group {group} (layers {first}..{end}); a plan replays only into its own group's layers")]
    LayerOutsideGroup {
        /// Given layer.
        layer: u32,
        /// The plan's layer group.
        group: u32,
        /// Its first layer.
        first: u32,
        /// One past its last layer.
        end: u32,
    },
    /// A plan's destination rows were reassigned since it was made (a later resolve or prefetch).
    #[error("stale plan: hot row {row} no longer holds position {position} of session {session}")]
    StalePlan {
        /// Session.
        session: u64,
        /// Position.
        position: u32,
        /// Arena row.
        row: u32,
    },
    /// Not enough HBM for the session's fixed rows even after reclaiming every borrowed page.
    #[error("no room: need {needed} pages, at most {available} can be freed")]
    NoRoom {
        /// Pages needed.
        needed: u32,
        /// Free + reclaimable + pending pages.
        available: u32,
    },
    /// The host could not allocate a buffer the geometry or the caller's input asks for (the
    /// arena planes, a session's history and its tables, a copy of draft rows). Nothing changed.
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
    /// A host store's capacity is exceeded (its session slots or positions per slot; a
    /// region-backed store's `max_sessions` / `max_history`).
    #[error("host store: {what} = {value}, must stay below {limit}")]
    StoreCapacity {
        /// Which limit.
        what: &'static str,
        /// The value asked for.
        value: u64,
        /// One past the largest allowed.
        limit: u64,
    },
    /// The session is being imported (rows reserved by [`crate::ElasticPool::reserve`], not
    /// committed yet): it is invisible to resolves, appends and finish until `commit` or `abort`.
    #[error("session {0} is being imported (reserved, not committed)")]
    SessionImporting(u64),
    /// `commit` / `abort` of a session with no reservation.
    #[error("session {0} has no import in flight (reserve first)")]
    NoImport(u64),
    /// A reservation overlapping rows the same import already reserved.
    #[error("session {session}: rows {start}..{end} overlap rows already reserved")]
    OverlappingReserve {
        /// Session.
        session: u64,
        /// First row asked for.
        start: u32,
        /// One past the last row asked for.
        end: u32,
    },
    /// A reservation past the rows a session slot of the region holds (`max_history`), or an
    /// empty one.
    #[error("session {session}: rows {start}..{end} outside the region's 0..{limit}")]
    RowsBeyondRegion {
        /// Session.
        session: u64,
        /// First row asked for.
        start: u32,
        /// One past the last row asked for.
        end: u32,
        /// Rows per session slot.
        limit: u32,
    },
    /// `commit` while the reserved rows leave a gap (they must cover `0..n`).
    #[error("session {session}: reserved rows leave position {missing} uncovered")]
    ImportIncomplete {
        /// Session.
        session: u64,
        /// The first position no reservation covers.
        missing: u32,
    },
    /// The import timed out (no `commit` within the pool's import timeout of `between_steps`
    /// calls): its pages went back; its rows stay held, because a writer may still be writing
    /// them, until `abort` says it is gone. A writer outliving its session gets this.
    #[error("session {0}: the import timed out; abort it once its writer is gone")]
    ImportExpired(u64),
    /// `export_done` with no export of the session open.
    #[error("session {0} has no export in flight")]
    NoExport(u64),
    /// A simulation or selection-model parameter is out of range (the message names it and its bounds).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The operation needs another back-end (e.g. device-written appends on the CPU pool).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A GPU pool's publish failed after taking its change log: the device no longer follows the
    /// control plane, so every later call fails; drop the pool (the error names the failure).
    #[error("GPU pool poisoned by a failed publish ({0}); drop it and build a new one")]
    Poisoned(String),
    /// A trace file could not be read or parsed.
    #[error("trace: {0}")]
    Trace(String),
    /// An error from `tier-core` (pool, map, loans); its allocation failures come as
    /// [`KvError::OutOfMemory`] instead.
    #[error(transparent)]
    Core(tier_core::CoreError),
    /// A CUDA error of the GPU back-end (carries the CUDA error name, e.g.
    /// `CUDA_ERROR_OUT_OF_MEMORY`), or a device capacity limit.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] cuda_kernels::CudaError),
}

impl From<tier_core::CoreError> for KvError {
    fn from(e: tier_core::CoreError) -> Self {
        match e {
            tier_core::CoreError::AllocationFailed { what, bytes } => {
                KvError::OutOfMemory { what, bytes }
            }
            e => KvError::Core(e),
        }
    }
}

/// `Result` with [`KvError`].
pub type Result<T, E = KvError> = std::result::Result<T, E>;
