//! `kv_gpu`'s tests of the output paths: packed rows, per-query bounds and padded buffers, the
//! overflowing speculative step, table patches from mapped staging, every engine against the
//! classic kernel, and the direct batch (the set-up and helpers are `kv_gpu.rs`'s).

use super::*;

#[test]
fn packed_rows_per_query_bounds_and_padded_buffers() {
    each_engine(packed_rows_per_query_bounds_and_padded_buffers_on);
}

fn packed_rows_per_query_bounds_and_padded_buffers_on(gpu: Arc<Gpu>) {
    let mut kv = setup(&gpu);
    // Two speculative rows of k = 600 (> KV_BLOCK: the packing crosses chunks): page hits, tail,
    // misses, -1 mid-row.
    let k = 600u32;
    let mut topk = Vec::new();
    for r in 0..2i32 {
        for j in 0..k as i32 {
            topk.push(match (j + r) % 4 {
                0 => -1,
                1 => j % 160,
                2 => 984 + j % 16,
                _ => 200 + (j % 60) + r,
            });
        }
    }
    let inplace = call(&gpu, &topk, &[0, 2], &[1000], &[0], k);
    run_with(&kv, &inplace, 1, &KvResolveOptions::default());
    let packed = call_padded(&gpu, &topk, &[0, 2], &[1000], &[0], k, 37, 5);
    let o = KvResolveOptions {
        layout: KV_LAYOUT_PACKED,
        indices_len: topk.len() as u64 + 37,
        valid_len: 2 + 5,
        ..Default::default()
    };
    run_with(&kv, &packed, 1, &o);
    assert!(kv.errors().unwrap().is_clean());
    let a = inplace.idx.download().unwrap();
    let b = packed.idx.download().unwrap();
    let va = inplace.valid.download().unwrap();
    let vb = packed.valid.download().unwrap();
    assert_eq!(vb[..2], va[..]);
    assert_eq!(vb[2..], [0; 5], "valid padding");
    assert!(b[topk.len()..].iter().all(|&x| x == -1), "index padding");
    for r in 0..2 {
        let row = &a[r * k as usize..(r + 1) * k as usize];
        let compact: Vec<i32> = row.iter().copied().filter(|&x| x >= 0).collect();
        assert_eq!(compact.len(), va[r] as usize);
        let prow = &b[r * k as usize..(r + 1) * k as usize];
        assert_eq!(prow[..compact.len()], compact[..], "packed row {r}");
        assert!(prow[compact.len()..].iter().all(|&x| x == -1));
    }
    // Per-query bounds: row 0 sees 990 positions, row 1 all 1000: row 0's picks >= 990 are -1.
    let bounds = DeviceBuffer::from_host(gpu.ctx(), &[990i32, 1000]).unwrap();
    let c = call(&gpu, &topk, &[0, 2], &[1000], &[0], k);
    run_with(
        &kv,
        &c,
        1,
        &KvResolveOptions {
            query_seq_lens: bounds.device_ptr(),
            ..Default::default()
        },
    );
    let idx = c.idx.download().unwrap();
    let beyond = topk[..k as usize].iter().filter(|&&p| p >= 990).count();
    assert!(beyond > 0);
    assert_eq!(kv.errors().unwrap().bad_position as usize, beyond);
    let plane = kv.download_plane(0).unwrap();
    for (j, &p) in topk.iter().enumerate() {
        let bound = if j < k as usize { 990 } else { 1000 };
        if p < 0 || p >= bound {
            assert_eq!(idx[j], -1, "pick {j} position {p}");
        } else {
            assert_eq!(row_bytes(&plane, idx[j]), &want_row(0, p, 0)[..]);
        }
    }
    kv.clear_errors().unwrap();
    // Launch-time checks: unknown layout, buffers shorter than rows × k.
    let a = KvResolveArgs {
        k: 4,
        rows: 2,
        ..Default::default()
    };
    for o in [
        KvResolveOptions {
            layout: 2,
            ..Default::default()
        },
        KvResolveOptions {
            indices_len: 7,
            ..Default::default()
        },
        KvResolveOptions {
            valid_len: 1,
            ..Default::default()
        },
    ] {
        // SAFETY: refused before any launch.
        let e = unsafe { kv.resolve_async_with(gpu.stream(), &a, &o, CopyBackend::Gather) };
        assert!(e.is_err(), "{o:?}");
    }
}

#[test]
fn an_overflowing_speculative_step_is_served_as_far_as_hot_rows_last() {
    each_engine(an_overflowing_speculative_step_is_served_as_far_as_hot_rows_last_on);
}

fn an_overflowing_speculative_step_is_served_as_far_as_hot_rows_last_on(gpu: Arc<Gpu>) {
    let mut kv = setup(&gpu);
    // Three rows of 40 distinct misses (120 > 64 hot rows): the first 64 in first-appearance order
    // are placed and served exactly, the other picks are -1 and counted as overflow.
    let k = 40u32;
    let topk: Vec<i32> = (0..3 * k as i32).map(|j| 200 + j).collect();
    for layout in [KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED] {
        let c = call(&gpu, &topk, &[0, 3], &[1000], &[0], k);
        run_layout(&kv, &c, 1, layout);
        let e = kv.errors().unwrap();
        assert!(e.overflow > 0 && e.bad_position == 0 && e.bad_session == 0);
        kv.clear_errors().unwrap();
        let idx = c.idx.download().unwrap();
        let valid = c.valid.download().unwrap();
        let st = c.stats.download().unwrap();
        assert_eq!(valid.iter().sum::<i32>() as u32, st[0]);
        assert_eq!(st[0] as usize + e.overflow as usize, topk.len());
        let plane = kv.download_plane(0).unwrap();
        let served: Vec<i32> = idx.iter().copied().filter(|&x| x >= 0).collect();
        assert_eq!(served.len(), st[0] as usize);
        // Served picks are a prefix of the picks (first appearance) and hold their bytes.
        for (j, &row) in served.iter().enumerate() {
            assert_eq!(row_bytes(&plane, row), &want_row(0, topk[j], 0)[..]);
        }
        // The next call is exact.
        let c = call(&gpu, &topk[..k as usize], &[0, 1], &[1000], &[0], k);
        run(&kv, &c, 1, 0, CopyBackend::Gather);
        assert!(kv.errors().unwrap().is_clean());
        let idx = c.idx.download().unwrap();
        let plane = kv.download_plane(0).unwrap();
        for (j, &p) in topk[..k as usize].iter().enumerate() {
            assert_eq!(row_bytes(&plane, idx[j]), &want_row(0, p, 0)[..]);
        }
    }
}

#[test]
fn table_patches_read_from_mapped_staging_fill_words_in_stream_order() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let kv = setup(&gpu);
    let ctx = gpu.ctx();
    let buf = DeviceBuffer::<u32>::from_host(ctx, &[7u32; 300]).unwrap();
    // Two launches on one stream: a range, then single words over it (the GPU pool's order:
    // slot resets first, then the entries that set them).
    let mut ranges = PinnedBuffer::<KvFill>::zeroed(ctx, 1).unwrap();
    ranges.as_mut_slice()[0] = KvFill {
        dst: buf.device_ptr(),
        count: 266,
        value: u32::MAX,
    };
    let mut points = PinnedBuffer::<KvFill>::zeroed(ctx, 3).unwrap();
    points.as_mut_slice().copy_from_slice(&[
        KvFill {
            dst: buf.device_ptr_at(3).unwrap(),
            count: 1,
            value: 11,
        },
        KvFill {
            dst: buf.device_ptr_at(280).unwrap(),
            count: 1,
            value: 5,
        },
        KvFill {
            dst: buf.device_ptr_at(299).unwrap(),
            count: 1,
            value: 9,
        },
    ]);
    let s = gpu.stream();
    // SAFETY: the lists live in mapped pinned memory until the synchronize below; every entry
    // names words of `buf`; the point words are distinct.
    unsafe {
        kv.fill_words_async(s, ranges.device_ptr(), 1).unwrap();
        kv.fill_words_async(s, points.device_ptr(), 3).unwrap();
    }
    gpu.synchronize().unwrap();
    let got = buf.download().unwrap();
    for (i, &v) in got.iter().enumerate() {
        let want = match i {
            3 => 11,
            280 => 5,
            299 => 9,
            i if i < 266 => u32::MAX,
            _ => 7,
        };
        assert_eq!(v, want, "word {i}");
    }
}

#[test]
fn every_engine_equals_the_classic_one_on_large_direct_and_overflowing_entries() {
    // Entry 0: slot 0, 4 rows of k = 700 (2,800 picks: past Lean512's 2,048-pick limit, so that
    // engine takes its classic path; page, tail, invalid and more distinct misses than hot rows).
    // Entry 1: slot 1, whole history resident (the direct path), invalid picks beyond its seq_len.
    // Two calls per layout (the second mostly hits); every engine must give the classic kernel's
    // indices, valid counts, plans, stats and error words.
    let Some(gpu) = gpu_or_skip() else { return };
    let k = 700u32;
    let mut topk = Vec::new();
    for r in 0..4usize {
        for j in 0..k as usize {
            topk.push(match j % 11 {
                0 => -1,
                1 => 1000 + j as i32,
                _ => ((r * 389 + j * 13) % 1000) as i32,
            });
        }
    }
    topk.extend((0..k as i32).map(|j| if j % 9 == 0 { -1 } else { (j * 7) % 200 }));
    let outputs = |engine: ResolveEngine| {
        let mut kv = setup(&gpu);
        let pages: Vec<i32> = (0..64).map(|j| if j < 10 { 5 + j } else { -1 }).collect();
        let desc = KvSlotDesc {
            live: 1,
            committed: 160,
            scratch_len: 0,
            full: 1,
            tail_start: 144,
            pad: [0; 3],
        };
        kv.set_slot(1, desc, &[0, 1, 2, 3, 4], &pages).unwrap();
        let mut got = Vec::new();
        for layout in [KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED] {
            for _ in 0..2 {
                let c = call(&gpu, &topk, &[0, 4, 5], &[1000, 160], &[0, 1], k);
                ENGINE.with(|e| e.set(engine));
                run_layout(&kv, &c, 2, layout);
                let count = c.count.download().unwrap();
                let plan = c.plan.download().unwrap();
                let plan: Vec<(u32, u32, u32)> = (0..2)
                    .flat_map(|r| plan[r * 64..r * 64 + count[r] as usize].to_vec())
                    .map(|c| (c.slot, c.position, c.dst_row))
                    .collect();
                got.push(format!(
                    "{:?} {:?} {count:?} {plan:?} {:?} {:?}",
                    c.idx.download().unwrap(),
                    c.valid.download().unwrap(),
                    c.stats.download().unwrap(),
                    kv.errors().unwrap()
                ));
                kv.clear_errors().unwrap();
            }
        }
        got
    };
    let want = outputs(ResolveEngine::Classic);
    for engine in ResolveEngine::ALL {
        let got = outputs(engine);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w,
                "engine {engine:?}, call {i} differs from the classic kernel"
            );
        }
    }
}

/// Slot 1 of [`setup`]'s arena made live and full: 160 committed positions, the tail 144..160 in
/// its fixed rows, logical pages 0..10 (positions 0..160) borrowed at pages 5..15 (slot 0's
/// rows there: the test reads indices, not bytes, for slot 1).
fn full_slot_1(kv: &mut GpuArena) {
    let pages: Vec<i32> = (0..64).map(|j| if j < 10 { 5 + j } else { -1 }).collect();
    let desc = KvSlotDesc {
        live: 1,
        committed: 160,
        scratch_len: 0,
        full: 1,
        tail_start: 144,
        pad: [0; 3],
    };
    kv.set_slot(1, desc, &[0, 1, 2, 3, 4], &pages).unwrap();
}

/// Indices, valid counts, plan counts, stats and error words of one call, as one comparable string.
fn outcome(kv: &GpuArena, c: &Call) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?}",
        c.idx.download().unwrap(),
        c.valid.download().unwrap(),
        c.count.download().unwrap(),
        c.stats.download().unwrap(),
        kv.errors().unwrap()
    )
}

#[test]
fn a_direct_batch_equals_the_hot_cache_path_and_a_broken_promise_is_never_a_wrong_row() {
    each_engine(
        a_direct_batch_equals_the_hot_cache_path_and_a_broken_promise_is_never_a_wrong_row_on,
    );
}

fn a_direct_batch_equals_the_hot_cache_path_and_a_broken_promise_is_never_a_wrong_row_on(
    gpu: Arc<Gpu>,
) {
    // 1. The word follows the descriptors: slot 0 (not full) live keeps it off; once slot 1 (full)
    // is the only live slot it is on, and off again when a slot that is not full is published.
    let mut kv = setup(&gpu);
    assert!(!kv.direct_batch());
    full_slot_1(&mut kv);
    assert!(!kv.direct_batch(), "slot 0 is live and not full");
    kv.reset_slot(0).unwrap();
    assert!(kv.direct_batch(), "every live slot is full");
    // Page, tail, padding and invalid picks in two rows (k = 40): with the word on and forced
    // off, every engine gives the same indices, counts, stats (direct bit included) and errors.
    let k = 40u32;
    let topk: Vec<i32> = (0..2 * k as i32)
        .map(|j| match j % 10 {
            0 => -1,
            1 => 170 + j, // beyond seq_len: invalid
            2 => 144 + j % 16,
            _ => (j * 7) % 144,
        })
        .collect();
    let mut got = Vec::new();
    for word in [1u32, 0] {
        kv.force_direct_word(word).unwrap();
        for layout in [KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED] {
            let c = call(&gpu, &topk, &[0, 2], &[160], &[1], k);
            run_layout(&kv, &c, 1, layout);
            got.push(outcome(&kv, &c));
            let stats = KvStats::from_row(&c.stats.download().unwrap());
            assert!(stats.direct, "the direct bit (word {word})");
            kv.clear_errors().unwrap();
        }
    }
    assert_eq!(got[0], got[2], "in place: direct word on = off");
    assert_eq!(got[1], got[3], "packed: direct word on = off");
    // 2. Refusals after early stores (page-only warps store before the validating barrier): a
    // slot named twice and a malformed query_start_loc still leave every row -1.
    kv.force_direct_word(1).unwrap();
    let pages: Vec<i32> = (0..2 * k as i32).map(|j| (j * 3) % 144).collect();
    let c = call(&gpu, &pages, &[0, 1, 2], &[160, 160], &[1, 1], k);
    run(&kv, &c, 2, 0, CopyBackend::Gather);
    assert!(
        c.idx.download().unwrap().iter().all(|&x| x == -1),
        "slot named twice"
    );
    assert_eq!(kv.errors().unwrap().bad_session, 2);
    kv.clear_errors().unwrap();
    let c = call(&gpu, &pages, &[0, 2, 1], &[160, 160], &[1, 2], k);
    run(&kv, &c, 2, 0, CopyBackend::Gather);
    assert!(
        c.idx.download().unwrap().iter().all(|&x| x == -1),
        "malformed qsl"
    );
    assert_eq!(kv.errors().unwrap().bad_qsl, 1);
    kv.clear_errors().unwrap();

    // 3. A broken promise: slot 0 (not full) with its hot cache warm, the word forced on. Its
    // hot-cache positions come out -1 (never a wrong row), nothing is placed, the hot tables are
    // untouched; its page and tail picks are the rows the hot-cache path gives.
    let mut kv = setup(&gpu);
    let warm: Vec<i32> = (0..8).map(|j| 300 + j).collect();
    let c = call(&gpu, &warm, &[0, 1], &[1000], &[0], 8);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    let hot_before = kv.download_hot(0, 0).unwrap();
    let mixed: Vec<i32> = vec![300, 5, 990, 301, 17, 302, 600, 150];
    let reference = {
        let c = call(&gpu, &mixed[..], &[0, 1], &[1000], &[0], 8);
        // Word off, a fresh arena in the same warm state: the hot-cache path's rows.
        let fresh = setup(&gpu);
        let w = call(&gpu, &warm, &[0, 1], &[1000], &[0], 8);
        run(&fresh, &w, 1, 0, CopyBackend::Gather);
        run(&fresh, &c, 1, 0, CopyBackend::Gather);
        c.idx.download().unwrap()
    };
    kv.force_direct_word(1).unwrap();
    let c = call(&gpu, &mixed, &[0, 1], &[1000], &[0], 8);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    let idx = c.idx.download().unwrap();
    for (j, &p) in mixed.iter().enumerate() {
        let resident = !(160..984).contains(&p);
        if resident {
            assert_eq!(idx[j], reference[j], "position {p}: a resident row");
        } else {
            // The lean kernels skip the hot cache (-1); the classic one reads the position table
            // on its direct path and may return the hot row that still holds the position.
            assert!(
                idx[j] == -1 || idx[j] == reference[j],
                "position {p}: {} is neither -1 nor the hot-cache path's row {}",
                idx[j],
                reference[j]
            );
            if engine() != ResolveEngine::Classic {
                assert_eq!(
                    idx[j], -1,
                    "position {p}: the lean kernels skip the hot cache"
                );
            }
        }
    }
    assert_eq!(c.count.download().unwrap(), vec![0], "nothing placed");
    assert_eq!(
        kv.download_hot(0, 0).unwrap(),
        hot_before,
        "hot tables untouched"
    );
    assert!(kv.errors().unwrap().is_clean());
}
