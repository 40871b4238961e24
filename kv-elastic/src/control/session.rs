//! [`SessionState`]: one live session's control state — its committed and draft lengths, its fixed
//! pages (hot cache, tail, scratch), its borrowed-page table and its hot cache.

use tier_core::{PageHandle, PageMap};

use crate::control::HotCache;
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
    /// The hot cache (CLOCK).
    pub(crate) hot: HotCache,
    /// The session's resolve / prefetch call number (hot-cache pins): starts at 1, advanced by
    /// each resolve that names the session; a prefetch pins with the current one. Per session, as
    /// the GPU kernels' per-slot counters (`cuda-kernels/DESIGN.md`, "Call counters"): pins are
    /// compared only within one session's hot cache.
    pub(crate) call: u64,
}

impl SessionState {
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
