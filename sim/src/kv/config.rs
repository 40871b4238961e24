//! The serving simulation's parameters: the placements ([`Placement`]), their step-time models
//! ([`PlacementTimes`]) and the run's configuration ([`SimConfig`]); [`crate::kv::serving`]
//! runs them, [`crate::kv::footprint`] sizes them up front.

use crate::kv::residency::ResidencyKind;
use crate::kv::selection::SelectionParams;
use crate::kv::time_model::{TimeModel, MIN_ADMISSION_GBPS};
use kv_elastic::Geometry;
use kv_elastic::{KvError, Result};

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
    /// bytes: `serving::simulate_placement` refuses a larger run before allocating anything (the
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
            row_format: None,
        }
    }
}
