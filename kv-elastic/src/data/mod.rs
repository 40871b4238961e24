//! The data plane: bytes, and nothing about where they should be. The host store holds every
//! session's committed history (the source of truth, once); the arena holds the rows resolves
//! return. A [`DataPlane`] executes the control plane's decisions: [`CpuData`] copies bytes on the
//! host (the CPU reference); the GPU back-end's `gpu::GpuData` (feature `cuda`) records what
//! changed and enqueues O(changed) asynchronous copies and table patches on the device.

mod arena;
mod host;
mod region;
mod region_store;
mod slots;

pub(crate) use arena::CpuArena;
pub(crate) use host::sealed;
pub use host::{HostBytes, HostStore, SessionId, VecBytes};
#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub(crate) use region::{numa_node_of, TeardownHooks};
pub use region::{
    page_size, HostMemory, HostRegion, MemKind, RegionDesc, RegionHold, StoreLayout, TeardownHook,
    REGION_CHUNK,
};
pub use region_store::{CpuBytes, RegionBytes, StoreConfig};
pub(crate) use slots::forward_slot_books;
#[cfg(feature = "cuda")]
pub(crate) use slots::SlotStore;

use crate::error::Result;
use crate::layout::Geometry;

/// What executes the control plane's decisions on bytes (see the module docs). Sealed: the
/// pool's exactness depends on every implementation moving exactly these bytes.
///
/// Every call names rows the control plane has already decided (pages it lent, tail and scratch
/// rows of live sessions); a call never fails except where it says so. The GPU implementation
/// applies them to the device asynchronously, in the order of the calls, when its pool flushes.
pub trait DataPlane: sealed::Sealed + Send {
    /// Where the host store keeps the history's bytes.
    type Bytes: HostBytes;

    /// The host store (committed history of every live session).
    fn host(&self) -> &HostStore<Self::Bytes>;

    /// Mutable host store.
    fn host_mut(&mut self) -> &mut HostStore<Self::Bytes>;

    /// Copies history page `logical` of `session` (positions `logical × page_rows ..`, all
    /// layers, committed) into physical page `page`; the control plane maps it right after.
    fn fill_page(&mut self, session: SessionId, logical: u32, page: u32);

    /// [`DataPlane::fill_page`] for each `(logical, page)` of `pages`, in order (a loan of many
    /// pages: the GPU back-end logs them with one slot lookup and one reservation).
    fn fill_pages(&mut self, session: SessionId, pages: &[(u32, u32)]) {
        for &(logical, page) in pages {
            self.fill_page(session, logical, page);
        }
    }

    /// The control plane unmapped history page `logical` of `session`, held in physical page
    /// `page` (reclaim); no bytes move. The page may be lent or reserved again before the next
    /// publish, so a data plane that defers fills drops those still pending into `page`.
    fn unmap_page(&mut self, session: SessionId, logical: u32, page: u32);

    /// Copies committed token `position` of `session` (all layers) into arena row `row` (tail).
    fn write_tail(&mut self, session: SessionId, position: u32, row: u32);

    /// Writes draft `token` (all layers; history position `position` if accepted) into scratch
    /// row `row`.
    fn write_draft(&mut self, session: SessionId, position: u32, row: u32, token: &[u8]);

    /// Appends the tokens held in arena rows `rows` (all layers; drafts in scratch) to the
    /// session's committed history, in order; returns the new committed length. Errors:
    /// `OutOfMemory` (nothing changed).
    fn commit_rows(&mut self, session: SessionId, rows: &[u32]) -> Result<u32>;

    /// As [`DataPlane::commit_rows`] for rows the engine wrote on the device (new tokens in the
    /// tail); `Unsupported` where the arena is not the engine's (the CPU pool). Nothing changes on
    /// an error.
    fn commit_written_rows(&mut self, session: SessionId, rows: &[u32]) -> Result<u32>;

    /// The session's placement (lengths, pages) changed; the GPU republishes its descriptor.
    fn placement_changed(&mut self, session: SessionId);

    /// Whether arena row `row` of plane `layer` holds committed position `position` of `session`
    /// (the invariant checks); `None` where the data plane cannot tell without waiting for a
    /// device (the GPU back-end).
    fn row_holds(&self, session: SessionId, position: u32, layer: u32, row: u32) -> Option<bool>;
}

/// The CPU back-end's data plane: the host store (a `Vec` per session, or one registrable
/// region: [`CpuBytes`]) and the CPU arena (`u8 [layers][arena_rows][row_bytes]`).
#[derive(Debug)]
pub struct CpuData {
    host: HostStore<CpuBytes>,
    arena: CpuArena,
}

impl CpuData {
    pub(crate) fn new(geometry: &Geometry, bytes: CpuBytes) -> Result<Self> {
        Ok(Self {
            host: HostStore::with_backing(geometry.row_bytes, geometry.layers, bytes),
            arena: CpuArena::new(geometry)?,
        })
    }

    pub(crate) fn arena(&self) -> &CpuArena {
        &self.arena
    }

    /// Copies `(session, position, layer)` from the host store into `row` of plane `layer`.
    pub(crate) fn copy_host_row(
        &mut self,
        session: SessionId,
        position: u32,
        layer: u32,
        row: u32,
    ) {
        self.arena
            .copy_host_row(&self.host, session, position, layer, row);
    }
}

impl sealed::Sealed for CpuData {}

impl DataPlane for CpuData {
    type Bytes = CpuBytes;

    fn host(&self) -> &HostStore<CpuBytes> {
        &self.host
    }

    fn host_mut(&mut self) -> &mut HostStore<CpuBytes> {
        &mut self.host
    }

    fn fill_page(&mut self, session: SessionId, logical: u32, page: u32) {
        self.arena.fill_page(&self.host, session, logical, page);
    }

    fn unmap_page(&mut self, _session: SessionId, _logical: u32, _page: u32) {}

    fn write_tail(&mut self, session: SessionId, position: u32, row: u32) {
        let token = self.host.token(session, position).expect("committed");
        self.arena.write_token(row, token);
    }

    fn write_draft(&mut self, _session: SessionId, _position: u32, row: u32, token: &[u8]) {
        self.arena.write_token(row, token);
    }

    fn commit_rows(&mut self, session: SessionId, rows: &[u32]) -> Result<u32> {
        let mut tokens = Vec::new();
        tier_core::alloc::try_reserve(
            &mut tokens,
            rows.len() * self.host.token_bytes(),
            "accepted draft rows",
        )?;
        for &row in rows {
            self.arena.read_token(row, &mut tokens);
        }
        self.host.append(session, &tokens)
    }

    fn commit_written_rows(&mut self, _session: SessionId, _rows: &[u32]) -> Result<u32> {
        Err(crate::KvError::Unsupported(
            "rows written on the device: the CPU pool's arena is its own (use append)",
        ))
    }

    fn placement_changed(&mut self, _session: SessionId) {}

    fn row_holds(&self, session: SessionId, position: u32, layer: u32, row: u32) -> Option<bool> {
        let want = self.host.row(session, position, layer).ok()?;
        Some(self.arena.row(layer, row as i32).as_deref() == Some(want))
    }
}
