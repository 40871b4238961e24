//! Properties of `ProportionalOldestFirst` on larger random holdings than the
//! lender state machine reaches: exact count, proportional within one page,
//! oldest first, deterministic.

mod common;

use proptest::prelude::*;
use tier_core::{BorrowerId, ProportionalOldestFirst, ReclaimPolicy};

fn holdings() -> impl Strategy<Value = Vec<(u64, Vec<u32>)>> {
    prop::collection::btree_map(0u64..1000, 1usize..400, 1..12).prop_map(|m| {
        m.into_iter()
            .map(|(id, n)| (id, (0..n as u32).map(|i| i * 3 + (id as u32 % 3)).collect()))
            .collect()
    })
}

proptest! {
    #![proptest_config(common::config())]

    #[test]
    fn proportional_oldest_first(h in holdings(), n in 0u32..5000) {
        let view: Vec<(BorrowerId, &[u32])> =
            h.iter().map(|(id, l)| (BorrowerId(*id), l.as_slice())).collect();
        let total: usize = h.iter().map(|x| x.1.len()).sum();
        let k = (n as usize).min(total);
        let picks = ProportionalOldestFirst.choose(&view, n);
        prop_assert_eq!(picks.len(), k);
        prop_assert_eq!(&picks, &ProportionalOldestFirst.choose(&view, n), "deterministic");
        for (id, held) in &h {
            let mine: Vec<u32> =
                picks.iter().filter(|p| p.0 .0 == *id).map(|p| p.1).collect();
            // Oldest first: exactly the lowest logical indices held.
            prop_assert_eq!(&mine[..], &held[..mine.len()]);
            // Within one page of the exact share k * h / total.
            let exact = k as f64 * held.len() as f64 / total as f64;
            prop_assert!((mine.len() as f64 - exact).abs() < 1.0,
                "borrower {} got {} for share {}", id, mine.len(), exact);
        }
    }
}
