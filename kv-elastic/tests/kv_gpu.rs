//! Device-level tests of the KV resolve kernels (`cuda_kernels::kv`) on the GPU back-end's device
//! state ([`GpuArena`]; the CPU reference comparison lives in `tests/gpu_exactness.rs`): bad input never reads or writes out of bounds and comes out
//! as `-1` with typed counters, misses are deduplicated across a session's rows and fetched bit-exact
//! from the mapped host store, both copy back-ends write the same bytes, prefetched candidates are
//! hits for the next resolve, write-back lands in the host store, a direct batch (the pool's word:
//! every live slot full) gives the hot-cache path's outputs and a broken promise never a wrong row;
//! DeepSeek-V4's paged split rows land where the segment rule puts them (gather, DMA, write-back).
//! The resolve tests run once per
//! resolve engine (`ResolveEngine::ALL`), and every engine equals the classic kernel on a large,
//! a direct-path and an overflowing entry. Every test prints `SKIP: no CUDA device` and returns
//! where no device exists.

#![cfg(feature = "test-hooks")]

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;

use cuda_kernels::*;
use cuda_kernels::{DeviceBuffer, Gpu};
use kv_elastic::gpu::GpuArena;
use kv_elastic::LayerGroups;
use tierkit_testkit::gpu_or_skip;

#[path = "kv_gpu/paths.rs"]
mod paths;

const ROW: u32 = 656;

thread_local! {
    /// The resolve kernel [`run`] and [`run_with`] launch (each test runs on its own thread).
    static ENGINE: Cell<ResolveEngine> = const { Cell::new(ResolveEngine::Auto) };
}

fn engine() -> ResolveEngine {
    ENGINE.with(Cell::get)
}

/// The default options with the current test engine.
fn engine_opts() -> KvResolveOptions {
    KvResolveOptions {
        engine: engine(),
        ..Default::default()
    }
}

/// Runs a device test once per resolve engine ([`ResolveEngine::ALL`], fresh state each time), or
/// prints `SKIP: no CUDA device` and returns.
fn each_engine(test: fn(Arc<Gpu>)) {
    let Some(gpu) = gpu_or_skip() else { return };
    for e in ResolveEngine::ALL {
        println!("resolve engine {e:?}");
        ENGINE.with(|c| c.set(e));
        test(gpu.clone());
    }
}

fn dims() -> KvDims {
    KvDims {
        row_bytes: ROW,
        layers: 2,
        page_rows: 16,
        hot_rows: 64,
        tail_rows: 16,
        scratch_rows: 0,
        fixed_pages: 5,
        max_slots: 4,
        max_history: 1024,
        max_pages: 64,
        arena_rows: 16 * 64,
        ..KvDims::default()
    }
    .contiguous()
}

fn byte(slot: u32, pos: u32, layer: u32, i: usize) -> u8 {
    (slot.wrapping_mul(131) ^ pos.wrapping_mul(7919) ^ layer.wrapping_mul(31) ^ (i as u32 * 17))
        as u8
}

/// Slot 0 live: 1000 committed, fixed pages 0..5, logical pages 0..10 borrowed at pages 5..15.
fn setup(gpu: &Arc<Gpu>) -> GpuArena {
    let d = dims();
    // The two layers share one hot cache (resolves at either fill both).
    let mut kv = GpuArena::new(gpu, d, LayerGroups::one()).unwrap();
    let store = kv.host_store_mut();
    for slot in 0..d.max_slots {
        for pos in 0..d.max_history {
            for l in 0..d.layers {
                let off = d.host_offset(slot, pos, l);
                for i in 0..ROW as usize {
                    store[off + i] = byte(slot, pos, l, i);
                }
            }
        }
    }
    let committed = 1000;
    let pages: Vec<i32> = (0..64).map(|j| if j < 10 { 5 + j } else { -1 }).collect();
    kv.set_slot(
        0,
        KvSlotDesc {
            live: 1,
            committed,
            scratch_len: 0,
            full: 0,
            tail_start: committed - 16,
            pad: [0; 3],
        },
        &[0, 1, 2, 3, 4],
        &pages,
    )
    .unwrap();
    // Borrowed pages and the tail hold their rows (the control plane's job).
    for l in 0..d.layers {
        for j in 0..10u32 {
            let mut b = Vec::new();
            for p in j * 16..(j + 1) * 16 {
                b.extend((0..ROW as usize).map(|i| byte(0, p, l, i)));
            }
            kv.upload_rows(l, (5 + j) * 16, &b).unwrap();
        }
        for p in committed - 16..committed {
            let local = 64 + p % 16;
            let row = (local / 16) * 16 + local % 16;
            let b: Vec<u8> = (0..ROW as usize).map(|i| byte(0, p, l, i)).collect();
            kv.upload_rows(l, row, &b).unwrap();
        }
    }
    kv
}

struct Call {
    topk: DeviceBuffer<i32>,
    qsl: DeviceBuffer<i32>,
    seq: DeviceBuffer<i32>,
    slots: DeviceBuffer<i32>,
    idx: DeviceBuffer<i32>,
    valid: DeviceBuffer<i32>,
    plan: DeviceBuffer<KvCopy>,
    count: DeviceBuffer<u32>,
    stats: DeviceBuffer<u32>,
    rows: u32,
    k: u32,
}

fn call(gpu: &Arc<Gpu>, topk: &[i32], qsl: &[i32], seq: &[i32], slots: &[i32], k: u32) -> Call {
    let ctx = gpu.ctx();
    let rows = (topk.len() / k as usize) as u32;
    let reqs = slots.len();
    Call {
        topk: DeviceBuffer::from_host(ctx, topk).unwrap(),
        qsl: DeviceBuffer::from_host(ctx, qsl).unwrap(),
        seq: DeviceBuffer::from_host(ctx, seq).unwrap(),
        slots: DeviceBuffer::from_host(ctx, slots).unwrap(),
        // Poisoned: every element must be written.
        idx: DeviceBuffer::from_host(ctx, &vec![12345; topk.len()]).unwrap(),
        valid: DeviceBuffer::from_host(ctx, &vec![777; rows as usize]).unwrap(),
        plan: DeviceBuffer::zeroed(ctx, reqs.max(1) * 64).unwrap(),
        count: DeviceBuffer::zeroed(ctx, reqs.max(1)).unwrap(),
        stats: DeviceBuffer::zeroed(ctx, reqs.max(1) * KV_STATS).unwrap(),
        rows,
        k,
    }
}

fn run(kv: &GpuArena, c: &Call, sessions: u32, layer: u32, backend: CopyBackend) {
    let gpu = kv.gpu();
    gpu.synchronize().unwrap();
    let a = KvResolveArgs {
        topk: c.topk.device_ptr(),
        query_start_loc: c.qsl.device_ptr(),
        seq_lens: c.seq.device_ptr(),
        session_slot: c.slots.device_ptr(),
        sessions,
        rows: c.rows,
        k: c.k,
        layer,
        indices: c.idx.device_ptr(),
        valid_count: c.valid.device_ptr(),
        plan: c.plan.device_ptr(),
        plan_count: c.count.device_ptr(),
        stats: c.stats.device_ptr(),
    };
    // SAFETY: all buffers of `c` are live and sized for (reqs, rows, k, hot_rows = 64).
    unsafe { kv.resolve_async_with(gpu.stream(), &a, &engine_opts(), backend) }.unwrap();
    gpu.stream().synchronize().unwrap();
}

/// [`call`] with output buffers of `extra` more index entries and `extra_rows` more valid counts
/// (a persistent max-size buffer), poisoned.
#[allow(clippy::too_many_arguments)]
fn call_padded(
    gpu: &Arc<Gpu>,
    topk: &[i32],
    qsl: &[i32],
    seq: &[i32],
    slots: &[i32],
    k: u32,
    extra: usize,
    extra_rows: usize,
) -> Call {
    let mut c = call(gpu, topk, qsl, seq, slots, k);
    let ctx = gpu.ctx();
    c.idx = DeviceBuffer::from_host(ctx, &vec![12345; topk.len() + extra]).unwrap();
    c.valid = DeviceBuffer::from_host(ctx, &vec![777; c.rows as usize + extra_rows]).unwrap();
    c
}

/// [`run`] with options (layout, per-query bounds, output lengths).
fn run_with(kv: &GpuArena, c: &Call, sessions: u32, o: &KvResolveOptions) {
    let gpu = kv.gpu();
    gpu.synchronize().unwrap();
    let a = KvResolveArgs {
        topk: c.topk.device_ptr(),
        query_start_loc: c.qsl.device_ptr(),
        seq_lens: c.seq.device_ptr(),
        session_slot: c.slots.device_ptr(),
        sessions,
        rows: c.rows,
        k: c.k,
        layer: 0,
        indices: c.idx.device_ptr(),
        valid_count: c.valid.device_ptr(),
        plan: c.plan.device_ptr(),
        plan_count: c.count.device_ptr(),
        stats: c.stats.device_ptr(),
    };
    let o = KvResolveOptions {
        engine: engine(),
        ..*o
    };
    // SAFETY: all buffers of `c` are live and sized for (reqs, rows, k, hot_rows = 64), the output
    // buffers hold at least `o.indices_len` / `o.valid_len` entries, `o.query_seq_lens` is 0 or a
    // live int32 [rows].
    unsafe { kv.resolve_async_with(gpu.stream(), &a, &o, CopyBackend::Gather) }.unwrap();
    gpu.stream().synchronize().unwrap();
}

/// [`run_with`] with only the row layout set.
fn run_layout(kv: &GpuArena, c: &Call, sessions: u32, layout: u32) {
    let o = KvResolveOptions {
        layout,
        ..Default::default()
    };
    run_with(kv, c, sessions, &o);
}

fn want_row(slot: u32, p: i32, layer: u32) -> Vec<u8> {
    (0..ROW as usize)
        .map(|i| byte(slot, p as u32, layer, i))
        .collect()
}

fn row_bytes(plane: &[u8], row: i32) -> &[u8] {
    &plane[row as usize * ROW as usize..(row as usize + 1) * ROW as usize]
}

#[test]
fn misses_are_deduplicated_across_rows_and_fetched_exactly() {
    each_engine(misses_are_deduplicated_across_rows_and_fetched_exactly_on);
}

fn misses_are_deduplicated_across_rows_and_fetched_exactly_on(gpu: Arc<Gpu>) {
    let mut kv = setup(&gpu);
    // One request, 3 speculative rows of k = 40: page hits (< 160), tail (>= 984), misses with
    // duplicates across rows, and -1 padding.
    let k = 40u32;
    let mut topk = Vec::new();
    for r in 0..3 {
        for j in 0..k as i32 {
            topk.push(match j % 5 {
                0 => j * 3,            // page hit
                1 => 984 + j % 16,     // tail
                2 => 300 + j,          // miss, same in every row
                3 => 500 + r * 50 + j, // miss, distinct per row
                _ => -1,
            });
        }
    }
    let c = call(&gpu, &topk, &[0, 3], &[1000], &[0], k);
    run(&kv, &c, 1, 1, CopyBackend::Gather);
    assert!(kv.errors().unwrap().is_clean());
    let idx = c.idx.download().unwrap();
    let valid = c.valid.download().unwrap();
    assert_eq!(valid, vec![32, 32, 32]);
    let distinct: HashSet<i32> = topk
        .iter()
        .copied()
        .filter(|&p| (160..984).contains(&p))
        .collect();
    let count = c.count.download().unwrap()[0] as usize;
    assert_eq!(count, distinct.len());
    let plan = &c.plan.download().unwrap()[..count];
    let planned: HashSet<i32> = plan.iter().map(|c| c.position as i32).collect();
    assert_eq!(planned, distinct);
    let plane = kv.download_plane(1).unwrap();
    for (j, &p) in topk.iter().enumerate() {
        if p < 0 {
            assert_eq!(idx[j], -1);
            continue;
        }
        let want: Vec<u8> = (0..ROW as usize).map(|i| byte(0, p as u32, 1, i)).collect();
        assert_eq!(row_bytes(&plane, idx[j]), &want[..], "position {p}");
    }
    // Same position -> same row in every row of the session (all but the per-row misses).
    for j in (0..k as usize).filter(|j| j % 5 != 3) {
        assert_eq!(idx[j], idx[k as usize + j]);
        assert_eq!(idx[j], idx[2 * k as usize + j]);
    }
    let st = c.stats.download().unwrap();
    assert_eq!(st[5] as usize, distinct.len());
    assert_eq!(st[0], 96);
    // A second call on the same picks: all hits, nothing fetched.
    let c2 = call(&gpu, &topk, &[0, 3], &[1000], &[0], k);
    run(&kv, &c2, 1, 1, CopyBackend::Gather);
    assert_eq!(c2.count.download().unwrap()[0], 0);
    assert_eq!(c2.idx.download().unwrap(), idx);
    kv.clear_errors().unwrap();
}

#[test]
fn bad_input_comes_out_as_minus_one_and_is_counted() {
    each_engine(bad_input_comes_out_as_minus_one_and_is_counted_on);
}

fn bad_input_comes_out_as_minus_one_and_is_counted_on(gpu: Arc<Gpu>) {
    let mut kv = setup(&gpu);
    let k = 8u32;
    // req 0: slot 0 with out-of-range picks; req 1: slot 3 (not live); req 2: slot 99 (no such slot);
    // row 5 belongs to no request.
    let mut topk = vec![0, 5, -1, -7, 1000, 5000, i32::MAX, i32::MIN];
    topk.extend([1, 2, 3, 4, 5, 6, 7, 8]);
    topk.extend([1, 2, 3, 4, 5, 6, 7, 8]);
    topk.extend([9; 8]);
    topk.extend([10; 8]);
    topk.extend([11; 8]);
    let c = call(&gpu, &topk, &[0, 1, 3, 5], &[1000, 10, 10], &[0, 3, 99], k);
    run(&kv, &c, 3, 0, CopyBackend::Gather);
    let idx = c.idx.download().unwrap();
    assert_eq!(c.valid.download().unwrap(), vec![2, 0, 0, 0, 0, 0]);
    assert!(idx[2..].iter().all(|&x| x == -1));
    let e = kv.errors().unwrap();
    assert_eq!(e.bad_session, 2);
    assert_eq!(e.bad_position, 5);
    kv.clear_errors().unwrap();
    // Malformed query_start_loc: every row -1.
    let c = call(&gpu, &topk[..16], &[0, 3], &[1000], &[0], k);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    assert!(c.idx.download().unwrap().iter().all(|&x| x == -1));
    assert_eq!(c.valid.download().unwrap(), vec![0, 0]);
    assert_eq!(kv.errors().unwrap().bad_qsl, 1);
    kv.clear_errors().unwrap();
    // seq_len beyond the history: the session's rows are -1.
    let c = call(&gpu, &topk[..8], &[0, 1], &[5000], &[0], k);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    assert!(c.idx.download().unwrap().iter().all(|&x| x == -1));
    assert_eq!(kv.errors().unwrap().bad_session, 1);
    kv.clear_errors().unwrap();
    // Zero requests: the whole output is still written.
    let c = call(&gpu, &topk[..16], &[0], &[], &[], k);
    run(&kv, &c, 0, 0, CopyBackend::Gather);
    assert!(c.idx.download().unwrap().iter().all(|&x| x == -1));
    // Bad launch arguments are typed errors, not launches.
    let a = KvResolveArgs {
        layer: 2,
        k: 1,
        ..Default::default()
    };
    // SAFETY: the call is rejected before any launch (layer out of range).
    let e = unsafe { kv.resolve_async(gpu.stream(), &a, CopyBackend::Gather) };
    assert!(matches!(e, Err(cuda_kernels::CudaError::OutOfRange { .. })));
}

#[test]
fn dma_and_gather_write_the_same_bytes_and_replay_fills_other_layers() {
    each_engine(dma_and_gather_write_the_same_bytes_and_replay_fills_other_layers_on);
}

fn dma_and_gather_write_the_same_bytes_and_replay_fills_other_layers_on(gpu: Arc<Gpu>) {
    let kv = setup(&gpu);
    let k = 48u32;
    let topk: Vec<i32> = (0..k as i32).map(|j| 200 + j * 13).collect();
    let c = call(&gpu, &topk, &[0, 1], &[1000], &[0], k);
    run(&kv, &c, 1, 0, CopyBackend::Dma);
    let n = c.count.download().unwrap()[0] as usize;
    assert_eq!(n, 48);
    let plan = c.plan.download().unwrap()[..n].to_vec();
    // Dma: the kernel placed the rows but copied nothing; the batch copy fills layer 0 ...
    kv.dma_copy_async(gpu.stream(), &plan, 0, 1).unwrap();
    // ... and the gather replay fills layer 1 from the same plan.
    // SAFETY: plan/count buffers of the resolve (one segment of stride 64).
    unsafe {
        kv.replay_async(
            gpu.stream(),
            c.plan.device_ptr(),
            c.count.device_ptr(),
            1,
            64,
            1,
            1,
        )
    }
    .unwrap();
    gpu.stream().synchronize().unwrap();
    let idx = c.idx.download().unwrap();
    for l in 0..2 {
        let plane = kv.download_plane(l).unwrap();
        for (j, &p) in topk.iter().enumerate() {
            let want: Vec<u8> = (0..ROW as usize).map(|i| byte(0, p as u32, l, i)).collect();
            assert_eq!(
                row_bytes(&plane, idx[j]),
                &want[..],
                "layer {l} position {p}"
            );
        }
    }
    // A plan made stale by the next resolve's evictions is detected.
    let topk2: Vec<i32> = (0..k as i32).map(|j| 700 + j).collect();
    let c2 = call(&gpu, &topk2, &[0, 1], &[1000], &[0], k);
    run(&kv, &c2, 1, 0, CopyBackend::Gather);
    // SAFETY: as above.
    unsafe {
        kv.check_plan_async(
            gpu.stream(),
            c.plan.device_ptr(),
            c.count.device_ptr(),
            1,
            64,
            0,
        )
    }
    .unwrap();
    gpu.stream().synchronize().unwrap();
    assert!(kv.errors().unwrap().stale_plan > 0);
}

#[test]
fn prefetched_candidates_are_hits_and_write_back_reaches_the_host_store() {
    each_engine(prefetched_candidates_are_hits_and_write_back_reaches_the_host_store_on);
}

fn prefetched_candidates_are_hits_and_write_back_reaches_the_host_store_on(gpu: Arc<Gpu>) {
    let kv = setup(&gpu);
    let ctx = gpu.ctx();
    let cand: Vec<i32> = (0..60).map(|j| 400 + j * 7).collect();
    let slots = DeviceBuffer::from_host(ctx, &[0i32]).unwrap();
    let cd = DeviceBuffer::from_host(ctx, &cand).unwrap();
    let cc = DeviceBuffer::from_host(ctx, &[cand.len() as u32]).unwrap();
    let plan = DeviceBuffer::<KvCopy>::zeroed(ctx, 64).unwrap();
    let pc = DeviceBuffer::<u32>::zeroed(ctx, 1).unwrap();
    let side = gpu.new_stream().unwrap();
    let ev = gpu.stream().record_event(None).unwrap();
    side.wait(&ev).unwrap();
    // SAFETY: buffers of the documented shapes, alive until the synchronize.
    unsafe {
        kv.prefetch_async(
            &side,
            slots.device_ptr(),
            cd.device_ptr(),
            cc.device_ptr(),
            1,
            60,
            0,
            plan.device_ptr(),
            pc.device_ptr(),
        )
    }
    .unwrap();
    let done = side.record_event(None).unwrap();
    gpu.stream().wait(&done).unwrap();
    side.synchronize().unwrap();
    assert_eq!(pc.download().unwrap()[0], 60);
    let c = call(&gpu, &cand[10..50], &[0, 1], &[1000], &[0], 40);
    run(&kv, &c, 1, 1, CopyBackend::Gather);
    assert_eq!(
        c.count.download().unwrap()[0],
        0,
        "prefetched picks are hits"
    );
    let idx = c.idx.download().unwrap();
    let plane = kv.download_plane(1).unwrap();
    for (j, &p) in cand[10..50].iter().enumerate() {
        let want: Vec<u8> = (0..ROW as usize).map(|i| byte(0, p as u32, 1, i)).collect();
        assert_eq!(row_bytes(&plane, idx[j]), &want[..]);
    }
    // Write-back: arena rows of positions 400.. go to slot 2's positions 0..40 in both layers.
    let items: Vec<KvCopy> = (0..40)
        .map(|j| KvCopy {
            slot: 2,
            position: j,
            dst_row: idx[j as usize] as u32,
            pad: 0,
        })
        .collect();
    let it = DeviceBuffer::from_host(ctx, &items).unwrap();
    gpu.synchronize().unwrap();
    // SAFETY: 40 items on the device; the host reads after the synchronize.
    unsafe { kv.write_back_async(gpu.stream(), it.device_ptr(), 40, 0, 2) }.unwrap();
    gpu.stream().synchronize().unwrap();
    let d = *kv.dims();
    for (j, &p) in cand[10..50].iter().enumerate() {
        for l in 0..2 {
            let off = d.host_offset(2, j as u32, l);
            let want: Vec<u8> = (0..ROW as usize).map(|i| byte(0, p as u32, l, i)).collect();
            assert_eq!(&kv.host_store()[off..off + ROW as usize], &want[..]);
        }
    }
    assert!(kv.errors().unwrap().is_clean());
}

#[test]
fn resolve_captured_in_a_cuda_graph_equals_direct_launches() {
    each_engine(resolve_captured_in_a_cuda_graph_equals_direct_launches_on);
}

fn resolve_captured_in_a_cuda_graph_equals_direct_launches_on(gpu: Arc<Gpu>) {
    use cuda_kernels::cudarc_driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    // Two identical states: one driven by graph replays (fixed buffers, new picks uploaded into the
    // same topk buffer between replays), one by direct launches. With 48 picks per call into a
    // 64-row hot cache, evictions depend on the pins of each call: the call counter must advance on
    // every replay for the two to agree.
    let kg = setup(&gpu);
    let kd = setup(&gpu);
    let k = 48u32;
    let picks = |i: usize| -> Vec<i32> {
        (0..k as usize)
            .map(|j| 160 + ((i * 389 + j * 13) % 824) as i32)
            .collect()
    };
    let mut cg = call(&gpu, &picks(0), &[0, 1], &[1000], &[0], k);
    let s = gpu.stream().clone();
    gpu.synchronize().unwrap();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let a = KvResolveArgs {
        topk: cg.topk.device_ptr(),
        query_start_loc: cg.qsl.device_ptr(),
        seq_lens: cg.seq.device_ptr(),
        session_slot: cg.slots.device_ptr(),
        sessions: 1,
        rows: 1,
        k,
        layer: 0,
        indices: cg.idx.device_ptr(),
        valid_count: cg.valid.device_ptr(),
        plan: cg.plan.device_ptr(),
        plan_count: cg.count.device_ptr(),
        stats: cg.stats.device_ptr(),
    };
    // SAFETY: buffers of `cg` live for the whole test; the graph only reads/writes them.
    unsafe { kg.resolve_async_with(&s, &a, &engine_opts(), CopyBackend::Gather) }.unwrap();
    let graph = s
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("captured graph");
    for i in 0..4 {
        cg.topk.upload(&picks(i)).unwrap();
        gpu.synchronize().unwrap();
        graph.launch().unwrap();
        s.synchronize().unwrap();
        let cd = call(&gpu, &picks(i), &[0, 1], &[1000], &[0], k);
        run(&kd, &cd, 1, 0, CopyBackend::Gather);
        assert_eq!(
            cg.idx.download().unwrap(),
            cd.idx.download().unwrap(),
            "call {i}"
        );
        assert_eq!(cg.count.download().unwrap(), cd.count.download().unwrap());
        let n = cd.count.download().unwrap()[0] as usize;
        assert_eq!(
            cg.plan.download().unwrap()[..n],
            cd.plan.download().unwrap()[..n]
        );
        let plane = kg.download_plane(0).unwrap();
        for (j, &p) in picks(i).iter().enumerate() {
            let want: Vec<u8> = (0..ROW as usize).map(|b| byte(0, p as u32, 0, b)).collect();
            assert_eq!(row_bytes(&plane, cg.idx.download().unwrap()[j]), &want[..]);
        }
    }
    assert!(kg.errors().unwrap().is_clean() && kd.errors().unwrap().is_clean());
}

#[test]
fn cuda_failures_are_typed_with_the_cuda_name() {
    let Some(gpu) = gpu_or_skip() else { return };
    // An arena of 2^31 - 1 rows of 656 bytes (1.4 TB) cannot be allocated.
    let d = KvDims {
        max_slots: 1,
        max_history: 16,
        max_pages: 1,
        arena_rows: i32::MAX as u32 / 16 * 16,
        fmt_page_bytes: 16 * ROW as u64,
        ..dims()
    };
    match GpuArena::new(&gpu, d, LayerGroups::per_layer()) {
        Err(e) => assert_eq!(e.cuda_name(), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{e}"),
        Ok(_) => panic!("a 1.4 TB arena was allocated"),
    }
}

#[test]
fn a_slot_named_twice_is_refused_and_its_hot_cache_stays_exact() {
    each_engine(a_slot_named_twice_is_refused_and_its_hot_cache_stays_exact_on);
}

fn a_slot_named_twice_is_refused_and_its_hot_cache_stays_exact_on(gpu: Arc<Gpu>) {
    let mut kv = setup(&gpu);
    let k = 8u32;
    let first: Vec<i32> = (0..k as i32).map(|j| 300 + j).collect();
    let c = call(&gpu, &first, &[0, 1], &[1000], &[0], k);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    let hot_before = kv.download_hot(0, 0).unwrap();
    // Slot 0 named by both requests, with other misses: both refused, nothing placed or fetched.
    let other: Vec<i32> = (0..2 * k as i32).map(|j| 600 + j).collect();
    let c = call(&gpu, &other, &[0, 1, 2], &[1000, 1000], &[0, 0], k);
    run(&kv, &c, 2, 0, CopyBackend::Gather);
    assert!(c.idx.download().unwrap().iter().all(|&x| x == -1));
    assert_eq!(c.valid.download().unwrap(), vec![0, 0]);
    assert_eq!(c.count.download().unwrap(), vec![0, 0]);
    assert_eq!(kv.errors().unwrap().bad_session, 2);
    assert_eq!(
        kv.download_hot(0, 0).unwrap(),
        hot_before,
        "hot cache untouched"
    );
    kv.clear_errors().unwrap();
    // Later resolves are exact: the first picks are still hits, the others fetched.
    let mut picks = first.clone();
    picks.extend(&other[..k as usize]);
    let c = call(&gpu, &picks, &[0, 1], &[1000], &[0], 2 * k);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    assert!(kv.errors().unwrap().is_clean());
    assert_eq!(c.count.download().unwrap()[0], k);
    let idx = c.idx.download().unwrap();
    let plane = kv.download_plane(0).unwrap();
    for (j, &p) in picks.iter().enumerate() {
        assert_eq!(
            row_bytes(&plane, idx[j]),
            &want_row(0, p, 0)[..],
            "position {p}"
        );
    }
    // A slot named twice next to a valid one: only the duplicates are refused.
    let c = call(&gpu, &picks[..3], &[0, 1, 2, 3], &[1000; 3], &[0, 1, 0], 1);
    run(&kv, &c, 3, 0, CopyBackend::Gather);
    assert_eq!(
        kv.errors().unwrap().bad_session,
        3,
        "two duplicates + slot 1 not live"
    );
    kv.clear_errors().unwrap();
}

/// DeepSeek-V4's paged split row (SGLang 0.5.23 `kvcacheio.cuh`): 576 B values then 8 B scales
/// per 64-row page, the page padded to 37,440 B. Two layers sharing one hot cache; slot 0 live
/// with 1,000 committed positions and no borrowed page (every non-tail pick is a miss).
fn v4_setup(gpu: &Arc<Gpu>) -> GpuArena {
    let d = KvDims {
        row_bytes: 584,
        layers: 2,
        page_rows: 64,
        hot_rows: 64,
        tail_rows: 64,
        scratch_rows: 0,
        fixed_pages: 2,
        max_slots: 2,
        max_history: 1024,
        max_pages: 16,
        arena_rows: 64 * 8,
        fmt: KV_FMT_PAGED_SPLIT,
        value_bytes: 576,
        scale_bytes: 8,
        fmt_page_bytes: 37_440,
    };
    let mut kv = GpuArena::new(gpu, d, LayerGroups::one()).unwrap();
    let store = kv.host_store_mut();
    for pos in 0..d.max_history {
        for l in 0..d.layers {
            let off = d.host_offset(0, pos, l);
            for i in 0..584 {
                store[off + i] = byte(0, pos, l, i);
            }
        }
    }
    let desc = KvSlotDesc {
        live: 1,
        committed: 1000,
        scratch_len: 0,
        full: 0,
        tail_start: 1000 - 64,
        pad: [0; 3],
    };
    kv.set_slot(0, desc, &[0, 1], &[-1; 16]).unwrap();
    kv
}

#[test]
fn paged_split_rows_land_where_the_segment_rule_puts_them() {
    each_engine(paged_split_rows_land_where_the_segment_rule_puts_them_on);
}

fn paged_split_rows_land_where_the_segment_rule_puts_them_on(gpu: Arc<Gpu>) {
    let kv = v4_setup(&gpu);
    let d = *kv.dims();
    assert_eq!(d.plane_bytes(), 8 * 37_440);
    let want = |p: i32, l: u32| -> Vec<u8> { (0..584).map(|i| byte(0, p as u32, l, i)).collect() };
    // Each served row's value and scale where KvDims::row_segs puts them, in both layers; the
    // pages' 64 B of padding untouched.
    let check = |picks: &[i32], idx: &[i32], what: &str| {
        for l in 0..2 {
            let plane = kv.download_plane(l).unwrap();
            for (j, &p) in picks.iter().enumerate() {
                let (v, s) = d.row_segs(idx[j] as u32);
                let (v, s) = (v as usize, s as usize);
                let w = want(p, l);
                assert_eq!(
                    &plane[v..v + 576],
                    &w[..576],
                    "{what}: layer {l} position {p} value"
                );
                assert_eq!(
                    &plane[s..s + 8],
                    &w[576..],
                    "{what}: layer {l} position {p} scale"
                );
            }
            for page in 0..8 {
                let pad = page * 37_440 + 64 * 584..(page + 1) * 37_440;
                assert!(
                    plane[pad].iter().all(|&b| b == 0),
                    "{what}: page {page} padding"
                );
            }
        }
    };
    // The gather fetches the misses into both layers of the group.
    let k = 48u32;
    let topk: Vec<i32> = (0..k as i32).map(|j| 100 + j * 7).collect();
    let c = call(&gpu, &topk, &[0, 1], &[1000], &[0], k);
    run(&kv, &c, 1, 0, CopyBackend::Gather);
    assert_eq!(c.count.download().unwrap()[0], 48);
    let idx = c.idx.download().unwrap();
    check(&topk, &idx, "gather");
    // DMA: the kernel places, the batch copy (two descriptors per row) fills both layers.
    let topk2: Vec<i32> = (0..k as i32).map(|j| 500 + j * 5).collect();
    let c2 = call(&gpu, &topk2, &[0, 1], &[1000], &[0], k);
    run(&kv, &c2, 1, 0, CopyBackend::Dma);
    let n = c2.count.download().unwrap()[0] as usize;
    let plan = c2.plan.download().unwrap()[..n].to_vec();
    kv.dma_copy_async(gpu.stream(), &plan, 0, 2).unwrap();
    gpu.stream().synchronize().unwrap();
    let idx2 = c2.idx.download().unwrap();
    check(&topk2, &idx2, "dma");
    // Write-back: the rows just filled go to slot 1's positions 0..48 as value ‖ scale.
    let items: Vec<KvCopy> = (0..k)
        .map(|j| KvCopy {
            slot: 1,
            position: j,
            dst_row: idx2[j as usize] as u32,
            pad: 0,
        })
        .collect();
    let it = DeviceBuffer::from_host(gpu.ctx(), &items).unwrap();
    gpu.synchronize().unwrap();
    // SAFETY: 48 items on the device; the host reads after the synchronize.
    unsafe { kv.write_back_async(gpu.stream(), it.device_ptr(), k, 0, 2) }.unwrap();
    gpu.stream().synchronize().unwrap();
    for (j, &p) in topk2.iter().enumerate() {
        for l in 0..2 {
            let off = d.host_offset(1, j as u32, l);
            assert_eq!(
                &kv.host_store()[off..off + 584],
                &want(p, l)[..],
                "write-back {p}"
            );
        }
    }
    assert!(kv.errors().unwrap().is_clean());
}
