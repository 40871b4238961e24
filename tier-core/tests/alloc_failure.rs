//! Tables sized by caller input under an address-space limit (a container's memory limit): the
//! allocation fails as `CoreError::AllocationFailed`, never as an abort of the process.
#![cfg(not(loom))]

use tier_core::{BorrowerId, CoreError, Lender, PageMap, PagePool, Tier};
use tierkit_testkit::under_memory_limit;

/// Headroom above what the child maps when the limit is set.
const HEADROOM: usize = 32 << 20;

fn assert_oom<T: std::fmt::Debug>(r: Result<T, CoreError>, what: &str) {
    match r {
        Err(CoreError::AllocationFailed { what: w, bytes }) => {
            assert_eq!(w, what);
            assert!(bytes > HEADROOM as u64, "{bytes}");
        }
        other => panic!("expected AllocationFailed for {what}, got {other:?}"),
    }
}

#[test]
fn lend_of_a_huge_logical_list_is_an_error() {
    under_memory_limit(
        "lend_of_a_huge_logical_list_is_an_error",
        HEADROOM,
        // 128 MiB of logical page ids (lazily zeroed: never touched), made before the limit.
        || vec![0u32; 32 << 20],
        |logical| {
            let mut lender = Lender::new(Tier::DeviceHbm, 4).unwrap();
            assert_oom(
                lender.lend(BorrowerId(1), &logical),
                "lend: sorted logical pages",
            );
            // Nothing changed: the lender still lends.
            assert_eq!(lender.lend(BorrowerId(1), &[0, 1]).unwrap().len(), 2);
        },
    );
}

#[test]
fn tables_past_the_limit_are_errors() {
    under_memory_limit(
        "tables_past_the_limit_are_errors",
        HEADROOM,
        || (),
        |()| {
            assert_oom(PageMap::new(64 << 20), "page map table");
            let mut m = PageMap::new(4).unwrap();
            assert_oom(m.reserve(64 << 20), "page map table");
            assert_eq!(m.len(), 4);
            m.reserve(1024).unwrap();
            m.resize(1024).unwrap();
            assert_oom(
                PagePool::new(Tier::DeviceHbm, 64 << 20),
                "page pool free list",
            );
            assert_oom(
                tier_core::DecayingCounters::new(64 << 20, 8.0),
                "decaying counters",
            );
        },
    );
}
