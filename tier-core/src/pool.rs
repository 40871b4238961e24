//! Fixed-capacity page pool with O(1) alloc/free and generation-tagged handles.

use crate::alloc::try_filled;
use crate::error::{CoreError, Result};
use crate::page::{PageHandle, PageId, Tier};

/// A fixed-capacity pool of physical pages (or slots) in one [`Tier`].
///
/// Allocation and free are O(1) (a LIFO free list). Each page carries a `u32`
/// generation that is bumped on every free, so a [`PageHandle`] kept past its
/// free is rejected instead of aliasing the page's next owner. The pool only
/// does the bookkeeping: the memory itself (device arena, pinned buffer)
/// belongs to the caller, indexed by [`PageId`].
///
/// A [`free`](Self::free) that fails tells a double free (the handle is the
/// one whose free was the page's last event) from a stale handle (anything
/// else: freed and reused, or a generation the pool never issued, e.g. a
/// forged handle on a page that was never allocated).
///
/// Memory: 9 bytes per page plus the struct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagePool {
    tier: Tier,
    /// Free page ids, popped from the back (LIFO keeps recently freed pages
    /// warm in caches).
    free: Vec<u32>,
    /// Current generation of each page.
    generation: Vec<u32>,
    /// Where each page is in its life.
    state: Vec<PageState>,
}

/// The life of one page. `Fresh` and `Freed` are both free; only a `Freed`
/// page has a last issued handle (generation `current - 1`, wrapping), so
/// only there can a failed free be a double free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageState {
    /// Never allocated: no handle to this page was ever issued.
    Fresh,
    /// Allocated under the page's current generation.
    Live,
    /// Freed at least once, free now.
    Freed,
}

impl PagePool {
    /// Makes a pool of `capacity` pages (ids `0..capacity`), all free.
    ///
    /// # Errors
    /// [`CoreError::ZeroCapacity`] if `capacity == 0`;
    /// [`CoreError::AllocationFailed`] if the 9-bytes-per-page bookkeeping
    /// cannot be allocated.
    pub fn new(tier: Tier, capacity: u32) -> Result<Self> {
        if capacity == 0 {
            return Err(CoreError::ZeroCapacity);
        }
        let n = capacity as usize;
        let mut free = try_filled(n, 0u32, "page pool free list")?;
        // Reversed so the first allocations hand out 0, 1, 2, ...
        for (slot, p) in free.iter_mut().zip((0..capacity).rev()) {
            *slot = p;
        }
        Ok(PagePool {
            tier,
            free,
            generation: try_filled(n, 0, "page pool generations")?,
            state: try_filled(n, PageState::Fresh, "page pool states")?,
        })
    }

    /// The tier the pool's pages live in.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Total pages in the pool.
    pub fn capacity(&self) -> u32 {
        self.state.len() as u32
    }

    /// Pages free now.
    pub fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    /// Pages allocated now (`capacity - free_count`).
    pub fn used_count(&self) -> u32 {
        self.capacity() - self.free_count()
    }

    /// Allocates one page in O(1).
    ///
    /// # Errors
    /// [`CoreError::PoolExhausted`] (`requested: 1`) if no page is free.
    pub fn alloc(&mut self) -> Result<PageHandle> {
        match self.free.pop() {
            Some(p) => {
                self.state[p as usize] = PageState::Live;
                Ok(PageHandle {
                    page: PageId(p),
                    generation: self.generation[p as usize],
                })
            }
            None => Err(self.exhausted(1)),
        }
    }

    /// Allocates `n` pages, all or nothing, in O(n).
    ///
    /// # Errors
    /// [`CoreError::PoolExhausted`] if fewer than `n` pages are free; nothing
    /// is allocated then.
    pub fn alloc_many(&mut self, n: u32) -> Result<Vec<PageHandle>> {
        if n > self.free_count() {
            return Err(self.exhausted(n));
        }
        let start = self.free.len() - n as usize;
        let mut out = Vec::with_capacity(n as usize);
        // Same order as n single allocs (pop from the back).
        for &p in self.free[start..].iter().rev() {
            self.state[p as usize] = PageState::Live;
            out.push(PageHandle {
                page: PageId(p),
                generation: self.generation[p as usize],
            });
        }
        self.free.truncate(start);
        Ok(out)
    }

    /// Frees the page of `h` in O(1) and bumps its generation, so `h` (and
    /// every copy of it) goes stale.
    ///
    /// # Errors
    /// - [`CoreError::OutOfRange`] if the page id is not below the capacity.
    /// - [`CoreError::DoubleFree`] if this very handle was already freed (its
    ///   free was the page's last event).
    /// - [`CoreError::StaleHandle`] if the page was freed and reused, or the
    ///   handle's generation was never issued (a never-allocated page has no
    ///   handle to free twice, whatever generation a forged handle carries).
    pub fn free(&mut self, h: PageHandle) -> Result<()> {
        self.check(h)?;
        let i = h.page.index();
        self.state[i] = PageState::Freed;
        self.generation[i] = self.generation[i].wrapping_add(1);
        self.free.push(h.page.0);
        Ok(())
    }

    /// Whether `h` refers to a page that is allocated under `h`'s generation.
    pub fn is_live(&self, h: PageHandle) -> bool {
        let i = h.page.index();
        i < self.state.len()
            && self.state[i] == PageState::Live
            && self.generation[i] == h.generation
    }

    /// Checks that `h` may be freed, without changing anything.
    ///
    /// # Errors
    /// As [`free`](Self::free).
    pub fn check(&self, h: PageHandle) -> Result<()> {
        let i = h.page.index();
        if i >= self.state.len() {
            return Err(CoreError::OutOfRange {
                index: u64::from(h.page.0),
                len: self.state.len() as u64,
            });
        }
        if self.state[i] == PageState::Live && self.generation[i] == h.generation {
            return Ok(());
        }
        Err(self.bad_handle(h))
    }

    #[cold]
    fn bad_handle(&self, h: PageHandle) -> CoreError {
        let i = h.page.index();
        // Only a freed page has a last issued handle; its generation is one
        // below the page's (wrapping, as the bump on free wraps).
        if self.state[i] == PageState::Freed && self.generation[i] == h.generation.wrapping_add(1) {
            CoreError::DoubleFree { page: h.page.0 }
        } else {
            CoreError::StaleHandle {
                page: h.page.0,
                generation: h.generation,
            }
        }
    }

    #[cold]
    fn exhausted(&self, requested: u32) -> CoreError {
        CoreError::PoolExhausted {
            requested,
            free: self.free_count(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_capacity_is_an_error() {
        assert_eq!(
            PagePool::new(Tier::DeviceHbm, 0).unwrap_err(),
            CoreError::ZeroCapacity
        );
    }

    #[test]
    fn alloc_free_reuse_and_stale_handles() {
        let mut p = PagePool::new(Tier::HostPinned, 2).unwrap();
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert_eq!((a.page(), b.page()), (PageId(0), PageId(1)));
        assert_eq!(
            p.alloc().unwrap_err(),
            CoreError::PoolExhausted {
                requested: 1,
                free: 0
            }
        );
        p.free(a).unwrap();
        assert_eq!(p.free(a).unwrap_err(), CoreError::DoubleFree { page: 0 });
        let a2 = p.alloc().unwrap();
        assert_eq!(a2.page(), a.page());
        assert_ne!(a2.generation(), a.generation());
        // The old handle now names a page someone else owns: stale, not an alias.
        let before = p.clone();
        assert_eq!(
            p.free(a).unwrap_err(),
            CoreError::StaleHandle {
                page: 0,
                generation: 0
            }
        );
        assert!(!p.is_live(a) && p.is_live(a2));
        assert_eq!(p.free_count(), before.free_count());
        let bad = PageHandle::from_raw(PageId(7), 0);
        assert_eq!(
            p.free(bad).unwrap_err(),
            CoreError::OutOfRange { index: 7, len: 2 }
        );
    }

    #[test]
    fn forged_handle_on_a_fresh_page_is_stale_not_a_double_free() {
        // A never-allocated page has generation 0, and u32::MAX + 1 wraps to
        // 0: this used to be reported as a double free.
        let mut p = PagePool::new(Tier::DeviceHbm, 2).unwrap();
        let before = p.clone();
        for generation in [u32::MAX, 0, 1] {
            assert_eq!(
                p.free(PageHandle::from_raw(PageId(1), generation))
                    .unwrap_err(),
                CoreError::StaleHandle {
                    page: 1,
                    generation
                }
            );
        }
        assert_eq!(p, before);
        // Once the page was allocated and freed, its last handle is a double
        // free and every other generation is stale.
        let a = p.alloc().unwrap();
        assert_eq!(a.page(), PageId(0));
        p.free(a).unwrap();
        assert_eq!(p.free(a).unwrap_err(), CoreError::DoubleFree { page: 0 });
        assert_eq!(
            p.free(PageHandle::from_raw(PageId(0), u32::MAX))
                .unwrap_err(),
            CoreError::StaleHandle {
                page: 0,
                generation: u32::MAX
            }
        );
    }

    #[test]
    fn double_free_is_recognised_across_the_generation_wrap() {
        let mut p = PagePool::new(Tier::DeviceHbm, 1).unwrap();
        // Stand-in for 2^32 - 1 earlier frees of page 0.
        p.generation[0] = u32::MAX;
        p.state[0] = PageState::Freed;
        let h = p.alloc().unwrap();
        assert_eq!(h.generation(), u32::MAX);
        p.free(h).unwrap();
        assert_eq!(p.free(h).unwrap_err(), CoreError::DoubleFree { page: 0 });
        let h2 = p.alloc().unwrap();
        assert_eq!(h2.generation(), 0);
        assert_eq!(
            p.free(h).unwrap_err(),
            CoreError::StaleHandle {
                page: 0,
                generation: u32::MAX
            }
        );
        p.free(h2).unwrap();
    }

    #[test]
    fn alloc_many_is_all_or_nothing() {
        let mut p = PagePool::new(Tier::DeviceHbm, 4).unwrap();
        let hs = p.alloc_many(3).unwrap();
        assert_eq!(
            hs.iter().map(|h| h.page().0).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            p.alloc_many(2).unwrap_err(),
            CoreError::PoolExhausted {
                requested: 2,
                free: 1
            }
        );
        assert_eq!(p.free_count(), 1);
        assert_eq!(p.used_count(), 3);
    }
}
