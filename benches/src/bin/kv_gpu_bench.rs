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
    if let Err(e) = run::run() {
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
#[path = "kv_gpu_bench/run.rs"]
mod run;

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
    use tierkit_testkit::pattern_tokens;

    pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

    pub(crate) const REQS: usize = 64;
    pub(crate) const K: usize = 2048;
    pub(crate) const ROW: u32 = 656;
    pub(crate) const LAYERS: u32 = 4;
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
        pub(crate) fn fresh_pool(&mut self, n: usize) -> Vec<i32> {
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
            row_format: None,
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
        pub(crate) fn row(&mut self, what: &str, time: String, figure: String, note: String) {
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
}
