//! GPU tests: each compares a kernel with its CPU reference or checks the swap protocol on a
//! real device. Every test prints `SKIP: no CUDA device` and returns where no device exists.

use cuda_kernels::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tierkit_testkit::{
    gpu_or_skip, launch_count_ids_striped, launch_standin_router, pattern_table, router_standins,
    ExpertReaders,
};

#[path = "gpu/controls.rs"]
mod controls;

/// Under compute-sanitizer (`TIERKIT_SANITIZE=1`) the long loops shrink ~30x: the sanitizer
/// instruments every load, and the point there is memory safety, not volume.
fn scaled(n: usize) -> usize {
    if std::env::var_os("TIERKIT_SANITIZE").is_some() {
        (n / 30).max(20)
    } else {
        n
    }
}

fn random_ids(rng: &mut ChaCha8Rng, n: usize, experts: i64, bad_every: usize) -> Vec<i64> {
    (0..n)
        .map(|i| {
            if bad_every > 0 && i % bad_every == 0 {
                // out of range on either side
                if rng.random_bool(0.5) {
                    -1 - rng.random_range(0..5)
                } else {
                    experts + rng.random_range(0..100)
                }
            } else {
                // skewed: half the picks on the first 8 experts (stresses the warp aggregation)
                if rng.random_bool(0.5) {
                    rng.random_range(0..8.min(experts))
                } else {
                    rng.random_range(0..experts)
                }
            }
        })
        .collect()
}

/// [`random_ids`] as int32.
fn random_ids_i32(rng: &mut ChaCha8Rng, n: usize, experts: i64, bad_every: usize) -> Vec<i32> {
    random_ids(rng, n, experts, bad_every)
        .into_iter()
        .map(|v| v as i32)
        .collect()
}

#[test]
fn count_step_matches_cpu_reference_i32_and_i64() {
    let Some(gpu) = gpu_or_skip() else { return };
    let (layers, tokens, k, experts) = (40u32, 256u32, 6u32, 64u32);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut counter = PickCounterGpu::new(&gpu, layers, experts).unwrap();
    let mut cpu = vec![0u32; (layers * experts) as usize];
    let mut cpu_rej = 0u32;
    let shape = TopkShape::step(layers, tokens, k);
    let s = gpu.stream().clone();
    for round in 0..4 {
        let ids = random_ids(
            &mut rng,
            shape.picks() as usize,
            experts as i64,
            if round % 2 == 0 { 97 } else { 0 },
        );
        cpu_rej += count_picks_cpu(&ids, shape, 0, layers, experts, &mut cpu).unwrap();
        if round % 2 == 0 {
            let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
            counter.count(&s, &d, shape, 0).unwrap();
        } else {
            let ids32: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
            let d = DeviceBuffer::from_host(gpu.ctx(), &ids32).unwrap();
            counter.count(&s, &d, shape, 0).unwrap();
        }
        s.synchronize().unwrap();
    }
    // one layer's [tokens, k] into layer 17
    let ids = random_ids(&mut rng, (tokens * k) as usize, experts as i64, 13);
    cpu_rej += count_picks_cpu(
        &ids,
        TopkShape::layer(tokens, k),
        17,
        layers,
        experts,
        &mut cpu,
    )
    .unwrap();
    let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
    counter
        .count(&s, &d, TopkShape::layer(tokens, k), 17)
        .unwrap();
    // an odd-sized [255, 3] int32 layer at a 4-byte (not 16-byte) offset: scalar path + tail
    let ids = random_ids(&mut rng, 255 * 3, experts as i64, 11);
    cpu_rej += count_picks_cpu(
        &ids,
        TopkShape::layer(255, 3),
        39,
        layers,
        experts,
        &mut cpu,
    )
    .unwrap();
    let mut padded: Vec<i32> = vec![0];
    padded.extend(ids.iter().map(|&x| x as i32));
    let d = DeviceBuffer::from_host(gpu.ctx(), &padded).unwrap();
    let view = TopkIdsView {
        ptr: d.device_ptr() + 4,
        bytes: 255 * 3 * 4,
        dtype: IdsDtype::I32,
        shape: TopkShape::layer(255, 3),
    };
    counter.count_raw(&s, &view, 39).unwrap();
    counter.drain_async(&s).unwrap();
    assert!(matches!(
        counter.drain_async(&s),
        Err(CudaError::InFlight(_))
    ));
    let snap = counter.wait_drain().unwrap();
    assert_eq!(
        snap.counts,
        &cpu[..],
        "GPU counts differ from the CPU reference"
    );
    assert_eq!(snap.rejected, cpu_rej);
    assert!(cpu_rej > 0);
    println!(
        "counted {} picks exactly, {} rejected",
        cpu.iter().map(|&c| c as u64).sum::<u64>(),
        cpu_rej
    );
}

#[test]
fn count_rejects_bad_shapes_and_dtypes() {
    let Some(gpu) = gpu_or_skip() else { return };
    let counter = PickCounterGpu::new(&gpu, 4, 8).unwrap();
    let s = gpu.stream().clone();
    let d = DeviceBuffer::<i32>::zeroed(gpu.ctx(), 12).unwrap();
    // wrong element count
    assert!(matches!(
        counter.count(&s, &d, TopkShape::step(2, 3, 3), 0),
        Err(CudaError::Shape { .. })
    ));
    // layer range outside the table
    assert!(matches!(
        counter.count(&s, &d, TopkShape::step(2, 3, 2), 3),
        Err(CudaError::OutOfRange { .. })
    ));
    // raw view: dtype says int64 but the bytes are those of int32
    let view = TopkIdsView {
        ptr: d.device_ptr(),
        bytes: 48,
        dtype: IdsDtype::I64,
        shape: TopkShape::step(2, 3, 2),
    };
    assert!(matches!(
        counter.count_raw(&s, &view, 0),
        Err(CudaError::Shape { .. })
    ));
    let view = TopkIdsView {
        ptr: d.device_ptr() + 4,
        bytes: 96,
        dtype: IdsDtype::I64,
        shape: TopkShape::step(2, 3, 2),
    };
    assert!(matches!(
        counter.count_raw(&s, &view, 0),
        Err(CudaError::Dtype { .. })
    ));
    assert!(PickCounterGpu::new(&gpu, 0, 8).is_err());
}

#[test]
fn failed_cuda_call_is_a_typed_error_with_the_cuda_name() {
    let Some(gpu) = gpu_or_skip() else { return };
    let e = DeviceBuffer::<u8>::zeroed(gpu.ctx(), 1usize << 50).unwrap_err();
    assert_eq!(e.cuda_name(), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{e}");
    // the context stays usable
    let b = DeviceBuffer::<u32>::from_host(gpu.ctx(), &[1, 2, 3]).unwrap();
    assert_eq!(b.download().unwrap(), vec![1, 2, 3]);
}

/// The fused header called from the stand-in routers (one kernel per way of calling it,
/// `tierkit_standin_{router,gate}_m<MODE>` in testkit's router_standins.cu), over several steps of a 4-layer model
/// with one ids buffer reused by every layer: the picks equal the CPU top-k, the gate's weights
/// the CPU softmax over the picks, and after every step (and the drain's fold of the stripes)
/// the table holds exactly `step` steps' counts.
#[test]
fn fused_paths_count_exactly_every_step() {
    let Some(gpu) = gpu_or_skip() else { return };
    let (layers, tokens, experts, k) = (4u32, 3000u32, 64u32, 6u32);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let s = gpu.stream().clone();
    // one logits matrix per layer; one ids buffer reused by every layer (as engines do)
    let logits: Vec<Vec<f32>> = (0..layers)
        .map(|_| (0..tokens * experts).map(|_| rng.random::<f32>()).collect())
        .collect();
    let dl: Vec<DeviceBuffer<f32>> = logits
        .iter()
        .map(|l| DeviceBuffer::from_host(gpu.ctx(), l).unwrap())
        .collect();
    // CPU reference of the router's picks (top-k, ties lowest id) and of one step's counts
    let mut one_step = vec![0u32; (layers * experts) as usize];
    let mut last_picks = Vec::new();
    for (layer, lg) in logits.iter().enumerate() {
        let picks: Vec<i32> = (0..tokens as usize)
            .flat_map(|t| {
                let row = &lg[t * experts as usize..(t + 1) * experts as usize];
                let mut idx: Vec<usize> = (0..experts as usize).collect();
                idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                idx[..k as usize]
                    .iter()
                    .map(|&i| i as i32)
                    .collect::<Vec<_>>()
            })
            .collect();
        let shape = TopkShape::layer(tokens, k);
        count_picks_cpu(&picks, shape, layer as u32, layers, experts, &mut one_step).unwrap();
        last_picks = picks;
    }
    let warps = tokens; // one warp per token
    let blocks = (tokens * 32).div_ceil(256);
    // CPU reference of the gate kernels' weights for the last layer: softmax over the k picks
    let last = &logits[layers as usize - 1];
    let want_w: Vec<f32> = last_picks
        .chunks(k as usize)
        .enumerate()
        .flat_map(|(t, p)| {
            let v: Vec<f32> = p
                .iter()
                .map(|&e| last[t * experts as usize + e as usize])
                .collect();
            let ex: Vec<f32> = v.iter().map(|x| (x - v[0]).exp()).collect();
            let sum: f32 = ex.iter().sum();
            ex.into_iter().map(move |x| x / sum)
        })
        .collect();
    // (mode, stripes): 3 in-loop atomics and 7 previous-layer path, into the table; 21 striped
    // with a stripe per warp, and with stripes for two thirds of the warps (the rest add to the
    // table); 25 a stripe per block; 26 striped call straight into the table; 27 striped at the
    // very end. Each on the ids-only router and on the gate (ids + weights).
    let cases = [
        (3u32, 0u32),
        (7, 0),
        (21, warps),
        (21, 2 * warps / 3),
        (25, blocks),
        (26, 0),
        (27, warps),
        (30, warps),
    ];
    for (kind, (mode, stripes)) in ["router", "gate"]
        .into_iter()
        .flat_map(|kind| cases.into_iter().map(move |c| (kind, c)))
    {
        let f = gpu
            .function(
                &router_standins(),
                &format!("tierkit_standin_{kind}_m{mode}"),
            )
            .unwrap();
        // fresh outputs per case, filled with -1 / NaN, so each case's picks and weights are its own;
        // mode 30 (step form): each layer writes its own slice of one step buffer
        let fill = |n: u32| vec![-1i32; n as usize];
        let ids = DeviceBuffer::from_host(gpu.ctx(), &fill(tokens * k)).unwrap();
        let step_ids = DeviceBuffer::from_host(gpu.ctx(), &fill(layers * tokens * k)).unwrap();
        let weights =
            DeviceBuffer::from_host(gpu.ctx(), &vec![f32::NAN; (tokens * k) as usize]).unwrap();
        let mut counter = if stripes > 0 {
            PickCounterGpu::with_stripes(&gpu, layers, experts, stripes).unwrap()
        } else {
            PickCounterGpu::new(&gpu, layers, experts).unwrap()
        };
        for step in 1..=3u32 {
            for layer in 0..layers {
                let lp = dl[layer as usize].device_ptr();
                let (ip, pp) = if mode == 30 {
                    let slice = step_ids.device_ptr() + 4 * (layer * tokens * k) as u64;
                    (slice, step_ids.device_ptr())
                } else {
                    (ids.device_ptr(), ids.device_ptr())
                };
                let dims = (tokens, experts, k);
                // SAFETY: `f` is a stand-in router; logits hold tokens*experts f32, ids tokens*k
                // i32 (the step buffer layers*tokens*k for mode 30), weights tokens*k f32.
                unsafe {
                    launch_standin_router(
                        &s,
                        &f,
                        lp,
                        dims,
                        (ip, pp, weights.device_ptr()),
                        &counter,
                        layer,
                    )
                }
                .unwrap();
            }
            counter.drain_async(&s).unwrap();
            let snap = counter.wait_drain().unwrap();
            let want: Vec<u32> = one_step.iter().map(|&c| c * step).collect();
            let what = format!("{kind} mode {mode}, stripes {stripes}, step {step}");
            assert_eq!(snap.counts, &want[..], "{what}");
            assert_eq!(snap.rejected, 0);
        }
        let got = if mode == 30 {
            step_ids.download().unwrap()[((layers - 1) * tokens * k) as usize..].to_vec()
        } else {
            ids.download().unwrap()
        };
        assert_eq!(got, last_picks, "{kind} mode {mode}: picks");
        if kind == "gate" {
            let got = weights.download().unwrap();
            let worst = got
                .iter()
                .zip(&want_w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-5, "gate mode {mode}: weights off by {worst}");
        }
    }
}

/// `len` u32 read back from device address `ptr` (after the stream's work so far).
fn raw_u32(gpu: &Gpu, ptr: u64, len: usize) -> Vec<u32> {
    let mut v = vec![0u32; len];
    // SAFETY: `ptr` points to at least `len` u32 of a live allocation of the caller; the copy
    // is synchronised before `v` is read.
    unsafe { copy_dtoh_async(v.as_mut_ptr() as *mut u8, ptr, len * 4, gpu.stream()).unwrap() };
    gpu.stream().synchronize().unwrap();
    v
}

/// `tierkit_count_pick_striped` with arbitrary ids (bad ones included, several lanes of a warp
/// on one expert), int32 and int64, over several layers and drains, stripes for about half the
/// warps. Before the first drain the raw stripes hold exactly each striped warp's picks and the
/// raw table exactly the other warps' (so the stripes are really used); after each drain the
/// table and the rejected word equal the CPU reference; a layer outside the table rejects every
/// pick.
#[test]
fn striped_counts_match_the_cpu_reference_with_bad_ids() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (layers, experts, n) = (3u32, 200u32, 10_000usize);
    let (l, e) = (layers as usize, experts as usize);
    let warps = n.div_ceil(32);
    for dtype in ["i32", "i64"] {
        let f = gpu
            .function(
                &router_standins(),
                &format!("tierkit_count_ids_striped_{dtype}"),
            )
            .unwrap();
        let launch = |ids: &[i64], layer: u32, c: &PickCounterGpu| {
            if dtype == "i32" {
                let v: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                let d = DeviceBuffer::from_host(gpu.ctx(), &v).unwrap();
                // SAFETY: `f` is the i32 kernel.
                unsafe { launch_count_ids_striped(gpu.stream(), &f, &d, layer, c) }.unwrap();
            } else {
                let d = DeviceBuffer::from_host(gpu.ctx(), ids).unwrap();
                // SAFETY: `f` is the i64 kernel.
                unsafe { launch_count_ids_striped(gpu.stream(), &f, &d, layer, c) }.unwrap();
            }
            gpu.stream().synchronize().unwrap();
        };
        let ns = 150u32;
        let mut counter = PickCounterGpu::with_stripes(&gpu, layers, experts, ns).unwrap();
        assert!(warps as u32 > counter.num_stripes());
        let mut cpu = vec![0u32; l * e];
        let mut rejected = 0u32;
        for drain in 0..3 {
            for layer in 0..layers {
                let ids = random_ids(&mut rng, n, experts as i64, 37);
                let shape = TopkShape::layer(n as u32, 1);
                rejected += count_picks_cpu(&ids, shape, layer, layers, experts, &mut cpu).unwrap();
                launch(&ids, layer, &counter);
                if drain == 0 && layer == 0 {
                    // where the adds went: warp w < ns into stripe w of layer 0, the rest into the table
                    let mut want_stripes = vec![0u32; l * ns as usize * e];
                    let mut want_table = vec![0u32; l * e + 1];
                    for (i, &id) in ids.iter().enumerate() {
                        let w = i / 32;
                        if id < 0 || id >= experts as i64 {
                            want_table[l * e] += 1;
                        } else if w < ns as usize {
                            want_stripes[w * e + id as usize] += 1;
                        } else {
                            want_table[id as usize] += 1;
                        }
                    }
                    let got = raw_u32(&gpu, counter.stripes_ptr(), want_stripes.len());
                    assert_eq!(got, want_stripes, "{dtype}: stripes before the fold");
                    let got = raw_u32(&gpu, counter.table_ptr(), want_table.len());
                    assert_eq!(got, want_table, "{dtype}: table + rejected before the fold");
                }
            }
            counter.drain_async(gpu.stream()).unwrap();
            let snap = counter.wait_drain().unwrap();
            assert_eq!(snap.counts, &cpu[..], "{dtype}, drain {drain}");
            assert_eq!(snap.rejected, rejected);
        }
        assert!(rejected > 0);
        let ids: Vec<i64> = (0..n as i64).map(|i| i % 64).collect();
        launch(&ids, layers, &counter);
        counter.drain_async(gpu.stream()).unwrap();
        let snap = counter.wait_drain().unwrap();
        assert_eq!(snap.counts, &cpu[..]);
        assert_eq!(snap.rejected, rejected + n as u32);
    }
}

/// The fold kernel against `fold_stripes_cpu`: random stripes written directly (the header path
/// that writes them is covered above), one value near 2^32 so the sum wraps.
#[test]
fn fold_stripes_matches_the_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for (layers, experts, stripes) in [
        (40u32, 64u32, 256u32),
        (3, 200, 97),
        (1, 1, 1),
        (2, 33, 130),
    ] {
        let mut counter = PickCounterGpu::with_stripes(&gpu, layers, experts, stripes).unwrap();
        let cells = (layers * experts * stripes) as usize;
        let mut host: Vec<u32> = (0..cells).map(|_| rng.random_range(0..1000)).collect();
        host[0] = u32::MAX - 3; // wraps
                                // SAFETY: the stripes buffer holds `cells` u32 (with_stripes), `host` as many.
        unsafe {
            copy_htod_async(
                counter.stripes_ptr(),
                host.as_ptr() as *const u8,
                cells * 4,
                gpu.stream(),
            )
            .unwrap()
        };
        gpu.stream().synchronize().unwrap();
        let mut want = vec![0u32; (layers * experts) as usize];
        fold_stripes_cpu(&mut host, stripes, layers, experts, &mut want).unwrap();
        counter.drain_async(gpu.stream()).unwrap();
        let first = counter.wait_drain().unwrap().counts.to_vec();
        assert_eq!(first, want, "{layers} x {experts} x {stripes}");
        // the stripes are zero now: a second drain changes nothing
        counter.drain_async(gpu.stream()).unwrap();
        assert_eq!(counter.wait_drain().unwrap().counts, &first[..]);
    }
}

#[test]
fn event_signal_holds_a_tier_core_fence_until_the_gpu_reader_finishes() {
    let Some(gpu) = gpu_or_skip() else { return };
    use tier_core::{CompletionSignal, EpochFence, Retired};
    // a 64 MiB expert read in place from mapped host memory: > 1 ms of GPU work
    let expert_bytes = 64 << 20;
    // every expert cold (table -> host); `_host` outlives the reader (synchronised below)
    let (_host, table) = pattern_table(&gpu, 2, expert_bytes, 42).unwrap();
    let readers = ExpertReaders::new(&gpu).unwrap();
    let s = gpu.stream().clone();
    let picks = DeviceBuffer::from_host(gpu.ctx(), &[1u32]).unwrap(); // expert 1 is cold
    let errors = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 2).unwrap();
    readers
        .launch_checksum_reader((table.device_ptr(), expert_bytes), &s, &picks, &errors)
        .unwrap();
    let sig = EventSignal::record(&gpu, &s).unwrap();
    let fence = EpochFence::new();
    fence.enter_signal(Box::new(sig.clone()));
    // the page the reader uses is retired while the kernel may still run
    let mut retired: Retired<u32> = Retired::new();
    retired.retire(&fence, 7);
    let early = sig.is_complete();
    let early_freed = retired.collect(&fence);
    if !early {
        assert!(
            early_freed.is_empty(),
            "reclaimed while the GPU reader was running"
        );
    }
    s.synchronize().unwrap();
    assert!(sig.is_complete() && sig.try_complete().unwrap());
    let mut freed = early_freed;
    freed.extend(retired.collect(&fence));
    assert_eq!(freed, vec![7]);
    assert_eq!(errors.download().unwrap()[0], 0);
    println!(
        "signal complete right after the launch: {early} (expected false); reclaimed after sync"
    );
}

/// A query that a global-mode capture on another thread forbids reads as "not yet" (`Ok(false)`)
/// rather than an error: pollers (the KV pool's deferred maps, the expert bank's deferred
/// commits) keep their work pending instead of failing. Whether the driver forbids the query
/// at all is its choice; either way the answer is `Ok`, and complete once the capture ends.
#[test]
fn event_signal_query_during_a_global_capture_is_not_yet_not_an_error() {
    let Some(gpu) = gpu_or_skip() else { return };
    use cuda_kernels::cudarc_driver::sys;
    let s = gpu.stream().clone();
    let sig = EventSignal::record(&gpu, &s).unwrap();
    s.synchronize().unwrap();
    let capturing = gpu.ctx().new_stream().unwrap();
    capturing
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .unwrap();
    let during = std::thread::scope(|t| t.spawn(|| sig.try_complete()).join().unwrap());
    // the capture may have been invalidated by the forbidden call; either way it ends here
    let ended = capturing.end_capture(sys::CUgraphInstantiate_flags(0));
    let during = during.expect("a capture conflict must read as Ok(false), not an error");
    assert!(
        sig.try_complete().unwrap(),
        "complete once the capture ended"
    );
    println!(
        "query during another thread's global capture: {during} (capture ended: {})",
        if ended.is_ok() { "ok" } else { "invalidated" }
    );
}

/// `count_forked` / `join_forked`: the earlier layers counted on the branch while the step stream
/// counts the last layer, exact (with bad ids) after every step, in stream order and captured in
/// a CUDA graph; a second fork before the join and a bad shape are typed errors that leave
/// nothing pending; a join from outside the fork's capture (or inside one for a fork made
/// outside) is refused and keeps the fork pending. (That the branch really runs beside the step stream is shown by the bench's
/// mode 41, not here.)
#[test]
fn forked_count_is_exact_every_step_and_captures_in_a_graph() {
    let Some(gpu) = gpu_or_skip() else { return };
    use cuda_kernels::cudarc_driver::sys;
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let (layers, tokens, k, experts) = (5u32, 300u32, 6u32, 64u32);
    let shape = TopkShape::step(layers, tokens, k);
    let ids = random_ids_i32(&mut rng, shape.picks() as usize, experts as i64, 97);
    let mut one_step = vec![0u32; (layers * experts) as usize];
    let rejected = count_picks_cpu(&ids, shape, 0, layers, experts, &mut one_step).unwrap();
    assert!(rejected > 0);
    let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
    let per_layer = (tokens * k) as u64;
    let before_last = TopkIdsView {
        ptr: d.device_ptr(),
        bytes: 4 * per_layer * (layers as u64 - 1),
        dtype: IdsDtype::I32,
        shape: TopkShape::step(layers - 1, tokens, k),
    };
    let last = TopkIdsView {
        ptr: d.device_ptr() + 4 * per_layer * (layers as u64 - 1),
        bytes: 4 * per_layer,
        dtype: IdsDtype::I32,
        shape: TopkShape::layer(tokens, k),
    };
    let s = gpu.stream().clone();
    let mut counter = PickCounterGpu::new(&gpu, layers, experts).unwrap();
    let step = |c: &mut PickCounterGpu| {
        c.count_forked(&s, &before_last, 0).unwrap();
        assert!(c.fork_pending());
        c.count_raw(&s, &last, layers - 1).unwrap();
        c.join_forked(&s).unwrap();
        assert!(!c.fork_pending());
    };
    let check = |c: &mut PickCounterGpu, steps: u32, what: &str| {
        c.drain_async(&s).unwrap();
        let snap = c.wait_drain().unwrap();
        let want: Vec<u32> = one_step.iter().map(|&v| v * steps).collect();
        assert_eq!(snap.counts, &want[..], "{what}: counts after {steps} steps");
        assert_eq!(snap.rejected, rejected * steps, "{what}: rejected");
    };
    for n in 1..=3 {
        step(&mut counter);
        check(&mut counter, n, "stream order");
    }
    // a fork left pending is joined by the drain
    counter.count_forked(&s, &before_last, 0).unwrap();
    counter.count_raw(&s, &last, layers - 1).unwrap();
    check(&mut counter, 4, "joined by the drain");
    assert!(!counter.fork_pending());
    // captured: 2 steps per graph, 3 launches
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    step(&mut counter);
    step(&mut counter);
    let g = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("captured graph");
    for _ in 0..3 {
        g.launch().unwrap();
    }
    check(&mut counter, 10, "CUDA graph");
    // faults: a second fork before the join; a bad shape (nothing recorded, nothing pending)
    counter.count_forked(&s, &before_last, 0).unwrap();
    assert!(matches!(
        counter.count_forked(&s, &before_last, 0),
        Err(CudaError::InFlight(_))
    ));
    counter.count_raw(&s, &last, layers - 1).unwrap(); // step 11's last layer
    counter.join_forked(&s).unwrap();
    let bad = TopkIdsView {
        bytes: before_last.bytes - 4,
        ..before_last
    };
    assert!(matches!(
        counter.count_forked(&s, &bad, 0),
        Err(CudaError::Shape { .. })
    ));
    assert!(!counter.fork_pending());
    assert!(matches!(
        counter.count_forked(&s, &before_last, 2),
        Err(CudaError::OutOfRange { .. })
    ));
    check(&mut counter, 11, "after the faults");
    // a fork made outside a capture cannot be joined inside one (refused before any wait, so
    // the capture stays valid); joined outside after the capture, it completes step 12 with the
    // captured last layer
    counter.count_forked(&s, &before_last, 0).unwrap();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    assert!(matches!(
        counter.join_forked(&s),
        Err(CudaError::Capture(_))
    ));
    assert!(counter.fork_pending());
    counter.count_raw(&s, &last, layers - 1).unwrap();
    let g = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("captured graph");
    counter.join_forked(&s).unwrap();
    g.launch().unwrap();
    check(&mut counter, 12, "fork outside, last layer captured");
    // a captured fork cannot be joined from a stream outside its capture (refused, still
    // pending, capture still valid); joined inside, the graph completes step 13
    let other = gpu.ctx().new_stream().unwrap();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    counter.count_forked(&s, &before_last, 0).unwrap();
    counter.count_raw(&s, &last, layers - 1).unwrap();
    assert!(matches!(
        counter.join_forked(&other),
        Err(CudaError::Capture(_))
    ));
    assert!(counter.fork_pending());
    counter.join_forked(&s).unwrap();
    let g = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("captured graph");
    g.launch().unwrap();
    check(
        &mut counter,
        13,
        "captured fork, join refused outside then done inside",
    );
}

/// Uploads int32 `ids` of `shape` (layers from 0): the device buffer (keep it alive while the
/// view is used), its view and the CPU reference counts `[layers][experts]`.
fn upload_step(
    gpu: &Gpu,
    ids: &[i32],
    shape: TopkShape,
    experts: u32,
) -> (DeviceBuffer<i32>, TopkIdsView, Vec<u32>) {
    let mut want = vec![0u32; (shape.layers * experts) as usize];
    count_picks_cpu(ids, shape, 0, shape.layers, experts, &mut want).unwrap();
    let d = DeviceBuffer::from_host(gpu.ctx(), ids).unwrap();
    let view = TopkIdsView {
        ptr: d.device_ptr(),
        bytes: 4 * shape.picks(),
        dtype: IdsDtype::I32,
        shape,
    };
    (d, view, want)
}

/// A capture that ends without the join fails (CUDA: unjoined work); the next `join_forked`
/// drops that fork (it never ran) with `CudaError::Capture` instead of wedging the counter, and
/// counting goes on exactly. Its own test: the capture's deliberate
/// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` is the one API error compute-sanitizer reports.
#[test]
fn a_capture_ended_without_the_join_drops_its_fork() {
    let Some(gpu) = gpu_or_skip() else { return };
    use cuda_kernels::cudarc_driver::sys;
    let (layers, tokens, k, experts) = (2u32, 64u32, 2u32, 8u32);
    let shape = TopkShape::step(layers, tokens, k);
    let ids: Vec<i32> = (0..shape.picks()).map(|i| (i % 7) as i32).collect();
    let (_d, view, want) = upload_step(&gpu, &ids, shape, experts);
    let s = gpu.stream().clone();
    let mut counter = PickCounterGpu::new(&gpu, layers, experts).unwrap();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    counter.count_forked(&s, &view, 0).unwrap();
    assert!(s.end_capture(sys::CUgraphInstantiate_flags(0)).is_err());
    assert!(matches!(
        counter.join_forked(&s),
        Err(CudaError::Capture(_))
    ));
    assert!(!counter.fork_pending());
    counter.drain_async(&s).unwrap();
    assert!(counter.wait_drain().unwrap().counts.iter().all(|&c| c == 0));
    counter.count_forked(&s, &view, 0).unwrap();
    counter.join_forked(&s).unwrap();
    counter.drain_async(&s).unwrap();
    assert_eq!(counter.wait_drain().unwrap().counts, &want[..]);
}

/// The join orders the step stream after the branch: a branch count of ~8.4 M picks (hundreds
/// of µs) is complete when a drain queued on the step stream right after `join_forked` copies
/// the table (a join that ordered nothing would drain a partial count).
#[test]
fn join_forked_orders_the_step_stream_after_a_long_branch() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let (layers, tokens, k, experts) = (4u32, scaled(350_000) as u32, 6u32, 128u32);
    let shape = TopkShape::step(layers, tokens, k);
    let ids: Vec<i32> = random_ids(&mut rng, shape.picks() as usize, experts as i64, 0)
        .into_iter()
        .map(|v| v as i32)
        .collect();
    let (_d, view, want) = upload_step(&gpu, &ids, shape, experts);
    let s = gpu.stream().clone();
    let mut counter = PickCounterGpu::new(&gpu, layers, experts).unwrap();
    counter.count_forked(&s, &view, 0).unwrap();
    counter.join_forked(&s).unwrap();
    counter.drain_async(&s).unwrap();
    let snap = counter.wait_drain().unwrap();
    assert_eq!(snap.counts, &want[..]);
    assert_eq!(snap.rejected, 0);
}
