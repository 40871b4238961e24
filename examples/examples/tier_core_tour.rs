//! A tour of `tier-core`: a page pool, a block table (`PageMap`), a lender
//! with two borrowers (requests), a reader fence held across a reclaim, a GPU
//! completion signal standing in for a reader, and a finished request handed
//! back in bounded chunks. Deterministic; prints each step.
//!
//! Run: `cargo run -p tierkit-examples --example tier_core_tour`
use tier_core::{
    BorrowerId, CoreError, DecayingCounters, FlagSignal, Lender, PageMap, PagePool, Tier,
};

fn show(l: &Lender, what: &str) {
    println!(
        "  [{what}] free {} | lent {} | queued {} | pending {} (sum {} = capacity {})",
        l.free_count(),
        l.lent_count(),
        l.queued_count(),
        l.pending_count(),
        l.free_count() + l.lent_count() + l.queued_count() + l.pending_count(),
        l.capacity()
    );
}

fn main() -> Result<(), CoreError> {
    println!("1. A pool of 4 HBM pages; handles are generation-tagged.");
    let mut pool = PagePool::new(Tier::DeviceHbm, 4)?;
    let h = pool.alloc()?;
    println!("  alloc -> page {} gen {}", h.page(), h.generation());
    pool.free(h)?;
    println!("  free again -> {}", pool.free(h).unwrap_err());
    let h2 = pool.alloc()?;
    println!("  realloc -> page {} gen {}", h2.page(), h2.generation());
    println!("  free the stale handle -> {}", pool.free(h).unwrap_err());

    println!("\n2. A lender of 12 pages; request 1 borrows 6, request 2 borrows 3.");
    let mut lender = Lender::new(Tier::DeviceHbm, 12)?;
    let (r1, r2) = (BorrowerId(1), BorrowerId(2));
    let mut map1 = PageMap::new(6)?; // request 1's block table
    let mut map2 = PageMap::new(3)?;
    for loan in lender.lend(r1, &[0, 1, 2, 3, 4, 5])? {
        map1.set(loan.logical, loan.handle.page())?;
    }
    for loan in lender.lend(r2, &[0, 1, 2])? {
        map2.set(loan.logical, loan.handle.page())?;
    }
    println!(
        "  request 1 table {:?} (gen {})",
        map1.table(),
        map1.generation()
    );
    println!(
        "  request 2 table {:?} (gen {})",
        map2.table(),
        map2.generation()
    );
    show(&lender, "lent");

    println!("\n3. A CPU reader and a GPU step (completion signal) read the tables; pressure reclaims 4.");
    let fence = lender.shared_fence();
    let cpu_reader = fence.enter();
    let gpu_step = FlagSignal::new(); // a CUDA event in real use
    fence.enter_signal(Box::new(gpu_step.clone()));
    let planned_gen = map1.generation();
    for loan in lender.reclaim(4)? {
        println!(
            "  reclaimed request {} logical {} (page {})",
            loan.borrower.0,
            loan.logical,
            loan.handle.page()
        );
        let map = if loan.borrower == r1 {
            &mut map1
        } else {
            &mut map2
        };
        map.clear(loan.logical)?; // unmap before the next collect
    }
    println!("  request 1 table {:?}", map1.table());
    println!("  request 2 table {:?}", map2.table());
    println!(
        "  a move planned at gen {planned_gen} is now rejected: {}",
        map1.check_generation(planned_gen).unwrap_err()
    );
    println!(
        "  collect with both readers inside -> {} freed",
        lender.collect()
    );
    show(&lender, "pending");
    drop(cpu_reader);
    println!(
        "  CPU reader left; collect -> {} freed (GPU step still running)",
        lender.collect()
    );
    gpu_step.complete();
    println!(
        "  GPU event complete; collect -> {} freed",
        lender.collect()
    );
    show(&lender, "collected");

    println!("\n4. Request 1 finishes; its pages go back 1 per step.");
    lender.finish(r1)?;
    show(&lender, "queued");
    let mut step = 0;
    while lender.queued_count() > 0 {
        step += 1;
        let back = lender.hand_back_step(1);
        for loan in &back {
            map1.clear(loan.logical)?;
        }
        let freed = lender.collect();
        println!(
            "  step {step}: handed back logical {:?}, freed {freed}",
            back.iter().map(|l| l.logical).collect::<Vec<_>>()
        );
    }
    show(&lender, "done");

    println!("\n5. Bad input is a typed error, never a panic.");
    println!(
        "  lend 99 pages -> {}",
        lender.lend(r2, &(10..109).collect::<Vec<_>>()).unwrap_err()
    );
    lender.finish(r2)?;
    println!(
        "  lend to a finished request -> {}",
        lender.lend(r2, &[9]).unwrap_err()
    );
    lender.hand_back_step(u32::MAX);
    lender.collect();
    println!(
        "  once handed back, request 2 is forgotten; lending to it again works: {}",
        lender.lend(r2, &[0]).is_ok()
    );
    println!(
        "  zero-capacity pool -> {}",
        PagePool::new(Tier::HostPinned, 0).unwrap_err()
    );

    println!("\n6. Heat: EMA counters with a half-life of 4 steps.");
    let mut heat = DecayingCounters::new(3, 4.0)?;
    heat.fold(&[8, 4, 0], 0)?;
    heat.fold(&[0, 0, 2], 4)?;
    println!("  after 4 steps: {:?}", heat.values());
    Ok(())
}
