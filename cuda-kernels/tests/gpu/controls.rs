//! The GPU tests of the expert table update and of the count controls (exact counts in stream
//! order and in a graph replayed many times); the helpers are `gpu.rs`'s.

use super::*;

/// `TableUpdater::launch` against `apply_table_updates_cpu` (a batch of 150 pairs: three
/// launches) and bad batches refused before any launch. (The expert store's table flipped to
/// HBM slots by it is `expert-residency`'s `tests/gpu_store.rs`.)
#[test]
fn table_update_matches_the_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    let s = gpu.stream().clone();
    let updater = TableUpdater::new(&gpu).unwrap();
    let mut want: Vec<u64> = (0..200).map(|i| 1000 + i).collect();
    let mut table = DeviceBuffer::from_host(gpu.ctx(), &want).unwrap();
    let ups: Vec<(u32, u64)> = (0..150u32).map(|i| (i * 4 / 3, 7 * i as u64)).collect();
    apply_table_updates_cpu(&mut want, &ups).unwrap();
    updater.launch(&s, &table, &ups).unwrap();
    assert_eq!(table.download().unwrap(), want);
    assert!(matches!(
        updater.launch(&s, &table, &[(3, 1), (200, 2)]),
        Err(CudaError::OutOfRange { .. })
    ));
    assert!(matches!(
        updater.launch(&s, &table, &[(3, 1), (3, 2)]),
        Err(CudaError::Duplicate { .. })
    ));
    assert_eq!(
        table.download().unwrap(),
        want,
        "refused batches write nothing"
    );
    table.upload(&vec![0u64; 200]).unwrap();
}

/// A control for step `i` of the control tests: every case the kernels branch on (disabled,
/// valid 0, valid inside the batch, exactly the batch, beyond it, the `u32::MAX` default),
/// then random ones.
fn control_case(rng: &mut ChaCha8Rng, i: usize, tokens: u32) -> CountControl {
    let fixed = [
        (true, u32::MAX),
        (false, u32::MAX),
        (true, 0),
        (true, 1),
        (true, tokens / 3),
        (true, tokens - 1),
        (true, tokens),
        (true, tokens + 5),
        (false, tokens / 2),
    ];
    let (enabled, valid_tokens) = match fixed.get(i) {
        Some(&c) => c,
        None => (
            !rng.random_ratio(1, 5),
            if rng.random_bool(0.2) {
                u32::MAX
            } else {
                rng.random_range(0..=tokens + 2)
            },
        ),
    };
    CountControl {
        enabled,
        valid_tokens,
    }
}

/// The device control block in stream order: a new counter counts everything (the old
/// semantics); then, step after step, `set_enabled_async` / `set_valid_tokens_async` change the
/// controls on the step stream and the counts (int32 and int64 launches, and the forked count)
/// equal `count_picks_cpu_ctl` exactly, rejected picks included: a disabled launch counts
/// nothing and token rows at or above the valid count are skipped in every layer.
#[test]
fn count_controls_give_exact_counts_in_stream_order() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let (layers, tokens, k, experts) = (6u32, 301u32, 6u32, 64u32);
    let shape = TopkShape::step(layers, tokens, k);
    let s = gpu.stream().clone();
    let mut counter = PickCounterGpu::new(&gpu, layers, experts).unwrap();
    let mut cpu = vec![0u32; (layers * experts) as usize];
    let mut cpu_rej = 0u32;
    // defaults: everything counted, as before the controls existed
    let ids = random_ids(&mut rng, shape.picks() as usize, experts as i64, 89);
    cpu_rej += count_picks_cpu(&ids, shape, 0, layers, experts, &mut cpu).unwrap();
    let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
    counter.count(&s, &d, shape, 0).unwrap();
    counter.drain_async(&s).unwrap();
    let snap = counter.wait_drain().unwrap();
    assert_eq!(snap.counts, &cpu[..], "defaults");
    assert_eq!(snap.rejected, cpu_rej, "defaults: rejected");
    assert_eq!(
        raw_u32(&gpu, counter.control_ptr(), COUNT_CONTROL_WORDS),
        CountControl::ALL.to_words()
    );
    let steps = scaled(60);
    let mut last = CountControl::ALL;
    for step in 0..steps {
        let ctl = control_case(&mut rng, step, tokens);
        last = ctl;
        counter.set_enabled_async(&s, ctl.enabled).unwrap();
        counter
            .set_valid_tokens_async(&s, ctl.valid_tokens)
            .unwrap();
        let ids = random_ids(&mut rng, shape.picks() as usize, experts as i64, 53);
        cpu_rej += count_picks_cpu_ctl(&ids, shape, 0, layers, experts, ctl, &mut cpu).unwrap();
        match step % 3 {
            0 => {
                let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
                counter.count(&s, &d, shape, 0).unwrap();
                s.synchronize().unwrap();
            }
            1 => {
                let ids32: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                let d = DeviceBuffer::from_host(gpu.ctx(), &ids32).unwrap();
                counter.count(&s, &d, shape, 0).unwrap();
                s.synchronize().unwrap();
            }
            _ => {
                // forked from the step stream after the control writes: the branch sees them
                let ids32: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                let (_d, view, _) = upload_step(&gpu, &ids32, shape, experts);
                counter.count_forked(&s, &view, 0).unwrap();
                counter.join_forked(&s).unwrap();
                s.synchronize().unwrap();
            }
        }
        if step % 4 == 3 || step + 1 == steps {
            counter.drain_async(&s).unwrap();
            let snap = counter.wait_drain().unwrap();
            assert_eq!(snap.counts, &cpu[..], "step {step}, control {ctl:?}");
            assert_eq!(snap.rejected, cpu_rej, "step {step}: rejected");
        }
    }
    // the block holds the last control written (word by word through the raw pointers too)
    assert_eq!(
        raw_u32(&gpu, counter.control_ptr(), COUNT_CONTROL_WORDS),
        last.to_words()
    );
    assert_eq!(
        raw_u32(&gpu, counter.valid_tokens_ptr(), 1)[0],
        last.valid_tokens
    );
    assert_eq!(
        raw_u32(&gpu, counter.enabled_ptr(), 1)[0],
        last.enabled as u32
    );
}

/// A router-end stand-in for the controlled fused call: one thread per pick of one layer's
/// `[tokens, k]` int32 ids, token = pick / k, stripe = the thread's warp; each calls
/// `tierkit_count_pick_striped_ctl` with the counter's control block.
const CTL_STANDIN: KernelSource = KernelSource {
    name: "test_count_ctl_standin",
    code: concat!(
        include_str!("../../kernels/expert_count.cuh"),
        r#"
extern "C" __global__ void test_count_striped_ctl(const int* ids, unsigned int tokens, unsigned int k,
                                                  unsigned int* stripes, unsigned int num_stripes,
                                                  unsigned int* table, unsigned int* err,
                                                  unsigned int layer, unsigned int layers,
                                                  unsigned int experts, const unsigned int* ctl) {
    const unsigned int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= tokens * k) return;
    tierkit_count_pick_striped_ctl(ctl, g / k, stripes, num_stripes, g >> 5, table, err, layer,
                                   layers, (long long)ids[g], experts);
}
"#
    ),
};

/// Exact counts inside one captured CUDA graph replayed many times while the host changes the
/// controls between replays: the graph is the recommended production step (the earlier layers'
/// count forked onto the branch, the last layer counted by the fused header's
/// `tierkit_count_pick_striped_ctl`, stripes for half its warps, the rest into the table,
/// joined at the end). Before each replay the host writes a new control, alternately with
/// `set_control_async` on the graph's stream and as an engine would (an async copy of
/// `[enabled, valid_tokens]` from pinned memory into `control_ptr()`); every few replays a
/// drain must equal `count_picks_cpu_ctl` summed over the replays' controls, so a graph that
/// had baked in the values at capture (or read stale ones) fails.
#[test]
fn count_controls_are_exact_in_a_graph_replayed_many_times() {
    let Some(gpu) = gpu_or_skip() else { return };
    use cuda_kernels::cudarc_driver::{sys, LaunchConfig, PushKernelArg};
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let (layers, tokens, k, experts) = (5u32, 256u32, 6u32, 64u32);
    let shape = TopkShape::step(layers, tokens, k);
    let ids = random_ids_i32(&mut rng, shape.picks() as usize, experts as i64, 71);
    let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
    let per_layer = (tokens * k) as u64;
    let before_last = TopkIdsView {
        ptr: d.device_ptr(),
        bytes: 4 * per_layer * (layers as u64 - 1),
        dtype: IdsDtype::I32,
        shape: TopkShape::step(layers - 1, tokens, k),
    };
    let last_ptr = d.device_ptr() + 4 * per_layer * (layers as u64 - 1);
    let warps = (tokens * k).div_ceil(32);
    let mut counter = PickCounterGpu::with_stripes(&gpu, layers, experts, warps / 2).unwrap();
    let f = gpu
        .function(&CTL_STANDIN, "test_count_striped_ctl")
        .unwrap();
    let s = gpu.stream().clone();
    let launch_last = |c: &PickCounterGpu| {
        let cfg = LaunchConfig {
            grid_dim: ((tokens * k).div_ceil(128), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (sp, ns, tp, ep, cp) = (
            c.stripes_ptr(),
            c.num_stripes(),
            c.table_ptr(),
            c.rejected_ptr(),
            c.control_ptr(),
        );
        let layer = layers - 1;
        let mut b = s.launch_builder(&f);
        b.arg(&last_ptr)
            .arg(&tokens)
            .arg(&k)
            .arg(&sp)
            .arg(&ns)
            .arg(&tp)
            .arg(&ep)
            .arg(&layer)
            .arg(&layers)
            .arg(&experts)
            .arg(&cp);
        // SAFETY: the argument list matches `test_count_striped_ctl`; `last_ptr` holds tokens*k
        // i32 (the last layer's slice of `d`), the stripes, table, rejected word and control
        // block are the counter's (with_stripes: layers x num_stripes x experts stripes).
        unsafe { b.launch(cfg) }.unwrap();
    };
    // capture one step
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    counter.count_forked(&s, &before_last, 0).unwrap();
    launch_last(&counter);
    counter.join_forked(&s).unwrap();
    let g = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("captured graph");
    let replays = scaled(150);
    // one pinned [enabled, valid_tokens, 0, 0] slot per replay: no slot is rewritten while a
    // queued copy may still read it
    let mut pinned = PinnedBuffer::<u32>::zeroed(gpu.ctx(), replays * COUNT_CONTROL_WORDS).unwrap();
    let mut cpu = vec![0u32; (layers * experts) as usize];
    let mut cpu_rej = 0u32;
    let (mut disabled, mut padded) = (0, 0);
    for r in 0..replays {
        let ctl = control_case(&mut rng, r, tokens);
        disabled += usize::from(!ctl.enabled);
        padded += usize::from(ctl.enabled && ctl.valid_tokens < tokens);
        if r % 2 == 0 {
            counter.set_control_async(&s, ctl).unwrap();
        } else {
            let slot = &mut pinned.as_mut_slice()[r * COUNT_CONTROL_WORDS..][..COUNT_CONTROL_WORDS];
            slot.copy_from_slice(&ctl.to_words());
            let src = slot.as_ptr() as *const u8;
            // SAFETY: the control block holds 4 u32 (8 bytes written: enabled, valid_tokens);
            // `src` is this replay's own pinned slot, never written again, and `pinned` outlives
            // the synchronisation at the end of the test.
            unsafe { copy_htod_async(counter.control_ptr(), src, 8, &s) }.unwrap();
        }
        g.launch().unwrap();
        cpu_rej += count_picks_cpu_ctl(&ids, shape, 0, layers, experts, ctl, &mut cpu).unwrap();
        if r % 10 == 9 || r + 1 == replays {
            counter.drain_async(&s).unwrap();
            let snap = counter.wait_drain().unwrap();
            assert_eq!(snap.counts, &cpu[..], "after replay {r} (control {ctl:?})");
            assert_eq!(snap.rejected, cpu_rej, "after replay {r}: rejected");
        }
    }
    s.synchronize().unwrap();
    assert!(disabled > 0 && padded > 0 && cpu_rej > 0);
    println!(
        "{replays} replays exact ({disabled} disabled, {padded} with padding rows), {} picks",
        cpu.iter().map(|&c| c as u64).sum::<u64>()
    );
}
