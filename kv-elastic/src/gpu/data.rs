//! [`GpuData`]: the GPU back-end's data plane. It holds the history once — the host store's
//! bytes are the mapped pinned store the kernels read ([`PinnedBytes`]) — and the device state
//! ([`GpuArena`]). It moves no byte when the control plane calls it: it records *what changed*
//! (page fills, tail and draft rows, write-backs, page-table entries, descriptors, session slots)
//! in a [`ChangeLog`], which `GpuElasticPool::publish` turns into O(changed) asynchronous work on
//! the device (see `gpu/pool.rs` for the streams and events).

use std::sync::atomic::{AtomicU64, Ordering};

use cuda_kernels::{EventSignal, HostBacking, KvCopy};
use hashbrown::HashMap;
use tier_core::CompletionSignal;

use super::GpuArena;
use crate::data::{
    sealed, DataPlane, HostBytes, HostStore, MemKind, RegionDesc, SessionId, SlotStore,
    StoreLayout, TeardownHook, TeardownHooks,
};
use crate::error::{KvError, Result};

/// The GPU pool's host-store backing: a view of the mapped pinned store of its [`GpuArena`]
/// (`u8 [max_slots][max_history][layers][row_bytes]`), one session slot per live session. The
/// history's only host copy: kernels read misses and page fills from it in place and write new
/// rows back into it.
///
/// Bytes of positions appended by a device write-back (`ElasticPool::append_written`, `accept`)
/// land when the step stream passes that write-back; the byte view ([`HostBytes::bytes`], under
/// `HostStore::row` / `token`) first waits on the host for the last write-back event, so no
/// slice it hands out covers bytes a queued kernel still writes.
#[derive(Debug)]
pub struct PinnedBytes {
    /// The slots over the pinned store (owned by the `GpuArena` beside this value in
    /// `GpuData`, which outlives it); freed slots stay blocked until the device passed the work
    /// queued before the free, exported ones until their last export ends.
    store: SlotStore,
    numa_node: Option<u32>,
    /// Who owns the pinned memory (for the accounting).
    backing: HostBacking,
    /// Teardown hooks (transfer agents' deregistrations): run when this view drops, before the
    /// `GpuArena` beside it frees the pinned store.
    hooks: TeardownHooks,
    /// Event after the last write-back queued (set by the publish that queued it).
    last_write_back: Option<EventSignal>,
    /// Host waits the byte view made for it.
    pub(crate) host_waits: AtomicU64,
    /// Slots created / freed since the last publish.
    pub(crate) created: Vec<u32>,
    pub(crate) freed: Vec<u32>,
}

impl PinnedBytes {
    fn new(dev: &GpuArena) -> Self {
        let d = *dev.dims();
        let (base, len) = dev.host_base();
        let layout = StoreLayout {
            max_slots: d.max_slots,
            max_history: d.max_history,
            layers: d.layers,
            row_bytes: d.row_bytes,
        };
        let full = |what, value, limit| {
            KvError::Cuda(cuda_kernels::CudaError::OutOfRange { what, value, limit })
        };
        // SAFETY: the pinned allocation of `dev` (the `GpuArena` this view sits beside in
        // `GpuData`, dropped after it) holds the layout (`GpuArena::with_buffers` checks it); the
        // host writes it only through this store, the device through queued kernels the pool
        // orders (see `SlotStore::write`).
        let store = unsafe { SlotStore::new(base, len, layout, full) };
        Self {
            store,
            numa_node: crate::data::numa_node_of(base),
            backing: dev.host_backing(),
            hooks: TeardownHooks::default(),
            last_write_back: None,
            host_waits: AtomicU64::new(0),
            created: Vec::new(),
            freed: Vec::new(),
        }
    }

    /// The session slot of a live session.
    pub fn slot_of(&self, session: SessionId) -> Option<u32> {
        self.store.books.slot_of(session)
    }

    /// The session holding a slot (live or importing).
    pub fn session_at(&self, slot: u32) -> Option<SessionId> {
        self.store.books.session_at(slot)
    }

    /// Sessions holding a slot (live or importing).
    pub fn live(&self) -> usize {
        self.store.books.held()
    }

    /// Whether a slot is free for a new session now.
    pub(crate) fn has_free_slot(&self) -> bool {
        self.store.books.has_free()
    }

    /// A publish queued write-backs into the store, complete after `event`.
    pub(crate) fn set_last_write_back(&mut self, event: EventSignal) {
        self.last_write_back = Some(event);
    }

    /// Makes a freed slot reusable (the device passed the work queued before its free).
    pub(crate) fn unblock(&mut self, slot: u32) {
        self.store.books.unblock(slot);
    }

    /// Writes `token` at `position` of a live session's slot (drafts: past its committed bytes,
    /// below `max_history`; the pool checks the bound first and waits for queued copies that
    /// read drafts there, `DraftReads`).
    pub(crate) fn write_at(&mut self, session: SessionId, position: u32, token: &[u8]) {
        self.store.write_at(session, position, token);
    }
}

impl sealed::Sealed for PinnedBytes {}

impl HostBytes for PinnedBytes {
    fn check_room(&self, history_bytes: usize) -> Result<()> {
        self.store.check_room(history_bytes)
    }

    fn create(&mut self, session: SessionId, history: &[u8]) -> Result<()> {
        let b = self.store.create(session, history)?;
        self.created.push(b);
        Ok(())
    }

    fn append(&mut self, session: SessionId, bytes: &[u8]) -> Result<()> {
        self.store.append(session, Some(bytes), bytes.len())
    }

    fn extend_device_written(&mut self, session: SessionId, bytes: usize) -> Result<()> {
        self.store.append(session, None, bytes)
    }

    fn bytes(&self, session: SessionId) -> Result<&[u8]> {
        if let Some(ev) = &self.last_write_back {
            if !ev.is_complete() {
                self.host_waits.fetch_add(1, Ordering::Relaxed);
                ev.event().synchronize().map_err(|e| {
                    KvError::Cuda(cuda_kernels::CudaError::driver("cuEventSynchronize", e))
                })?;
            }
        }
        // No device work writes these bytes while the slice lives: every write-back queued so
        // far has run (waited above; device kernels write the store only through write-backs),
        // and a new one is queued only by a publish, which needs `&mut` of the pool.
        Ok(self.store.committed(session))
    }

    fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        let desc = RegionDesc {
            addr: self.store.base() as u64,
            len: self.store.len() as u64,
            item_len: self.store.layout().token_bytes(),
            kind: MemKind::Dram,
            numa_node: self.numa_node,
        };
        Some((desc, self.store.layout()))
    }

    crate::data::forward_slot_books!(store);

    fn commit_import(&mut self, session: SessionId, bytes: usize) {
        let b = self.store.commit_import(session, bytes);
        // Published as a new session's slot (tables reset, fixed pages, tail fills).
        self.created.push(b);
    }

    fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        self.hooks.push(hook);
        Ok(())
    }

    fn memory(&self) -> crate::HostMemory {
        // Pinned and mapped once: tierkit's `cuMemHostAlloc`, or the engine's memory registered
        // by tierkit (`cuMemHostRegister`), or already pinned by the engine (nothing more).
        let len = self.store.len() as u64;
        let (allocated_bytes, pinned_bytes) = match self.backing {
            HostBacking::Owned => (len, len),
            HostBacking::Registered => (0, len),
            HostBacking::Borrowed => (0, 0),
        };
        crate::HostMemory {
            store_bytes: self.store.layout().store_bytes(),
            allocated_bytes,
            pinned_bytes,
        }
    }

    fn remove(&mut self, session: SessionId) {
        // Blocked until the device passed the publish that freed it (and, exported, until the
        // last export ends).
        if let Some(b) = self.store.books.free(session, true) {
            self.freed.push(b);
        }
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        // Deregistration first: the pinned store is freed after this view (the `GpuArena`
        // beside it in `GpuData` drops later).
        if let Some((desc, _)) = self.region() {
            self.hooks.run(&desc);
        }
    }
}

/// Draft positions of the pinned store that queued step-stream copies may still read: per
/// session slot, positions `lo..hi` and the signal (a publish's event) after the last copy that
/// reads them. A host write over those positions (`write_scratch` after `accept(k < drafts)`, or
/// `append`) must wait for the signal first.
#[derive(Debug)]
pub(crate) struct DraftReads<S>(HashMap<u32, (u32, u32, S)>);

impl<S> Default for DraftReads<S> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<S: tier_core::CompletionSignal + Clone> DraftReads<S> {
    /// A publish after `signal` queued copies reading positions `lo..hi` of `slot`. The signal
    /// of a later publish on the same stream covers the earlier ones, so ranges merge.
    pub(crate) fn record(&mut self, slot: u32, lo: u32, hi: u32, signal: S) {
        let e = self.0.entry(slot).or_insert((lo, hi, signal.clone()));
        if e.2.is_complete() {
            *e = (lo, hi, signal);
        } else {
            *e = (e.0.min(lo), e.1.max(hi), signal);
        }
    }

    /// The signal a host write over positions `lo..hi` of `slot` must wait for (incomplete and
    /// overlapping), if any; once it passed every recorded read of the slot has run, so the
    /// slot's entry is dropped (`take` semantics: call, wait for the result, write).
    pub(crate) fn take_conflict(&mut self, slot: u32, lo: u32, hi: u32) -> Option<S> {
        let &(a, b, ref s) = self.0.get(&slot)?;
        if s.is_complete() {
            self.0.remove(&slot);
            return None;
        }
        if a < hi && lo < b {
            return self.0.remove(&slot).map(|e| e.2);
        }
        None
    }

    /// Forgets a freed slot (its reuse waits for the publish that freed it, after every copy).
    pub(crate) fn forget(&mut self, slot: u32) {
        self.0.remove(&slot);
    }
}

/// A run of borrowed-page rows to fill from the pinned store: positions `position ..
/// position + rows` of `slot` into arena rows `dst_row .. dst_row + rows` (every layer). Whole
/// pages, so a run starts and ends on page boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FillRun {
    pub(crate) slot: u32,
    pub(crate) position: u32,
    pub(crate) dst_row: u32,
    pub(crate) rows: u32,
}

impl FillRun {
    /// The run's rows, one [`KvCopy`] each (the gather kernel's list).
    pub(crate) fn copies(&self) -> impl Iterator<Item = KvCopy> + '_ {
        (0..self.rows).map(move |i| KvCopy {
            slot: self.slot,
            position: self.position + i,
            dst_row: self.dst_row + i,
            pad: 0,
        })
    }
}

/// What the control plane changed since the last publish (see the module docs), in call order.
#[derive(Debug, Default)]
pub(crate) struct ChangeLog {
    /// Host store → arena rows nobody can be reading in fixed pages (tail rows of sessions
    /// created in this window): the copy stream; the step stream waits for them.
    pub(crate) fills: Vec<KvCopy>,
    /// Host store → arena rows of borrowed pages just lent (loans, growth, admissions' history):
    /// the copy stream, after `fills`; their page-table entries are mapped after them (ordered
    /// on the step stream, or deferred: see `MapAfterFill`). Kept as runs of consecutive
    /// positions on consecutive rows (O(pages) to log, one strided copy per run and layer to
    /// publish); the gather back-end expands them into rows at publish.
    pub(crate) page_runs: Vec<FillRun>,
    /// Row by row (the gather kernel's list): filled from `page_runs` at publish.
    pub(crate) page_fills: Vec<KvCopy>,
    /// Arena rows → host store (accepted drafts, rows the engine wrote): the step stream, first.
    pub(crate) write_backs: Vec<KvCopy>,
    /// Host store → arena rows of live sessions' tail and scratch: the step stream, after the
    /// write-backs (a resolve queued before may still read the rows they overwrite).
    pub(crate) step_copies: Vec<KvCopy>,
    /// Page-table entries `(slot, logical page, physical page or -1)`, last one wins.
    pub(crate) pages: Vec<(u32, u32, i32)>,
    /// Sessions whose descriptor (lengths, direct path) changed.
    pub(crate) touched: Vec<SessionId>,
}

impl ChangeLog {
    /// Drops the pending fills whose destination rows lie in physical page `page` (the control
    /// plane unmapped it; a later fill may target it in the same window). Only reclaim unmaps a
    /// page with fills pending: a finished session's pages (hand-back, fixed-page release) were
    /// filled in earlier windows, as `finish` publishes at once.
    pub(crate) fn drop_fills_into(&mut self, page: u32, page_rows: u32) {
        self.fills.retain(|c| c.dst_row / page_rows != page);
        self.page_fills.retain(|c| c.dst_row / page_rows != page);
        let (lo, hi) = (page * page_rows, (page + 1) * page_rows);
        if !self
            .page_runs
            .iter()
            .any(|r| r.dst_row < hi && lo < r.dst_row + r.rows)
        {
            return;
        }
        let mut kept = Vec::with_capacity(self.page_runs.len() + 1);
        for r in self.page_runs.drain(..) {
            let end = r.dst_row + r.rows;
            if end <= lo || r.dst_row >= hi {
                kept.push(r);
                continue;
            }
            if r.dst_row < lo {
                kept.push(FillRun {
                    rows: lo - r.dst_row,
                    ..r
                });
            }
            if end > hi {
                kept.push(FillRun {
                    slot: r.slot,
                    position: r.position + (hi - r.dst_row),
                    dst_row: hi,
                    rows: end - hi,
                });
            }
        }
        self.page_runs = kept;
    }

    /// Logs the fill of one borrowed page (`page_rows` rows), extending the last run where it
    /// continues it (same slot, next positions on the next rows).
    pub(crate) fn push_page_fill(&mut self, run: FillRun) {
        if let Some(last) = self.page_runs.last_mut() {
            if last.slot == run.slot
                && last.position + last.rows == run.position
                && last.dst_row + last.rows == run.dst_row
            {
                last.rows += run.rows;
                return;
            }
        }
        self.page_runs.push(run);
    }

    /// Logs the fill of borrowed page `page` (arena page) with logical page `logical` of
    /// `session` (in store slot `slot`): its rows' run and its page-table entry.
    pub(crate) fn fill_page(
        &mut self,
        session: SessionId,
        slot: u32,
        logical: u32,
        page: u32,
        page_rows: u32,
    ) {
        self.push_page_fill(FillRun {
            slot,
            position: logical * page_rows,
            dst_row: page * page_rows,
            rows: page_rows,
        });
        self.pages.push((slot, logical, page as i32));
        self.touch(session);
    }

    /// [`ChangeLog::fill_page`] for each `(logical, page)` of `pages`, in order (one
    /// reservation, one touch).
    pub(crate) fn fill_pages(
        &mut self,
        session: SessionId,
        slot: u32,
        pages: &[(u32, u32)],
        page_rows: u32,
    ) {
        self.pages.reserve(pages.len());
        for &(logical, page) in pages {
            self.push_page_fill(FillRun {
                slot,
                position: logical * page_rows,
                dst_row: page * page_rows,
                rows: page_rows,
            });
            self.pages.push((slot, logical, page as i32));
        }
        if !pages.is_empty() {
            self.touch(session);
        }
    }

    /// Logs the unmap of borrowed page `page` (logical page `logical` of `session` in `slot`).
    pub(crate) fn unmap_page(
        &mut self,
        session: SessionId,
        slot: u32,
        logical: u32,
        page: u32,
        page_rows: u32,
    ) {
        // The page may be taken again in this publish window (another admission of the same
        // `admit_batch` reserves or borrows it once `collect` frees it): its pending fills must
        // not run beside the new owner's in the same launch.
        self.drop_fills_into(page, page_rows);
        self.pages.push((slot, logical, tier_core::NOT_RESIDENT));
        self.touch(session);
    }

    /// `session`'s descriptor changed.
    pub(crate) fn touch(&mut self, session: SessionId) {
        if !self.touched.contains(&session) {
            self.touched.push(session);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fills.is_empty()
            && self.page_runs.is_empty()
            && self.page_fills.is_empty()
            && self.write_backs.is_empty()
            && self.step_copies.is_empty()
            && self.pages.is_empty()
            && self.touched.is_empty()
    }
}

/// The GPU back-end's data plane (see the module docs): the host store on [`PinnedBytes`], the
/// device state, and the log of what changed.
#[derive(Debug)]
pub struct GpuData {
    host: HostStore<PinnedBytes>,
    pub(crate) dev: GpuArena,
    pub(crate) log: ChangeLog,
    page_rows: u32,
}

impl GpuData {
    pub(crate) fn new(dev: GpuArena) -> Self {
        let d = *dev.dims();
        Self {
            host: HostStore::with_backing(d.row_bytes, d.layers, PinnedBytes::new(&dev)),
            dev,
            log: ChangeLog::default(),
            page_rows: d.page_rows,
        }
    }

    /// The device state.
    pub fn device(&self) -> &GpuArena {
        &self.dev
    }

    pub(crate) fn pinned_mut(&mut self) -> &mut PinnedBytes {
        self.host.backing_mut()
    }

    fn slot(&self, session: SessionId) -> u32 {
        self.host
            .backing()
            .slot_of(session)
            .expect("the control plane names live sessions")
    }
}

impl sealed::Sealed for GpuData {}

impl DataPlane for GpuData {
    type Bytes = PinnedBytes;

    fn host(&self) -> &HostStore<PinnedBytes> {
        &self.host
    }

    fn host_mut(&mut self) -> &mut HostStore<PinnedBytes> {
        &mut self.host
    }

    fn fill_page(&mut self, session: SessionId, logical: u32, page: u32) {
        let slot = self.slot(session);
        self.log
            .fill_page(session, slot, logical, page, self.page_rows);
    }

    fn fill_pages(&mut self, session: SessionId, pages: &[(u32, u32)]) {
        let slot = self.slot(session);
        self.log.fill_pages(session, slot, pages, self.page_rows);
    }

    fn unmap_page(&mut self, session: SessionId, logical: u32, page: u32) {
        let slot = self.slot(session);
        self.log
            .unmap_page(session, slot, logical, page, self.page_rows);
    }

    fn write_tail(&mut self, session: SessionId, position: u32, row: u32) {
        let slot = self.slot(session);
        let c = KvCopy {
            slot,
            position,
            dst_row: row,
            pad: 0,
        };
        // A session created in this window: its fixed pages were free (nobody reads them).
        if self.host.backing().created.contains(&slot) {
            self.log.fills.push(c);
        } else {
            self.log.step_copies.push(c);
        }
    }

    fn write_draft(&mut self, session: SessionId, position: u32, row: u32, token: &[u8]) {
        // The draft goes where it would be committed (past the committed bytes, unused until an
        // accept writes the same bytes back), so one copy kernel moves it like a tail row.
        self.host.backing_mut().write_at(session, position, token);
        let slot = self.slot(session);
        self.log.step_copies.push(KvCopy {
            slot,
            position,
            dst_row: row,
            pad: 0,
        });
    }

    fn commit_rows(&mut self, session: SessionId, rows: &[u32]) -> Result<u32> {
        let old = self.host.len(session)?;
        let new = self
            .host
            .append_device_written(session, rows.len() as u32)?;
        let slot = self.slot(session);
        for (i, &row) in rows.iter().enumerate() {
            self.log.write_backs.push(KvCopy {
                slot,
                position: old + i as u32,
                dst_row: row,
                pad: 0,
            });
        }
        Ok(new)
    }

    fn commit_written_rows(&mut self, session: SessionId, rows: &[u32]) -> Result<u32> {
        self.commit_rows(session, rows)
    }

    fn placement_changed(&mut self, session: SessionId) {
        self.log.touch(session);
    }

    fn row_holds(
        &self,
        _session: SessionId,
        _position: u32,
        _layer: u32,
        _row: u32,
    ) -> Option<bool> {
        None // the arena is on the device (the GPU exactness tests download it)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn fill(slot: u32, position: u32, dst_row: u32) -> KvCopy {
        KvCopy::new(slot, position, dst_row)
    }

    /// Bug 2: drafts at positions 10..14 of slot 0 are read by a queued step copy; after
    /// `accept(1)` the next drafts (or an append) go to 11.. and must wait for that copy; writes
    /// elsewhere, or after the copy ran, do not wait.
    #[test]
    fn host_writes_over_queued_draft_reads_wait() {
        let mut d = DraftReads::default();
        let copy = tier_core::FlagSignal::new();
        d.record(0, 10, 14, copy.clone());
        assert!(d.take_conflict(1, 10, 14).is_none(), "other slot");
        assert!(d.take_conflict(0, 14, 16).is_none(), "past the drafts");
        assert!(
            d.take_conflict(0, 11, 14).is_some(),
            "rewrites queued draft bytes"
        );
        // A second window: drafts 14..16 read after `later`; merged with 10..14 while pending.
        let later = tier_core::FlagSignal::new();
        d.record(0, 10, 14, copy.clone());
        d.record(0, 14, 16, later.clone());
        assert!(
            d.take_conflict(0, 10, 11).is_some(),
            "merged range, latest signal"
        );
        d.record(0, 10, 14, copy.clone());
        copy.complete();
        assert!(d.take_conflict(0, 11, 14).is_none(), "the copy ran");
        d.record(0, 10, 12, later);
        d.forget(0);
        assert!(d.take_conflict(0, 10, 12).is_none());
    }

    /// Page fills are logged as runs (O(pages)); dropping a page's fills splits its run.
    #[test]
    fn page_fills_coalesce_into_runs_and_split_on_unmap() {
        let pr = 4;
        let mut log = ChangeLog::default();
        for (logical, page) in [(0, 5), (1, 6), (2, 7), (3, 9)] {
            log.push_page_fill(FillRun {
                slot: 1,
                position: logical * pr,
                dst_row: page * pr,
                rows: pr,
            });
        }
        let run = |position, dst_row, rows| FillRun {
            slot: 1,
            position,
            dst_row,
            rows,
        };
        assert_eq!(log.page_runs, [run(0, 20, 12), run(12, 36, 4)]);
        log.drop_fills_into(6, pr);
        assert_eq!(
            log.page_runs,
            [run(0, 20, 4), run(8, 28, 4), run(12, 36, 4)]
        );
        log.drop_fills_into(9, pr);
        let rows: Vec<KvCopy> = log.page_runs.iter().flat_map(|r| r.copies()).collect();
        assert_eq!(rows.len(), 8);
        assert_eq!((rows[4].position, rows[4].dst_row), (8, 28));
        assert!(!log.is_empty());
    }

    /// The bulk log of a loan equals the page-by-page one (runs, entries, touched once).
    #[test]
    fn fill_pages_logs_as_fill_page_does() {
        let pr = 4;
        let pages = [(0, 5), (1, 6), (2, 7), (3, 9), (7, 2), (8, 3)];
        let (mut one, mut bulk) = (ChangeLog::default(), ChangeLog::default());
        for &(logical, page) in &pages {
            one.fill_page(42, 1, logical, page, pr);
        }
        bulk.fill_pages(42, 1, &pages, pr);
        bulk.fill_pages(43, 2, &[], pr);
        assert_eq!(bulk.page_runs, one.page_runs);
        assert_eq!(bulk.page_runs.len(), 3);
        assert_eq!(bulk.pages, one.pages);
        assert_eq!(bulk.touched, [42]);
        assert_eq!(one.touched, [42]);
    }

    /// Bug: session A's fills into page 2 were still pending when B reclaimed page 2 and logged
    /// its tail fills into it; both ran in one replay launch. Unmapping drops A's fills only.
    #[test]
    fn unmapped_page_drops_its_pending_fills() {
        let pr = 4;
        let mut log = ChangeLog::default();
        for i in 0..pr {
            log.page_fills.push(fill(0, 8 + i, 2 * pr + i)); // A, logical page 2 -> page 2
            log.page_fills.push(fill(0, 12 + i, 3 * pr + i)); // A, logical page 3 -> page 3
        }
        log.drop_fills_into(2, pr);
        assert!(log.page_fills.iter().all(|c| c.dst_row / pr == 3));
        assert_eq!(log.page_fills.len(), pr as usize);
        // B's tail rows land in page 2 afterwards and stay the only fills there.
        log.fills.push(fill(1, 40, 2 * pr));
        assert_eq!(
            log.fills.iter().filter(|c| c.dst_row / pr == 2).count(),
            1,
            "one writer per row"
        );
    }
}
