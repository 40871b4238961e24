//! Reference integration of `expert-residency` on a GPU: a MoE layer stack whose expert FFNs
//! (a plain GEMV per pick) read their weights through the executor's indirection table, driven
//! by a routing trace with a domain shift (OLMoE-fitted synthetic, github → book), with the
//! counting kernel (forked onto the counter's branch stream alongside the layers:
//! `PickCounterGpu::count_forked`), asynchronous drains and swaps running live.
//!
//! Geometry (scaled down so that not all experts fit the hot budget): 40 layers × 64 experts ×
//! 2 MiB (f32 `[1024 × 512]`), top-8, 4 tokens per step, 48 hot per layer. Cold experts are read
//! in place from mapped pinned host memory (zero-copy over PCIe), so every cold pick costs PCIe
//! time; the table prints tokens/s and cold share for all-HBM (the ceiling), the static map
//! (experts 0..48), a seed map (fitted offline on another github trace) and adaptive (seed map +
//! controller).
//!
//! Run: `cargo run --release -p tierkit-examples --features cuda --example moe_gpu`
//! (prints `SKIP: no CUDA device` where no device exists). Options: `--steps N` (default 600,
//! shift at N/3), `--expert-mib M` (default 2).

#[cfg(feature = "cuda")]
mod run {
    use std::sync::Arc;
    use std::time::Instant;

    use cuda_kernels::cudarc_driver::{CudaFunction, LaunchConfig, PushKernelArg};
    use cuda_kernels::{
        copy_htod_async, DeviceBuffer, Gpu, IdsDtype, KernelSource, PickCounterGpu, PinnedBuffer,
        TopkIdsView, TopkShape,
    };
    use expert_residency::gpu::GpuExecutor;
    use expert_residency::{
        fit_seed_map, Controller, ControllerConfig, Geometry, ResidencyMap, SwapExecutor,
    };
    use tierkit_sim::experts::trace::synth::{generate, DomainProfile, Phase, SynthConfig};
    use tierkit_sim::experts::trace::{Trace, TraceShape};
    use tierkit_testkit::gpu_or_skip;

    const LAYERS: u32 = 40;
    const EXPERTS: u32 = 64;
    const HOT: u32 = 48;
    const TOP_K: u32 = 8;
    const TOKENS: u32 = 4;
    const DIN: u32 = 512;

    /// The engine's expert FFN kernel (the integration point): weights come from
    /// `table[layer * experts + expert]`, an HBM slot or mapped pinned host memory.
    const MOE_SRC: KernelSource = KernelSource {
        name: "moe_example",
        code: r#"
extern "C" __global__ void moe_expert_gemv(const unsigned long long* table, unsigned int layer, unsigned int experts,
    const int* ids, unsigned int k, const float* x0, const float* yprev, float* y,
    unsigned int din, unsigned int dout, float gate) {
    __shared__ float xs[1024];
    const unsigned int p = blockIdx.y;
    const unsigned int t = p / k;
    const int e = ids[p];
    if (e < 0 || (unsigned int)e >= experts) return;
    for (unsigned int i = threadIdx.x; i < din; i += blockDim.x)
        xs[i] = yprev ? tanhf(yprev[(unsigned long long)t * dout + i]) : x0[(unsigned long long)t * din + i];
    __syncthreads();
    const float* W = (const float*)table[(unsigned long long)layer * experts + (unsigned int)e];
    const unsigned int warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, warps = blockDim.x >> 5;
    for (unsigned int r = blockIdx.x * warps + warp; r < dout; r += gridDim.x * warps) {
        const float4* row = (const float4*)(W + (unsigned long long)r * din);
        float acc = 0.f;
        for (unsigned int c = lane; c < din / 4; c += 32) {
            const float4 w = row[c];
            acc += w.x * xs[4 * c] + w.y * xs[4 * c + 1] + w.z * xs[4 * c + 2] + w.w * xs[4 * c + 3];
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xFFFFFFFFu, acc, o);
        if (lane == 0) atomicAdd(&y[(unsigned long long)t * dout + r], gate * acc);
    }
}
"#,
    };

    fn weight(l: u32, e: u32, i: u64) -> f32 {
        let mut z = ((l as u64) << 48 ^ (e as u64) << 36 ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) / (DIN as f32).sqrt()
    }

    fn fill(l: u32, e: u32, b: &mut [u8]) {
        for (i, c) in b.chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&weight(l, e, i as u64).to_le_bytes());
        }
    }

    fn synth(name: &str, steps: u64, domains: &[&str], shift_at: u64, seed: u64) -> Trace {
        let cfg = SynthConfig {
            name: name.into(),
            shape: TraceShape {
                layers: LAYERS,
                experts_per_layer: EXPERTS,
                top_k: TOP_K,
            },
            tokens_per_step: TOKENS,
            steps,
            reuse: 0.37,
            seed,
            domains: domains
                .iter()
                .map(|d| DomainProfile::olmoe(d, LAYERS).expect("built-in domain"))
                .collect(),
            phases: (0..domains.len())
                .map(|d| Phase {
                    start_step: d as u64 * shift_at,
                    domain: d,
                })
                .collect(),
        };
        generate(&cfg).expect("valid scenario")
    }

    #[derive(Default)]
    struct Phase2 {
        secs: f64,
        steps: u64,
        picks: u64,
        cold: u64,
    }

    struct Result {
        name: &'static str,
        pre: Phase2,
        post: Phase2,
        applied: u64,
        rel_err: f64,
    }

    enum Mode {
        AllHbm,
        Static,
        Seed,
        Adaptive,
    }

    #[allow(clippy::too_many_arguments)]
    fn run_mode(
        gpu: &Arc<Gpu>,
        f: &CudaFunction,
        trace: &Trace,
        shift_at: usize,
        mode: Mode,
        seed_map: &ResidencyMap,
        expert_bytes: u64,
        x0: &DeviceBuffer<f32>,
    ) -> Result {
        let dout = (expert_bytes / 4 / DIN as u64) as u32;
        let hot = if matches!(mode, Mode::AllHbm) {
            EXPERTS
        } else {
            HOT
        };
        let geo = Geometry::new(LAYERS, EXPERTS, hot, expert_bytes).unwrap();
        let map = match mode {
            Mode::AllHbm | Mode::Static => ResidencyMap::first_k("moe_gpu", geo).unwrap(),
            Mode::Seed | Mode::Adaptive => seed_map.clone(),
        };
        let name = match mode {
            Mode::AllHbm => "all-HBM (ceiling)",
            Mode::Static => "static map (experts 0..48)",
            Mode::Seed => "seed map (github-fitted)",
            Mode::Adaptive => "adaptive (seed map + controller)",
        };
        let s = gpu.stream().clone();
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(4);
        let mut exec = GpuExecutor::new(gpu, s.clone(), &map, threads, fill).expect("GPU executor");
        let cfg = ControllerConfig {
            drain_every: 16,
            half_life_steps: 64.0,
            max_swaps_per_layer: 4,
            max_swaps_per_step: 16,
            ..ControllerConfig::default()
        };
        let mut ctl = Controller::new(map, cfg).unwrap();
        let mut counter = PickCounterGpu::new(gpu, LAYERS, EXPERTS).unwrap();
        let picks_per_step = (LAYERS * TOKENS * TOP_K) as usize;
        let mut ids_host = PinnedBuffer::<i32>::zeroed(gpu.ctx(), picks_per_step).unwrap();
        let ids = DeviceBuffer::<i32>::zeroed(gpu.ctx(), picks_per_step).unwrap();
        let y = DeviceBuffer::<f32>::zeroed(gpu.ctx(), (LAYERS * TOKENS * dout) as usize).unwrap();
        let table = exec.table_ptr();
        let adaptive = matches!(mode, Mode::Adaptive);
        let (mut pre, mut post) = (Phase2::default(), Phase2::default());
        let mut draining = false;
        let mut rel_err = f64::NAN;
        for (step, picks) in trace.steps.iter().enumerate() {
            let t0 = Instant::now();
            let mut cold = 0u64;
            for (l, p) in picks.layers.iter().enumerate() {
                for (j, &e) in p.iter().enumerate() {
                    ids_host.as_mut_slice()[l * p.len() + j] = e as i32;
                    cold += !exec.bank().is_hot(l as u32, e) as u64;
                }
            }
            // SAFETY: both buffers hold picks_per_step i32; the host buffer is rewritten only
            // after the step's synchronize below.
            unsafe {
                copy_htod_async(
                    ids.device_ptr(),
                    ids_host.host_ptr() as *const u8,
                    picks_per_step * 4,
                    &s,
                )
                .unwrap()
            };
            y.zero_async(&s).unwrap();
            if adaptive {
                // the step's picks are all known here (trace-driven): count them on the counter's
                // branch stream, alongside the layers, and join before the drain
                let view = TopkIdsView {
                    ptr: ids.device_ptr(),
                    bytes: (picks_per_step * 4) as u64,
                    dtype: IdsDtype::I32,
                    shape: TopkShape::step(LAYERS, TOKENS, TOP_K),
                };
                counter.count_forked(&s, &view, 0).unwrap();
            }
            for l in 0..LAYERS {
                let layer_ids = ids.device_ptr() + (l * TOKENS * TOP_K * 4) as u64;
                let yprev = if l == 0 {
                    0u64
                } else {
                    y.device_ptr() + ((l - 1) * TOKENS * dout * 4) as u64
                };
                let yl = y.device_ptr() + (l * TOKENS * dout * 4) as u64;
                let (experts, k, din, gate, x0p) =
                    (EXPERTS, TOP_K, DIN, 1.0f32 / TOP_K as f32, x0.device_ptr());
                let cfg = LaunchConfig {
                    grid_dim: (16, TOKENS * TOP_K, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = s.launch_builder(f);
                b.arg(&table)
                    .arg(&l)
                    .arg(&experts)
                    .arg(&layer_ids)
                    .arg(&k)
                    .arg(&x0p)
                    .arg(&yprev)
                    .arg(&yl)
                    .arg(&din)
                    .arg(&dout)
                    .arg(&gate);
                // SAFETY: argument list matches moe_expert_gemv; ids/x0/y sized above; table
                // entries point at `expert_bytes` = dout * din f32 each; din <= 1024 (shared xs).
                unsafe { b.launch(cfg) }.unwrap();
            }
            if adaptive {
                counter.join_forked(&s).unwrap();
                if ctl.drain_due() && !draining {
                    counter.drain_async(&s).unwrap();
                    draining = true;
                }
            }
            s.synchronize().unwrap(); // the engine samples the next tokens here
            let mut secs = t0.elapsed().as_secs_f64();
            if step == 0 {
                rel_err = check_step(&exec, picks, &y.download().unwrap(), dout);
            }
            let t1 = Instant::now();
            if adaptive {
                let snap = if draining {
                    counter.poll_drain().unwrap().map(|d| d.counts.to_vec())
                } else {
                    None
                };
                if snap.is_some() {
                    draining = false;
                }
                ctl.step_with(snap.as_deref(), &mut exec).unwrap();
            }
            let ph = if step < shift_at { &mut pre } else { &mut post };
            secs += t1.elapsed().as_secs_f64();
            ph.secs += secs;
            ph.steps += 1;
            ph.picks += picks_per_step as u64;
            ph.cold += cold;
        }
        exec.flush().unwrap();
        if adaptive {
            ctl.step_with(None, &mut exec).unwrap();
        }
        let bad = exec.bank().mismatches().unwrap();
        assert_eq!(bad, 0, "HBM slots differ from host copies");
        Result {
            name,
            pre,
            post,
            applied: ctl.stats().applied,
            rel_err,
        }
    }

    /// CPU reference (f64) of one step of the layer stack, reading the host copies; returns
    /// ‖y_gpu − y_ref‖ / ‖y_ref‖ over all layers.
    fn check_step(
        exec: &GpuExecutor,
        picks: &tierkit_sim::experts::trace::StepPicks,
        y: &[f32],
        dout: u32,
    ) -> f64 {
        let (din, dout) = (DIN as usize, dout as usize);
        let mut prev: Vec<f64> = Vec::new();
        let (mut num, mut den) = (0f64, 0f64);
        for (l, p) in picks.layers.iter().enumerate() {
            let mut out = vec![0f64; TOKENS as usize * dout];
            for (j, &e) in p.iter().enumerate() {
                let t = j / TOP_K as usize;
                let x: Vec<f64> = (0..din)
                    .map(|i| {
                        if l == 0 {
                            x0_value(t, i) as f64
                        } else {
                            (prev[t * dout + i] as f32).tanh() as f64
                        }
                    })
                    .collect();
                let w = exec.bank().host_expert(l as u32, e).unwrap();
                for r in 0..dout {
                    let mut acc = 0f64;
                    for (i, xi) in x.iter().enumerate() {
                        let o = (r * din + i) * 4;
                        acc += f32::from_le_bytes([w[o], w[o + 1], w[o + 2], w[o + 3]]) as f64 * xi;
                    }
                    out[t * dout + r] += acc / TOP_K as f64;
                }
            }
            for (i, v) in out.iter().enumerate() {
                let g = y[l * TOKENS as usize * dout + i] as f64;
                num += (g - v) * (g - v);
                den += v * v;
            }
            // the next layer reads the GPU's own output (as the GPU did), so errors don't compound
            prev = (0..TOKENS as usize * dout)
                .map(|i| y[l * TOKENS as usize * dout + i] as f64)
                .collect();
        }
        (num / den).sqrt()
    }

    fn x0_value(t: usize, i: usize) -> f32 {
        ((t * 131 + i * 31) % 97) as f32 / 97.0 - 0.5
    }

    pub fn main() {
        let Some(gpu) = gpu_or_skip() else { return };
        let args: Vec<String> = std::env::args().collect();
        let arg = |name: &str, default: u64| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let steps = arg("--steps", 600);
        let expert_bytes = arg("--expert-mib", 2) << 20;
        let shift_at = steps / 3;
        println!(
            "device {} | {LAYERS} layers x {EXPERTS} experts x {} MiB, {HOT} hot, top-{TOP_K}, {TOKENS} tokens/step, {steps} steps, github -> book at step {shift_at}",
            gpu.name().unwrap(),
            expert_bytes >> 20
        );
        let f = gpu
            .function(&MOE_SRC, "moe_expert_gemv")
            .expect("compile example kernel");
        let trace = synth("github-to-book", steps, &["github", "book"], shift_at, 42);
        let offline = synth("github-offline", 400, &["github"], 400, 7);
        let geo = Geometry::new(LAYERS, EXPERTS, HOT, expert_bytes).unwrap();
        let dump = tierkit_sim::experts::counter_dump(&offline, 0..offline.steps.len()).unwrap();
        let seed_map = fit_seed_map("moe_gpu-seed", &geo, &dump).unwrap();
        let x0h: Vec<f32> = (0..TOKENS as usize * DIN as usize)
            .map(|j| x0_value(j / DIN as usize, j % DIN as usize))
            .collect();
        let x0 = DeviceBuffer::from_host(gpu.ctx(), &x0h).unwrap();
        let mut results = Vec::new();
        for mode in [Mode::AllHbm, Mode::Static, Mode::Seed, Mode::Adaptive] {
            let r = run_mode(
                &gpu,
                &f,
                &trace,
                shift_at as usize,
                mode,
                &seed_map,
                expert_bytes,
                &x0,
            );
            println!(
                "  done: {} (step-0 rel. error vs f64 CPU reference {:.2e})",
                r.name, r.rel_err
            );
            assert!(
                r.rel_err < 1e-4,
                "GPU output differs from the CPU reference"
            );
            results.push(r);
        }
        let tps = |p: &Phase2| TOKENS as f64 * p.steps as f64 / p.secs;
        let cs = |p: &Phase2| 100.0 * p.cold as f64 / p.picks as f64;
        println!("\n| mode | tokens/s before shift | cold share before | tokens/s after shift | cold share after | swaps applied |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for r in &results {
            println!(
                "| {} | {:.0} | {:.1}% | {:.0} | {:.1}% | {} |",
                r.name,
                tps(&r.pre),
                cs(&r.pre),
                tps(&r.post),
                cs(&r.post),
                r.applied
            );
        }
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    run::main();
    #[cfg(not(feature = "cuda"))]
    println!("SKIP: no CUDA device (built without the `cuda` feature; pass --features cuda)");
}
