//! Revocable loans of pages from a lender to borrowers (requests).
//!
//! Lifecycle of a page: **free** -> [`Lender::lend`] -> **lent** ->
//! ([`Lender::reclaim`] | [`Lender::give_back`]) -> **pending** behind the
//! fence -> [`Lender::collect`] once readers left -> **free**. A finished
//! borrower's pages go **lent** -> [`Lender::finish`] -> **queued** ->
//! [`Lender::hand_back_step`] (at most `max_per_step` per call) -> **pending**
//! -> **free**. A page can also be **reserved** ([`Lender::reserve`]): taken
//! by the lender's owner for a use that is never revoked (e.g. a KV request's
//! fixed hot-cache rows), invisible to the reclaim policy, and given back
//! with [`Lender::release`] behind the same fence.
//! `free + lent + reserved + queued + pending == capacity` always.

use std::collections::{BTreeMap, VecDeque};

use crate::error::{CoreError, Result};
use crate::fence::{EpochFence, Retired};
use crate::page::{PageHandle, Tier};
use crate::pool::PagePool;
use crate::sync::Arc;

/// A borrower of pages, e.g. an engine's request id. Plain `u64`, `Pod`.
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
pub struct BorrowerId(pub u64);

/// One lent page: `borrower` holds physical page `handle` as its logical page
/// `logical` (for KV: history page number, 0 = oldest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Loan {
    /// Who holds (or held) the page.
    pub borrower: BorrowerId,
    /// The borrower's own logical page index.
    pub logical: u32,
    /// The physical page, generation-tagged.
    pub handle: PageHandle,
}

/// Chooses which lent pages to take back under pressure. Pluggable; the
/// first implementation is [`ProportionalOldestFirst`].
pub trait ReclaimPolicy {
    /// `holdings`: per borrower with at least one page, `(id, sorted logical
    /// indices held)`, in ascending id order. Return at most `n` distinct
    /// `(borrower, logical)` pairs taken from `holdings` (a policy may
    /// exempt borrowers and return fewer; [`ProportionalOldestFirst`]
    /// returns exactly `min(n, total held)`). The lender rejects anything
    /// else with [`CoreError::InvalidPolicyChoice`] and reclaims nothing.
    fn choose(&mut self, holdings: &[(BorrowerId, &[u32])], n: u32) -> Vec<(BorrowerId, u32)>;
}

/// Takes `n` pages split in proportion to what each borrower holds (largest
/// remainder method; ties go to the lower borrower id), and the oldest
/// (lowest logical index) pages first within each borrower.
///
/// Source: the HiSparse-style elastic KV pool (Adaptive HiSparse: pressure
/// reclaims borrowed pages oldest-history-first in proportion to holdings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProportionalOldestFirst;

impl ProportionalOldestFirst {
    /// How many pages each borrower gives up when `n` pages are taken from
    /// `held` = `(borrower, pages held)`: `min(n, total)` split by largest
    /// remainder, ties to the lower id. Same order as `held`.
    pub(crate) fn quotas(held: &[(BorrowerId, u64)], n: u32) -> Vec<u64> {
        let total: u128 = held.iter().map(|h| u128::from(h.1)).sum();
        let k = u128::from(n).min(total);
        if k == 0 {
            return vec![0; held.len()];
        }
        let mut quota: Vec<u64> = Vec::with_capacity(held.len());
        let mut rem: Vec<u128> = Vec::with_capacity(held.len());
        for &(_, h) in held {
            let x = k * u128::from(h);
            quota.push((x / total) as u64); // <= h
            rem.push(x % total);
        }
        let given: u128 = quota.iter().map(|&q| u128::from(q)).sum();
        let mut order: Vec<usize> = (0..held.len()).collect();
        order.sort_by(|&a, &b| rem[b].cmp(&rem[a]).then(held[a].0.cmp(&held[b].0)));
        // The fractional parts sum to k - given, each < 1, so at least that
        // many borrowers have a non-zero remainder and room for one more.
        for &i in order.iter().take((k - given) as usize) {
            quota[i] += 1;
        }
        quota
    }
}

impl ReclaimPolicy for ProportionalOldestFirst {
    fn choose(&mut self, holdings: &[(BorrowerId, &[u32])], n: u32) -> Vec<(BorrowerId, u32)> {
        let held: Vec<(BorrowerId, u64)> =
            holdings.iter().map(|h| (h.0, h.1.len() as u64)).collect();
        let quota = Self::quotas(&held, n);
        let mut out = Vec::with_capacity(quota.iter().sum::<u64>() as usize);
        for (&(b, logicals), &q) in holdings.iter().zip(&quota) {
            out.extend(logicals[..q as usize].iter().map(|&l| (b, l)));
        }
        out
    }
}

#[derive(Debug, Default)]
struct Borrower {
    /// logical -> page, while the borrower is active.
    loans: BTreeMap<u32, PageHandle>,
    finished: bool,
    /// Pages still in the hand-back queue (finished borrowers only).
    queued: u32,
}

/// Lends free pages of one [`PagePool`] to borrowers and takes them back
/// through an [`EpochFence`], so that no page is reused while a reader may
/// still see it.
///
/// Single-owner (`&mut self`) bookkeeping; only the fence is shared with
/// readers ([`shared_fence`](Self::shared_fence)). See the module docs for
/// the page lifecycle. Determinism: with the same calls (and the same reader
/// activity), results are identical; borrowers are visited in id order.
pub struct Lender<P: ReclaimPolicy = ProportionalOldestFirst> {
    pool: PagePool,
    fence: Arc<EpochFence>,
    retired: Retired<PageHandle>,
    borrowers: BTreeMap<BorrowerId, Borrower>,
    queue: VecDeque<Loan>,
    lent: u32,
    /// Reserved pages, by page id (the handle checks the generation on release).
    reserved: BTreeMap<u32, PageHandle>,
    policy: P,
    scratch: Vec<PageHandle>,
}

impl<P: ReclaimPolicy> std::fmt::Debug for Lender<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lender")
            .field("tier", &self.pool.tier())
            .field("capacity", &self.capacity())
            .field("free", &self.free_count())
            .field("lent", &self.lent)
            .field("queued", &self.queue.len())
            .field("pending", &self.pending_count())
            .field("borrowers", &self.borrowers.len())
            .finish()
    }
}

impl Lender {
    /// A lender of `capacity` pages in `tier` with the default
    /// [`ProportionalOldestFirst`] policy and its own fence.
    ///
    /// # Errors
    /// [`CoreError::ZeroCapacity`] if `capacity == 0`.
    pub fn new(tier: Tier, capacity: u32) -> Result<Self> {
        Self::with_policy(tier, capacity, ProportionalOldestFirst)
    }
}

impl<P: ReclaimPolicy> Lender<P> {
    /// A lender with a custom reclaim policy and its own fence.
    ///
    /// # Errors
    /// [`CoreError::ZeroCapacity`] if `capacity == 0`.
    pub fn with_policy(tier: Tier, capacity: u32, policy: P) -> Result<Lender<P>> {
        Self::with_fence(tier, capacity, policy, Arc::new(EpochFence::new()))
    }

    /// A lender that uses an existing (shared) fence, e.g. one fence for every
    /// pool a GPU step reads.
    ///
    /// # Errors
    /// [`CoreError::ZeroCapacity`] if `capacity == 0`.
    pub fn with_fence(
        tier: Tier,
        capacity: u32,
        policy: P,
        fence: Arc<EpochFence>,
    ) -> Result<Lender<P>> {
        Ok(Lender {
            pool: PagePool::new(tier, capacity)?,
            fence,
            retired: Retired::new(),
            borrowers: BTreeMap::new(),
            queue: VecDeque::new(),
            lent: 0,
            reserved: BTreeMap::new(),
            policy,
            scratch: Vec::new(),
        })
    }

    /// The fence readers enter before reading any borrower's page map. To
    /// hold a reader across `&mut self` calls, use
    /// [`shared_fence`](Self::shared_fence).
    pub fn fence(&self) -> &EpochFence {
        &self.fence
    }

    /// A shared handle on the fence, for reader threads.
    pub fn shared_fence(&self) -> Arc<EpochFence> {
        self.fence.clone()
    }

    /// The tier of the pages.
    pub fn tier(&self) -> Tier {
        self.pool.tier()
    }

    /// Total pages.
    pub fn capacity(&self) -> u32 {
        self.pool.capacity()
    }

    /// Pages lendable now.
    pub fn free_count(&self) -> u32 {
        self.pool.free_count()
    }

    /// Pages held by active borrowers.
    pub fn lent_count(&self) -> u32 {
        self.lent
    }

    /// Pages reserved by the owner ([`reserve`](Self::reserve)).
    pub fn reserved_count(&self) -> u32 {
        self.reserved.len() as u32
    }

    /// Pages of finished borrowers waiting in the hand-back queue.
    pub fn queued_count(&self) -> u32 {
        self.queue.len() as u32
    }

    /// Pages reclaimed or handed back, waiting for readers to leave
    /// ([`collect`](Self::collect) frees them).
    pub fn pending_count(&self) -> u32 {
        self.retired.pending() as u32
    }

    /// Pages an active borrower holds (0 for unknown or finished borrowers).
    pub fn held_by(&self, b: BorrowerId) -> u32 {
        self.borrowers.get(&b).map_or(0, |s| s.loans.len() as u32)
    }

    /// Whether `b` is known (active, or finished with pages still queued).
    pub fn is_known(&self, b: BorrowerId) -> bool {
        self.borrowers.contains_key(&b)
    }

    /// The reclaim policy.
    pub fn policy_mut(&mut self) -> &mut P {
        &mut self.policy
    }

    /// Lends one free page to `b` for each logical index in `logical`, all or
    /// nothing; registers `b` if new. Loans come back in the order of
    /// `logical`. Pages follow the indices' order: the i-th smallest index
    /// gets the i-th lowest page id of the pages taken, so consecutive
    /// indices land on consecutive pages wherever the free pages are (one
    /// copy per run when a history is filled in). O(m log m) for m pages
    /// (appending past the pages already held is the fast case).
    ///
    /// # Errors
    /// - [`CoreError::BorrowerFinished`] if `b` has finished.
    /// - [`CoreError::DuplicateLogical`] if an index repeats or `b` holds it
    ///   (reported: the smallest index repeated in `logical`, else the
    ///   smallest one already held).
    /// - [`CoreError::PoolExhausted`] if fewer than `logical.len()` pages are
    ///   free (call [`collect`](Self::collect) or
    ///   [`reclaim`](Self::reclaim) first).
    /// - [`CoreError::AllocationFailed`] if the sorted copy of `logical` the
    ///   duplicate check makes cannot be allocated.
    pub fn lend(&mut self, b: BorrowerId, logical: &[u32]) -> Result<Vec<Loan>> {
        let existing = self.borrowers.get(&b);
        if existing.is_some_and(|s| s.finished) {
            return Err(CoreError::BorrowerFinished { borrower: b.0 });
        }
        // Duplicate check without hashing: sort a copy (O(m log m); none for
        // strictly ascending indices, the common case, which cannot repeat),
        // look at neighbours, then probe the held set only where it overlaps.
        let ascending = logical.windows(2).all(|w| w[0] < w[1]);
        let owned;
        let sorted: &[u32] = if ascending {
            logical
        } else {
            let mut v = crate::alloc::try_copied(logical, "lend: sorted logical pages")?;
            v.sort_unstable();
            if let Some(w) = v.windows(2).find(|w| w[0] == w[1]) {
                return Err(Self::duplicate(b, w[0]));
            }
            owned = v;
            &owned
        };
        if let (Some(s), Some(&lo)) = (existing, sorted.first()) {
            let overlaps = s.loans.last_key_value().is_some_and(|(&max, _)| lo <= max);
            if overlaps {
                if let Some(&l) = sorted.iter().find(|l| s.loans.contains_key(l)) {
                    return Err(Self::duplicate(b, l));
                }
            }
        }
        let Ok(n) = u32::try_from(logical.len()) else {
            return Err(CoreError::PoolExhausted {
                requested: u32::MAX,
                free: self.pool.free_count(),
            });
        };
        let mut handles = self.pool.alloc_many(n)?;
        // Pages in the order of their logical indices: the i-th smallest logical index gets the
        // i-th lowest page, so a run of consecutive indices lands on ascending pages wherever the
        // free pages allow it (the free stack hands pages back in the reverse of the order they
        // were freed; a history's fill is then one copy per run of pages, not one per page).
        // The free stack pops pages in one order or its reverse when they were
        // freed in order: O(m) then. Otherwise it is a few such runs (pages
        // freed in order by several hand-backs, reclaims and releases): the
        // stable sort finds the natural runs and merges them, O(m log runs)
        // (the pages are distinct, so it orders them as any sort would).
        if handles.windows(2).all(|w| w[0].page.0 > w[1].page.0) {
            handles.reverse();
        } else if !handles.windows(2).all(|w| w[0].page.0 < w[1].page.0) {
            handles.sort_by_key(|h| h.page.0);
        }
        let out: Vec<Loan> = logical
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let rank = if ascending {
                    i
                } else {
                    // `sorted` holds `logical` without repeats (checked above).
                    sorted.binary_search(&l).unwrap_or(i)
                };
                Loan {
                    borrower: b,
                    logical: l,
                    handle: handles[rank],
                }
            })
            .collect();
        let entry = self.borrowers.entry(b).or_default();
        if entry.loans.len() <= 8 * out.len() {
            // Bulk: build a map of the new pages (sorted build, O(m)) and
            // merge it in one linear pass.
            let mut add: BTreeMap<u32, PageHandle> =
                out.iter().map(|x| (x.logical, x.handle)).collect();
            entry.loans.append(&mut add);
        } else {
            entry
                .loans
                .extend(out.iter().map(|x| (x.logical, x.handle)));
        }
        self.lent += n;
        Ok(out)
    }

    #[cold]
    fn duplicate(b: BorrowerId, logical: u32) -> CoreError {
        CoreError::DuplicateLogical {
            borrower: b.0,
            logical,
        }
    }

    /// Takes `n` free pages for a use the lender never revokes (all or
    /// nothing): they are no borrower's, so the reclaim policy never sees
    /// them, and they count as [`reserved_count`](Self::reserved_count) until
    /// [`release`](Self::release)d. Pages come out in the order
    /// [`lend`](Self::lend) would hand them out.
    ///
    /// Source: the HiSparse-style KV pool, where a request's fixed hot-cache
    /// pages and its revocable borrowed history pages share one arena.
    ///
    /// # Errors
    /// [`CoreError::PoolExhausted`] if fewer than `n` pages are free.
    pub fn reserve(&mut self, n: u32) -> Result<Vec<PageHandle>> {
        let handles = self.pool.alloc_many(n)?;
        for &h in &handles {
            self.reserved.insert(h.page.0, h);
        }
        Ok(handles)
    }

    /// Gives a reserved page back: it goes behind the fence and becomes free
    /// at a [`collect`](Self::collect) once no reader can see it.
    ///
    /// # Errors
    /// [`CoreError::NotReserved`] if the page is not reserved;
    /// [`CoreError::StaleHandle`] if it is reserved under another handle.
    /// Nothing changes on error.
    pub fn release(&mut self, handle: PageHandle) -> Result<()> {
        match self.reserved.get(&handle.page.0) {
            None => Err(CoreError::NotReserved {
                page: handle.page.0,
            }),
            Some(&h) if h != handle => Err(CoreError::StaleHandle {
                page: handle.page.0,
                generation: handle.generation,
            }),
            Some(_) => {
                self.reserved.remove(&handle.page.0);
                self.retired.retire(&self.fence, handle);
                Ok(())
            }
        }
    }

    /// The borrower returns one page voluntarily (e.g. it dropped that part of
    /// its history). The page goes behind the fence. Unmap it before the next
    /// [`collect`](Self::collect).
    ///
    /// # Errors
    /// [`CoreError::UnknownBorrower`], [`CoreError::BorrowerFinished`],
    /// [`CoreError::NotLent`] (not held), [`CoreError::StaleHandle`] (held
    /// under another page).
    pub fn give_back(&mut self, loan: Loan) -> Result<()> {
        let b = loan.borrower;
        let s = self
            .borrowers
            .get_mut(&b)
            .ok_or(CoreError::UnknownBorrower { borrower: b.0 })?;
        if s.finished {
            return Err(CoreError::BorrowerFinished { borrower: b.0 });
        }
        match s.loans.get(&loan.logical) {
            None => {
                return Err(CoreError::NotLent {
                    borrower: b.0,
                    logical: loan.logical,
                })
            }
            Some(&h) if h != loan.handle => {
                return Err(CoreError::StaleHandle {
                    page: loan.handle.page.0,
                    generation: loan.handle.generation,
                })
            }
            Some(_) => {}
        }
        s.loans.remove(&loan.logical);
        self.lent -= 1;
        self.retired.retire(&self.fence, loan.handle);
        Ok(())
    }

    /// Revokes up to `n` lent pages chosen by the policy from active
    /// borrowers (with [`ProportionalOldestFirst`]: exactly `min(n, lent)`). The returned loans, in (borrower,
    /// logical) order, are no longer the borrowers': unmap them before the
    /// next [`collect`](Self::collect); the pages become free only after
    /// every reader that could see them left. O(h + k log k) for h pages
    /// held and k taken.
    ///
    /// # Errors
    /// [`CoreError::InvalidPolicyChoice`] if the policy's answer is invalid;
    /// nothing is reclaimed then.
    pub fn reclaim(&mut self, n: u32) -> Result<Vec<Loan>> {
        if n == 0 || self.lent == 0 {
            return Ok(Vec::new());
        }
        let keys: Vec<(BorrowerId, Vec<u32>)> = self
            .borrowers
            .iter()
            .filter(|(_, s)| !s.finished && !s.loans.is_empty())
            .map(|(&b, s)| (b, s.loans.keys().copied().collect()))
            .collect();
        let holdings: Vec<(BorrowerId, &[u32])> =
            keys.iter().map(|(b, l)| (*b, l.as_slice())).collect();
        let picks = self.policy.choose(&holdings, n);
        if picks.len() > n as usize {
            return Err(Self::invalid("more pages than asked for"));
        }
        // Group by borrower and sort, then check every group before touching
        // anything (all or nothing).
        let mut groups: BTreeMap<BorrowerId, Vec<u32>> = BTreeMap::new();
        for &(b, l) in &picks {
            groups.entry(b).or_default().push(l);
        }
        let mut plans = Vec::with_capacity(groups.len());
        for (b, mut ls) in groups {
            ls.sort_unstable();
            if ls.windows(2).any(|w| w[0] == w[1]) {
                return Err(Self::invalid("page chosen twice"));
            }
            let Some(s) = self.borrowers.get(&b).filter(|s| !s.finished) else {
                return Err(Self::invalid("page not held by an active borrower"));
            };
            // Oldest-first policies take a prefix: check it in one ordered
            // pass and cut it off with one split.
            let prefix = s.loans.keys().take(ls.len()).eq(ls.iter());
            if !prefix && !ls.iter().all(|l| s.loans.contains_key(l)) {
                return Err(Self::invalid("page not held by an active borrower"));
            }
            plans.push((b, ls, prefix));
        }
        let mut out = Vec::with_capacity(picks.len());
        for (b, ls, prefix) in plans {
            let Some(s) = self.borrowers.get_mut(&b) else {
                continue; // checked above
            };
            if prefix {
                let rest = match s.loans.keys().nth(ls.len()) {
                    Some(&cut) => s.loans.split_off(&cut),
                    None => BTreeMap::new(),
                };
                let taken = std::mem::replace(&mut s.loans, rest);
                out.extend(taken.into_iter().map(|(logical, handle)| Loan {
                    borrower: b,
                    logical,
                    handle,
                }));
            } else {
                for l in ls {
                    if let Some(handle) = s.loans.remove(&l) {
                        out.push(Loan {
                            borrower: b,
                            logical: l,
                            handle,
                        });
                    }
                }
            }
        }
        self.lent -= out.len() as u32;
        self.retired
            .retire_many(&self.fence, out.iter().map(|loan| loan.handle));
        Ok(out)
    }

    #[cold]
    fn invalid(reason: &'static str) -> CoreError {
        CoreError::InvalidPolicyChoice { reason }
    }

    /// The borrower is done: its pages are queued for hand-back in logical
    /// order (oldest first), released by [`hand_back_step`](Self::hand_back_step).
    /// A borrower with no pages is forgotten at once; otherwise once its last
    /// page leaves the queue (then its id may be reused).
    ///
    /// # Errors
    /// [`CoreError::UnknownBorrower`], [`CoreError::BorrowerFinished`].
    pub fn finish(&mut self, b: BorrowerId) -> Result<()> {
        let s = self
            .borrowers
            .get_mut(&b)
            .ok_or(CoreError::UnknownBorrower { borrower: b.0 })?;
        if s.finished {
            return Err(CoreError::BorrowerFinished { borrower: b.0 });
        }
        let loans = std::mem::take(&mut s.loans);
        let n = loans.len() as u32;
        if n == 0 {
            self.borrowers.remove(&b);
            return Ok(());
        }
        s.finished = true;
        s.queued = n;
        self.lent -= n;
        self.queue
            .extend(loans.into_iter().map(|(logical, handle)| Loan {
                borrower: b,
                logical,
                handle,
            }));
        Ok(())
    }

    /// Moves at most `max_per_step` queued pages of finished borrowers behind
    /// the fence (bounded work per engine step) and returns them, in finish
    /// order. Unmap them (if still mapped) before the next collect.
    pub fn hand_back_step(&mut self, max_per_step: u32) -> Vec<Loan> {
        let k = (max_per_step as usize).min(self.queue.len());
        let out: Vec<Loan> = self.queue.drain(..k).collect();
        for loan in &out {
            if let Some(s) = self.borrowers.get_mut(&loan.borrower) {
                s.queued -= 1;
                if s.queued == 0 {
                    self.borrowers.remove(&loan.borrower);
                }
            }
        }
        self.retired
            .retire_many(&self.fence, out.iter().map(|loan| loan.handle));
        out
    }

    /// Frees every pending page that no reader inside the fence could still
    /// see; returns how many became free. Call it once per step, after the
    /// maps were updated.
    pub fn collect(&mut self) -> u32 {
        let mut done = std::mem::take(&mut self.scratch);
        self.retired.collect_into(&self.fence, &mut done);
        self.free_all(&mut done)
    }

    fn free_all(&mut self, done: &mut Vec<PageHandle>) -> u32 {
        let n = done.len() as u32;
        for h in done.drain(..) {
            // Every retired handle came from this pool and is freed once.
            let freed = self.pool.free(h);
            debug_assert!(freed.is_ok(), "{freed:?}");
        }
        self.scratch = std::mem::take(done);
        n
    }

    /// MUTATION for the loom tests only: frees every pending page without
    /// looking at readers (the fence removed). Never use it.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn collect_ignoring_readers(&mut self) -> u32 {
        let mut done = self.retired.collect_ignoring_readers(&self.fence);
        self.free_all(&mut done)
    }

    /// The loans `b` holds now, in logical order (empty if unknown or
    /// finished).
    pub fn loans_of(&self, b: BorrowerId) -> Vec<Loan> {
        self.borrowers.get(&b).map_or_else(Vec::new, |s| {
            s.loans
                .iter()
                .map(|(&logical, &handle)| Loan {
                    borrower: b,
                    logical,
                    handle,
                })
                .collect()
        })
    }

    /// Known borrower ids (active, or finished with pages queued), ascending.
    pub fn borrowers(&self) -> impl Iterator<Item = BorrowerId> + '_ {
        self.borrowers.keys().copied()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
