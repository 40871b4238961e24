//! [`ArenaPages`]: who holds each arena page. One `tier-core` [`Lender`] owns every page of the
//! arena; a page moves between two uses: a session's *fixed* pages (hot cache, tail, scratch;
//! reserved from admission to finish with [`Lender::reserve`], never revoked, invisible to the
//! reclaim policy) and *history* pages (borrowed by the session's id, revocable oldest first in
//! proportion to holdings, handed back in bounded chunks). Both come from, and go back through
//! the reader fence to, the same free pages, so an admission sees exactly the free + reclaimable
//! pages of one pool.

use tier_core::{BorrowerId, EpochFence, Lender, Loan, PageHandle, Tier};

use crate::data::SessionId;
use crate::error::Result;

#[inline]
fn history_id(s: SessionId) -> BorrowerId {
    BorrowerId(s)
}

/// Page counts of a pool (see [`crate::ElasticPool::pages`]). `free + fixed + history + pending +
/// queued == capacity` always.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PageCounts {
    /// Pages in the arena.
    pub capacity: u32,
    /// Pages free now.
    pub free: u32,
    /// Pages held as live sessions' fixed rows (hot cache, tail, scratch).
    pub fixed: u32,
    /// History pages borrowed by live sessions.
    pub history: u32,
    /// Pages reclaimed or handed back, waiting for readers in flight (reader fence).
    pub pending: u32,
    /// History pages of finished sessions waiting to be handed back (bounded chunks per step).
    pub queued: u32,
}

/// Who holds each arena page (see the module docs).
#[derive(Debug)]
pub(crate) struct ArenaPages {
    lender: Lender,
}

impl ArenaPages {
    pub(crate) fn new(pages: u32) -> Result<Self> {
        Ok(Self {
            lender: Lender::new(Tier::DeviceHbm, pages)?,
        })
    }

    /// The reader fence every resolve registers in.
    pub(crate) fn fence(&self) -> &EpochFence {
        self.lender.fence()
    }

    pub(crate) fn counts(&self) -> PageCounts {
        let l = &self.lender;
        PageCounts {
            capacity: l.capacity(),
            free: l.free_count(),
            fixed: l.reserved_count(),
            history: l.lent_count(),
            pending: l.pending_count(),
            queued: l.queued_count(),
        }
    }

    pub(crate) fn free_count(&self) -> u32 {
        self.lender.free_count()
    }

    pub(crate) fn pending_count(&self) -> u32 {
        self.lender.pending_count()
    }

    pub(crate) fn queued_count(&self) -> u32 {
        self.lender.queued_count()
    }

    /// Frees the pending pages no reader can see any more; returns how many.
    pub(crate) fn collect(&mut self) -> u32 {
        self.lender.collect()
    }

    /// Moves at most `max` queued pages of finished sessions behind the fence; returns how many.
    pub(crate) fn hand_back(&mut self, max: u32) -> u32 {
        self.lender.hand_back_step(max).len() as u32
    }

    /// Takes `n` free pages as a session's fixed pages (all or nothing).
    pub(crate) fn take_fixed(&mut self, n: u32) -> Result<Vec<PageHandle>> {
        Ok(self.lender.reserve(n)?)
    }

    /// Gives a finished session's fixed pages back through the reader fence at once.
    pub(crate) fn release_fixed(&mut self, pages: Vec<PageHandle>) -> Result<()> {
        for h in pages {
            self.lender.release(h)?;
        }
        Ok(())
    }

    /// Pages reserved as fixed pages (all sessions).
    pub(crate) fn fixed_count(&self) -> u32 {
        self.lender.reserved_count()
    }

    /// Lends one free page per history page index in `logical` to `session` (all or nothing).
    pub(crate) fn lend_history(
        &mut self,
        session: SessionId,
        logical: &[u32],
    ) -> Result<Vec<Loan>> {
        Ok(self.lender.lend(history_id(session), logical)?)
    }

    /// Revokes `n` history pages (oldest history first, in proportion to holdings); the loans name
    /// their session in `borrower`.
    pub(crate) fn reclaim_history(&mut self, n: u32) -> Result<Vec<Loan>> {
        Ok(self.lender.reclaim(n)?)
    }

    /// Gives back the history pages of `session` whose indices are in `logical` (those it holds;
    /// the rest are skipped); the loans name them. The pages go behind the fence.
    pub(crate) fn revoke_history(
        &mut self,
        session: SessionId,
        logical: &[u32],
    ) -> Result<Vec<Loan>> {
        let mut want = tier_core::alloc::try_copied(logical, "revoked page indices")?;
        want.sort_unstable();
        let loans: Vec<Loan> = self
            .lender
            .loans_of(history_id(session))
            .into_iter()
            .filter(|l| want.binary_search(&l.logical).is_ok())
            .collect();
        for &loan in &loans {
            self.lender.give_back(loan)?;
        }
        Ok(loans)
    }

    /// Queues a finished session's history pages for hand-back.
    pub(crate) fn finish_history(&mut self, session: SessionId) -> Result<()> {
        if self.lender.is_known(history_id(session)) {
            self.lender.finish(history_id(session))?;
        }
        Ok(())
    }

    pub(crate) fn history_held(&self, session: SessionId) -> u32 {
        self.lender.held_by(history_id(session))
    }

    pub(crate) fn history_loans(&self, session: SessionId) -> Vec<Loan> {
        self.lender.loans_of(history_id(session))
    }

    /// `free + lent + reserved + pending + queued == capacity`, or a description of the mismatch.
    pub(crate) fn check_books(&self) -> std::result::Result<(), String> {
        let l = &self.lender;
        let total = l.free_count()
            + l.lent_count()
            + l.reserved_count()
            + l.pending_count()
            + l.queued_count();
        if total != l.capacity() {
            return Err(format!(
                "free {} + lent {} + reserved {} + pending {} + queued {} != capacity {}",
                l.free_count(),
                l.lent_count(),
                l.reserved_count(),
                l.pending_count(),
                l.queued_count(),
                l.capacity()
            ));
        }
        Ok(())
    }
}
