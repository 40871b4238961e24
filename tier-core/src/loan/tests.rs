//! Unit tests of the lender (the state machine is `tests/lender_state_machine.rs`).
use super::*;

fn check<P: ReclaimPolicy>(l: &Lender<P>) {
    assert_eq!(
        l.free_count() + l.lent_count() + l.reserved_count() + l.queued_count() + l.pending_count(),
        l.capacity()
    );
}

#[test]
fn reserved_pages_are_never_reclaimed_and_release_through_the_fence() {
    let mut l = Lender::new(Tier::DeviceHbm, 4).unwrap();
    let fixed = l.reserve(2).unwrap();
    l.lend(BorrowerId(1), &[0, 1]).unwrap();
    assert_eq!(
        l.reserve(1),
        Err(CoreError::PoolExhausted {
            requested: 1,
            free: 0
        })
    );
    assert_eq!(l.reclaim(4).unwrap().len(), 2); // only the loans
    check(&l);
    let fence = l.shared_fence();
    let reader = fence.enter();
    l.release(fixed[0]).unwrap();
    assert_eq!(
        l.release(fixed[0]),
        Err(CoreError::NotReserved {
            page: fixed[0].page().0
        })
    );
    let stale = PageHandle::from_raw(fixed[1].page(), fixed[1].generation() + 1);
    assert!(matches!(
        l.release(stale),
        Err(CoreError::StaleHandle { .. })
    ));
    assert_eq!(l.collect(), 0); // the reader may still see the page
    drop(reader);
    assert_eq!(l.collect(), 3);
    assert_eq!((l.reserved_count(), l.free_count()), (1, 3));
    check(&l);
}

#[test]
fn proportional_quotas() {
    let q = |h: [u64; 3], n| {
        let ids = [BorrowerId(3), BorrowerId(1), BorrowerId(2)];
        let held: Vec<_> = ids.into_iter().zip(h).collect();
        ProportionalOldestFirst::quotas(&held, n)
    };
    assert_eq!(q([6, 3, 1], 5), vec![3, 2, 0]);
    // Equal remainders: the lower ids (1, then 2) get the extra pages.
    assert_eq!(q([1, 1, 1], 2), vec![0, 1, 1]);
    assert_eq!(q([2, 2, 2], 100), vec![2, 2, 2]);
    assert_eq!(q([0, 0, 0], 3), vec![0, 0, 0]);
    let big = q([u64::MAX, u64::MAX, 0], u32::MAX);
    assert_eq!(big.iter().sum::<u64>(), u64::from(u32::MAX));
}

#[test]
fn lend_reclaim_collect_lifecycle() {
    let mut l = Lender::new(Tier::DeviceHbm, 8).unwrap();
    let a = BorrowerId(1);
    let b = BorrowerId(2);
    l.lend(a, &[0, 1, 2, 3]).unwrap();
    l.lend(b, &[0, 1]).unwrap();
    check(&l);
    let fence = l.shared_fence();
    let g = fence.enter();
    let got = l.reclaim(3).unwrap();
    // 3 of 6 split 4:2 -> 2 from a, 1 from b, oldest first.
    let picked: Vec<_> = got.iter().map(|x| (x.borrower.0, x.logical)).collect();
    assert_eq!(picked, vec![(1, 0), (1, 1), (2, 0)]);
    assert_eq!(l.held_by(a), 2);
    assert_eq!(l.collect(), 0, "a reader is inside");
    assert_eq!(l.pending_count(), 3);
    check(&l);
    drop(g);
    assert_eq!(l.collect(), 3);
    assert_eq!(l.free_count(), 5);
    check(&l);
}

#[test]
fn finish_hands_back_in_chunks() {
    let mut l = Lender::new(Tier::HostPinned, 10).unwrap();
    let a = BorrowerId(5);
    l.lend(a, &[0, 1, 2, 3, 4]).unwrap();
    l.finish(a).unwrap();
    assert_eq!(
        l.lend(a, &[9]).unwrap_err(),
        CoreError::BorrowerFinished { borrower: 5 }
    );
    assert_eq!(l.queued_count(), 5);
    assert_eq!(l.hand_back_step(2).len(), 2);
    assert_eq!(l.hand_back_step(2).len(), 2);
    check(&l);
    assert_eq!(l.collect(), 4);
    assert_eq!(l.hand_back_step(2).len(), 1);
    assert!(!l.is_known(a), "forgotten once fully handed back");
    assert_eq!(l.collect(), 1);
    assert_eq!(l.free_count(), 10);
}

#[test]
fn bad_input_is_typed_and_changes_nothing() {
    let mut l = Lender::new(Tier::DeviceHbm, 3).unwrap();
    let a = BorrowerId(1);
    let loans = l.lend(a, &[0, 1]).unwrap();
    assert_eq!(
        l.lend(a, &[2, 3]).unwrap_err(),
        CoreError::PoolExhausted {
            requested: 2,
            free: 1
        }
    );
    assert_eq!(
        l.lend(a, &[1]).unwrap_err(),
        CoreError::DuplicateLogical {
            borrower: 1,
            logical: 1
        }
    );
    assert_eq!(
        l.lend(BorrowerId(2), &[4, 4]).unwrap_err(),
        CoreError::DuplicateLogical {
            borrower: 2,
            logical: 4
        }
    );
    assert!(!l.is_known(BorrowerId(2)));
    l.give_back(loans[0]).unwrap();
    assert_eq!(
        l.give_back(loans[0]).unwrap_err(),
        CoreError::NotLent {
            borrower: 1,
            logical: 0
        }
    );
    assert_eq!(
        l.finish(BorrowerId(9)).unwrap_err(),
        CoreError::UnknownBorrower { borrower: 9 }
    );
    assert_eq!(l.held_by(a), 1);
    assert_eq!(l.free_count(), 1);
    assert_eq!(
        Lender::new(Tier::DeviceHbm, 0).unwrap_err(),
        CoreError::ZeroCapacity
    );
}

/// Answers with a preset list, whatever it is asked.
struct Preset(Vec<(BorrowerId, u32)>);
impl ReclaimPolicy for Preset {
    fn choose(&mut self, _h: &[(BorrowerId, &[u32])], _n: u32) -> Vec<(BorrowerId, u32)> {
        self.0.clone()
    }
}

/// Takes the newest pages (not a prefix): exercises the general path.
struct NewestFirst;
impl ReclaimPolicy for NewestFirst {
    fn choose(&mut self, h: &[(BorrowerId, &[u32])], n: u32) -> Vec<(BorrowerId, u32)> {
        let mut all: Vec<(BorrowerId, u32)> = h
            .iter()
            .flat_map(|(b, ls)| ls.iter().map(move |&l| (*b, l)))
            .collect();
        all.sort_by_key(|&(b, l)| (std::cmp::Reverse(l), b));
        all.truncate(n as usize);
        all
    }
}

#[test]
fn custom_policy_takes_non_prefix_pages() {
    let mut l = Lender::with_policy(Tier::DeviceHbm, 8, NewestFirst).unwrap();
    l.lend(BorrowerId(1), &[0, 1, 2, 3]).unwrap();
    l.lend(BorrowerId(2), &[0, 5]).unwrap();
    let got: Vec<_> = l
        .reclaim(3)
        .unwrap()
        .iter()
        .map(|x| (x.borrower.0, x.logical))
        .collect();
    assert_eq!(got, vec![(1, 2), (1, 3), (2, 5)]);
    assert_eq!(l.loans_of(BorrowerId(1)).len(), 2);
    assert_eq!(l.pending_count(), 3);
    check(&l);
}

#[test]
fn invalid_policy_choice_reclaims_nothing() {
    let (a, b) = (BorrowerId(1), BorrowerId(2));
    let cases = [
        (vec![(a, 0), (a, 0)], 2, "twice"),
        (vec![(a, 0), (a, 1)], 1, "more than asked"),
        (vec![(a, 99)], 1, "not held"),
        (vec![(b, 0)], 1, "unknown borrower"),
    ];
    for (answer, n, why) in cases {
        let mut l = Lender::with_policy(Tier::DeviceHbm, 4, Preset(answer)).unwrap();
        l.lend(a, &[0, 1, 2]).unwrap();
        let r = l.reclaim(n);
        assert!(
            matches!(r, Err(CoreError::InvalidPolicyChoice { .. })),
            "{why}: {r:?}"
        );
        assert_eq!(l.lent_count(), 3, "{why}");
        assert_eq!(l.pending_count(), 0, "{why}");
        assert_eq!(l.loans_of(a).len(), 3, "{why}");
    }
    // Fewer than asked is allowed: a policy may exempt borrowers.
    let mut l = Lender::with_policy(Tier::DeviceHbm, 4, Preset(vec![(a, 2)])).unwrap();
    l.lend(a, &[0, 1, 2]).unwrap();
    assert_eq!(l.reclaim(3).unwrap().len(), 1);
    check(&l);
}

#[test]
fn consecutive_logical_indices_get_ascending_pages_whatever_order_pages_came_back() {
    let mut l = Lender::new(Tier::DeviceHbm, 8).unwrap();
    let pages = |loans: &[Loan]| loans.iter().map(|x| x.handle.page().0).collect::<Vec<_>>();
    let first = l.lend(BorrowerId(1), &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert_eq!(pages(&first), (0..8).collect::<Vec<_>>());
    // Given back lowest page first: the free stack now pops them highest first.
    l.finish(BorrowerId(1)).unwrap();
    l.hand_back_step(8);
    assert_eq!(l.collect(), 8);
    let again = l.lend(BorrowerId(2), &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert_eq!(
        pages(&again),
        (0..8).collect::<Vec<_>>(),
        "one run, not eight"
    );
    // Unordered indices: the i-th smallest index gets the i-th lowest page; loans keep the
    // order of the call.
    l.finish(BorrowerId(2)).unwrap();
    l.hand_back_step(8);
    l.collect();
    let mixed = l.lend(BorrowerId(3), &[5, 2, 7]).unwrap();
    let logical: Vec<u32> = mixed.iter().map(|x| x.logical).collect();
    assert_eq!(logical, vec![5, 2, 7]);
    let p = pages(&mixed);
    assert!(p[1] < p[0] && p[0] < p[2], "{p:?}");
    check(&l);
}

/// Pages freed by several hand-backs sit on the free stack as a few ordered runs; a lend of
/// consecutive indices still takes them in ascending page order (one run of pages).
#[test]
fn lend_orders_pages_from_several_freed_runs() {
    let mut l = Lender::new(Tier::DeviceHbm, 64).unwrap();
    let a: Vec<u32> = (0..20).collect();
    l.lend(BorrowerId(1), &a).unwrap();
    l.lend(BorrowerId(2), &a).unwrap();
    l.lend(BorrowerId(3), &a).unwrap();
    // Borrowers 3 and 1 finish and hand back in logical order: two ascending runs freed.
    l.finish(BorrowerId(3)).unwrap();
    l.finish(BorrowerId(1)).unwrap();
    assert_eq!(l.hand_back_step(64).len(), 40);
    assert_eq!(l.collect(), 40);
    // 44 free pages: 4 never lent, then runs 40..60 and 0..20 (popped in reverse).
    let want: Vec<u32> = (0..30).collect();
    let loans = l.lend(BorrowerId(4), &want).unwrap();
    let pages: Vec<u32> = loans.iter().map(|x| x.handle.page().0).collect();
    assert!(pages.windows(2).all(|w| w[0] < w[1]), "{pages:?}");
    assert_eq!(loans.iter().map(|x| x.logical).collect::<Vec<_>>(), want);
    check(&l);
}
