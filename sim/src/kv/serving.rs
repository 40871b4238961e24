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

pub use crate::kv::config::{Placement, PlacementTimes, SimConfig, DEFAULT_MAX_MEMORY_BYTES};
use crate::kv::residency::{AdmitOutcome, Residency, ResidencyCounters, ResidencyKind};
use crate::kv::schedule::{Decision, Phase, RequestTiming, Scheduler};
use crate::kv::selection::SelectionGen;
pub use crate::kv::time_model::{StepSums, TimeModel, MAX_STEP_TERM_US, MIN_ADMISSION_GBPS};
use crate::kv::trace::{ArrivalTrace, MAX_REQUEST_TOKENS};
use kv_elastic::{ElasticPool, PoolConfig};
use kv_elastic::{KvError, Result};
use kv_elastic::{ResolveInput, ResolveOutput, Resolver};

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
mod tests;
