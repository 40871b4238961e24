//! `kv_gpu_bench --mode peer`: our resolve kernels (fast, classic, lean with 1024 and 512 threads per
//! entry) against SGLang HiSparse's
//! swap-in kernel (`load_cache_to_device_buffer_kernel`, ported in
//! `testkit/kernels/sglang_hisparse.cu`, launched as SGLang's coordinator does: one block of 960
//! threads per request) on identical inputs: batch 64, top-k 2048, 656 B rows, one layer, the full
//! history in mapped pinned host memory read in place by both, the same selection sequence
//! (`Churn`, seed 7). Each kernel starts cold and runs the same phases in order:
//!
//! 1. *hits only, first set*: the first set (loaded by one untimed step) repeated;
//! 2. *9.5% misses*: 10% of each set replaced per step (≈ 9.5% distinct fresh positions);
//! 3. *25.9% misses*: 30% replaced per step;
//! 4. *hits only, scattered*: the last set repeated (its hot slots now scattered by the churn).
//!
//! Each phase: `warm` untimed steps, then `reps` timed ones (CUDA events, median). Four runs per
//! kernel from the same cold state: plain launch, the launch captured once in a CUDA graph and
//! replayed, *bookkeeping* (plain launch with the byte copy left out: SGLang's kernel without
//! its final copy loop, ours with the DMA back-end's placement and no copy), and the same
//! bookkeeping launch in a CUDA graph (the launch overhead out of the figure). Copy GB/s: the step's
//! distinct misses × 656 B over (step − bookkeeping) time. Also the all-resident case: SGLang's
//! short-sequence path (history 4096 ≤ hot 4096) against our direct path (history in borrowed pages).

use std::sync::Arc;

use cuda_kernels::cudarc_driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cuda_kernels::cudarc_driver::{CudaGraph, CudaStream};
use cuda_kernels::{CopyBackend, DeviceBuffer, Gpu, KvResolveOptions, ResolveEngine};
use tierkit_testkit::{SglangHisparse, SglangShape};

use crate::bench::{
    cu, median, resident_sets, setup, Churn, Ev, Out, Res, Setup, Table, K, REQS, ROW,
};

/// The kernels compared.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kernel {
    Sglang,
    Ours(ResolveEngine),
}

const KERNELS: [Kernel; 5] = [
    Kernel::Sglang,
    Kernel::Ours(ResolveEngine::Fast),
    Kernel::Ours(ResolveEngine::Classic),
    Kernel::Ours(ResolveEngine::Lean),
    Kernel::Ours(ResolveEngine::Lean512),
];

/// Column names of [`KERNELS`].
const NAMES: [&str; 5] = ["SGLang", "fast", "classic", "lean", "lean512"];

/// Kernels whose copy speed is reported (indices into [`KERNELS`]).
const GBS: [usize; 3] = [0, 1, 3];

/// How a run launches and whether it copies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Run {
    Plain,
    Graph,
    /// Plain launches with the copy left out (ours: the DMA back-end's plan, not copied; SGLang:
    /// its kernel without the copy): the bookkeeping figure.
    Bookkeeping,
    /// The same in a CUDA graph (launch overhead out of the figure).
    BookkeepingGraph,
}

const RUNS: [Run; 4] = [
    Run::Plain,
    Run::Graph,
    Run::Bookkeeping,
    Run::BookkeepingGraph,
];

/// Column suffixes of [`RUNS`].
const RUN_NAMES: [&str; 4] = ["us", "graph us", "bookkeeping us", "bookkeeping graph us"];

/// The table's header: configuration, then per run every kernel's median and the best of ours
/// over SGLang's (with the engine that gave it), then copy speeds.
fn header() -> Vec<String> {
    let mut h: Vec<String> = ["hot / history", "step", "misses/step"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for run in RUN_NAMES {
        h.extend(NAMES.iter().map(|k| format!("{k} {run}")));
        h.push(format!("best ours / SGLang ({run})"));
    }
    h.extend(GBS.iter().map(|&k| format!("{} copy GB/s", NAMES[k])));
    h
}

/// One row's timing columns from `med[kernel][run]` (µs; `None` where a run was not made).
fn timing_cells(med: &[[Option<f64>; 4]]) -> Vec<String> {
    let mut c = Vec::new();
    for ri in 0..RUNS.len() {
        c.extend(med.iter().map(|m| match m[ri] {
            Some(v) => format!("{v:.1}"),
            None => "-".into(),
        }));
        let best = (1..med.len())
            .filter_map(|k| med[k][ri].map(|v| (v, k)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        c.push(match (best, med[0][ri]) {
            (Some((v, k)), Some(sg)) => format!("{:.2} ({})", v / sg, NAMES[k]),
            _ => "-".into(),
        });
    }
    c
}

/// One phase of the sequence: steps `start .. start + warm + reps`, the last `reps` timed.
struct Phase {
    label: &'static str,
    start: usize,
}

/// The selection sequence of one configuration: step 0 loads the first set, then the phases.
struct Sequence {
    steps: Vec<Vec<i32>>,
    phases: Vec<Phase>,
}

fn sequence(history: u32, warm: usize, reps: usize) -> Sequence {
    let mut churn = Churn::new(history - 64, 7);
    let mut steps = vec![churn.step(0.0)];
    let mut phases = Vec::new();
    for (label, rate) in [
        ("hits only, first set", 0.0),
        ("9.5% misses (10% churn)", 0.10),
        ("25.9% misses (30% churn)", 0.30),
        ("hits only, scattered", 0.0),
    ] {
        phases.push(Phase {
            label,
            start: steps.len(),
        });
        for _ in 0..warm + reps {
            steps.push(churn.step(rate));
        }
    }
    Sequence { steps, phases }
}

/// The state both sides keep for one configuration, plus fixed input/output buffers (graph-safe).
struct Bed {
    ours: Setup,
    out: Out,
    sg: SglangHisparse,
    cur: DeviceBuffer<i32>,
}

impl Bed {
    fn new(gpu: &Arc<Gpu>, hot: u32, history: u32, elastic: bool, sg_hot: u32) -> Res<Self> {
        let ours = setup(gpu, hot, history, elastic, 1)?;
        let d = *ours.pool.device().dims();
        let t = ours.pool.device().tables(0)?;
        // SGLang's host_cache_locs: token p of request r lives at our host row (slot, p, layer 0).
        let mut locs = Vec::with_capacity(REQS * history as usize);
        for r in 0..REQS {
            let slot = ours.pool.slot_of(r as u64 + 1)? as u64;
            for p in 0..history as u64 {
                locs.push(((slot * d.max_history as u64 + p) * d.layers as u64) as i64);
            }
        }
        let sg = SglangHisparse::new(
            gpu,
            SglangShape {
                reqs: REQS as u32,
                hot: sg_hot,
                seq_len: history,
                item_bytes: ROW,
            },
            t.host,
            &locs,
            history,
        )?;
        Ok(Bed {
            out: Out::new(gpu, hot)?,
            cur: DeviceBuffer::zeroed(gpu.ctx(), REQS * K)?,
            ours,
            sg,
        })
    }

    /// Both sides back to a cold hot cache.
    fn reset(&mut self) -> Res<()> {
        self.sg.reset()?;
        for r in 0..REQS as u64 {
            let slot = self.ours.pool.slot_of(r + 1)?;
            self.ours.pool.device_mut().clear_hot(slot)?;
        }
        self.ours.pool.device_mut().clear_errors()?;
        Ok(())
    }

    /// Enqueues one step of `kernel` reading `self.cur`.
    fn launch(&self, s: &CudaStream, kernel: Kernel, copy: bool) -> Res<()> {
        match kernel {
            Kernel::Sglang => {
                // SAFETY: `cur` holds REQS x 2048 positions below the history; the host cache (the
                // pool's pinned store) outlives the launch.
                unsafe { self.sg.launch(s, self.cur.device_ptr(), copy)? }
            }
            Kernel::Ours(engine) => {
                let a = self.out.args(&self.ours, self.cur.device_ptr(), 0);
                let o = KvResolveOptions {
                    engine,
                    ..Default::default()
                };
                let backend = if copy {
                    CopyBackend::Gather
                } else {
                    CopyBackend::Dma
                };
                // SAFETY: the buffers of `out` and `ours` are live and shaped for REQS x K.
                unsafe {
                    self.ours
                        .pool
                        .device()
                        .resolve_async_with(s, &a, &o, backend)?
                };
            }
        }
        Ok(())
    }

    /// The port reads the right bytes: every pick of the last step maps to a device-buffer row
    /// holding the host row of its position (the setup's `host_cache_locs` mapping is correct).
    fn check_sglang_rows(&self, step: &[i32]) -> Res<()> {
        let locs = self.sg.out().download()?;
        let buf = self.sg.buffer().download()?;
        let dev = self.ours.pool.device();
        let (d, host) = (*dev.dims(), dev.host_store());
        let rb = ROW as usize;
        for r in 0..REQS {
            let slot = self.ours.pool.slot_of(r as u64 + 1)? as usize;
            for j in 0..K {
                let (p, loc) = (step[r * K + j] as usize, locs[r * K + j] as usize);
                let h = (slot * d.max_history as usize + p) * d.layers as usize * rb;
                if buf[loc * rb..(loc + 1) * rb] != host[h..h + rb] {
                    return Err(format!(
                        "SGLang port: request {r} pick {j} (position {p}) wrong row"
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    fn capture(&self, s: &Arc<CudaStream>, kernel: Kernel, copy: bool) -> Res<CudaGraph> {
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cu("cuStreamBeginCapture"))?;
        let launched = self.launch(s, kernel, copy);
        let graph = s
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(cu("cuStreamEndCapture"))?;
        launched?;
        Ok(graph.ok_or("empty graph")?)
    }
}

/// Per-step times (µs) of one run over the whole sequence, our distinct misses per step, and (ours)
/// the last step's outputs (indices, valid counts, stats): every engine must give the same.
fn run_sequence(
    gpu: &Arc<Gpu>,
    bed: &mut Bed,
    seq: &Sequence,
    kernel: Kernel,
    run: Run,
) -> Res<(Vec<f64>, Vec<u64>, Vec<i64>)> {
    let s = gpu.stream().clone();
    let ev = Ev::new(gpu)?;
    bed.reset()?;
    let graph = match run {
        Run::Graph => Some(bed.capture(&s, kernel, true)?),
        Run::BookkeepingGraph => Some(bed.capture(&s, kernel, false)?),
        _ => None,
    };
    let (mut us, mut misses) = (Vec::new(), Vec::new());
    for step in &seq.steps {
        bed.cur.upload(step)?;
        ev.start(&s)?;
        match &graph {
            Some(g) => g.launch().map_err(cu("cuGraphLaunch"))?,
            None => bed.launch(&s, kernel, run == Run::Plain)?,
        }
        us.push(ev.stop_us(&s)?);
        misses.push(match kernel {
            Kernel::Ours(_) => bed.out.misses()?,
            Kernel::Sglang => 0,
        });
    }
    // (The short-sequence path of the all-resident case assumes its buffer already filled.)
    if kernel == Kernel::Sglang && run == Run::Plain && !seq.phases.is_empty() {
        if let Some(last) = seq.steps.last() {
            bed.check_sglang_rows(last)?;
        }
    }
    let mut last = Vec::new();
    if let Kernel::Ours(_) = kernel {
        let e = bed.ours.pool.device().errors()?;
        if e != Default::default() {
            return Err(format!("device error counters after {kernel:?} {run:?}: {e:?}").into());
        }
        let o = &bed.out;
        last.extend(o.idx.download()?.iter().map(|&x| x as i64));
        last.extend(o.valid.download()?.iter().map(|&x| x as i64));
        last.extend(o.stats.download()?.iter().map(|&x| x as i64));
    }
    Ok((us, misses, last))
}

/// Runs every configuration and prints one table row per (configuration, phase).
pub(crate) fn run(gpu: &Arc<Gpu>, reps: usize) -> Res<()> {
    let warm = 3;
    println!(
        "peer mode: device {} ({}), batch {REQS}, top-k {K}, rows {ROW} B, 1 layer, history in \
         mapped pinned host memory (read in place), {reps} timed steps per phase (median); \
         SGLang = load_cache_to_device_buffer_kernel (960 threads/block); ours fast / classic / \
         lean / lean512 = tierkit_kv_resolve_fast / tierkit_kv_resolve / tierkit_kv_resolve_lean(512) \
         (1024 / 512 threads)",
        gpu.name()?,
        gpu.arch()
    );
    let mut t = Table(vec![header()]);
    // Mismatches are reported after the table (rows marked WRONG), so an ablation still times.
    let mut wrong: Vec<String> = Vec::new();
    for (hot, history) in [
        (4096u32, 32768u32),
        (2048, 32768),
        (8192, 16384),
        (4096, 131072),
    ] {
        let seq = sequence(history, warm, reps);
        let mut bed = Bed::new(gpu, hot, history, false, hot)?;
        // times[kernel][run] = per-step µs; misses from our fast kernel's plain run.
        let mut times = vec![vec![Vec::new(); RUNS.len()]; KERNELS.len()];
        let (mut misses, mut last) = (Vec::new(), Vec::new());
        let wrong_before = wrong.len();
        for (ki, &kernel) in KERNELS.iter().enumerate() {
            for (ri, &run) in RUNS.iter().enumerate() {
                let (us, m, l) = run_sequence(gpu, &mut bed, &seq, kernel, run)?;
                if kernel == Kernel::Ours(ResolveEngine::Fast) && run == Run::Plain {
                    (misses, last) = (m, l);
                } else if matches!(kernel, Kernel::Ours(_)) && (m != misses || l != last) {
                    // Same decisions: every engine fetches the same distinct misses per step and
                    // returns the same last step.
                    wrong.push(format!(
                        "hot {hot} / {history}: {kernel:?} {run:?}: outputs differ from fast's"
                    ));
                }
                times[ki][ri] = us;
            }
        }
        for ph in &seq.phases {
            let timed = ph.start + warm..ph.start + warm + reps;
            let med = |ki: usize, ri: usize| median(&mut times[ki][ri][timed.clone()].to_vec());
            let m = median(
                &mut misses[timed.clone()]
                    .iter()
                    .map(|&m| m as f64)
                    .collect::<Vec<_>>(),
            );
            let bytes = m * ROW as f64;
            let meds: Vec<[Option<f64>; 4]> = (0..KERNELS.len())
                .map(|ki| [0, 1, 2, 3].map(|ri| Some(med(ki, ri))))
                .collect();
            let gbs = |ki: usize| {
                let net = med(ki, 0) - med(ki, 2);
                if bytes > 0.0 && net > 0.0 {
                    format!("{:.1}", bytes / (net * 1e3))
                } else {
                    "-".into()
                }
            };
            let mut row = vec![
                format!("{hot} / {}K", history / 1024),
                if wrong.len() > wrong_before {
                    format!("WRONG {}", ph.label)
                } else {
                    ph.label.to_string()
                },
                format!("{m:.0} ({:.1}%)", m / (REQS * K) as f64 * 100.0),
            ];
            row.extend(timing_cells(&meds));
            row.extend(GBS.iter().map(|&ki| gbs(ki)));
            t.0.push(row);
        }
        eprintln!("peer: hot {hot}, history {history} done");
    }
    all_resident(gpu, reps, warm, &mut t)?;
    t.print();
    println!(
        "bookkeeping target (issue 13): <= 10 us everywhere (plain launches; the bookkeeping \
         graph columns time the same steps in a CUDA graph); copy: >= 45 GB/s (in-place gather \
         ceiling 47 GB/s); misses/step: our distinct misses (SGLang's are the same fresh positions)"
    );
    if !wrong.is_empty() {
        return Err(wrong.join("; ").into());
    }
    Ok(())
}

/// Only the all-resident row (a quick run for kernel ablations, `--mode peer-resident`).
pub(crate) fn run_resident(gpu: &Arc<Gpu>, reps: usize) -> Res<()> {
    let mut t = Table(vec![header()]);
    all_resident(gpu, reps, 3, &mut t)?;
    t.print();
    Ok(())
}

/// The all-resident case: SGLang's short-sequence path (history 4096 ≤ its hot 4096: every token
/// already in its device buffer) against our direct path (history in borrowed pages, hot 2048).
fn all_resident(gpu: &Arc<Gpu>, reps: usize, warm: usize, t: &mut Table) -> Res<()> {
    let history = 4096u32;
    let mut bed = Bed::new(gpu, 2048, history, true, 4096)?;
    let steps = resident_sets(history - 64, 42);
    let seq = Sequence {
        steps: (0..warm + reps).map(|i| steps[i % 4].clone()).collect(),
        phases: Vec::new(),
    };
    let mut med = vec![[None; 4]; KERNELS.len()];
    let mut last = Vec::new();
    // Timed rows are printed even when a kernel's outputs differ (the run then fails after them).
    let mut wrong = Vec::new();
    for (ki, &kernel) in KERNELS.iter().enumerate() {
        for (ri, run) in [Run::Plain, Run::Graph].into_iter().enumerate() {
            let (us, m, l) = run_sequence(gpu, &mut bed, &seq, kernel, run)?;
            if m.iter().any(|&m| m > 0) {
                wrong.push(format!("{kernel:?} {run:?}: fetched rows"));
            }
            if kernel == Kernel::Ours(ResolveEngine::Fast) && run == Run::Plain {
                last = l;
            } else if matches!(kernel, Kernel::Ours(_)) && l != last {
                wrong.push(format!("{kernel:?} {run:?}: outputs differ"));
            }
            med[ki][ri] = Some(median(&mut us[warm..].to_vec()));
        }
    }
    let what = if wrong.is_empty() {
        "SGLang short path vs our direct path"
    } else {
        "WRONG"
    };
    let mut row = vec![
        "all resident (4K history)".to_string(),
        what.into(),
        "0".into(),
    ];
    row.extend(timing_cells(&med));
    row.extend(GBS.iter().map(|_| "-".to_string()));
    t.0.push(row);
    if !wrong.is_empty() {
        t.print();
        return Err(format!("all resident: {}", wrong.join("; ")).into());
    }
    Ok(())
}
