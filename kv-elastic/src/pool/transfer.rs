//! Transfers in place (prefill/decode disaggregation): zero-copy imports into reserved rows of
//! the host store (`reserve` / `commit` / `abort`, with a deterministic timeout) and exports
//! whose rows stay pinned until the transfer reports completion. Needs a region-backed store
//! ([`ElasticPool::with_store`], or the GPU pool's pinned store).
//!
//! An import is a session in the making: its rows are a run of its store slot that a transfer
//! agent writes in place; its fixed pages are reserved at the first `reserve`, so the `commit`
//! that publishes it never waits for room and moves no history byte on the host. Until then the
//! session is invisible (every call naming it gets `SessionImporting`), no page is lent to it,
//! no reclaim, hand-back or growth touches its pages or rows, and its slot is no one else's.

use std::ops::Range;

use tier_core::{PageHandle, PageMap};

use super::{Admission, AdmitOptions, ElasticPool};
use crate::control::SessionState;
use crate::data::{DataPlane, HostBytes, RegionDesc, SessionId, StoreLayout, TeardownHook};
use crate::error::{KvError, Result};

/// `between_steps` calls after its last `reserve` before an import that was not committed
/// times out into an abort ([`ElasticPool::set_import_timeout`]): 1000, about 20–50 s of decode
/// steps at 20–50 ms each, well past a healthy RDMA transfer of a long history.
pub const DEFAULT_IMPORT_TIMEOUT_STEPS: u32 = 1000;

/// Rows `start..end` of a session in the host store's region: one contiguous byte run (the store
/// is token-major), `[end - start][layers][row_bytes]` bytes at `addr` (= the region's address +
/// `offset`). What a transfer agent writes (an import) or reads (an export).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RowSpan {
    /// Session.
    pub session: SessionId,
    /// First position.
    pub start: u32,
    /// One past the last position.
    pub end: u32,
    /// The session's slot in the store layout.
    pub slot: u32,
    /// Byte offset from the region's start.
    pub offset: u64,
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Bytes (`(end - start) × token_bytes`).
    pub len: u64,
}

/// The outcome of [`ElasticPool::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The rows are reserved; write them, then `commit`.
    Reserved(RowSpan),
    /// A new import's fixed pages wait for readers in flight (borrowed pages were reclaimed for
    /// them, as an admission does); nothing was reserved. Call again after `between_steps`.
    Waiting {
        /// Pages waiting behind reader fences.
        pending: u32,
    },
}

/// An import in flight (see [`ElasticPool::imports`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImportInfo {
    /// Session.
    pub session: SessionId,
    /// The reserved rows as sorted, disjoint ranges (adjacent reservations merged: a writer
    /// reserving row by row holds one range).
    pub ranges: Vec<Range<u32>>,
    /// `between_steps` calls since the last `reserve`.
    pub idle_steps: u32,
    /// Timed out: pages given back, rows held until `abort`.
    pub expired: bool,
}

/// Running totals of imports and exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransferCounters {
    /// Imports started (first `reserve` of a session).
    pub imports: u64,
    /// Imports committed.
    pub committed: u64,
    /// Imports aborted (by the engine, after a timeout too).
    pub aborted: u64,
    /// Imports that timed out.
    pub expired: u64,
    /// Exports started.
    pub exports: u64,
    /// Exports completed.
    pub exports_done: u64,
}

/// One import's control state.
#[derive(Debug)]
pub(crate) struct ImportState {
    /// Fixed pages reserved for the session (empty once expired).
    fixed: Vec<PageHandle>,
    /// Sorted, disjoint, adjacent ones merged ([`add_range`]).
    ranges: Vec<Range<u32>>,
    idle: u32,
    expired: bool,
}

impl<D: DataPlane> ElasticPool<D> {
    /// The host store's region and the layout of its rows (`None` for the default CPU store, a
    /// `Vec` per session). Register the region once with a transfer agent.
    pub fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        self.data.host().region()
    }

    /// The host store's memory by its own accounting (see [`crate::HostMemory`]).
    pub fn host_memory(&self) -> crate::HostMemory {
        self.data.host().memory()
    }

    /// Adds a teardown hook to the host store's region (a transfer agent's deregistration): it
    /// runs when the pool is dropped, before the region's memory is unlocked and freed. Errors:
    /// `Unsupported` for a store without a region.
    pub fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        self.data.host_mut().on_teardown(hook)
    }

    fn layout(&self) -> Result<(RegionDesc, StoreLayout)> {
        self.region().ok_or(KvError::Unsupported(
            "transfers need a region-backed host store (ElasticPool::with_store)",
        ))
    }

    fn span(&self, session: SessionId, slot: u32, rows: Range<u32>) -> Result<RowSpan> {
        let (desc, layout) = self.layout()?;
        let offset = layout.offset(slot, rows.start, 0);
        Ok(RowSpan {
            session,
            start: rows.start,
            end: rows.end,
            slot,
            offset,
            addr: desc.addr + offset,
            len: (rows.end - rows.start) as u64 * layout.token_bytes(),
        })
    }

    /// Reserves rows `rows` (positions, `start < end <= max_history`) of `session` for a
    /// transfer agent to write in place; returns their byte run. The first reservation of a
    /// session starts its import: it takes a store slot and the session's fixed pages (as
    /// [`ElasticPool::admit`] does: hand-back, then reclaim of others' borrowed pages;
    /// [`Reserve::Waiting`] when those wait for readers). Later reservations add row ranges
    /// (chunked or layer-by-layer pushes) and restart the import's timeout. The rows are
    /// invisible to resolves and untouched by loans, reclaim and other sessions until
    /// [`ElasticPool::commit`] or [`ElasticPool::abort`].
    ///
    /// Errors (nothing changes): `RowsBeyondRegion` (empty, or past `max_history`),
    /// `OverlappingReserve`, `ImportExpired`, `SessionExists` (live or finished id),
    /// `Unsupported` (no region), `StoreCapacity` or the GPU's capacity error (no free slot),
    /// `NoRoom`, `OutOfMemory`.
    pub fn reserve(&mut self, session: SessionId, rows: Range<u32>) -> Result<Reserve> {
        let (_, layout) = self.layout()?;
        if rows.start >= rows.end || rows.end > layout.max_history {
            return Err(KvError::RowsBeyondRegion {
                session,
                start: rows.start,
                end: rows.end,
                limit: layout.max_history,
            });
        }
        if let Some(imp) = self.ctl.imports.get_mut(&session) {
            if imp.expired {
                return Err(KvError::ImportExpired(session));
            }
            if !add_range(&mut imp.ranges, rows.clone())? {
                return Err(KvError::OverlappingReserve {
                    session,
                    start: rows.start,
                    end: rows.end,
                });
            }
            imp.idle = 0;
            let slot = self.data.host().slot(session).expect("importing");
            return Ok(Reserve::Reserved(self.span(session, slot, rows)?));
        }
        self.data.host().check_new(session)?;
        self.data.host().backing().check_room(0)?;
        let ranges = tier_core::alloc::try_copied(std::slice::from_ref(&rows), "import rows")?;
        let fixed = match self.take_fixed_pages()? {
            Ok(fixed) => fixed,
            Err(pending) => return Ok(Reserve::Waiting { pending }),
        };
        let slot = match self.data.host_mut().reserve_import(session) {
            Ok(slot) => slot,
            Err(e) => {
                self.ctl.pages.release_fixed(fixed)?;
                self.ctl.pages.collect();
                return Err(e);
            }
        };
        self.ctl.imports.insert(
            session,
            ImportState {
                fixed,
                ranges,
                idle: 0,
                expired: false,
            },
        );
        self.ctl.transfers.imports += 1;
        Ok(Reserve::Reserved(self.span(session, slot, rows)?))
    }

    /// Publishes an import: its reserved rows (which must cover `0..n` without a gap) become
    /// the session's committed history of `n` tokens, as an admission of those bytes would —
    /// but no history byte moves on the host: the session takes the fixed pages reserved for
    /// it, its tail rows and borrowed pages are filled from the store (the GPU pool enqueues
    /// them on its streams). Call once the transfer agent reported the writes complete.
    ///
    /// Errors (nothing changes): `NoImport` (commit without reserve, or after an abort),
    /// `ImportExpired` (timed out: a writer outliving its session), `ImportIncomplete`,
    /// `OutOfMemory`.
    pub fn commit(&mut self, session: SessionId) -> Result<Admission> {
        let imp = self
            .ctl
            .imports
            .get(&session)
            .ok_or(KvError::NoImport(session))?;
        if imp.expired {
            return Err(KvError::ImportExpired(session));
        }
        // Sorted and merged: complete when one range starts at 0.
        let n = match imp.ranges.as_slice() {
            [r] if r.start == 0 => r.end,
            rs => {
                return Err(KvError::ImportIncomplete {
                    session,
                    missing: rs
                        .first()
                        .map_or(0, |r| if r.start == 0 { r.end } else { 0 }),
                })
            }
        };
        let pages = PageMap::new(n / self.ctl.geometry.page_rows)?;
        let (hot, call) = SessionState::try_new_hot(&self.ctl.geometry, n)?;
        self.data.host_mut().commit_import(session, n)?;
        let imp = self.ctl.imports.remove(&session).expect("checked above");
        self.ctl.transfers.committed += 1;
        self.install_session(
            session,
            n,
            imp.fixed,
            (pages, hot, call),
            AdmitOptions::default().max_borrowed_pages,
        )
    }

    /// Drops an import whose writer is gone (failed, cancelled, or timed out): its fixed pages
    /// go back through the reader fence, its slot is free again, and the session id was never
    /// live (it may be reserved again). The pool is as before the first `reserve`, except for
    /// borrowed pages that reservation reclaimed from others. Errors: `NoImport`.
    pub fn abort(&mut self, session: SessionId) -> Result<()> {
        let imp = self
            .ctl
            .imports
            .remove(&session)
            .ok_or(KvError::NoImport(session))?;
        self.ctl.pages.release_fixed(imp.fixed)?;
        self.data
            .host_mut()
            .abort_import(session)
            .expect("an import holds its slot");
        self.ctl.pages.collect();
        self.ctl.transfers.aborted += 1;
        Ok(())
    }

    /// Sets after how many `between_steps` calls without a `reserve` an uncommitted import times
    /// out (default [`DEFAULT_IMPORT_TIMEOUT_STEPS`]). Errors: `InvalidConfig` for 0.
    pub fn set_import_timeout(&mut self, steps: u32) -> Result<()> {
        if steps == 0 {
            return Err(KvError::InvalidConfig(
                "import timeout: at least 1 between_steps call".into(),
            ));
        }
        self.ctl.import_timeout = steps;
        Ok(())
    }

    /// The import timeout in `between_steps` calls.
    pub fn import_timeout(&self) -> u32 {
        self.ctl.import_timeout
    }

    /// Imports in flight (ascending session id).
    pub fn imports(&self) -> Vec<ImportInfo> {
        self.ctl
            .imports
            .iter()
            .map(|(&session, i)| ImportInfo {
                session,
                ranges: i.ranges.clone(),
                idle_steps: i.idle,
                expired: i.expired,
            })
            .collect()
    }

    /// Running totals of imports and exports.
    pub fn transfer_counters(&self) -> TransferCounters {
        self.ctl.transfers
    }

    /// Fixed pages held by imports in flight (not expired).
    pub(super) fn import_fixed_pages(&self) -> u32 {
        self.ctl
            .imports
            .values()
            .map(|i| i.fixed.len() as u32)
            .sum()
    }

    /// Ages the imports by one `between_steps` call; those reaching the timeout expire: their
    /// fixed pages go back through the fence, their rows stay held until `abort`. Returns how
    /// many expired.
    pub(super) fn age_imports(&mut self) -> Result<u32> {
        let timeout = self.ctl.import_timeout;
        let mut expired = 0;
        for imp in self.ctl.imports.values_mut() {
            if imp.expired {
                continue;
            }
            imp.idle = imp.idle.saturating_add(1);
            if imp.idle >= timeout {
                imp.expired = true;
                self.ctl
                    .pages
                    .release_fixed(std::mem::take(&mut imp.fixed))?;
                expired += 1;
            }
        }
        self.ctl.transfers.expired += expired as u64;
        Ok(expired)
    }

    /// Pins a live session's committed rows (`0..committed`) for a transfer agent to read
    /// (prefill side): they stay in place, and the slot is not reused even after the session
    /// finishes, until [`ElasticPool::export_done`]. Appends after the export go past them.
    /// Errors: session errors, `Unsupported` (no region).
    pub fn export(&mut self, session: SessionId) -> Result<RowSpan> {
        let committed = self.session(session)?.committed;
        self.layout()?;
        self.data.host_mut().export(session)?;
        let slot = self.data.host().slot(session).expect("live");
        self.ctl.transfers.exports += 1;
        self.span(session, slot, 0..committed)
    }

    /// The transfer reading an export of `session` completed (its rows may be reused once no
    /// export of them is open and the session finished). Errors: `NoExport`.
    pub fn export_done(&mut self, session: SessionId) -> Result<()> {
        self.data.host_mut().export_done(session)?;
        self.ctl.transfers.exports_done += 1;
        Ok(())
    }

    /// Open exports of a session (live or finished).
    pub fn exports_of(&self, session: SessionId) -> u32 {
        self.data.host().exports_of(session)
    }
}

/// Adds `rows` to `ranges` (sorted, disjoint, adjacent ranges merged), in `O(log n)` but for the
/// rare insert of a range adjacent to none: `Ok(false)` when `rows` overlaps a range (nothing
/// changes). A writer reserving row by row used to cost a scan of every earlier range per call
/// (100,000 one-row reserves: minutes).
///
/// Errors: `OutOfMemory` (nothing changes).
fn add_range(ranges: &mut Vec<Range<u32>>, rows: Range<u32>) -> Result<bool> {
    // The first range ending after `rows.start` is the only one that can overlap (ends grow).
    let j = ranges.partition_point(|r| r.end <= rows.start);
    if ranges.get(j).is_some_and(|r| r.start < rows.end) {
        return Ok(false);
    }
    let left = j > 0 && ranges[j - 1].end == rows.start;
    let right = ranges.get(j).is_some_and(|r| r.start == rows.end);
    match (left, right) {
        (true, true) => {
            ranges[j - 1].end = ranges[j].end;
            ranges.remove(j);
        }
        (true, false) => ranges[j - 1].end = rows.end,
        (false, true) => ranges[j].start = rows.start,
        (false, false) => {
            tier_core::alloc::try_reserve(ranges, 1, "import row ranges")?;
            ranges.insert(j, rows);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_stay_sorted_disjoint_and_merged() {
        let mut r = Vec::new();
        for (rows, added) in [
            (10..12, true),
            (0..4, true),
            (4..6, true),    // merges left
            (8..10, true),   // merges right
            (6..8, true),    // joins both
            (11..13, false), // overlaps
            (0..1, false),
            (12..12 + 1, true),
            (20..30, true),
            (15..21, false),
            (13..20, true),
        ] {
            assert_eq!(add_range(&mut r, rows.clone()).unwrap(), added, "{rows:?}");
        }
        assert_eq!(r, vec![0..30]);
        // Row by row: one range, whatever the count.
        let mut r = Vec::new();
        for i in 0..100_000u32 {
            assert!(add_range(&mut r, i..i + 1).unwrap());
        }
        assert_eq!(r, vec![0..100_000]);
        // Every other row, then the gaps in reverse: sorted and merged at the end.
        let mut r = Vec::new();
        for i in (0..2_000u32).step_by(2) {
            assert!(add_range(&mut r, i..i + 1).unwrap());
        }
        assert_eq!(r.len(), 1_000);
        for i in (1..2_000u32).step_by(2).rev() {
            assert!(add_range(&mut r, i..i + 1).unwrap());
        }
        assert_eq!(r, vec![0..2_000]);
    }
}
