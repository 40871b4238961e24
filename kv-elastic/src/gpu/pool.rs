//! [`GpuElasticPool`]: the elastic pool with its resolver on the GPU.
//!
//! Split of work: the [`ElasticPool`] inside stays the control plane (admissions, loans, reclaim,
//! hand-back, appends, drafts: everything between steps). After each control operation the pool
//! publishes each live session's placement ([`ElasticPool::placement`]) into the device tables of
//! a session slot, copies new committed history into the mapped pinned host store, and re-uploads
//! every arena row outside the live sessions' hot caches (tail, scratch, borrowed pages; the hot
//! rows belong to the device). That upload is O(arena) per control operation, synchronous: simple
//! and exact, fine for admission bursts (see [`GpuElasticPool::admit_batch`]), too slow to run
//! every step; uploading only the rows an operation wrote is a later issue. New KV rows produced
//! on the device go to the pinned host store with [`GpuArena::write_back_async`]. Every step's
//! work — resolve, deduplicated miss fetch, hot-cache replacement, replay, prefetch — runs on the
//! device. The device's replacement decisions equal the CPU reference's (same contract: same
//! CLOCK sweep, same pins), so a GPU pool and a CPU pool fed the same operations return identical
//! indices, valid counts, plans and stats, and the bytes at every returned row equal a fully
//! resident cache's (`tests/gpu_exactness.rs`).
//!
//! The [`Resolver`] methods are synchronous (inputs and outputs are host slices): they upload,
//! launch on the GPU's step stream, and download. Their [`ReadTicket`] is a CUDA event recorded on
//! the step stream when the ticket ends (see `ReadTicket`'s orderings). Engines use the
//! asynchronous device-pointer API of [`GpuElasticPool::device`] ([`GpuArena::resolve_async`]
//! etc.) with fixed buffers, which is CUDA-graph capturable; [`GpuElasticPool::slot_of`] gives the
//! session slot of a session.

use std::sync::Arc;

use std::sync::OnceLock;

use cuda_kernels::{
    CopyBackend, KvCopy, KvDims, KvResolveArgs, KvResolveOptions, KvSlotDesc, KV_LAYOUT_IN_PLACE,
    KV_LAYOUT_PACKED, KV_STATS,
};
use cuda_kernels::{CudaError, DeviceBuffer, EventSignal, Gpu};
use hashbrown::HashMap;
use tier_core::CompletionSignal;

use super::GpuArena;
use crate::data::SessionId;
use crate::error::{KvError, Result};
use crate::layout::Geometry;
use crate::pool::{Admission, ElasticPool, PoolConfig, StepMaintenance};
use crate::resolve::{
    OutputLayout, ResolveInput, ResolveOptions, ResolveOutput, ResolvePlan, ResolveStats, Resolved,
    Resolver, RowCopy,
};
use crate::ticket::{ReadTicket, TicketEnd};

/// The fence's view of a GPU reader: complete once the ticket ended and the step stream passed
/// the event recorded then (`Some(None)`: ended after a device synchronize, no event).
#[derive(Debug, Clone, Default)]
struct DeviceReader(Arc<OnceLock<Option<EventSignal>>>);

impl CompletionSignal for DeviceReader {
    fn is_complete(&self) -> bool {
        match self.0.get() {
            None => false,
            Some(None) => true,
            Some(Some(event)) => event.is_complete(),
        }
    }
}

/// Ends a GPU ticket: records the event on the step stream (after every kernel queued so far).
#[derive(Debug)]
struct DeviceEnd {
    gpu: Arc<Gpu>,
    reader: DeviceReader,
}

impl TicketEnd for DeviceEnd {
    fn end(self: Box<Self>) {
        let done = match EventSignal::record(&self.gpu, self.gpu.stream()) {
            Ok(event) => Some(event),
            // No event: wait for the device instead; on failure leave the reader in flight for
            // good (pages stay pending rather than being reused under a reader).
            Err(_) => match self.gpu.synchronize() {
                Ok(()) => None,
                Err(_) => return,
            },
        };
        let _ = self.reader.0.set(done);
    }
}

/// Device capacity of a [`GpuElasticPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuPoolConfig {
    /// Live sessions at once (session slots of the device tables).
    pub max_sessions: u32,
    /// Positions per session (committed + drafts) the pinned host store holds.
    pub max_history: u32,
    /// How misses are copied (zero-copy gather inside the kernel, or `cuMemcpyBatchAsync`).
    pub backend: CopyBackend,
}

/// The elastic pool with its resolver on the GPU (see the module docs).
pub struct GpuElasticPool {
    cpu: ElasticPool,
    dev: GpuArena,
    gcfg: GpuPoolConfig,
    slot_of: HashMap<SessionId, u32>,
    session_of: Vec<Option<SessionId>>,
    synced: Vec<u32>,
    miss_tokens: u64,
}

impl std::fmt::Debug for GpuElasticPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuElasticPool")
            .field("cpu", &self.cpu)
            .field("config", &self.gcfg)
            .field("live_slots", &self.slot_of.len())
            .finish()
    }
}

fn cuda(e: CudaError) -> KvError {
    KvError::Cuda(e)
}

impl GpuElasticPool {
    /// A pool for `geometry` on `gpu`: the control plane (`ElasticPool::new`'s errors) plus the device
    /// tables, arena and pinned host store for `gcfg` (CUDA errors as [`KvError::Cuda`]).
    pub fn new(
        gpu: &Arc<Gpu>,
        geometry: Geometry,
        config: PoolConfig,
        gcfg: GpuPoolConfig,
    ) -> Result<Self> {
        let cpu = ElasticPool::new(geometry, config)?;
        let dims = KvDims {
            row_bytes: geometry.row_bytes,
            layers: geometry.layers,
            page_rows: geometry.page_rows,
            hot_rows: geometry.hot_rows,
            tail_rows: geometry.tail_rows,
            scratch_rows: geometry.scratch_rows,
            fixed_pages: geometry.fixed_pages(),
            max_slots: gcfg.max_sessions,
            max_history: gcfg.max_history,
            max_pages: gcfg.max_history.div_ceil(geometry.page_rows),
            arena_rows: geometry.arena_rows() as u32,
            pad0: 0,
        };
        let dev = GpuArena::new(gpu, dims).map_err(cuda)?;
        Ok(Self {
            cpu,
            dev,
            gcfg,
            slot_of: HashMap::new(),
            session_of: vec![None; gcfg.max_sessions as usize],
            synced: vec![0; gcfg.max_sessions as usize],
            miss_tokens: 0,
        })
    }

    /// The control plane (read-only: change it through this pool's methods so the device follows).
    pub fn cpu(&self) -> &ElasticPool {
        &self.cpu
    }

    /// The device state and kernels (asynchronous, graph-capturable API).
    pub fn device(&self) -> &GpuArena {
        &self.dev
    }

    /// Mutable device state (e.g. to clear error counters).
    pub fn device_mut(&mut self) -> &mut GpuArena {
        &mut self.dev
    }

    /// The copy back-end.
    pub fn backend(&self) -> CopyBackend {
        self.gcfg.backend
    }

    /// Switches the copy back-end.
    pub fn set_backend(&mut self, backend: CopyBackend) {
        self.gcfg.backend = backend;
    }

    /// The session slot of a live session (index into the device tables).
    pub fn slot_of(&self, session: SessionId) -> Result<u32> {
        self.cpu.host().check_live(session)?;
        self.slot_of
            .get(&session)
            .copied()
            .ok_or(KvError::UnknownSession(session))
    }

    /// Distinct rows fetched from the host store by device resolves.
    pub fn miss_tokens(&self) -> u64 {
        self.miss_tokens
    }

    fn capacity(&self, what: &'static str, value: u64) -> KvError {
        KvError::Cuda(CudaError::OutOfRange {
            what,
            value,
            limit: self.gcfg.max_history as u64 + 1,
        })
    }

    /// [`ElasticPool::admit`], then publishes the session to a free session slot.
    /// Extra errors (nothing changes): `Cuda(OutOfRange)` when no slot is free or the history
    /// exceeds `max_history`.
    pub fn admit(&mut self, session: SessionId, history: &[u8]) -> Result<Admission> {
        let n = self.cpu.host().check_tokens(history, false)?;
        if n > self.gcfg.max_history {
            return Err(self.capacity("history length (max_history)", n as u64));
        }
        if self.slot_of.len() >= self.gcfg.max_sessions as usize {
            return Err(KvError::Cuda(CudaError::OutOfRange {
                what: "live sessions (max_sessions)",
                value: self.slot_of.len() as u64 + 1,
                limit: self.gcfg.max_sessions as u64 + 1,
            }));
        }
        self.settle_readers()?;
        let a = self.cpu.admit(session, history)?;
        self.publish()?;
        Ok(a)
    }

    /// Admits several sessions with one publish at the end (one arena upload instead of one per
    /// session). Stops at the first error or `Waiting` admission; what was admitted before stays
    /// admitted and published. Returns the outcome of each attempted admission.
    pub fn admit_batch(&mut self, sessions: &[(SessionId, &[u8])]) -> Result<Vec<Admission>> {
        self.settle_readers()?;
        let mut out = Vec::with_capacity(sessions.len());
        let mut first_err = None;
        for &(session, history) in sessions {
            let n = match self.cpu.host().check_tokens(history, false) {
                Ok(n) => n,
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            };
            if n > self.gcfg.max_history {
                first_err = Some(self.capacity("history length (max_history)", n as u64));
                break;
            }
            if self.cpu.active_sessions() >= self.gcfg.max_sessions as usize {
                first_err = Some(KvError::Cuda(CudaError::OutOfRange {
                    what: "live sessions (max_sessions)",
                    value: self.cpu.active_sessions() as u64 + 1,
                    limit: self.gcfg.max_sessions as u64 + 1,
                }));
                break;
            }
            match self.cpu.admit(session, history) {
                Ok(a) => {
                    out.push(a);
                    if matches!(a, Admission::Waiting { .. }) {
                        break;
                    }
                }
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        self.publish()?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// [`ElasticPool::append`], then publishes. Extra error: history beyond `max_history`.
    pub fn append(&mut self, session: SessionId, tokens: &[u8]) -> Result<u32> {
        let n = self.cpu.host().check_tokens(tokens, true)?;
        let now = self.cpu.committed_len(session)?;
        if now as u64 + n as u64 > self.gcfg.max_history as u64 {
            return Err(self.capacity("history length (max_history)", now as u64 + n as u64));
        }
        let r = self.cpu.append(session, tokens)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::write_scratch`], then publishes. Extra error: drafts beyond `max_history`.
    pub fn write_scratch(&mut self, session: SessionId, tokens: &[u8]) -> Result<()> {
        let n = self.cpu.host().check_tokens(tokens, true)?;
        let now = self.cpu.committed_len(session)? + self.cpu.scratch_len(session)?;
        if now as u64 + n as u64 > self.gcfg.max_history as u64 {
            return Err(self.capacity(
                "committed + draft length (max_history)",
                now as u64 + n as u64,
            ));
        }
        self.cpu.write_scratch(session, tokens)?;
        self.publish()
    }

    /// [`ElasticPool::accept`], then publishes.
    pub fn accept(&mut self, session: SessionId, n: u32) -> Result<u32> {
        let r = self.cpu.accept(session, n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::finish`], then frees the session's slot.
    pub fn finish(&mut self, session: SessionId) -> Result<()> {
        self.cpu.finish(session)?;
        self.publish()
    }

    /// [`ElasticPool::reclaim`], then publishes (the owners stop mapping the pages at once).
    pub fn reclaim(&mut self, n: u32) -> Result<u32> {
        self.settle_readers()?;
        let r = self.cpu.reclaim(n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::between_steps`], then publishes (grown pages are uploaded).
    pub fn between_steps(&mut self, chunk: u32) -> Result<StepMaintenance> {
        self.settle_readers()?;
        let r = self.cpu.between_steps(chunk)?;
        self.publish()?;
        Ok(r)
    }

    /// Publishes the control plane to the device: session slots of new and finished sessions, each
    /// live session's descriptor and page tables, new committed history into the pinned host
    /// store, and every arena row except live sessions' hot rows. Synchronous (between steps).
    pub fn publish(&mut self) -> Result<()> {
        let live: Vec<SessionId> = self.cpu.sessions().collect();
        let gone: Vec<(SessionId, u32)> = self
            .slot_of
            .iter()
            .filter(|(s, _)| self.cpu.host().check_live(**s).is_err())
            .map(|(&s, &b)| (s, b))
            .collect();
        for (s, b) in gone {
            self.dev.reset_slot(b).map_err(cuda)?;
            self.slot_of.remove(&s);
            self.session_of[b as usize] = None;
            self.synced[b as usize] = 0;
        }
        for &s in &live {
            if !self.slot_of.contains_key(&s) {
                let b = self
                    .session_of
                    .iter()
                    .position(Option::is_none)
                    .ok_or(KvError::Cuda(CudaError::OutOfRange {
                        what: "live sessions (max_sessions)",
                        value: self.slot_of.len() as u64 + 1,
                        limit: self.gcfg.max_sessions as u64 + 1,
                    }))? as u32;
                self.dev.reset_slot(b).map_err(cuda)?;
                self.slot_of.insert(s, b);
                self.session_of[b as usize] = Some(s);
                self.synced[b as usize] = 0;
            }
        }
        let g = *self.cpu.geometry();
        let dims = *self.dev.dims();
        let pr = g.page_rows;
        let mut hot_row = vec![false; g.arena_rows() as usize];
        for &s in &live {
            let b = self.slot_of[&s];
            let pl = self.cpu.placement(s)?;
            // New committed history -> pinned host store.
            let from = self.synced[b as usize];
            if pl.committed > from {
                let tb = g.token_bytes();
                let dst0 = dims.host_offset(b, from, 0);
                let store = self.dev.host_store_mut();
                for p in from..pl.committed {
                    let tok = self.cpu.host().token(s, p)?;
                    let off = dst0 + (p - from) as usize * tb;
                    store[off..off + tb].copy_from_slice(tok);
                }
                self.synced[b as usize] = pl.committed;
            }
            let desc = KvSlotDesc {
                live: 1,
                committed: pl.committed,
                scratch_len: pl.scratch_len,
                full: u32::from(pl.full),
                tail_start: pl.committed.saturating_sub(g.tail_rows),
                pad: [0; 3],
            };
            let fixed: Vec<i32> = pl.fixed_pages.iter().map(|&p| p as i32).collect();
            for local in 0..g.hot_rows {
                let row = pl.fixed_pages[(local / pr) as usize] * pr + local % pr;
                hot_row[row as usize] = true;
            }
            self.dev
                .set_slot(b, desc, &fixed, pl.page_table)
                .map_err(cuda)?;
        }
        // Arena rows the control plane owns (everything but live hot rows), in maximal runs.
        let rb = g.row_bytes as usize;
        for layer in 0..g.layers {
            let plane = self.cpu.plane(layer)?;
            let mut row = 0usize;
            while row < hot_row.len() {
                if hot_row[row] {
                    row += 1;
                    continue;
                }
                let start = row;
                while row < hot_row.len() && !hot_row[row] {
                    row += 1;
                }
                self.dev
                    .upload_rows(layer, start as u32, &plane[start * rb..row * rb])
                    .map_err(cuda)?;
            }
        }
        self.dev.gpu().synchronize().map_err(cuda)
    }

    /// Waits for the device, so every ticket ended before this call is complete when the control
    /// plane collects pages (the GPU passed the event it recorded): the pool then frees exactly the
    /// pages the CPU reference frees for the same calls. Control operations are synchronous anyway
    /// (`publish` waits for the device too).
    fn settle_readers(&self) -> Result<()> {
        self.dev.gpu().synchronize().map_err(cuda)
    }

    /// Registers a GPU reader in the pool's fence (see [`ReadTicket`]'s orderings).
    fn register_reader(&self) -> ReadTicket {
        let reader = DeviceReader::default();
        self.cpu.fence().enter_signal(Box::new(reader.clone()));
        ReadTicket::with_end(Box::new(DeviceEnd {
            gpu: self.dev.gpu().clone(),
            reader,
        }))
    }

    fn plan_from_device(&self, copies: &[KvCopy]) -> Vec<RowCopy> {
        copies
            .iter()
            .map(|c| RowCopy {
                session: self.session_of[c.slot as usize].expect("plan rows name live slots"),
                position: c.position,
                dst_row: c.dst_row,
            })
            .collect()
    }

    fn device_errors_clean(&mut self, layer: u32) -> Result<()> {
        let mut e = self.dev.errors().map_err(cuda)?;
        // Overflow is not bad input: the step was served as far as the hot cache allowed (the
        // unserved picks are in the stats); clear the word so it does not accumulate.
        let overflowed = e.overflow > 0;
        e.overflow = 0;
        if overflowed && e.is_clean() {
            self.dev.clear_errors().map_err(cuda)?;
        }
        if !e.is_clean() {
            self.dev.clear_errors().map_err(cuda)?;
            return Err(KvError::Cuda(CudaError::Residency {
                layer,
                reason: "device kernel reported bad input that passed host validation",
            }));
        }
        Ok(())
    }

    /// Copies `copies` into layer `layer` with the configured back-end (synchronous).
    fn copy_rows(&self, copies: &[KvCopy], layer: u32) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let gpu = self.dev.gpu().clone();
        let stream = gpu.stream();
        match self.gcfg.backend {
            CopyBackend::Dma => self.dev.dma_copy_async(stream, copies, layer, 1),
            CopyBackend::Gather => {
                let ctx = gpu.ctx();
                let plan = DeviceBuffer::from_host(ctx, copies)?;
                let count = DeviceBuffer::from_host(ctx, &[copies.len() as u32])?;
                gpu.synchronize()?;
                // SAFETY: one segment of `copies.len()` entries in live device buffers that outlive
                // the launch (we synchronize below); the plan's rows were checked fresh.
                unsafe {
                    self.dev.replay_async(
                        stream,
                        plan.device_ptr(),
                        count.device_ptr(),
                        1,
                        copies.len() as u32,
                        layer,
                        1,
                    )
                }?;
                stream
                    .synchronize()
                    .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
            }
        }
        .map_err(cuda)?;
        stream
            .synchronize()
            .map_err(|e| cuda(CudaError::driver("cuStreamSynchronize", e)))
    }
}

impl Resolver for GpuElasticPool {
    fn resolve_with(
        &mut self,
        input: &ResolveInput<'_>,
        opts: &ResolveOptions<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved> {
        // The same checks, errors and output fill as the CPU reference.
        self.cpu.validate_resolve(input, opts, out)?;
        let rows = input.topk.len() / input.k;
        let reqs = input.sessions.len();
        let slots: Vec<i32> = input
            .sessions
            .iter()
            .map(|&s| self.slot_of(s).map(|b| b as i32))
            .collect::<Result<_>>()?;
        let gpu = self.dev.gpu().clone();
        let ctx = gpu.ctx();
        let hot = self.dev.dims().hot_rows as usize;
        let dev_in = (|| -> cuda_kernels::Result<_> {
            Ok((
                DeviceBuffer::from_host(ctx, input.topk)?,
                DeviceBuffer::from_host(ctx, input.query_start_loc)?,
                DeviceBuffer::from_host(ctx, input.seq_lens)?,
                DeviceBuffer::from_host(ctx, &slots)?,
                DeviceBuffer::<i32>::zeroed(ctx, out.indices.len().max(1))?,
                DeviceBuffer::<i32>::zeroed(ctx, out.valid_count.len().max(1))?,
                DeviceBuffer::from_host(ctx, opts.query_seq_lens.unwrap_or(&[0]))?,
                DeviceBuffer::<KvCopy>::zeroed(ctx, reqs * hot)?,
                DeviceBuffer::<u32>::zeroed(ctx, reqs)?,
                DeviceBuffer::<u32>::zeroed(ctx, reqs * KV_STATS)?,
            ))
        })()
        .map_err(cuda)?;
        let (topk, qsl, seq, slot_buf, idx, valid, qseq, plan, plan_count, stats) = dev_in;
        gpu.synchronize().map_err(cuda)?;
        let args = KvResolveArgs {
            topk: topk.device_ptr(),
            query_start_loc: qsl.device_ptr(),
            seq_lens: seq.device_ptr(),
            session_slot: slot_buf.device_ptr(),
            sessions: reqs as u32,
            rows: rows as u32,
            k: input.k as u32,
            layer: input.layer,
            indices: idx.device_ptr(),
            valid_count: valid.device_ptr(),
            plan: plan.device_ptr(),
            plan_count: plan_count.device_ptr(),
            stats: stats.device_ptr(),
        };
        let o = KvResolveOptions {
            layout: match opts.layout {
                OutputLayout::InPlace => KV_LAYOUT_IN_PLACE,
                OutputLayout::Packed => KV_LAYOUT_PACKED,
            },
            query_seq_lens: if opts.query_seq_lens.is_some() {
                qseq.device_ptr()
            } else {
                0
            },
            indices_len: out.indices.len() as u64,
            valid_len: out.valid_count.len() as u64,
        };
        let stream = gpu.stream();
        // SAFETY: every pointer addresses a live buffer of the documented shape (allocated above,
        // output buffers of the host outputs' lengths, alive until after the synchronize below);
        // the tables are only touched by this stream.
        unsafe {
            self.dev
                .resolve_async_with(stream, &args, &o, self.gcfg.backend)
        }
        .map_err(cuda)?;
        stream
            .synchronize()
            .map_err(|e| cuda(CudaError::driver("cuStreamSynchronize", e)))?;
        let counts = plan_count.download().map_err(cuda)?;
        let all = plan.download().map_err(cuda)?;
        let mut copies = Vec::new();
        for (r, &c) in counts.iter().enumerate() {
            copies.extend_from_slice(&all[r * hot..r * hot + c as usize]);
        }
        if self.gcfg.backend == CopyBackend::Dma {
            self.copy_rows(&copies, input.layer)?;
        }
        let n_idx = out.indices.len();
        out.indices
            .copy_from_slice(&idx.download().map_err(cuda)?[..n_idx]);
        let n_valid = out.valid_count.len();
        out.valid_count
            .copy_from_slice(&valid.download().map_err(cuda)?[..n_valid]);
        self.device_errors_clean(input.layer)?;
        let st = stats.download().map_err(cuda)?;
        let mut stats = ResolveStats::default();
        for r in st.chunks(KV_STATS) {
            stats.picks += r[0] as u64;
            stats.tail_hits += r[1] as u64;
            stats.scratch_hits += r[2] as u64;
            stats.page_hits += r[3] as u64;
            stats.hot_hits += r[4] as u64;
            stats.misses += r[5] as u64;
            stats.direct_sessions += r[6] as u64;
        }
        // Valid picks (validated: all in range) the kernel could not serve (no evictable hot row).
        let wanted = input.topk.iter().filter(|&&p| p >= 0).count() as u64;
        stats.unserved = wanted.saturating_sub(stats.picks);
        self.miss_tokens += stats.misses;
        Ok(Resolved {
            plan: ResolvePlan {
                copies: self.plan_from_device(&copies),
            },
            stats,
            ticket: self.register_reader(),
        })
    }

    fn replay(&mut self, plan: &ResolvePlan, layer: u32) -> Result<()> {
        let g = *self.cpu.geometry();
        if layer >= g.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: g.layers,
            });
        }
        // Staleness: each destination row must still hold its position (checked in plan order
        // against the device's position table, as the CPU reference checks its hot cache).
        let mut copies = Vec::with_capacity(plan.copies.len());
        for c in &plan.copies {
            let slot = self.slot_of(c.session)?;
            let pl = self.cpu.placement(c.session)?;
            let ok = c.position < self.gcfg.max_history
                && self
                    .dev
                    .hot_slot_of(slot, c.position)
                    .map_err(cuda)?
                    .is_some_and(|s| {
                        pl.fixed_pages[(s / g.page_rows) as usize] * g.page_rows + s % g.page_rows
                            == c.dst_row
                    });
            if !ok {
                return Err(KvError::StalePlan {
                    session: c.session,
                    position: c.position,
                    row: c.dst_row,
                });
            }
            copies.push(KvCopy {
                slot,
                position: c.position,
                dst_row: c.dst_row,
                pad: 0,
            });
        }
        self.copy_rows(&copies, layer)
    }

    fn prefetch(
        &mut self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<ResolvePlan> {
        self.cpu.validate_prefetch(session, candidates, layer)?;
        let slot = self.slot_of(session)? as i32;
        let gpu = self.dev.gpu().clone();
        let ctx = gpu.ctx();
        let hot = self.dev.dims().hot_rows as usize;
        let n = candidates.len().max(1);
        let mut cand = candidates.to_vec();
        cand.resize(n, -1);
        let bufs = (|| -> cuda_kernels::Result<_> {
            Ok((
                DeviceBuffer::from_host(ctx, &[slot])?,
                DeviceBuffer::from_host(ctx, &cand)?,
                DeviceBuffer::from_host(ctx, &[candidates.len() as u32])?,
                DeviceBuffer::<KvCopy>::zeroed(ctx, hot)?,
                DeviceBuffer::<u32>::zeroed(ctx, 1)?,
            ))
        })()
        .map_err(cuda)?;
        let (slots, cand_d, count, plan, plan_count) = bufs;
        gpu.synchronize().map_err(cuda)?;
        let stream = gpu.stream();
        // The prefetch always gathers inside its kernel (it runs on a side stream while other layers
        // compute; the back-end switch applies to resolve and replay).
        // SAFETY: live buffers of the documented shapes, alive until the synchronize below.
        unsafe {
            self.dev.prefetch_async(
                stream,
                slots.device_ptr(),
                cand_d.device_ptr(),
                count.device_ptr(),
                1,
                n as u32,
                layer,
                1,
                plan.device_ptr(),
                plan_count.device_ptr(),
            )
        }
        .map_err(cuda)?;
        stream
            .synchronize()
            .map_err(|e| cuda(CudaError::driver("cuStreamSynchronize", e)))?;
        let c = plan_count.download().map_err(cuda)?[0] as usize;
        let copies = plan.download().map_err(cuda)?[..c].to_vec();
        self.device_errors_clean(layer)?;
        Ok(ResolvePlan {
            copies: self.plan_from_device(&copies),
        })
    }
}
