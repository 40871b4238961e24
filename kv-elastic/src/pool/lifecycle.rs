//! Session lifecycle and page movement between steps: admit, append, drafts (write / accept),
//! finish, reclaim, and the bounded hand-back / growth of [`ElasticPool::between_steps`]. The
//! control plane decides (pages, loans, tables); the data plane then moves the bytes.

use tier_core::PageMap;

use super::{Admission, AdmitOptions, ElasticPool, StepMaintenance, StepOptions};
use crate::control::{HotCache, SessionState};
use crate::data::{DataPlane, HostBytes, SessionId};
use crate::error::{KvError, Result};

impl<D: DataPlane> ElasticPool<D> {
    /// Lends up to `max` free pages to `session` for its newest unheld wanted pages; copies them in.
    fn borrow_newest(&mut self, session: SessionId, max: u32) -> Result<u32> {
        let r = &self.ctl.sessions[&session];
        let wanted = self.wanted_pages(r.committed);
        let mut logical = Vec::new();
        let mut j = wanted;
        let budget = max.min(self.ctl.pages.free_count());
        while j > 0 && (logical.len() as u32) < budget {
            j -= 1;
            if r.pages.table()[j as usize] < 0 {
                logical.push(j);
            }
        }
        if logical.is_empty() {
            return Ok(0);
        }
        // Chosen newest first, lent in position order: free pages come out in ascending order
        // from a fresh pool, so a history lands on consecutive arena rows and its fill is one
        // run (the GPU pool copies a run with one strided copy per layer).
        logical.reverse();
        let loans = self.ctl.pages.lend_history(session, &logical)?;
        let filled: Vec<(u32, u32)> = loans
            .iter()
            .map(|l| (l.logical, l.handle.page().0))
            .collect();
        let r = self.ctl.sessions.get_mut(&session).expect("live");
        // Each page mapped is filled (also those mapped before a failing `set`), as when the
        // pages were mapped and filled one by one.
        let mut mapped = 0;
        let set = filled.iter().try_for_each(|&(logical, page)| {
            r.pages.set(logical, tier_core::PageId(page))?;
            mapped += 1;
            Ok::<_, tier_core::CoreError>(())
        });
        self.data.fill_pages(session, &filled[..mapped]);
        self.ctl.counters.page_fill_tokens += mapped as u64 * self.ctl.geometry.page_rows as u64;
        set?;
        self.ctl.counters.pages_lent += loans.len() as u64;
        Ok(loans.len() as u32)
    }

    /// Admits a session with its committed history (`[tokens][layers][row_bytes]` bytes, at least
    /// one token): takes its fixed pages (hot cache + tail + scratch) — if the pool runs short, first
    /// from finished sessions' queued pages, then by reclaiming borrowed pages of others — writes the tail, and — in elastic mode — borrows free pages for
    /// as much of its history as fits, newest first, copying that history in.
    ///
    /// Errors (nothing changes): `SessionExists`, `RaggedRows`, `EmptyHistory`,
    /// `NoRoom` (fixed rows do not fit even after reclaiming every borrowed page), `OutOfMemory`
    /// (the host cannot hold the history's copy or the session's tables: everything the session
    /// needs in host memory is allocated before anything changes).
    /// [`Admission::Waiting`] is not an error: pages were reclaimed (a requested effect) but wait for
    /// readers in flight; the session was not created.
    pub fn admit(&mut self, session: SessionId, history: &[u8]) -> Result<Admission> {
        self.admit_with(session, history, AdmitOptions::default())
    }

    /// [`ElasticPool::admit`], borrowing at most `options.max_borrowed_pages` elastic pages for
    /// the history (0: the session starts on its hot cache alone, e.g. an engine that lands a
    /// request in host memory when its whole history does not fit). Errors as `admit`.
    pub fn admit_with(
        &mut self,
        session: SessionId,
        history: &[u8],
        options: AdmitOptions,
    ) -> Result<Admission> {
        self.data.host().check_new(session)?;
        let n = self.data.host().check_tokens(history, false)?;
        self.data.host().backing().check_room(history.len())?;
        // Host memory first: an admission the host cannot hold is `OutOfMemory` before any page
        // moves.
        let pages = PageMap::new(n / self.ctl.geometry.page_rows)?;
        let (hot, call) = SessionState::try_new_hot(&self.ctl.geometry, n)?;
        self.data.host_mut().reserve_new(history.len())?;
        let admitted = self.admit_reserved(
            session,
            history,
            n,
            (pages, hot, call),
            options.max_borrowed_pages,
        );
        // The reserved buffer when no session was created (nothing once one was).
        self.data.host_mut().release_reserved();
        admitted
    }

    /// [`ElasticPool::admit`] once the host memory is reserved: fixed pages, then the session.
    fn admit_reserved(
        &mut self,
        session: SessionId,
        history: &[u8],
        n: u32,
        (pages, hot, call): (PageMap, Vec<HotCache>, Vec<u64>),
        max_borrowed_pages: u32,
    ) -> Result<Admission> {
        let fixed = match self.take_fixed_pages()? {
            Ok(fixed) => fixed,
            Err(pending) => return Ok(Admission::Waiting { pending }),
        };
        self.data
            .host_mut()
            .create(session, history)
            .expect("checked above (check_new, check_room, reserve_new)");
        self.install_session(session, n, fixed, (pages, hot, call), max_borrowed_pages)
    }

    /// Takes one session's fixed pages — if the pool runs short, first from finished sessions'
    /// queued pages, then by reclaiming borrowed pages of others. `Ok(Err(pending))` when the
    /// freed pages still wait for readers in flight (nothing taken; the reclaims stay).
    /// Errors: `NoRoom` (not enough pages even after reclaiming every borrowed one).
    pub(super) fn take_fixed_pages(
        &mut self,
    ) -> Result<std::result::Result<Vec<tier_core::PageHandle>, u32>> {
        let f = self.ctl.geometry.fixed_pages();
        self.ctl.pages.collect();
        if self.ctl.pages.free_count() < f {
            let lent_elastic = self.elastic_lent();
            let pending = self.ctl.pages.pending_count();
            let queued = self.ctl.pages.queued_count();
            let available = self.ctl.pages.free_count() + pending + queued + lent_elastic;
            if available < f {
                return Err(KvError::NoRoom {
                    needed: f,
                    available,
                });
            }
            // Pages of finished sessions go first (no one reads them any more).
            let handed = self.ctl.pages.hand_back(f);
            self.ctl.counters.pages_handed_back += handed as u64;
            self.ctl.pages.collect();
            let short =
                f.saturating_sub(self.ctl.pages.free_count() + self.ctl.pages.pending_count());
            if short > 0 {
                self.reclaim_pages(short)?;
            }
            self.ctl.pages.collect();
            if self.ctl.pages.free_count() < f {
                return Ok(Err(self.ctl.pages.pending_count()));
            }
        }
        Ok(Ok(self.ctl.pages.take_fixed(f)?))
    }

    /// A session whose `n` committed tokens are in the host store becomes live on its fixed
    /// pages: tail rows written, at most `max_borrowed_pages` history pages borrowed (elastic
    /// mode), placement published.
    pub(super) fn install_session(
        &mut self,
        session: SessionId,
        n: u32,
        fixed: Vec<tier_core::PageHandle>,
        (pages, hot, call): (PageMap, Vec<HotCache>, Vec<u64>),
        max_borrowed_pages: u32,
    ) -> Result<Admission> {
        let fixed_pages = fixed.iter().map(|h| h.page().0).collect();
        let req = SessionState {
            committed: n,
            scratch_len: 0,
            fixed,
            fixed_pages,
            pages,
            hot,
            call,
        };
        self.ctl.sessions.insert(session, req);
        self.write_tail(session, 0, n);
        self.ctl.counters.admitted += 1;
        let borrowed = if self.ctl.config.elastic {
            self.borrow_newest(session, max_borrowed_pages)?
        } else {
            0
        };
        self.data.placement_changed(session);
        Ok(Admission::Admitted {
            borrowed_pages: borrowed,
        })
    }

    /// Writes the tail rows of positions `from..to` that are still among the newest `tail_rows`.
    fn write_tail(&mut self, session: SessionId, from: u32, to: u32) {
        let start = from.max(to.saturating_sub(self.ctl.geometry.tail_rows));
        for p in start..to {
            let row = self.tail_row(&self.ctl.sessions[&session], p);
            self.data.write_tail(session, p, row);
        }
    }

    /// Appends committed tokens (`[tokens][layers][row_bytes]`) to a live session: host store,
    /// then the tail ring. Clears the session's scratch (drafts are relative to the old length).
    /// Errors (nothing changes): `UnknownSession`, `SessionFinished`, `RaggedRows`,
    /// `OutOfMemory` (the host cannot hold the longer history or its tables).
    pub fn append(&mut self, session: SessionId, tokens: &[u8]) -> Result<u32> {
        self.session(session)?;
        let n = self.data.host().check_tokens(tokens, true)?;
        let old = self.ctl.sessions[&session].committed;
        self.reserve_growth(session, old.saturating_add(n))?;
        let new = self.data.host_mut().append(session, tokens)?;
        self.appended(session, old, new, true)
    }

    /// Reserves the host memory a live session's tables need to grow to `committed` positions
    /// (hot-cache position table, page table), so [`Self::appended`] allocates nothing after the
    /// history grew. Errors: `OutOfMemory` (nothing changed).
    fn reserve_growth(&mut self, session: SessionId, committed: u32) -> Result<()> {
        let pr = self.ctl.geometry.page_rows;
        let r = self.ctl.sessions.get_mut(&session).expect("live");
        for h in &mut r.hot {
            h.reserve(committed)?;
        }
        r.pages.reserve(committed / pr)?;
        Ok(())
    }

    /// Appends `n` committed tokens whose rows the engine already wrote into the session's tail
    /// rows on the device ([`ElasticPool::tail_row_of`] of positions `committed .. committed + n`,
    /// `n <= tail_rows`); the data plane writes them back to the host store (GPU: a write-back
    /// kernel on the step stream, no host sync). Clears the scratch. Errors: session errors,
    /// `ScratchOverflow` when `n > tail_rows` (named as the tail's rows), `Unsupported` on the CPU
    /// pool (its arena is the host's: use [`ElasticPool::append`]), `OutOfMemory` (the session's
    /// tables cannot grow).
    pub fn append_written(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.session(session)?;
        let tail = self.ctl.geometry.tail_rows;
        if n > tail {
            return Err(KvError::ScratchOverflow {
                session,
                scratch_rows: tail,
                requested: n,
            });
        }
        let old = self.ctl.sessions[&session].committed;
        self.reserve_growth(session, old.saturating_add(n))?;
        let r = &self.ctl.sessions[&session];
        let rows: Vec<u32> = (old..old + n).map(|p| self.tail_row(r, p)).collect();
        let new = self.data.commit_written_rows(session, &rows)?;
        self.appended(session, old, new, false)
    }

    /// The arena row (all layers, same row in every plane) of a live session's tail slot for
    /// `position` (`position % tail_rows`): where the engine writes a new token's KV before
    /// [`ElasticPool::append_written`]. Errors: `UnknownSession`, `SessionFinished`.
    pub fn tail_row_of(&self, session: SessionId, position: u32) -> Result<u32> {
        self.session(session).map(|r| self.tail_row(r, position))
    }

    /// The control plane's side of an append of `old .. new`: lengths, tables, tail rows (unless
    /// they already hold the tokens), the scratch cleared.
    fn appended(
        &mut self,
        session: SessionId,
        old: u32,
        new: u32,
        write_tail: bool,
    ) -> Result<u32> {
        let pr = self.ctl.geometry.page_rows;
        {
            let r = self.ctl.sessions.get_mut(&session).expect("live");
            r.committed = new;
            r.scratch_len = 0;
            r.hot.iter_mut().for_each(|h| h.grow(new));
            r.pages.resize(new / pr)?;
        }
        if write_tail {
            self.write_tail(session, old, new);
        }
        self.data.placement_changed(session);
        Ok(new)
    }

    /// Writes draft tokens (speculative decoding) into the session's scratch after those already
    /// there; they are visible to resolves (positions `committed..committed + scratch_len`) but are
    /// not history until [`ElasticPool::accept`]. Errors: session errors, `RaggedRows`,
    /// `ScratchOverflow`.
    pub fn write_scratch(&mut self, session: SessionId, tokens: &[u8]) -> Result<()> {
        let r = self.session(session)?;
        let n = self.data.host().check_tokens(tokens, true)?;
        if r.scratch_len + n > self.ctl.geometry.scratch_rows {
            return Err(KvError::ScratchOverflow {
                session,
                scratch_rows: self.ctl.geometry.scratch_rows,
                requested: r.scratch_len + n,
            });
        }
        let tb = self.ctl.geometry.token_bytes();
        for i in 0..n {
            let r = &self.ctl.sessions[&session];
            let row = self.scratch_row(r, r.scratch_len + i);
            let position = r.committed + r.scratch_len + i;
            self.data.write_draft(
                session,
                position,
                row,
                &tokens[i as usize * tb..(i as usize + 1) * tb],
            );
        }
        self.ctl
            .sessions
            .get_mut(&session)
            .expect("live")
            .scratch_len += n;
        self.data.placement_changed(session);
        Ok(())
    }

    /// Commits the first `n` scratch tokens as history (verification accepted them) and drops the
    /// rest. Only committed history is eligible for the elastic tier. Errors: session errors,
    /// `ScratchOverflow` when `n > scratch_len`, `OutOfMemory` (the host cannot hold the longer
    /// history); nothing changes on an error.
    pub fn accept(&mut self, session: SessionId, n: u32) -> Result<u32> {
        let r = self.session(session)?;
        if n > r.scratch_len {
            return Err(KvError::ScratchOverflow {
                session,
                scratch_rows: r.scratch_len,
                requested: n,
            });
        }
        let rows: Vec<u32> = (0..n).map(|i| self.scratch_row(r, i)).collect();
        let old = r.committed;
        self.reserve_growth(session, old + n)?;
        let new = self.data.commit_rows(session, &rows)?;
        self.appended(session, old, new, true)
    }

    /// Finishes a session: its fixed pages go back through the reader fence at once, its borrowed
    /// pages are queued and handed back to others in bounded chunks by
    /// [`ElasticPool::between_steps`]. Errors (nothing changes): `UnknownSession`, `SessionFinished`,
    /// `OutOfMemory` (no room to remember the finished id).
    pub fn finish(&mut self, session: SessionId) -> Result<()> {
        self.session(session)?;
        self.data.host_mut().reserve_finish()?;
        let r = self.ctl.sessions.remove(&session).expect("live");
        self.ctl.pages.release_fixed(r.fixed)?;
        self.ctl.pages.finish_history(session)?;
        self.data.host_mut().finish(session)?;
        self.ctl.counters.finished += 1;
        Ok(())
    }

    fn reclaim_pages(&mut self, n: u32) -> Result<u32> {
        // The lender asks the policy for exactly min(n, lent) pages; fixed pages are never offered.
        let n = n.min(self.elastic_lent());
        let loans = self.ctl.pages.reclaim_history(n)?;
        for loan in &loans {
            if let Some(r) = self.ctl.sessions.get_mut(&loan.borrower.0) {
                r.pages.clear(loan.logical)?;
                self.data
                    .unmap_page(loan.borrower.0, loan.logical, loan.handle.page().0);
            }
        }
        self.ctl.counters.pages_reclaimed += loans.len() as u64;
        Ok(loans.len() as u32)
    }

    /// Reclaims up to `n` borrowed pages under pressure: oldest history first, in proportion to
    /// holdings ([`tier_core::ProportionalOldestFirst`]). The owners stop mapping them at once; the pages become
    /// free only after every reader in flight has completed. Returns the pages reclaimed.
    pub fn reclaim(&mut self, n: u32) -> Result<u32> {
        let got = self.reclaim_pages(n)?;
        self.ctl.pages.collect();
        Ok(got)
    }

    /// Takes back borrowed pages `logical` (history page indices) of one live session, in an
    /// order the caller chose (e.g. an engine's own free queue, or all of a request's pages when
    /// it is demoted to its hot cache); [`ElasticPool::reclaim`] is the pool's own order.
    /// Indices the session does not hold are skipped. The session stops mapping the pages at
    /// once; they become free only after every reader in flight has completed (reader fence),
    /// and count as reclaimed. Returns the pages taken back. Errors: `UnknownSession`,
    /// `SessionFinished`, `OutOfMemory` (the sorted copy of `logical`).
    pub fn revoke(&mut self, session: SessionId, logical: &[u32]) -> Result<u32> {
        self.session(session)?;
        let loans = self.ctl.pages.revoke_history(session, logical)?;
        let r = self.ctl.sessions.get_mut(&session).expect("live");
        for loan in &loans {
            r.pages.clear(loan.logical)?;
            self.data
                .unmap_page(session, loan.logical, loan.handle.page().0);
        }
        self.ctl.counters.pages_reclaimed += loans.len() as u64;
        self.ctl.pages.collect();
        Ok(loans.len() as u32)
    }

    /// Lends up to `max` free pages to one live session for the newest complete history pages it
    /// does not hold (newest first) and copies that history in: [`ElasticPool::between_steps`]'s
    /// growth for one session, for a caller that decides who grows (with
    /// [`StepOptions::growth`] off). Returns the pages lent (0 when no page is free or the
    /// session holds every page it wants). Errors: `UnknownSession`, `SessionFinished`,
    /// `Unsupported` on a pool with `elastic` off, `OutOfMemory`.
    pub fn lend(&mut self, session: SessionId, max: u32) -> Result<u32> {
        self.session(session)?;
        if !self.ctl.config.elastic {
            return Err(KvError::Unsupported(
                "lending history pages in a pool with elastic off (fixed hot cache)",
            ));
        }
        self.borrow_newest(session, max)
    }

    /// Between decode steps: hands back at most `chunk` pages of finished sessions, frees pages whose
    /// readers have left, and (elastic mode) lends at most `chunk` free pages to sessions missing
    /// history (round-robin, newest missing page first), copying the history in.
    ///
    /// It also ages the imports in flight: one not committed within the import timeout
    /// ([`ElasticPool::set_import_timeout`]) expires (`imports_expired`).
    pub fn between_steps(&mut self, chunk: u32) -> Result<StepMaintenance> {
        self.between_steps_with(chunk, StepOptions::default())
    }

    /// [`ElasticPool::between_steps`]; with `options.growth` off it lends nothing (hand-back and
    /// freeing only).
    pub fn between_steps_with(
        &mut self,
        chunk: u32,
        options: StepOptions,
    ) -> Result<StepMaintenance> {
        let imports_expired = self.age_imports()?;
        let handed_back = self.ctl.pages.hand_back(chunk);
        self.ctl.counters.pages_handed_back += handed_back as u64;
        let collected = self.ctl.pages.collect();
        let mut grown = 0;
        if self.ctl.config.elastic && options.growth {
            let mut progress = true;
            while progress && grown < chunk && self.ctl.pages.free_count() > 0 {
                progress = false;
                let order: Vec<SessionId> = self
                    .ctl
                    .sessions
                    .range(self.ctl.grow_cursor..)
                    .chain(self.ctl.sessions.range(..self.ctl.grow_cursor))
                    .map(|(&s, _)| s)
                    .collect();
                for s in order {
                    if grown >= chunk || self.ctl.pages.free_count() == 0 {
                        break;
                    }
                    let got = self.borrow_newest(s, 1)?;
                    if got > 0 {
                        grown += got;
                        progress = true;
                        self.ctl.grow_cursor = s.wrapping_add(1);
                    }
                }
            }
        }
        Ok(StepMaintenance {
            handed_back,
            collected,
            grown,
            imports_expired,
        })
    }

    /// Checks the pool's books: every page is free, lent, pending or queued exactly once, each
    /// live session's page table agrees with the lender, each session has one consistent hot cache
    /// per layer group, and (on the CPU pool, whose arena is in host memory) every row the control
    /// plane maps holds its position's committed bytes in every layer it serves: tail rows and
    /// borrowed pages in all layers, a group's hot rows in the group's layers. Returns a
    /// description of the first inconsistency (tests call this after every operation).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let l = &self.ctl.pages;
        l.check_books()?;
        let f = self.ctl.geometry.fixed_pages();
        let imports = self.import_fixed_pages() as u64;
        if l.fixed_count() as u64 != f as u64 * self.ctl.sessions.len() as u64 + imports {
            return Err(format!(
                "{} fixed pages reserved for {} sessions of {f} and {imports} of imports",
                l.fixed_count(),
                self.ctl.sessions.len()
            ));
        }
        for (&s, r) in &self.ctl.sessions {
            if r.fixed.len() as u32 != f {
                return Err(format!("session {s}: fixed pages {} != {f}", r.fixed.len()));
            }
            if l.history_held(s) != r.pages.mapped_count() {
                return Err(format!(
                    "session {s}: lender says {} pages, map has {}",
                    l.history_held(s),
                    r.pages.mapped_count()
                ));
            }
            for loan in l.history_loans(s) {
                if r.pages.get(loan.logical).ok().flatten() != Some(loan.handle.page()) {
                    return Err(format!(
                        "session {s}: page {} not mapped as lent",
                        loan.logical
                    ));
                }
            }
            self.check_rows(s, r)?;
        }
        Ok(())
    }

    /// One session's share of [`ElasticPool::check_invariants`]: one hot cache per layer group,
    /// each consistent, and every row the control plane maps (tail, borrowed pages, each group's
    /// hot rows in each of the group's layers) holding its position's committed bytes, where the
    /// data plane can tell without waiting for a device ([`DataPlane::row_holds`]).
    fn check_rows(&self, s: SessionId, r: &SessionState) -> std::result::Result<(), String> {
        let g = &self.ctl.geometry;
        if r.hot.len() != g.groups() as usize || r.call.len() != r.hot.len() {
            return Err(format!(
                "session {s}: {} hot caches for {} layer groups",
                r.hot.len(),
                g.groups()
            ));
        }
        let check = |p: u32, row: u32, layers: std::ops::Range<u32>, what: &str| {
            for layer in layers {
                if self.data.row_holds(s, p, layer, row) == Some(false) {
                    return Err(format!(
                        "session {s}: {what} row {row} does not hold position {p} at layer {layer}"
                    ));
                }
            }
            Ok(())
        };
        for p in r.committed.saturating_sub(g.tail_rows)..r.committed {
            check(p, self.tail_row(r, p), 0..g.layers, "tail")?;
        }
        for (j, &pg) in r.pages.table().iter().enumerate() {
            if pg >= 0 {
                for p in j as u32 * g.page_rows..(j as u32 + 1) * g.page_rows {
                    check(p, g.page_row(pg as u32, p), 0..g.layers, "page")?;
                }
            }
        }
        for (group, hot) in r.hot.iter().enumerate() {
            hot.check(r.committed)
                .map_err(|e| format!("session {s}, layer group {group}: {e}"))?;
            let layers = g.layer_groups.layers(group as u32, g.layers);
            for slot in 0..hot.rows() {
                if let Some(p) = hot.position_of(slot) {
                    check(p, self.fixed_row(r, slot), layers.clone(), "hot")?;
                }
            }
        }
        Ok(())
    }
}
