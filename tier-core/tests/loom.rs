//! Loom models of the reader fence: every interleaving (preemption bound 3)
//! of a reader and a writer that unmaps, retires, collects and reuses a page.
//!
//! Run (as `.ci/run` does): `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p tier-core --test loom`
//!
//! A page's content is a `loom::cell::UnsafeCell`, so loom reports any access
//! of a reused page that is not ordered after the reader's last read (a
//! causality violation), and the reader also asserts it sees the owner's
//! value. The `mutant_*` tests remove the fence (`collect_ignoring_readers`)
//! and must panic: they prove the checks can fail.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use tier_core::{BorrowerId, EpochFence, FlagSignal, Lender, Retired, Tier};

/// Map value of an unmapped entry.
const NONE: u32 = u32::MAX;
/// Content the first owner writes into its page.
const OWNER_A: u64 = 0xA;
/// Content the page's next owner writes after reuse.
const OWNER_B: u64 = 0xB;

/// Runs a mutant model and re-panics with a fixed message only if loom
/// caught the fence failure (a causality violation on the page, or the reader
/// seeing the next owner's content). Any other panic fails the test.
fn expect_fence_violation(mutant: impl FnOnce() + std::panic::UnwindSafe) {
    let Err(err) = std::panic::catch_unwind(mutant) else {
        return; // no panic: the #[should_panic] test fails
    };
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    if msg.contains("Causality violation") || msg.contains("reused under it") {
        panic!("fence violation caught: {msg}");
    }
    panic!("mutant failed for an unrelated reason: {msg}");
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(3, f);
}

/// Runs `f` under loom with the given preemption bound and prints how many
/// interleavings were explored (visible with `--nocapture`).
fn model_bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    println!(
        "loom: {} interleavings explored (preemption bound {bound})",
        runs.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// One logical entry mapped to page 0, whose content is `OWNER_A`.
struct World {
    map: AtomicU32,
    pages: Vec<UnsafeCell<u64>>,
}

impl World {
    fn new(pages: usize) -> Self {
        World {
            map: AtomicU32::new(0),
            pages: (0..pages).map(|_| UnsafeCell::new(OWNER_A)).collect(),
        }
    }

    /// A reader: look the entry up and read the page it maps to.
    fn read(&self) {
        // Acquire: pairs with the Release of the writer's map stores.
        let p = self.map.load(Ordering::Acquire);
        if p != NONE {
            // SAFETY: loom checks this read is not concurrent with a write
            // (that is exactly what the fence must guarantee).
            let v = self.pages[p as usize].with(|x| unsafe { *x });
            assert_eq!(v, OWNER_A, "reader saw page {p} reused under it");
        }
    }

    /// The page's next owner writes it.
    fn reuse(&self, page: usize) {
        // SAFETY: loom checks this write is ordered after every read.
        self.pages[page].with_mut(|x| unsafe { *x = OWNER_B });
    }

    fn unmap(&self) {
        // Release: the reader that acquires NONE sees everything before.
        self.map.store(NONE, Ordering::Release);
    }
}

fn fence_scenario(ignore_readers: bool) {
    model(move || {
        let fence = Arc::new(EpochFence::with_reader_slots(2));
        let world = Arc::new(World::new(1));
        let reader = {
            let (fence, world) = (fence.clone(), world.clone());
            thread::spawn(move || {
                let _g = fence.enter();
                world.read();
            })
        };
        world.unmap();
        let mut retired = Retired::new();
        retired.retire(&fence, 0usize);
        // Spin until the page comes back (the reader always leaves), so every
        // execution reuses it: liveness and safety in one model.
        loop {
            let freed = if ignore_readers {
                retired.collect_ignoring_readers(&fence)
            } else {
                retired.collect(&fence)
            };
            if let Some(&p) = freed.first() {
                world.reuse(p);
                break;
            }
            thread::yield_now();
        }
        assert_eq!(retired.pending(), 0);
        reader.join().unwrap();
    });
}

#[test]
fn fence_keeps_page_until_reader_leaves() {
    fence_scenario(false);
}

#[test]
#[should_panic(expected = "fence violation caught")]
fn mutant_fence_removed_reader_sees_reuse() {
    expect_fence_violation(|| fence_scenario(true));
}

fn reclaim_scenario(ignore_readers: bool) {
    model(move || {
        let world = Arc::new(World::new(1));
        let mut lender = Lender::new(Tier::DeviceHbm, 1).unwrap();
        let a = BorrowerId(1);
        let loans = lender.lend(a, &[0]).unwrap();
        assert_eq!(loans[0].handle.page().0, 0);
        let fence = lender.shared_fence();
        let reader = {
            let world = world.clone();
            thread::spawn(move || {
                let _g = fence.enter();
                world.read();
            })
        };
        // Pressure: take the page back, unmap it, collect, lend it again.
        let got = lender.reclaim(1).unwrap();
        assert_eq!(got, loans);
        world.unmap();
        while lender.free_count() == 0 {
            if ignore_readers {
                lender.collect_ignoring_readers();
            } else {
                lender.collect();
            }
            thread::yield_now();
        }
        let b = lender.lend(BorrowerId(2), &[0]).unwrap();
        world.reuse(b[0].handle.page().index());
        reader.join().unwrap();
        assert_eq!(lender.lent_count(), 1);
        assert_eq!(lender.free_count() + lender.pending_count(), 0);
    });
}

#[test]
fn reclaim_waits_for_racing_reader() {
    reclaim_scenario(false);
}

#[test]
#[should_panic(expected = "fence violation caught")]
fn mutant_reclaim_without_fence_reuses_read_page() {
    expect_fence_violation(|| reclaim_scenario(true));
}

/// A GPU reader stands in as a completion signal: registered when its work
/// is enqueued, complete after its last read.
fn signal_scenario(ignore_readers: bool) {
    model(move || {
        let fence = Arc::new(EpochFence::with_reader_slots(1));
        let world = Arc::new(World::new(1));
        let done = FlagSignal::new();
        fence.enter_signal(Box::new(done.clone()));
        let gpu = {
            let world = world.clone();
            thread::spawn(move || {
                world.read();
                done.complete();
            })
        };
        world.unmap();
        let mut retired = Retired::new();
        retired.retire(&fence, 0usize);
        let freed = if ignore_readers {
            retired.collect_ignoring_readers(&fence)
        } else {
            retired.collect(&fence)
        };
        for p in freed {
            world.reuse(p);
        }
        gpu.join().unwrap();
        retired.collect(&fence);
        assert_eq!(retired.pending(), 0);
    });
}

#[test]
fn completion_signal_fences_like_a_reader() {
    signal_scenario(false);
}

#[test]
#[should_panic(expected = "fence violation caught")]
fn mutant_signal_ignored_gpu_sees_reuse() {
    expect_fence_violation(|| signal_scenario(true));
}

/// Two CPU readers, one slot: the second takes the locked overflow path.
#[test]
fn overflow_reader_is_fenced() {
    model_bounded(3, || {
        let fence = Arc::new(EpochFence::with_reader_slots(1));
        let world = Arc::new(World::new(1));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (fence, world) = (fence.clone(), world.clone());
                thread::spawn(move || {
                    let _g = fence.enter();
                    world.read();
                })
            })
            .collect();
        world.unmap();
        let mut retired = Retired::new();
        retired.retire(&fence, 0usize);
        for p in retired.collect(&fence) {
            world.reuse(p);
        }
        for r in readers {
            r.join().unwrap();
        }
    });
}

/// Two rounds of remap + retire + reuse against a reader that enters twice
/// (its slot is released and claimed again): page 0 -> page 1 -> page 0.
fn two_rounds(ignore_readers: bool) {
    model_bounded(3, move || {
        let fence = Arc::new(EpochFence::with_reader_slots(1));
        let world = Arc::new(World::new(2));
        let reader = {
            let (fence, world) = (fence.clone(), world.clone());
            thread::spawn(move || {
                for _ in 0..2 {
                    let _g = fence.enter();
                    world.read();
                }
            })
        };
        let mut retired = Retired::new();
        for (old, new) in [(0usize, 1usize), (1, 0)] {
            // Fill the unpublished page, then publish it in place of `old`.
            // SAFETY: `new` is unmapped and was released by the fence (or
            // never mapped), so no reader can touch it; loom checks that.
            world.pages[new].with_mut(|x| unsafe { *x = OWNER_A });
            // Release: the reader that acquires `new` sees its content.
            world.map.store(new as u32, Ordering::Release);
            retired.retire(&fence, old);
            loop {
                let freed = if ignore_readers {
                    retired.collect_ignoring_readers(&fence)
                } else {
                    retired.collect(&fence)
                };
                if let Some(&p) = freed.first() {
                    world.reuse(p);
                    break;
                }
                thread::yield_now();
            }
        }
        reader.join().unwrap();
    });
}

#[test]
fn two_rounds_with_slot_reuse() {
    two_rounds(false);
}

#[test]
#[should_panic(expected = "fence violation caught")]
fn mutant_two_rounds_without_fence() {
    expect_fence_violation(|| two_rounds(true));
}
