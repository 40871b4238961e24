//! Epoch-based reader fences (in the spirit of crossbeam-epoch).
//!
//! A reader *enters* the fence before it reads shared state (a page map) and
//! *leaves* when it no longer uses anything it found there. A writer that
//! unpublishes an item (unmaps a page) *retires* it into a [`Retired`] list;
//! the item comes back from [`Retired::collect`] only once every reader that
//! could have seen it has left.
//!
//! ## Protocol and memory orderings
//! - The fence holds a global epoch `E` and a fixed array of reader slots
//!   (`0` = inactive, else the reader's epoch + 1), plus a locked overflow
//!   list for readers beyond the slots and a locked list of asynchronous
//!   readers (GPU work) given as [`CompletionSignal`]s.
//! - `collect` first *seals* newly retired items: `tag = E.fetch_add(1)`.
//!   The caller unpublished them before calling `collect`, so that write is
//!   sequenced before the advance.
//! - A reader with epoch `e > tag` loaded `E` after the advance (acquire /
//!   release on `E`), so it sees the unpublish and cannot reach the item. A
//!   reader with `e <= tag` may have seen it, so the item waits for it.
//! - A reader that announces itself too late for the collector's scan is
//!   covered by a Dekker pair of `SeqCst` fences: reader "announce; fence;
//!   read map", collector "unpublish; fence; scan". Either the scan sees the
//!   announcement, or the reader's map read sees the unpublish.
//! - Leaving is a `Release` store and the scan an `Acquire` load, so all of a
//!   reader's reads of a page happen before the page's reuse.

use std::collections::VecDeque;
use std::fmt;

use crossbeam_utils::CachePadded;

use crate::sync::{fence, lock, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// Reader slots an [`EpochFence::new`] fence has (2 under `--cfg loom`, to
/// keep the model small). Readers beyond this fall back to a locked list.
#[cfg(not(loom))]
pub const DEFAULT_READER_SLOTS: usize = 64;
/// Reader slots an [`EpochFence::new`] fence has (2 under `--cfg loom`, to
/// keep the model small). Readers beyond this fall back to a locked list.
#[cfg(loom)]
pub const DEFAULT_READER_SLOTS: usize = 2;

const INACTIVE: u64 = 0;

/// An asynchronous reader's "I am done" signal, e.g. a CUDA event recorded on
/// a stream after the last kernel that reads a page table (implemented in
/// `cuda-kernels`).
///
/// `is_complete` must return `true` only once the reader will never again
/// read anything it could reach at registration, and the reader's reads must
/// happen-before that observation (a CUDA event query that returns success
/// gives this). It must be cheap and must not block.
pub trait CompletionSignal: Send + Sync {
    /// Whether the reader has finished (non-blocking).
    fn is_complete(&self) -> bool;
}

/// A [`CompletionSignal`] set by hand: clone it, register one clone with
/// [`EpochFence::enter_signal`], call [`complete`](Self::complete) on another
/// when the reader is done. Useful for CPU worker pools and for tests.
#[derive(Clone, Debug, Default)]
pub struct FlagSignal(Arc<AtomicBool>);

impl FlagSignal {
    /// A new, not yet complete signal.
    pub fn new() -> Self {
        FlagSignal(Arc::new(AtomicBool::new(false)))
    }

    /// Marks the reader as done.
    pub fn complete(&self) {
        // Release: the reader's reads happen-before a fence scan that
        // acquire-loads `true` and then lets its pages be reused.
        self.0.store(true, Ordering::Release);
    }
}

impl CompletionSignal for FlagSignal {
    fn is_complete(&self) -> bool {
        // Acquire: pairs with the Release in `complete`.
        self.0.load(Ordering::Acquire)
    }
}

/// An epoch-based reader fence. Thread-safe: every method takes `&self`.
///
/// Readers call [`enter`](Self::enter) (CPU) or
/// [`enter_signal`](Self::enter_signal) (asynchronous, e.g. GPU) before they
/// read a published page map; writers retire unpublished pages into a
/// [`Retired`] list and get them back only after those readers left.
///
/// Cost: `enter` + leave is one load, one CAS, one `SeqCst` fence and one
/// store when a slot is free (see `benches/`).
///
/// ```
/// use tier_core::{EpochFence, FlagSignal, Retired};
///
/// let fence = EpochFence::new();
/// let mut retired = Retired::new();
/// let gpu_step = FlagSignal::new(); // stands in for a CUDA event
/// fence.enter_signal(Box::new(gpu_step.clone())); // the step reads the table
/// let cpu = fence.enter();                        // so does a CPU thread
/// retired.retire(&fence, 7u32);                   // page 7 was unmapped
/// assert!(retired.collect(&fence).is_empty());    // both may still read it
/// drop(cpu);
/// assert!(retired.collect(&fence).is_empty());    // the GPU step still may
/// gpu_step.complete();
/// assert_eq!(retired.collect(&fence), vec![7]);   // safe to reuse
/// ```
pub struct EpochFence {
    epoch: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<AtomicU64>]>,
    overflow: Mutex<Vec<u64>>,
    signals: Mutex<Vec<(u64, Box<dyn CompletionSignal>)>>,
}

impl fmt::Debug for EpochFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpochFence")
            .field("epoch", &self.epoch())
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Default for EpochFence {
    fn default() -> Self {
        Self::new()
    }
}

impl EpochFence {
    /// A fence at epoch 0 with [`DEFAULT_READER_SLOTS`] reader slots.
    pub fn new() -> Self {
        Self::with_reader_slots(DEFAULT_READER_SLOTS)
    }

    /// A fence with `slots` lock-free reader slots (0 is allowed: every
    /// reader then takes the locked overflow path). Size it to the number of
    /// CPU readers that are inside at once.
    pub fn with_reader_slots(slots: usize) -> Self {
        EpochFence {
            epoch: CachePadded::new(AtomicU64::new(0)),
            slots: (0..slots)
                .map(|_| CachePadded::new(AtomicU64::new(INACTIVE)))
                .collect(),
            overflow: Mutex::new(Vec::new()),
            signals: Mutex::new(Vec::new()),
        }
    }

    /// Enters the fence as a CPU reader; leaving is dropping the guard.
    /// Enter *before* reading the page map, leave after the last use of any
    /// page found there.
    #[inline]
    pub fn enter(&self) -> ReaderGuard<'_> {
        // Acquire: pairs with the Release of `advance`. A reader that sees an
        // epoch past an item's tag also sees the unpublish made before it.
        let e = self.epoch.load(Ordering::Acquire);
        for (i, slot) in self.slots.iter().enumerate() {
            // Relaxed: the announcement is ordered by the SeqCst fence just
            // below, not by the CAS itself. An epoch that is stale by the time
            // it lands is only more conservative (it blocks more items).
            if slot
                .compare_exchange(INACTIVE, e + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                // SeqCst fence: the reader half of the Dekker pair with the
                // fence in `min_active_epoch`. Either the collector's scan sees
                // this slot, or our later map reads see its unpublish.
                fence(Ordering::SeqCst);
                return ReaderGuard {
                    fence: self,
                    kind: GuardKind::Slot(i),
                    epoch: e,
                };
            }
        }
        self.enter_overflow()
    }

    #[cold]
    fn enter_overflow(&self) -> ReaderGuard<'_> {
        let mut list = lock(&self.overflow);
        // Loaded under the lock: if the collector scanned the list before we
        // took the lock, our lock acquire synchronizes with its unlock, so we
        // see its advance and unpublish (Acquire pairs with `advance`).
        let e = self.epoch.load(Ordering::Acquire);
        list.push(e);
        ReaderGuard {
            fence: self,
            kind: GuardKind::Overflow,
            epoch: e,
        }
    }

    /// Registers an asynchronous reader (e.g. GPU work already enqueued that
    /// reads the page table) at the current epoch; it counts as left once
    /// `signal.is_complete()` returns true.
    ///
    /// Call it after enqueueing the work and before the next `collect` of
    /// anything that work may see (typically on the thread that owns the
    /// map). Completed signals are dropped during collection.
    pub fn enter_signal(&self, signal: Box<dyn CompletionSignal>) {
        let mut list = lock(&self.signals);
        // Under the lock for the same reason as in `enter_overflow`.
        let e = self.epoch.load(Ordering::Acquire);
        list.push((e, signal));
    }

    /// The current epoch (diagnostic; it moves whenever items are sealed).
    pub fn epoch(&self) -> u64 {
        // Relaxed: a snapshot for display and tests; no data depends on it.
        self.epoch.load(Ordering::Relaxed)
    }

    /// Number of CPU readers inside plus asynchronous readers not yet known
    /// to be complete (diagnostic snapshot).
    pub fn reader_count(&self) -> usize {
        // Relaxed: a snapshot, no data depends on it.
        let slots = self
            .slots
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != INACTIVE)
            .count();
        slots + lock(&self.overflow).len() + lock(&self.signals).len()
    }

    /// Advances the epoch and returns the old value: the *tag* for items
    /// unpublished before this call. An item tagged `t` may be reused once
    /// [`min_active_epoch`](Self::min_active_epoch) `> t`.
    pub fn advance(&self) -> u64 {
        // Release: the caller's unpublish happens-before any reader that
        // acquire-loads the new epoch (see `enter`).
        self.epoch.fetch_add(1, Ordering::Release)
    }

    /// The smallest epoch of any reader still inside, or `u64::MAX` if none.
    /// Drops completed asynchronous readers.
    pub fn min_active_epoch(&self) -> u64 {
        // SeqCst fence: the collector half of the Dekker pair with `enter`.
        fence(Ordering::SeqCst);
        let mut min = u64::MAX;
        for slot in self.slots.iter() {
            // Acquire: pairs with the Release in `ReaderGuard::drop`; if we
            // see a slot empty, that reader's page reads are done before we
            // let a page go.
            let v = slot.load(Ordering::Acquire);
            if v != INACTIVE {
                min = min.min(v - 1);
            }
        }
        for &e in lock(&self.overflow).iter() {
            min = min.min(e);
        }
        lock(&self.signals).retain(|(e, s)| {
            if s.is_complete() {
                false
            } else {
                min = min.min(*e);
                true
            }
        });
        min
    }
}

enum GuardKind {
    Slot(usize),
    Overflow,
}

/// A CPU reader inside an [`EpochFence`]; dropping it leaves the fence.
pub struct ReaderGuard<'a> {
    fence: &'a EpochFence,
    kind: GuardKind,
    epoch: u64,
}

impl ReaderGuard<'_> {
    /// The epoch the reader entered at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl fmt::Debug for ReaderGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderGuard")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Drop for ReaderGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        match self.kind {
            // Release: every read this reader made happens-before a collector
            // that acquire-loads INACTIVE and then reuses a page.
            GuardKind::Slot(i) => self.fence.slots[i].store(INACTIVE, Ordering::Release),
            GuardKind::Overflow => leave_overflow(self.fence, self.epoch),
        }
    }
}

#[cold]
fn leave_overflow(fence: &EpochFence, epoch: u64) {
    let mut list = lock(&fence.overflow);
    if let Some(i) = list.iter().position(|&e| e == epoch) {
        list.swap_remove(i);
    }
}

/// Items retired behind an [`EpochFence`]: each comes back from
/// [`collect`](Self::collect) only once no reader that could have seen it is
/// still inside.
///
/// Protocol: unpublish the item (unmap the page), [`retire`](Self::retire)
/// it, then call `collect` (now or at any later step). The unpublish may also
/// happen between `retire` and the next `collect`: items are sealed (tagged
/// with a fresh epoch) at the first `collect` after their retire. Use one
/// `Retired` with one fence.
pub struct Retired<T> {
    unsealed: Vec<T>,
    sealed: VecDeque<(u64, T)>,
}

impl<T> Default for Retired<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for Retired<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retired")
            .field("unsealed", &self.unsealed)
            .field("sealed", &self.sealed)
            .finish()
    }
}

impl<T> Retired<T> {
    /// An empty list.
    pub fn new() -> Self {
        Retired {
            unsealed: Vec::new(),
            sealed: VecDeque::new(),
        }
    }

    /// Retires `item`. `fence` is the fence it will be collected against; the
    /// epoch is advanced when the item is sealed at the next
    /// [`collect`](Self::collect), so the caller may unpublish it until then.
    pub fn retire(&mut self, fence: &EpochFence, item: T) {
        let _ = fence;
        self.unsealed.push(item);
    }

    /// Retires every item of `items` (one epoch advance for all of them at
    /// the next collect).
    pub fn retire_many(&mut self, fence: &EpochFence, items: impl IntoIterator<Item = T>) {
        let _ = fence;
        self.unsealed.extend(items);
    }

    /// Items retired but not yet returned by `collect`.
    pub fn pending(&self) -> usize {
        self.unsealed.len() + self.sealed.len()
    }

    /// Seals newly retired items and returns, oldest first, every item that
    /// no reader still inside `fence` could have seen: safe to reuse.
    pub fn collect(&mut self, fence: &EpochFence) -> Vec<T> {
        let mut out = Vec::new();
        self.collect_into(fence, &mut out);
        out
    }

    /// [`collect`](Self::collect) into `out` (appended); returns how many
    /// items were appended.
    pub fn collect_into(&mut self, fence: &EpochFence, out: &mut Vec<T>) -> usize {
        self.seal(fence);
        if self.sealed.is_empty() {
            return 0;
        }
        let min = fence.min_active_epoch();
        let before = out.len();
        // Tags are non-decreasing (every seal is a later advance of the same
        // fence), so the releasable items are a prefix.
        while self.sealed.front().is_some_and(|&(tag, _)| tag < min) {
            if let Some((_, item)) = self.sealed.pop_front() {
                out.push(item);
            }
        }
        out.len() - before
    }

    fn seal(&mut self, fence: &EpochFence) {
        if !self.unsealed.is_empty() {
            let tag = fence.advance();
            self.sealed
                .extend(self.unsealed.drain(..).map(|x| (tag, x)));
        }
    }

    /// MUTATION for the loom tests only: releases every retired item without
    /// looking at readers (the fence removed). Never use it.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn collect_ignoring_readers(&mut self, fence: &EpochFence) -> Vec<T> {
        self.seal(fence);
        self.sealed.drain(..).map(|(_, x)| x).collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn item_waits_for_reader_that_entered_before() {
        let f = EpochFence::new();
        let mut r = Retired::new();
        let g = f.enter();
        r.retire(&f, 7u32);
        assert!(r.collect(&f).is_empty());
        assert_eq!(r.pending(), 1);
        // A reader entering after the seal cannot see the item: no wait.
        let g2 = f.enter();
        drop(g);
        assert_eq!(r.collect(&f), vec![7]);
        drop(g2);
        assert_eq!(f.reader_count(), 0);
    }

    #[test]
    fn signal_reader_blocks_until_complete() {
        let f = EpochFence::new();
        let s = FlagSignal::new();
        f.enter_signal(Box::new(s.clone()));
        let mut r = Retired::new();
        r.retire_many(&f, [1u8, 2]);
        assert!(r.collect(&f).is_empty());
        s.complete();
        assert_eq!(r.collect(&f), vec![1, 2]);
        assert_eq!(f.reader_count(), 0, "completed signals are dropped");
    }

    #[test]
    fn overflow_readers_are_fenced_too() {
        let f = EpochFence::with_reader_slots(1);
        let a = f.enter();
        let b = f.enter(); // overflow path
        let mut r = Retired::new();
        r.retire(&f, ());
        drop(a);
        assert!(r.collect(&f).is_empty());
        drop(b);
        assert_eq!(r.collect(&f).len(), 1);
    }

    #[test]
    fn threads_enter_and_leave() {
        let f = std::sync::Arc::new(EpochFence::with_reader_slots(2));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let _g = f.enter();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(f.reader_count(), 0);
    }
}
