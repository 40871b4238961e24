//! Deterministic scenarios of the elastic pool: admission newest-first, the direct path, reclaim
//! oldest-first in proportion, bounded hand-back, prefetch, speculative scratch, typed errors.

use kv_elastic::{
    Admission, ElasticPool, Geometry, KvError, PoolConfig, ResolveInput, ResolveOutput, Resolver,
};
use tierkit_testkit::{pattern_row, pattern_tokens};

fn geometry(arena_pages: u32) -> Geometry {
    // Fixed rows: 8 hot + 4 tail + 4 scratch = 16 rows = 4 pages of 4 rows.
    Geometry {
        row_bytes: 16,
        layers: 2,
        page_rows: 4,
        arena_pages,
        hot_rows: 8,
        tail_rows: 4,
        scratch_rows: 4,
    }
}

fn resolve(
    pool: &mut ElasticPool,
    s: u64,
    seq_len: i32,
    picks: &[i32],
) -> (Vec<i32>, kv_elastic::ResolveStats) {
    let mut idx = vec![0; picks.len()];
    let mut valid = [0];
    let input = ResolveInput {
        sessions: &[s],
        query_start_loc: &[0, 1],
        seq_lens: &[seq_len],
        topk: picks,
        k: picks.len(),
        layer: 0,
    };
    let done = pool
        .resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut idx,
                valid_count: &mut valid,
            },
        )
        .unwrap();
    for l in 1..pool.geometry().layers {
        pool.replay(&done.plan, l).unwrap();
    }
    (idx, done.stats)
}

fn assert_rows(pool: &ElasticPool, s: u64, picks: &[i32], idx: &[i32]) {
    let mut want = vec![0u8; 16];
    for (&p, &i) in picks.iter().zip(idx) {
        for l in 0..2 {
            pattern_row(s, p as u32, l, &mut want);
            assert_eq!(
                pool.arena_row(l, i).unwrap(),
                &want[..],
                "session {s} position {p} layer {l}"
            );
        }
    }
}

#[test]
fn admission_borrows_newest_first_and_a_full_holder_takes_the_direct_path() {
    let g = geometry(4 + 3);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: true }).unwrap();
    // 24 tokens: tail holds 20..24, pages 0..5 wanted; only 3 free pages -> pages 2, 3, 4 (newest).
    let a = pool
        .admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 24))
        .unwrap();
    assert_eq!(a, Admission::Admitted { borrowed_pages: 3 });
    assert!(!pool.holds_all(1).unwrap());
    let (idx, st) = resolve(&mut pool, 1, 24, &[23, 19, 8, 0, 3]);
    assert_eq!((st.tail_hits, st.page_hits, st.misses), (1, 2, 2)); // 0 and 3 miss (page 0 not held)
    assert_rows(&pool, 1, &[23, 19, 8, 0, 3], &idx);
    // A short history fits entirely: the direct path, no misses.
    let mut pool = ElasticPool::new(geometry(20), PoolConfig { elastic: true }).unwrap();
    pool.admit(2, &pattern_tokens(g.row_bytes, g.layers, 2, 0, 24))
        .unwrap();
    assert!(pool.holds_all(2).unwrap());
    let (idx, st) = resolve(&mut pool, 2, 24, &[0, 5, 17, 23]);
    assert_eq!((st.misses, st.hot_hits, st.direct_sessions), (0, 0, 1));
    assert_rows(&pool, 2, &[0, 5, 17, 23], &idx);
}

#[test]
fn reclaim_takes_oldest_pages_in_proportion_and_hand_back_is_bounded() {
    let g = geometry(2 * 4 + 12);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: true }).unwrap();
    // Session 1 wants 8 pages, session 2 wants 4: after both, no page is free.
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 36))
        .unwrap();
    pool.admit(2, &pattern_tokens(g.row_bytes, g.layers, 2, 0, 20))
        .unwrap();
    assert_eq!(
        (
            pool.borrowed_pages(1).unwrap(),
            pool.borrowed_pages(2).unwrap()
        ),
        (8, 4)
    );
    // A third admission needs 4 pages: reclaimed 8:4 -> 3 from session 1 (pages 0, 1, 2) and 1 from 2.
    pool.admit(3, &pattern_tokens(g.row_bytes, g.layers, 3, 0, 8))
        .unwrap();
    assert_eq!(
        (
            pool.borrowed_pages(1).unwrap(),
            pool.borrowed_pages(2).unwrap()
        ),
        (5, 3)
    );
    let (idx, st) = resolve(&mut pool, 1, 36, &[0, 4, 8, 12]);
    assert_eq!(
        (st.page_hits, st.misses),
        (1, 3),
        "pages 0..3 went first (oldest)"
    );
    assert_rows(&pool, 1, &[0, 4, 8, 12], &idx);
    pool.check_invariants().unwrap();
    // Finishing session 1 queues its 5 pages; they come back 2 per step and regrow the others.
    pool.finish(1).unwrap();
    assert_eq!(pool.pages().queued, 5);
    let m = pool.between_steps(2).unwrap();
    assert_eq!(m.handed_back, 2);
    assert_eq!(pool.pages().queued, 3);
    for _ in 0..5 {
        pool.between_steps(2).unwrap();
        pool.check_invariants().unwrap();
    }
    assert!(pool.holds_all(2).unwrap());
    for s in [2, 3] {
        pool.finish(s).unwrap();
    }
    for _ in 0..20 {
        pool.between_steps(2).unwrap();
    }
    assert_eq!(pool.pages().free, g.arena_pages, "no page leaked");
}

#[test]
fn fixed_mode_never_lends_and_prefetch_serves_later_layers() {
    let g = geometry(8);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 40))
        .unwrap();
    assert_eq!(pool.borrowed_pages(1).unwrap(), 0);
    let (_, st) = resolve(&mut pool, 1, 40, &[1, 2]);
    assert_eq!(st.misses, 2);
    // Candidates announced at the group's first layer: 1, 2 already hot; 5, 6, 7 fetched.
    let plan = pool.prefetch(1, &[1, 2, 5, 6, 7, -1], 0).unwrap();
    assert_eq!(plan.copies.len(), 3);
    pool.replay(&plan, 1).unwrap();
    let (idx, st) = resolve(&mut pool, 1, 40, &[5, 6, 7, 1]);
    assert_eq!((st.misses, st.hot_hits), (0, 4));
    assert_rows(&pool, 1, &[5, 6, 7, 1], &idx);
    assert_eq!(
        pool.prefetch(1, &[40], 0),
        Err(KvError::PositionOutOfRange {
            row: 0,
            position: 40,
            seq_len: 40
        })
    );
}

#[test]
fn drafts_live_in_scratch_until_accepted() {
    let g = geometry(20);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: true }).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 15))
        .unwrap();
    // Three drafts at positions 15, 16, 17.
    pool.write_scratch(1, &pattern_tokens(g.row_bytes, g.layers, 1, 15, 3))
        .unwrap();
    assert_eq!(
        pool.write_scratch(1, &pattern_tokens(g.row_bytes, g.layers, 1, 18, 2)),
        Err(KvError::ScratchOverflow {
            session: 1,
            scratch_rows: 4,
            requested: 5
        })
    );
    let (idx, st) = resolve(&mut pool, 1, 18, &[17, 15, 14]);
    assert_eq!((st.scratch_hits, st.tail_hits), (2, 1));
    assert_rows(&pool, 1, &[17, 15, 14], &idx);
    // Two accepted: history 17; page 3 (12..16) becomes complete and is lent between steps.
    assert_eq!(pool.accept(1, 2).unwrap(), 17);
    assert_eq!(pool.scratch_len(1).unwrap(), 0);
    pool.between_steps(8).unwrap();
    let (idx, st) = resolve(&mut pool, 1, 17, &[16, 15, 12, 0]);
    assert_eq!(st.scratch_hits, 0);
    assert_rows(&pool, 1, &[16, 15, 12, 0], &idx);
    assert!(pool.holds_all(1).unwrap());
}

#[test]
fn bad_input_is_typed_and_changes_nothing() {
    let g = geometry(8);
    assert_eq!(
        ElasticPool::new(
            Geometry {
                arena_pages: 3,
                ..g
            },
            PoolConfig::default()
        )
        .err(),
        Some(KvError::ArenaTooSmall {
            arena_pages: 3,
            needed_pages: 4
        })
    );
    let mut pool = ElasticPool::new(g, PoolConfig::default()).unwrap();
    assert_eq!(pool.admit(1, &[]), Err(KvError::EmptyHistory));
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 10))
        .unwrap();
    // 8 pages: session 1 took 4 fixed + borrowed the rest; session 2 reclaims them.
    pool.admit(2, &pattern_tokens(g.row_bytes, g.layers, 2, 0, 10))
        .unwrap();
    // A third session cannot fit even after reclaiming everything.
    assert!(matches!(
        pool.admit(3, &pattern_tokens(g.row_bytes, g.layers, 3, 0, 4)),
        Err(KvError::NoRoom { .. })
    ));
    pool.finish(2).unwrap();
    assert_eq!(
        pool.append(2, &pattern_tokens(g.row_bytes, g.layers, 2, 10, 1)),
        Err(KvError::SessionFinished(2))
    );
    assert_eq!(
        pool.append(9, &pattern_tokens(g.row_bytes, g.layers, 9, 0, 1)),
        Err(KvError::UnknownSession(9))
    );
    assert_eq!(
        pool.admit(2, &pattern_tokens(g.row_bytes, g.layers, 2, 0, 1)),
        Err(KvError::SessionExists(2))
    );
    let mut idx = [0; 2];
    let mut valid = [0; 2];
    let input = ResolveInput {
        sessions: &[1, 1],
        query_start_loc: &[0, 1, 2],
        seq_lens: &[10, 10],
        topk: &[0, 1],
        k: 1,
        layer: 0,
    };
    assert_eq!(
        pool.resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut idx,
                valid_count: &mut valid
            }
        )
        .err(),
        Some(KvError::DuplicateSession(1))
    );
    let input = ResolveInput {
        sessions: &[1],
        query_start_loc: &[0, 2],
        seq_lens: &[10],
        topk: &[0, 1],
        k: 1,
        layer: 2,
    };
    assert_eq!(
        pool.resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut idx,
                valid_count: &mut valid[..2]
            }
        )
        .err(),
        Some(KvError::LayerOutOfRange {
            layer: 2,
            layers: 2
        })
    );
    assert_eq!(
        (idx, valid),
        ([-1, -1], [0, 0]),
        "outputs fully written on error"
    );
    pool.check_invariants().unwrap();
}

#[test]
fn huge_geometries_are_typed_errors_not_aborts() {
    // Out of the documented bounds: rejected before any allocation (a 2 TB plane used to abort).
    for g in [
        Geometry {
            row_bytes: 1000,
            page_rows: 1 << 20,
            arena_pages: 2000,
            ..geometry(8)
        },
        Geometry {
            layers: u32::MAX,
            ..geometry(8)
        },
        Geometry {
            hot_rows: 64,
            tail_rows: 4_294_967_232,
            ..geometry(8)
        },
    ] {
        let r = ElasticPool::new(g, PoolConfig::default());
        assert!(
            matches!(r, Err(KvError::InvalidGeometry(_))),
            "{g:?}: {r:?}"
        );
    }
    // Inside the bounds (just under 1 TiB of arena) but more than the host may give: either the
    // allocator grants it lazily or the pool answers `OutOfMemory`; it never aborts.
    let g = Geometry {
        row_bytes: 512,
        layers: 1,
        page_rows: 1 << 16,
        arena_pages: 32_767,
        hot_rows: 8,
        tail_rows: 4,
        scratch_rows: 0,
    };
    g.validate().unwrap();
    match ElasticPool::new(g, PoolConfig::default()) {
        Ok(pool) => assert_eq!(pool.plane(0).unwrap().len(), g.plane_bytes()),
        Err(e) => assert!(
            matches!(e, KvError::OutOfMemory { what: "arena plane", bytes } if bytes == g.plane_bytes() as u64),
            "{e:?}"
        ),
    }
}
