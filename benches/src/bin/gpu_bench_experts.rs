//! GPU timings of the expert tier on a real device (CUDA events, warm-up, medians):
//! H2D ceiling, swap copy rate, added step time per applied swap, counting cost per step, and
//! the fused counting header's cost. Prints a table with ratios against the ceilings.
//!
//! Run: `cargo run --release -p tierkit-benches --features cuda --bin gpu_bench_experts`
//! (prints `SKIP: no CUDA device` and exits 0 where no device exists; add `-- fused` for the
//! fused-path rows alone). The stand-in routers and expert readers are `tierkit-testkit`'s.

#[cfg(feature = "cuda")]
mod bench {
    use std::sync::Arc;

    use cuda_kernels::cudarc_driver::{CudaFunction, CudaStream};
    use cuda_kernels::{
        copy_htod_async, DeviceBuffer, Gpu, IdsDtype, PickCounterGpu, PinnedBuffer, TopkIdsView,
        TopkShape,
    };
    use expert_residency::gpu::{CommitMode, ExpertBankGpu};
    use expert_residency::{Geometry, ResidencyMap};
    use tierkit_testkit::{
        gpu_or_skip, launch_standin_router, router_standins, ExpertReaders, TIMING_EVENT,
    };

    /// The published H2D ceiling of the test machine (docs/h200-ceilings.md).
    const H2D_CEILING_GBS: f64 = 55.6;
    /// One 17.93 MiB expert row (the GB300 recipe's expert size).
    const EXPERT_BYTES: u64 = 18_800_640;

    fn ev(gpu: &Gpu) -> cuda_kernels::cudarc_driver::CudaEvent {
        gpu.ctx().new_event(TIMING_EVENT).expect("event")
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }

    fn time_ms(gpu: &Gpu, s: &CudaStream, mut f: impl FnMut()) -> f64 {
        let (a, b) = (ev(gpu), ev(gpu));
        a.record(s).unwrap();
        f();
        b.record(s).unwrap();
        a.elapsed_ms(&b).unwrap() as f64
    }

    struct Row(String, String, String);

    /// Captures what `f` enqueues on `s` into a CUDA graph (engines capture their steps; replay
    /// removes the host's launch cost, so the figure is the GPU's time).
    fn capture(s: &Arc<CudaStream>, f: impl FnOnce()) -> cuda_kernels::cudarc_driver::CudaGraph {
        use cuda_kernels::cudarc_driver::sys;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        f();
        s.end_capture(sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("captured graph")
    }

    fn h2d_ceiling(gpu: &Arc<Gpu>) -> f64 {
        let n = 1usize << 30;
        let host = PinnedBuffer::<u8>::zeroed(gpu.ctx(), n).unwrap();
        let dev = DeviceBuffer::<u8>::zeroed(gpu.ctx(), n).unwrap();
        let s = gpu.stream().clone();
        let mut t = Vec::new();
        for i in 0..6 {
            let ms = time_ms(gpu, &s, || {
                // SAFETY: both buffers hold n bytes and live past the synchronising elapsed_ms.
                unsafe { copy_htod_async(dev.device_ptr(), host.host_ptr(), n, &s).unwrap() }
            });
            if i > 0 {
                t.push(ms);
            }
        }
        n as f64 / (median(t) * 1e-3) / 1e9
    }

    fn swap_copy(gpu: &Arc<Gpu>, rows: &mut Vec<Row>, ceiling: f64) {
        let geo = Geometry::new(1, 4, 2, EXPERT_BYTES).unwrap();
        let mut bank = ExpertBankGpu::new(gpu, geo).unwrap();
        bank.load_map(&ResidencyMap::first_k("bench", geo).unwrap())
            .unwrap();
        let s = gpu.stream().clone();
        let cs = bank.copy_stream().clone();
        let mut t = Vec::new();
        for i in 0..21 {
            let hot = bank.hot_experts(0);
            let inc = (0..4).find(|e| !hot.contains(e)).unwrap();
            let (a, b) = (ev(gpu), ev(gpu));
            a.record(&cs).unwrap();
            let swap = bank.plan_swap(0, inc, hot[0]).unwrap();
            bank.begin_swap(&swap).unwrap();
            b.record(&cs).unwrap();
            bank.commit_ready(&s, CommitMode::Wait).unwrap();
            s.synchronize().unwrap();
            if i > 0 {
                t.push(a.elapsed_ms(&b).unwrap() as f64 * 1e3);
            }
        }
        let us = median(t);
        let gbs = EXPERT_BYTES as f64 / (us * 1e-6) / 1e9;
        rows.push(Row(
            "swap copy, one 17.93 MiB expert, host -> spare slot (copy stream)".into(),
            format!("{us:.0} us ({gbs:.1} GB/s)"),
            format!(
                "{:.1}% of 55.6 GB/s, {:.1}% of measured {ceiling:.1}; goal <= 380 us",
                100.0 * gbs / H2D_CEILING_GBS,
                100.0 * gbs / ceiling
            ),
        ));
    }

    fn added_step_time(gpu: &Arc<Gpu>, rows: &mut Vec<Row>) {
        // 40 layers x 8 experts x 17.93 MiB, 6 hot: each step reads experts 0 and 1 of every layer
        // from HBM (never swapped), while swaps rotate experts 2..7 through the spare slots.
        let (layers, experts) = (40u32, 8u32);
        let geo = Geometry::new(layers, experts, 6, EXPERT_BYTES).unwrap();
        let mut bank = ExpertBankGpu::new(gpu, geo).unwrap();
        bank.load_map(&ResidencyMap::first_k("bench", geo).unwrap())
            .unwrap();
        let readers = ExpertReaders::new(gpu).unwrap();
        let s = gpu.stream().clone();
        let picks: Vec<DeviceBuffer<u32>> = (0..layers)
            .map(|l| DeviceBuffer::from_host(gpu.ctx(), &[l * experts, l * experts + 1]).unwrap())
            .collect();
        let sink = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 1).unwrap();
        let mut next_layer = 0u32;
        let mut run = |bank: &mut ExpertBankGpu, steps: usize, swaps: bool| -> (f64, usize) {
            let (a, b) = (ev(gpu), ev(gpu));
            let mut applied = 0;
            a.record(&s).unwrap();
            for _ in 0..steps {
                for p in &picks {
                    readers
                        .launch_touch_reader((bank.table_ptr(), EXPERT_BYTES), &s, p, 64, &sink)
                        .unwrap();
                }
                if swaps {
                    // step boundary: flip what is ready, begin one new swap
                    applied += bank.commit_ready(&s, CommitMode::Deferred).unwrap().len();
                    let l = next_layer % layers;
                    if !bank.in_flight(l) {
                        let hot = bank.hot_experts(l);
                        let inc = (2..experts).find(|&e| !bank.is_hot(l, e)).unwrap();
                        let out = *hot.iter().find(|&&e| e >= 2).unwrap();
                        let swap = bank.plan_swap(l, inc, out).unwrap();
                        bank.begin_swap(&swap).unwrap();
                        next_layer += 1;
                    }
                }
                s.synchronize().unwrap(); // an engine reads the step's logits
            }
            b.record(&s).unwrap();
            (
                a.elapsed_ms(&b).unwrap() as f64 * 1e3 / steps as f64,
                applied,
            )
        };
        run(&mut bank, 20, false);
        run(&mut bank, 20, true);
        let (mut base, mut with, mut per_step) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..5 {
            base.push(run(&mut bank, 200, false).0);
            let (us, applied) = run(&mut bank, 200, true);
            with.push(us);
            per_step.push(applied as f64 / 200.0);
        }
        bank.copy_stream().synchronize().unwrap();
        let (b, w, p) = (median(base.clone()), median(with.clone()), median(per_step));
        let added = (w - b) / p.max(1e-9);
        rows.push(Row(
            "step time, 40 layers reading 2 HBM experts each, no swaps".into(),
            format!("{b:.1} us/step"),
            format!(
                "spread {:.1}..{:.1}",
                base.iter().cloned().fold(f64::MAX, f64::min),
                base.iter().cloned().fold(0.0, f64::max)
            ),
        ));
        rows.push(Row(
            format!("same, swaps running ({p:.2} applied per step)"),
            format!("{w:.1} us/step"),
            format!(
                "spread {:.1}..{:.1}",
                with.iter().cloned().fold(f64::MAX, f64::min),
                with.iter().cloned().fold(0.0, f64::max)
            ),
        ));
        rows.push(Row(
            "added step time per applied swap".into(),
            format!("{added:.1} us"),
            "goal <= 50 us (GB300 recipe: 1300-2400 us)".into(),
        ));
        let bad = bank.mismatches().unwrap();
        assert_eq!(bad, 0);
    }

    fn counting(gpu: &Arc<Gpu>, rows: &mut Vec<Row>) {
        let (layers, tokens, k, experts) = (40u32, 256u32, 6u32, 64u32);
        let shape = TopkShape::step(layers, tokens, k);
        let mut x = 0x1234_5678_9abc_def0u64;
        let ids: Vec<i32> = (0..shape.picks())
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % experts as u64) as i32
            })
            .collect();
        let ids64: Vec<i64> = ids.iter().map(|&v| v as i64).collect();
        let d32 = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
        let d64 = DeviceBuffer::from_host(gpu.ctx(), &ids64).unwrap();
        let counter = PickCounterGpu::new(gpu, layers, experts).unwrap();
        let s = gpu.stream().clone();
        for (name, i64_) in [("int32", false), ("int64", true)] {
            let mut t = Vec::new();
            for rep in 0..6 {
                let n = 2000;
                let ms = time_ms(gpu, &s, || {
                    for _ in 0..n {
                        if i64_ {
                            counter.count(&s, &d64, shape, 0).unwrap();
                        } else {
                            counter.count(&s, &d32, shape, 0).unwrap();
                        }
                    }
                });
                if rep > 0 {
                    t.push(ms * 1e3 / n as f64);
                }
            }
            rows.push(Row(
                format!("count one step's picks, [40, 256, 6] {name}, one launch per step, stream launches back-to-back (host-bound)"),
                format!("{:.2} us/step", median(t)),
                "ceiling file: 3.6 us launch-bound".into(),
            ));
            let per_graph = 100;
            let g = capture(&s, || {
                for _ in 0..per_graph {
                    if i64_ {
                        counter.count(&s, &d64, shape, 0).unwrap();
                    } else {
                        counter.count(&s, &d32, shape, 0).unwrap();
                    }
                }
            });
            g.upload().unwrap();
            let mut t = Vec::new();
            for rep in 0..6 {
                let n = 20;
                let ms = time_ms(gpu, &s, || (0..n).for_each(|_| g.launch().unwrap()));
                if rep > 0 {
                    t.push(ms * 1e3 / (n * per_graph) as f64);
                }
            }
            rows.push(Row(
                format!("same, {name}, captured in a CUDA graph (GPU time per step)"),
                format!("{:.2} us/step", median(t)),
                "goal <= 4 us".into(),
            ));
        }
    }

    /// Deterministic f32 logits `[tokens, experts]` in [0, 1) for the stand-in routers.
    fn standin_logits(tokens: u32, experts: u32) -> Vec<f32> {
        let mut x = 99u64;
        (0..tokens * experts)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect()
    }

    type Variants<'a> = [(u32, &'a str)];

    /// Per variant, the per-step times (us) of 31 repetitions: stream launches (what a host without
    /// graphs pays) and CUDA graphs of 10 steps (GPU time). Variants interleave in every repetition.
    fn time_variants(
        gpu: &Arc<Gpu>,
        s: &Arc<CudaStream>,
        step: &dyn Fn(u32),
        variants: &Variants,
    ) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let steps_per_graph = 10;
        let graphs: Vec<_> = variants
            .iter()
            .map(|&(v, _)| {
                let g = capture(s, || (0..steps_per_graph).for_each(|_| step(v)));
                g.upload().unwrap();
                g
            })
            .collect();
        let mut stream_t = vec![Vec::new(); variants.len()];
        let mut graph_t = vec![Vec::new(); variants.len()];
        for rep in 0..32 {
            for (i, &(v, _)) in variants.iter().enumerate() {
                let n = 100;
                let a = time_ms(gpu, s, || (0..n).for_each(|_| step(v)));
                let m = 30;
                let b = time_ms(gpu, s, || (0..m).for_each(|_| graphs[i].launch().unwrap()));
                if rep > 0 {
                    stream_t[i].push(a * 1e3 / n as f64);
                    graph_t[i].push(b * 1e3 / (m * steps_per_graph) as f64);
                }
            }
        }
        (stream_t, graph_t)
    }

    /// Rows: the baseline (variant 0) and each variant's added time per step (median of the
    /// per-repetition differences against the baseline).
    fn push_rows(
        rows: &mut Vec<Row>,
        what: &str,
        variants: &Variants,
        stream_t: &[Vec<f64>],
        graph_t: &[Vec<f64>],
    ) {
        for (mode, t) in [("stream launches", stream_t), ("CUDA graph", graph_t)] {
            let base = median(t[0].clone());
            rows.push(Row(
                format!("{what}, 40 layers x 256 tokens x top-6, {mode}, without counting"),
                format!("{base:.2} us/step"),
                String::new(),
            ));
            for (i, &(v, name)) in variants.iter().enumerate().skip(1) {
                let mut diffs: Vec<f64> = t[i].iter().zip(&t[0]).map(|(w, o)| w - o).collect();
                diffs.sort_by(|a, b| a.total_cmp(b));
                let q = |p: f64| diffs[((diffs.len() - 1) as f64 * p).round() as usize];
                rows.push(Row(
                    format!("same, {name} (mode {v}): added per 40-layer step"),
                    format!(
                        "{:.2} us (quartiles {:.2}..{:.2}; {:.2} us/step)",
                        median(diffs.clone()),
                        q(0.25),
                        q(0.75),
                        median(t[i].clone())
                    ),
                    "goal <= 2 us (GB300 recipe: 2-6 us)".into(),
                ));
            }
        }
    }

    /// The fused header's cost: each way of calling it from the stand-in router (one kernel per
    /// way, `tierkit_standin_router_m<MODE>` in testkit's router_standins.cu, one ids buffer reused by every layer as
    /// engines do) against the same router without counting, in CUDA graphs. Before timing, each
    /// counting variant runs 3 steps and a drain (which folds the stripes) and must equal
    /// 3 x layers x the CPU top-k histogram. Then the drain's fold is timed.
    fn fused(gpu: &Arc<Gpu>, rows: &mut Vec<Row>, kind: &str) {
        let (layers, tokens, experts, k) = (40u32, 256u32, 64u32, 6u32);
        let logits = standin_logits(tokens, experts);
        // CPU reference of the router: top-k per row, ties lowest id
        let mut hist = vec![0u32; experts as usize];
        for t in 0..tokens as usize {
            let row = &logits[t * experts as usize..(t + 1) * experts as usize];
            let mut idx: Vec<usize> = (0..experts as usize).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            idx[..k as usize].iter().for_each(|&e| hist[e] += 1);
        }
        let dl = DeviceBuffer::from_host(gpu.ctx(), &logits).unwrap();
        let ids = DeviceBuffer::<i32>::zeroed(gpu.ctx(), (tokens * k) as usize).unwrap();
        let step_ids =
            DeviceBuffer::<i32>::zeroed(gpu.ctx(), (layers * tokens * k) as usize).unwrap();
        let weights = DeviceBuffer::<f32>::zeroed(gpu.ctx(), (tokens * k) as usize).unwrap();
        let s = gpu.stream().clone();
        let variants = [
            (0u32, "without counting"),
            (
                21,
                "tierkit_count_pick_striped from lanes < k as the top-k loop ends, a stripe per warp",
            ),
            (
                27,
                "same, placed after the router's last store (recommended)",
            ),
            (
                29,
                "no counting, each layer's ids written to its slice of a [layers, tokens, k] step buffer (the step form's baseline)",
            ),
            (
                30,
                "step form: the last layer's router counts the step from the step buffer (tierkit_step_picks_*) + its own picks at its end",
            ),
            (40, "no fused call: the standalone count launch over the whole step buffer after the last router (PickCounterGpu::count_raw)"),
            (41, "hybrid: the standalone count of layers 0-38 on a forked graph branch after layer 38's router (joined at the step's end) + the last router's own picks striped (mode 27)"),
            (25, "same, a stripe per block (8 warps share one)"),
            (26, "same call into the table itself (no stripes)"),
            (
                3,
                "tierkit_count_pick (atomicAdd into the table) inside each arg-max round, lane 0",
            ),
            (
                7,
                "tierkit_count_prev_layer after the logits loads + last layer's own picks in-loop",
            ),
            (
                17,
                "diagnostic, no counting: each pick stored a second time as the loop ends (plain store)",
            ),
        ];
        // 40 and 41 run the step buffer's routers (mode 29) and count off the router
        let kernel_mode = |v: u32| if v >= 40 { 29 } else { v };
        let funcs: Vec<CudaFunction> = variants
            .iter()
            .map(|&(v, _)| {
                let m = kernel_mode(v);
                gpu.function(&router_standins(), &format!("tierkit_standin_{kind}_m{m}"))
                    .unwrap()
            })
            .collect();
        let f27 = gpu
            .function(&router_standins(), &format!("tierkit_standin_{kind}_m27"))
            .unwrap();
        let step_view = |l: u32| TopkIdsView {
            ptr: step_ids.device_ptr(),
            bytes: 4 * (l * tokens * k) as u64,
            dtype: IdsDtype::I32,
            shape: TopkShape::step(l, tokens, k),
        };
        let launch = |i: usize, c: &mut PickCounterGpu| {
            let v = variants[i].0;
            for layer in 0..layers {
                let (lp, dims) = (dl.device_ptr(), (tokens, experts, k));
                let out = if v == 29 || v >= 30 {
                    let slice = step_ids.device_ptr() + 4 * (layer * tokens * k) as u64;
                    (slice, step_ids.device_ptr(), weights.device_ptr())
                } else {
                    (ids.device_ptr(), ids.device_ptr(), weights.device_ptr())
                };
                if v == 41 && layer + 1 == layers {
                    // fork the count of the earlier layers, run the last router (fused call for
                    // its own picks) alongside it, join at the step's end
                    c.count_forked(&s, &step_view(layers - 1), 0).unwrap();
                    // SAFETY: f27 is a stand-in router; logits, ids and weights are sized above.
                    unsafe { launch_standin_router(&s, &f27, lp, dims, out, c, layer) }.unwrap();
                    c.join_forked(&s).unwrap();
                } else {
                    // SAFETY: funcs[i] is a stand-in router; logits, ids and weights are sized above.
                    unsafe { launch_standin_router(&s, &funcs[i], lp, dims, out, c, layer) }
                        .unwrap();
                }
            }
            if v == 40 {
                c.count_raw(&s, &step_view(layers), 0).unwrap();
            }
        };
        // one stripe per warp (one warp per token); mode 25 uses the first 32 (one per block)
        let counter = std::cell::RefCell::new(
            PickCounterGpu::with_stripes(gpu, layers, experts, tokens).unwrap(),
        );
        for (i, &(v, _)) in variants.iter().enumerate() {
            if v == 0 || v == 17 || v == 29 {
                continue;
            }
            let mut c = PickCounterGpu::with_stripes(gpu, layers, experts, tokens).unwrap();
            (0..3).for_each(|_| launch(i, &mut c));
            c.drain_async(&s).unwrap();
            let snap = c.wait_drain().unwrap();
            let want: Vec<u32> = (0..layers)
                .flat_map(|_| hist.iter().map(|&h| 3 * h))
                .collect();
            let ok = snap.counts == &want[..] && snap.rejected == 0;
            println!(
                "{kind} mode {v}: counts after 3 steps and a drain equal the CPU reference: {ok}"
            );
            assert!(ok, "fused counts differ in mode {v}");
        }
        // time_variants takes variant ids: map them back to kernel indices
        let step = |v: u32| {
            let i = variants.iter().position(|x| x.0 == v).unwrap();
            launch(i, &mut counter.borrow_mut())
        };
        let (stream_t, graph_t) = time_variants(gpu, &s, &step, &variants);
        let what = if kind == "gate" {
            "stand-in gate (ids + top-k softmax weights)"
        } else {
            "stand-in router (ids only)"
        };
        push_rows(rows, what, &variants, &stream_t, &graph_t);
        if kind == "gate" {
            return; // the fold is the same for both
        }
        // the drain's fold of the stripes (40 x 256 x 64 u32), in a graph of 30 folds
        let n = 30;
        let g = capture(&s, || {
            (0..n).for_each(|_| counter.borrow().fold_stripes(&s).unwrap())
        });
        g.upload().unwrap();
        let fold_us = median(
            (0..11)
                .map(|_| time_ms(gpu, &s, || g.launch().unwrap()) * 1e3 / n as f64)
                .collect(),
        );
        rows.push(Row(
            format!(
                "fold of the stripes at the drain ({layers} x {tokens} x {experts} u32), CUDA graph"
            ),
            format!(
                "{fold_us:.2} us per drain = {:.3} us/step at a drain every 64 steps",
                fold_us / 64.0
            ),
            "once per drain, on the step stream".into(),
        ));
    }

    pub fn main() {
        let Some(gpu) = gpu_or_skip() else { return };
        println!(
            "device: {} ({}), cuda-kernels NVRTC arch {}",
            gpu.name().unwrap(),
            gpu.ctx().ordinal(),
            gpu.arch()
        );
        let mut rows = Vec::new();
        let ceiling = h2d_ceiling(&gpu);
        rows.push(Row(
            "H2D ceiling, 1 GiB pinned (mapped) -> HBM".into(),
            format!("{ceiling:.1} GB/s"),
            format!(
                "{:.1}% of the recorded 55.6 GB/s",
                100.0 * ceiling / H2D_CEILING_GBS
            ),
        ));
        // `gpu_bench_experts fused`: the fused-path rows alone
        let only_fused = std::env::args().any(|a| a == "fused");
        if !only_fused {
            swap_copy(&gpu, &mut rows, ceiling);
            counting(&gpu, &mut rows);
        }
        fused(&gpu, &mut rows, "router");
        fused(&gpu, &mut rows, "gate");
        if !only_fused {
            added_step_time(&gpu, &mut rows);
        }
        println!("\n| measurement | figure | against |\n| --- | --- | --- |");
        for Row(a, b, c) in rows {
            println!("| {a} | {b} | {c} |");
        }
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    bench::main();
    #[cfg(not(feature = "cuda"))]
    println!("SKIP: no CUDA device (built without the `cuda` feature; pass --features cuda)");
}
