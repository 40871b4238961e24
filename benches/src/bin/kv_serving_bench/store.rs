//! The placements' stores: admission (with its copies), per-step inputs, finish and
//! between-step maintenance, over the physical planes of one index-sharing group. The four pool
//! placements run one `GpuElasticPool` each under their residency policy
//! (`tierkit_sim::kv::residency`, the simulation's), through [`GpuDriver`].

use std::collections::HashMap;
use std::sync::Arc;

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{copy_htod_async, CopyBackend, DeviceBuffer, PinnedBuffer};
use kv_elastic::gpu::{GpuData, GpuElasticPool, GpuPoolConfig, MapAfterFill};
use kv_elastic::{
    Admission, AdmitOptions, ElasticPool, Geometry, LayerGroups, PoolConfig, SessionId,
    StepMaintenance, StepOptions,
};
use tier_core::{PageHandle, PagePool, Tier};
use tierkit_sim::kv::residency::{AdmitOutcome, PoolDriver, Residency, ResidencyKind};
use tierkit_sim::kv::schedule::{Active, Decision};

use crate::device::{Device, Res};
use crate::scenario::Scenario;

/// Token offsets a session's history starts at in the [`Pattern`] (sessions see different bytes).
const SPAN: usize = 4096;

/// The history bytes sessions are admitted with: `[tokens][group_layers][row_bytes]` random bytes,
/// a session's history starting at a per-session token offset.
pub struct Pattern {
    bytes: Vec<u8>,
    token_bytes: usize,
    tokens: usize,
}

impl Pattern {
    pub fn new(sc: &Scenario, max_input: u32) -> Self {
        let token_bytes = sc.group_layers as usize * sc.row_bytes as usize;
        let tokens = max_input as usize + SPAN;
        let mut bytes = vec![0u8; tokens * token_bytes];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for c in bytes.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        Pattern {
            bytes,
            token_bytes,
            tokens,
        }
    }

    /// First token of session `id`'s history in the pattern.
    pub fn offset(id: u64) -> usize {
        (id as usize).wrapping_mul(7919) % SPAN
    }

    /// Session `id`'s history of `input` tokens.
    pub fn history(&self, id: u64, input: u32) -> &[u8] {
        let o = Self::offset(id) * self.token_bytes;
        &self.bytes[o..o + input as usize * self.token_bytes]
    }
}

/// The fully resident placement: an arena of the budget's pages (physical planes), a page pool
/// and a block table per session; every page of a session's input + output tokens reserved at
/// admission.
pub struct Resident {
    arena: DeviceBuffer<u8>,
    pages: PagePool,
    tables: HashMap<u64, Vec<PageHandle>>,
    /// The pattern, layer-major (`[group_layers][tokens][row_bytes]`, pinned) for page copies.
    src: PinnedBuffer<u8>,
    src_tokens: usize,
    plane_bytes: u64,
    page_rows: u32,
}

/// A placement's store.
pub enum Store {
    Resident(Box<Resident>),
    /// A GPU pool and the residency policy that drives it.
    Pool(Box<GpuElasticPool>, Box<Residency>),
}

/// The GPU pool as a residency policy's [`PoolDriver`]: every call publishes its work to the
/// device, as the simulation's CPU pool calls change its arena at once.
pub struct GpuDriver<'a>(pub &'a mut GpuElasticPool);

impl PoolDriver for GpuDriver<'_> {
    type Data = GpuData;

    fn pool(&self) -> &ElasticPool<GpuData> {
        self.0.cpu()
    }

    fn admit_with(
        &mut self,
        session: SessionId,
        history: &[u8],
        options: AdmitOptions,
    ) -> kv_elastic::Result<Admission> {
        self.0.admit_with(session, history, options)
    }

    fn revoke(&mut self, session: SessionId, logical: &[u32]) -> kv_elastic::Result<u32> {
        self.0.revoke(session, logical)
    }

    fn lend(&mut self, session: SessionId, max: u32) -> kv_elastic::Result<u32> {
        self.0.lend(session, max)
    }

    fn between_steps_with(
        &mut self,
        chunk: u32,
        options: StepOptions,
    ) -> kv_elastic::Result<StepMaintenance> {
        self.0.between_steps_with(chunk, options)
    }
}

/// What an admission did.
pub struct Admitted {
    pub decision: Decision,
    /// Tokens (all model layers) the admission copied host → HBM.
    pub tokens_copied: u64,
    /// Tokens (all model layers) the policy writes host-ward at admission (vLLM's mirror of the
    /// prefix, SGLang's backup; the caller moves their bytes D2H on the copy stream).
    pub tokens_mirrored: u64,
}

impl Store {
    pub fn resident(dev: &Device, sc: &Scenario, pat: &Pattern) -> Res<Self> {
        let ctx = dev.gpu.ctx();
        let rows = sc.budget_pages() as u64 * sc.page_rows as u64;
        let plane_bytes = rows * sc.row_bytes as u64;
        let g = sc.group_layers as usize;
        let rb = sc.row_bytes as usize;
        let mut src = PinnedBuffer::<u8>::zeroed(ctx, g * pat.tokens * rb)?;
        let s = src.as_mut_slice();
        for t in 0..pat.tokens {
            for l in 0..g {
                let from = (t * g + l) * rb;
                let to = (l * pat.tokens + t) * rb;
                s[to..to + rb].copy_from_slice(&pat.bytes[from..from + rb]);
            }
        }
        Ok(Store::Resident(Box::new(Resident {
            arena: DeviceBuffer::zeroed(ctx, (plane_bytes * g as u64) as usize)?,
            pages: PagePool::new(Tier::DeviceHbm, sc.budget_pages())?,
            tables: HashMap::new(),
            src,
            src_tokens: pat.tokens,
            plane_bytes,
            page_rows: sc.page_rows,
        })))
    }

    /// A GPU pool over the budget run by the residency policy `kind` (`link_gate`: the elastic
    /// placement's admission gate), mapping borrowed pages deferred after their fill unless
    /// `ordered_maps`.
    pub fn pool(
        dev: &Device,
        sc: &Scenario,
        (kind, link_gate): (ResidencyKind, bool),
        max_history: u32,
        ordered_maps: bool,
    ) -> Res<Self> {
        let elastic = kind != ResidencyKind::Fixed;
        let g = Geometry {
            row_bytes: sc.row_bytes,
            layers: sc.group_layers,
            page_rows: sc.page_rows,
            arena_pages: sc.budget_pages(),
            hot_rows: sc.hot_rows,
            tail_rows: sc.tail_rows,
            scratch_rows: 0,
            // The physical layers share the indexer's picks: one layer group, filled by each
            // resolve.
            layer_groups: LayerGroups::one(),
            row_format: None,
        };
        g.validate()?;
        let max_sessions = pool_slots(&g, sc);
        let gcfg = GpuPoolConfig {
            max_sessions,
            max_history,
            backend: CopyBackend::Gather,
        };
        eprintln!(
            "pool ({kind:?}): {} pages, {max_sessions} session slots, pinned store {:.1} GB",
            g.arena_pages,
            max_sessions as f64 * max_history as f64 * g.token_bytes() as f64 / 1e9
        );
        let mut p = GpuElasticPool::new(&dev.gpu, g, PoolConfig { elastic }, gcfg)?;
        p.set_map_after_fill(if ordered_maps {
            MapAfterFill::Ordered
        } else {
            MapAfterFill::Deferred
        });
        Ok(Store::Pool(
            Box::new(p),
            Box::new(Residency::new(kind, link_gate)),
        ))
    }

    /// Whether the step stream does not wait for this store's admission and growth copies (a
    /// pool with deferred mapping: pages are mapped once their fill passed, misses meanwhile).
    pub fn defers_copies(&self) -> bool {
        matches!(self, Store::Pool(p, _) if p.map_after_fill() == MapAfterFill::Deferred)
    }

    /// The stream admissions and fills run on.
    pub fn copy_stream(&self, dev: &Device) -> Arc<CudaStream> {
        match self {
            Store::Resident(_) => dev.copy.clone(),
            Store::Pool(p, _) => p.copy_stream().clone(),
        }
    }

    /// Device address of physical plane `l`.
    pub fn plane_ptr(&self, l: u32) -> Res<u64> {
        match self {
            Store::Resident(r) => Ok(r.arena.device_ptr() + l as u64 * r.plane_bytes),
            Store::Pool(p, _) => Ok(p.device().plane_ptr(l)?),
        }
    }

    /// Bytes of one physical plane.
    pub fn plane_bytes(&self) -> u64 {
        match self {
            Store::Resident(r) => r.plane_bytes,
            Store::Pool(p, _) => p.cpu().geometry().plane_bytes() as u64,
        }
    }

    /// Pages in use (fixed + history + pending + queued, or the resident's reserved pages).
    pub fn pages_in_use(&self) -> u32 {
        match self {
            Store::Resident(r) => r.pages.used_count(),
            Store::Pool(p, _) => {
                let c = p.cpu().pages();
                c.capacity - c.free
            }
        }
    }

    /// Admits `a` (its history copied on the copy stream), or says why not.
    pub fn admit(
        &mut self,
        dev: &Device,
        sc: &Scenario,
        a: &Active,
        pat: &Pattern,
        max_history: u32,
    ) -> Res<Admitted> {
        let none = |decision| Admitted {
            decision,
            tokens_copied: 0,
            tokens_mirrored: 0,
        };
        if a.total() > max_history as u64 {
            return Ok(none(Decision::Reject));
        }
        match self {
            Store::Pool(p, res) => {
                // The pool refuses a session beyond its slots with an error; here that is "no
                // room" (the slots are sized to the fixed pages the budget holds).
                if p.cpu().active_sessions() >= pool_slots(p.cpu().geometry(), sc) as usize {
                    return Ok(none(Decision::NoRoom));
                }
                let before = p.flush_counters().rows_filled;
                let mirrored = res.counters().mirror_tokens;
                let history = pat.history(a.id, a.input);
                match res.admit(&mut GpuDriver(p), a.id, history, a.input)? {
                    AdmitOutcome::Admitted { .. } => Ok(Admitted {
                        decision: Decision::Admitted,
                        tokens_copied: p.flush_counters().rows_filled - before,
                        tokens_mirrored: res.counters().mirror_tokens - mirrored,
                    }),
                    AdmitOutcome::NoRoom => Ok(none(Decision::NoRoom)),
                    AdmitOutcome::Never => Ok(none(Decision::Reject)),
                }
            }
            Store::Resident(r) => {
                let need = a.total().div_ceil(sc.page_rows as u64);
                if need > r.pages.capacity() as u64 {
                    return Ok(none(Decision::Reject));
                }
                if need > r.pages.free_count() as u64 {
                    return Ok(none(Decision::NoRoom));
                }
                let pages = r.pages.alloc_many(need as u32)?;
                let copied = r.copy_history(&dev.copy, sc, a.input, &pages, a.id)?;
                r.tables.insert(a.id, pages);
                Ok(Admitted {
                    decision: Decision::Admitted,
                    tokens_copied: copied,
                    tokens_mirrored: 0,
                })
            }
        }
    }

    /// Ends session `id` (its pages go back).
    pub fn finish(&mut self, id: u64) -> Res<()> {
        match self {
            Store::Pool(p, res) => {
                p.finish(id)?;
                res.finished(id);
            }
            Store::Resident(r) => {
                for h in r.tables.remove(&id).unwrap_or_default() {
                    r.pages.free(h)?;
                }
            }
        }
        Ok(())
    }

    /// Between steps: hand-back and the policy's growth for the live sessions `running` (pools).
    /// Returns rows filled (tokens, all layers).
    pub fn maintain(&mut self, sc: &Scenario, running: &[SessionId]) -> Res<u64> {
        match self {
            Store::Pool(p, res) => {
                let before = p.flush_counters().rows_filled;
                res.between_steps(&mut GpuDriver(p), running, sc.chunk_pages)?;
                Ok(p.flush_counters().rows_filled - before)
            }
            Store::Resident(_) => Ok(0),
        }
    }

    /// At the scheduling boundary before a step of `running` (vLLM's transitions).
    pub fn before_step(&mut self, running: &[SessionId]) {
        if let Store::Pool(p, res) = self {
            res.before_step(&mut GpuDriver(p), running);
        }
    }

    /// The residency policy (pools).
    pub fn residency(&self) -> Option<&Residency> {
        match self {
            Store::Pool(_, res) => Some(res),
            Store::Resident(_) => None,
        }
    }

    /// The residency policy, mutable (pools).
    pub fn residency_mut(&mut self) -> Option<&mut Residency> {
        match self {
            Store::Pool(_, res) => Some(res),
            Store::Resident(_) => None,
        }
    }

    /// Fills the step inputs for `running` (batch order): slots (pools) or block-table rows
    /// (resident), and the arena row each continuing request's new token goes to (`-1` for a
    /// request finishing in this step).
    pub fn step_inputs(&self, dev: &mut Device, running: &[Active]) -> Res<()> {
        let io = &mut dev.io;
        let (slots_at, rows_at, mb) = (io.slots_at(), io.rows_at(), io.max_blocks);
        match self {
            Store::Pool(p, _) => {
                let small = io.small_h.as_mut_slice();
                for (r, a) in running.iter().enumerate() {
                    small[slots_at + r] = p.slot_of(a.id)? as i32;
                    small[rows_at + r] = if a.last_step() {
                        -1
                    } else {
                        p.tail_row_of(a.id, a.history())? as i32
                    };
                }
            }
            Store::Resident(res) => {
                let bt = io.bt_h.as_mut_slice();
                let mut rows = Vec::with_capacity(running.len());
                for (r, a) in running.iter().enumerate() {
                    let t = &res.tables[&a.id];
                    let row = &mut bt[r * mb..(r + 1) * mb];
                    row.fill(-1);
                    for (j, h) in t.iter().enumerate() {
                        row[j] = h.page().0 as i32;
                    }
                    rows.push(if a.last_step() {
                        -1
                    } else {
                        res.row_of(t, a.history())
                    });
                }
                let small = io.small_h.as_mut_slice();
                small[rows_at..rows_at + rows.len()].copy_from_slice(&rows);
            }
        }
        Ok(())
    }
}

/// Session slots of a pool: as many sessions as the budget holds fixed rows for, at most the
/// max batch.
fn pool_slots(g: &Geometry, sc: &Scenario) -> u32 {
    (g.arena_pages / g.fixed_pages()).clamp(1, sc.max_batch)
}

impl Resident {
    /// The arena row of `position` in a session's pages.
    fn row_of(&self, pages: &[PageHandle], position: u32) -> i32 {
        let pr = self.page_rows;
        (pages[(position / pr) as usize].page().0 * pr + position % pr) as i32
    }

    /// Copies a session's `input` tokens into its pages on `stream` (one copy per page and
    /// plane, from the layer-major pinned pattern at the session's offset). Returns the tokens
    /// copied.
    fn copy_history(
        &self,
        stream: &CudaStream,
        sc: &Scenario,
        input: u32,
        pages: &[PageHandle],
        id: u64,
    ) -> Res<u64> {
        let rb = sc.row_bytes as usize;
        let pr = self.page_rows as usize;
        let off = Pattern::offset(id);
        for (j, h) in pages.iter().enumerate() {
            let t0 = j * pr;
            if t0 >= input as usize {
                break;
            }
            let n = (input as usize - t0).min(pr);
            for l in 0..sc.group_layers as usize {
                let dst = self.arena.device_ptr()
                    + l as u64 * self.plane_bytes
                    + (h.page().0 as u64 * pr as u64) * rb as u64;
                let src_at = (l * self.src_tokens + off + t0) * rb;
                // SAFETY: the destination page lies inside plane l of the arena (page ids <
                // budget pages); the source range lies inside the pinned pattern (offset + input
                // <= tokens); both outlive the copy (the run synchronizes before freeing either).
                unsafe { copy_htod_async(dst, self.src.host_ptr().add(src_at), n * rb, stream)? };
            }
        }
        Ok(input as u64)
    }
}
