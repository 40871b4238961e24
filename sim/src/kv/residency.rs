//! Residency policies on one elastic pool: who holds which history pages in HBM, step by step,
//! for the placements that share the pool, its resolver and the scheduler — so that only the
//! placement differs. The serving simulation ([`crate::kv::serving`]) drives the CPU
//! [`ElasticPool`]; the GPU serving benchmark (`kv_serving_bench`) drives `GpuElasticPool` through
//! the same [`PoolDriver`] calls.
//!
//! - [`ResidencyKind::Fixed`]: the fixed hot cache (HiSparse), a pool with lending off.
//! - [`ResidencyKind::Elastic`] (ours): free HBM lent newest-history-first, taken back oldest
//!   first in proportion to holdings, lent back when pressure falls (promotion back); admission
//!   limited by the link's share ([`AdmissionGate`]) instead of a batch cap.
//! - [`ResidencyKind::VllmHybrid`]: vLLM 0.34's Hybrid HiSparse, as its public design describes
//!   it (`docs/design/hisparse.md`, `vllm/v1/hisparse/coordinator.py`): a request lands with its
//!   whole history resident when it fits the free and evictable pages (else in host memory, on
//!   its hot region alone); its pages stay pinned until the pool's free pages (evictable ones
//!   counted) fall below the transition watermark `max(hot region, 10% of the pool)` at a
//!   scheduling boundary; then it takes its hot region and every page it holds becomes
//!   evictable, appended to one free queue newest page first, and later allocations reuse the
//!   queue's oldest entries (FIFO). Pages are mirrored to host ahead of time (the whole prefix
//!   at admission: [`ResidencyCounters::mirror_tokens`]). New pages are allocated as a request
//!   decodes; a page lost to reuse is never brought back.
//! - [`ResidencyKind::SglangDemote`]: SGLang's dynamic HiSparse residency (PRs #23935 and
//!   #30266, `hisparse_dynamic.py`): a request enters with its full KV on the device and an eager
//!   host backup of its prefix; when an allocation (an admission's KV, a resident request's new
//!   page) finds too few free pages, the resident requests longer than the hot buffer are
//!   demoted largest first — all their pages released, the request served from its hot buffer
//!   — until it fits; each demotion first waits for the request's pending backup
//!   ([`ResidencyCounters::backup_wait_tokens`]). No promotion back.
//!
//! What the emulations cannot reproduce (see `docs/kv.md`): our pool reserves every session's hot
//! cache at admission, whereas vLLM leases the hot region at transition and SGLang allocates the
//! device buffer at demotion (their fully resident requests use no hot rows); SGLang seeds a
//! demoted request's buffer with its newest pages (ours starts the hot cache cold; the
//! calibrated picks are not recency-biased); vLLM keeps the two newest sealed pages pinned.

use std::collections::{HashMap, HashSet, VecDeque};

use kv_elastic::{
    Admission, AdmitOptions, CpuData, DataPlane, ElasticPool, KvError, Result, SessionId,
    StepMaintenance, StepOptions,
};

use crate::kv::time_model::StepSums;

/// The pool calls a residency policy makes (the CPU [`ElasticPool`] here; the GPU benchmark
/// implements it for `GpuElasticPool`, whose calls also publish to the device).
pub trait PoolDriver {
    /// The pool's data plane.
    type Data: DataPlane;
    /// The pool's control plane, read-only.
    fn pool(&self) -> &ElasticPool<Self::Data>;
    /// [`ElasticPool::admit_with`].
    fn admit_with(
        &mut self,
        session: SessionId,
        history: &[u8],
        options: AdmitOptions,
    ) -> Result<Admission>;
    /// [`ElasticPool::revoke`].
    fn revoke(&mut self, session: SessionId, logical: &[u32]) -> Result<u32>;
    /// [`ElasticPool::lend`].
    fn lend(&mut self, session: SessionId, max: u32) -> Result<u32>;
    /// [`ElasticPool::between_steps_with`].
    fn between_steps_with(&mut self, chunk: u32, options: StepOptions) -> Result<StepMaintenance>;
}

impl PoolDriver for ElasticPool {
    type Data = CpuData;

    fn pool(&self) -> &ElasticPool<CpuData> {
        self
    }

    fn admit_with(
        &mut self,
        session: SessionId,
        history: &[u8],
        options: AdmitOptions,
    ) -> Result<Admission> {
        ElasticPool::admit_with(self, session, history, options)
    }

    fn revoke(&mut self, session: SessionId, logical: &[u32]) -> Result<u32> {
        ElasticPool::revoke(self, session, logical)
    }

    fn lend(&mut self, session: SessionId, max: u32) -> Result<u32> {
        ElasticPool::lend(self, session, max)
    }

    fn between_steps_with(&mut self, chunk: u32, options: StepOptions) -> Result<StepMaintenance> {
        ElasticPool::between_steps_with(self, chunk, options)
    }
}

/// Which residency policy runs on the pool (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ResidencyKind {
    /// Fixed hot cache (lending off).
    Fixed,
    /// Ours: lend, take back proportionally oldest first, lend back; link-share admission.
    Elastic,
    /// vLLM 0.34 Hybrid HiSparse.
    VllmHybrid,
    /// SGLang dynamic HiSparse demotion.
    SglangDemote,
}

/// What an admission attempt came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmitOutcome {
    /// Admitted, holding `borrowed` history pages.
    Admitted {
        /// History pages it holds at admission.
        borrowed: u32,
    },
    /// Not now: it (and everyone behind it) waits.
    NoRoom,
    /// Never: its fixed rows (or, where the policy must hold the whole history, its history)
    /// exceed the whole pool.
    Never,
}

/// A policy's running totals (see each field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResidencyCounters {
    /// History tokens written host-ward at admission (all layers each): vLLM's mirror of the
    /// prefix ahead of time, SGLang's eager backup. Ours: 0 (the history is already in host
    /// memory; every pool placement writes each decoded token back alike).
    pub mirror_tokens: u64,
    /// vLLM: requests that took their hot region (their pages became evictable).
    pub transitions: u64,
    /// vLLM: requests landed in host memory at admission (their history did not fit).
    pub landed_on_host: u64,
    /// SGLang: requests demoted to their hot buffer.
    pub demotions: u64,
    /// SGLang: tokens whose backup a demotion waited for (the pending backup of the batch's last
    /// step once per round, and each demoted request's newest token).
    pub backup_wait_tokens: u64,
    /// History pages the policy took back itself (vLLM's free-queue reuse, SGLang's demotions;
    /// the elastic pool's proportional reclaims are the pool's `pages_reclaimed`).
    pub pages_taken: u64,
    /// Elastic: admission attempts the link-share gate deferred.
    pub gated: u64,
}

/// Ours: the admission limit of the elastic placement, from the run's own counters instead of a
/// batch cap swept on a trace.
///
/// A session admitted under pressure (its fixed rows need pages the others hold) adds one token
/// per step and `ΔM` misses per step (its own, and the others' from the pages it takes). With
/// step time `t0 + a·B + m·M` (batch `B`, misses `M`), admitting raises tokens/s iff `B·ΔM < M +
/// t0/m` (the per-request term cancels). `t0/m` is the **link's share** of a step: the token rows
/// the link fetches in the step's fixed time. When each session's misses grow with the others'
/// number (`M ∝ B^α`, `B·ΔM ≈ α·M`), the rule is `(α − 1)·M < t0/m`; with `α = 2` (a newcomer's
/// own misses plus as many from the pages it takes from the others) it reads: **admit under
/// pressure while the last step's misses took less link time than the step's fixed part**
/// (`m·M < t0`). `t0` and `m` are fitted online ([`StepSums`]) to the steps the run measured;
/// until they can be (no miss yet, or step times that do not grow with misses), nothing is
/// gated. Once they are, at most one admission under pressure per step (its effect shows in the
/// next step's misses). Admissions into free pages are never gated.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdmissionGate {
    sums: StepSums,
    last_misses: u64,
    max_misses: u64,
    admitted_under_pressure: bool,
}

impl AdmissionGate {
    /// Feeds one measured step.
    pub fn observe(&mut self, batch: u32, misses: u64, step_us: f64) {
        // A bad time is the caller's to report; it only leaves the fit without that step.
        let _ = self.sums.add(batch, misses, step_us);
        self.last_misses = misses;
        self.max_misses = self.max_misses.max(misses);
    }

    /// The link's share of a step in missed tokens (`t0 / m` of the fit), None while the fit has
    /// no per-miss term that matters (the most misses of a step priced at under a billionth of
    /// the base: rounding, not a price).
    pub fn link_share_tokens(&self) -> Option<f64> {
        let m = self.sums.fit().ok()?;
        let priced = m.step_per_miss_us * self.max_misses as f64 > 1e-9 * m.step_base_us;
        priced.then(|| m.step_base_us / m.step_per_miss_us)
    }

    /// A new admission round (before each step's admissions).
    pub fn begin_round(&mut self) {
        self.admitted_under_pressure = false;
    }

    /// Whether an admission under pressure may go ahead now (and, if so, counts it).
    fn allow_under_pressure(&mut self) -> bool {
        // Until misses are priced (no miss yet, or step times that do not grow with them) the
        // gate is inert.
        let Some(l) = self.link_share_tokens() else {
            return true;
        };
        if self.admitted_under_pressure || self.last_misses as f64 >= l {
            return false;
        }
        self.admitted_under_pressure = true;
        true
    }
}

/// vLLM's residency state (see the module docs).
#[derive(Clone, Debug, Default)]
struct Vllm {
    /// Evictable pages in the order they became evictable (oldest first).
    queue: VecDeque<(SessionId, u32)>,
    /// Requests with their hot region (every page they hold is evictable).
    hot: HashSet<SessionId>,
    /// Pages each request wanted at its last growth (older ones are never lent again).
    seen: HashMap<SessionId, u32>,
}

/// SGLang's residency state.
#[derive(Clone, Debug, Default)]
struct Sglang {
    demoted: HashSet<SessionId>,
    /// A demotion in this round already waited for the batch's pending backup.
    waited: bool,
}

/// One residency policy and its state, driving one pool (see the module docs).
#[derive(Clone, Debug)]
pub struct Residency {
    kind: ResidencyKind,
    gate: Option<AdmissionGate>,
    vllm: Vllm,
    sglang: Sglang,
    counters: ResidencyCounters,
    last_batch: u32,
}

impl Residency {
    /// A policy of `kind`; `link_gate` turns on the elastic placement's [`AdmissionGate`]
    /// (ignored by the others).
    pub fn new(kind: ResidencyKind, link_gate: bool) -> Self {
        Self {
            kind,
            gate: (kind == ResidencyKind::Elastic && link_gate).then(AdmissionGate::default),
            vllm: Vllm::default(),
            sglang: Sglang::default(),
            counters: ResidencyCounters::default(),
            last_batch: 0,
        }
    }

    /// The policy.
    pub fn kind(&self) -> ResidencyKind {
        self.kind
    }

    /// The running totals.
    pub fn counters(&self) -> &ResidencyCounters {
        &self.counters
    }

    /// The elastic admission gate, when on.
    pub fn gate(&self) -> Option<&AdmissionGate> {
        self.gate.as_ref()
    }

    /// Whether `session` is in its hot-cache mode (vLLM: took its hot region; SGLang: demoted).
    pub fn in_hot_mode(&self, session: SessionId) -> bool {
        match self.kind {
            ResidencyKind::VllmHybrid => self.vllm.hot.contains(&session),
            ResidencyKind::SglangDemote => self.sglang.demoted.contains(&session),
            _ => false,
        }
    }

    /// Starts a step's admission round.
    pub fn begin_round(&mut self) {
        if let Some(g) = &mut self.gate {
            g.begin_round();
        }
        self.sglang.waited = false;
    }

    /// Feeds one measured step (batch, distinct misses, µs) to the policy.
    pub fn observe_step(&mut self, batch: u32, misses: u64, step_us: f64) {
        if let Some(g) = &mut self.gate {
            g.observe(batch, misses, step_us);
        }
        self.last_batch = batch;
    }

    /// Tries to admit `session` with its committed `history` (`[tokens][layers][row_bytes]`,
    /// `tokens` of them) under the policy. Errors: the pool's (never `NoRoom`, which is
    /// [`AdmitOutcome::NoRoom`]).
    pub fn admit<P: PoolDriver>(
        &mut self,
        pool: &mut P,
        session: SessionId,
        history: &[u8],
        tokens: u32,
    ) -> Result<AdmitOutcome> {
        let g = *pool.pool().geometry();
        let fixed = g.fixed_pages();
        if fixed > g.arena_pages {
            return Ok(AdmitOutcome::Never);
        }
        let want = pool.pool().wanted_pages(tokens);
        match self.kind {
            ResidencyKind::Fixed => Self::plain(pool, session, history, AdmitOptions::default()),
            ResidencyKind::Elastic => {
                let c = pool.pool().pages();
                if fixed > c.free + c.queued + c.pending {
                    if let Some(gate) = &mut self.gate {
                        if !gate.allow_under_pressure() {
                            self.counters.gated += 1;
                            return Ok(AdmitOutcome::NoRoom);
                        }
                    }
                }
                Self::plain(pool, session, history, AdmitOptions::default())
            }
            ResidencyKind::VllmHybrid => {
                let avail = self.vllm_available(pool.pool());
                let resident = fixed + want <= avail && fixed + want <= g.arena_pages;
                let need = if resident {
                    fixed + want
                } else if fixed <= avail {
                    fixed
                } else {
                    return Ok(AdmitOutcome::NoRoom);
                };
                self.vllm_make_free(pool, need)?;
                if pool.pool().pages().free < fixed {
                    return Ok(AdmitOutcome::NoRoom);
                }
                let max = if resident { u32::MAX } else { 0 };
                let out = Self::plain(
                    pool,
                    session,
                    history,
                    AdmitOptions {
                        max_borrowed_pages: max,
                    },
                )?;
                if let AdmitOutcome::Admitted { .. } = out {
                    self.counters.mirror_tokens += tokens as u64;
                    self.vllm.seen.insert(session, want);
                    if !resident {
                        // Landed in host memory: it reads through its hot region from the start.
                        self.vllm.hot.insert(session);
                        self.counters.landed_on_host += 1;
                        self.counters.transitions += 1;
                    }
                }
                Ok(out)
            }
            ResidencyKind::SglangDemote => {
                let need = fixed + want;
                if need > g.arena_pages {
                    return Ok(AdmitOutcome::Never);
                }
                let c = pool.pool().pages();
                if need > c.free + c.queued + c.pending + self.sglang_reclaimable(pool.pool()) {
                    return Ok(AdmitOutcome::NoRoom);
                }
                self.sglang_demote_until(pool, need)?;
                if pool.pool().pages().free < fixed {
                    return Ok(AdmitOutcome::NoRoom);
                }
                let out = Self::plain(pool, session, history, AdmitOptions::default())?;
                if let AdmitOutcome::Admitted { .. } = out {
                    self.counters.mirror_tokens += tokens as u64;
                }
                Ok(out)
            }
        }
    }

    fn plain<P: PoolDriver>(
        pool: &mut P,
        session: SessionId,
        history: &[u8],
        options: AdmitOptions,
    ) -> Result<AdmitOutcome> {
        match pool.admit_with(session, history, options) {
            Ok(Admission::Admitted { borrowed_pages }) => Ok(AdmitOutcome::Admitted {
                borrowed: borrowed_pages,
            }),
            Ok(Admission::Waiting { .. }) | Err(KvError::NoRoom { .. }) => Ok(AdmitOutcome::NoRoom),
            Err(e) => Err(e),
        }
    }

    /// At a scheduling boundary, before a step of `running` (batch order): vLLM moves each
    /// request still pinned to its hot region while the pool's free pages (evictable ones
    /// counted) are below the transition watermark.
    pub fn before_step<P: PoolDriver>(&mut self, pool: &mut P, running: &[SessionId]) {
        if self.kind != ResidencyKind::VllmHybrid {
            return;
        }
        let p = pool.pool();
        let watermark = vllm_watermark(p);
        for &s in running {
            if self.vllm.hot.contains(&s) || self.vllm_available(p) >= watermark {
                continue;
            }
            if let Ok(pl) = p.placement(s) {
                // Tail first: the newest page becomes evictable first.
                for j in (0..pl.page_table.len()).rev() {
                    if pl.page_table[j] >= 0 {
                        self.vllm.queue.push_back((s, j as u32));
                    }
                }
                self.vllm.hot.insert(s);
                self.counters.transitions += 1;
            }
        }
    }

    /// Between steps (after the step's appends and finishes): hand-back of finished sessions'
    /// pages and the policy's growth for the live sessions `running` (batch order). Returns the
    /// pool's maintenance.
    pub fn between_steps<P: PoolDriver>(
        &mut self,
        pool: &mut P,
        running: &[SessionId],
        chunk: u32,
    ) -> Result<StepMaintenance> {
        match self.kind {
            ResidencyKind::Fixed | ResidencyKind::Elastic => {
                pool.between_steps_with(chunk, StepOptions::default())
            }
            ResidencyKind::VllmHybrid => {
                let mut m = pool.between_steps_with(chunk, StepOptions { growth: false })?;
                for &s in running {
                    let Ok(n) = pool.pool().committed_len(s) else {
                        continue;
                    };
                    let want = pool.pool().wanted_pages(n);
                    let seen = self.vllm.seen.insert(s, want).unwrap_or(want);
                    let new = want.saturating_sub(seen);
                    if new == 0 {
                        continue;
                    }
                    self.vllm_make_free(pool, new)?;
                    let got = pool.lend(s, new)?;
                    m.grown += got;
                    if got > 0 && self.vllm.hot.contains(&s) {
                        let table = pool.pool().placement(s)?.page_table;
                        for j in (seen..want).rev() {
                            if table[j as usize] >= 0 {
                                self.vllm.queue.push_back((s, j));
                            }
                        }
                    }
                }
                Ok(m)
            }
            ResidencyKind::SglangDemote => {
                let mut m = pool.between_steps_with(chunk, StepOptions { growth: false })?;
                for &s in running {
                    if self.sglang.demoted.contains(&s) {
                        continue;
                    }
                    let p = pool.pool();
                    let (Ok(n), Ok(held)) = (p.committed_len(s), p.borrowed_pages(s)) else {
                        continue;
                    };
                    let new = p.wanted_pages(n).saturating_sub(held);
                    if new == 0 {
                        continue;
                    }
                    if pool.pool().pages().free < new {
                        self.sglang_demote_until(pool, new)?;
                    }
                    if !self.sglang.demoted.contains(&s) {
                        m.grown += pool.lend(s, new)?;
                    }
                }
                Ok(m)
            }
        }
    }

    /// `session` finished (after the pool's `finish`): forgets its state.
    pub fn finished(&mut self, session: SessionId) {
        self.vllm.hot.remove(&session);
        self.vllm.seen.remove(&session);
        self.sglang.demoted.remove(&session);
    }

    /// vLLM's free pages: free, queued for hand-back, pending behind the fence, and evictable.
    fn vllm_available<D: DataPlane>(&self, p: &ElasticPool<D>) -> u32 {
        let c = p.pages();
        let evictable: u32 = self
            .vllm
            .hot
            .iter()
            .filter_map(|&s| p.borrowed_pages(s).ok())
            .sum();
        c.free + c.queued + c.pending + evictable
    }

    /// Makes `need` pages free (or pending behind the fence): hands back finished sessions'
    /// pages, then reuses evictable pages from the head of the free queue.
    fn vllm_make_free<P: PoolDriver>(&mut self, pool: &mut P, need: u32) -> Result<()> {
        let short = |p: &ElasticPool<P::Data>| {
            let c = p.pages();
            need.saturating_sub(c.free + c.pending)
        };
        if short(pool.pool()) > 0 && pool.pool().pages().queued > 0 {
            pool.between_steps_with(need, StepOptions { growth: false })?;
        }
        while short(pool.pool()) > 0 {
            let Some((s, j)) = self.vllm.queue.pop_front() else {
                break;
            };
            if !self.vllm.hot.contains(&s) {
                continue; // finished
            }
            // A run of the same request's queue entries goes in one call.
            let mut run = vec![j];
            let room = short(pool.pool()) as usize;
            while run.len() < room {
                match self.vllm.queue.front() {
                    Some(&(s2, j2)) if s2 == s => {
                        run.push(j2);
                        self.vllm.queue.pop_front();
                    }
                    _ => break,
                }
            }
            self.counters.pages_taken += pool.revoke(s, &run)? as u64;
        }
        Ok(())
    }

    /// SGLang's reclaimable pages: those of resident requests longer than the hot buffer.
    fn sglang_reclaimable<D: DataPlane>(&self, p: &ElasticPool<D>) -> u32 {
        let hot = p.geometry().hot_rows;
        p.sessions()
            .filter(|s| !self.sglang.demoted.contains(s))
            .filter(|&s| p.committed_len(s).is_ok_and(|n| n > hot))
            .filter_map(|s| p.borrowed_pages(s).ok())
            .sum()
    }

    /// Demotes resident requests longer than the hot buffer, largest history first, until
    /// `need` pages are free (or pending), after handing back finished sessions' pages.
    fn sglang_demote_until<P: PoolDriver>(&mut self, pool: &mut P, need: u32) -> Result<()> {
        let short = |p: &ElasticPool<P::Data>| {
            let c = p.pages();
            need.saturating_sub(c.free + c.pending)
        };
        if short(pool.pool()) > 0 && pool.pool().pages().queued > 0 {
            pool.between_steps_with(need, StepOptions { growth: false })?;
        }
        if short(pool.pool()) == 0 {
            return Ok(());
        }
        let p = pool.pool();
        let hot = p.geometry().hot_rows;
        let mut cands: Vec<(u32, SessionId)> = p
            .sessions()
            .filter(|s| !self.sglang.demoted.contains(s))
            .filter_map(|s| p.committed_len(s).ok().map(|n| (n, s)))
            .filter(|&(n, _)| n > hot)
            .collect();
        // Largest first; ties to the lower id.
        cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, s) in cands {
            if short(pool.pool()) == 0 {
                break;
            }
            let all: Vec<u32> = (0..pool.pool().placement(s)?.page_table.len() as u32).collect();
            // The demotion waits for the request's pending backup first (synchronously): its
            // newest token, and once per round the batch's last step.
            if !self.sglang.waited {
                self.counters.backup_wait_tokens += self.last_batch as u64;
                self.sglang.waited = true;
            }
            self.counters.backup_wait_tokens += 1;
            self.counters.pages_taken += pool.revoke(s, &all)? as u64;
            self.sglang.demoted.insert(s);
            self.counters.demotions += 1;
        }
        Ok(())
    }
}

/// vLLM's transition watermark: `max(hot region, 10% of the pool)` pages (its
/// `max(hot_cost, num_blocks // 10)`; the hot region is the fixed rows here).
pub fn vllm_watermark<D: DataPlane>(p: &ElasticPool<D>) -> u32 {
    let g = p.geometry();
    g.fixed_pages().max(g.arena_pages / 10)
}

#[cfg(test)]
mod tests;
