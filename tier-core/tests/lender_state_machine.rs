//! `Lender` (loans, reclaim, hand-back, reader fence) against a reference
//! model.
//!
//! The model keeps, per borrower, the set of logical pages held; the
//! hand-back queue; and the fence abstractly: an epoch, the epochs of readers
//! inside, and pending pages sealed with a tag at the first collect after
//! their release (a page tagged `t` is free once every reader has epoch
//! `> t`). Readers are asynchronous [`FlagSignal`]s on the real side.
//! Reclaim picks are predicted with exact shares (largest remainder, ties to
//! the lower id, oldest pages first). After every step:
//! `free + lent + reserved + queued + pending == capacity`, counts match the
//! model, no physical page is held (lent or reserved) twice, and errors change
//! nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use tier_core::{BorrowerId, CoreError, FlagSignal, Lender, Loan, PageHandle, PageId, Tier};

#[derive(Clone, Debug, Default)]
struct Borrower {
    held: BTreeSet<u32>,
    finished: bool,
    queued: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    Unit,
    Pages(Vec<(u64, u32)>),
    Count(u32),
}

#[derive(Clone, Debug, Default)]
struct Model {
    capacity: u32,
    free: u32,
    borrowers: BTreeMap<u64, Borrower>,
    queue: VecDeque<(u64, u32)>,
    /// Reservations made, by index (`true` while reserved).
    reserved: Vec<bool>,
    epoch: u64,
    readers: Vec<u64>,
    unsealed: u32,
    sealed: VecDeque<(u64, u32)>,
    expect: Option<Result<Out, CoreError>>,
}

impl Model {
    fn lent(&self) -> u32 {
        self.borrowers.values().map(|b| b.held.len() as u32).sum()
    }
    fn pending(&self) -> u32 {
        self.unsealed + self.sealed.iter().map(|s| s.1).sum::<u32>()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Lend(u64, Vec<u32>),
    /// Give back (borrower, logical); `tamper` makes the handle's generation wrong.
    GiveBack(u64, u32, bool),
    Reclaim(u32),
    Finish(u64),
    HandBack(u32),
    Collect,
    EnterReader,
    LeaveReader(usize),
    Reserve(u32),
    /// Release reservation `i % made` (if any was made); `tamper` makes the handle's generation
    /// wrong.
    Release(usize, bool),
}

/// Reference reclaim: whole part of each exact share, then one more page for
/// the largest fractional parts (ties: lower id), oldest pages first.
fn reference_picks(m: &Model, n: u32) -> Vec<(u64, u32)> {
    let active: Vec<(u64, Vec<u32>)> = m
        .borrowers
        .iter()
        .filter(|(_, b)| !b.finished && !b.held.is_empty())
        .map(|(&id, b)| (id, b.held.iter().copied().collect()))
        .collect();
    let total: usize = active.iter().map(|a| a.1.len()).sum();
    let k = (n as usize).min(total);
    if k == 0 {
        return Vec::new();
    }
    // Exact share k*h/total as (whole, numerator of the fraction over total).
    let mut q: Vec<usize> = Vec::new();
    let mut frac: Vec<usize> = Vec::new();
    for a in &active {
        let num = k * a.1.len();
        q.push(num / total);
        frac.push(num - (num / total) * total);
    }
    let mut order: Vec<usize> = (0..active.len()).collect();
    order.sort_by(|&a, &b| frac[b].cmp(&frac[a]).then(active[a].0.cmp(&active[b].0)));
    let missing = k - q.iter().sum::<usize>();
    for &i in order.iter().take(missing) {
        q[i] += 1;
    }
    active
        .iter()
        .zip(q)
        .flat_map(|((id, held), qi)| held[..qi].iter().map(move |&l| (*id, l)))
        .collect()
}

struct LenderRef;

impl ReferenceStateMachine for LenderRef {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (1u32..10)
            .prop_map(|capacity| Model {
                capacity,
                free: capacity,
                ..Model::default()
            })
            .boxed()
    }

    fn transitions(s: &Model) -> BoxedStrategy<Op> {
        let cap = s.capacity;
        prop_oneof![
            4 => (0u64..3, prop::collection::vec(0u32..8, 0..5)).prop_map(|(b, l)| Op::Lend(b, l)),
            2 => (0u64..3, 0u32..8, prop::bool::weighted(0.2)).prop_map(|(b, l, t)| Op::GiveBack(b, l, t)),
            2 => (0..cap + 2).prop_map(Op::Reclaim),
            1 => (0u64..3).prop_map(Op::Finish),
            2 => (0u32..4).prop_map(Op::HandBack),
            3 => Just(Op::Collect),
            1 => Just(Op::EnterReader),
            1 => any::<usize>().prop_map(Op::LeaveReader),
            2 => (0u32..4).prop_map(Op::Reserve),
            2 => (any::<usize>(), prop::bool::weighted(0.2)).prop_map(|(i, t)| Op::Release(i, t)),
        ]
        .boxed()
    }

    fn apply(mut s: Model, op: &Op) -> Model {
        s.expect = Some(step(&mut s, op));
        s
    }
}

fn step(s: &mut Model, op: &Op) -> Result<Out, CoreError> {
    match op {
        Op::Lend(b, ls) => {
            let cur = s.borrowers.get(b);
            if cur.is_some_and(|x| x.finished) {
                return Err(CoreError::BorrowerFinished { borrower: *b });
            }
            // The smallest index repeated in the request, else the smallest
            // one already held.
            let repeated = ls
                .iter()
                .filter(|&&l| ls.iter().filter(|&&m| m == l).count() > 1)
                .min();
            let held = ls
                .iter()
                .filter(|&&l| cur.is_some_and(|x| x.held.contains(&l)))
                .min();
            let bad = repeated.or(held);
            if let Some(&l) = bad {
                return Err(CoreError::DuplicateLogical {
                    borrower: *b,
                    logical: l,
                });
            }
            let n = ls.len() as u32;
            if n > s.free {
                return Err(CoreError::PoolExhausted {
                    requested: n,
                    free: s.free,
                });
            }
            s.free -= n;
            s.borrowers.entry(*b).or_default().held.extend(ls);
            Ok(Out::Pages(ls.iter().map(|&l| (*b, l)).collect()))
        }
        Op::GiveBack(b, l, tamper) => {
            let Some(x) = s.borrowers.get_mut(b) else {
                return Err(CoreError::UnknownBorrower { borrower: *b });
            };
            if x.finished {
                return Err(CoreError::BorrowerFinished { borrower: *b });
            }
            if !x.held.contains(l) {
                return Err(CoreError::NotLent {
                    borrower: *b,
                    logical: *l,
                });
            }
            if *tamper {
                // The real side fills in the page and generation it used.
                return Err(CoreError::StaleHandle {
                    page: u32::MAX,
                    generation: u32::MAX,
                });
            }
            x.held.remove(l);
            s.unsealed += 1;
            Ok(Out::Unit)
        }
        Op::Reclaim(n) => {
            let picks = reference_picks(s, *n);
            for (b, l) in &picks {
                s.borrowers.get_mut(b).unwrap().held.remove(l);
            }
            s.unsealed += picks.len() as u32;
            Ok(Out::Pages(picks))
        }
        Op::Finish(b) => {
            let Some(x) = s.borrowers.get_mut(b) else {
                return Err(CoreError::UnknownBorrower { borrower: *b });
            };
            if x.finished {
                return Err(CoreError::BorrowerFinished { borrower: *b });
            }
            if x.held.is_empty() {
                s.borrowers.remove(b);
            } else {
                x.finished = true;
                x.queued = x.held.len() as u32;
                s.queue
                    .extend(std::mem::take(&mut x.held).into_iter().map(|l| (*b, l)));
            }
            Ok(Out::Unit)
        }
        Op::HandBack(max) => {
            let k = (*max as usize).min(s.queue.len());
            let out: Vec<(u64, u32)> = s.queue.drain(..k).collect();
            for (b, _) in &out {
                let x = s.borrowers.get_mut(b).unwrap();
                x.queued -= 1;
                if x.queued == 0 {
                    s.borrowers.remove(b);
                }
            }
            s.unsealed += k as u32;
            Ok(Out::Pages(out))
        }
        Op::Collect => {
            if s.unsealed > 0 {
                s.sealed.push_back((s.epoch, s.unsealed));
                s.unsealed = 0;
                s.epoch += 1;
            }
            let min = s.readers.iter().copied().min().unwrap_or(u64::MAX);
            let mut freed = 0;
            while s.sealed.front().is_some_and(|&(t, _)| t < min) {
                freed += s.sealed.pop_front().unwrap().1;
            }
            s.free += freed;
            Ok(Out::Count(freed))
        }
        Op::EnterReader => {
            s.readers.push(s.epoch);
            Ok(Out::Unit)
        }
        Op::LeaveReader(i) => {
            if !s.readers.is_empty() {
                let i = i % s.readers.len();
                s.readers.remove(i);
            }
            Ok(Out::Unit)
        }
        Op::Reserve(n) => {
            if *n > s.free {
                return Err(CoreError::PoolExhausted {
                    requested: *n,
                    free: s.free,
                });
            }
            s.free -= n;
            s.reserved.extend((0..*n).map(|_| true));
            Ok(Out::Count(*n))
        }
        Op::Release(i, tamper) => {
            if s.reserved.is_empty() {
                return Ok(Out::Unit); // nothing to release: no call made
            }
            let i = i % s.reserved.len();
            if !s.reserved[i] {
                // Released before: the page id may be free, reserved again or lent.
                return Err(CoreError::NotReserved { page: u32::MAX });
            }
            if *tamper {
                return Err(CoreError::StaleHandle {
                    page: u32::MAX,
                    generation: u32::MAX,
                });
            }
            s.reserved[i] = false;
            s.unsealed += 1;
            Ok(Out::Unit)
        }
    }
}

struct Sut {
    lender: Lender,
    loans: HashMap<(u64, u32), Loan>,
    readers: Vec<FlagSignal>,
    /// Every reservation made, in order, and whether it is still reserved (a released one
    /// stays, as a stale handle to try).
    reserved: Vec<(PageHandle, bool)>,
}

/// Counts (free, lent, reserved, queued, pending), fence epoch, loans per borrower.
type Snapshot = (u32, u32, u32, u32, u32, u64, Vec<(BorrowerId, Vec<Loan>)>);

/// Everything observable, to prove an error changed nothing.
fn snapshot(l: &Lender) -> Snapshot {
    (
        l.free_count(),
        l.lent_count(),
        l.reserved_count(),
        l.queued_count(),
        l.pending_count(),
        l.fence().epoch(),
        l.borrowers().map(|b| (b, l.loans_of(b))).collect(),
    )
}

fn keys(loans: &[Loan]) -> Vec<(u64, u32)> {
    loans.iter().map(|x| (x.borrower.0, x.logical)).collect()
}

struct LenderTest;

impl StateMachineTest for LenderTest {
    type SystemUnderTest = Sut;
    type Reference = LenderRef;

    fn init_test(s: &Model) -> Sut {
        Sut {
            lender: Lender::new(Tier::DeviceHbm, s.capacity).unwrap(),
            loans: HashMap::new(),
            readers: Vec::new(),
            reserved: Vec::new(),
        }
    }

    fn apply(mut sut: Sut, s: &Model, op: Op) -> Sut {
        let before = snapshot(&sut.lender);
        let l = &mut sut.lender;
        let got: Result<Out, CoreError> = match &op {
            Op::Lend(b, ls) => l.lend(BorrowerId(*b), ls).map(|v| {
                for x in &v {
                    sut.loans.insert((x.borrower.0, x.logical), *x);
                }
                Out::Pages(keys(&v))
            }),
            Op::GiveBack(b, lg, tamper) => {
                let mut loan = sut.loans.get(&(*b, *lg)).copied().unwrap_or(Loan {
                    borrower: BorrowerId(*b),
                    logical: *lg,
                    handle: PageHandle::from_raw(PageId(0), 0),
                });
                if *tamper {
                    let h = loan.handle;
                    loan.handle = PageHandle::from_raw(h.page(), h.generation().wrapping_add(1));
                }
                match l.give_back(loan) {
                    Ok(()) => {
                        sut.loans.remove(&(*b, *lg));
                        Ok(Out::Unit)
                    }
                    // Normalise the handle details the model cannot know.
                    Err(CoreError::StaleHandle { .. }) => Err(CoreError::StaleHandle {
                        page: u32::MAX,
                        generation: u32::MAX,
                    }),
                    Err(e) => Err(e),
                }
            }
            Op::Reclaim(n) => l.reclaim(*n).map(|v| {
                for x in &v {
                    assert_eq!(sut.loans.remove(&(x.borrower.0, x.logical)), Some(*x));
                }
                Out::Pages(keys(&v))
            }),
            Op::Finish(b) => l.finish(BorrowerId(*b)).map(|()| Out::Unit),
            Op::HandBack(max) => {
                let v = l.hand_back_step(*max);
                for x in &v {
                    assert_eq!(sut.loans.remove(&(x.borrower.0, x.logical)), Some(*x));
                }
                Ok(Out::Pages(keys(&v)))
            }
            Op::Collect => Ok(Out::Count(l.collect())),
            Op::EnterReader => {
                let r = FlagSignal::new();
                l.fence().enter_signal(Box::new(r.clone()));
                sut.readers.push(r);
                Ok(Out::Unit)
            }
            Op::LeaveReader(i) => {
                if !sut.readers.is_empty() {
                    let i = i % sut.readers.len();
                    sut.readers.remove(i).complete();
                }
                Ok(Out::Unit)
            }
            Op::Reserve(n) => l.reserve(*n).map(|v| {
                sut.reserved.extend(v.iter().map(|&h| (h, true)));
                Out::Count(v.len() as u32)
            }),
            Op::Release(i, tamper) => {
                if sut.reserved.is_empty() {
                    Ok(Out::Unit)
                } else {
                    let i = i % sut.reserved.len();
                    let (mut h, live) = sut.reserved[i];
                    // Tampering only applies to a live reservation (as in the model).
                    let tamper = *tamper && live;
                    if tamper {
                        h = PageHandle::from_raw(h.page(), h.generation().wrapping_add(1));
                    }
                    match l.release(h) {
                        Ok(()) => {
                            sut.reserved[i].1 = false;
                            Ok(Out::Unit)
                        }
                        // Normalise the details the model cannot know. A released handle whose
                        // page was reserved again under a newer handle reads as stale: the model
                        // calls both "not reserved".
                        Err(CoreError::StaleHandle { .. }) if !tamper => {
                            Err(CoreError::NotReserved { page: u32::MAX })
                        }
                        Err(CoreError::StaleHandle { .. }) => Err(CoreError::StaleHandle {
                            page: u32::MAX,
                            generation: u32::MAX,
                        }),
                        Err(CoreError::NotReserved { .. }) => {
                            Err(CoreError::NotReserved { page: u32::MAX })
                        }
                        Err(e) => Err(e),
                    }
                }
            }
        };
        assert_eq!(Some(&got), s.expect.as_ref(), "{op:?}");
        if got.is_err() {
            assert_eq!(snapshot(&sut.lender), before, "error changed state: {op:?}");
        }
        sut
    }

    fn check_invariants(sut: &Sut, s: &Model) {
        let l = &sut.lender;
        assert_eq!(
            l.free_count()
                + l.lent_count()
                + l.reserved_count()
                + l.queued_count()
                + l.pending_count(),
            l.capacity()
        );
        assert_eq!(l.free_count(), s.free);
        assert_eq!(
            l.reserved_count() as usize,
            s.reserved.iter().filter(|&&r| r).count()
        );
        assert_eq!(l.lent_count(), s.lent());
        assert_eq!(l.queued_count() as usize, s.queue.len());
        assert_eq!(l.pending_count(), s.pending());
        let mut pages = BTreeSet::new();
        for (&id, b) in &s.borrowers {
            let got = l.loans_of(BorrowerId(id));
            assert_eq!(
                got.iter().map(|x| x.logical).collect::<BTreeSet<_>>(),
                b.held,
                "borrower {id}"
            );
            for x in got {
                assert!(
                    pages.insert(x.handle.page()),
                    "page {:?} held twice",
                    x.handle.page()
                );
            }
        }
        assert_eq!(sut.reserved.len(), s.reserved.len());
        for ((h, live), &model_live) in sut.reserved.iter().zip(&s.reserved) {
            assert_eq!(*live, model_live);
            if *live {
                assert!(pages.insert(h.page()), "page {:?} held twice", h.page());
            }
        }
        assert_eq!(l.borrowers().count(), s.borrowers.len());
    }
}

prop_state_machine! {
    #![proptest_config(common::config())]
    #[test]
    fn lender_matches_model(sequential 1..60 => LenderTest);
}
