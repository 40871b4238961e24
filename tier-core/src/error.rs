//! The crate's error type.

/// Every error `tier-core` returns. A call that returns an error leaves the
/// object it was called on exactly as it was (no half-done updates).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A pool, lender or table was asked to hold zero pages/entries where at
    /// least one is required.
    #[error("capacity must be at least 1")]
    ZeroCapacity,
    /// More pages were requested (`requested`, pages) than are free right now
    /// (`free`, pages).
    #[error("pool exhausted: requested {requested} pages, {free} free")]
    PoolExhausted {
        /// Pages asked for.
        requested: u32,
        /// Pages free when the request was made.
        free: u32,
    },
    /// The handle's page was freed (and possibly reused) since the handle was
    /// made: `generation` is the handle's, which no longer matches the page's.
    #[error("stale handle for page {page} (handle generation {generation})")]
    StaleHandle {
        /// Physical page id of the handle.
        page: u32,
        /// Generation carried by the handle.
        generation: u32,
    },
    /// The page of this very handle was already freed.
    #[error("page {page} freed twice")]
    DoubleFree {
        /// Physical page id.
        page: u32,
    },
    /// An index (logical map entry, physical page id, counter index) is not
    /// below `len`.
    #[error("index {index} out of range (len {len})")]
    OutOfRange {
        /// The index given.
        index: u64,
        /// The exclusive upper bound.
        len: u64,
    },
    /// A planned change was made against map generation `expected`, but the
    /// map is now at `actual`: it moved under the plan.
    #[error("stale map generation: planned at {expected}, map is at {actual}")]
    StaleGeneration {
        /// Generation the plan was made against.
        expected: u64,
        /// Generation of the map now.
        actual: u64,
    },
    /// A [`PageMap`](crate::PageMap) is at generation `generation` and may
    /// not count another change: generations stop at
    /// [`MAX_GENERATION`](crate::MAX_GENERATION) rather than wrap (a wrapped
    /// generation would let a plan made long ago pass the staleness check
    /// again). Also returned when a loaded map claims a generation above
    /// `MAX_GENERATION`. Nothing was changed.
    #[error("map generation {generation} is exhausted (generations stop at {max})", max = crate::MAX_GENERATION)]
    GenerationExhausted {
        /// The map's generation (or the one a loaded map claimed).
        generation: u64,
    },
    /// The borrower id is not known to the lender (never lent to, or fully
    /// handed back and forgotten).
    #[error("unknown borrower {borrower}")]
    UnknownBorrower {
        /// Borrower id.
        borrower: u64,
    },
    /// The borrower has finished; its pages are queued for hand-back and it
    /// may not borrow or return pages any more.
    #[error("borrower {borrower} has finished")]
    BorrowerFinished {
        /// Borrower id.
        borrower: u64,
    },
    /// An EMA half-life (steps) was `<= 0` or not finite.
    #[error("half-life must be finite and > 0 steps")]
    InvalidHalfLife,
    /// A loaded [`DecayingCounters`](crate::DecayingCounters) table holds a
    /// negative or non-finite value (NaN, ±inf) at `index`; decayed counts are
    /// finite and `>= 0`.
    #[error("counter {index} is negative or not finite")]
    InvalidCounterValue {
        /// Index of the first bad value.
        index: u64,
    },
    /// A slice had `actual` elements where `expected` were needed.
    #[error("length mismatch: expected {expected}, got {actual}")]
    LengthMismatch {
        /// Required length.
        expected: usize,
        /// Given length.
        actual: usize,
    },
    /// The same logical page was asked for twice for one borrower (in one
    /// request, or one it already holds).
    #[error("borrower {borrower} already holds (or asked twice for) logical page {logical}")]
    DuplicateLogical {
        /// Borrower id.
        borrower: u64,
        /// Logical page index.
        logical: u32,
    },
    /// The loan given back is not held by that borrower (already returned,
    /// reclaimed, or never lent).
    #[error("borrower {borrower} holds no such loan for logical page {logical}")]
    NotLent {
        /// Borrower id.
        borrower: u64,
        /// Logical page index.
        logical: u32,
    },
    /// [`Lender::release`](crate::Lender::release) of a page that is not
    /// reserved.
    #[error("page {page} is not reserved")]
    NotReserved {
        /// Physical page id.
        page: u32,
    },
    /// A [`PageMap::move_page`](crate::PageMap::move_page) source entry
    /// `logical` has no page to move.
    #[error("logical entry {logical} is not mapped")]
    NotMapped {
        /// The unmapped logical entry.
        logical: u32,
    },
    /// A [`PageMap::move_page`](crate::PageMap::move_page) target entry
    /// `logical` already holds physical page `page`.
    #[error("logical entry {logical} is already mapped (page {page})")]
    AlreadyMapped {
        /// The mapped logical entry.
        logical: u32,
        /// The page it holds.
        page: u32,
    },
    /// A map could not shrink because logical entry `logical` (at or beyond
    /// the new length) is still mapped.
    #[error("cannot shrink: logical entry {logical} is still mapped")]
    MappedTail {
        /// First mapped logical entry in the dropped tail.
        logical: u32,
    },
    /// A [`ReclaimPolicy`](crate::ReclaimPolicy) returned an invalid choice
    /// (wrong count, a page not held, or a page twice). Nothing was reclaimed.
    #[error("reclaim policy returned an invalid choice: {reason}")]
    InvalidPolicyChoice {
        /// What was wrong.
        reason: &'static str,
    },
    /// A table of `bytes` bytes could not be allocated (size overflow or the
    /// allocator refused): see [`crate::alloc`].
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    AllocationFailed {
        /// What was being allocated.
        what: &'static str,
        /// Bytes requested (saturated at `u64::MAX`).
        bytes: u64,
    },
}

/// `Result` with [`CoreError`] as the default error.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
