//! The C ABI called from Rust: the happy paths and the error classes. The C programs under
//! `examples/` and `tests/` (built by `.ci/test` with the system compiler) do the same from C.

use std::ptr::{null, null_mut};
use std::sync::Mutex;

use super::*;

fn message(e: *const TierkitError) -> String {
    // SAFETY: `tierkit_error_message` returns a NUL-terminated string (static for NULL/freed).
    unsafe { std::ffi::CStr::from_ptr(tierkit_error_message(e)) }
        .to_string_lossy()
        .into_owned()
}

/// Calls `f` with an error slot; returns the code and the message (freeing the error).
fn check(f: impl FnOnce(*mut *mut TierkitError) -> TierkitCode) -> (TierkitCode, String) {
    let mut err = null_mut();
    let code = f(&mut err);
    let msg = message(err);
    if code == TIERKIT_OK {
        assert!(err.is_null(), "error written on success");
    } else {
        // SAFETY: `err` came from the failed call.
        assert_eq!(unsafe { tierkit_error_code(err) }, code);
    }
    // SAFETY: NULL or the error just returned.
    unsafe { tierkit_error_free(err) };
    (code, msg)
}

const G: TierkitExpertGeometry = TierkitExpertGeometry {
    layers: 2,
    experts_per_layer: 8,
    hot_per_layer: 2,
    expert_bytes: 64,
};

#[test]
fn expert_loop_swaps_busy_experts_in_losslessly() {
    let (mut map, mut ctl, mut counters, mut exec) =
        (null_mut(), null_mut(), null_mut(), null_mut());
    // SAFETY: every pointer below is a live handle or a valid local.
    unsafe {
        assert_eq!(
            check(|e| tierkit_residency_map_first_k(c"toy".as_ptr(), &G, &mut map, e)).0,
            0
        );
        let cfg = c"{\"policy\": \"ratio\", \"adaptive\": null, \"drain_every\": 4}";
        assert_eq!(
            check(|e| tierkit_controller_new(map, cfg.as_ptr(), &mut ctl, e)).0,
            0
        );
        assert_eq!(
            check(|e| tierkit_pick_counters_new(&G, &mut counters, e)).0,
            0
        );
        assert_eq!(
            check(|e| tierkit_executor_new_memory(map, 64, 7, &mut exec, e)).0,
            0
        );
        // Tokens pick experts 6 and 7, as a strided [tokens, 2] view of a [tokens, 3] array.
        let ids: [i32; 12] = [6, 7, -9, 7, 6, -9, 6, 7, -9, 7, 6, -9];
        let mut report = TierkitStepReport::default();
        for _ in 0..32 {
            for layer in 0..2 {
                let r = tierkit_pick_counters_record_layer(
                    counters,
                    layer,
                    ids.as_ptr(),
                    4,
                    2,
                    3,
                    null_mut(),
                );
                assert_eq!(r, TIERKIT_OK);
            }
            assert_eq!(
                check(|e| tierkit_controller_step(ctl, counters, exec, &mut report, e)).0,
                0
            );
        }
        assert_eq!(report.step, 32);
        assert!(report.applied_total >= 4);
        let mut hot = false;
        assert_eq!(
            check(|e| tierkit_controller_is_hot(ctl, 1, 6, &mut hot, e)).0,
            0
        );
        assert!(hot);
        let mut now = null_mut();
        assert_eq!(check(|e| tierkit_controller_map(ctl, &mut now, e)).0, 0);
        let mut moves = 0;
        assert_eq!(
            check(|e| tierkit_executor_verify(exec, now, &mut moves, e)).0,
            0
        );
        assert!(moves >= 4);
        let (mut buf, mut n) = ([0u32; 2], 0usize);
        assert_eq!(
            check(|e| tierkit_residency_map_hot_experts(now, 0, buf.as_mut_ptr(), 2, &mut n, e)).0,
            0
        );
        buf.sort();
        assert_eq!((buf, n), ([6, 7], 2));
        let mut json = null_mut();
        assert_eq!(
            check(|e| tierkit_residency_map_to_json(now, &mut json, e)).0,
            0
        );
        let mut back = null_mut();
        assert_eq!(
            check(|e| tierkit_residency_map_from_json(json, &G, &mut back, e)).0,
            0
        );
        tierkit_string_free(json);
        tierkit_residency_map_free(back);
        tierkit_residency_map_free(now);
        tierkit_executor_free(exec);
        tierkit_pick_counters_free(counters);
        tierkit_controller_free(ctl);
        tierkit_residency_map_free(map);
    }
}

#[test]
fn bad_input_is_a_code_and_a_message() {
    let mut counters = null_mut();
    // SAFETY: as above; the bad pointers are what is being tested and are never dereferenced.
    unsafe {
        let bad = TierkitExpertGeometry {
            hot_per_layer: 9,
            ..G
        };
        let (c, m) = check(|e| tierkit_pick_counters_new(&bad, &mut counters, e));
        assert_eq!(c, TIERKIT_ERR_INVALID_ARGUMENT, "{m}");
        assert_eq!(
            check(|e| tierkit_pick_counters_new(null(), &mut counters, e)).0,
            TIERKIT_ERR_NULL_ARGUMENT
        );
        assert_eq!(
            check(|e| tierkit_pick_counters_new(&G, &mut counters, e)).0,
            0
        );
        let ids = [1i32, 2, 3, 8];
        let (c, m) =
            check(|e| tierkit_pick_counters_record_layer(counters, 0, ids.as_ptr(), 2, 2, 2, e));
        assert_eq!(c, TIERKIT_ERR_INVALID_ARGUMENT);
        assert!(m.contains("[1, 1]"), "{m}");
        let (c, _) =
            check(|e| tierkit_pick_counters_record_layer(counters, 0, ids.as_ptr(), 2, 2, 1, e));
        assert_eq!(c, TIERKIT_ERR_LAYOUT); // stride below k
        let misaligned = ids.as_ptr().cast::<u8>().wrapping_add(1).cast::<i32>();
        let (c, m) =
            check(|e| tierkit_pick_counters_record_layer(counters, 0, misaligned, 1, 1, 1, e));
        assert_eq!(c, TIERKIT_ERR_LAYOUT, "{m}");
        let (c, _) = check(|e| tierkit_pick_counters_record_layer(counters, 0, null(), 1, 1, 1, e));
        assert_eq!(c, TIERKIT_ERR_NULL_ARGUMENT);
        assert_eq!(
            tierkit_pick_counters_record_layer(counters, 0, null(), 0, 2, 2, null_mut()),
            0
        );
        // Nothing was counted by the failed calls.
        let mut snap = [0u32; 16];
        assert_eq!(
            check(|e| tierkit_pick_counters_snapshot(counters, snap.as_mut_ptr(), 16, e)).0,
            0
        );
        assert_eq!(snap, [0; 16]);
        // A handle of another type, then a freed one.
        let wrong = counters.cast::<TierkitController>();
        let (c, m) = check(|e| tierkit_controller_step(wrong, counters, null(), null_mut(), e));
        assert_eq!(c, TIERKIT_ERR_INVALID_HANDLE, "{m}");
        tierkit_pick_counters_free(counters);
        let (c, m) =
            check(|e| tierkit_pick_counters_record_layer(counters, 0, ids.as_ptr(), 1, 1, 1, e));
        assert_eq!(c, TIERKIT_ERR_INVALID_HANDLE);
        assert!(m.contains("freed"), "{m}");
        tierkit_pick_counters_free(counters); // double free: ignored
        let (c, m) = check(|e| tierkit_test_panic(e));
        assert_eq!(c, TIERKIT_ERR_PANIC);
        assert!(m.contains("test panic"), "{m}");
        assert_eq!(tierkit_error_code(null()), TIERKIT_ERR_NULL_ARGUMENT);
    }
}

#[test]
fn codes_match_the_shared_classes() {
    use tierkit_bindings::Code;
    let pairs = [
        (Code::Ok, TIERKIT_OK),
        (Code::NullArgument, TIERKIT_ERR_NULL_ARGUMENT),
        (Code::InvalidArgument, TIERKIT_ERR_INVALID_ARGUMENT),
        (Code::TypeMismatch, TIERKIT_ERR_TYPE_MISMATCH),
        (Code::Layout, TIERKIT_ERR_LAYOUT),
        (Code::InvalidHandle, TIERKIT_ERR_INVALID_HANDLE),
        (Code::State, TIERKIT_ERR_STATE),
        (Code::NoRoom, TIERKIT_ERR_NO_ROOM),
        (Code::Panic, TIERKIT_ERR_PANIC),
        (Code::Poisoned, TIERKIT_ERR_POISONED),
        (Code::Internal, TIERKIT_ERR_INTERNAL),
        (Code::Unsupported, TIERKIT_ERR_UNSUPPORTED),
        (Code::OutOfMemory, TIERKIT_ERR_OUT_OF_MEMORY),
    ];
    for (class, code) in pairs {
        assert_eq!(ffi::code_of(class), code, "{class:?}");
    }
}

#[test]
fn a_poisoned_handle_is_refused() {
    let m = Mutex::new(0);
    let _ = std::panic::catch_unwind(|| {
        let _g = m.lock().unwrap();
        panic!("poison it");
    });
    let e = ffi::lock(&m, "pool").unwrap_err();
    assert_eq!(e.code as TierkitCode, TIERKIT_ERR_POISONED);
}

#[test]
fn kv_resolve_reads_replay_and_end() {
    let mut g = TierkitKvGeometry::default();
    let mut pool = null_mut();
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            check(|e| tierkit_kv_geometry_for_hbm_budget(
                16 * 4 * 16 * 2,
                16,
                2,
                4,
                8,
                4,
                0,
                &mut g,
                e
            ))
            .0,
            0
        );
        assert_eq!(
            (g.group_layers, g.group_count),
            (0, 0),
            "per layer by default"
        );
        // The two layers share the picks: one layer group (replay inside it is a re-copy).
        g.group_layers = 2;
        assert_eq!(check(|e| tierkit_kv_pool_new(&g, true, &mut pool, e)).0, 0);
        let history: Vec<u8> = (0..20 * 32).map(|i| (i / 32) as u8).collect();
        let mut adm = TierkitKvAdmission::default();
        assert_eq!(
            check(|e| tierkit_kv_pool_admit(pool, 7, history.as_ptr(), history.len(), &mut adm, e))
                .0,
            0
        );
        assert!(adm.admitted);
        // One row, k = 4, as a strided view (stride 5).
        let topk = [0, 5, 19, -1, 99];
        let (sessions, qsl, seq) = ([7u64], [0i32, 1], [20i32]);
        let batch = TierkitKvBatch {
            sessions: sessions.as_ptr(),
            reqs: 1,
            query_start_loc: qsl.as_ptr(),
            seq_lens: seq.as_ptr(),
            topk: topk.as_ptr(),
            rows: 1,
            k: 4,
            topk_row_stride: 5,
            query_seq_lens: null(),
            layer: 0,
            flags: 0,
            block_positions: 0,
        };
        let (mut idx, mut valid, mut stats, mut read) =
            ([0i32; 4], [0i32; 1], TierkitKvStats::default(), 0u64);
        let (c, m) = check(|e| {
            tierkit_kv_pool_resolve(
                pool,
                &batch,
                idx.as_mut_ptr(),
                4,
                valid.as_mut_ptr(),
                1,
                &mut stats,
                &mut read,
                e,
            )
        });
        assert_eq!(c, 0, "{m}");
        assert_eq!((valid[0], stats.picks, idx[3]), (3, 3, -1));
        let (mut p, mut n) = (null(), 0usize);
        assert_eq!(
            check(|e| tierkit_kv_pool_arena_row(pool, 1, idx[1], &mut p, &mut n, e)).0,
            0
        );
        assert_eq!(std::slice::from_raw_parts(p, n), &[5u8; 16]);
        assert_eq!(check(|e| tierkit_kv_pool_replay(pool, read, 1, e)).0, 0);
        assert_eq!(check(|e| tierkit_kv_pool_end_read(pool, read, e)).0, 0);
        assert_eq!(
            check(|e| tierkit_kv_pool_end_read(pool, read, e)).0,
            TIERKIT_ERR_INVALID_HANDLE
        );
        // A position past seq_len: an argument error, no read opened.
        let bad = [0, 20, -1, -1];
        let b2 = TierkitKvBatch {
            topk: bad.as_ptr(),
            topk_row_stride: 4,
            ..batch
        };
        let (c, m) = check(|e| {
            tierkit_kv_pool_resolve(
                pool,
                &b2,
                idx.as_mut_ptr(),
                4,
                valid.as_mut_ptr(),
                1,
                null_mut(),
                &mut read,
                e,
            )
        });
        assert_eq!(c, TIERKIT_ERR_INVALID_ARGUMENT, "{m}");
        assert_eq!(idx, [-1; 4]);
        // Block ids of 4 positions under a bound of 18: block 1 = positions 4..8, block 4 =
        // 16..20 straddles the bound (18, 19 come out -1).
        let (blocks, seq18) = ([1, 4], [18i32]);
        let b3 = TierkitKvBatch {
            topk: blocks.as_ptr(),
            k: 2,
            topk_row_stride: 2,
            seq_lens: seq18.as_ptr(),
            block_positions: 4,
            ..batch
        };
        let resolve_into = |out: &mut [i32], stats: &mut TierkitKvStats, read: &mut u64| {
            let mut valid = [0i32; 1];
            let r = check(|e| {
                tierkit_kv_pool_resolve(
                    pool,
                    &b3,
                    out.as_mut_ptr(),
                    out.len(),
                    valid.as_mut_ptr(),
                    1,
                    stats,
                    read,
                    e,
                )
            });
            (r, valid[0])
        };
        let mut wide = [0i32; 8];
        let ((c, m), v) = resolve_into(&mut wide, &mut stats, &mut read);
        valid[0] = v;
        assert_eq!(c, 0, "{m}");
        assert_eq!((valid[0], stats.picks, wide[6], wide[7]), (6, 6, -1, -1));
        for (col, pos) in [(0usize, 4u8), (3, 7), (4, 16), (5, 17)] {
            let (mut p, mut n) = (null(), 0usize);
            assert_eq!(
                check(|e| tierkit_kv_pool_arena_row(pool, 1, wide[col], &mut p, &mut n, e)).0,
                0
            );
            assert_eq!(std::slice::from_raw_parts(p, n), &[pos; 16], "column {col}");
        }
        assert_eq!(check(|e| tierkit_kv_pool_end_read(pool, read, e)).0, 0);
        // Outputs shorter than rows × k × block_positions: an argument error.
        let ((c, m), _) = resolve_into(&mut wide[..7], &mut stats, &mut read);
        assert_eq!(c, TIERKIT_ERR_INVALID_ARGUMENT, "{m}");
        // A block of more than TIERKIT_KV_MAX_BLOCK_POSITIONS positions: refused by name, even
        // with outputs long enough for it (the bound is kv-elastic's, one value).
        assert_eq!(
            TIERKIT_KV_MAX_BLOCK_POSITIONS,
            kv_elastic::MAX_BLOCK_POSITIONS
        );
        let one = [0i32];
        for (b, ok) in [
            (TIERKIT_KV_MAX_BLOCK_POSITIONS, true),
            (TIERKIT_KV_MAX_BLOCK_POSITIONS + 1, false),
        ] {
            let bb = TierkitKvBatch {
                topk: one.as_ptr(),
                k: 1,
                topk_row_stride: 1,
                block_positions: b,
                ..b3
            };
            let mut out = vec![7i32; b as usize + 1];
            let (c, m) = check(|e| {
                tierkit_kv_pool_resolve(
                    pool,
                    &bb,
                    out.as_mut_ptr(),
                    out.len(),
                    valid.as_mut_ptr(),
                    1,
                    null_mut(),
                    &mut read,
                    e,
                )
            });
            if ok {
                assert_eq!(c, 0, "{m}");
                assert_eq!(check(|e| tierkit_kv_pool_end_read(pool, read, e)).0, 0);
            } else {
                assert_eq!(c, TIERKIT_ERR_INVALID_ARGUMENT, "{m}");
                assert!(m.contains("block_positions = 65537 is out of range"), "{m}");
                assert!(out.iter().all(|&x| x == -1), "outputs filled on error");
            }
        }
        assert_eq!(check(|e| tierkit_kv_pool_check_invariants(pool, e)).0, 0);
        tierkit_kv_pool_free(pool);
        assert_eq!(
            check(|e| tierkit_kv_pool_finish(pool, 7, e)).0,
            TIERKIT_ERR_INVALID_HANDLE
        );
    }
}

/// Resolves `pos` of session 1 (one row, k = 1) at `layer`; the arena row of `layer` it returns.
///
/// # Safety
/// `pool` a live pool handle.
unsafe fn resolve_row(pool: *mut TierkitKvPool, pos: i32, layer: u32) -> Vec<u8> {
    let (sessions, qsl, seq, topk) = ([1u64], [0i32, 1], [40i32], [pos]);
    let batch = TierkitKvBatch {
        sessions: sessions.as_ptr(),
        reqs: 1,
        query_start_loc: qsl.as_ptr(),
        seq_lens: seq.as_ptr(),
        topk: topk.as_ptr(),
        rows: 1,
        k: 1,
        topk_row_stride: 1,
        query_seq_lens: null(),
        layer,
        flags: 0,
        block_positions: 0,
    };
    let (mut idx, mut valid, mut read) = ([0i32; 1], [0i32; 1], 0u64);
    // SAFETY: the caller's pool; buffers of the lengths given.
    unsafe {
        let (c, m) = check(|e| {
            tierkit_kv_pool_resolve(
                pool,
                &batch,
                idx.as_mut_ptr(),
                1,
                valid.as_mut_ptr(),
                1,
                null_mut(),
                &mut read,
                e,
            )
        });
        assert_eq!(c, 0, "{m}");
        let (mut p, mut n) = (null(), 0usize);
        assert_eq!(
            check(|e| tierkit_kv_pool_arena_row(pool, layer, idx[0], &mut p, &mut n, e)).0,
            0
        );
        let row = std::slice::from_raw_parts(p, n).to_vec();
        assert_eq!(check(|e| tierkit_kv_pool_end_read(pool, read, e)).0, 0);
        row
    }
}

#[test]
fn kv_layer_groups_cross_the_c_abi() {
    // The reliability issue's reproducer: 2 layers, token t is bytes t (layer 0), 100 + t (layer 1).
    let history: Vec<u8> = (0..40u8)
        .flat_map(|t| std::iter::repeat_n(t, 16).chain(std::iter::repeat_n(100 + t, 16)))
        .collect();
    let base = TierkitKvGeometry {
        row_bytes: 16,
        layers: 2,
        page_rows: 4,
        arena_pages: 16,
        hot_rows: 8,
        tail_rows: 4,
        ..TierkitKvGeometry::default()
    };
    let sizes = [1u32, 1];
    let bad_sizes = [1u32, 2];
    for (what, g) in [
        ("default (per layer)", base),
        (
            "explicit sizes",
            TierkitKvGeometry {
                group_count: 2,
                group_sizes: sizes.as_ptr(),
                ..base
            },
        ),
        (
            "one group",
            TierkitKvGeometry {
                group_layers: 2,
                ..base
            },
        ),
    ] {
        let mut pool = null_mut();
        // SAFETY: the geometry's pointers outlive the call; the pool is freed below.
        unsafe {
            assert_eq!(check(|e| tierkit_kv_pool_new(&g, false, &mut pool, e)).0, 0);
            assert_eq!(
                check(|e| tierkit_kv_pool_admit(
                    pool,
                    1,
                    history.as_ptr(),
                    history.len(),
                    null_mut(),
                    e
                ))
                .0,
                0
            );
            for layer in 0..2u32 {
                let want = if layer == 0 { 5 } else { 105 };
                assert_eq!(
                    resolve_row(pool, 5, layer),
                    vec![want; 16],
                    "{what}: layer {layer}"
                );
            }
            tierkit_kv_pool_free(pool);
        }
    }
    // Sizes that do not sum to the layers, NULL sizes: argument errors, no pool.
    for (g, code) in [
        (
            TierkitKvGeometry {
                group_count: 2,
                group_sizes: bad_sizes.as_ptr(),
                ..base
            },
            TIERKIT_ERR_INVALID_ARGUMENT,
        ),
        (
            TierkitKvGeometry {
                group_count: 2,
                ..base
            },
            TIERKIT_ERR_NULL_ARGUMENT,
        ),
    ] {
        let mut pool = null_mut();
        // SAFETY: as above; the call fails before any pool exists.
        let (c, m) = unsafe { check(|e| tierkit_kv_pool_new(&g, false, &mut pool, e)) };
        assert_eq!(c, code, "{m}");
        assert!(pool.is_null());
    }
}

#[test]
fn gpu_entry_points_refuse_or_check_their_arguments() {
    let mut err: *mut TierkitError = std::ptr::null_mut();
    let ids = [0i32, 1, 2, 3];
    let mut counts = [0u32; 8];
    let mut rejected = 0u32;
    // SAFETY: valid pointers (host memory: never launched on, the calls fail first) and `err`.
    let code = unsafe {
        tierkit_count_topk_cuda(
            0,
            std::ptr::null_mut(),
            ids.as_ptr().cast(),
            TIERKIT_IDS_INT32 + 7,
            2,
            2,
            2,
            0,
            counts.as_mut_ptr(),
            2,
            4,
            &mut rejected,
            std::ptr::null(),
            &mut err,
        )
    };
    let want = if tierkit_has_cuda() {
        TIERKIT_ERR_TYPE_MISMATCH
    } else {
        TIERKIT_ERR_UNSUPPORTED
    };
    assert_eq!(code, want);
    assert!(!err.is_null());
    // SAFETY: `err` was written by the failing call.
    unsafe {
        assert_eq!(tierkit_error_code(err), want);
        tierkit_error_free(err);
    }
    let mut err: *mut TierkitError = std::ptr::null_mut();
    // SAFETY: NULL table and out are refused (or the build has no CUDA) before any use.
    let code = unsafe {
        tierkit_expert_slot_ids_cuda(
            0,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null_mut(),
            8,
            4,
            0,
            256,
            3,
            &mut err,
        )
    };
    let want = if tierkit_has_cuda() {
        TIERKIT_ERR_NULL_ARGUMENT
    } else {
        TIERKIT_ERR_UNSUPPORTED
    };
    assert_eq!(code, want);
    // SAFETY: written by the failing call.
    unsafe { tierkit_error_free(err) };
}

/// The GPU entry points on a device (the `cuda` build; `scripts/gpu-tests` runs it on the H200):
/// counts and slot ids equal the CPU references, on a caller's stream.
#[cfg(feature = "cuda")]
#[test]
fn gpu_entry_points_match_the_cpu_references_on_a_device() {
    use cuda_kernels::{
        count_picks_cpu_ctl, table_slot_ids_cpu, CountControl, DeviceBuffer, Gpu, SlotLayout,
        TopkShape,
    };
    let Some(gpu) = Gpu::try_default().unwrap() else {
        println!("SKIP: no CUDA device");
        return;
    };
    let (tokens, k, stride, layers, experts) = (9u32, 2u32, 3u64, 2u32, 4u32);
    let wide: Vec<i32> = (0..tokens as i32 * 3).map(|i| (i * 5) % 6 - 1).collect();
    let picks: Vec<i32> = (0..tokens as usize)
        .flat_map(|t| wide[t * 3..t * 3 + 2].to_vec())
        .collect();
    let ids = DeviceBuffer::from_host(gpu.ctx(), &wide).unwrap();
    let counts = DeviceBuffer::<u32>::zeroed(gpu.ctx(), (layers * experts) as usize).unwrap();
    let rejected = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 1).unwrap();
    let ctl = CountControl {
        enabled: true,
        valid_tokens: 7,
    };
    let control = DeviceBuffer::from_host(gpu.ctx(), &ctl.to_words()).unwrap();
    let stream = gpu.new_stream().unwrap();
    let mut err: *mut TierkitError = null_mut();
    // SAFETY: device buffers of the declared sizes, alive until the synchronize; a live stream.
    let code = unsafe {
        tierkit_count_topk_cuda(
            0,
            stream.cu_stream().cast(),
            ids.device_ptr() as *const std::ffi::c_void,
            TIERKIT_IDS_INT32,
            tokens,
            k,
            stride,
            1,
            counts.device_ptr() as *mut u32,
            layers,
            experts,
            rejected.device_ptr() as *mut u32,
            control.device_ptr() as *const u32,
            &mut err,
        )
    };
    assert_eq!(code, TIERKIT_OK);
    stream.synchronize().unwrap();
    let mut want = vec![0u32; (layers * experts) as usize];
    let bad = count_picks_cpu_ctl(
        &picks,
        TopkShape::layer(tokens, k),
        1,
        layers,
        experts,
        ctl,
        &mut want,
    )
    .unwrap();
    assert_eq!(counts.download().unwrap(), want);
    assert_eq!(rejected.download().unwrap()[0], bad);

    let layout = SlotLayout {
        hbm: 1 << 30,
        slot_bytes: 512,
        slots_per_layer: 3,
    };
    // layer 0: slot 0, a host address; layer 1 (slots from hbm + 1536): slot 2, slot 1
    let table: Vec<u64> = vec![1 << 30, 77, (1 << 30) + 1536 + 1024, (1 << 30) + 1536 + 512];
    let dtable = DeviceBuffer::from_host(gpu.ctx(), &table).unwrap();
    let out = DeviceBuffer::<i32>::zeroed(gpu.ctx(), 4).unwrap();
    // SAFETY: as above (4 cells each).
    let code = unsafe {
        tierkit_expert_slot_ids_cuda(
            0,
            stream.cu_stream().cast(),
            dtable.device_ptr() as *const u64,
            out.device_ptr() as *mut i32,
            4,
            2,
            layout.hbm,
            layout.slot_bytes,
            layout.slots_per_layer,
            &mut err,
        )
    };
    assert_eq!(code, TIERKIT_OK);
    stream.synchronize().unwrap();
    let mut want = vec![0i32; 4];
    table_slot_ids_cpu(&table, 2, layout, &mut want).unwrap();
    assert_eq!(out.download().unwrap(), want);
    assert_eq!(want, vec![0, -1, 2, 1]);
}
