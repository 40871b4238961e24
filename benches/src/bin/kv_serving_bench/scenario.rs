//! The benchmark's scenario (what one run stands for) and its JSON report.

use serde::Serialize;
use tierkit_sim::kv::residency::ResidencyCounters;
use tierkit_sim::kv::schedule::{RequestTiming, ScheduleSummary};

/// The published setting the scenario follows (DeepSeek-V4.1-Flash-like sparse attention, as in
/// the Adaptive HiSparse results): fp8 MLA rows of 656 B per token per layer, 61 layers, top-k
/// 2048 per query, a hot cache of 2 × top-k rows per request (HiSparse's size), a 64-row tail and
/// pages of 64 rows (FlashMLA's block).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Scenario {
    /// Bytes per token row per layer (fp8 MLA: 656).
    pub row_bytes: u32,
    /// Layers of the model a step stands for (attention, miss traffic and admission copies cover
    /// all of them).
    pub model_layers: u32,
    /// Layers held physically (one index-sharing group: the top-k is resolved once for the group
    /// and its plan replayed into the other planes, as Adaptive HiSparse shares indices). The
    /// other `model_layers − group_layers` layers' bytes are moved as stand-ins (see `device.rs`).
    pub group_layers: u32,
    /// Picks per query.
    pub top_k: u32,
    /// Hot-cache rows per request (fixed hot cache and elastic).
    pub hot_rows: u32,
    /// Tail rows per request (newest positions, always resident).
    pub tail_rows: u32,
    /// Rows per page.
    pub page_rows: u32,
    /// HBM given to the KV of all `model_layers` layers, bytes (the same budget for every
    /// placement; the physical arena is this × `group_layers / model_layers`).
    pub hbm_budget_bytes: u64,
    /// HBM a decode step streams besides attention (the weights), bytes.
    pub weights_bytes: u64,
    /// Most requests decoding at once (the engine's max batch).
    pub max_batch: u32,
    /// Pages handed back / lent per step between steps.
    pub chunk_pages: u32,
    /// Seed of the selection streams (one per request, the same in every placement).
    pub seed: u64,
}

impl Scenario {
    /// The default scenario (documented in the binary's module doc).
    pub fn published() -> Self {
        Scenario {
            row_bytes: 656,
            model_layers: 61,
            group_layers: 2,
            top_k: 2048,
            hot_rows: 4096,
            tail_rows: 64,
            page_rows: 64,
            hbm_budget_bytes: 24 << 30,
            weights_bytes: 16 << 30,
            max_batch: 256,
            chunk_pages: 1024,
            seed: 1,
        }
    }

    /// Bytes of one token over the model's layers.
    pub fn token_bytes_model(&self) -> u64 {
        self.row_bytes as u64 * self.model_layers as u64
    }

    /// Bytes of one page over the model's layers.
    pub fn page_bytes_model(&self) -> u64 {
        self.token_bytes_model() * self.page_rows as u64
    }

    /// Pages in the budget (the same count for every placement).
    pub fn budget_pages(&self) -> u32 {
        (self.hbm_budget_bytes / self.page_bytes_model()).min(u32::MAX as u64) as u32
    }

    /// Layers whose bytes are moved by stand-ins (`model_layers − group_layers`).
    pub fn shadow_layers(&self) -> u32 {
        self.model_layers - self.group_layers
    }

    /// Checks the scenario (messages name the field).
    pub fn validate(&self) -> Result<(), String> {
        if self.group_layers == 0 || self.group_layers > self.model_layers {
            return Err(format!(
                "group_layers {} must be in 1..={}",
                self.group_layers, self.model_layers
            ));
        }
        if self.top_k > self.hot_rows {
            return Err(format!(
                "top_k {} must be <= hot_rows {}",
                self.top_k, self.hot_rows
            ));
        }
        if !self.weights_bytes.is_multiple_of(16) {
            return Err("weights bytes must be a multiple of 16".into());
        }
        if self.budget_pages() == 0 || self.max_batch == 0 || self.chunk_pages == 0 {
            return Err("budget, max_batch and chunk_pages must be > 0".into());
        }
        Ok(())
    }
}

/// One decode step as measured (GPU events), for fitting the simulation's step-time model.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StepRecord {
    /// Requests in the step.
    pub batch: u32,
    /// Sum of the batch's committed history, tokens.
    pub history_tokens: u64,
    /// Distinct positions fetched from host memory (the resolve's misses).
    pub misses: u32,
    /// Whole step, µs (weights + resolve + attention + new rows and write-back).
    pub step_us: f32,
    /// Weights stand-in, µs.
    pub weights_us: f32,
    /// Resolve section (resolve, plan replay, other layers' miss traffic; resident: block-table
    /// conversion), µs.
    pub resolve_us: f32,
    /// Attention over all model layers, µs.
    pub attend_us: f32,
    /// New rows written and written back, µs.
    pub write_us: f32,
    /// Copies before the step that it waited for (admissions, page growth), µs.
    pub copy_stall_us: f32,
}

/// The KV kernels' device error counters (`cuda_kernels::KvErrors`, field for field), saved with
/// the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceErrors {
    /// Requests with a bad slot or `seq_len`.
    pub bad_session: u32,
    /// Picks out of their row's bounds.
    pub bad_position: u32,
    /// Distinct positions that found no evictable hot row.
    pub overflow: u32,
    /// Calls with a malformed `query_start_loc`.
    pub bad_qsl: u32,
    /// Plan entries whose destination row no longer holds the position.
    pub stale_plan: u32,
}

/// One placement at one load.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// `fully resident`, `fixed hot cache`, `elastic`, `vllm-hybrid` or `sglang-demote`
    /// (`tierkit_sim::kv::serving::Placement::name`).
    pub placement: String,
    /// Arrival speed-up over the trace.
    pub load: f64,
    /// Most requests decoding at once in this run (the scenario's max batch, or
    /// `--elastic-max-batch` for the elastic placement).
    pub max_batch: u32,
    /// The scheduler's figures (tokens/s, batches, TTFT queueing).
    pub summary: ScheduleSummary,
    /// Median step time, µs.
    pub step_us_median: f64,
    /// Median weights, resolve, attention and write section times, µs.
    pub section_us_median: [f64; 4],
    /// Mean resolve-section time per step, µs (what attention waits for: the stall of the
    /// hot-cache placements, the block-table conversion of the resident one).
    pub resolve_us_mean: f64,
    /// Mean misses per step (distinct positions).
    pub misses_per_step: f64,
    /// Mean bytes fetched from host memory per step for misses, all model layers.
    pub miss_bytes_per_step: f64,
    /// Mean copy stall per step (admissions and page growth the next step waited for, and the
    /// growth after the last step), µs.
    pub copy_stall_us_per_step: f64,
    /// The growth copy after the last step that the run waited for (no step follows it), µs;
    /// counted in `copy_stall_us_per_step`, in no step record.
    pub trailing_copy_stall_us: f64,
    /// Admission copy time, all admissions, ms (copy-stream events).
    pub admission_copy_ms: f64,
    /// Bytes copied host → HBM by admissions, all model layers.
    pub admission_bytes: u64,
    /// Page-growth fill time between steps, ms (elastic only).
    pub growth_copy_ms: f64,
    /// KV pages in use, peak, as bytes of all model layers (GiB).
    pub kv_gib_peak: f64,
    /// KV pages in use, median over steps (GiB of all model layers).
    pub kv_gib_median: f64,
    /// Device memory in use at the peak batch (`cuMemGetInfo`: the whole process, GiB).
    pub device_gib_used: f64,
    /// Resolved rows whose bytes were compared with the host store (per physical plane).
    pub rows_checked: u64,
    /// Rows that differed (must be 0; the run fails otherwise).
    pub rows_mismatched: u64,
    /// The pool's device error counters after this run (cumulative over the placement's runs;
    /// `cuda_kernels::KvErrors`); None for the fully resident placement (no pool kernels).
    pub device_errors: Option<DeviceErrors>,
    /// Bytes the residency policy wrote host-ward at admission, all model layers (vLLM's mirror
    /// of the prefix, SGLang's backup; D2H on the copy stream, not waited for).
    pub mirror_bytes: u64,
    /// Bytes of decoded tokens written back to host memory, all model layers (pools).
    pub writeback_bytes: u64,
    /// Host waits before SGLang's demotions for the pending backup, µs in all (a stall).
    pub backup_wait_us: f64,
    /// The residency policy's totals (pools; None for the fully resident placement).
    pub residency: Option<ResidencyCounters>,
    /// Every arrived request's clock readings (TTFT / TPOT over the requests every placement
    /// finished).
    pub requests: Vec<RequestTiming>,
    /// Run stopped at the wall-clock limit (`--max-run-s`).
    pub stopped_by_wall_clock: bool,
    /// Host wall time of the run, s.
    pub wall_s: f64,
    /// Every step.
    pub steps: Vec<StepRecord>,
}

/// The commit the binary was built from (`git rev-parse --short HEAD` at build time, `unknown`
/// without git; see `benches/build.rs`).
pub const BUILD_COMMIT: &str = env!("TIERKIT_BUILD_COMMIT");

/// The whole benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The commit the binary was built from ([`BUILD_COMMIT`]). Reports written before it was
    /// recorded have no `commit`; readers (`tierkit kv fit-time`, `plot-bench`) take `unknown`.
    pub commit: String,
    /// GPU name.
    pub device: String,
    /// Trace file and requests read.
    pub trace: String,
    /// Requests in the trace.
    pub requests: usize,
    /// The scenario.
    pub scenario: Scenario,
    /// Steps per run at most.
    pub max_steps: u64,
    /// One entry per placement × load.
    pub runs: Vec<RunReport>,
}
