//! `kv_gpu_bench --mode peer --peer-source DIR`: tierkit's resolve (the production kernel the
//! library launches, `ResolveEngine::Auto`) against SGLang HiSparse's swap-in kernel
//! (`load_cache_to_device_buffer_kernel`) read from its released wheel (`scripts/fetch-sglang-peer
//! DIR`: the version and every file's SHA-256 are printed) and compiled behind tierkit's shim,
//! launched as SGLang's coordinator does (one block of 960 threads per request, `SmemLayout` shared
//! memory), on identical inputs: batch 64, top-k 2048, 656 B rows, one layer, the full history in
//! mapped pinned host memory read in place by both, the same selection sequence (`Churn`, seed 7).
//! Each kernel starts cold and runs the same phases in order:
//!
//! 1. *hits only, first set*: the first set (loaded by one untimed step) repeated;
//! 2. *9.5% misses*: 10% of each set replaced per step (≈ 9.5% distinct fresh positions);
//! 3. *25.9% misses*: 30% replaced per step;
//! 4. *hits only, scattered*: the last set repeated (its hot slots now scattered by the churn).
//!
//! The *block ids* configurations run the same phases on block-id top-k (MiniMax-M3 style): 32 ids
//! of 64 positions per row (2048 output columns, as the token rows), churned as whole blocks (10% /
//! 30% of the ids replaced per step), SGLang's `TopKIsBlocks` instantiation (`SPARSE_BLOCK_SIZE =
//! 64`) against our `KvResolveOptions::block_positions = 64`.
//!
//! Each phase: `warm` untimed steps, then `reps` timed ones (CUDA events, median). Four launch
//! modes per kernel from the same cold state: plain launch, the launch captured once in a CUDA
//! graph and replayed, *bookkeeping* (plain launch with the byte copy left out: SGLang's own SkipIO
//! instantiation, ours with the DMA back-end's placement and no copy), and the same bookkeeping
//! launch in a CUDA graph. Copy GB/s: the step's distinct misses × 656 B over (step − bookkeeping)
//! time. `--runs N` (default 3) repeats everything, the kernels' order alternating between runs
//! (SGLang first in odd runs, ours first in even ones); each cell is the median over the runs, and
//! the largest per-run ratio is shown beside it. Also the all-resident case: SGLang's
//! short-sequence path (history 4096 ≤ hot 4096) against our direct path (history in borrowed
//! pages), with the floor: an empty kernel of our parameters launched with our grid (`KV_LAB`).

use std::sync::Arc;

use cuda_kernels::cudarc_driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cuda_kernels::cudarc_driver::{CudaGraph, CudaStream};
use cuda_kernels::{CopyBackend, DeviceBuffer, Gpu, KvResolveOptions};
use tierkit_testkit::{SglangHisparse, SglangShape, SglangSource, SGLANG_SPARSE_BLOCK};

use crate::bench::{
    cu, median, resident_sets, setup, Churn, Ev, Out, Res, Setup, Table, K, REQS, ROW,
};

/// The kernels compared.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kernel {
    Sglang,
    Ours,
}

const KERNELS: [Kernel; 2] = [Kernel::Sglang, Kernel::Ours];

/// Column names of [`KERNELS`].
const NAMES: [&str; 2] = ["SGLang", "tierkit"];

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

/// The table's header: configuration, then per launch mode both kernels' medians and ours over
/// SGLang's (median over runs, the largest run's in brackets), then copy speeds.
fn header() -> Vec<String> {
    let mut h: Vec<String> = ["hot / history", "step", "misses/step"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for run in RUN_NAMES {
        h.extend(NAMES.iter().map(|k| format!("{k} {run}")));
        h.push(format!("tierkit / SGLang ({run}; worst run)"));
    }
    h.extend(NAMES.iter().map(|k| format!("{k} copy GB/s")));
    h
}

/// `v` sorted: its median.
fn med_of(mut v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| median(&mut v))
}

/// One row's timing columns from `runs[r][kernel][mode]` (µs medians of each run; `None` where a
/// mode was not timed): per mode both kernels' medians over runs, and ours / SGLang as the median
/// of the per-run ratios with the largest in brackets.
fn timing_cells(runs: &[Vec<[Option<f64>; 4]>]) -> Vec<String> {
    let mut c = Vec::new();
    for ri in 0..RUNS.len() {
        for ki in 0..KERNELS.len() {
            c.push(
                match med_of(runs.iter().filter_map(|r| r[ki][ri]).collect()) {
                    Some(v) => format!("{v:.1}"),
                    None => "-".into(),
                },
            );
        }
        let ratios: Vec<f64> = runs
            .iter()
            .filter_map(|r| Some(r[1][ri]? / r[0][ri]?))
            .collect();
        let worst = ratios.iter().copied().fold(f64::NAN, f64::max);
        c.push(match med_of(ratios) {
            Some(m) => format!("{m:.2} ({worst:.2})"),
            None => "-".into(),
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

/// `block > 1`: sets of `K / block` block ids below the tail (positions `< history - 64`).
fn sequence(history: u32, block: u32, warm: usize, reps: usize) -> Sequence {
    let mut churn = Churn::with_width((history - 64) / block, 7, K / block as usize);
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
    /// The step's top-k, `[REQS][K / block]`.
    cur: DeviceBuffer<i32>,
    /// Positions per top-k entry (1: positions; else block ids).
    block: u32,
}

impl Bed {
    fn new(
        gpu: &Arc<Gpu>,
        peer: &SglangSource,
        hot: u32,
        history: u32,
        elastic: bool,
        sg_hot: u32,
        block: u32,
    ) -> Res<Self> {
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
            peer,
            SglangShape {
                reqs: REQS as u32,
                hot: sg_hot,
                seq_len: history,
                item_bytes: ROW,
                block,
            },
            t.host,
            &locs,
            history,
        )?;
        Ok(Bed {
            out: Out::new(gpu, hot)?,
            cur: DeviceBuffer::zeroed(gpu.ctx(), REQS * K / block as usize)?,
            ours,
            sg,
            block,
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
                // SAFETY: `cur` holds REQS x 2048 / block positions (block ids) below the history;
                // the host cache (the pool's pinned store) outlives the launch.
                unsafe { self.sg.launch(s, self.cur.device_ptr(), copy)? }
            }
            Kernel::Ours => {
                let mut a = self.out.args(&self.ours, self.cur.device_ptr(), 0);
                a.k = K as u32 / self.block;
                let o = KvResolveOptions {
                    block_positions: self.block,
                    ..KvResolveOptions::default()
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

    /// The peer reads the right bytes: every pick of the last step maps to a device-buffer row
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
                // Column j: position j of the row, or position j % block of its block j / block.
                let b = self.block as usize;
                let p = step[(r * K + j) / b] as usize * b + j % b;
                let loc = locs[r * K + j] as usize;
                let h = (slot * d.max_history as usize + p) * d.layers as usize * rb;
                if buf[loc * rb..(loc + 1) * rb] != host[h..h + rb] {
                    return Err(format!(
                        "SGLang peer: request {r} pick {j} (position {p}) wrong row"
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
            Kernel::Ours => bed.out.misses()?,
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
    if kernel == Kernel::Ours {
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

/// The peer's folder (`--peer-source DIR`) and runs (`--runs N`, default 3) from the command line.
pub(crate) struct PeerArgs {
    source: SglangSource,
    runs: usize,
}

impl PeerArgs {
    /// Reads `--peer-source` (required: the folder `scripts/fetch-sglang-peer` made) and `--runs`.
    pub(crate) fn from_args() -> Res<Self> {
        let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
        let dir = arg("--peer-source").ok_or(
            "--mode peer needs --peer-source DIR: the SGLang peer is read from its released wheel, \
             never kept in the tree; fetch it with `scripts/fetch-sglang-peer .peer/sglang` (on a \
             machine that reaches the package registry: sglang==0.5.23, no dependencies), carry \
             .peer/sglang beside this binary and pass `--peer-source .peer/sglang`",
        )?;
        let source = SglangSource::load(std::path::Path::new(&dir))?;
        let runs = match arg("--runs") {
            Some(r) => r
                .parse::<usize>()
                .ok()
                .filter(|r| (1..=9).contains(r))
                .ok_or("--runs must be 1..=9")?,
            None => 3,
        };
        Ok(PeerArgs { source, runs })
    }

    /// The peer's record for the output: release, wheel and every SHA-256
    /// ([`SglangSource::describe`]).
    pub(crate) fn describe(&self) -> String {
        self.source.describe()
    }
}

/// The kernels in the order of run `r` (0-based): SGLang first in even runs, ours first in odd ones.
fn order(r: usize) -> [usize; 2] {
    if r.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Runs every configuration `--runs` times and prints one table row per (configuration, phase).
pub(crate) fn run(gpu: &Arc<Gpu>, reps: usize, peer: &PeerArgs) -> Res<()> {
    let warm = 3;
    println!(
        "peer mode: device {} ({}), batch {REQS}, top-k {K}, rows {ROW} B, 1 layer, history in \
         mapped pinned host memory (read in place), {reps} timed steps per phase (median), {} runs \
         (order alternating); SGLang = load_cache_to_device_buffer_kernel (960 threads/block); \
         tierkit = the library's resolve (ResolveEngine::Auto)",
        gpu.name()?,
        gpu.arch(),
        peer.runs,
    );
    let mut t = Table(vec![header()]);
    // Mismatches are reported after the table (rows marked WRONG).
    let mut wrong: Vec<String> = Vec::new();
    let b = SGLANG_SPARSE_BLOCK;
    for (hot, history, block) in [
        (4096u32, 32768u32, 1u32),
        (2048, 32768, 1),
        (8192, 16384, 1),
        (4096, 131072, 1),
        (4096, 32768, b),
        (2048, 32768, b),
    ] {
        let seq = sequence(history, block, warm, reps);
        let mut bed = Bed::new(gpu, &peer.source, hot, history, false, hot, block)?;
        let config = match block {
            1 => format!("{hot} / {}K", history / 1024),
            b => format!("{hot} / {}K, block ids x{b}", history / 1024),
        };
        // times[run][kernel][mode] = per-step µs; our misses and last outputs of each run.
        let mut times = vec![vec![vec![Vec::new(); RUNS.len()]; KERNELS.len()]; peer.runs];
        let (mut misses, mut last) = (Vec::new(), Vec::new());
        let wrong_before = wrong.len();
        for (r, per_run) in times.iter_mut().enumerate() {
            for ki in order(r) {
                let kernel = KERNELS[ki];
                for (ri, &run) in RUNS.iter().enumerate() {
                    let (us, m, l) = run_sequence(gpu, &mut bed, &seq, kernel, run)?;
                    if kernel == Kernel::Ours {
                        if misses.is_empty() {
                            (misses, last) = (m, l);
                        } else if m != misses || l != last {
                            // The same decisions in every launch mode and run.
                            wrong.push(format!("{config}: run {r} {run:?}: outputs differ"));
                        }
                    }
                    per_run[ki][ri] = us;
                }
            }
        }
        for ph in &seq.phases {
            let timed = ph.start + warm..ph.start + warm + reps;
            let m = median(
                &mut misses[timed.clone()]
                    .iter()
                    .map(|&m| m as f64)
                    .collect::<Vec<_>>(),
            );
            let bytes = m * ROW as f64;
            // meds[run][kernel][mode]
            let meds: Vec<Vec<[Option<f64>; 4]>> = times
                .iter()
                .map(|per_run| {
                    per_run
                        .iter()
                        .map(|modes| {
                            [0, 1, 2, 3]
                                .map(|ri| Some(median(&mut modes[ri][timed.clone()].to_vec())))
                        })
                        .collect()
                })
                .collect();
            let gbs = |ki: usize| {
                let rates: Vec<f64> = meds
                    .iter()
                    .filter_map(|r| {
                        let net = r[ki][0]? - r[ki][2]?;
                        (bytes > 0.0 && net > 0.0).then(|| bytes / (net * 1e3))
                    })
                    .collect();
                med_of(rates).map_or("-".into(), |g| format!("{g:.1}"))
            };
            let mut row = vec![
                config.clone(),
                if wrong.len() > wrong_before {
                    format!("WRONG {}", ph.label)
                } else {
                    ph.label.to_string()
                },
                format!("{m:.0} ({:.1}%)", m / (REQS * K) as f64 * 100.0),
            ];
            row.extend(timing_cells(&meds));
            row.extend((0..KERNELS.len()).map(gbs));
            t.0.push(row);
        }
        eprintln!("peer: {config} done");
    }
    all_resident(gpu, &peer.source, peer.runs, reps, warm, &mut t)?;
    t.print();
    println!(
        "copy target: >= 45 GB/s (in-place gather ceiling 47 GB/s); misses/step: our distinct \
         misses (SGLang's are the same fresh positions); ratios: median over the runs (the worst \
         run in brackets)"
    );
    if !wrong.is_empty() {
        return Err(wrong.join("; ").into());
    }
    Ok(())
}

/// Only the all-resident row (`--mode peer-resident`).
pub(crate) fn run_resident(gpu: &Arc<Gpu>, reps: usize, peer: &PeerArgs) -> Res<()> {
    let mut t = Table(vec![header()]);
    all_resident(gpu, &peer.source, peer.runs, reps, 3, &mut t)?;
    t.print();
    Ok(())
}

/// The all-resident case: SGLang's short-sequence path (history 4096 ≤ its hot 4096: every token
/// already in its device buffer) against our direct path (history in borrowed pages, hot 2048),
/// and the floor of ours: the empty kernel of our parameters with our grid, block and shared
/// memory (`KV_LAB`'s `tierkit_kv_resolve_empty`), plain and in a graph.
fn all_resident(
    gpu: &Arc<Gpu>,
    peer: &SglangSource,
    runs: usize,
    reps: usize,
    warm: usize,
    t: &mut Table,
) -> Res<()> {
    let history = 4096u32;
    let mut bed = Bed::new(gpu, peer, 2048, history, true, 4096, 1)?;
    // Every session's history is in borrowed pages: the pool sets the direct-batch word.
    if !bed.ours.pool.device().direct_batch() {
        return Err("all resident: the pool did not set the direct-batch word".into());
    }
    let steps = resident_sets(history - 64, 42);
    let seq = Sequence {
        steps: (0..warm + reps).map(|i| steps[i % 4].clone()).collect(),
        phases: Vec::new(),
    };
    let mut meds = vec![vec![[None; 4]; KERNELS.len()]; runs];
    let mut last = Vec::new();
    // Timed rows are printed even when the outputs differ (the run then fails after them).
    let mut wrong = Vec::new();
    for (r, per_run) in meds.iter_mut().enumerate() {
        for ki in order(r) {
            let kernel = KERNELS[ki];
            for (ri, run) in [Run::Plain, Run::Graph].into_iter().enumerate() {
                let (us, m, l) = run_sequence(gpu, &mut bed, &seq, kernel, run)?;
                if m.iter().any(|&m| m > 0) {
                    wrong.push(format!("{kernel:?} {run:?}: fetched rows"));
                }
                if kernel == Kernel::Ours {
                    if last.is_empty() {
                        last = l;
                    } else if l != last {
                        wrong.push(format!("{kernel:?} {run:?}: outputs differ"));
                    }
                }
                per_run[ki][ri] = Some(median(&mut us[warm..].to_vec()));
            }
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
    row.extend(timing_cells(&meds));
    row.extend((0..KERNELS.len()).map(|_| "-".to_string()));
    t.0.push(row);
    let (plain, graph) = crate::bench::empty_launch_floor(gpu, &bed.ours, &bed.out, warm + reps)?;
    let mut floor = vec![
        "all resident (4K history)".to_string(),
        "floor: empty kernel, our launch shape".into(),
        "0".into(),
    ];
    floor.extend([
        "-".into(),
        format!("{plain:.1}"),
        "-".into(),
        "-".into(),
        format!("{graph:.1}"),
        "-".into(),
    ]);
    floor.extend((0..header().len() - floor.len()).map(|_| "-".to_string()));
    t.0.push(floor);
    if !wrong.is_empty() {
        t.print();
        return Err(format!("all resident: {}", wrong.join("; ")).into());
    }
    Ok(())
}
