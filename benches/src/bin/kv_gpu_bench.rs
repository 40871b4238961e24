//! kv_gpu_bench: the kv-elastic GPU resolver on a real device (release build, CUDA events, medians).
//!
//! ```text
//! cargo run --release -p tierkit-benches --features cuda --bin kv_gpu_bench [-- --reps N] [--mode peer]
//! ```
//!
//! `--mode peer`: the library's resolve kernel (its default choice) against SGLang HiSparse's swap-in kernel (read from the released wheel, `--peer-source`)
//! on the issue-13 cases (hot 2048 / 4096 / 8192, history 16K-128K, hit-only first-set and scattered
//! steps, 9.5% and 25.9% misses, all resident), plain launch, CUDA graph and bookkeeping (the copy left
//! out, plain and in a graph); see `kv_gpu_bench/peer.rs`. `--mode admit`: a 500K-token history admitted on the copy
//! stream while decode steps run (copy time, GB/s, step time with and without it; see
//! `kv_gpu_bench/admit.rs`; `--reps` caps at 5 admissions per fill back-end; `--mode admit-import`:
//! its import rows alone, issue 29's figures). Default
//! (`--mode all`): the table below.
//!
//! Batch 64, top-k 2048, 656-byte rows (DeepSeek fp8 MLA), 4 layers. Prints one table with the
//! ratios to the measured ceilings of `docs/h200-ceilings.md` (zero-copy gather of 656 B rows:
//! 46.4 GB/s; pinned H2D: 55.6 GB/s):
//! 1. direct path: 64 × 2048 picks, whole history resident (borrowed pages) — resolve time, and
//!    the block-table conversion a fully resident engine runs instead;
//! 2. miss fetch at 0 / 10 / 30% misses (fresh positions replace that share of each request's set
//!    every step), gather back-end (inside the fused kernel) and DMA back-end (`cuMemcpyBatchAsync`
//!    of the plan), plus a plain warp-per-row gather of 32,768 rows (the ceiling's shape);
//! 3. decode-step microbenchmark (one resolve filling the layer group's 4 layers + gather-and-dot
//!    attention over them) against the fully resident step (block-table conversion + the same
//!    attention);
//! 4. candidate prefetch: a 4,096-position pool announced at the group's first layer, prefetched
//!    on a side stream into the group's 4 layers while layer 0's attention runs; demand misses of
//!    layers 1–3, which pick their own positions in the same group (each resolve fills all 4).
//!
//! The pools here declare the 4 layers one layer group (`LayerGroups::one`): one hot cache, and
//! every resolve or prefetch fills all four planes.
//!
//! Without a device it prints `SKIP: no CUDA device`; without the `cuda` feature, how to build it.

#[cfg(not(feature = "cuda"))]
fn main() {
    println!(
        "SKIP: built without the `cuda` feature; build with `--features cuda` \
         (cargo run --release -p tierkit-benches --features cuda --bin kv_gpu_bench)"
    );
}

#[cfg(feature = "cuda")]
fn main() {
    if let Err(e) = bench::run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda")]
#[path = "kv_gpu_bench/peer.rs"]
mod peer;

#[cfg(feature = "cuda")]
#[path = "kv_gpu_bench/admit.rs"]
mod admit;

#[cfg(feature = "cuda")]
mod bench {
    use std::collections::HashSet;
    use std::sync::Arc;

    use cuda_kernels::cudarc_driver::sys::{
        CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode,
    };
    use cuda_kernels::cudarc_driver::{CudaEvent, CudaStream};
    use cuda_kernels::{CopyBackend, KvCopy, KvResolveArgs, KV_STATS};
    use cuda_kernels::{CudaError, DeviceBuffer, Gpu};
    use kv_elastic::gpu::{GpuElasticPool, GpuPoolConfig};
    use kv_elastic::{Geometry, LayerGroups, PoolConfig};
    use tierkit_testkit::{pattern_tokens, KvStandins};

    pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

    pub(crate) const REQS: usize = 64;
    pub(crate) const K: usize = 2048;
    pub(crate) const ROW: u32 = 656;
    const LAYERS: u32 = 4;
    pub(crate) const GATHER_CEIL: f64 = 46.4; // GB/s, docs/h200-ceilings.md
    pub(crate) const H2D_CEIL: f64 = 55.6; // GB/s

    pub(crate) fn cu(
        call: &'static str,
    ) -> impl Fn(cuda_kernels::cudarc_driver::DriverError) -> CudaError {
        move |e| CudaError::driver(call, e)
    }

    pub(crate) fn median(v: &mut [f64]) -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    }

    pub(crate) struct Ev {
        a: CudaEvent,
        b: CudaEvent,
    }
    impl Ev {
        pub(crate) fn new(gpu: &Gpu) -> Res<Self> {
            let f = Some(CUevent_flags::CU_EVENT_DEFAULT);
            Ok(Ev {
                a: gpu.ctx().new_event(f).map_err(cu("cuEventCreate"))?,
                b: gpu.ctx().new_event(f).map_err(cu("cuEventCreate"))?,
            })
        }
        pub(crate) fn start(&self, s: &CudaStream) -> Res<()> {
            self.a.record(s).map_err(cu("cuEventRecord"))?;
            Ok(())
        }
        /// Records the end and returns the elapsed microseconds (waits for the end event).
        pub(crate) fn stop_us(&self, s: &CudaStream) -> Res<f64> {
            self.b.record(s).map_err(cu("cuEventRecord"))?;
            Ok(self
                .a
                .elapsed_ms(&self.b)
                .map_err(cu("cuEventElapsedTime"))? as f64
                * 1e3)
        }
    }

    /// Per-session selection with controlled churn: each step replaces `rate` of the set with fresh
    /// positions (a running counter over `[0, limit)`, skipping positions in the set). The set has
    /// `K` positions, or `width` ids of another unit ([`Churn::with_width`]: block ids).
    pub(crate) struct Churn {
        sets: Vec<Vec<i32>>,
        next: Vec<u32>,
        limit: u32,
        rng: u64,
        width: usize,
    }

    pub(crate) fn mix(x: &mut u64) -> u64 {
        *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    impl Churn {
        pub(crate) fn new(limit: u32, seed: u64) -> Self {
            Self::with_width(limit, seed, K)
        }
        /// Sets of `width` ids below `limit` per session.
        pub(crate) fn with_width(limit: u32, seed: u64, width: usize) -> Self {
            let mut c = Churn {
                sets: vec![Vec::new(); REQS],
                next: (0..REQS as u32).map(|r| (r * 7919) % limit).collect(),
                limit,
                rng: seed,
                width,
            };
            for r in 0..REQS {
                let set: Vec<i32> = (0..width).map(|_| c.fresh(r, &HashSet::new())).collect();
                c.sets[r] = set;
            }
            c
        }
        fn fresh(&mut self, r: usize, avoid: &HashSet<i32>) -> i32 {
            loop {
                let p = self.next[r] as i32;
                self.next[r] = (self.next[r] + 1) % self.limit;
                if !avoid.contains(&p) {
                    return p;
                }
            }
        }
        /// Next step's picks, `[REQS][width]` flattened.
        pub(crate) fn step(&mut self, rate: f64) -> Vec<i32> {
            let n = (rate * self.width as f64).round() as usize;
            let mut out = Vec::with_capacity(REQS * self.width);
            for r in 0..REQS {
                let mut set = std::mem::take(&mut self.sets[r]);
                let mut present: HashSet<i32> = set.iter().copied().collect();
                for _ in 0..n {
                    let i = (mix(&mut self.rng) % self.width as u64) as usize;
                    let p = self.fresh(r, &present);
                    present.remove(&set[i]);
                    present.insert(p);
                    set[i] = p;
                }
                // Shuffle-free: order within a row does not matter to the kernels.
                out.extend_from_slice(&set);
                self.sets[r] = set;
            }
            out
        }
        /// `n` fresh positions per session (not in the current set), `[REQS][n]` flattened.
        fn fresh_pool(&mut self, n: usize) -> Vec<i32> {
            let mut out = Vec::with_capacity(REQS * n);
            for r in 0..REQS {
                let present: HashSet<i32> = self.sets[r].iter().copied().collect();
                for _ in 0..n {
                    out.push(self.fresh(r, &present));
                }
            }
            out
        }
    }

    pub(crate) struct Setup {
        pub(crate) pool: GpuElasticPool,
        pub(crate) slots: DeviceBuffer<i32>,
        pub(crate) qsl: DeviceBuffer<i32>,
        pub(crate) seq: DeviceBuffer<i32>,
        pub(crate) history: u32,
        pub(crate) block_table: DeviceBuffer<i32>,
        pub(crate) max_blocks: u32,
    }

    /// A pool of `REQS` sessions of `history` tokens over `layers` layers (elastic: the whole
    /// history in borrowed pages). Admitted 8 sessions at a time (bounded host memory).
    pub(crate) fn setup(
        gpu: &Arc<Gpu>,
        hot_rows: u32,
        history: u32,
        elastic: bool,
        layers: u32,
    ) -> Res<Setup> {
        let mut g = Geometry {
            row_bytes: ROW,
            layers,
            page_rows: 64,
            arena_pages: 0,
            hot_rows,
            tail_rows: 64,
            scratch_rows: 0,
            // The bench's layers share one hot cache (a shared-index group; section 4's layers
            // pick their own positions in it): every resolve fills all of them.
            layer_groups: LayerGroups::one(),
        };
        let hist_pages = if elastic { history / 64 } else { 0 };
        g.arena_pages = REQS as u32 * (g.fixed_pages() + hist_pages) + 4;
        let gcfg = GpuPoolConfig {
            max_sessions: REQS as u32,
            max_history: history,
            backend: CopyBackend::Gather,
        };
        let mut pool = GpuElasticPool::new(gpu, g, PoolConfig { elastic }, gcfg)?;
        let t0 = std::time::Instant::now();
        for chunk in (1..=REQS as u64).collect::<Vec<_>>().chunks(8) {
            let hists: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&s| pattern_tokens(g.row_bytes, g.layers, s, 0, history))
                .collect();
            let batch: Vec<(u64, &[u8])> = chunk
                .iter()
                .zip(&hists)
                .map(|(&s, h)| (s, h.as_slice()))
                .collect();
            pool.admit_batch(&batch)?;
        }
        eprintln!(
            "setup: hot {hot_rows}, history {history}, elastic {elastic}: {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        let ctx = gpu.ctx();
        let slots: Vec<i32> = (1..=REQS as u64)
            .map(|s| pool.slot_of(s).map(|b| b as i32))
            .collect::<Result<_, _>>()?;
        let qsl: Vec<i32> = (0..=REQS as i32).collect();
        let max_blocks = history / 64;
        let mut bt = vec![-1i32; REQS * max_blocks as usize];
        for s in 1..=REQS as u64 {
            let pl = pool.cpu().placement(s)?;
            for (j, &p) in pl.page_table.iter().enumerate() {
                bt[(s as usize - 1) * max_blocks as usize + j] = p;
            }
        }
        Ok(Setup {
            slots: DeviceBuffer::from_host(ctx, &slots)?,
            qsl: DeviceBuffer::from_host(ctx, &qsl)?,
            seq: DeviceBuffer::from_host(ctx, &vec![history as i32; REQS])?,
            block_table: DeviceBuffer::from_host(ctx, &bt)?,
            max_blocks,
            history,
            pool,
        })
    }

    /// Output buffers of one resolve.
    pub(crate) struct Out {
        pub(crate) idx: DeviceBuffer<i32>,
        pub(crate) valid: DeviceBuffer<i32>,
        pub(crate) plan: DeviceBuffer<KvCopy>,
        pub(crate) count: DeviceBuffer<u32>,
        pub(crate) stats: DeviceBuffer<u32>,
    }
    impl Out {
        pub(crate) fn new(gpu: &Gpu, hot: u32) -> Res<Self> {
            let ctx = gpu.ctx();
            Ok(Out {
                idx: DeviceBuffer::zeroed(ctx, REQS * K)?,
                valid: DeviceBuffer::zeroed(ctx, REQS)?,
                plan: DeviceBuffer::zeroed(ctx, REQS * hot as usize)?,
                count: DeviceBuffer::zeroed(ctx, REQS)?,
                stats: DeviceBuffer::zeroed(ctx, REQS * KV_STATS)?,
            })
        }
        pub(crate) fn args(&self, s: &Setup, topk: u64, layer: u32) -> KvResolveArgs {
            KvResolveArgs {
                topk,
                query_start_loc: s.qsl.device_ptr(),
                seq_lens: s.seq.device_ptr(),
                session_slot: s.slots.device_ptr(),
                sessions: REQS as u32,
                rows: REQS as u32,
                k: K as u32,
                layer,
                indices: self.idx.device_ptr(),
                valid_count: self.valid.device_ptr(),
                plan: self.plan.device_ptr(),
                plan_count: self.count.device_ptr(),
                stats: self.stats.device_ptr(),
            }
        }
        pub(crate) fn misses(&self) -> Res<u64> {
            Ok(self.count.download()?.iter().map(|&c| c as u64).sum())
        }
    }

    /// Four steps of `REQS × K` distinct random positions below `limit` each (seeded).
    pub(crate) fn resident_sets(limit: u32, seed: u64) -> Vec<Vec<i32>> {
        let mut rng = seed;
        (0..4)
            .map(|_| {
                let mut v = Vec::with_capacity(REQS * K);
                for _ in 0..REQS {
                    let mut seen = HashSet::new();
                    while seen.len() < K {
                        seen.insert((mix(&mut rng) % limit as u64) as i32);
                    }
                    v.extend(seen);
                }
                v
            })
            .collect()
    }

    pub(crate) fn upload_steps(gpu: &Gpu, steps: &[Vec<i32>]) -> Res<DeviceBuffer<i32>> {
        let flat: Vec<i32> = steps.iter().flatten().copied().collect();
        Ok(DeviceBuffer::from_host(gpu.ctx(), &flat)?)
    }

    pub(crate) fn at(buf: &DeviceBuffer<i32>, step: usize) -> u64 {
        buf.device_ptr() + (step * REQS * K * 4) as u64
    }

    /// A markdown table; the first row is the header.
    pub(crate) struct Table(pub(crate) Vec<Vec<String>>);
    impl Table {
        fn row(&mut self, what: &str, time: String, figure: String, note: String) {
            self.0.push(vec![what.into(), time, figure, note]);
        }
        pub(crate) fn print(&self) {
            let cols = self.0.iter().map(Vec::len).max().unwrap_or(0);
            let cell = |r: &Vec<String>, c: usize| r.get(c).cloned().unwrap_or_default();
            let w: Vec<usize> = (0..cols)
                .map(|c| {
                    self.0
                        .iter()
                        .map(|r| cell(r, c).chars().count())
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            for (i, r) in self.0.iter().enumerate() {
                let cells: Vec<String> = (0..cols)
                    .map(|c| format!("{:<w$}", cell(r, c), w = w[c]))
                    .collect();
                println!("| {} |", cells.join(" | "));
                if i == 0 {
                    let dashes: Vec<String> = w.iter().map(|&n| "-".repeat(n)).collect();
                    println!("| {} |", dashes.join(" | "));
                }
            }
        }
    }

    /// The launch floor of the all-resident step: the lab's empty kernel with the launch shape
    /// the library uses for `s`'s decode call (512 threads, `REQS + 1` blocks, the lean kernels'
    /// dynamic shared memory), `n` launches plain and `n` in a CUDA graph; median µs of each.
    pub(crate) fn empty_launch_floor(
        gpu: &Arc<Gpu>,
        s: &Setup,
        _out: &Out,
        n: usize,
    ) -> Res<(f64, f64)> {
        let lab = tierkit_testkit::KvLab::new(gpu)?;
        let dev = s.pool.device();
        let (d, t) = (*dev.dims(), dev.tables(0)?);
        // The launcher's formula (cuda-kernels/src/kv/launch.rs): bitmaps, fixed pages, victim table.
        let smem = 8 * d.hot_rows.div_ceil(32)
            + 4 * d.fixed_pages
            + if d.hot_rows <= 8192 {
                2 * d.hot_rows
            } else {
                0
            };
        let st = gpu.stream().clone();
        let ev = Ev::new(gpu)?;
        let mut plain = Vec::new();
        for _ in 0..n {
            ev.start(&st)?;
            lab.launch_empty(&st, &d, &t, REQS as u32, 512, smem)?;
            plain.push(ev.stop_us(&st)?);
        }
        st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cu("cuStreamBeginCapture"))?;
        let launched = lab.launch_empty(&st, &d, &t, REQS as u32, 512, smem);
        let graph = st
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(cu("cuStreamEndCapture"))?;
        launched?;
        let graph = graph.ok_or("empty graph")?;
        let mut in_graph = Vec::new();
        for _ in 0..n {
            ev.start(&st)?;
            graph.launch().map_err(cu("cuGraphLaunch"))?;
            in_graph.push(ev.stop_us(&st)?);
        }
        Ok((median(&mut plain), median(&mut in_graph)))
    }

    pub fn run() -> Res<()> {
        let mode = std::env::args()
            .skip_while(|a| a != "--mode")
            .nth(1)
            .unwrap_or_else(|| "all".into());
        const MODES: &str = "all, peer, peer-resident, admit, admit-import";
        if !MODES.split(", ").any(|m| m == mode) {
            // Refused with or without a device (the match below keeps its own arm for safety).
            return Err(format!("unknown --mode {mode} ({MODES})").into());
        }
        // The peer's source first: a missing one is refused with or without a device.
        let peer = if mode.starts_with("peer") {
            Some(crate::peer::PeerArgs::from_args()?)
        } else {
            None
        };
        let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
            return Ok(());
        };
        if std::env::args().any(|a| a == "--lineinfo") {
            gpu.set_line_info(true); // source lines for compute-sanitizer / Nsight Compute
        }
        let reps: usize = std::env::args()
            .skip_while(|a| a != "--reps")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        match (mode.as_str(), &peer) {
            ("all", _) => {}
            ("peer", Some(p)) => return crate::peer::run(&gpu, reps, p),
            ("peer-resident", Some(p)) => return crate::peer::run_resident(&gpu, reps, p),
            ("admit", _) => return crate::admit::run(&gpu, reps, false),
            ("admit-import", _) => return crate::admit::run(&gpu, reps, true),
            (other, _) => return Err(format!("unknown --mode {other} ({MODES})").into()),
        }
        let warm = 3;
        let standins = KvStandins::new(&gpu)?;
        let s = gpu.stream().clone();
        let ev = Ev::new(&gpu)?;
        println!(
            "device: {} ({}), batch {REQS}, top-k {K}, rows {ROW} B, layers {LAYERS}, {reps} timed reps (median)",
            gpu.name()?,
            gpu.arch()
        );
        let mut t = Table(vec![vec![
            "measurement".into(),
            "median".into(),
            "figure".into(),
            "vs ceiling / target".into(),
        ]]);

        // ---------- 1. direct path + 3. low-load decode step (whole history resident) ----------
        let full = setup(&gpu, 2048, 4096, true, LAYERS)?;
        let tail_start = full.history - 64;
        let sets = resident_sets(tail_start, 42);
        let picks = upload_steps(&gpu, &sets)?;
        let out = Out::new(&gpu, 2048)?;
        let dev = full.pool.device();
        gpu.synchronize()?;
        let mut tv = Vec::new();
        let mut tb = Vec::new();
        for i in 0..warm + 5 * reps {
            let a = out.args(&full, at(&picks, i % 4), 0);
            ev.start(&s)?;
            // SAFETY: buffers of `out`/`full`/`picks` are live and shaped for REQS x K.
            unsafe { dev.resolve_async(&s, &a, CopyBackend::Gather)? };
            let us = ev.stop_us(&s)?;
            ev.start(&s)?;
            // SAFETY: as above; block table [REQS][max_blocks].
            unsafe {
                standins.resident_indices_async(
                    &s,
                    at(&picks, i % 4),
                    full.qsl.device_ptr(),
                    full.seq.device_ptr(),
                    full.block_table.device_ptr(),
                    full.max_blocks,
                    64,
                    REQS as u32,
                    K as u32,
                    out.idx.device_ptr(),
                    out.valid.device_ptr(),
                )?
            };
            let ub = ev.stop_us(&s)?;
            if i >= warm {
                tv.push(us);
                tb.push(ub);
            }
        }
        assert_eq!(out.misses()?, 0, "direct path must not fetch");
        let st = out.stats.download()?;
        let direct: u32 = st.chunks(KV_STATS).map(|c| c[6]).sum();
        let direct_us = median(&mut tv);
        t.row(
            "resolve, direct path (64 x 2048, all resident)",
            format!("{direct_us:.1} us"),
            format!("{direct} / {REQS} requests direct"),
            format!(
                "target <= 20 us: {}",
                if direct_us <= 20.0 { "met" } else { "MISSED" }
            ),
        );
        // The same resolve captured once in a CUDA graph and replayed (fixed buffers).
        {
            use cuda_kernels::cudarc_driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
            let a = out.args(&full, at(&picks, 0), 0);
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .map_err(cu("cuStreamBeginCapture"))?;
            // SAFETY: as above; the buffers outlive the graph.
            unsafe { dev.resolve_async(&s, &a, CopyBackend::Gather)? };
            let graph = s
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(cu("cuStreamEndCapture"))?
                .ok_or("empty graph")?;
            let mut tg = Vec::new();
            for i in 0..warm + 5 * reps {
                ev.start(&s)?;
                graph.launch().map_err(cu("cuGraphLaunch"))?;
                let us = ev.stop_us(&s)?;
                if i >= warm {
                    tg.push(us);
                }
            }
            t.row(
                "resolve, direct path, CUDA graph replay",
                format!("{:.1} us", median(&mut tg)),
                String::new(),
                "target <= 20 us".into(),
            );
        }
        t.row(
            "block-table conversion (fully resident engine)",
            format!("{:.1} us", median(&mut tb)),
            String::new(),
            "baseline".into(),
        );

        // Decode step: resident vs elastic at low load.
        let q: Vec<f32> = (0..ROW).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let qd = DeviceBuffer::from_host(gpu.ctx(), &q)?;
        let att = DeviceBuffer::<f32>::zeroed(gpu.ctx(), REQS)?;
        let attend_all = |dev: &kv_elastic::gpu::GpuArena, o: &Out| -> Res<()> {
            for l in 0..LAYERS {
                // SAFETY: indices/valid of `o` hold rows inside the arena or -1; q/att sized.
                unsafe {
                    standins.attend_async(
                        &s,
                        dev.plane_ptr(l)?,
                        dev.dims().row_bytes,
                        o.idx.device_ptr(),
                        o.valid.device_ptr(),
                        REQS as u32,
                        K as u32,
                        qd.device_ptr(),
                        att.device_ptr(),
                    )?
                };
            }
            Ok(())
        };
        let (mut tr, mut te) = (Vec::new(), Vec::new());
        for i in 0..warm + 3 * reps {
            let a = out.args(&full, at(&picks, i % 4), 0);
            ev.start(&s)?;
            // SAFETY: as above.
            unsafe {
                standins.resident_indices_async(
                    &s,
                    at(&picks, i % 4),
                    full.qsl.device_ptr(),
                    full.seq.device_ptr(),
                    full.block_table.device_ptr(),
                    full.max_blocks,
                    64,
                    REQS as u32,
                    K as u32,
                    out.idx.device_ptr(),
                    out.valid.device_ptr(),
                )?
            };
            attend_all(dev, &out)?;
            let ur = ev.stop_us(&s)?;
            ev.start(&s)?;
            // SAFETY: as above.
            unsafe { dev.resolve_async(&s, &a, CopyBackend::Gather)? };
            attend_all(dev, &out)?;
            let ue = ev.stop_us(&s)?;
            if i >= warm {
                tr.push(ur);
                te.push(ue);
            }
        }
        let resident_step = median(&mut tr);
        let low_step = median(&mut te);
        t.row(
            "decode step, fully resident (convert + 4 x attend)",
            format!("{resident_step:.1} us"),
            String::new(),
            "baseline".into(),
        );
        t.row(
            "decode step, elastic low load (resolve + 4 x attend)",
            format!("{low_step:.1} us"),
            format!(
                "{:+.2}% vs resident",
                (low_step / resident_step - 1.0) * 100.0
            ),
            format!(
                "target within 2%: {}",
                if low_step <= resident_step * 1.02 {
                    "met"
                } else {
                    "MISSED"
                }
            ),
        );
        drop(out);
        drop(picks);
        drop(full);

        // ---------- 2. miss fetch, 3. high-load step, 4. prefetch (fixed hot cache) ----------
        let hot = setup(&gpu, 8192, 16384, false, LAYERS)?;
        let dev = hot.pool.device();
        let out = Out::new(&gpu, 8192)?;
        let mut churn = Churn::new(hot.history - 64, 7);
        // Plain gather of 32,768 random rows (the ceiling's shape): 64 segments x 512 rows.
        {
            let mut copies = Vec::with_capacity(32768);
            let mut rng = 9u64;
            for r in 0..REQS as u32 {
                for i in 0..512u32 {
                    copies.push(KvCopy {
                        slot: r,
                        position: (mix(&mut rng) % (hot.history as u64 - 64)) as u32,
                        // rows of a scratch region: the plan buffer's own hot rows are not touched
                        dst_row: r * 512 + i,
                        pad: 0,
                    });
                }
            }
            let pb = DeviceBuffer::from_host(gpu.ctx(), &copies)?;
            let cb = DeviceBuffer::from_host(gpu.ctx(), &vec![512u32; REQS])?;
            gpu.synchronize()?;
            let mut tt = Vec::new();
            for i in 0..warm + reps {
                ev.start(&s)?;
                // SAFETY: 64 segments of 512 entries; destination rows inside the arena (layer 3's
                // plane, rows 0..32768: hot rows not yet filled and tail rows no pick reads). The
                // kernel's unchecked copy (the arena's replay copies only rows a hot cache maps).
                unsafe {
                    dev.kernels().replay_async(
                        &s,
                        dev.dims(),
                        &dev.tables(0)?,
                        pb.device_ptr(),
                        cb.device_ptr(),
                        64,
                        512,
                        3,
                        1,
                    )?
                };
                let us = ev.stop_us(&s)?;
                if i >= warm {
                    tt.push(us);
                }
            }
            let us = median(&mut tt);
            let gbs = 32768.0 * ROW as f64 / (us * 1e3);
            t.row(
                "plain gather, 32,768 random rows (replay kernel)",
                format!("{us:.1} us"),
                format!("{gbs:.1} GB/s"),
                format!("{:.0}% of 46.4 GB/s", gbs / GATHER_CEIL * 100.0),
            );
        }
        // Warm the hot cache with the initial set (all misses once).
        let init = upload_steps(&gpu, &[churn.step(0.0)])?;
        gpu.synchronize()?;
        // SAFETY: live buffers shaped for REQS x K.
        unsafe { dev.resolve_async(&s, &out.args(&hot, at(&init, 0), 0), CopyBackend::Gather)? };
        s.synchronize().map_err(cu("cuStreamSynchronize"))?;

        let mut zero_us = 0.0;
        for (rate, label) in [(0.0, "0%"), (0.10, "10%"), (0.30, "30%")] {
            let steps: Vec<Vec<i32>> = (0..warm + reps).map(|_| churn.step(rate)).collect();
            let p = upload_steps(&gpu, &steps)?;
            gpu.synchronize()?;
            let (mut tt, mut bytes) = (Vec::new(), Vec::new());
            for i in 0..warm + reps {
                ev.start(&s)?;
                // SAFETY: as above.
                unsafe {
                    dev.resolve_async(&s, &out.args(&hot, at(&p, i), 0), CopyBackend::Gather)?
                };
                let us = ev.stop_us(&s)?;
                let m = out.misses()?;
                if i >= warm {
                    tt.push(us);
                    bytes.push(m as f64 * ROW as f64);
                }
            }
            let us = median(&mut tt);
            let b = median(&mut bytes);
            if rate == 0.0 {
                zero_us = us;
                t.row(
                    "resolve, 0% misses (hot-cache hits, bookkeeping only)",
                    format!("{us:.1} us"),
                    String::new(),
                    String::new(),
                );
                continue;
            }
            let gbs = b / (us * 1e3);
            let net = b / ((us - zero_us).max(1e-3) * 1e3);
            t.row(
                &format!("resolve + gather fetch, {label} misses"),
                format!("{us:.1} us"),
                format!(
                    "{:.0} rows/step, {gbs:.1} GB/s (net of 0%: {net:.1})",
                    b / ROW as f64
                ),
                format!(
                    "{:.0}% of 46.4 GB/s gather ceiling (target >= 85%: {})",
                    gbs / GATHER_CEIL * 100.0,
                    if gbs >= 0.85 * GATHER_CEIL {
                        "met"
                    } else {
                        "MISSED"
                    }
                ),
            );
            // DMA back-end on fresh steps of the same rate: place on the device (fetch = 0), then one
            // cuMemcpyBatchAsync of the plan.
            let steps: Vec<Vec<i32>> = (0..warm + reps).map(|_| churn.step(rate)).collect();
            let p = upload_steps(&gpu, &steps)?;
            gpu.synchronize()?;
            let (mut tr, mut td, mut td2, mut bd) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for i in 0..warm + reps {
                ev.start(&s)?;
                // SAFETY: as above.
                unsafe { dev.resolve_async(&s, &out.args(&hot, at(&p, i), 0), CopyBackend::Dma)? };
                let ur = ev.stop_us(&s)?;
                let counts = out.count.download()?;
                let plan = out.plan.download()?;
                let mut copies = Vec::new();
                for (r, &c) in counts.iter().enumerate() {
                    copies.extend_from_slice(&plan[r * 8192..r * 8192 + c as usize]);
                }
                // Alternate the copy hint (overlap-with-compute preferred / driver default).
                ev.start(&s)?;
                dev.dma_copy_async_with(&s, &copies, 0, 1, i % 2 == 0)?;
                let ud = ev.stop_us(&s)?;
                if i >= warm {
                    tr.push(ur);
                    if i % 2 == 0 {
                        td.push(ud);
                    } else {
                        td2.push(ud);
                    }
                    bd.push(copies.len() as f64 * ROW as f64);
                }
            }
            let (ur, ud, b) = (median(&mut tr), median(&mut td), median(&mut bd));
            let ud2 = median(&mut td2);
            t.row(
                &format!("DMA back-end, {label} misses, driver-default hint"),
                format!("{ud2:.1} us"),
                format!("{:.1} GB/s copy only", b / (ud2 * 1e3)),
                format!(
                    "{:.0}% of 55.6 GB/s H2D",
                    b / (ud2 * 1e3) / H2D_CEIL * 100.0
                ),
            );
            let gbs = b / (ud * 1e3);
            t.row(
                &format!("DMA back-end, {label} misses: place + batch copy (overlap hint)"),
                format!("{ur:.1} + {ud:.1} us"),
                format!(
                    "{gbs:.1} GB/s copy only ({:.0} descriptors)",
                    b / ROW as f64
                ),
                format!(
                    "{:.0}% of 55.6 GB/s H2D, {:.0}% of 46.4 GB/s gather",
                    gbs / H2D_CEIL * 100.0,
                    gbs / GATHER_CEIL * 100.0
                ),
            );
        }

        // High-load decode step: one resolve fills the group's 4 layers + attention over them.
        for (rate, label) in [(0.10, "10%"), (0.30, "30%")] {
            let steps: Vec<Vec<i32>> = (0..warm + reps).map(|_| churn.step(rate)).collect();
            let p = upload_steps(&gpu, &steps)?;
            gpu.synchronize()?;
            let mut tt = Vec::new();
            for i in 0..warm + reps {
                ev.start(&s)?;
                // SAFETY: as above; the plan is the resolve's own output (fresh).
                unsafe {
                    dev.resolve_async(&s, &out.args(&hot, at(&p, i), 0), CopyBackend::Gather)?;
                }
                attend_all(dev, &out)?;
                let us = ev.stop_us(&s)?;
                if i >= warm {
                    tt.push(us);
                }
            }
            let us = median(&mut tt);
            t.row(
                &format!("decode step, elastic {label} misses (resolve fills 4 layers)"),
                format!("{us:.1} us"),
                format!("+{:.1} us vs resident", us - resident_step),
                format!(
                    "{:.1}% of the resident step",
                    (us / resident_step - 1.0) * 100.0
                ),
            );
        }

        // Prefetch: pool of 4,096 candidates (current set + 2,048 fresh) announced at layer 0;
        // layers 1..3 pick 2,048 of the pool (half from the fresh part).
        let side = gpu.new_stream()?;
        let pool_n = 4096usize;
        let ctx = gpu.ctx();
        let cand_count = DeviceBuffer::from_host(ctx, &vec![pool_n as u32; REQS])?;
        let pf_plan = DeviceBuffer::<KvCopy>::zeroed(ctx, REQS * 8192)?;
        let pf_count = DeviceBuffer::<u32>::zeroed(ctx, REQS)?;
        let later: Vec<Out> = (0..LAYERS - 1)
            .map(|_| Out::new(&gpu, 8192))
            .collect::<Res<_>>()?;
        for prefetch in [false, true] {
            let (mut tt, mut demand, mut pf_rows) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..warm + reps {
                let p0 = churn.step(0.3);
                let fresh = churn.fresh_pool(pool_n - K);
                let mut cand = Vec::with_capacity(REQS * pool_n);
                let mut lp: Vec<Vec<i32>> = (0..3).map(|_| Vec::with_capacity(REQS * K)).collect();
                for r in 0..REQS {
                    let c0 = &p0[r * K..(r + 1) * K];
                    let f = &fresh[r * (pool_n - K)..(r + 1) * (pool_n - K)];
                    cand.extend_from_slice(c0);
                    cand.extend_from_slice(f);
                    for (l, v) in lp.iter_mut().enumerate() {
                        let o = (l * 331 + i * 17) % K;
                        v.extend((0..K / 2).map(|j| c0[(o + j) % K]));
                        v.extend((0..K / 2).map(|j| f[(o + j) % (pool_n - K)]));
                    }
                }
                let p0d = DeviceBuffer::from_host(ctx, &p0)?;
                let cd = DeviceBuffer::from_host(ctx, &cand)?;
                let lpd: Vec<DeviceBuffer<i32>> = lp
                    .iter()
                    .map(|v| DeviceBuffer::from_host(ctx, v))
                    .collect::<Result<_, _>>()?;
                gpu.synchronize()?;
                ev.start(&s)?;
                // SAFETY: live buffers of the documented shapes; the side stream's prefetch is
                // ordered after layer 0's resolve and before layers 1..3 by events.
                unsafe {
                    dev.resolve_async(
                        &s,
                        &out.args(&hot, p0d.device_ptr(), 0),
                        CopyBackend::Gather,
                    )?;
                    if prefetch {
                        let e0 = s.record_event(None).map_err(cu("cuEventRecord"))?;
                        side.wait(&e0).map_err(cu("cuStreamWaitEvent"))?;
                        dev.prefetch_async(
                            &side,
                            hot.slots.device_ptr(),
                            cd.device_ptr(),
                            cand_count.device_ptr(),
                            REQS as u32,
                            pool_n as u32,
                            0,
                            pf_plan.device_ptr(),
                            pf_count.device_ptr(),
                        )?;
                    }
                    standins.attend_async(
                        &s,
                        dev.plane_ptr(0)?,
                        dev.dims().row_bytes,
                        out.idx.device_ptr(),
                        out.valid.device_ptr(),
                        REQS as u32,
                        K as u32,
                        qd.device_ptr(),
                        att.device_ptr(),
                    )?;
                    if prefetch {
                        let e1 = side.record_event(None).map_err(cu("cuEventRecord"))?;
                        s.wait(&e1).map_err(cu("cuStreamWaitEvent"))?;
                    }
                    for l in 1..LAYERS {
                        let o = &later[l as usize - 1];
                        dev.resolve_async(
                            &s,
                            &o.args(&hot, lpd[l as usize - 1].device_ptr(), l),
                            CopyBackend::Gather,
                        )?;
                        standins.attend_async(
                            &s,
                            dev.plane_ptr(l)?,
                            dev.dims().row_bytes,
                            o.idx.device_ptr(),
                            o.valid.device_ptr(),
                            REQS as u32,
                            K as u32,
                            qd.device_ptr(),
                            att.device_ptr(),
                        )?;
                    }
                }
                let us = ev.stop_us(&s)?;
                let mut d = 0;
                for o in &later {
                    d += o.misses()?;
                }
                let pr: u64 = pf_count.download()?.iter().map(|&c| c as u64).sum();
                if i >= warm {
                    tt.push(us);
                    demand.push(d);
                    pf_rows.push(pr);
                }
            }
            let us = median(&mut tt);
            let total: u64 = demand.iter().sum();
            t.row(
                &format!(
                    "group step, 4 layers, {}",
                    if prefetch {
                        "pool prefetched on side stream"
                    } else {
                        "no prefetch"
                    }
                ),
                format!("{us:.1} us"),
                format!(
                    "demand misses in layers 1-3: {total} over {reps} steps{}",
                    if prefetch {
                        format!(
                            ", prefetched {:.0} rows/step",
                            pf_rows.iter().sum::<u64>() as f64 / reps as f64
                        )
                    } else {
                        String::new()
                    }
                ),
                if prefetch {
                    format!("target 0: {}", if total == 0 { "met" } else { "MISSED" })
                } else {
                    String::new()
                },
            );
        }
        let e = hot.pool.device().errors()?;
        println!();
        t.print();
        println!();
        println!("device error counters: {e:?}");
        Ok(())
    }
}
