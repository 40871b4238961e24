//! `kv_gpu_bench --mode admit`: admitting a 500K-token history (896 B rows, one layer: 448 MB,
//! the 500K × 890 B rounded to the attention stand-in's 16-byte rows) into borrowed pages
//! on the pool's copy stream while decode steps keep running on the step stream.
//!
//! A decode step: the resolve of 8 live sessions (history 4096, all resident: direct path) and the
//! sparse-attention stand-in over their 8 × 2048 picks, 4 layers' worth (HBM reads). Both streams
//! are held by a gate kernel while the host queues `n` steps (an event between steps) and then the
//! admission (`GpuElasticPool::admit`: the host copies the history into the pinned store and
//! publishes the fills on the copy stream, bracketed by two events); the host then opens the gate,
//! so the fills run beside the queued steps. Printed: the admission copy time and GB/s (against
//! 55.6 GB/s pinned H2D; target ≥ 90%, i.e. ≤ 8.9 ms for 445 MB), the median step time of the
//! steps that ran inside the copy window against the same steps queued without an admission, for
//! the copy-engine fills (`CopyBackend::Dma`, default) and the gather kernel. Further rows queue
//! the steps *after* the admission, as an engine's next steps are: with `MapAfterFill::Ordered`
//! they wait for the whole copy (the first step's time is the copy), with `MapAfterFill::Deferred`
//! they run beside it (the admitted pages are mapped by the publish after the copy). The DMA runs
//! are checked: every borrowed page of the admitted session holds its history bytes.
//!
//! The `Import` rows (issue 29) admit the same history through the transfer path: the rows are
//! reserved and written in the pinned store as a transfer agent's RDMA write would (untimed), and
//! the `host admit call` column times `GpuElasticPool::commit` alone: bookkeeping, the fills
//! enqueued on the copy stream (one strided copy per run of pages with the `Dma` back-end).
//! Targets: host call <= 1 ms, copy >= 95% of H2D, steps during the copy <= 2% slower.
//! `--mode admit-import` runs these rows alone (the whole mode, 8 cases × `--reps`, ran past a
//! 120 s call limit on the H200 at `--reps 3`).

use std::sync::Arc;

use cuda_kernels::cudarc_driver::sys::CUevent_flags;
use cuda_kernels::cudarc_driver::{CudaEvent, CudaStream};
use cuda_kernels::{CopyBackend, DeviceBuffer, Gpu, KvResolveArgs, PinnedBuffer, KV_STATS};
use kv_elastic::gpu::{GpuElasticPool, GpuPoolConfig, MapAfterFill};
use kv_elastic::{Admission, Geometry, PoolConfig, Reserve};
use tierkit_testkit::{pattern_tokens, KvStandins};

use crate::bench::{cu, median, mix, Res, Table, H2D_CEIL, K};

const ROW: u32 = 896;
const TOKENS: u32 = 500_000;
const DECODE: usize = 8;
const DECODE_HISTORY: u32 = 4096;
const PAGE: u32 = 64;
/// Launches queued behind the gate at most (5 per step).
const MAX_STEPS: usize = 300;
/// The gate opens by itself after this long (a host that cannot release it never hangs the run).
const GATE_NS: u64 = 20_000_000_000;

struct Bench {
    gpu: Arc<Gpu>,
    pool: GpuElasticPool,
    standins: KvStandins,
    topk: DeviceBuffer<i32>,
    qsl: DeviceBuffer<i32>,
    seq: DeviceBuffer<i32>,
    slots: DeviceBuffer<i32>,
    idx: DeviceBuffer<i32>,
    valid: DeviceBuffer<i32>,
    plan: DeviceBuffer<cuda_kernels::KvCopy>,
    count: DeviceBuffer<u32>,
    stats: DeviceBuffer<u32>,
    q: DeviceBuffer<f32>,
    att: DeviceBuffer<f32>,
    flag: PinnedBuffer<u32>,
}

fn event(gpu: &Gpu) -> Res<CudaEvent> {
    Ok(gpu
        .ctx()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cu("cuEventCreate"))?)
}

fn ms(a: &CudaEvent, b: &CudaEvent) -> Res<f64> {
    Ok(a.elapsed_ms(b).map_err(cu("cuEventElapsedTime"))? as f64)
}

impl Bench {
    fn new(gpu: &Arc<Gpu>) -> Res<Self> {
        let mut g = Geometry {
            row_bytes: ROW,
            layers: 1,
            page_rows: PAGE,
            arena_pages: 0,
            hot_rows: 2048,
            tail_rows: 64,
            scratch_rows: 0,
            layer_groups: Default::default(),
            row_format: None,
        };
        // Decode sessions fully resident, two admissions' pages (the second one may start before
        // the first one's pages are back), fixed pages of every slot.
        g.arena_pages = 12 * g.fixed_pages()
            + DECODE as u32 * DECODE_HISTORY / PAGE
            + 2 * TOKENS.div_ceil(PAGE)
            + 8;
        let gcfg = GpuPoolConfig {
            max_sessions: DECODE as u32 + 3,
            max_history: TOKENS,
            backend: CopyBackend::Gather,
        };
        let mut pool = GpuElasticPool::new(gpu, g, PoolConfig { elastic: true }, gcfg)?;
        for s in 1..=DECODE as u64 {
            let h = pattern_tokens(ROW, 1, s, 0, DECODE_HISTORY);
            pool.admit(s, &h)?;
        }
        let ctx = gpu.ctx();
        let slots: Vec<i32> = (1..=DECODE as u64)
            .map(|s| pool.slot_of(s).map(|b| b as i32))
            .collect::<Result<_, _>>()?;
        let mut rng = 11u64;
        let topk: Vec<i32> = (0..DECODE * K)
            .map(|_| (mix(&mut rng) % (DECODE_HISTORY as u64 - 64)) as i32)
            .collect();
        let q: Vec<f32> = (0..ROW).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let mut flag = PinnedBuffer::zeroed(ctx, 1)?;
        flag.as_mut_slice()[0] = 0;
        Ok(Bench {
            standins: KvStandins::new(gpu)?,
            topk: DeviceBuffer::from_host(ctx, &topk)?,
            qsl: DeviceBuffer::from_host(ctx, &(0..=DECODE as i32).collect::<Vec<_>>())?,
            seq: DeviceBuffer::from_host(ctx, &[DECODE_HISTORY as i32; DECODE])?,
            slots: DeviceBuffer::from_host(ctx, &slots)?,
            idx: DeviceBuffer::zeroed(ctx, DECODE * K)?,
            valid: DeviceBuffer::zeroed(ctx, DECODE)?,
            plan: DeviceBuffer::zeroed(ctx, DECODE * 2048)?,
            count: DeviceBuffer::zeroed(ctx, DECODE)?,
            stats: DeviceBuffer::zeroed(ctx, DECODE * KV_STATS)?,
            q: DeviceBuffer::from_host(ctx, &q)?,
            att: DeviceBuffer::zeroed(ctx, DECODE)?,
            flag,
            pool,
            gpu: gpu.clone(),
        })
    }

    /// One decode step on `s`: resolve (direct path) + the attention stand-in 4 times.
    fn step(&self, s: &CudaStream) -> Res<()> {
        let a = KvResolveArgs {
            topk: self.topk.device_ptr(),
            query_start_loc: self.qsl.device_ptr(),
            seq_lens: self.seq.device_ptr(),
            session_slot: self.slots.device_ptr(),
            sessions: DECODE as u32,
            rows: DECODE as u32,
            k: K as u32,
            layer: 0,
            indices: self.idx.device_ptr(),
            valid_count: self.valid.device_ptr(),
            plan: self.plan.device_ptr(),
            plan_count: self.count.device_ptr(),
            stats: self.stats.device_ptr(),
        };
        let dev = self.pool.device();
        // SAFETY: the buffers above are live and shaped for DECODE x K; the sessions' whole
        // histories are resident (direct path: nothing is fetched).
        unsafe { dev.resolve_async(s, &a, CopyBackend::Gather)? };
        for _ in 0..4 {
            // SAFETY: indices hold rows of plane 0 or -1; q / att sized for ROW / DECODE.
            unsafe {
                self.standins.attend_async(
                    s,
                    dev.plane_ptr(0)?,
                    ROW,
                    self.idx.device_ptr(),
                    self.valid.device_ptr(),
                    DECODE as u32,
                    K as u32,
                    self.q.device_ptr(),
                    self.att.device_ptr(),
                )?
            };
        }
        Ok(())
    }

    /// Closes the gate on `streams` (the host opens it with [`Bench::open`]).
    fn close(&mut self, streams: &[&CudaStream]) -> Res<()> {
        self.flag.as_mut_slice()[0] = 0;
        for s in streams {
            // SAFETY: the flag is a live mapped pinned u32 owned by `self`.
            unsafe {
                self.standins
                    .spin_until_async(s, self.flag.device_ptr(), GATE_NS)?
            };
        }
        Ok(())
    }

    fn open(&mut self) {
        // A host write to mapped pinned memory the gate kernels poll.
        self.flag.as_mut_slice()[0] = 1;
    }

    /// Queues `n` steps on `s` with an event before each and after the last.
    fn queue_steps(&self, s: &CudaStream, evs: &[CudaEvent], n: usize) -> Res<()> {
        for (i, e) in evs.iter().enumerate() {
            e.record(s).map_err(cu("cuEventRecord"))?;
            if i < n {
                self.step(s)?;
            }
        }
        Ok(())
    }

    /// Queues `n` steps behind the gate with an event before each and after the last; with
    /// `admit = Some((session, history, how))` also the admission (its copy-stream work between
    /// two events): `How::Copy` is `GpuElasticPool::admit` (the host copies the history into the
    /// pinned store); `How::Import` reserves the rows, writes them as a transfer agent would
    /// (before the timed call) and times `GpuElasticPool::commit` alone,
    /// before the steps (`after`: the steps are queued after it, as an engine's next steps are).
    /// Returns per-step µs, the step events' offsets from the copy window start (ms) and, with an
    /// admission, the copy window (ms) and the rows filled.
    fn window(&mut self, n: usize, admit: Option<(u64, &[u8], How)>, after: bool) -> Res<Window> {
        let gpu = self.gpu.clone();
        let step_s = gpu.stream().clone();
        let copy_s = self.pool.copy_stream().clone();
        self.close(&[&step_s, &copy_s])?;
        let evs: Vec<CudaEvent> = (0..=n).map(|_| event(&gpu)).collect::<Res<_>>()?;
        let (c0, c1) = (event(&gpu)?, event(&gpu)?);
        c0.record(&copy_s).map_err(cu("cuEventRecord"))?;
        if !after {
            self.queue_steps(&step_s, &evs, n)?;
        }
        let before = self.pool.flush_counters();
        if let Some((session, history, How::Import)) = admit {
            // The agent's part: rows reserved, then written in place (an RDMA write lands in the
            // pinned store). Not the admission's host call.
            let span = match self.pool.reserve(session, 0..TOKENS)? {
                Reserve::Reserved(span) => span,
                Reserve::Waiting { pending } => {
                    return Err(format!("import waiting for {pending} pages").into())
                }
            };
            assert_eq!(span.len as usize, history.len());
            // SAFETY: the rows are reserved for this writer inside the pool's pinned store.
            unsafe {
                std::ptr::copy_nonoverlapping(history.as_ptr(), span.addr as *mut u8, history.len())
            };
        }
        let t0 = std::time::Instant::now();
        if let Some((session, history, how)) = admit {
            let a = match how {
                How::Copy => self.pool.admit(session, history)?,
                How::Import => self.pool.commit(session)?,
            };
            if let Admission::Waiting { pending } = a {
                return Err(format!("admission waiting for {pending} pages").into());
            }
        }
        let host_ms = t0.elapsed().as_secs_f64() * 1e3;
        c1.record(&copy_s).map_err(cu("cuEventRecord"))?;
        if after {
            self.queue_steps(&step_s, &evs, n)?;
        }
        self.open();
        gpu.synchronize()?;
        // Deferred mapping: the admitted pages are mapped once their fill passed (it has).
        self.pool.publish()?;
        let counters = self.pool.flush_counters();
        let mut step_us = Vec::with_capacity(n);
        let mut end_ms = Vec::with_capacity(n);
        for i in 0..n {
            step_us.push(ms(&evs[i], &evs[i + 1])? * 1e3);
            end_ms.push(ms(&c0, &evs[i + 1])?);
        }
        Ok(Window {
            step_us,
            end_ms,
            copy_ms: ms(&c0, &c1)?,
            host_ms,
            rows: counters.rows_filled - before.rows_filled,
            rows_dma: counters.rows_filled_dma - before.rows_filled_dma,
            descriptors: counters.fill_descriptors - before.fill_descriptors,
        })
    }

    /// Every borrowed page of `session` holds its history bytes (arena plane 0 vs `history`).
    fn check_pages(&self, session: u64, history: &[u8]) -> Res<u64> {
        let plane = self.pool.device().download_plane(0)?;
        let pl = self.pool.cpu().placement(session)?;
        let (rb, pr) = (ROW as usize, PAGE as usize);
        let mut pages = 0;
        for (j, &page) in pl.page_table.iter().enumerate() {
            if page < 0 {
                continue;
            }
            let at = page as usize * pr * rb;
            if plane[at..at + pr * rb] != history[j * pr * rb..(j + 1) * pr * rb] {
                return Err(
                    format!("admitted page {j} (arena page {page}) holds wrong bytes").into(),
                );
            }
            pages += 1;
        }
        Ok(pages)
    }
}

/// How a history gets into the pool (see [`Bench::window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// `admit`: the host copies the history into the pinned store, then publishes.
    Copy,
    /// `reserve` + the agent's write + `commit`: the history is already in the store.
    Import,
}

struct Window {
    step_us: Vec<f64>,
    end_ms: Vec<f64>,
    copy_ms: f64,
    host_ms: f64,
    rows: u64,
    rows_dma: u64,
    descriptors: u64,
}

/// Runs the admission measurement and prints its table.
/// `import_only`: the import rows alone (`--mode admit-import`, issue 29's figures: the three
/// import cases take about a third of the whole mode's time).
pub(crate) fn run(gpu: &Arc<Gpu>, reps: usize, import_only: bool) -> Res<()> {
    let mut b = Bench::new(gpu)?;
    let bytes = TOKENS as f64 * ROW as f64;
    println!(
        "admit mode: device {} ({}), history {TOKENS} tokens x {ROW} B = {:.0} MB (one layer) into \
         borrowed pages on the copy stream; decode step = resolve of {DECODE} resident sessions + \
         4 x attention stand-in over {DECODE} x {K} picks",
        gpu.name()?,
        gpu.arch(),
        bytes / 1e6
    );
    // Step time alone (ungated) sizes the queue: the steps must cover the copy window.
    let s = gpu.stream().clone();
    for _ in 0..20 {
        b.step(&s)?;
    }
    gpu.synchronize()?;
    let probe = b.window(50, None, false)?;
    let step_guess = median(&mut probe.step_us.clone()).max(1.0);
    let n = ((2.0 * bytes / (H2D_CEIL * 1e3) / step_guess) as usize).clamp(50, MAX_STEPS);
    let history = pattern_tokens(ROW, 1, 1000, 0, TOKENS);
    let mut t = Table(vec![[
        "fill back-end, mapping, steps queued",
        "copy window",
        "GB/s",
        "vs 55.6 GB/s H2D",
        "rows (DMA rows, descriptors)",
        "step alone (median)",
        "step during the copy (median, n)",
        "first step queued",
        "host admit call",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect()]);
    let mut session = 1000u64;
    // Today's rows (steps queued before the admission, mapping ordered after the fill), then
    // steps queued after the admission: ordered (they wait for the copy) vs deferred mapping;
    // then the import path (issue 29): the history already in the store, `commit` publishes it.
    let cases = [
        (CopyBackend::Dma, MapAfterFill::Ordered, false, How::Copy),
        (CopyBackend::Gather, MapAfterFill::Ordered, false, How::Copy),
        (CopyBackend::Dma, MapAfterFill::Ordered, true, How::Copy),
        (CopyBackend::Dma, MapAfterFill::Deferred, true, How::Copy),
        (CopyBackend::Gather, MapAfterFill::Deferred, true, How::Copy),
        (CopyBackend::Dma, MapAfterFill::Ordered, false, How::Import),
        (CopyBackend::Dma, MapAfterFill::Deferred, true, How::Import),
        (
            CopyBackend::Gather,
            MapAfterFill::Deferred,
            true,
            How::Import,
        ),
    ];
    for (ci, (backend, mapping, after, how)) in cases.into_iter().enumerate() {
        if import_only && how != How::Import {
            continue;
        }
        b.pool.set_fill_backend(backend);
        b.pool.set_map_after_fill(mapping);
        for rep in 0..reps.clamp(1, 5) {
            let alone = b.window(n, None, after)?;
            let with = b.window(n, Some((session, &history, how)), after)?;
            if backend == CopyBackend::Dma && rep == 0 {
                let pages = b.check_pages(session, &history)?;
                eprintln!(
                    "admit: {how:?}, {backend:?} fill ({mapping:?} mapping) checked, {pages} \
                     borrowed pages hold their bytes"
                );
            }
            let inside: Vec<f64> = with
                .step_us
                .iter()
                .zip(&with.end_ms)
                .filter(|&(_, &end)| end <= with.copy_ms)
                .map(|(&us, _)| us)
                .collect();
            let gbs = with.rows as f64 * ROW as f64 / (with.copy_ms * 1e6);
            let queued = if after { "after" } else { "before" };
            t.0.push(vec![
                format!("{how:?}, {backend:?}, {mapping:?}, {queued} (case {ci} run {rep})"),
                format!("{:.2} ms", with.copy_ms),
                format!("{gbs:.1}"),
                format!("{:.0}%", gbs / H2D_CEIL * 100.0),
                format!("{} ({}, {})", with.rows, with.rows_dma, with.descriptors),
                format!("{:.1} us", median(&mut alone.step_us.clone())),
                if inside.is_empty() {
                    "no step inside the window".into()
                } else {
                    format!("{:.1} us ({})", median(&mut inside.clone()), inside.len())
                },
                format!("{:.1} us", with.step_us.first().copied().unwrap_or(0.0)),
                format!("{:.3} ms", with.host_ms),
            ]);
            b.pool.finish(session)?;
            session += 1;
            gpu.synchronize()?;
            // Hand the finished session's pages back (nothing else is missing history).
            b.pool.between_steps(TOKENS.div_ceil(PAGE) + 64)?;
        }
    }
    t.print();
    println!(
        "target (issue 13): 445 MB in <= 8.9 ms (>= 90% of 55.6 GB/s) on the copy stream, steps \
         during the copy unchanged within noise, also steps queued after the admission (Deferred \
         mapping); {n} steps queued per window. Import rows (issue 29): host admit call (commit) \
         <= 1 ms, copy >= 95% of H2D, steps during the copy <= 2% slower than alone"
    );
    Ok(())
}
