//! `PageMap` against a reference model (a `BTreeMap` + a change counter).
//!
//! Every call's result is predicted by the model (value, previous page, or
//! the exact error); errors must leave the map unchanged, and the flat table
//! must always equal the model rendered as `i32` with `-1` holes. Half the
//! cases start from a map loaded (serde) two changes short of
//! `MAX_GENERATION`, so the refusal to bump past it is exercised too.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use tier_core::{CoreError, PageId, PageMap, MAX_GENERATION, MAX_MAPPED_PAGE, NOT_RESIDENT};

#[derive(Clone, Debug, Default)]
struct Model {
    len: u32,
    entries: BTreeMap<u32, u32>,
    generation: u64,
    /// What the last transition must return.
    expect: Option<Result<Option<u32>, CoreError>>,
}

#[derive(Clone, Debug)]
enum Op {
    Get(u32),
    Set(u32, u32),
    /// Set planned at `generation - lag`.
    SetIfGeneration(u64, u32, u32),
    Clear(u32),
    Resize(u32),
    /// Move the page of `from` to the unmapped `to`.
    Move(u32, u32),
}

/// The generation after one more change, as the map must compute it.
fn bump(generation: u64) -> Result<u64, CoreError> {
    if generation < MAX_GENERATION {
        Ok(generation + 1)
    } else {
        Err(CoreError::GenerationExhausted { generation })
    }
}

fn oob(index: u32, len: u32) -> CoreError {
    CoreError::OutOfRange {
        index: index.into(),
        len: len.into(),
    }
}

struct MapRef;

impl ReferenceStateMachine for MapRef {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (0u32..6, prop_oneof![Just(0), Just(MAX_GENERATION - 2)])
            .prop_map(|(len, generation)| Model {
                len,
                generation,
                ..Model::default()
            })
            .boxed()
    }

    fn transitions(s: &Model) -> BoxedStrategy<Op> {
        let l = s.len + 2;
        let page =
            prop_oneof![8 => 0u32..8, 1 => Just(MAX_MAPPED_PAGE), 1 => Just(MAX_MAPPED_PAGE + 1)];
        prop_oneof![
            2 => (0..l).prop_map(Op::Get),
            4 => (0..l, page.clone()).prop_map(|(i, p)| Op::Set(i, p)),
            1 => (0u64..2, 0..l, page).prop_map(|(lag, i, p)| Op::SetIfGeneration(lag, i, p)),
            2 => (0..l).prop_map(Op::Clear),
            1 => (0..l + 2).prop_map(Op::Resize),
            2 => (0..l, 0..l).prop_map(|(f, t)| Op::Move(f, t)),
        ]
        .boxed()
    }

    fn apply(mut s: Model, op: &Op) -> Model {
        let set = |s: &mut Model, i: u32, p: u32| -> Result<Option<u32>, CoreError> {
            if p > MAX_MAPPED_PAGE {
                return Err(CoreError::OutOfRange {
                    index: p.into(),
                    len: u64::from(MAX_MAPPED_PAGE) + 1,
                });
            }
            if i >= s.len {
                return Err(oob(i, s.len));
            }
            s.generation = bump(s.generation)?;
            Ok(s.entries.insert(i, p))
        };
        s.expect = Some(match *op {
            Op::Get(i) if i >= s.len => Err(oob(i, s.len)),
            Op::Get(i) => Ok(s.entries.get(&i).copied()),
            Op::Set(i, p) => set(&mut s, i, p),
            Op::SetIfGeneration(lag, i, p) => {
                let planned = s.generation.saturating_sub(lag);
                if planned != s.generation {
                    Err(CoreError::StaleGeneration {
                        expected: planned,
                        actual: s.generation,
                    })
                } else {
                    set(&mut s, i, p)
                }
            }
            Op::Clear(i) if i >= s.len => Err(oob(i, s.len)),
            Op::Clear(i) => match s.entries.get(&i) {
                None => Ok(None),
                Some(_) => bump(s.generation).map(|g| {
                    s.generation = g;
                    s.entries.remove(&i)
                }),
            },
            Op::Move(f, _) if f >= s.len => Err(oob(f, s.len)),
            Op::Move(_, t) if t >= s.len => Err(oob(t, s.len)),
            Op::Move(f, t) => match (s.entries.get(&f).copied(), s.entries.get(&t).copied()) {
                (None, _) => Err(CoreError::NotMapped { logical: f }),
                (Some(_), Some(held)) => Err(CoreError::AlreadyMapped {
                    logical: t,
                    page: held,
                }),
                (Some(p), None) => bump(s.generation).map(|g| {
                    s.generation = g;
                    s.entries.remove(&f);
                    s.entries.insert(t, p);
                    Some(p)
                }),
            },
            Op::Resize(n) => {
                if let Some((&first, _)) = s.entries.range(n..).next() {
                    Err(CoreError::MappedTail { logical: first })
                } else if n == s.len {
                    Ok(None)
                } else {
                    bump(s.generation).map(|g| {
                        s.generation = g;
                        s.len = n;
                        None
                    })
                }
            }
        });
        s
    }
}

struct MapTest;

impl StateMachineTest for MapTest {
    type SystemUnderTest = PageMap;
    type Reference = MapRef;

    fn init_test(s: &Model) -> PageMap {
        if s.generation == 0 {
            PageMap::new(s.len).unwrap()
        } else {
            let table = vec![NOT_RESIDENT; s.len as usize];
            let json = serde_json::json!({ "table": table, "generation": s.generation });
            serde_json::from_value(json).unwrap()
        }
    }

    fn apply(mut map: PageMap, s: &Model, op: Op) -> PageMap {
        let before = map.clone();
        let page = |r: tier_core::Result<Option<PageId>>| r.map(|o| o.map(|p| p.0));
        let got = match op {
            Op::Get(i) => page(map.get(i)),
            Op::Set(i, p) => page(map.set(i, PageId(p))),
            Op::SetIfGeneration(lag, i, p) => {
                let planned = map.generation().saturating_sub(lag);
                page(map.set_if_generation(planned, i, PageId(p)))
            }
            Op::Clear(i) => page(map.clear(i)),
            Op::Resize(n) => map.resize(n).map(|()| None),
            Op::Move(f, t) => map.move_page(f, t).map(|p| Some(p.0)),
        };
        assert_eq!(Some(&got), s.expect.as_ref(), "{op:?}");
        if got.is_err() {
            assert_eq!(map, before, "error changed the map");
        }
        map
    }

    fn check_invariants(map: &PageMap, s: &Model) {
        assert_eq!(map.len(), s.len);
        assert_eq!(map.generation(), s.generation);
        assert_eq!(map.mapped_count() as usize, s.entries.len());
        let want: Vec<i32> = (0..s.len)
            .map(|i| s.entries.get(&i).map_or(NOT_RESIDENT, |&p| p as i32))
            .collect();
        assert_eq!(map.table(), want.as_slice());
        assert!(map.check_generation(s.generation).is_ok());
    }
}

prop_state_machine! {
    #![proptest_config(common::config())]
    #[test]
    fn map_matches_model(sequential 1..40 => MapTest);
}
