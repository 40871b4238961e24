//! Tiers and physical page ids.

use std::fmt;

/// A memory tier a pool lives in.
///
/// `#[non_exhaustive]`: more tiers (pageable host, NVMe) may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Tier {
    /// GPU device memory (HBM): the fast tier kernels read directly.
    DeviceHbm,
    /// Page-locked (pinned) host memory: DMA-able, and GPU-readable in place
    /// when mapped.
    HostPinned,
    /// Ordinary pageable host memory (staging only; not DMA-able directly).
    HostPageable,
}

impl Tier {
    /// Short stable name: `"hbm"`, `"pinned"`, `"pageable"`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::DeviceHbm => "hbm",
            Tier::HostPinned => "pinned",
            Tier::HostPageable => "pageable",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A physical page (or slot) index inside one pool, `0..capacity`.
///
/// Plain `u32`, `bytemuck::Pod`, so tables of page ids can be copied to the
/// GPU as-is. A bare `PageId` carries no ownership; use a [`PageHandle`] to
/// free or check a page.
#[repr(transparent)]
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    bytemuck::Pod,
    bytemuck::Zeroable,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PageId(pub u32);

impl PageId {
    /// The id as a `usize` index (for indexing a page array).
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// A generation-tagged reference to an allocated page.
///
/// The pool bumps a page's generation each time the page is freed, so a
/// handle kept past its free is detected ([`CoreError::StaleHandle`](crate::CoreError)
/// or [`CoreError::DoubleFree`](crate::CoreError)) instead of silently
/// aliasing the page's next owner. Generations are `u32` and wrap after 2^32
/// frees of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PageHandle {
    pub(crate) page: PageId,
    pub(crate) generation: u32,
}

impl PageHandle {
    /// The physical page this handle refers to.
    #[inline]
    pub fn page(&self) -> PageId {
        self.page
    }

    /// The page generation at the time the handle was made.
    #[inline]
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Rebuilds a handle from its raw parts (e.g. after crossing FFI). The
    /// pool still checks it: a made-up generation is a
    /// [`CoreError::StaleHandle`](crate::CoreError).
    #[inline]
    pub fn from_raw(page: PageId, generation: u32) -> Self {
        PageHandle { page, generation }
    }
}
