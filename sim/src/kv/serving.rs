//! Serving simulation: one arrival trace, five placements of the KV history, the same decode
//! schedule model.
//!
//! - **Fully resident**: a request is admitted only if its whole KV (input + output tokens ×
//!   `kv_bytes_per_token`) fits in the HBM budget; reserved as pages of a `tier-core` [`PagePool`].
//!   Every pick is resident by construction, so it never misses.
//! - The other four share one [`ElasticPool`] design and its exact resolver (tail → borrowed page
//!   → hot cache → miss); only their residency policy ([`crate::kv::residency`]) differs:
//!   **fixed hot cache** (HiSparse: lending off), **elastic** (ours: free HBM lent newest first,
//!   taken back oldest first in proportion to holdings, lent back when pressure falls, admission
//!   limited by the link's share), **vllm-hybrid** (vLLM 0.34 Hybrid HiSparse: whole history
//!   resident until the pool runs low, then hot region and evictable pages in one FIFO free
//!   queue) and **sglang-demote** (SGLang dynamic HiSparse: full KV resident, largest requests
//!   demoted to their hot buffer under pressure, no promotion back).
//!
//! The schedule (arrivals, first come first served admission, one token per request per step,
//! batches, TTFT queueing, per-request TTFT and TPOT) is [`crate::kv::schedule::Scheduler`], the
//! one the GPU serving benchmark (`kv_serving_bench`) runs on measured step times;
//! [`TimeModel::fit`] fits this simulation's step time to that benchmark's per-step records.
//!
//! What is exact and what is modelled: admission, page loans, reclaims, hand-backs, hot-cache
//! contents, every resolve and every miss count come from the real pool and its resolver (the same
//! code the exactness proptest checks), run with 1-byte rows and one layer so the arena stays small;
//! bytes moved are then `misses × kv_bytes_per_token`. Modelled: the top-k picks (the calibrated
//! [`SelectionGen`], one stream per request standing for every layer), and time: a decode step takes
//! `step_base_us + step_per_request_us × batch + step_per_miss_us × misses`, prefill runs
//! elsewhere (disaggregated serving, as in Mooncake: a decode node receives each request's KV at
//! admission). Host-ward writes (vLLM's mirror of the prefix, SGLang's backup, every pool's
//! write-back of decoded tokens) are counted, not priced in step time (they run the other way
//! on the link, on a copy stream); SGLang's synchronous wait for a backup before a demotion is a
//! stall at `admission_gbps`.

use std::collections::HashMap;

use tier_core::{PageHandle, PagePool, Tier};

use crate::kv::residency::{AdmitOutcome, Residency, ResidencyCounters, ResidencyKind};
use crate::kv::schedule::{Decision, Phase, RequestTiming, Scheduler};
use crate::kv::selection::{SelectionGen, SelectionParams};
use crate::kv::trace::{ArrivalTrace, MAX_REQUEST_TOKENS};
use kv_elastic::Geometry;
use kv_elastic::{ElasticPool, PoolConfig};
use kv_elastic::{KvError, Result};
use kv_elastic::{ResolveInput, ResolveOutput, Resolver};

/// Where history lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Placement {
    /// Whole KV in HBM (conventional serving).
    FullyResident,
    /// Host history + fixed per-request hot cache (HiSparse).
    FixedHotCache,
    /// Host history + hot cache + borrowed elastic pages (Adaptive HiSparse, this crate).
    Elastic,
    /// vLLM 0.34 Hybrid HiSparse on the same pool ([`ResidencyKind::VllmHybrid`]).
    VllmHybrid,
    /// SGLang dynamic HiSparse demotion on the same pool ([`ResidencyKind::SglangDemote`]).
    SglangDemote,
}

impl Placement {
    /// All five, in report order.
    pub const ALL: [Placement; 5] = [
        Placement::FullyResident,
        Placement::FixedHotCache,
        Placement::Elastic,
        Placement::VllmHybrid,
        Placement::SglangDemote,
    ];

    /// Short name for tables (and the GPU benchmark's report).
    pub fn name(self) -> &'static str {
        match self {
            Placement::FullyResident => "fully resident",
            Placement::FixedHotCache => "fixed hot cache",
            Placement::Elastic => "elastic",
            Placement::VllmHybrid => "vllm-hybrid",
            Placement::SglangDemote => "sglang-demote",
        }
    }

    /// The placement named `name` ([`Placement::name`]), if any.
    pub fn from_name(name: &str) -> Option<Placement> {
        Placement::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The residency policy of a pool placement (None for the fully resident one).
    pub fn residency(self) -> Option<ResidencyKind> {
        match self {
            Placement::FullyResident => None,
            Placement::FixedHotCache => Some(ResidencyKind::Fixed),
            Placement::Elastic => Some(ResidencyKind::Elastic),
            Placement::VllmHybrid => Some(ResidencyKind::VllmHybrid),
            Placement::SglangDemote => Some(ResidencyKind::SglangDemote),
        }
    }
}

/// Most µs of each term of a [`TimeModel`] (10^9 µs, 1,000 s): with at most `u32::MAX` requests
/// per step and `u64::MAX` steps, every step time and the clock stay finite.
pub const MAX_STEP_TERM_US: f64 = 1e9;

/// Least non-zero [`SimConfig::admission_gbps`], GB/s (1 MB/s): a copy of a whole `u64` budget then
/// stalls at most ~1.8 × 10^19 µs, so the clock stays finite.
pub const MIN_ADMISSION_GBPS: f64 = 1e-3;

/// Decode step time model (µs).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TimeModel {
    /// Fixed cost of one decode step (weights read, launch), µs.
    pub step_base_us: f64,
    /// Added cost per request in the batch, µs.
    pub step_per_request_us: f64,
    /// Added cost per demand miss of the step (one token's KV over all layers fetched from host
    /// memory), µs. 0 (the default, and missing in older JSON) keeps misses out of step time, so
    /// all placements share one schedule and their misses compare at equal concurrency; the H200
    /// serving benchmark measured 0.95–0.99 µs (`docs/kv.md`).
    #[serde(default)]
    pub step_per_miss_us: f64,
}

impl TimeModel {
    /// Least-squares fit of `step_base_us + step_per_request_us × batch` to measured decode steps
    /// `(batch, µs)` (e.g. the `steps` of `kv_serving_bench`'s JSON report, one placement). A
    /// negative slope is clamped to 0 (the base is then the mean step). Errors
    /// (`KvError::InvalidConfig`): fewer than two distinct batch sizes, a non-finite or negative
    /// time, or a fitted base that is not > 0.
    pub fn fit(steps: &[(u32, f64)]) -> Result<TimeModel> {
        let mut sums = StepSums::default();
        for &(b, t) in steps {
            sums.add(b, 0, t)?;
        }
        sums.fit_batch_only()
    }

    /// Least-squares fit of `step_base_us + step_per_request_us × batch + step_per_miss_us ×
    /// misses` to measured decode steps `(batch, misses, µs)` (the `steps` of
    /// `kv_serving_bench`'s JSON report: `batch`, `misses`, `step_us`; the pools' placements,
    /// where misses vary). Negative slopes are refitted without that term. Errors
    /// (`KvError::InvalidConfig`): a non-finite or negative time, a degenerate design (fewer than
    /// two distinct batch sizes, or misses collinear with the batch), or a base that is not > 0.
    pub fn fit_with_misses(steps: &[(u32, u64, f64)]) -> Result<TimeModel> {
        let mut sums = StepSums::default();
        for &(b, m, t) in steps {
            sums.add(b, m, t)?;
        }
        sums.fit()
    }
}

/// Running least-squares sums of decode steps `(batch, misses, µs)`: the centred co-moments of
/// [`TimeModel::fit_with_misses`], updated one step at a time (Welford's method), so a caller
/// can refit after every step in O(1) — e.g. an admission rule that prices misses with the
/// step times it measured itself ([`crate::kv::residency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepSums {
    n: f64,
    mb: f64,
    mm: f64,
    mt: f64,
    sbb: f64,
    smm: f64,
    sbm: f64,
    sbt: f64,
    smt: f64,
    any_miss: bool,
}

impl StepSums {
    /// Adds one step. Error (`KvError::InvalidConfig`, nothing added): `us` not finite and >= 0.
    pub fn add(&mut self, batch: u32, misses: u64, us: f64) -> Result<()> {
        if !(us.is_finite() && us >= 0.0) {
            return Err(KvError::InvalidConfig(format!(
                "step time {us} µs must be finite and >= 0"
            )));
        }
        let (b, m) = (batch as f64, misses as f64);
        self.n += 1.0;
        let (db, dm, dt) = (b - self.mb, m - self.mm, us - self.mt);
        self.mb += db / self.n;
        self.mm += dm / self.n;
        self.mt += dt / self.n;
        let (eb, em, et) = (b - self.mb, m - self.mm, us - self.mt);
        self.sbb += db * eb;
        self.smm += dm * em;
        self.sbm += db * em;
        self.sbt += db * et;
        self.smt += dm * et;
        self.any_miss |= misses > 0;
        Ok(())
    }

    /// Steps added.
    pub fn steps(&self) -> u64 {
        self.n as u64
    }

    /// The two-term fit (`step_per_miss_us` 0) of [`TimeModel::fit`].
    pub fn fit_batch_only(&self) -> Result<TimeModel> {
        if self.n < 2.0 || self.sbb == 0.0 {
            return Err(KvError::InvalidConfig(
                "fitting a step-time model needs steps of at least two batch sizes".into(),
            ));
        }
        let slope = (self.sbt / self.sbb).max(0.0);
        Self::model(self.mt - slope * self.mb, slope, 0.0)
    }

    /// The three-term fit of [`TimeModel::fit_with_misses`] (the two-term one when no step
    /// missed).
    pub fn fit(&self) -> Result<TimeModel> {
        if !self.any_miss {
            return self.fit_batch_only();
        }
        let (sbb, smm, sbm) = (self.sbb, self.smm, self.sbm);
        let det = sbb * smm - sbm * sbm;
        if !(det.is_finite() && det > 1e-9 * (sbb * smm).max(f64::MIN_POSITIVE)) {
            return Err(KvError::InvalidConfig(
                "fitting a step-time model with misses needs steps whose batch and misses vary independently".into(),
            ));
        }
        let mut kb = (self.sbt * smm - self.smt * sbm) / det;
        let mut km = (self.smt * sbb - self.sbt * sbm) / det;
        if km < 0.0 {
            km = 0.0;
            kb = if sbb > 0.0 {
                (self.sbt / sbb).max(0.0)
            } else {
                0.0
            };
        } else if kb < 0.0 {
            kb = 0.0;
            km = if smm > 0.0 {
                (self.smt / smm).max(0.0)
            } else {
                0.0
            };
        }
        Self::model(self.mt - kb * self.mb - km * self.mm, kb, km)
    }

    fn model(base: f64, per_request: f64, per_miss: f64) -> Result<TimeModel> {
        if !(base.is_finite() && base > 0.0) {
            return Err(KvError::InvalidConfig(format!(
                "fitted step_base_us {base} must be > 0"
            )));
        }
        Ok(TimeModel {
            step_base_us: base,
            step_per_request_us: per_request,
            step_per_miss_us: per_miss,
        })
    }
}

/// Step-time models per placement (e.g. fitted by `tierkit kv fit-time` from the H200 serving
/// benchmark, where the resident step and the pools' steps differ: the pools resolve and fetch,
/// the resident placement converts a block table).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlacementTimes {
    /// [`Placement::FullyResident`].
    pub resident: TimeModel,
    /// [`Placement::FixedHotCache`].
    pub fixed: TimeModel,
    /// [`Placement::Elastic`].
    pub elastic: TimeModel,
    /// [`Placement::VllmHybrid`] (None: the elastic placement's; the same pool and resolver).
    #[serde(default)]
    pub vllm: Option<TimeModel>,
    /// [`Placement::SglangDemote`] (None: the elastic placement's).
    #[serde(default)]
    pub sglang: Option<TimeModel>,
}

impl PlacementTimes {
    /// `placement`'s model.
    pub fn get(&self, placement: Placement) -> TimeModel {
        match placement {
            Placement::FullyResident => self.resident,
            Placement::FixedHotCache => self.fixed,
            Placement::Elastic => self.elastic,
            Placement::VllmHybrid => self.vllm.unwrap_or(self.elastic),
            Placement::SglangDemote => self.sglang.unwrap_or(self.elastic),
        }
    }
}

/// Simulation parameters. [`SimConfig::default`] is the documented scenario of `docs/kv.md`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SimConfig {
    /// HBM given to KV, bytes.
    pub hbm_budget_bytes: u64,
    /// KV bytes of one token over all layers (DeepSeek-V3.2 fp8 MLA: 656 B × 61 layers = 40,016).
    pub kv_bytes_per_token: u64,
    /// Hot-cache rows per request (e.g. 2 × top-k).
    pub hot_rows: u32,
    /// Tail rows per request (newest positions, always resident).
    pub tail_rows: u32,
    /// Rows per elastic page.
    pub page_rows: u32,
    /// Most requests decoded together (engine's max batch).
    pub max_batch: u32,
    /// Most requests the elastic placement decodes together (None: `max_batch`; above
    /// `max_batch` is an invalid config). A lower cap leaves HBM to lend: fewer sessions, each missing less.
    #[serde(default)]
    pub elastic_max_batch: Option<u32>,
    /// The elastic placement admits under pressure only within the link's share
    /// ([`crate::kv::residency::AdmissionGate`]; inert while misses are not priced in step time).
    /// Missing in older JSON: on.
    #[serde(default = "default_true")]
    pub elastic_link_gate: bool,
    /// Most pages handed back / lent per step between steps.
    pub chunk_pages: u32,
    /// Step time model (every placement's, unless `placement_time` is set).
    pub time: TimeModel,
    /// Per-placement step time models, replacing `time` (None: `time` for all).
    #[serde(default)]
    pub placement_time: Option<PlacementTimes>,
    /// Host → HBM rate of the fully resident placement's admission copies, GB/s (10^9 bytes per
    /// second): the history of the requests admitted before a step (`input × kv_bytes_per_token`)
    /// is copied before it, a stall outside the step (the H200 serving benchmark measured ~49
    /// GB/s). 0 (the default, and missing in older JSON) leaves admissions free. The pools map a
    /// borrowed page once its fill has completed (deferred mapping, the benchmark's default) and
    /// serve those positions from host until then, so their admissions never stall a step.
    #[serde(default)]
    pub admission_gbps: f64,
    /// Decode steps simulated (per placement).
    pub max_steps: u64,
    /// Arrival speed-up (> 1 = arrivals come faster than in the trace).
    pub load: f64,
    /// The selection model.
    pub selection: SelectionParams,
    /// Seed of the selection streams.
    pub seed: u64,
    /// Host memory a run may be estimated to allocate ([`crate::kv::footprint::estimate`]),
    /// bytes: [`simulate_placement`] refuses a larger run before allocating anything (the
    /// documented scenarios take well under 1 GiB). Missing in older JSON: the default.
    #[serde(default = "default_max_memory_bytes")]
    pub max_memory_bytes: u64,
}

/// [`SimConfig::max_memory_bytes`]'s default: 4 GiB (`tierkit kv simulate --max-memory-gib`'s).
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 4 << 30;

fn default_max_memory_bytes() -> u64 {
    DEFAULT_MAX_MEMORY_BYTES
}

fn default_true() -> bool {
    true
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            hbm_budget_bytes: 24 << 30,
            kv_bytes_per_token: 656 * 61,
            hot_rows: 4096,
            tail_rows: 64,
            page_rows: 64,
            max_batch: 256,
            elastic_max_batch: None,
            elastic_link_gate: true,
            chunk_pages: 1024,
            time: TimeModel {
                step_base_us: 25_000.0,
                step_per_request_us: 100.0,
                step_per_miss_us: 0.0,
            },
            placement_time: None,
            admission_gbps: 0.0,
            max_steps: 3000,
            load: 1.0,
            selection: SelectionParams::calibrated(2048),
            seed: 1,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
        }
    }
}

impl SimConfig {
    /// Checks the configuration before a run (`KvError::InvalidConfig` naming the field, or the
    /// geometry's `InvalidGeometry` / `ArenaTooSmall`). Bounds: `hbm_budget_bytes`,
    /// `kv_bytes_per_token` (bytes), `max_batch` (requests) and `chunk_pages` (pages) `>= 1`;
    /// every placement's step-time model as in [`TimeModel::validate`] (the error names the
    /// placement); `admission_gbps` 0 or finite and `>=` [`MIN_ADMISSION_GBPS`] GB/s; `load` finite and `> 0`; `selection` as in [`SelectionParams::validate`] with
    /// `top_k <= hot_rows` (a step's distinct misses must fit in the hot cache); and
    /// [`SimConfig::geometry`] valid (`page_rows`, `hot_rows`, `tail_rows >= 1`, arena rows below
    /// 2^31, one request's fixed rows fit in the budget).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(KvError::InvalidConfig(m));
        if self.hbm_budget_bytes == 0 {
            return bad("hbm_budget_bytes must be > 0".into());
        }
        if self.kv_bytes_per_token == 0 {
            return bad("kv_bytes_per_token must be > 0".into());
        }
        if self.max_batch == 0 || self.elastic_max_batch == Some(0) {
            return bad(
                "max_batch and elastic_max_batch must be >= 1 (no request could ever run)".into(),
            );
        }
        if let Some(c) = self.elastic_max_batch.filter(|&c| c > self.max_batch) {
            return bad(format!(
                "elastic_max_batch {c} is above max_batch {} (the cap can only lower it)",
                self.max_batch
            ));
        }
        if self.chunk_pages == 0 {
            return bad("chunk_pages must be >= 1".into());
        }
        let g = self.admission_gbps;
        if !(g.is_finite() && (g == 0.0 || g >= MIN_ADMISSION_GBPS)) {
            return bad(format!(
                "admission_gbps {g} must be 0 (free) or finite and >= {MIN_ADMISSION_GBPS} GB/s"
            ));
        }
        for p in Placement::ALL {
            self.time_for(p).validate(p.name())?;
        }
        self.selection.validate()?;
        if self.selection.top_k > self.hot_rows {
            return bad(format!(
                "top_k {} must be <= hot_rows {} (a step's misses must fit in the hot cache)",
                self.selection.top_k, self.hot_rows
            ));
        }
        if !(self.load.is_finite() && self.load > 0.0) {
            return bad(format!("load {} must be finite and > 0", self.load));
        }
        self.geometry().validate()
    }

    /// The step-time model `placement` runs with (`placement_time`'s, else `time`).
    pub fn time_for(&self, placement: Placement) -> TimeModel {
        self.placement_time.map_or(self.time, |t| t.get(placement))
    }
}

impl TimeModel {
    /// Checks the terms (`KvError::InvalidConfig` naming `what`, e.g. the placement):
    /// `step_base_us` in `(0, MAX_STEP_TERM_US]` µs, the per-request and per-miss terms in
    /// `[0, MAX_STEP_TERM_US]` µs ([`MAX_STEP_TERM_US`] keeps every step time and the clock finite).
    pub fn validate(&self, what: &str) -> Result<()> {
        let bad = |m: String| Err(KvError::InvalidConfig(format!("{what}: {m}")));
        let t = *self;
        let max = MAX_STEP_TERM_US;
        if !(t.step_base_us.is_finite() && t.step_base_us > 0.0 && t.step_base_us <= max) {
            return bad(format!(
                "step_base_us {} must be in (0, {max:e}] µs",
                t.step_base_us
            ));
        }
        for (name, v) in [
            ("step_per_miss_us", t.step_per_miss_us),
            ("step_per_request_us", t.step_per_request_us),
        ] {
            if !(v.is_finite() && (0.0..=max).contains(&v)) {
                return bad(format!("{name} {v} must be in [0, {max:e}] µs"));
            }
        }
        Ok(())
    }
}

impl SimConfig {
    /// HBM budget in token rows (`hbm_budget_bytes / kv_bytes_per_token`).
    pub fn budget_rows(&self) -> u64 {
        self.hbm_budget_bytes / self.kv_bytes_per_token.max(1)
    }

    /// Pages in the budget.
    pub fn budget_pages(&self) -> u32 {
        (self.budget_rows() / self.page_rows.max(1) as u64).min(u32::MAX as u64) as u32
    }

    /// The pool geometry the hot-cache placements run with (1-byte rows, one layer).
    pub fn geometry(&self) -> Geometry {
        Geometry {
            row_bytes: 1,
            layers: 1,
            page_rows: self.page_rows,
            arena_pages: self.budget_pages(),
            hot_rows: self.hot_rows,
            tail_rows: self.tail_rows,
            scratch_rows: 0,
            layer_groups: kv_elastic::LayerGroups::per_layer(),
        }
    }
}

/// One placement's results.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlacementReport {
    /// The placement.
    pub placement: Placement,
    /// Decode steps run.
    pub steps: u64,
    /// Simulated seconds.
    pub sim_seconds: f64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests finished.
    pub completed: u64,
    /// Requests that can never fit (larger than the whole budget), skipped.
    pub rejected: u64,
    /// Most sessions admitted at once.
    pub peak_sessions: u32,
    /// Median decode batch over steps.
    pub median_batch: u32,
    /// Mean decode batch over steps.
    pub mean_batch: f64,
    /// Valid picks per step (mean).
    pub picks_per_step: f64,
    /// Demand misses per step (mean; distinct positions fetched from host).
    pub misses_per_step: f64,
    /// Bytes fetched from host per step by demand misses (`misses × kv_bytes_per_token`).
    pub fetched_bytes_per_step: f64,
    /// Bytes copied host → HBM per step to fill borrowed pages (bulk, off the critical path).
    pub fill_bytes_per_step: f64,
    /// Steps with no miss at all (fraction).
    pub zero_miss_steps: f64,
    /// Elastic pages reclaimed.
    pub pages_reclaimed: u64,
    /// Elastic pages of finished sessions handed back.
    pub pages_handed_back: u64,
    /// Requests still waiting at the end.
    pub queued_at_end: u64,
    /// Decode tokens per simulated second of busy time (the scheduler's; the GPU serving
    /// benchmark reports the same figure measured).
    #[serde(default)]
    pub tokens_per_s: f64,
    /// Host-ward bytes per step written at admission (vLLM's mirror of the prefix, SGLang's
    /// backup; `mirror_tokens × kv_bytes_per_token`).
    #[serde(default)]
    pub mirror_bytes_per_step: f64,
    /// Host-ward bytes per step of decoded tokens written back (every pool placement alike).
    #[serde(default)]
    pub writeback_bytes_per_step: f64,
    /// HBM pages in use (fixed, lent, pending, queued; the resident placement's reserved pages)
    /// as bytes of all layers, peak over the steps.
    #[serde(default)]
    pub device_bytes_peak: u64,
    /// The same, mean over the steps.
    #[serde(default)]
    pub device_bytes_mean: f64,
    /// Median time per output token of the requests finished in the run, ms.
    #[serde(default)]
    pub tpot_p50_ms: f64,
    /// 99th percentile of the same, ms.
    #[serde(default)]
    pub tpot_p99_ms: f64,
    /// Stall of SGLang's synchronous backup waits before demotions, µs in all.
    #[serde(default)]
    pub backup_wait_us: f64,
    /// The residency policy's totals (transitions, demotions, pages it took back, gated
    /// admissions, mirrored tokens).
    #[serde(default)]
    pub residency: ResidencyCounters,
    /// Every arrived request's clock readings (for TTFT and TPOT over the requests every
    /// placement finished: [`crate::kv::schedule::common_finished`]).
    #[serde(default)]
    pub requests: Vec<RequestTiming>,
}

/// All placements on one run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SimReport {
    /// Trace name.
    pub trace: String,
    /// The configuration.
    pub config: SimConfig,
    /// One report per placement, in [`Placement::ALL`] order.
    pub placements: Vec<PlacementReport>,
}

/// A running request's placement state (its schedule is the [`Scheduler`]'s).
struct Running {
    gen: Option<SelectionGen>,
    pages: Vec<PageHandle>,
}

enum Store {
    Resident(PagePool),
    Pool(Box<ElasticPool>, Box<Residency>),
}

/// Simulates every placement on the same trace and configuration (errors as
/// [`simulate_placement`]).
pub fn simulate(trace: &ArrivalTrace, cfg: &SimConfig) -> Result<SimReport> {
    let placements = Placement::ALL
        .iter()
        .map(|&p| simulate_placement(trace, cfg, p))
        .collect::<Result<Vec<_>>>()?;
    Ok(SimReport {
        trace: trace.name.clone(),
        config: *cfg,
        placements,
    })
}

/// Simulates one placement (see the module doc). Errors (checked before anything runs):
/// [`SimConfig::validate`]'s (`InvalidConfig`, `InvalidGeometry`, `ArenaTooSmall` when the budget
/// cannot hold one request's fixed rows); `KvError::Trace` for an empty trace or a request of more than
/// [`crate::kv::trace::MAX_REQUEST_TOKENS`] tokens; `InvalidConfig` when the run's estimated host
/// memory ([`crate::kv::footprint::estimate`]) is above [`SimConfig::max_memory_bytes`], naming the
/// part that dominates; `InvalidConfig` if a request could not be admitted
/// into an idle pool (never expected, but it ends the run instead of spinning); pool errors (none
/// expected).
pub fn simulate_placement(
    trace: &ArrivalTrace,
    cfg: &SimConfig,
    placement: Placement,
) -> Result<PlacementReport> {
    cfg.validate()?;
    if trace.requests.is_empty() {
        return Err(KvError::Trace(format!(
            "{}: no requests (empty trace)",
            trace.name
        )));
    }
    if let Some((i, q)) =
        trace.requests.iter().enumerate().find(|(_, q)| {
            q.input_length as u64 + q.output_length as u64 > MAX_REQUEST_TOKENS as u64
        })
    {
        return Err(KvError::Trace(format!(
            "request {i}: {} + {} tokens, at most {MAX_REQUEST_TOKENS}",
            q.input_length, q.output_length
        )));
    }
    let e = crate::kv::footprint::estimate(cfg, trace);
    if e.total() > cfg.max_memory_bytes {
        let size = |b: u64| match b {
            b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
            b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
            b => format!("{b} B"),
        };
        let part = match e.largest_part() {
            crate::kv::footprint::Part::Pages => format!(
                "{} pages take {} of page tables and arena (raise page_rows or \
                 kv_bytes_per_token, or lower hbm_budget_bytes)",
                e.arena_pages,
                size(e.page_bytes.saturating_add(e.arena_bytes))
            ),
            crate::kv::footprint::Part::Sessions => format!(
                "{} sessions at once take {} (lower hot_rows or max_batch, or use fewer / \
                 shorter requests)",
                e.sessions,
                size(e.session_bytes)
            ),
        };
        return Err(KvError::InvalidConfig(format!(
            "the run would allocate about {} of host memory, above max_memory_bytes ({}): {part}",
            size(e.total()),
            size(cfg.max_memory_bytes)
        )));
    }
    let g = cfg.geometry();
    let mut store = match placement.residency() {
        None => Store::Resident(PagePool::new(Tier::DeviceHbm, g.arena_pages)?),
        Some(kind) => Store::Pool(
            Box::new(ElasticPool::new(
                g,
                PoolConfig {
                    elastic: kind != ResidencyKind::Fixed,
                },
            )?),
            Box::new(Residency::new(kind, cfg.elastic_link_gate)),
        ),
    };
    let cap = match (placement, cfg.elastic_max_batch) {
        (Placement::Elastic, Some(c)) => c,
        _ => cfg.max_batch,
    };
    let mut sched = Scheduler::new(trace, cfg.load, cap)?;
    let time = cfg.time_for(placement);
    let mut runs: HashMap<u64, Running> = HashMap::new();
    let mut r = PlacementReport {
        placement,
        steps: 0,
        sim_seconds: 0.0,
        admitted: 0,
        completed: 0,
        rejected: 0,
        peak_sessions: 0,
        median_batch: 0,
        mean_batch: 0.0,
        picks_per_step: 0.0,
        misses_per_step: 0.0,
        fetched_bytes_per_step: 0.0,
        fill_bytes_per_step: 0.0,
        zero_miss_steps: 0.0,
        pages_reclaimed: 0,
        pages_handed_back: 0,
        queued_at_end: 0,
        tokens_per_s: 0.0,
        mirror_bytes_per_step: 0.0,
        writeback_bytes_per_step: 0.0,
        device_bytes_peak: 0,
        device_bytes_mean: 0.0,
        tpot_p50_ms: 0.0,
        tpot_p99_ms: 0.0,
        backup_wait_us: 0.0,
        residency: ResidencyCounters::default(),
        requests: Vec::new(),
    };
    let (mut picks, mut misses, mut zero_miss) = (0u64, 0u64, 0u64);
    let (mut pages_used_sum, mut pages_used_peak, mut writeback) = (0u64, 0u32, 0u64);
    let page_bytes = cfg.page_rows as u64 * cfg.kv_bytes_per_token;
    let (mut sessions, mut qsl, mut seq_lens, mut topk, mut one) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut indices, mut valid) = (Vec::new(), Vec::new());
    let k = cfg.selection.top_k as usize;
    let history_buf = vec![
        0u8;
        trace
            .requests
            .iter()
            .map(|q| q.input_length as usize)
            .max()
            .unwrap_or(0)
    ];
    // SGLang's synchronous backup waits: the tokens waited for since the last look, as a stall.
    let mut waited_tokens = 0u64;
    let mut backup_wait = |sched: &mut Scheduler, c: &ResidencyCounters| -> Result<f64> {
        let new = c.backup_wait_tokens - waited_tokens;
        waited_tokens = c.backup_wait_tokens;
        if new == 0 || cfg.admission_gbps <= 0.0 {
            return Ok(0.0);
        }
        let us = (new * cfg.kv_bytes_per_token) as f64 / (cfg.admission_gbps * 1e3);
        sched.stall(us)?;
        Ok(us)
    };
    while sched.steps() < cfg.max_steps {
        if let Store::Pool(_, res) = &mut store {
            res.begin_round();
        }
        // Admissions, first come first served (head-of-line waits).
        let admitted = sched.admit(|a| -> Result<Decision> {
            match &mut store {
                Store::Resident(pool) => {
                    let need = a.total().div_ceil(cfg.page_rows as u64);
                    if need > pool.capacity() as u64 {
                        return Ok(Decision::Reject);
                    }
                    match pool.alloc_many(need as u32) {
                        Ok(pages) => {
                            runs.insert(a.id, Running { gen: None, pages });
                            Ok(Decision::Admitted)
                        }
                        Err(_) => Ok(Decision::NoRoom),
                    }
                }
                Store::Pool(pool, res) => {
                    let history = &history_buf[..a.input as usize];
                    match res.admit(pool.as_mut(), a.id, history, a.input)? {
                        AdmitOutcome::Admitted { .. } => {
                            // total <= MAX_REQUEST_TOKENS (checked above).
                            let gen = SelectionGen::new(
                                cfg.selection,
                                cfg.seed ^ a.id.wrapping_mul(0x9E37_79B9),
                                a.total() as u32,
                            )?;
                            runs.insert(
                                a.id,
                                Running {
                                    gen: Some(gen),
                                    pages: Vec::new(),
                                },
                            );
                            Ok(Decision::Admitted)
                        }
                        AdmitOutcome::NoRoom => Ok(Decision::NoRoom),
                        AdmitOutcome::Never => Ok(Decision::Reject),
                    }
                }
            }
        })?;
        r.admitted += admitted.len() as u64;
        // The resident placement copies each admitted history into HBM before its first step.
        if placement == Placement::FullyResident && cfg.admission_gbps > 0.0 {
            let bytes: u64 = admitted
                .iter()
                .map(|a| a.input as u64 * cfg.kv_bytes_per_token)
                .sum();
            if bytes > 0 {
                sched.stall(bytes as f64 / (cfg.admission_gbps * 1e3))?;
            }
        }
        if let Store::Pool(_, res) = &store {
            r.backup_wait_us += backup_wait(&mut sched, res.counters())?;
        }
        match sched.before_step() {
            Ok(Phase::Step) => {}
            Ok(Phase::Waited) => continue,
            Ok(Phase::Done) => break,
            // Nothing runs, so nothing will ever free room for the head of the queue.
            Err(KvError::InvalidConfig(m)) => {
                return Err(KvError::InvalidConfig(format!(
                    "{m} ({})",
                    placement.name()
                )))
            }
            Err(e) => return Err(e),
        }
        let batch = sched.running().len() as u32;
        let used = match &mut store {
            Store::Resident(pool) => pool.used_count(),
            Store::Pool(pool, res) => {
                sessions.clear();
                sessions.extend(sched.running().iter().map(|a| a.id));
                res.before_step(pool.as_mut(), &sessions);
                let c = pool.pages();
                c.capacity - c.free
            }
        };
        pages_used_sum += used as u64;
        pages_used_peak = pages_used_peak.max(used);
        // One decode step: every running request picks top-k over its history.
        let mut step_misses = 0;
        if let Store::Pool(pool, _) = &mut store {
            sessions.clear();
            qsl.clear();
            seq_lens.clear();
            topk.clear();
            qsl.push(0);
            for a in sched.running() {
                let h = a.history();
                runs.get_mut(&a.id)
                    .and_then(|x| x.gen.as_mut())
                    .expect("pool placements draw picks")
                    .step(h, &mut one);
                topk.extend_from_slice(&one);
                sessions.push(a.id);
                seq_lens.push(h as i32);
                qsl.push(sessions.len() as i32);
            }
            indices.resize(topk.len(), 0);
            valid.resize(sessions.len(), 0);
            let input = ResolveInput {
                sessions: &sessions,
                query_start_loc: &qsl,
                seq_lens: &seq_lens,
                topk: &topk,
                k,
                layer: 0,
            };
            let done = pool.resolve(
                &input,
                &mut ResolveOutput {
                    indices: &mut indices,
                    valid_count: &mut valid,
                },
            )?;
            picks += done.stats.picks;
            step_misses = done.stats.misses;
            drop(done.ticket); // the step's kernel has run
        } else {
            picks += sched
                .running()
                .iter()
                .map(|x| x.history().min(k as u32) as u64)
                .sum::<u64>();
        }
        misses += step_misses;
        zero_miss += (step_misses == 0) as u64;
        // Each request commits one token; finished ones leave.
        for a in sched.running() {
            match &mut store {
                Store::Pool(pool, res) => {
                    if a.last_step() {
                        pool.finish(a.id)?;
                        res.finished(a.id);
                    } else {
                        pool.append(a.id, &[0u8])?;
                        writeback += 1;
                    }
                }
                Store::Resident(pool) => {
                    if a.last_step() {
                        for h in runs
                            .get_mut(&a.id)
                            .map(|x| std::mem::take(&mut x.pages))
                            .unwrap_or_default()
                        {
                            pool.free(h)?;
                        }
                    }
                }
            }
        }
        let step_us = time.step_base_us
            + time.step_per_request_us * batch as f64
            + time.step_per_miss_us * step_misses as f64;
        for f in sched.end_step(step_us)? {
            runs.remove(&f.id);
        }
        if let Store::Pool(pool, res) = &mut store {
            res.observe_step(batch, step_misses, step_us);
            sessions.clear();
            sessions.extend(sched.running().iter().map(|a| a.id));
            res.between_steps(pool.as_mut(), &sessions, cfg.chunk_pages)?;
            r.backup_wait_us += backup_wait(&mut sched, res.counters())?;
        }
    }
    let s = sched.summary();
    r.steps = s.steps;
    r.sim_seconds = s.elapsed_s;
    r.completed = s.completed;
    r.rejected = s.rejected;
    r.peak_sessions = s.peak_batch;
    r.median_batch = s.median_batch;
    r.mean_batch = s.mean_batch;
    r.queued_at_end = s.queued_at_end;
    r.tokens_per_s = s.tokens_per_s;
    r.tpot_p50_ms = s.tpot_p50_ms;
    r.tpot_p99_ms = s.tpot_p99_ms;
    r.requests = sched.arrived_timings();
    let steps = r.steps.max(1) as f64;
    r.picks_per_step = picks as f64 / steps;
    r.misses_per_step = misses as f64 / steps;
    r.fetched_bytes_per_step = r.misses_per_step * cfg.kv_bytes_per_token as f64;
    r.zero_miss_steps = zero_miss as f64 / steps;
    r.device_bytes_peak = pages_used_peak as u64 * page_bytes;
    r.device_bytes_mean = pages_used_sum as f64 / steps * page_bytes as f64;
    if let Store::Pool(pool, res) = &store {
        let c = pool.counters();
        r.fill_bytes_per_step = c.page_fill_tokens as f64 * cfg.kv_bytes_per_token as f64 / steps;
        r.pages_reclaimed = c.pages_reclaimed;
        r.pages_handed_back = c.pages_handed_back;
        r.residency = *res.counters();
        r.mirror_bytes_per_step =
            r.residency.mirror_tokens as f64 * cfg.kv_bytes_per_token as f64 / steps;
        r.writeback_bytes_per_step = writeback as f64 * cfg.kv_bytes_per_token as f64 / steps;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::trace::TraceRequest;

    fn small() -> SimConfig {
        SimConfig {
            hbm_budget_bytes: 64 * 16 * 100,
            kv_bytes_per_token: 100,
            hot_rows: 32,
            tail_rows: 8,
            page_rows: 8,
            max_batch: 64,
            chunk_pages: 16,
            max_steps: 400,
            selection: SelectionParams::calibrated(16),
            ..SimConfig::default()
        }
    }

    fn trace(n: usize, gap_ms: u64, input: u32) -> ArrivalTrace {
        ArrivalTrace {
            name: "t".into(),
            requests: (0..n)
                .map(|i| TraceRequest {
                    arrival_ms: i as u64 * gap_ms,
                    input_length: input,
                    output_length: 20,
                })
                .collect(),
        }
    }

    #[test]
    fn bad_configs_are_typed_errors_before_anything_runs() {
        let t = trace(3, 10, 50);
        let inval = |c: SimConfig| {
            for p in Placement::ALL {
                let r = simulate_placement(&t, &c, p);
                assert!(
                    matches!(r, Err(KvError::InvalidConfig(_))),
                    "{p:?} {c:?}: {r:?}"
                );
            }
        };
        // Item 1: max_batch 0 used to spin forever.
        inval(SimConfig {
            max_batch: 0,
            ..small()
        });
        inval(SimConfig {
            chunk_pages: 0,
            ..small()
        });
        // Item 13: NaN / negative / zero floats.
        for load in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
            inval(SimConfig { load, ..small() });
        }
        // Finite but so large that a step (or the clock) would overflow to inf.
        for step_base_us in [f64::NAN, 0.0, -5.0, 1e308, MAX_STEP_TERM_US * 2.0] {
            inval(SimConfig {
                time: TimeModel {
                    step_base_us,
                    step_per_request_us: 1.0,
                    step_per_miss_us: 0.0,
                },
                ..small()
            });
        }
        inval(SimConfig {
            time: TimeModel {
                step_base_us: 1.0,
                step_per_request_us: f64::NAN,
                step_per_miss_us: 0.0,
            },
            ..small()
        });
        for (step_per_request_us, step_per_miss_us) in [(1.0, -1.0), (1e308, 0.0), (0.0, 1e10)] {
            inval(SimConfig {
                time: TimeModel {
                    step_base_us: 1.0,
                    step_per_request_us,
                    step_per_miss_us,
                },
                ..small()
            });
        }
        for admission_gbps in [1e-300, MIN_ADMISSION_GBPS / 2.0] {
            inval(SimConfig {
                admission_gbps,
                ..small()
            });
        }
        inval(SimConfig {
            hbm_budget_bytes: 0,
            ..small()
        });
        inval(SimConfig {
            kv_bytes_per_token: 0,
            ..small()
        });
        // `--top-k` huge: rejected before a selection vector is built.
        inval(SimConfig {
            selection: SelectionParams::calibrated(2_147_483_680),
            ..small()
        });
        inval(SimConfig {
            selection: SelectionParams::calibrated(64),
            ..small()
        });
        // Item 2: page_rows 0 used to divide by zero in the fully resident placement.
        for p in Placement::ALL {
            let r = simulate_placement(
                &t,
                &SimConfig {
                    page_rows: 0,
                    ..small()
                },
                p,
            );
            assert!(
                matches!(r, Err(KvError::InvalidGeometry(_))),
                "{p:?}: {r:?}"
            );
        }
        // Item 3: hot + tail wrapping to 0 fixed rows; and a 16 GB hot cache.
        for (hot_rows, tail_rows) in [(64, 4_294_967_232), (u32::MAX, 1)] {
            let c = SimConfig {
                hot_rows,
                tail_rows,
                ..small()
            };
            for p in Placement::ALL {
                let r = simulate_placement(&t, &c, p);
                assert!(
                    matches!(
                        r,
                        Err(KvError::InvalidGeometry(_)) | Err(KvError::ArenaTooSmall { .. })
                    ),
                    "{p:?}: {r:?}"
                );
            }
        }
        // A request longer than the documented bound (public trace fields bypass the reader).
        let mut long = t.clone();
        long.requests[1].input_length = u32::MAX;
        let r = simulate_placement(&long, &small(), Placement::Elastic);
        assert!(matches!(r, Err(KvError::Trace(_))), "{r:?}");
        let r = simulate(&trace(0, 1, 10), &small());
        assert!(matches!(r, Err(KvError::Trace(m)) if m.contains("empty trace")));
    }

    /// A library caller is held to `max_memory_bytes` as the CLI is: refused before anything is
    /// allocated, the dominant part named; the limit is the estimate's (one byte more runs); JSON
    /// without the field reads the default.
    #[test]
    fn runs_above_the_memory_limit_are_refused_before_allocating() {
        let t = trace(20, 10, 30);
        let need = crate::kv::footprint::estimate(&small(), &t).total();
        assert!(need > 0);
        let tight = SimConfig {
            max_memory_bytes: need - 1,
            ..small()
        };
        for p in Placement::ALL {
            let r = simulate_placement(&t, &tight, p);
            assert!(
                matches!(&r, Err(KvError::InvalidConfig(m))
                    if m.contains("max_memory_bytes") && m.contains("20 sessions at once")),
                "{p:?}: {r:?}"
            );
        }
        let fits = SimConfig {
            max_memory_bytes: need,
            ..small()
        };
        assert!(simulate_placement(&t, &fits, Placement::Elastic).is_ok());
        let mut json = serde_json::to_value(small()).unwrap();
        json.as_object_mut().unwrap().remove("max_memory_bytes");
        let back: SimConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back.max_memory_bytes, DEFAULT_MAX_MEMORY_BYTES);
    }

    #[test]
    fn time_model_fit_recovers_a_line_and_rejects_bad_samples() {
        let steps: Vec<(u32, f64)> = (1..=50).map(|b| (b, 5000.0 + 40.0 * b as f64)).collect();
        let m = TimeModel::fit(&steps).unwrap();
        assert!((m.step_base_us - 5000.0).abs() < 1e-6, "{m:?}");
        assert!((m.step_per_request_us - 40.0).abs() < 1e-9, "{m:?}");
        // A falling line is clamped to a flat one at the mean.
        let m = TimeModel::fit(&[(1, 10.0), (3, 6.0)]).unwrap();
        assert_eq!((m.step_base_us, m.step_per_request_us), (8.0, 0.0));
        for bad in [
            vec![],
            vec![(4, 10.0)],
            vec![(4, 1.0), (4, 2.0)],
            vec![(1, f64::NAN), (2, 1.0)],
        ] {
            assert!(
                matches!(TimeModel::fit(&bad), Err(KvError::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn low_load_elastic_fetches_nothing() {
        // One short request at a time: every history fits in borrowed pages.
        let rep = simulate(&trace(5, 10_000, 200), &small()).unwrap();
        let e = &rep.placements[2];
        assert_eq!(e.placement, Placement::Elastic);
        assert_eq!(e.completed, 5);
        assert_eq!(e.misses_per_step, 0.0);
        assert!(
            rep.placements[1].misses_per_step > 0.0,
            "the fixed hot cache misses on 200-token histories"
        );
    }

    #[test]
    fn fit_with_misses_recovers_the_three_terms_and_refuses_collinear_steps() {
        let truth = |b: u32, m: u64| 11_000.0 + 60.0 * b as f64 + 0.95 * m as f64;
        let steps: Vec<(u32, u64, f64)> = (1..40u32)
            .flat_map(|b| {
                [0u64, 500, 3_000].map(|m| (b, m + 37 * b as u64, truth(b, m + 37 * b as u64)))
            })
            .collect();
        let m = TimeModel::fit_with_misses(&steps).unwrap();
        assert!((m.step_base_us - 11_000.0).abs() < 1e-6, "{m:?}");
        assert!((m.step_per_request_us - 60.0).abs() < 1e-9, "{m:?}");
        assert!((m.step_per_miss_us - 0.95).abs() < 1e-12, "{m:?}");
        // misses a multiple of the batch: the two slopes cannot be told apart
        let coll: Vec<(u32, u64, f64)> = (1..10u32)
            .map(|b| (b, 10 * b as u64, 100.0 + b as f64))
            .collect();
        assert!(matches!(
            TimeModel::fit_with_misses(&coll),
            Err(KvError::InvalidConfig(_))
        ));
        // no misses at all: the two-term fit, per-miss 0
        let none: Vec<(u32, u64, f64)> =
            (1..10u32).map(|b| (b, 0, 100.0 + 2.0 * b as f64)).collect();
        let m = TimeModel::fit_with_misses(&none).unwrap();
        assert_eq!(m.step_per_miss_us, 0.0);
        assert!((m.step_per_request_us - 2.0).abs() < 1e-9);
        assert!(matches!(
            TimeModel::fit_with_misses(&[(1, 1, f64::NAN), (2, 3, 1.0)]),
            Err(KvError::InvalidConfig(_))
        ));
    }

    #[test]
    fn misses_feed_back_into_step_time_when_priced() {
        let trace = trace(40, 1, 400);
        let free = simulate(
            &trace,
            &SimConfig {
                load: 4.0,
                ..small()
            },
        )
        .unwrap();
        let priced = simulate(
            &trace,
            &SimConfig {
                load: 4.0,
                time: TimeModel {
                    step_per_miss_us: 50.0,
                    ..small().time
                },
                ..small()
            },
        )
        .unwrap();
        let fixed = |r: &SimReport| r.placements[1].clone();
        assert!(
            fixed(&free).misses_per_step > 0.0,
            "the fixed hot cache misses here"
        );
        assert!(
            fixed(&priced).sim_seconds > fixed(&free).sim_seconds,
            "priced misses lengthen the fixed hot cache's steps"
        );
        assert_eq!(
            priced.placements[0].sim_seconds, free.placements[0].sim_seconds,
            "resident never misses"
        );
        assert!(
            fixed(&priced).tokens_per_s > 0.0
                && fixed(&priced).tokens_per_s < fixed(&free).tokens_per_s
        );
    }

    #[test]
    fn per_placement_times_and_resident_admission_copies_are_applied() {
        let trace = trace(40, 1, 400);
        let base = SimConfig {
            load: 4.0,
            ..small()
        };
        let shared = simulate(&trace, &base).unwrap();
        // The resident placement twice as dear per step, the pools as before.
        let slow = TimeModel {
            step_base_us: 2.0 * base.time.step_base_us,
            ..base.time
        };
        let per = simulate(
            &trace,
            &SimConfig {
                placement_time: Some(PlacementTimes {
                    resident: slow,
                    fixed: base.time,
                    elastic: base.time,
                    vllm: None,
                    sglang: None,
                }),
                ..base
            },
        )
        .unwrap();
        assert!(per.placements[0].sim_seconds > shared.placements[0].sim_seconds);
        assert_eq!(per.placements[1], shared.placements[1]);
        assert_eq!(per.placements[2], shared.placements[2]);
        assert_eq!(base.time_for(Placement::Elastic), base.time);
        // Admission copies stall the resident placement only: 400 tokens × 100 B at 0.001 GB/s
        // is 40 ms per admission.
        let copies = simulate(
            &trace,
            &SimConfig {
                admission_gbps: 0.001,
                ..base
            },
        )
        .unwrap();
        let stalled = copies.placements[0].sim_seconds - shared.placements[0].sim_seconds;
        let admitted = copies.placements[0].admitted as f64;
        assert!(
            (stalled - admitted * 0.04).abs() < 1e-6 * admitted.max(1.0),
            "{stalled} s for {admitted} admissions"
        );
        assert!(copies.placements[0].tokens_per_s < shared.placements[0].tokens_per_s);
        assert_eq!(copies.placements[1], shared.placements[1]);
        assert_eq!(copies.placements[2], shared.placements[2]);
        // Bad per-placement terms and rates are typed errors naming the placement.
        let bad = SimConfig {
            placement_time: Some(PlacementTimes {
                resident: base.time,
                fixed: TimeModel {
                    step_base_us: 0.0,
                    ..base.time
                },
                elastic: base.time,
                vllm: None,
                sglang: None,
            }),
            ..base
        };
        match bad.validate() {
            Err(KvError::InvalidConfig(m)) => assert!(m.contains("fixed hot cache"), "{m}"),
            r => panic!("{r:?}"),
        }
        for g in [f64::NAN, -1.0, f64::INFINITY] {
            assert!(matches!(
                SimConfig {
                    admission_gbps: g,
                    ..base
                }
                .validate(),
                Err(KvError::InvalidConfig(_))
            ));
        }
        // An elastic-only cap leaves the other placements alone and bounds elastic's batch.
        let capped = simulate(
            &trace,
            &SimConfig {
                elastic_max_batch: Some(3),
                ..base
            },
        )
        .unwrap();
        assert_eq!(capped.placements[0], shared.placements[0]);
        assert_eq!(capped.placements[1], shared.placements[1]);
        assert!(capped.placements[2].peak_sessions <= 3);
        assert!(shared.placements[2].peak_sessions > 3);
        assert!(matches!(
            SimConfig {
                elastic_max_batch: Some(0),
                ..base
            }
            .validate(),
            Err(KvError::InvalidConfig(_))
        ));
        assert!(matches!(
            SimConfig {
                elastic_max_batch: Some(base.max_batch + 1),
                ..base
            }
            .validate(),
            Err(KvError::InvalidConfig(m)) if m.contains("is above max_batch")
        ));
    }

    #[test]
    fn high_load_elastic_admits_more_than_fully_resident_and_misses_less_than_fixed() {
        let rep = simulate(&trace(60, 1, 400), &small()).unwrap();
        let [full, fixed, el] = [&rep.placements[0], &rep.placements[1], &rep.placements[2]];
        assert!(
            el.peak_sessions as f64 >= 1.75 * full.peak_sessions as f64,
            "{el:?} vs {full:?}"
        );
        assert_eq!(el.peak_sessions, fixed.peak_sessions);
        assert!(
            el.misses_per_step <= fixed.misses_per_step,
            "{el:?} vs {fixed:?}"
        );
        assert_eq!(full.misses_per_step, 0.0);
    }
}
