//! `gpu_exactness`'s control-operation tests: publish work O(changed) and exact, a reclaimed
//! page's fills, drafts after a partial accept, the host view after write-backs, a failed publish
//! poisoning the pool (the harness is `gpu_exactness.rs`'s).

use super::*;

/// A step after admissions, reclaims, growth and write-backs costs what a step without them
/// costs: each control operation publishes O(changed) work — rows copied, table words patched,
/// bytes staged for the device — never the arena, and waits for nothing on the host. The bytes
/// stay equal to the CPU reference's throughout (timing: the bench).
#[test]
fn publish_work_is_o_changed_and_exact() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let mut g = Geometry {
        row_bytes: 656,
        layers: 2,
        page_rows: 64,
        arena_pages: 0,
        hot_rows: 128,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    };
    let history = 2048u32;
    g.arena_pages = 4 * (g.fixed_pages() + history / 64) + 16;
    let arena_bytes = g.arena_rows() * g.token_bytes() as u64;
    let (mut cpu, mut gp) = four_session_pools(&gpu, g);
    let sessions = [1u64, 2, 3, 4];
    let hists: Vec<Vec<u8>> = sessions
        .iter()
        .map(|&s| pattern_tokens(g.row_bytes, g.layers, s, 0, history))
        .collect();
    let batch: Vec<(u64, &[u8])> = sessions
        .iter()
        .zip(&hists)
        .map(|(&s, h)| (s, h.as_slice()))
        .collect();
    for &(s, h) in &batch {
        cpu.admit(s, h).unwrap();
    }
    let c0 = gp.flush_counters();
    gp.admit_batch(&batch).unwrap();
    let c1 = gp.flush_counters();
    let lent = gp.cpu().elastic_lent() as u64;
    assert_eq!(lent, cpu.elastic_lent() as u64);
    // Admissions: the lent pages and the tails, once, on the copy stream; one publish.
    assert_eq!(c1.rows_filled - c0.rows_filled, lent * 64 + 4 * 64);
    assert_eq!(c1.rows_copied - c0.rows_copied, 0);
    assert_eq!(c1.host_syncs - c0.host_syncs, 0);
    assert_eq!(c1.flushes - c0.flushes, 1);

    let mut rng = 9u64;
    let step = |gp: &mut GpuElasticPool, cpu: &mut ElasticPool, rng: &mut u64| {
        let k = 64;
        let len = cpu.committed_len(1).unwrap() as i32;
        let topk: Vec<i32> = (0..sessions.len() * k)
            .map(|_| below(rng, len as u64) as i32)
            .collect();
        let seq: Vec<i32> = sessions
            .iter()
            .map(|&s| cpu.committed_len(s).unwrap() as i32)
            .collect();
        let topk: Vec<i32> = topk
            .iter()
            .enumerate()
            .map(|(i, &p)| p.min(seq[i / k] - 1))
            .collect();
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &[0, 1, 2, 3, 4],
            seq_lens: &seq,
            topk: &topk,
            k,
            layer: 0,
        };
        let (mut i1, mut v1) = (vec![0; topk.len()], vec![0; 4]);
        let (mut i2, mut v2) = (vec![0; topk.len()], vec![0; 4]);
        let a = cpu
            .resolve(
                &input,
                &mut ResolveOutput {
                    indices: &mut i1,
                    valid_count: &mut v1,
                },
            )
            .unwrap();
        let b = gp
            .resolve(
                &input,
                &mut ResolveOutput {
                    indices: &mut i2,
                    valid_count: &mut v2,
                },
            )
            .unwrap();
        assert_eq!((&i1, &v1), (&i2, &v2));
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        let plane = gp.device().download_plane(0).unwrap();
        let cplane = cpu.plane(0).unwrap();
        for &r in i2.iter().filter(|&&r| r >= 0) {
            let at = r as usize * 656;
            assert_eq!(plane[at..at + 656], cplane[at..at + 656], "row {r}");
        }
    };
    step(&mut gp, &mut cpu, &mut rng);

    // A step's append through the device: one write-back row per session, one descriptor each.
    let c2 = gp.flush_counters();
    let mut appends = Vec::new();
    for &s in &sessions {
        let p = cpu.committed_len(s).unwrap();
        let t = pattern_tokens(g.row_bytes, g.layers, s, p, 1);
        let row = gp.tail_row_of(s, p).unwrap();
        for l in 0..g.layers {
            let at = l as usize * 656;
            gp.device_mut()
                .upload_rows(l, row, &t[at..at + 656])
                .unwrap();
        }
        cpu.append(s, &t).unwrap();
        appends.push((s, 1));
    }
    let direct_before = gp.device().direct_batch();
    gp.append_written_batch(&appends).unwrap();
    let c3 = gp.flush_counters();
    assert_eq!(c3.rows_written_back - c2.rows_written_back, 4);
    assert_eq!(c3.rows_copied - c2.rows_copied, 0);
    assert_eq!(c3.rows_filled - c2.rows_filled, 0);
    // Four descriptors, and the direct-batch word when the appends flipped it.
    let flip = u64::from(gp.device().direct_batch() != direct_before);
    assert_eq!(c3.words_patched - c2.words_patched, 4 * 8 + flip);
    assert_eq!(c3.ranges_reset - c2.ranges_reset, 0);
    assert_eq!(c3.host_syncs - c2.host_syncs, 0);
    assert!(c3.staged_bytes - c2.staged_bytes <= 1024);
    step(&mut gp, &mut cpu, &mut rng);

    // Reclaim: page-table entries and descriptors only, no row moves. (The test lets the step's
    // readers pass first so both pools free the reclaimed pages at the same call and lend the
    // same pages later; the pool itself does not wait.)
    gp.device().gpu().synchronize().unwrap();
    let c4 = gp.flush_counters();
    assert_eq!(gp.reclaim(6).unwrap(), cpu.reclaim(6).unwrap());
    let c5 = gp.flush_counters();
    assert_eq!(
        c5.rows_filled + c5.rows_copied,
        c4.rows_filled + c4.rows_copied
    );
    assert!(c5.words_patched - c4.words_patched <= 6 + 4 * 8 + 1); // + the direct-batch word
    assert!(c5.staged_bytes - c4.staged_bytes <= 2048);
    assert_eq!(c5.host_syncs - c4.host_syncs, 0);
    step(&mut gp, &mut cpu, &mut rng);

    // Growth between steps: the grown pages' rows, on the copy stream.
    gp.device().gpu().synchronize().unwrap();
    let c6 = gp.flush_counters();
    let m = gp.between_steps(4).unwrap();
    assert_eq!(m, cpu.between_steps(4).unwrap());
    let c7 = gp.flush_counters();
    assert_eq!(c7.rows_filled - c6.rows_filled, m.grown as u64 * 64);
    assert_eq!(c7.rows_copied - c6.rows_copied, 0);
    assert!(c7.words_patched - c6.words_patched <= m.grown as u64 + 4 * 8 + 1); // + the direct word
    assert_eq!(c7.host_syncs - c6.host_syncs, 0);
    step(&mut gp, &mut cpu, &mut rng);

    // Finish and re-admit: the slot reset is a few ranges, not an upload.
    let c8 = gp.flush_counters();
    gp.finish(4).unwrap();
    cpu.finish(4).unwrap();
    let c9 = gp.flush_counters();
    assert_eq!(
        c9.rows_filled + c9.rows_copied,
        c8.rows_filled + c8.rows_copied
    );
    assert!(c9.staged_bytes - c8.staged_bytes <= 1024);
    let total = c9.staged_bytes - c1.staged_bytes;
    assert!(
        total * 100 < arena_bytes,
        "{total} bytes staged after the admissions vs a {arena_bytes}-byte arena"
    );
    // The history lives once, in the pinned store, with the written-back rows.
    gp.device().gpu().synchronize().unwrap();
    for &s in &sessions[..3] {
        let n = cpu.committed_len(s).unwrap();
        for p in [0, n / 2, n - 1] {
            assert_eq!(
                gp.cpu().host().token(s, p).unwrap(),
                cpu.host().token(s, p).unwrap()
            );
        }
    }
}

/// Bug 1 (two fills into one page in one replay launch): in one `admit_batch`, A borrows every
/// free page (fills logged, not published); B's admission reclaims A's pages, `collect` frees
/// them at once (no reader) and B's fixed pages — its tail rows — are those pages. A's pending
/// fills into them must be dropped, so B's tail rows hold B's bytes, not A's history.
#[test]
fn admit_batch_reclaimed_page_holds_only_the_new_owners_fills() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let mut g = Geometry {
        row_bytes: 64,
        layers: 2,
        page_rows: 16,
        arena_pages: 0,
        hot_rows: 32,
        tail_rows: 16,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    };
    let f = g.fixed_pages();
    // A's fixed pages + every other page borrowed by A: B's fixed pages all come from A's loans.
    g.arena_pages = 2 * f + 2;
    let (mut cpu, mut gp) = four_session_pools(&gpu, g);
    let (a, b) = (21u64, 22u64);
    let ha = pattern_tokens(g.row_bytes, g.layers, a, 0, 32 * g.page_rows);
    let hb = pattern_tokens(g.row_bytes, g.layers, b, 0, 5 * g.page_rows - 3);
    let want = vec![cpu.admit(a, &ha), cpu.admit(b, &hb)];
    assert_eq!(
        want[0],
        Ok(kv_elastic::Admission::Admitted {
            borrowed_pages: f + 2
        })
    );
    let got = gp.admit_batch(&[(a, &ha[..]), (b, &hb[..])]).unwrap();
    assert_eq!(
        want.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        got
    );
    assert!(
        gp.cpu().counters().pages_reclaimed >= f as u64,
        "B reclaimed A's pages"
    );
    gpu.synchronize().unwrap();
    let tb = g.token_bytes();
    let rb = g.row_bytes as usize;
    let nb = (hb.len() / tb) as u32;
    for layer in 0..g.layers {
        let plane = gp.device().download_plane(layer).unwrap();
        let cplane = cpu.plane(layer).unwrap();
        for p in nb - g.tail_rows..nb {
            let row = gp.tail_row_of(b, p).unwrap() as usize;
            let at = p as usize * tb + layer as usize * rb;
            assert_eq!(
                plane[row * rb..(row + 1) * rb],
                hb[at..at + rb],
                "B's tail row {p}"
            );
            assert_eq!(
                plane[row * rb..(row + 1) * rb],
                cplane[row * rb..(row + 1) * rb]
            );
        }
    }
}

/// Resolves `positions` of one session on both pools and checks the GPU arena's bytes at every
/// returned row against the CPU reference's.
fn resolve_same(cpu: &mut ElasticPool, gp: &mut GpuElasticPool, s: u64, positions: &[i32]) {
    let seq = (cpu.committed_len(s).unwrap() + cpu.scratch_len(s).unwrap()) as i32;
    let input = ResolveInput {
        sessions: &[s],
        query_start_loc: &[0, 1],
        seq_lens: &[seq],
        topk: positions,
        k: positions.len(),
        layer: 0,
    };
    let (mut i1, mut v1) = (vec![0; positions.len()], vec![0; 1]);
    let (mut i2, mut v2) = (vec![0; positions.len()], vec![0; 1]);
    let mut o1 = ResolveOutput {
        indices: &mut i1,
        valid_count: &mut v1,
    };
    let mut o2 = ResolveOutput {
        indices: &mut i2,
        valid_count: &mut v2,
    };
    let (a, b) = (cpu.resolve(&input, &mut o1), gp.resolve(&input, &mut o2));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((i1.clone(), v1), (i2, v2));
    assert_eq!(a.stats, b.stats);
    let rb = cpu.geometry().row_bytes as usize;
    let plane = gp.device().download_plane(0).unwrap();
    let cplane = cpu.plane(0).unwrap();
    for &r in i1.iter().filter(|&&r| r >= 0) {
        let at = r as usize * rb;
        assert_eq!(plane[at..at + rb], cplane[at..at + rb], "row {r}");
    }
}

/// Bug 2 (host rewrites pinned draft bytes a queued step copy still reads): drafts, a partial
/// accept, then new drafts or an append at the rejected drafts' positions, with no host wait in
/// between; the scratch, tail and host store must hold what the CPU reference holds.
#[test]
fn drafts_after_partial_accept_keep_their_bytes() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let g = Geometry {
        row_bytes: 64,
        layers: 2,
        page_rows: 16,
        arena_pages: 64,
        hot_rows: 32,
        tail_rows: 16,
        scratch_rows: 8,
        layer_groups: Default::default(),
        row_format: None,
    };
    let (mut cpu, mut gp) = four_session_pools(&gpu, g);
    let s = 31u64;
    let h = pattern_tokens(g.row_bytes, g.layers, s, 0, 40);
    assert_eq!(cpu.admit(s, &h), gp.admit(s, &h));
    let mut seed = 100u32;
    for round in 0..24u64 {
        let c = cpu.committed_len(s).unwrap();
        let drafts = pattern_tokens(g.row_bytes, g.layers, s, seed, 6);
        seed += 6;
        assert_eq!(cpu.write_scratch(s, &drafts), gp.write_scratch(s, &drafts));
        assert_eq!(cpu.accept(s, 1), gp.accept(s, 1));
        if round % 2 == 0 {
            let more = pattern_tokens(g.row_bytes, g.layers, s, seed, 5);
            seed += 5;
            assert_eq!(cpu.write_scratch(s, &more), gp.write_scratch(s, &more));
        } else {
            let tok = pattern_tokens(g.row_bytes, g.layers, s, seed, 1);
            seed += 1;
            assert_eq!(cpu.append(s, &tok), gp.append(s, &tok));
        }
        let seq = cpu.committed_len(s).unwrap() + cpu.scratch_len(s).unwrap();
        let picks: Vec<i32> = (c as i32..seq as i32).collect();
        resolve_same(&mut cpu, &mut gp, s, &picks);
        gpu.synchronize().unwrap();
        for p in 0..cpu.committed_len(s).unwrap() {
            assert_eq!(
                cpu.host().token(s, p).unwrap(),
                gp.cpu().host().token(s, p).unwrap(),
                "committed token {p}"
            );
        }
    }
}

/// Bug 3 (a safe `&[u8]` over pinned bytes a queued write-back still writes): right after
/// `append_written` (no host wait), `cpu().host().token()` must return the rows the engine wrote.
#[test]
fn host_view_waits_for_queued_write_backs() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let g = small_geometry();
    let (_, mut gp) = four_session_pools(&gpu, g);
    let s = 41u64;
    let h = pattern_tokens(g.row_bytes, g.layers, s, 0, 40);
    gp.admit(s, &h).unwrap();
    let rb = g.row_bytes as usize;
    for round in 0..32u32 {
        let p = gp.cpu().committed_len(s).unwrap();
        let tok = pattern_tokens(g.row_bytes, g.layers, s + 1000, p, 1);
        let row = gp.tail_row_of(s, p).unwrap();
        for layer in 0..g.layers {
            let at = layer as usize * rb;
            gp.device_mut()
                .upload_rows(layer, row, &tok[at..at + rb])
                .unwrap();
        }
        assert_eq!(gp.append_written(s, 1).unwrap(), p + 1, "round {round}");
        assert_eq!(
            gp.cpu().host().token(s, p).unwrap(),
            &tok[..],
            "round {round}"
        );
    }
}

/// Bug 4 (a failed publish left the pool inconsistent): a publish failing after it took the
/// change log poisons the pool; that call returns the failure, every later call `Poisoned`.
#[test]
fn failed_publish_poisons_the_pool() {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    let g = small_geometry();
    let (_, mut gp) = four_session_pools(&gpu, g);
    let h = pattern_tokens(g.row_bytes, g.layers, 51, 0, 40);
    gp.admit(51, &h).unwrap();
    gp.inject_publish_failure();
    let tok = pattern_tokens(g.row_bytes, g.layers, 51, 40, 1);
    assert_eq!(
        gp.append(51, &tok),
        Err(KvError::Unsupported("injected publish failure"))
    );
    let poisoned =
        |r: Result<(), KvError>| assert!(matches!(r, Err(KvError::Poisoned(_))), "{r:?}");
    poisoned(gp.publish());
    poisoned(gp.append(51, &tok).map(drop));
    poisoned(gp.admit(52, &h).map(drop));
    poisoned(gp.admit_batch(&[(53, &h[..])]).map(drop));
    poisoned(gp.append_written(51, 1).map(drop));
    poisoned(gp.append_written_batch(&[(51, 1)]).map(drop));
    poisoned(gp.write_scratch(51, &tok));
    poisoned(gp.accept(51, 0).map(drop));
    poisoned(gp.reclaim(1).map(drop));
    poisoned(gp.between_steps(1).map(drop));
    poisoned(gp.slot_of(51).map(drop));
    poisoned(gp.tail_row_of(51, 0).map(drop));
    poisoned(gp.finish(51));
    let (mut idx, mut valid) = (vec![0; 1], vec![0; 1]);
    let r = gp.resolve(
        &ResolveInput {
            sessions: &[51],
            query_start_loc: &[0, 1],
            seq_lens: &[40],
            topk: &[0],
            k: 1,
            layer: 0,
        },
        &mut ResolveOutput {
            indices: &mut idx,
            valid_count: &mut valid,
        },
    );
    assert!(matches!(r, Err(KvError::Poisoned(_))));
    poisoned(gp.replay(&ResolvePlan::default(), 0));
    poisoned(gp.prefetch(51, &[0], 0).map(drop));
}

/// The 64-page, 2-layer geometry of the publish-window tests (4 draft rows per session).
fn small_geometry() -> Geometry {
    Geometry {
        row_bytes: 64,
        layers: 2,
        page_rows: 16,
        arena_pages: 64,
        hot_rows: 32,
        tail_rows: 16,
        scratch_rows: 4,
        layer_groups: Default::default(),
        row_format: None,
    }
}
