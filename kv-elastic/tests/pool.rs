//! Deterministic scenarios of the elastic pool: admission newest-first, the direct path, reclaim
//! oldest-first in proportion, bounded hand-back, prefetch, speculative scratch, typed errors.

use kv_elastic::{
    Admission, AdmitOptions, ElasticPool, Geometry, KvError, LayerGroups, OutputLayout, PoolConfig,
    ResolveInput, ResolveOptions, ResolveOutput, Resolver, StepOptions,
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
        // Both layers share the indexer's picks (the scenarios resolve at layer 0).
        layer_groups: LayerGroups::one(),
        row_format: None,
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
                pool.arena_row(l, i).as_deref().unwrap(),
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

/// The caller-driven residency operations (an engine's own order: a free queue, a whole-request
/// demotion, growth it decides): admission without borrowing, revocation of named pages,
/// lending to one session, maintenance without growth; bytes stay exact and the books balance.
#[test]
fn caller_chosen_revocation_lending_and_admission_keep_the_books_and_bytes() {
    let g = geometry(2 * 4 + 12);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: true }).unwrap();
    // Session 1 lands on its hot cache alone (0 pages), session 2 borrows all it wants (4).
    let none = AdmitOptions {
        max_borrowed_pages: 0,
    };
    let a = pool
        .admit_with(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 36), none)
        .unwrap();
    assert_eq!(a, Admission::Admitted { borrowed_pages: 0 });
    assert_eq!(pool.wanted_pages(36), 8);
    pool.admit(2, &pattern_tokens(g.row_bytes, g.layers, 2, 0, 20))
        .unwrap();
    assert_eq!(pool.borrowed_pages(2).unwrap(), 4);
    // Maintenance without growth lends nothing although 8 pages are free.
    let m = pool
        .between_steps_with(16, StepOptions { growth: false })
        .unwrap();
    assert_eq!((m.grown, pool.borrowed_pages(1).unwrap()), (0, 0));
    assert_eq!(pool.pages().free, 8);
    // Lending to session 1 takes its newest pages first (7, 6, 5).
    assert_eq!(pool.lend(1, 3).unwrap(), 3);
    let table = pool.placement(1).unwrap().page_table.to_vec();
    let held: Vec<usize> = (0..8).filter(|&j| table[j] >= 0).collect();
    assert_eq!(held, [5, 6, 7]);
    // Revoking named pages: 6 is held, 0 is not (skipped); counted as reclaimed.
    let before = pool.counters().pages_reclaimed;
    assert_eq!(pool.revoke(1, &[6, 0]).unwrap(), 1);
    assert_eq!(pool.counters().pages_reclaimed, before + 1);
    let table = pool.placement(1).unwrap().page_table.to_vec();
    assert!(table[6] < 0 && table[5] >= 0 && table[7] >= 0);
    pool.check_invariants().unwrap();
    // Position 24 (page 6) now misses and comes back exact; 20 (page 5) is a page hit.
    let (idx, st) = resolve(&mut pool, 1, 36, &[24, 20, 0]);
    assert_eq!((st.page_hits, st.misses), (1, 2));
    assert_rows(&pool, 1, &[24, 20, 0], &idx);
    // A whole-request demotion: every page of session 2 back, then it resolves from its hot cache.
    assert_eq!(pool.revoke(2, &[0, 1, 2, 3]).unwrap(), 4);
    assert_eq!(pool.borrowed_pages(2).unwrap(), 0);
    let (idx, st) = resolve(&mut pool, 2, 20, &[0, 5, 15]);
    assert_eq!(st.misses, 3);
    assert_rows(&pool, 2, &[0, 5, 15], &idx);
    pool.check_invariants().unwrap();
    // Lending to the session that held everything brings its newest page back first.
    assert_eq!(pool.lend(2, 1).unwrap(), 1);
    assert!(pool.placement(2).unwrap().page_table[3] >= 0);
    // Errors: unknown and finished sessions; lending in a fixed pool.
    assert!(matches!(
        pool.revoke(9, &[0]),
        Err(KvError::UnknownSession(9))
    ));
    assert!(matches!(pool.lend(9, 1), Err(KvError::UnknownSession(9))));
    pool.finish(2).unwrap();
    assert!(pool.revoke(2, &[0]).is_err());
    assert!(pool.lend(2, 1).is_err());
    let mut fixed = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    fixed
        .admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 36))
        .unwrap();
    assert!(matches!(fixed.lend(1, 1), Err(KvError::Unsupported(_))));
    assert_eq!(fixed.revoke(1, &[0, 1]).unwrap(), 0);
    pool.finish(1).unwrap();
    for _ in 0..10 {
        pool.between_steps_with(4, StepOptions { growth: false })
            .unwrap();
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
        layer_groups: Default::default(),
        row_format: None,
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

/// One resolve of `sessions` (rows per `qsl`) with options, into buffers of `extra` padding entries
/// (`indices`) and `extra_rows` padding rows (`valid_count`), poisoned first.
#[allow(clippy::too_many_arguments)]
fn resolve_opts(
    pool: &mut ElasticPool,
    sessions: &[u64],
    qsl: &[i32],
    seq_lens: &[i32],
    topk: &[i32],
    k: usize,
    opts: &ResolveOptions<'_>,
    extra: usize,
    extra_rows: usize,
) -> (kv_elastic::Result<kv_elastic::Resolved>, Vec<i32>, Vec<i32>) {
    let rows = topk.len() / k;
    let mut idx = vec![i32::MIN; topk.len() + extra];
    let mut valid = vec![i32::MIN; rows + extra_rows];
    let input = ResolveInput {
        sessions,
        query_start_loc: qsl,
        seq_lens,
        topk,
        k,
        layer: 0,
    };
    let r = pool.resolve_with(
        &input,
        opts,
        &mut ResolveOutput {
            indices: &mut idx,
            valid_count: &mut valid,
        },
    );
    if let Ok(done) = &r {
        for l in 1..pool.geometry().layers {
            pool.replay(&done.plan, l).unwrap();
        }
    }
    (r, idx, valid)
}

#[test]
fn a_session_named_twice_is_refused_and_later_resolves_stay_exact() {
    let g = geometry(4);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 40))
        .unwrap();
    let (idx, _) = resolve(&mut pool, 1, 40, &[3, 4, 5]);
    assert_rows(&pool, 1, &[3, 4, 5], &idx);
    let hot_before = pool.hot_cache(1, 0).unwrap().slot_table().to_vec();
    let (r, idx2, valid) = resolve_opts(
        &mut pool,
        &[1, 1],
        &[0, 1, 2],
        &[40, 40],
        &[6, 7],
        1,
        &ResolveOptions::default(),
        0,
        0,
    );
    assert_eq!(r.err(), Some(KvError::DuplicateSession(1)));
    assert_eq!((idx2, valid), (vec![-1, -1], vec![0, 0]));
    assert_eq!(pool.hot_cache(1, 0).unwrap().slot_table(), &hot_before[..]);
    let (idx, st) = resolve(&mut pool, 1, 40, &[3, 4, 5, 6, 7]);
    assert_eq!((st.hot_hits, st.misses), (5, 2));
    assert_rows(&pool, 1, &[3, 4, 5, 6, 7], &idx);
    pool.check_invariants().unwrap();
}

#[test]
fn packed_rows_put_valid_entries_first_as_flashmla_topk_length_reads_them() {
    let g = geometry(20);
    let mut pool = ElasticPool::new(g, PoolConfig::default()).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 30))
        .unwrap();
    let topk = [-1, 7, -1, 2, 29, -1, -1, -1, 0, -1, 1, -1];
    let (r, inplace, v_in) = resolve_opts(
        &mut pool,
        &[1],
        &[0, 2],
        &[30],
        &topk,
        6,
        &ResolveOptions::default(),
        0,
        0,
    );
    r.unwrap();
    assert_eq!(v_in, vec![3, 2]);
    assert_eq!(
        inplace[0], -1,
        "in place: -1 stays mid-row, valid_count is not topk_length"
    );
    let (r, packed, v) = resolve_opts(
        &mut pool,
        &[1],
        &[0, 2],
        &[30],
        &topk,
        6,
        &ResolveOptions {
            layout: OutputLayout::Packed,
            query_seq_lens: None,
            ..Default::default()
        },
        0,
        0,
    );
    r.unwrap();
    assert_eq!(v, vec![3, 2]);
    // Row 0: the rows of 7, 2, 29 (column order), then -1; row 1: 0, 1, then -1.
    let compact = |row: &[i32]| -> Vec<i32> { row.iter().copied().filter(|&i| i >= 0).collect() };
    for row in 0..2 {
        let n = v[row] as usize;
        assert_eq!(
            packed[row * 6..row * 6 + n],
            compact(&inplace[row * 6..row * 6 + 6])[..]
        );
        assert!(packed[row * 6 + n..row * 6 + 6].iter().all(|&i| i == -1));
    }
    // What FlashMLA reads (the first topk_length entries) serves exactly the valid picks.
    assert_rows(&pool, 1, &[7, 2, 29], &packed[..3]);
    assert_rows(&pool, 1, &[0, 1], &packed[6..8]);
}

#[test]
fn per_query_bounds_keep_draft_positions_from_earlier_queries() {
    let g = geometry(20);
    let mut pool = ElasticPool::new(g, PoolConfig::default()).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 15))
        .unwrap();
    // Drafts at 15, 16, 17: query row i (verifying draft i) sees 16 + i positions.
    pool.write_scratch(1, &pattern_tokens(g.row_bytes, g.layers, 1, 15, 3))
        .unwrap();
    let bounds = [16, 17, 18];
    let opts = ResolveOptions {
        layout: OutputLayout::InPlace,
        query_seq_lens: Some(&bounds),
        ..Default::default()
    };
    let (r, idx, v) = resolve_opts(
        &mut pool,
        &[1],
        &[0, 3],
        &[18],
        &[15, 3, 16, 15, 17, 16],
        2,
        &opts,
        0,
        0,
    );
    r.unwrap();
    assert_eq!(v, vec![2, 2, 2]);
    assert_rows(&pool, 1, &[15, 3, 16, 15, 17, 16], &idx);
    // Row 0 picking draft 16 (visible only from row 1 on) is refused, outputs filled.
    let (r, idx, v) = resolve_opts(
        &mut pool,
        &[1],
        &[0, 3],
        &[18],
        &[16, -1, 16, 15, 17, 16],
        2,
        &opts,
        1,
        1,
    );
    assert_eq!(
        r.err(),
        Some(KvError::PositionOutOfRange {
            row: 0,
            position: 16,
            seq_len: 16
        })
    );
    assert!(idx.iter().all(|&i| i == -1) && v.iter().all(|&c| c == 0));
    for (bad, at) in [([0, 17, 18], 0), ([16, 19, 18], 1)] {
        let (r, ..) = resolve_opts(
            &mut pool,
            &[1],
            &[0, 3],
            &[18],
            &[0; 6],
            2,
            &ResolveOptions {
                layout: OutputLayout::InPlace,
                query_seq_lens: Some(&bad),
                ..Default::default()
            },
            0,
            0,
        );
        assert_eq!(
            r.err(),
            Some(KvError::QuerySeqLenOutOfRange {
                row: at,
                query_seq_len: bad[at],
                seq_len: 18
            })
        );
    }
    let (r, ..) = resolve_opts(
        &mut pool,
        &[1],
        &[0, 3],
        &[18],
        &[0; 6],
        2,
        &ResolveOptions {
            layout: OutputLayout::InPlace,
            query_seq_lens: Some(&[16, 17]),
            ..Default::default()
        },
        0,
        0,
    );
    assert!(matches!(
        r.err(),
        Some(KvError::LengthMismatch {
            what: "query_seq_lens",
            ..
        })
    ));
    pool.check_invariants().unwrap();
}

#[test]
fn an_overflowing_speculative_step_is_served_not_failed() {
    // Hot cache of 8 rows, no borrowed pages, tail of 4: positions < 36 need the hot cache.
    let g = geometry(4);
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 40))
        .unwrap();
    // Three speculative rows of 5 distinct misses each: 15 distinct positions, 8 hot rows.
    let topk: Vec<i32> = (0..15).collect();
    for layout in [OutputLayout::InPlace, OutputLayout::Packed] {
        let (r, idx, v) = resolve_opts(
            &mut pool,
            &[1],
            &[0, 3],
            &[40],
            &topk,
            5,
            &ResolveOptions {
                layout,
                query_seq_lens: None,
                ..Default::default()
            },
            0,
            0,
        );
        let done = r.expect("served, never HotCacheOverflow");
        // First appearance order: the first 8 positions get the 8 hot rows.
        assert_eq!(done.stats.unserved, 7);
        assert_eq!(done.stats.picks, 8);
        assert_eq!(v, vec![5, 3, 0]);
        if layout == OutputLayout::InPlace {
            assert!(idx[8..].iter().all(|&i| i == -1));
        } else {
            assert!(idx[5..8].iter().all(|&i| i >= 0));
            assert!(idx[8..10].iter().all(|&i| i == -1));
        }
        let served: Vec<i32> = idx.iter().copied().filter(|&i| i >= 0).collect();
        assert_rows(&pool, 1, &topk[..8], &served);
        // The next step is exact and everything served fits again.
        let (idx, st) = resolve(&mut pool, 1, 40, &[20, 21, 39]);
        assert_eq!(st.unserved, 0);
        assert_rows(&pool, 1, &[20, 21, 39], &idx);
    }
    pool.check_invariants().unwrap();
}

#[test]
fn oversized_output_buffers_are_padded() {
    let g = geometry(20);
    let mut pool = ElasticPool::new(g, PoolConfig::default()).unwrap();
    pool.admit(1, &pattern_tokens(g.row_bytes, g.layers, 1, 0, 30))
        .unwrap();
    for layout in [OutputLayout::InPlace, OutputLayout::Packed] {
        let opts = ResolveOptions {
            layout,
            query_seq_lens: None,
            ..Default::default()
        };
        let (r, idx, v) =
            resolve_opts(&mut pool, &[1], &[0, 1], &[30], &[4, -1, 9], 3, &opts, 7, 3);
        r.unwrap();
        assert_eq!(idx.len(), 10);
        assert!(idx[3..].iter().all(|&i| i == -1), "index padding");
        assert_eq!(v, vec![2, 0, 0, 0]);
        // Too short is still refused.
        let mut short = [0; 2];
        let mut valid = [0; 1];
        let input = ResolveInput {
            sessions: &[1],
            query_start_loc: &[0, 1],
            seq_lens: &[30],
            topk: &[4, -1, 9],
            k: 3,
            layer: 0,
        };
        assert!(matches!(
            pool.resolve_with(
                &input,
                &opts,
                &mut ResolveOutput {
                    indices: &mut short,
                    valid_count: &mut valid
                }
            ),
            Err(KvError::LengthMismatch { .. })
        ));
    }
}
