//! The elastic pool: host store + one device arena + per-request fixed rows (hot cache, tail,
//! scratch) + elastic history pages lent through `tier-core` loans, and the exact CPU resolver.

use std::collections::BTreeMap;

use hashbrown::HashSet;
use tier_core::{
    BorrowerId, FlagSignal, Lender, Loan, PageMap, ProportionalOldestFirst, ReclaimPolicy, Tier,
};

use crate::error::{KvError, Result};
use crate::host::{HostStore, SessionId};
use crate::hot::HotCache;
use crate::layout::Geometry;
use crate::resolve::{
    ReadTicket, ResolveInput, ResolveOutput, ResolvePlan, ResolveStats, Resolved, Resolver,
    RowCopy, MAX_CANDIDATES,
};

/// Top bit of a [`BorrowerId`]: the loan holds a request's fixed rows (never reclaimed).
pub const FIXED_TAG: u64 = 1 << 63;

/// The reclaim policy of the pool: the inner policy (by default [`ProportionalOldestFirst`]) over
/// elastic history pages only; a request's fixed rows (borrower ids tagged [`FIXED_TAG`]) are
/// never offered to it.
#[derive(Debug, Default, Clone)]
pub struct ElasticReclaim<P = ProportionalOldestFirst>(pub P);

impl<P: ReclaimPolicy> ReclaimPolicy for ElasticReclaim<P> {
    fn choose(&mut self, holdings: &[(BorrowerId, &[u32])], n: u32) -> Vec<(BorrowerId, u32)> {
        let elastic: Vec<(BorrowerId, &[u32])> = holdings
            .iter()
            .filter(|(b, _)| b.0 & FIXED_TAG == 0)
            .map(|&(b, l)| (b, l))
            .collect();
        self.0.choose(&elastic, n)
    }
}

/// How the pool places history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolConfig {
    /// Lend free HBM as elastic history pages (Adaptive HiSparse). `false` = fixed hot cache only
    /// (HiSparse).
    pub elastic: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self { elastic: true }
    }
}

/// The outcome of [`ElasticPool::admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted; `borrowed_pages` elastic pages hold the newest history pages.
    Admitted {
        /// Elastic pages borrowed at admission.
        borrowed_pages: u32,
    },
    /// Not admitted yet: borrowed pages were reclaimed, but `pending` pages still wait for readers
    /// in flight. Nothing about the session was created; call again after the readers complete.
    Waiting {
        /// Pages waiting behind reader fences.
        pending: u32,
    },
}

/// Running totals of the pool's activity (rows are per layer; bytes cover all layers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolCounters {
    /// Sessions admitted.
    pub admitted: u64,
    /// Sessions finished.
    pub finished: u64,
    /// Elastic pages lent (at admission and by growth between steps).
    pub pages_lent: u64,
    /// Elastic pages reclaimed under pressure.
    pub pages_reclaimed: u64,
    /// Elastic pages of finished sessions handed back.
    pub pages_handed_back: u64,
    /// Tokens copied host → arena into elastic pages (all layers each).
    pub page_fill_tokens: u64,
    /// Distinct demand misses (tokens fetched host → hot cache by resolves).
    pub miss_tokens: u64,
    /// Tokens fetched by prefetches.
    pub prefetch_tokens: u64,
}

/// What [`ElasticPool::between_steps`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepMaintenance {
    /// Pages of finished sessions moved to the fence this step.
    pub handed_back: u32,
    /// Pages that became free (readers gone).
    pub collected: u32,
    /// Pages lent to requests missing history.
    pub grown: u32,
}

/// A live session's placement (see [`ElasticPool::placement`]).
#[derive(Clone, Copy, Debug)]
pub struct SessionPlacement<'a> {
    /// Physical page of each fixed page (hot cache, tail, scratch rows in that order).
    pub fixed_pages: &'a [u32],
    /// Borrowed history pages: physical page of logical page `j` (positions
    /// `j × page_rows..(j + 1) × page_rows`), `-1` when not resident.
    pub page_table: &'a [i32],
    /// Committed positions.
    pub committed: u32,
    /// Draft tokens in scratch.
    pub scratch_len: u32,
    /// Whole history resident (tail + borrowed pages).
    pub full: bool,
}

#[derive(Debug)]
struct Request {
    committed: u32,
    scratch_len: u32,
    fixed: Vec<Loan>,
    fixed_pages: Vec<u32>,
    pages: PageMap,
    hot: HotCache,
}

/// The elastic KV pool and its exact CPU resolver (see the crate docs for the data flow).
///
/// Arena rows of a request: fixed local rows `0..hot_rows` are hot-cache slots,
/// `hot_rows..hot_rows + tail_rows` the tail ring (position `p` at `p % tail_rows`), then the scratch
/// rows; they live in the request's fixed pages. History page `j` (positions
/// `j × page_rows..(j + 1) × page_rows`, complete pages only) may be borrowed: physical row
/// `page × page_rows + p % page_rows`.
pub struct ElasticPool {
    geometry: Geometry,
    config: PoolConfig,
    lender: Lender<ElasticReclaim>,
    host: HostStore,
    planes: Vec<Vec<u8>>,
    requests: BTreeMap<SessionId, Request>,
    call: u64,
    grow_cursor: SessionId,
    counters: PoolCounters,
}

impl std::fmt::Debug for ElasticPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElasticPool")
            .field("geometry", &self.geometry)
            .field("config", &self.config)
            .field("requests", &self.requests.len())
            .field("free_pages", &self.lender.free_count())
            .field("counters", &self.counters)
            .finish()
    }
}

/// A zeroed `n`-byte buffer, or `None` when the allocator refuses (instead of aborting, as
/// `vec![0u8; n]` would). Zeroing is lazy (`alloc_zeroed`), as with `vec!`.
fn try_zeroed(n: usize) -> Option<Vec<u8>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[u8; n]` (so capacity
    // `n` matches the allocation), and all `n` bytes are initialised (zeroed).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

#[inline]
fn elastic_id(s: SessionId) -> BorrowerId {
    BorrowerId(s)
}

#[inline]
fn fixed_id(s: SessionId) -> BorrowerId {
    BorrowerId(s | FIXED_TAG)
}

impl ElasticPool {
    /// A pool for `geometry` (validated: `InvalidGeometry`, `ArenaTooSmall`; see
    /// [`Geometry::validate`] for the bounds). The arena starts zeroed; every page is free. It takes
    /// `layers × plane_bytes` bytes of host memory (zeroed lazily by the allocator); when the host
    /// cannot allocate them: `OutOfMemory`.
    pub fn new(geometry: Geometry, config: PoolConfig) -> Result<Self> {
        geometry.validate()?;
        let lender = Lender::with_policy(
            Tier::DeviceHbm,
            geometry.arena_pages,
            ElasticReclaim::default(),
        )?;
        let mut planes = Vec::new();
        planes
            .try_reserve_exact(geometry.layers as usize)
            .map_err(|_| KvError::OutOfMemory {
                what: "arena plane table",
                bytes: geometry.layers as u64 * std::mem::size_of::<Vec<u8>>() as u64,
            })?;
        for _ in 0..geometry.layers {
            planes.push(
                try_zeroed(geometry.plane_bytes()).ok_or(KvError::OutOfMemory {
                    what: "arena plane",
                    bytes: geometry.plane_bytes() as u64,
                })?,
            );
        }
        Ok(Self {
            geometry,
            config,
            lender,
            host: HostStore::new(geometry.row_bytes, geometry.layers),
            planes,
            requests: BTreeMap::new(),
            call: 1,
            grow_cursor: 0,
            counters: PoolCounters::default(),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The placement configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The host store.
    pub fn host(&self) -> &HostStore {
        &self.host
    }

    /// The page lender (free / lent / pending counts, fence).
    pub fn lender(&self) -> &Lender<ElasticReclaim> {
        &self.lender
    }

    /// Running totals.
    pub fn counters(&self) -> &PoolCounters {
        &self.counters
    }

    /// One layer's arena plane (`arena_rows × row_bytes` bytes).
    pub fn plane(&self, layer: u32) -> Result<&[u8]> {
        self.planes
            .get(layer as usize)
            .map(|p| p.as_slice())
            .ok_or(KvError::LayerOutOfRange {
                layer,
                layers: self.geometry.layers,
            })
    }

    /// One arena row of one layer, or `None` when out of range.
    pub fn arena_row(&self, layer: u32, row: i32) -> Option<&[u8]> {
        let rb = self.geometry.row_bytes as usize;
        let p = self.planes.get(layer as usize)?;
        let off = usize::try_from(row).ok()? * rb;
        p.get(off..off + rb)
    }

    /// Sessions admitted and not finished.
    pub fn active_sessions(&self) -> usize {
        self.requests.len()
    }

    /// Ids of admitted, unfinished sessions (ascending).
    pub fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.requests.keys().copied()
    }

    /// Committed length of a live session.
    pub fn committed_len(&self, session: SessionId) -> Result<u32> {
        self.request(session).map(|r| r.committed)
    }

    /// Draft tokens in a live session's scratch.
    pub fn scratch_len(&self, session: SessionId) -> Result<u32> {
        self.request(session).map(|r| r.scratch_len)
    }

    /// Elastic pages a live session holds.
    pub fn borrowed_pages(&self, session: SessionId) -> Result<u32> {
        self.request(session).map(|r| r.pages.mapped_count())
    }

    /// Whether a live session holds its whole history (tail + borrowed pages): the direct path.
    pub fn holds_all(&self, session: SessionId) -> Result<bool> {
        self.request(session).map(|r| self.fully_held(r))
    }

    /// Where a live session's rows are, for a device mirror (the GPU back-end publishes this between
    /// steps): its fixed pages (hot-cache rows, then tail, then scratch, `page_rows` per page), its
    /// borrowed-page table (`-1` = not resident), committed and draft lengths, and whether the whole
    /// history is resident (direct path). Errors: `UnknownSession`, `SessionFinished`.
    pub fn placement(&self, session: SessionId) -> Result<SessionPlacement<'_>> {
        let r = self.request(session)?;
        Ok(SessionPlacement {
            fixed_pages: &r.fixed_pages,
            page_table: r.pages.table(),
            committed: r.committed,
            scratch_len: r.scratch_len,
            full: self.fully_held(r),
        })
    }

    /// Elastic pages lent to live sessions.
    pub fn elastic_lent(&self) -> u32 {
        self.requests.values().map(|r| r.pages.mapped_count()).sum()
    }

    fn request(&self, session: SessionId) -> Result<&Request> {
        self.host.check_live(session)?;
        self.requests
            .get(&session)
            .ok_or(KvError::UnknownSession(session))
    }

    /// History pages a request wants resident: complete pages covering positions outside its tail.
    fn wanted_pages(&self, committed: u32) -> u32 {
        let g = &self.geometry;
        committed
            .saturating_sub(g.tail_rows)
            .div_ceil(g.page_rows)
            .min(committed / g.page_rows)
    }

    fn needed_pages(&self, committed: u32) -> u32 {
        committed
            .saturating_sub(self.geometry.tail_rows)
            .div_ceil(self.geometry.page_rows)
    }

    fn fully_held(&self, r: &Request) -> bool {
        r.pages.mapped_count() == self.needed_pages(r.committed)
    }

    #[inline]
    fn fixed_row(&self, r: &Request, local: u32) -> u32 {
        let pr = self.geometry.page_rows;
        r.fixed_pages[(local / pr) as usize] * pr + local % pr
    }

    #[inline]
    fn tail_row(&self, r: &Request, position: u32) -> u32 {
        self.fixed_row(
            r,
            self.geometry.hot_rows + position % self.geometry.tail_rows,
        )
    }

    #[inline]
    fn scratch_row(&self, r: &Request, i: u32) -> u32 {
        self.fixed_row(r, self.geometry.hot_rows + self.geometry.tail_rows + i)
    }

    fn write_token(&mut self, row: u32, token: &[u8]) {
        let rb = self.geometry.row_bytes as usize;
        for (l, plane) in self.planes.iter_mut().enumerate() {
            let off = row as usize * rb;
            plane[off..off + rb].copy_from_slice(&token[l * rb..(l + 1) * rb]);
        }
    }

    fn copy_host_row(&mut self, session: SessionId, position: u32, layer: u32, row: u32) {
        let rb = self.geometry.row_bytes as usize;
        let src = self
            .host
            .row(session, position, layer)
            .expect("position checked by caller");
        let off = row as usize * rb;
        self.planes[layer as usize][off..off + rb].copy_from_slice(src);
    }

    /// Copies history page `logical` of `session` (all layers) into physical page `page`.
    fn fill_page(&mut self, session: SessionId, logical: u32, page: u32) {
        let pr = self.geometry.page_rows;
        for i in 0..pr {
            let pos = logical * pr + i;
            for l in 0..self.geometry.layers {
                self.copy_host_row(session, pos, l, page * pr + i);
            }
        }
        self.counters.page_fill_tokens += pr as u64;
    }

    /// Lends up to `max` free pages to `session` for its newest unheld wanted pages; copies them in.
    fn borrow_newest(&mut self, session: SessionId, max: u32) -> Result<u32> {
        let r = &self.requests[&session];
        let wanted = self.wanted_pages(r.committed);
        let mut logical = Vec::new();
        let mut j = wanted;
        let budget = max.min(self.lender.free_count());
        while j > 0 && (logical.len() as u32) < budget {
            j -= 1;
            if r.pages.table()[j as usize] < 0 {
                logical.push(j);
            }
        }
        if logical.is_empty() {
            return Ok(0);
        }
        let loans = self.lender.lend(elastic_id(session), &logical)?;
        for loan in &loans {
            let page = loan.handle.page();
            self.requests
                .get_mut(&session)
                .expect("live")
                .pages
                .set(loan.logical, page)?;
            self.fill_page(session, loan.logical, page.0);
        }
        self.counters.pages_lent += loans.len() as u64;
        Ok(loans.len() as u32)
    }

    /// Admits a session with its committed history (`[tokens][layers][row_bytes]` bytes, at least
    /// one token): takes its fixed pages (hot cache + tail + scratch) — if the pool runs short, first
    /// from finished sessions' queued pages, then by reclaiming borrowed pages of others — writes the tail, and — in elastic mode — borrows free pages for
    /// as much of its history as fits, newest first, copying that history in.
    ///
    /// Errors (nothing changes): `ReservedSessionId`, `SessionExists`, `RaggedRows`, `EmptyHistory`,
    /// `NoRoom` (fixed rows do not fit even after reclaiming every borrowed page).
    /// [`Admission::Waiting`] is not an error: pages were reclaimed (a requested effect) but wait for
    /// readers in flight; the session was not created.
    pub fn admit(&mut self, session: SessionId, history: &[u8]) -> Result<Admission> {
        self.host.check_new(session)?;
        let n = self.host.check_tokens(history, false)?;
        let f = self.geometry.fixed_pages();
        self.lender.collect();
        if self.lender.free_count() < f {
            let lent_elastic = self.elastic_lent();
            let pending = self.lender.pending_count();
            let queued = self.lender.queued_count();
            let available = self.lender.free_count() + pending + queued + lent_elastic;
            if available < f {
                return Err(KvError::NoRoom {
                    needed: f,
                    available,
                });
            }
            // Pages of finished sessions go first (no one reads them any more).
            let handed = self.lender.hand_back_step(f).len();
            self.counters.pages_handed_back += handed as u64;
            self.lender.collect();
            let short = f.saturating_sub(self.lender.free_count() + self.lender.pending_count());
            if short > 0 {
                self.reclaim_pages(short)?;
            }
            self.lender.collect();
            if self.lender.free_count() < f {
                return Ok(Admission::Waiting {
                    pending: self.lender.pending_count(),
                });
            }
        }
        let fixed_logical: Vec<u32> = (0..f).collect();
        let fixed = self.lender.lend(fixed_id(session), &fixed_logical)?;
        self.host.create(session, history).expect("checked above");
        let fixed_pages = fixed.iter().map(|l| l.handle.page().0).collect();
        let pages = PageMap::new(n / self.geometry.page_rows)?;
        let req = Request {
            committed: n,
            scratch_len: 0,
            fixed,
            fixed_pages,
            pages,
            hot: HotCache::new(self.geometry.hot_rows, n),
        };
        self.requests.insert(session, req);
        self.write_tail(session, 0, n);
        self.counters.admitted += 1;
        let borrowed = if self.config.elastic {
            self.borrow_newest(session, u32::MAX)?
        } else {
            0
        };
        Ok(Admission::Admitted {
            borrowed_pages: borrowed,
        })
    }

    /// Writes the tail rows of positions `from..to` that are still among the newest `tail_rows`.
    fn write_tail(&mut self, session: SessionId, from: u32, to: u32) {
        let start = from.max(to.saturating_sub(self.geometry.tail_rows));
        for p in start..to {
            let row = self.tail_row(&self.requests[&session], p);
            let token = self.host.token(session, p).expect("committed").to_vec();
            self.write_token(row, &token);
        }
    }

    /// Appends committed tokens (`[tokens][layers][row_bytes]`) to a live session: host store,
    /// then the tail ring. Clears the session's scratch (drafts are relative to the old length).
    /// Errors (nothing changes): `UnknownSession`, `SessionFinished`, `RaggedRows`.
    pub fn append(&mut self, session: SessionId, tokens: &[u8]) -> Result<u32> {
        self.request(session)?;
        self.host.check_tokens(tokens, true)?;
        let old = self.requests[&session].committed;
        let new = self.host.append(session, tokens)?;
        let pr = self.geometry.page_rows;
        {
            let r = self.requests.get_mut(&session).expect("live");
            r.committed = new;
            r.scratch_len = 0;
            r.hot.grow(new);
            r.pages.resize(new / pr)?;
        }
        self.write_tail(session, old, new);
        Ok(new)
    }

    /// Writes draft tokens (speculative decoding) into the session's scratch after those already
    /// there; they are visible to resolves (positions `committed..committed + scratch_len`) but are
    /// not history until [`ElasticPool::accept`]. Errors: session errors, `RaggedRows`,
    /// `ScratchOverflow`.
    pub fn write_scratch(&mut self, session: SessionId, tokens: &[u8]) -> Result<()> {
        let r = self.request(session)?;
        let n = self.host.check_tokens(tokens, true)?;
        if r.scratch_len + n > self.geometry.scratch_rows {
            return Err(KvError::ScratchOverflow {
                session,
                scratch_rows: self.geometry.scratch_rows,
                requested: r.scratch_len + n,
            });
        }
        let tb = self.geometry.token_bytes();
        for i in 0..n {
            let r = &self.requests[&session];
            let row = self.scratch_row(r, r.scratch_len + i);
            self.write_token(row, &tokens[i as usize * tb..(i as usize + 1) * tb]);
        }
        self.requests.get_mut(&session).expect("live").scratch_len += n;
        Ok(())
    }

    /// Commits the first `n` scratch tokens as history (verification accepted them) and drops the
    /// rest. Only committed history is eligible for the elastic tier. Errors: session errors,
    /// `ScratchOverflow` when `n > scratch_len`.
    pub fn accept(&mut self, session: SessionId, n: u32) -> Result<u32> {
        let r = self.request(session)?;
        if n > r.scratch_len {
            return Err(KvError::ScratchOverflow {
                session,
                scratch_rows: r.scratch_len,
                requested: n,
            });
        }
        let rb = self.geometry.row_bytes as usize;
        let mut tokens = Vec::with_capacity(n as usize * self.geometry.token_bytes());
        for i in 0..n {
            let row = self.scratch_row(r, i) as usize;
            for plane in &self.planes {
                tokens.extend_from_slice(&plane[row * rb..(row + 1) * rb]);
            }
        }
        self.append(session, &tokens)
    }

    /// Finishes a session: its fixed pages go back through the reader fence at once, its borrowed
    /// pages are queued and handed back to others in bounded chunks by
    /// [`ElasticPool::between_steps`]. Errors (nothing changes): `UnknownSession`, `SessionFinished`.
    pub fn finish(&mut self, session: SessionId) -> Result<()> {
        self.request(session)?;
        let r = self.requests.remove(&session).expect("live");
        for loan in r.fixed {
            self.lender.give_back(loan)?;
        }
        self.lender.finish(fixed_id(session))?;
        if self.lender.is_known(elastic_id(session)) {
            self.lender.finish(elastic_id(session))?;
        }
        self.host.finish(session)?;
        self.counters.finished += 1;
        Ok(())
    }

    fn reclaim_pages(&mut self, n: u32) -> Result<u32> {
        // The lender asks the policy for exactly min(n, lent) pages; fixed pages are never offered.
        let n = n.min(self.elastic_lent());
        let loans = self.lender.reclaim(n)?;
        for loan in &loans {
            if let Some(r) = self.requests.get_mut(&(loan.borrower.0 & !FIXED_TAG)) {
                r.pages.clear(loan.logical)?;
            }
        }
        self.counters.pages_reclaimed += loans.len() as u64;
        Ok(loans.len() as u32)
    }

    /// Reclaims up to `n` borrowed pages under pressure: oldest history first, in proportion to
    /// holdings ([`ProportionalOldestFirst`]). The owners stop mapping them at once; the pages become
    /// free only after every reader in flight has completed. Returns the pages reclaimed.
    pub fn reclaim(&mut self, n: u32) -> Result<u32> {
        let got = self.reclaim_pages(n)?;
        self.lender.collect();
        Ok(got)
    }

    /// Between decode steps: hands back at most `chunk` pages of finished sessions, frees pages whose
    /// readers have left, and (elastic mode) lends at most `chunk` free pages to sessions missing
    /// history (round-robin, newest missing page first), copying the history in.
    pub fn between_steps(&mut self, chunk: u32) -> Result<StepMaintenance> {
        let handed_back = self.lender.hand_back_step(chunk).len() as u32;
        self.counters.pages_handed_back += handed_back as u64;
        let collected = self.lender.collect();
        let mut grown = 0;
        if self.config.elastic {
            let mut progress = true;
            while progress && grown < chunk && self.lender.free_count() > 0 {
                progress = false;
                let order: Vec<SessionId> = self
                    .requests
                    .range(self.grow_cursor..)
                    .chain(self.requests.range(..self.grow_cursor))
                    .map(|(&s, _)| s)
                    .collect();
                for s in order {
                    if grown >= chunk || self.lender.free_count() == 0 {
                        break;
                    }
                    let got = self.borrow_newest(s, 1)?;
                    if got > 0 {
                        grown += got;
                        progress = true;
                        self.grow_cursor = s.wrapping_add(1);
                    }
                }
            }
        }
        Ok(StepMaintenance {
            handed_back,
            collected,
            grown,
        })
    }

    /// Checks the pool's books: every page is free, lent, pending or queued exactly once, and each
    /// live session's page table agrees with the lender. Returns a description of the first
    /// inconsistency (tests call this after every operation).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let l = &self.lender;
        let total = l.free_count() + l.lent_count() + l.pending_count() + l.queued_count();
        if total != l.capacity() {
            return Err(format!(
                "free {} + lent {} + pending {} + queued {} != capacity {}",
                l.free_count(),
                l.lent_count(),
                l.pending_count(),
                l.queued_count(),
                l.capacity()
            ));
        }
        let f = self.geometry.fixed_pages();
        for (&s, r) in &self.requests {
            if l.held_by(fixed_id(s)) != f || r.fixed.len() as u32 != f {
                return Err(format!(
                    "session {s}: fixed pages {} != {f}",
                    l.held_by(fixed_id(s))
                ));
            }
            if l.held_by(elastic_id(s)) != r.pages.mapped_count() {
                return Err(format!(
                    "session {s}: lender says {} pages, map has {}",
                    l.held_by(elastic_id(s)),
                    r.pages.mapped_count()
                ));
            }
            for loan in l.loans_of(elastic_id(s)) {
                if r.pages.get(loan.logical).ok().flatten() != Some(loan.handle.page()) {
                    return Err(format!(
                        "session {s}: page {} not mapped as lent",
                        loan.logical
                    ));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn validate_batch(&self, input: &ResolveInput<'_>) -> Result<Vec<Vec<u32>>> {
        let g = &self.geometry;
        let reqs = input.sessions.len();
        if input.layer >= g.layers {
            return Err(KvError::LayerOutOfRange {
                layer: input.layer,
                layers: g.layers,
            });
        }
        if input.query_start_loc.len() != reqs + 1 {
            return Err(KvError::LengthMismatch {
                what: "query_start_loc",
                expected: reqs + 1,
                actual: input.query_start_loc.len(),
            });
        }
        if input.seq_lens.len() != reqs {
            return Err(KvError::LengthMismatch {
                what: "seq_lens",
                expected: reqs,
                actual: input.seq_lens.len(),
            });
        }
        if input.k == 0 {
            return Err(KvError::LengthMismatch {
                what: "k",
                expected: 1,
                actual: 0,
            });
        }
        if !input.topk.len().is_multiple_of(input.k) {
            return Err(KvError::LengthMismatch {
                what: "topk (rows × k)",
                expected: input.topk.len().div_ceil(input.k) * input.k,
                actual: input.topk.len(),
            });
        }
        let rows = input.topk.len() / input.k;
        let qsl = input.query_start_loc;
        if qsl[0] != 0 {
            return Err(KvError::BadQueryStartLoc("query_start_loc[0] must be 0"));
        }
        if qsl.windows(2).any(|w| w[1] < w[0]) {
            return Err(KvError::BadQueryStartLoc(
                "query_start_loc must be non-decreasing",
            ));
        }
        if qsl[reqs] as usize != rows || qsl[reqs] < 0 {
            return Err(KvError::BadQueryStartLoc(
                "query_start_loc[reqs] must equal the number of topk rows",
            ));
        }
        let mut seen = HashSet::with_capacity(reqs);
        let mut hot_needed = Vec::with_capacity(reqs);
        for (ri, &s) in input.sessions.iter().enumerate() {
            let r = self.request(s)?;
            if !seen.insert(s) {
                return Err(KvError::DuplicateSession(s));
            }
            let seq_len = input.seq_lens[ri];
            let available = r.committed + r.scratch_len;
            if seq_len < 1 || seq_len as u32 > available {
                return Err(KvError::SeqLenOutOfRange {
                    session: s,
                    seq_len,
                    available,
                });
            }
            let tail_start = r.committed.saturating_sub(g.tail_rows);
            let full = self.fully_held(r);
            let mut need = Vec::new();
            let mut need_set = if full {
                HashSet::new()
            } else {
                HashSet::with_capacity(2 * input.k)
            };
            for row in qsl[ri] as usize..qsl[ri + 1] as usize {
                for &p in &input.topk[row * input.k..(row + 1) * input.k] {
                    if p < -1 || p >= seq_len {
                        return Err(KvError::PositionOutOfRange {
                            row,
                            position: p,
                            seq_len,
                        });
                    }
                    if p < 0 || full {
                        continue;
                    }
                    let p = p as u32;
                    if p >= tail_start {
                        continue;
                    }
                    let j = (p / g.page_rows) as usize;
                    if r.pages.table().get(j).is_some_and(|&pg| pg >= 0) {
                        continue;
                    }
                    if need_set.insert(p) {
                        need.push(p);
                    }
                }
            }
            if need.len() > g.hot_rows as usize {
                return Err(KvError::HotCacheOverflow {
                    session: s,
                    needed: need.len(),
                    hot_rows: g.hot_rows,
                });
            }
            hot_needed.push(need);
        }
        Ok(hot_needed)
    }

    /// A resolve's checks, shared by every back-end: output shapes and [`Self::validate_batch`]'s
    /// errors; on an input error the outputs are filled with `-1` / `0` when their lengths are right.
    /// Returns the distinct non-resident positions per request.
    pub(crate) fn validate_resolve(
        &self,
        input: &ResolveInput<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Vec<Vec<u32>>> {
        let rows = input.topk.len().checked_div(input.k).unwrap_or(0);
        let shapes_ok = input.k > 0
            && input.topk.len().is_multiple_of(input.k)
            && out.indices.len() == input.topk.len()
            && out.valid_count.len() == rows;
        match self.validate_batch(input) {
            Ok(h) if shapes_ok => Ok(h),
            Ok(_) => Err(if out.indices.len() != input.topk.len() {
                KvError::LengthMismatch {
                    what: "indices",
                    expected: input.topk.len(),
                    actual: out.indices.len(),
                }
            } else {
                KvError::LengthMismatch {
                    what: "valid_count",
                    expected: rows,
                    actual: out.valid_count.len(),
                }
            }),
            Err(e) => {
                if out.valid_count.len() == rows && out.indices.len() == input.topk.len() {
                    out.indices.fill(-1);
                    out.valid_count.fill(0);
                }
                Err(e)
            }
        }
    }

    /// Physical row of a valid position (tail → scratch → page → hot); `None` if not resident.
    #[inline]
    fn locate(
        &self,
        r: &Request,
        p: u32,
        tail_start: u32,
        stats: &mut ResolveStats,
    ) -> Option<u32> {
        let g = &self.geometry;
        if p >= r.committed {
            stats.scratch_hits += 1;
            return Some(self.scratch_row(r, p - r.committed));
        }
        if p >= tail_start {
            stats.tail_hits += 1;
            return Some(self.tail_row(r, p));
        }
        let pg = r
            .pages
            .table()
            .get((p / g.page_rows) as usize)
            .copied()
            .unwrap_or(-1);
        if pg >= 0 {
            stats.page_hits += 1;
            return Some(pg as u32 * g.page_rows + p % g.page_rows);
        }
        let slot = r.hot.lookup(p)?;
        stats.hot_hits += 1;
        Some(self.fixed_row(r, slot))
    }

    fn apply_copies(&mut self, copies: &[RowCopy], layer: u32) {
        for c in copies {
            self.copy_host_row(c.session, c.position, layer, c.dst_row);
        }
    }

    fn register_reader(&self) -> ReadTicket {
        let signal = FlagSignal::new();
        self.lender.fence().enter_signal(Box::new(signal.clone()));
        ReadTicket(signal)
    }
}

impl Resolver for ElasticPool {
    fn resolve(
        &mut self,
        input: &ResolveInput<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved> {
        let hot_needed = self.validate_resolve(input, out)?;
        self.call += 1;
        let call = self.call;
        let mut stats = ResolveStats::default();
        let mut copies = Vec::new();
        let g = self.geometry;
        // Hot-cache bookkeeping: pin hits, install misses into victims (never this call's rows).
        for (ri, need) in hot_needed.iter().enumerate() {
            let s = input.sessions[ri];
            if need.is_empty() {
                if self.fully_held(&self.requests[&s]) {
                    stats.direct_requests += 1;
                }
                continue;
            }
            let r = self.requests.get_mut(&s).expect("validated");
            let mut misses = Vec::new();
            for &p in need {
                match r.hot.lookup(p) {
                    Some(slot) => r.hot.touch(slot, call),
                    None => misses.push(p),
                }
            }
            for &p in &misses {
                let slot = r
                    .hot
                    .victim(call)
                    .expect("validated: distinct hot positions <= hot_rows");
                r.hot.install(slot, p, call);
                let pr = g.page_rows;
                let dst_row = r.fixed_pages[(slot / pr) as usize] * pr + slot % pr;
                copies.push(RowCopy {
                    session: s,
                    position: p,
                    dst_row,
                });
            }
            stats.misses += misses.len() as u64;
        }
        self.apply_copies(&copies, input.layer);
        self.counters.miss_tokens += stats.misses;
        // Outputs: every element written.
        for (ri, &s) in input.sessions.iter().enumerate() {
            let r = &self.requests[&s];
            let tail_start = r.committed.saturating_sub(g.tail_rows);
            for row in input.query_start_loc[ri] as usize..input.query_start_loc[ri + 1] as usize {
                let mut valid = 0;
                for j in row * input.k..(row + 1) * input.k {
                    let p = input.topk[j];
                    out.indices[j] = if p < 0 {
                        -1
                    } else {
                        valid += 1;
                        self.locate(r, p as u32, tail_start, &mut stats)
                            .expect("resident after install") as i32
                    };
                }
                out.valid_count[row] = valid;
                stats.picks += valid as u64;
            }
        }
        Ok(Resolved {
            plan: ResolvePlan { copies },
            stats,
            ticket: self.register_reader(),
        })
    }

    fn replay(&mut self, plan: &ResolvePlan, layer: u32) -> Result<()> {
        if layer >= self.geometry.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: self.geometry.layers,
            });
        }
        for c in &plan.copies {
            let r = self.request(c.session)?;
            let ok = r
                .hot
                .lookup(c.position)
                .is_some_and(|slot| self.fixed_row(r, slot) == c.dst_row);
            if !ok {
                return Err(KvError::StalePlan {
                    session: c.session,
                    position: c.position,
                    row: c.dst_row,
                });
            }
        }
        self.apply_copies(&plan.copies, layer);
        Ok(())
    }

    fn prefetch(
        &mut self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<ResolvePlan> {
        if layer >= self.geometry.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: self.geometry.layers,
            });
        }
        if candidates.len() > MAX_CANDIDATES {
            return Err(KvError::TooManyCandidates {
                given: candidates.len(),
                max: MAX_CANDIDATES,
            });
        }
        let r = self.request(session)?;
        for (i, &p) in candidates.iter().enumerate() {
            if p < -1 || p >= r.committed as i32 {
                return Err(KvError::PositionOutOfRange {
                    row: i,
                    position: p,
                    seq_len: r.committed as i32,
                });
            }
        }
        let g = self.geometry;
        let call = self.call;
        let tail_start = r.committed.saturating_sub(g.tail_rows);
        let mut copies = Vec::new();
        let r = self.requests.get_mut(&session).expect("live");
        // As in resolve: pin every hit first, then place the distinct misses (first appearance
        // order) while victims last, so a prefetch never evicts one of its own candidates. The
        // GPU back-end makes the same decisions.
        let mut misses = Vec::new();
        let mut seen = HashSet::new();
        for &p in candidates {
            if p < 0 {
                continue;
            }
            let p = p as u32;
            if p >= tail_start
                || r.pages
                    .table()
                    .get((p / g.page_rows) as usize)
                    .is_some_and(|&pg| pg >= 0)
            {
                continue;
            }
            if let Some(slot) = r.hot.lookup(p) {
                r.hot.touch(slot, call);
            } else if seen.insert(p) {
                misses.push(p);
            }
        }
        for p in misses {
            let Some(slot) = r.hot.victim(call) else {
                break;
            };
            r.hot.install(slot, p, call);
            let pr = g.page_rows;
            copies.push(RowCopy {
                session,
                position: p,
                dst_row: r.fixed_pages[(slot / pr) as usize] * pr + slot % pr,
            });
        }
        self.apply_copies(&copies, layer);
        self.counters.prefetch_tokens += copies.len() as u64;
        Ok(ResolvePlan { copies })
    }
}
