//! `PagePool` against a reference model (proptest-state-machine).
//!
//! The model knows how many pages are free and, for every handle ever issued,
//! whether it is still live. The test side keeps the real handles and a
//! per-page note of which handle freed it last, to tell a double free from a
//! stale handle. Every error must leave the pool bit-for-bit unchanged.

mod common;

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use tier_core::{CoreError, PageHandle, PageId, PagePool, Tier};

#[derive(Clone, Debug)]
struct Model {
    capacity: u32,
    free: u32,
    /// Per issued handle: live?
    live: Vec<bool>,
    /// For the last `Free`: was the handle live before it (so it must work)?
    freed_live: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Alloc,
    AllocMany(u32),
    /// Free the i-th issued handle (modulo count); live, freed or stale.
    Free(usize),
    /// Free a made-up handle (maybe out of range, maybe a wrong generation,
    /// maybe `u32::MAX`, which wraps to a fresh page's generation 0).
    FreeRaw(u32, u32),
}

struct PoolRef;

impl ReferenceStateMachine for PoolRef {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (1u32..6)
            .prop_map(|capacity| Model {
                capacity,
                free: capacity,
                live: Vec::new(),
                freed_live: false,
            })
            .boxed()
    }

    fn transitions(s: &Model) -> BoxedStrategy<Op> {
        let cap = s.capacity;
        prop_oneof![
            3 => Just(Op::Alloc),
            1 => (0..cap + 2).prop_map(Op::AllocMany),
            3 => any::<usize>().prop_map(Op::Free),
            1 => (0..cap + 2, prop_oneof![0u32..3, Just(u32::MAX)])
                .prop_map(|(p, g)| Op::FreeRaw(p, g)),
        ]
        .boxed()
    }

    fn apply(mut s: Model, op: &Op) -> Model {
        match *op {
            Op::Alloc => {
                if s.free > 0 {
                    s.free -= 1;
                    s.live.push(true);
                }
            }
            Op::AllocMany(n) => {
                if n <= s.free {
                    s.free -= n;
                    s.live.extend(std::iter::repeat_n(true, n as usize));
                }
            }
            Op::Free(i) => {
                if !s.live.is_empty() {
                    let i = i % s.live.len();
                    s.freed_live = s.live[i];
                    if s.live[i] {
                        s.live[i] = false;
                        s.free += 1;
                    }
                }
            }
            Op::FreeRaw(..) => {} // decided on the real side, see below
        }
        s
    }
}

struct Sut {
    pool: PagePool,
    issued: Vec<PageHandle>,
    /// Per page: the issued index of the live handle, if allocated.
    owner: Vec<Option<usize>>,
    /// Per page: the issued index whose free was the last event on the page.
    last_freed_by: Vec<Option<usize>>,
}

impl Sut {
    fn record(&mut self, h: PageHandle) {
        let p = h.page().index();
        assert!(self.owner[p].is_none(), "page {p} handed out while live");
        self.owner[p] = Some(self.issued.len());
        self.last_freed_by[p] = None;
        self.issued.push(h);
    }
}

struct PoolTest;

impl StateMachineTest for PoolTest {
    type SystemUnderTest = Sut;
    type Reference = PoolRef;

    fn init_test(s: &Model) -> Sut {
        Sut {
            pool: PagePool::new(Tier::DeviceHbm, s.capacity).unwrap(),
            issued: Vec::new(),
            owner: vec![None; s.capacity as usize],
            last_freed_by: vec![None; s.capacity as usize],
        }
    }

    fn apply(mut sut: Sut, s: &Model, op: Op) -> Sut {
        let before = sut.pool.clone();
        match op {
            Op::Alloc => match sut.pool.alloc() {
                Ok(h) => sut.record(h),
                Err(e) => {
                    assert_eq!(
                        e,
                        CoreError::PoolExhausted {
                            requested: 1,
                            free: 0
                        }
                    );
                    assert_eq!(sut.pool, before);
                }
            },
            Op::AllocMany(n) => match sut.pool.alloc_many(n) {
                Ok(hs) => {
                    assert_eq!(hs.len(), n as usize);
                    hs.into_iter().for_each(|h| sut.record(h));
                }
                Err(e) => {
                    assert_eq!(
                        e,
                        CoreError::PoolExhausted {
                            requested: n,
                            free: before.free_count()
                        }
                    );
                    assert_eq!(sut.pool, before);
                }
            },
            Op::Free(i) => {
                if sut.issued.is_empty() {
                    return sut;
                }
                let i = i % sut.issued.len();
                let h = sut.issued[i];
                let p = h.page().index();
                let r = sut.pool.free(h);
                if s.freed_live {
                    // The model freed it just now: it must have been live.
                    assert_eq!(r, Ok(()));
                    assert_eq!(sut.owner[p], Some(i));
                    sut.owner[p] = None;
                    sut.last_freed_by[p] = Some(i);
                } else {
                    let want = if sut.last_freed_by[p] == Some(i) {
                        CoreError::DoubleFree { page: p as u32 }
                    } else {
                        CoreError::StaleHandle {
                            page: p as u32,
                            generation: h.generation(),
                        }
                    };
                    assert_eq!(r, Err(want));
                    assert_eq!(sut.pool, before);
                }
            }
            Op::FreeRaw(page, generation) => {
                let h = PageHandle::from_raw(PageId(page), generation);
                let r = sut.pool.free(h);
                if page >= s.capacity {
                    assert_eq!(
                        r,
                        Err(CoreError::OutOfRange {
                            index: page.into(),
                            len: s.capacity.into()
                        })
                    );
                }
                match r {
                    Ok(()) => {
                        // Only a handle equal to the live one may free it; the
                        // model did not see this free, so skip the rest of the
                        // case by restoring the page.
                        let i = sut.owner[page as usize].expect("freed a page nobody owned");
                        assert_eq!(sut.issued[i], h);
                        let again = sut.pool.alloc().unwrap();
                        assert_eq!(again.page(), h.page());
                        sut.issued[i] = again;
                    }
                    Err(e) => {
                        assert_eq!(sut.pool, before);
                        if page < s.capacity {
                            // A double free only if this is the very handle
                            // whose free was the page's last event.
                            let p = page as usize;
                            let want = match sut.last_freed_by[p] {
                                Some(i) if sut.owner[p].is_none() && sut.issued[i] == h => {
                                    CoreError::DoubleFree { page }
                                }
                                _ => CoreError::StaleHandle { page, generation },
                            };
                            assert_eq!(e, want);
                        }
                    }
                }
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, s: &Model) {
        assert_eq!(sut.pool.free_count(), s.free);
        assert_eq!(sut.pool.free_count() + sut.pool.used_count(), s.capacity);
        let live = s.live.iter().filter(|&&l| l).count() as u32;
        assert_eq!(sut.pool.used_count(), live);
        for (i, h) in sut.issued.iter().enumerate() {
            assert_eq!(sut.pool.is_live(*h), s.live[i], "handle {i} {h:?}");
        }
    }
}

prop_state_machine! {
    #![proptest_config(common::config())]
    #[test]
    fn pool_matches_model(sequential 1..40 => PoolTest);
}
