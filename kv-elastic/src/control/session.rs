//! [`SessionState`]: one live session's control state — its committed and draft lengths, its fixed
//! pages (hot cache, tail, scratch), its borrowed-page table and its hot cache.

use tier_core::alloc::{try_filled, try_reserve};
use tier_core::{PageHandle, PageMap};

use crate::control::HotCache;
use crate::error::Result;
use crate::layout::Geometry;

/// One live session's control state (see the module docs).
#[derive(Debug)]
pub(crate) struct SessionState {
    /// Committed positions.
    pub(crate) committed: u32,
    /// Draft tokens in scratch.
    pub(crate) scratch_len: u32,
    /// The fixed pages, reserved from the arena's lender (released at finish).
    pub(crate) fixed: Vec<PageHandle>,
    /// Physical page of each fixed page.
    pub(crate) fixed_pages: Vec<u32>,
    /// Borrowed history pages: logical page → physical page (`tier_core::NOT_RESIDENT` if none).
    pub(crate) pages: PageMap,
    /// The hot cache (CLOCK) of each layer group (`Geometry::groups` entries).
    pub(crate) hot: Vec<HotCache>,
    /// Each layer group's resolve / prefetch call number (hot-cache pins): starts at 1, advanced
    /// by each resolve at the group that names the session; a prefetch pins with the current one.
    /// Per session and group, as the GPU kernels' per-(group, slot) counters
    /// (`cuda-kernels/DESIGN.md`, "Call counters"): pins are compared only within one hot cache.
    pub(crate) call: Vec<u64>,
}

impl SessionState {
    /// Fresh hot caches (empty, call 1) for every layer group of `g`, for a history of `history`
    /// positions. Errors: `OutOfMemory` when the host cannot allocate them (their sizes come from
    /// the caller's geometry and history).
    pub(crate) fn try_new_hot(g: &Geometry, history: u32) -> Result<(Vec<HotCache>, Vec<u64>)> {
        let n = g.groups() as usize;
        let mut hot = Vec::new();
        try_reserve(&mut hot, n, "hot caches of the layer groups")?;
        for _ in 0..n {
            hot.push(HotCache::try_new(g.hot_rows, history)?);
        }
        Ok((hot, try_filled(n, 1, "hot-cache call counters")?))
    }

    /// Whether every committed position below the tail is on a borrowed page (the direct path):
    /// its mapped pages equal `ceil((committed - tail_rows) / page_rows)`.
    pub(crate) fn fully_held(&self, g: &Geometry) -> bool {
        let needed = self
            .committed
            .saturating_sub(g.tail_rows)
            .div_ceil(g.page_rows);
        self.pages.mapped_count() == needed
    }
}
