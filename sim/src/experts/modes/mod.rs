//! Engine modes: how an engine serves a cold expert, and what each mode costs a step.
//!
//! The scoreboard of [`crate::experts::scoreboard`] models one engine, `in-place`: a cold
//! expert is read in place over the link by the grouped GEMM, and copies land at step
//! boundaries. This module prices the same traces in four modes ([`EngineMode`]):
//!
//! - **`in-place`**: as the scoreboard (reads at `read_gbps` on the critical path; the policy's
//!   swaps are boundary copies, [`LinkModel::stall_us`]).
//! - **`copy-on-miss`**: a miss copies the expert into HBM and the step computes it from there
//!   (vLLM's expert-pool design, PR #56177): a miss costs one copy on the critical path
//!   (`copy_us = bytes / copy_gbps + copy_fixed_us`, never hidden), no read. With an LRU bank
//!   ([`LruBank`], per layer or shared by all layers) the copy is admitted; with one of the
//!   project's policies the policy is the admission and eviction: the miss lands in a staging
//!   slot, the policy's map decides what stays, and a swap that admits an expert copied on a
//!   miss in the same step costs no second copy. The project's default
//!   ([`ModePolicy::Default`]) is a [`DuelBank`] instead: the controller's map protects the
//!   experts it wants hot, recency evicts among the rest, and per layer two shadow banks
//!   (recency alone, map first) say which rule evicts; with no evidence it is an LRU bank.
//! - **`read-or-copy`**: per expert and step, read in place or copy, whichever the link prices
//!   lower given the expected reuse (`copy_us ≤ read_us × (1 + reuse)`): in an LRU bank the reuse
//!   is [`bank`]'s estimate (expected further touched steps of the expert's run, from
//!   its past runs); under a policy's map a staged copy serves one step only (the policy,
//!   not the miss, decides residency), so the reuse is 0 and the choice is the cheaper of one
//!   read and one copy.
//! - **`cpu`**: the cold experts of a layer are split between the link (read in place) and the
//!   host CPU computing them from host memory ([`CpuChannel`]), whole experts per channel, the
//!   split that ends the layer first; the channels run in parallel, each at `together` of its
//!   solo rate when both have work. Boundary copies as in place.
//!
//! Per row, the stall is summed over steps; `vs in-place` divides a row's mean stall by the same
//! policy's in-place row's. Replays are deterministic.

pub mod admit;
pub mod bank;
pub mod mode;
pub mod optimal;
pub mod price;

use expert_residency::{
    Controller, ControllerConfig, ExpertError, Geometry, NullExecutor, PickCounters, ResidencyMap,
    Result,
};

pub use admit::DuelBank;
pub use bank::{BankScope, LruBank};
pub use mode::{EngineMode, StepCost};
pub use optimal::{mode_optima, ModeOptima};
pub use price::CpuChannel;

use crate::experts::check::validate_trace;
use crate::experts::link::LinkModel;
use crate::experts::scoreboard::{recency_config, Boot, RECENCY_CAP};
use crate::experts::trace::Trace;

/// What a mode row replays.
#[derive(Clone, Debug, PartialEq)]
pub enum ModePolicy {
    /// A fixed map (first-K, the seed map): never swapped.
    Map(ResidencyMap),
    /// The [`Controller`] with this config, from this boot map (drained through the
    /// [`PickCounters`] as in the scoreboard's replay, a [`NullExecutor`] committing swaps).
    Controller(ResidencyMap, Box<ControllerConfig>),
    /// An [`LruBank`] of this scope booting from this map (`None`: empty).
    Lru(BankScope, Option<ResidencyMap>),
    /// The project's default: the [`Controller`] with this config from this boot map as in
    /// [`ModePolicy::Controller`] in `in-place` and `cpu` (and in `read-or-copy` where a read is
    /// cheaper than a copy); in `copy-on-miss` (and `read-or-copy` where a copy is cheaper than
    /// one read, so every miss is copied) the controller's map is the admission and eviction of
    /// a [`DuelBank`].
    Default(ResidencyMap, Box<ControllerConfig>),
}

impl ModePolicy {
    /// The bank column: `map` (a policy's map, per layer) or the LRU bank's scope.
    pub fn bank(&self) -> &'static str {
        match self {
            ModePolicy::Map(_) | ModePolicy::Controller(..) | ModePolicy::Default(..) => {
                "per-layer"
            }
            ModePolicy::Lru(s, _) => s.name(),
        }
    }
}

/// The prices of a mode replay: the link (the scoreboard's) and the CPU channel.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModeOptions {
    /// The link ([`LinkModel`]: its prices are the library's `LinkCost`).
    pub link: LinkModel,
    /// The CPU channel of [`EngineMode::Cpu`].
    pub cpu: CpuChannel,
}

impl ModeOptions {
    /// Errors: [`ExpertError::InvalidConfig`] from the link's or the CPU's checks.
    pub fn validate(&self) -> Result<()> {
        self.link.validate()?;
        self.cpu.validate()
    }
}

/// One row of the modes table (JSON: `modes.rows` of `tierkit experts replay --mode ... --json`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModeRow {
    /// The mode the row assumes.
    pub mode: EngineMode,
    /// The policy (`static`, `seed`, `cost-aware (default)`, `recency (capped 4)`, `lru`).
    pub label: String,
    /// `per-layer` or `shared`.
    pub bank: String,
    /// The map the row booted from (`first-k`, `seed`, `empty`).
    pub boot: String,
    /// Steps replayed.
    pub steps: u64,
    /// Picks of experts not in HBM when their layer ran / all picks.
    pub miss_share: f64,
    /// Cold experts read in place, all steps.
    pub reads: u64,
    /// Copies, serving and boundary, all steps.
    pub copies: u64,
    /// Cold experts computed by the CPU, all steps.
    pub cpu: u64,
    /// Bytes read in place, GB (10⁹ bytes).
    pub host_read_gb: f64,
    /// Bytes copied host → HBM, GB.
    pub copy_gb: f64,
    /// Bytes of weights the CPU computed through, GB.
    pub cpu_gb: f64,
    /// Mean modelled stall per step, ms.
    pub stall_ms_per_step: f64,
    /// Mean stall over the same policy's in-place row's (`None` when that is 0).
    pub vs_in_place: Option<f64>,
    /// Mean stall over the offline optimum of the row's mode and bank scope ([`optimal`]; `None`
    /// where that optimum is not computed or is 0).
    #[serde(default)]
    pub vs_optimum: Option<f64>,
}

/// Sums of [`StepCost`] over a replay.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    steps: u64,
    picks: u64,
    miss_picks: u64,
    reads: u64,
    copies: u64,
    cpu: u64,
    stall_us: f64,
}

impl Totals {
    fn add(&mut self, c: &StepCost) {
        self.steps += 1;
        self.picks += c.picks;
        self.miss_picks += c.miss_picks;
        self.reads += c.reads;
        self.copies += c.serving_copies + c.boundary_copies;
        self.cpu += c.cpu;
        self.stall_us += c.stall_us;
    }

    /// The table row of these sums (`vs_in_place`, `vs_optimum` unset), experts of `b` bytes.
    fn row(&self, mode: EngineMode, label: &str, bank: &str, boot: &str, b: u64) -> ModeRow {
        let b = b as f64;
        let per = |v: f64| {
            if self.steps == 0 {
                0.0
            } else {
                v / self.steps as f64
            }
        };
        ModeRow {
            mode,
            label: label.into(),
            bank: bank.into(),
            boot: boot.into(),
            steps: self.steps,
            miss_share: if self.picks == 0 {
                0.0
            } else {
                self.miss_picks as f64 / self.picks as f64
            },
            reads: self.reads,
            copies: self.copies,
            cpu: self.cpu,
            host_read_gb: self.reads as f64 * b / 1e9,
            copy_gb: self.copies as f64 * b / 1e9,
            cpu_gb: self.cpu as f64 * b / 1e9,
            stall_ms_per_step: per(self.stall_us) / 1e3,
            vs_in_place: None,
            vs_optimum: None,
        }
    }
}

/// Prices a map-driven replay (a fixed map or the controller) in every mode of `modes` at once:
/// the map's trajectory does not depend on the mode (see the module docs for what each mode
/// charges).
fn map_policy_totals(
    trace: &Trace,
    geometry: &Geometry,
    policy: &ModePolicy,
    modes: &[EngineMode],
    opts: &ModeOptions,
) -> Result<Vec<Totals>> {
    let b = geometry.expert_bytes;
    let experts = geometry.experts_per_layer as usize;
    let (map, cfg) = match policy {
        ModePolicy::Map(m) => (m.clone(), None),
        ModePolicy::Controller(m, c) | ModePolicy::Default(m, c) => {
            (m.clone(), Some((**c).clone()))
        }
        ModePolicy::Lru(..) => unreachable!("LRU banks are replayed by LruBank"),
    };
    geometry.check_same(map.geometry())?;
    let mut ctl = match cfg {
        Some(c) => Some(Controller::new(map.clone(), c)?),
        None => None,
    };
    let counters = PickCounters::new(geometry)?;
    let mut null = NullExecutor::new();
    let mut totals = vec![Totals::default(); modes.len()];
    let mut count = vec![0u32; experts];
    let mut cold_cells: Vec<usize> = Vec::new();
    let mut cold_per_layer: Vec<u64> = Vec::new();
    for s in &trace.steps {
        let now = ctl.as_ref().map_or(&map, |c| c.map());
        let rows = now.layers();
        cold_cells.clear();
        cold_per_layer.clear();
        let mut miss_picks = 0u64;
        for (l, picks) in s.layers.iter().enumerate() {
            let mut n = 0;
            for &e in picks {
                if rows[l].table()[e as usize] < 0 {
                    miss_picks += 1;
                    let c = &mut count[e as usize];
                    if *c == 0 {
                        n += 1;
                        cold_cells.push(l * experts + e as usize);
                    }
                    *c += 1;
                }
            }
            for &e in picks {
                count[e as usize] = 0;
            }
            cold_per_layer.push(n);
        }
        let (applied, staged_admits) = match ctl.as_mut() {
            Some(c) => {
                let before = c.map().clone();
                counters.record_step(s)?;
                let rep = c.step(&counters, &mut null)?;
                // Incoming experts copied on a miss this step: in copy-on-miss their swap is free.
                let after = c.map();
                let staged = cold_cells
                    .iter()
                    .filter(|&&cell| {
                        let (l, e) = ((cell / experts) as u32, (cell % experts) as u32);
                        after.is_hot(l, e) && !before.is_hot(l, e)
                    })
                    .count() as u64;
                (rep.applied as u64, staged.min(rep.applied as u64))
            }
            None => (0, 0),
        };
        let cold: u64 = cold_per_layer.iter().sum();
        let picks = s.layers.iter().map(|p| p.len() as u64).sum();
        for (t, &mode) in totals.iter_mut().zip(modes) {
            let mut c = StepCost {
                picks,
                miss_picks,
                boundary_copies: applied,
                ..StepCost::default()
            };
            let copy = match mode {
                EngineMode::InPlace | EngineMode::Cpu => false,
                EngineMode::CopyOnMiss => true,
                EngineMode::ReadOrCopy => {
                    price::read_or_copy(&opts.link, b, 0.0) == price::Channel::Copy
                }
            };
            if copy {
                c.serving_copies = cold;
                c.boundary_copies = applied - staged_admits;
            } else if mode == EngineMode::Cpu {
                for &n in &cold_per_layer {
                    let (on_link, us) = opts.cpu.split(&opts.link, n, b);
                    c.reads += on_link;
                    c.cpu += n - on_link;
                    c.split_us += us;
                }
            } else {
                c.reads = cold;
            }
            c.finish(mode, &opts.link, b);
            t.add(&c);
        }
    }
    Ok(totals)
}

/// Replays an LRU bank in `mode`.
fn lru_totals(
    trace: &Trace,
    geometry: &Geometry,
    scope: BankScope,
    boot: Option<&ResidencyMap>,
    mode: EngineMode,
    opts: &ModeOptions,
) -> Result<Totals> {
    let mut bank = LruBank::new(geometry, scope, mode, boot, &opts.link, &opts.cpu)?;
    let mut t = Totals::default();
    for s in &trace.steps {
        t.add(&bank.step(&s.layers));
    }
    Ok(t)
}

/// Replays the default's copy-on-miss bank ([`DuelBank`]).
fn duel_totals(
    trace: &Trace,
    geometry: &Geometry,
    boot: &ResidencyMap,
    config: &ControllerConfig,
    opts: &ModeOptions,
) -> Result<Totals> {
    let mut bank = DuelBank::new(geometry, boot, config.clone(), &opts.link)?;
    let mut t = Totals::default();
    for s in &trace.steps {
        t.add(&bank.step(s)?);
    }
    Ok(t)
}

/// The policies of the modes table: `static` (first-K), `seed`, `cost-aware (default)`,
/// `recency (capped 4)` (their maps are the policy, as admission and eviction), and `lru` with a
/// per-layer and a shared bank; the adaptive and LRU rows boot from `boot` (first-K or the seed
/// map), as the scoreboard's.
///
/// Errors: geometry errors of [`ResidencyMap::first_k`].
pub fn mode_policies(
    trace: &Trace,
    geometry: &Geometry,
    seed: &ResidencyMap,
    boot: Boot,
) -> Result<Vec<(String, String, ModePolicy)>> {
    let first_k = ResidencyMap::first_k(trace.name.clone(), *geometry)?;
    let (start, boot_name) = match boot {
        Boot::FirstK => (first_k.clone(), "first-k"),
        Boot::Seed => (seed.clone(), "seed"),
    };
    let b = |s: &str| s.to_string();
    Ok(vec![
        (b("static"), b("first-k"), ModePolicy::Map(first_k)),
        (b("seed"), b("seed"), ModePolicy::Map(seed.clone())),
        (
            b("cost-aware (default)"),
            b(boot_name),
            ModePolicy::Default(start.clone(), Box::default()),
        ),
        (
            format!("recency (capped {RECENCY_CAP})"),
            b(boot_name),
            ModePolicy::Controller(start.clone(), Box::new(recency_config())),
        ),
        (
            b("lru"),
            b(boot_name),
            ModePolicy::Lru(BankScope::PerLayer, Some(start.clone())),
        ),
        (
            b("lru"),
            b(boot_name),
            ModePolicy::Lru(BankScope::Shared, Some(start)),
        ),
    ])
}

/// Replays every policy of `policies` (`(label, boot, policy)`, as [`mode_policies`] gives them)
/// in every mode of `modes` (duplicates dropped, table order), on up to
/// `available_parallelism` threads; rows grouped by mode, then in `policies`' order. The
/// in-place replay always runs, for `vs in-place`.
///
/// Errors: trace errors of [`validate_trace`]; [`ExpertError::InvalidConfig`] from
/// [`ModeOptions::validate`] or a bad controller config; map geometry mismatches.
pub fn mode_rows(
    trace: &Trace,
    geometry: &Geometry,
    policies: &[(String, String, ModePolicy)],
    modes: &[EngineMode],
    opts: &ModeOptions,
) -> Result<Vec<ModeRow>> {
    validate_trace(trace, geometry)?;
    opts.validate()?;
    let all = EngineMode::ALL;
    // Whether read-or-copy copies every miss of a map-driven row (a copy cheaper than one read).
    let roc_copies =
        price::read_or_copy(&opts.link, geometry.expert_bytes, 0.0) == price::Channel::Copy;
    // One job per map policy (all modes at once), one per LRU bank and mode; the default adds
    // its copy-on-miss bank.
    let jobs: Vec<(usize, Option<EngineMode>)> = policies
        .iter()
        .enumerate()
        .flat_map(|(i, (_, _, p))| match p {
            ModePolicy::Lru(..) => all.iter().map(|&m| (i, Some(m))).collect::<Vec<_>>(),
            ModePolicy::Default(..) => vec![(i, None), (i, Some(EngineMode::CopyOnMiss))],
            _ => vec![(i, None)],
        })
        .collect();
    let run = |&(i, mode): &(usize, Option<EngineMode>)| -> Result<Vec<Totals>> {
        match (&policies[i].2, mode) {
            (ModePolicy::Lru(s, boot), Some(m)) => Ok(vec![lru_totals(
                trace,
                geometry,
                *s,
                boot.as_ref(),
                m,
                opts,
            )?]),
            (ModePolicy::Default(boot, c), Some(_)) => {
                Ok(vec![duel_totals(trace, geometry, boot, c, opts)?])
            }
            (p, _) => map_policy_totals(trace, geometry, p, &all, opts),
        }
    };
    let results = parallel(&jobs, run)?;
    // totals[policy][mode]
    let mut totals: Vec<[Totals; 4]> = vec![[Totals::default(); 4]; policies.len()];
    // Map rows first, then the banks that override a mode of the default.
    for ((i, mode), r) in jobs.iter().zip(&results) {
        if mode.is_none() {
            totals[*i].copy_from_slice(r);
        }
    }
    for ((i, mode), r) in jobs.iter().zip(&results) {
        if let Some(m) = mode {
            totals[*i][mode_index(*m)] = r[0];
            if matches!(policies[*i].2, ModePolicy::Default(..)) && roc_copies {
                totals[*i][mode_index(EngineMode::ReadOrCopy)] = r[0];
            }
        }
    }
    let mut rows = Vec::new();
    for &mode in &all {
        if !modes.contains(&mode) {
            continue;
        }
        for ((label, boot, p), t) in policies.iter().zip(&totals) {
            let x = t[mode_index(mode)];
            let base = t[0].stall_us;
            let mut row = x.row(mode, label, p.bank(), boot, geometry.expert_bytes);
            row.vs_in_place = (base > 0.0).then(|| x.stall_us / base);
            rows.push(row);
        }
    }
    Ok(rows)
}

fn mode_index(m: EngineMode) -> usize {
    EngineMode::ALL
        .iter()
        .position(|&x| x == m)
        .expect("every mode is in ALL")
}

/// Runs `f` on every job on up to `available_parallelism` threads; results in job order.
fn parallel<J: Sync, R: Send>(jobs: &[J], f: impl Fn(&J) -> Result<R> + Sync) -> Result<Vec<R>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let out: Vec<Mutex<Option<Result<R>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                // Relaxed: the counter only hands out distinct indices; results go through mutexes.
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(j) = jobs.get(i) else { break };
                *out[i].lock().expect("no panic holds it") = Some(f(j));
            });
        }
    });
    out.into_iter()
        .map(|m| {
            m.into_inner()
                .expect("no panic holds it")
                .unwrap_or_else(|| Err(ExpertError::InvalidConfig("job not run".into())))
        })
        .collect()
}

/// The modes table as Markdown-compatible text: one row per (mode, policy), the mode first; each
/// mode's `offline optimum` rows of `optima` ([`ModeOptima::rows`]) close its group.
pub fn render_modes(rows: &[ModeRow], optima: &[ModeRow]) -> String {
    let ratio = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}×"));
    let mut ordered: Vec<&ModeRow> = Vec::with_capacity(rows.len() + optima.len());
    for &mode in &EngineMode::ALL {
        ordered.extend(rows.iter().filter(|r| r.mode == mode));
        ordered.extend(optima.iter().filter(|r| r.mode == mode));
    }
    let body: Vec<Vec<String>> = ordered
        .iter()
        .map(|r| {
            vec![
                r.mode.name().to_string(),
                r.label.clone(),
                r.bank.clone(),
                r.boot.clone(),
                format!("{:.4}", r.miss_share),
                format!("{:.1}", r.host_read_gb),
                format!("{:.1}", r.copy_gb),
                format!("{:.1}", r.cpu_gb),
                format!("{:.2}", r.stall_ms_per_step),
                ratio(r.vs_in_place),
                ratio(r.vs_optimum),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "mode",
            "policy",
            "bank",
            "boot",
            "miss share",
            "host GB read",
            "copy GB",
            "CPU GB",
            "stall ms/step",
            "vs in-place",
            "vs optimum",
        ],
        &body,
    )
}

/// The legend printed under [`render_modes`]' table.
pub fn modes_legend(opts: &ModeOptions) -> String {
    let l = &opts.link;
    format!(
        "mode = how the engine serves a cold expert: in-place = read over the link by the GEMM, copies at step boundaries (the scoreboard's model); copy-on-miss = copied into HBM and computed there in the same step (a copy on the critical path; an LRU bank admits it, a policy's map decides what stays and admits a just-copied expert for free; the default's bank evicts by recency, or by its map first where that shadow missed less, per layer); read-or-copy = read or copy per expert and step, whichever the link prices lower given the expected reuse (LRU bank: expected further touched steps of the expert's run; a policy's staged copy: none); cpu = a layer's cold experts split between the link and the host CPU, whole experts, in parallel.\n\
         link {}: reads {} GB/s, copies {} GB/s +{} µs each; CPU {} GB/s of weights, each channel at {} of its solo rate when both run. lru evicts the least recently used, then the fewest picks, then the lowest id; bank = per-layer (hot slots per layer) or shared (layers × hot slots, layers in order). miss share = picks of experts not in HBM when their layer ran; vs in-place = stall / the same policy's in-place stall (an optimum row: / the in-place optimum of its bank).\n\
         vs optimum = stall / the offline optimum of the row's mode and bank (its step-0 map free): in-place = the scoreboard's min-cost flow (Belady with bypass and copy costs; per layer, or jointly over every (layer, expert) with layers × hot slots for the shared bank); copy-on-miss = Belady's MIN (a miss costs one copy whatever is kept: keep the experts touched again soonest; per layer by step, shared by (step, layer)); read-or-copy = the copy-on-miss optimum where a copy costs at most a read (then a miss costs one copy either way), none where a read is cheaper; cpu = none (the two channels' split is not linear in cold experts). - = not computed.",
        l.name,
        l.cost.read_gbps,
        l.cost.copy_gbps,
        l.cost.copy_fixed_us,
        opts.cpu.cpu_gbps,
        opts.cpu.together,
    )
}

#[cfg(test)]
mod tests;
