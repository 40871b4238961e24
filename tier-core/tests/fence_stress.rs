//! Real threads against the fence (complements the loom models): reader
//! threads look a page up and check its content stays put while they are
//! inside; the writer keeps remapping one entry through a 4-page `Lender`,
//! so every page is reused thousands of times. The map entry packs
//! `(token << 32) | page`; the page holds `token` while it is mapped, and is
//! overwritten as soon as the lender hands it out again.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{BorrowerId, Lender, Tier};

#[test]
fn readers_never_see_a_reused_page() {
    const PAGES: u32 = 4;
    let mut lender = Lender::new(Tier::DeviceHbm, PAGES).unwrap();
    let fence = lender.shared_fence();
    let content: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let map = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let b = BorrowerId(1);

    let mut current = lender.lend(b, &[0]).unwrap()[0];
    content[current.handle.page().index()].store(1, Ordering::Relaxed);
    map.store(
        (1 << 32) | u64::from(current.handle.page().0),
        Ordering::Release,
    );

    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (fence, content, map, stop) =
                (fence.clone(), content.clone(), map.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _g = fence.enter();
                    // Acquire: pairs with the writer's Release publish.
                    let e = map.load(Ordering::Acquire);
                    let (page, token) = ((e & 0xffff_ffff) as usize, e >> 32);
                    for _ in 0..8 {
                        let v = content[page].load(Ordering::Relaxed);
                        assert_eq!(v, token, "page {page} reused while a reader held it");
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();

    let deadline = Instant::now() + Duration::from_millis(300);
    let mut token = 1u64;
    let mut logical = 0u32;
    let mut remaps = 0u64;
    while Instant::now() < deadline {
        logical += 1;
        let next = loop {
            match lender.lend(b, &[logical]) {
                Ok(v) => break v[0],
                Err(_) => {
                    lender.collect();
                    std::thread::yield_now();
                }
            }
        };
        token += 1;
        let p = next.handle.page();
        // The page is unmapped and fence-cleared: nobody reads it now.
        content[p.index()].store(token, Ordering::Relaxed);
        // Release: a reader that sees the new entry sees the content.
        map.store((token << 32) | u64::from(p.0), Ordering::Release);
        lender.give_back(current).unwrap();
        current = next;
        lender.collect();
        remaps += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    println!("{remaps} remaps, {reads} fenced reads");
    assert!(
        remaps > 100 && reads > 100,
        "too little contention: {remaps} / {reads}"
    );
    assert_eq!(
        lender.free_count() + lender.lent_count() + lender.pending_count(),
        PAGES
    );
}
