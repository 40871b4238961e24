//! [`GpuElasticPool`]: the elastic pool with its data plane and its resolver on the GPU.
//!
//! Split of work. The control plane is the CPU pool's ([`ElasticPool`], generic over its data
//! plane): admissions, loans, reclaim, hand-back, appends, drafts — everything between steps. Its
//! data plane here is [`GpuData`]: the history lives once, in the mapped pinned store the kernels
//! read ([`PinnedBytes`] is the host store's backing), and the device state is a [`GpuArena`].
//! The control plane's calls record *what changed*; after each control operation
//! [`GpuElasticPool::publish`] enqueues O(changed) asynchronous work and returns without waiting:
//!
//! | work | stream | ordered by |
//! | --- | --- | --- |
//! | page fills (pages just lent) and the tail rows of sessions admitted since the last publish: host store → arena rows (`tierkit_kv_replay` gather, a warp per row) | copy stream | waits for the last write-back event (history the device wrote), then runs beside the step in flight |
//! | write-backs: arena rows → host store (`tierkit_kv_write_back`; accepted drafts, rows the engine wrote, [`GpuElasticPool::append_written`]) | step stream | after the kernels that wrote the rows; records the write-back event |
//! | table patches (`tierkit_kv_fill_words`): slot resets, descriptors, fixed pages, page-table entries of pages mapped (after their fill) and unmapped (reclaim) | step stream | waits for this publish's fill event, so a page is mapped only once its rows hold its bytes; before every later resolve |
//! | tail / draft rows of live sessions: host store → arena rows | step stream | after the resolves queued before (which may read the rows they overwrite) |
//!
//! The lists (copies, patches) are staged in mapped pinned memory that the kernels read in place
//! (no upload); a staging buffer is reused only after the event recorded after its last reader.
//! No publish synchronizes with the host; the bytes it stages are counted ([`GpuFlushCounters`]).
//!
//! Reader fences. Every page the step stream's data-plane work touches stays allocated until that
//! work has run: each publish that queues step-stream copies registers a reader (its event) in the
//! pool's fence, like a resolve's [`ReadTicket`], so a page reclaimed or released after it is
//! reused (by a fill on the copy stream) only once the step stream passed it. Pages taken by a
//! fill were free (every reader before passed), so the copy stream never waits for the step
//! stream except for the write-back event. A finished session's slot (its host store bytes,
//! which queued kernels may still read or write) is reused only once the step stream passes the
//! publish that freed it.
//!
//! The device's replacement decisions equal the CPU reference's (same contract: same CLOCK sweep,
//! same pins), so a GPU pool and a CPU pool fed the same operations return identical indices,
//! valid counts, plans and stats, and the bytes at every returned row equal a fully resident
//! cache's (`tests/gpu_exactness.rs`, with [`GpuElasticPool::set_settle_readers`] so both pools
//! free pages at the same calls).
//!
//! The [`Resolver`] methods are synchronous (inputs and outputs are host slices): they upload,
//! launch on the GPU's step stream, and download. Their [`ReadTicket`] is a CUDA event recorded on
//! the step stream when the ticket ends (see `ReadTicket`'s orderings). Engines use the
//! asynchronous device-pointer API of [`GpuElasticPool::device`] ([`GpuArena::resolve_async`]
//! etc.) with fixed buffers, which is CUDA-graph capturable; [`GpuElasticPool::slot_of`] gives the
//! session slot of a session, [`GpuElasticPool::tail_row_of`] the row a new token's KV goes to.

use std::sync::Arc;

use std::sync::OnceLock;

use bytemuck::Pod;
use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{
    CopyBackend, KvCopy, KvDims, KvFill, KvResolveArgs, KvResolveOptions, KvSlotDesc,
    KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED, KV_STATS,
};
use cuda_kernels::{CudaError, DeviceBuffer, EventSignal, Gpu, PinnedBuffer};
use hashbrown::HashMap;
use tier_core::CompletionSignal;

use super::data::{DraftReads, GpuData, PinnedBytes};
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

/// What the publishes of a [`GpuElasticPool`] did, cumulative (see
/// [`GpuElasticPool::flush_counters`]). Rows count arena rows of one token (all layers each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuFlushCounters {
    /// Publishes that queued any work.
    pub flushes: u64,
    /// Rows copied host store → arena on the copy stream (page fills, new sessions' tails).
    pub rows_filled: u64,
    /// Rows copied host store → arena on the step stream (tail rows of appends, drafts).
    pub rows_copied: u64,
    /// Rows written back arena → host store on the step stream.
    pub rows_written_back: u64,
    /// Single table words patched (descriptors, fixed pages, page-table entries).
    pub words_patched: u64,
    /// Table ranges reset (a new or finished session's slot: hot cache, position table).
    pub ranges_reset: u64,
    /// Bytes the device read from host staging (copy lists, counts, patches): the upload.
    pub staged_bytes: u64,
    /// Host waits in control operations (settling readers, waiting for a slot).
    pub host_syncs: u64,
}

/// A mapped pinned staging buffer and the event after its last reader.
#[derive(Debug)]
struct Staging {
    buf: PinnedBuffer<u8>,
    done: EventSignal,
    /// Taken by a publish that has not recorded `done` yet (stays set if that publish fails:
    /// queued kernels may read the buffer, and the pool is poisoned anyway).
    busy: bool,
}

/// Builds one publish's staging image: 16-byte aligned sections.
#[derive(Default)]
struct Image(Vec<u8>);

impl Image {
    fn push<T: Pod>(&mut self, items: &[T]) -> usize {
        let at = self.0.len().next_multiple_of(16);
        self.0.resize(at, 0);
        self.0.extend_from_slice(bytemuck::cast_slice(items));
        at
    }
}

/// Rows per segment of the copy lists handed to the replay kernel (one block per segment).
const SEGMENT: u32 = 64;

/// A copy list as replay segments: the plan (`segments × SEGMENT`, last one short) and counts.
fn segments(copies: &[KvCopy]) -> (Vec<KvCopy>, Vec<u32>) {
    let n = copies.len() as u32;
    let counts = (0..n.div_ceil(SEGMENT))
        .map(|b| (n - b * SEGMENT).min(SEGMENT))
        .collect();
    (copies.to_vec(), counts)
}

/// Copies the staged replay segments at `base + at.0` (plan) / `base + at.1` (counts) from the
/// pinned store into every layer of their rows, on `stream`.
///
/// # Safety
/// As [`GpuArena::replay_async`]: the staging stays readable until `stream` passes the launch.
unsafe fn copy_segments(
    dev: &GpuArena,
    stream: &CudaStream,
    base: u64,
    at: (usize, usize),
    segments: usize,
) -> Result<()> {
    let layers = dev.dims().layers;
    // SAFETY: forwarded to the caller's contract.
    unsafe {
        dev.replay_async(
            stream,
            base + at.0 as u64,
            base + at.1 as u64,
            segments as u32,
            SEGMENT,
            0,
            layers,
        )
    }
    .map_err(cuda)
}

/// The elastic pool with its data plane and resolver on the GPU (see the module docs).
pub struct GpuElasticPool {
    cpu: ElasticPool<GpuData>,
    gcfg: GpuPoolConfig,
    copy: Arc<CudaStream>,
    staging: Vec<Staging>,
    /// Event after the last write-back (the copy stream waits for it before reading history).
    last_write_back: Option<EventSignal>,
    /// Freed session slots and the event after which nothing queued touches them.
    quarantine: Vec<(u32, EventSignal)>,
    /// Draft bytes in the pinned store that queued step copies may still read (see
    /// [`DraftReads`]): a host write over them waits first.
    draft_reads: DraftReads<EventSignal>,
    /// The event recorded at the end of the last publish that queued work.
    last_publish: Option<EventSignal>,
    settle: bool,
    /// Set by a failed publish: every later call fails with [`KvError::Poisoned`].
    poisoned: Option<String>,
    fail_next_publish: bool,
    miss_tokens: u64,
    counters: GpuFlushCounters,
}

impl std::fmt::Debug for GpuElasticPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuElasticPool")
            .field("cpu", &self.cpu)
            .field("config", &self.gcfg)
            .field("counters", &self.counters)
            .finish()
    }
}

fn cuda(e: CudaError) -> KvError {
    KvError::Cuda(e)
}

impl GpuElasticPool {
    /// A pool for `geometry` on `gpu`: the control plane (`ElasticPool::new`'s errors) plus the device
    /// tables, arena and pinned host store for `gcfg` (CUDA errors as [`KvError::Cuda`]), and a
    /// copy stream.
    pub fn new(
        gpu: &Arc<Gpu>,
        geometry: Geometry,
        config: PoolConfig,
        gcfg: GpuPoolConfig,
    ) -> Result<Self> {
        geometry.validate()?;
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
        let cpu = ElasticPool::with_data(geometry, config, GpuData::new(dev))?;
        Ok(Self {
            cpu,
            gcfg,
            copy: gpu.new_stream().map_err(cuda)?,
            staging: Vec::new(),
            last_write_back: None,
            quarantine: Vec::new(),
            draft_reads: DraftReads::default(),
            last_publish: None,
            settle: false,
            poisoned: None,
            fail_next_publish: false,
            miss_tokens: 0,
            counters: GpuFlushCounters::default(),
        })
    }

    /// The control plane (read-only: change it through this pool's methods so the device follows).
    /// Its host store's `row` / `token` wait on the host for the last queued write-back before
    /// handing out bytes (counted in [`GpuFlushCounters::host_syncs`]).
    pub fn cpu(&self) -> &ElasticPool<GpuData> {
        &self.cpu
    }

    /// The device state and kernels (asynchronous, graph-capturable API).
    pub fn device(&self) -> &GpuArena {
        &self.cpu.data.dev
    }

    /// Mutable device state (e.g. to clear error counters).
    pub fn device_mut(&mut self) -> &mut GpuArena {
        &mut self.cpu.data.dev
    }

    /// The copy stream page fills run on (see the module docs).
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy
    }

    /// The copy back-end.
    pub fn backend(&self) -> CopyBackend {
        self.gcfg.backend
    }

    /// Switches the copy back-end.
    pub fn set_backend(&mut self, backend: CopyBackend) {
        self.gcfg.backend = backend;
    }

    /// With `true`, every control operation that frees pages (admit, reclaim, between steps)
    /// first waits for the device, so every ticket ended before it is complete and the pool
    /// frees exactly the pages the CPU reference frees for the same calls (tests comparing the
    /// two). Default `false`: no host wait; pages free when the GPU passed their readers.
    pub fn set_settle_readers(&mut self, settle: bool) {
        self.settle = settle;
    }

    /// The session slot of a live session (index into the device tables).
    pub fn slot_of(&self, session: SessionId) -> Result<u32> {
        self.check_poison()?;
        self.cpu.host().check_live(session)?;
        self.pinned()
            .slot_of(session)
            .ok_or(KvError::UnknownSession(session))
    }

    /// The arena row (same row in every layer's plane) of a live session's tail slot for
    /// `position`: where the engine writes a new token's KV before
    /// [`GpuElasticPool::append_written`].
    pub fn tail_row_of(&self, session: SessionId, position: u32) -> Result<u32> {
        self.check_poison()?;
        self.cpu.tail_row_of(session, position)
    }

    /// Distinct rows fetched from the host store by device resolves.
    pub fn miss_tokens(&self) -> u64 {
        self.miss_tokens
    }

    /// What the publishes did so far (rows copied, words patched, bytes staged, host waits).
    pub fn flush_counters(&self) -> GpuFlushCounters {
        let mut c = self.counters;
        c.host_syncs += self
            .pinned()
            .host_waits
            .load(std::sync::atomic::Ordering::Relaxed);
        c
    }

    fn pinned(&self) -> &PinnedBytes {
        self.cpu.host().backing()
    }

    fn capacity(&self, what: &'static str, value: u64) -> KvError {
        KvError::Cuda(CudaError::OutOfRange {
            what,
            value,
            limit: self.gcfg.max_history as u64 + 1,
        })
    }

    /// Checks an admission against the device capacity, making a freed slot reusable when the
    /// device has passed it (waiting for it only when no other slot is free).
    fn check_admission(&mut self, history: &[u8]) -> Result<()> {
        let n = self.cpu.host().check_tokens(history, false)?;
        if n > self.gcfg.max_history {
            return Err(self.capacity("history length (max_history)", n as u64));
        }
        if self.cpu.active_sessions() >= self.gcfg.max_sessions as usize {
            return Err(KvError::Cuda(CudaError::OutOfRange {
                what: "live sessions (max_sessions)",
                value: self.cpu.active_sessions() as u64 + 1,
                limit: self.gcfg.max_sessions as u64 + 1,
            }));
        }
        self.release_slots(false)?;
        if !self.pinned().has_free_slot() {
            self.release_slots(true)?;
        }
        Ok(())
    }

    /// Unblocks quarantined slots whose event passed (`wait`: waits for the oldest one first).
    fn release_slots(&mut self, wait: bool) -> Result<()> {
        if wait {
            if let Some((_, ev)) = self.quarantine.first() {
                ev.event()
                    .synchronize()
                    .map_err(|e| cuda(CudaError::driver("cuEventSynchronize", e)))?;
                self.counters.host_syncs += 1;
            }
        }
        let mut i = 0;
        while i < self.quarantine.len() {
            if self.quarantine[i].1.is_complete() {
                let (slot, _) = self.quarantine.swap_remove(i);
                self.cpu.data.pinned_mut().unblock(slot);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// [`ElasticPool::admit`], then publishes (asynchronous). Extra errors (nothing changes):
    /// `Cuda(OutOfRange)` when no slot is free or the history exceeds `max_history`.
    pub fn admit(&mut self, session: SessionId, history: &[u8]) -> Result<Admission> {
        self.check_poison()?;
        self.check_admission(history)?;
        self.settle_readers()?;
        let a = self.cpu.admit(session, history);
        self.publish()?;
        a
    }

    /// Admits several sessions with one publish at the end. Stops at the first error or `Waiting`
    /// admission; what was admitted before stays admitted and published. Returns the outcome of
    /// each attempted admission.
    pub fn admit_batch(&mut self, sessions: &[(SessionId, &[u8])]) -> Result<Vec<Admission>> {
        self.check_poison()?;
        self.settle_readers()?;
        self.each_then_publish(sessions, |p, (session, history)| {
            p.check_admission(history)?;
            let a = p.cpu.admit(session, history)?;
            Ok((a, matches!(a, Admission::Waiting { .. })))
        })
    }

    /// Runs `op` on each item until the first error or until `op` says stop, then publishes
    /// once; returns the outcomes, or the first error (what ran before it stays published).
    fn each_then_publish<I: Copy, T>(
        &mut self,
        items: &[I],
        mut op: impl FnMut(&mut Self, I) -> Result<(T, bool)>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(items.len());
        let mut first_err = None;
        for &item in items {
            match op(self, item) {
                Ok((t, stop)) => {
                    out.push(t);
                    if stop {
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
        first_err.map_or(Ok(out), Err)
    }

    /// Capacity check: `n` more committed tokens of `session` fit in `max_history`.
    fn check_history_room(&self, session: SessionId, n: u32) -> Result<()> {
        let now = self.cpu.committed_len(session)?;
        if now as u64 + n as u64 > self.gcfg.max_history as u64 {
            return Err(self.capacity("history length (max_history)", now as u64 + n as u64));
        }
        Ok(())
    }

    /// [`ElasticPool::append`] (the CPU path: the tokens' bytes come from the host), then
    /// publishes: the bytes go into the pinned store, the tail rows are copied on the step stream.
    /// Extra error: history beyond `max_history`.
    pub fn append(&mut self, session: SessionId, tokens: &[u8]) -> Result<u32> {
        self.check_poison()?;
        let n = self.cpu.host().check_tokens(tokens, true)?;
        self.check_history_room(session, n)?;
        let at = self.cpu.committed_len(session)?;
        self.wait_draft_reads(session, at, at + n)?;
        let r = self.cpu.append(session, tokens)?;
        self.publish()?;
        Ok(r)
    }

    /// The engine path of an append: the step's kernels wrote the new tokens' KV into the
    /// session's tail rows ([`GpuElasticPool::tail_row_of`] of positions `committed ..
    /// committed + n`, every layer, `n <= tail_rows`); commits them and publishes: a write-back
    /// kernel on the step stream, after those kernels, copies the rows into the pinned host
    /// store (no host sync). Errors: as [`ElasticPool::append_written`], history beyond
    /// `max_history`.
    pub fn append_written(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.check_poison()?;
        let r = self.append_written_one(session, n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`GpuElasticPool::append_written`] for several sessions with one publish (one write-back
    /// launch for the step). Stops at the first error (what was committed before stays
    /// committed and published). Returns the new committed lengths.
    pub fn append_written_batch(&mut self, appends: &[(SessionId, u32)]) -> Result<Vec<u32>> {
        self.check_poison()?;
        self.each_then_publish(appends, |p, (s, n)| {
            Ok((p.append_written_one(s, n)?, false))
        })
    }

    fn append_written_one(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.check_history_room(session, n)?;
        self.cpu.append_written(session, n)
    }

    /// [`ElasticPool::write_scratch`], then publishes. Extra error: drafts beyond `max_history`.
    pub fn write_scratch(&mut self, session: SessionId, tokens: &[u8]) -> Result<()> {
        self.check_poison()?;
        let n = self.cpu.host().check_tokens(tokens, true)?;
        let now = self.cpu.committed_len(session)? + self.cpu.scratch_len(session)?;
        if now as u64 + n as u64 > self.gcfg.max_history as u64 {
            return Err(self.capacity(
                "committed + draft length (max_history)",
                now as u64 + n as u64,
            ));
        }
        self.wait_draft_reads(session, now, now + n)?;
        self.cpu.write_scratch(session, tokens)?;
        self.publish()?;
        if n > 0 {
            // This publish's step copies read the drafts' pinned bytes until its event.
            let slot = self.slot_of(session)?;
            let ev = self.last_publish.clone().expect("drafts were published");
            self.draft_reads.record(slot, now, now + n, ev);
        }
        Ok(())
    }

    /// Before the host rewrites pinned positions `lo..hi` of `session` (drafts, appends): waits
    /// for the last publish whose step copies read draft bytes there, if it has not run yet (a
    /// host wait, only on this path: `write_scratch` / `append` after `accept(k < drafts)`).
    fn wait_draft_reads(&mut self, session: SessionId, lo: u32, hi: u32) -> Result<()> {
        let slot = self.slot_of(session)?;
        if let Some(ev) = self.draft_reads.take_conflict(slot, lo, hi) {
            self.counters.host_syncs += 1;
            ev.event()
                .synchronize()
                .map_err(|e| cuda(CudaError::driver("cuEventSynchronize", e)))?;
        }
        Ok(())
    }

    /// [`ElasticPool::accept`], then publishes: the accepted drafts are written back from their
    /// scratch rows on the step stream and copied into the tail rows after.
    pub fn accept(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.check_poison()?;
        let r = self.cpu.accept(session, n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::finish`], then publishes (the slot is marked not live; it is reused once
    /// the step stream passed this point).
    pub fn finish(&mut self, session: SessionId) -> Result<()> {
        self.check_poison()?;
        let slot = self.slot_of(session)?;
        self.cpu.finish(session)?;
        self.draft_reads.forget(slot);
        self.publish()
    }

    /// [`ElasticPool::reclaim`], then publishes: the owners' page-table entries are patched on
    /// the step stream (no row moves).
    pub fn reclaim(&mut self, n: u32) -> Result<u32> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.reclaim(n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::between_steps`], then publishes (hand-backs patch nothing on the device:
    /// the finished sessions' slots are not live; grown pages are filled on the copy stream and
    /// mapped after their fill).
    pub fn between_steps(&mut self, chunk: u32) -> Result<StepMaintenance> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.between_steps(chunk)?;
        self.publish()?;
        Ok(r)
    }

    /// Publishes what the control plane changed since the last publish: O(changed) asynchronous
    /// work on the copy and step streams (see the module docs); no host wait. The control
    /// operations call it; calling it again with nothing changed does nothing.
    ///
    /// A failure after the change log was taken poisons the pool (the device no longer follows
    /// the control plane): this call returns the failure and every later one
    /// [`KvError::Poisoned`]; drop the pool.
    pub fn publish(&mut self) -> Result<()> {
        self.check_poison()?;
        self.publish_inner()
            .inspect_err(|e| self.poisoned = Some(e.to_string()))
    }

    /// `Err(Poisoned)` once a publish failed.
    fn check_poison(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(KvError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Makes the next publish fail after staging (tests of the failure path).
    #[doc(hidden)]
    pub fn inject_publish_failure(&mut self) {
        self.fail_next_publish = true;
    }

    fn publish_inner(&mut self) -> Result<()> {
        let log = std::mem::take(&mut self.cpu.data.log);
        let (created, freed) = {
            let p = self.cpu.data.pinned_mut();
            (std::mem::take(&mut p.created), std::mem::take(&mut p.freed))
        };
        if log.is_empty() && created.is_empty() && freed.is_empty() {
            return Ok(());
        }
        let d = *self.device().dims();
        let t = self.device().tables();
        let g = *self.cpu.geometry();
        // Table patches: ranges (slot resets) in one launch, then single words (last one wins).
        let mut ranges: Vec<KvFill> = Vec::new();
        let range = |ranges: &mut Vec<KvFill>, base: u64, word: u64, count: usize, value: u32| {
            ranges.push(KvFill {
                dst: base + 4 * word,
                count: count as u32,
                value,
            })
        };
        let (h, nh, mp, fp) = (
            d.hot_rows as u64,
            d.max_history as u64,
            d.max_pages as u64,
            d.fixed_pages as u64,
        );
        let desc_words = (std::mem::size_of::<KvSlotDesc>() / 4) as u64;
        for &b in created.iter().chain(&freed) {
            let b = b as u64;
            range(&mut ranges, t.desc, b * desc_words, desc_words as usize, 0);
            range(&mut ranges, t.slot_pos, b * h, h as usize, u32::MAX);
            range(&mut ranges, t.referenced, b * h, h as usize, 0);
            range(&mut ranges, t.stamp, 2 * b * h, 2 * h as usize, 0);
            range(&mut ranges, t.hand, b, 1, 0);
            range(&mut ranges, t.pos_slot, b * nh, nh as usize, u32::MAX);
            range(&mut ranges, t.page_tab, b * mp, mp as usize, u32::MAX);
        }
        ranges.dedup();
        let mut words: HashMap<u64, u32> = HashMap::new();
        let mut order: Vec<u64> = Vec::new();
        let mut put = |addr: u64, value: u32| {
            if words.insert(addr, value).is_none() {
                order.push(addr);
            }
        };
        for &b in &created {
            let s = self.pinned().session_at(b).expect("created this window");
            let pl = self.cpu.placement(s)?;
            for (i, &p) in pl.fixed_pages.iter().enumerate() {
                put(t.fixed_pages + 4 * (b as u64 * fp + i as u64), p);
            }
        }
        for &(b, logical, page) in &log.pages {
            if self.pinned().session_at(b).is_some() && (logical as u64) < mp {
                put(
                    t.page_tab + 4 * (b as u64 * mp + logical as u64),
                    page as u32,
                );
            }
        }
        let mut touched = log.touched.clone();
        for &b in &created {
            let s = self.pinned().session_at(b).expect("created this window");
            if !touched.contains(&s) {
                touched.push(s);
            }
        }
        for s in touched {
            let Some(b) = self.pinned().slot_of(s) else {
                continue; // finished since
            };
            let pl = self.cpu.placement(s)?;
            let desc = KvSlotDesc {
                live: 1,
                committed: pl.committed,
                scratch_len: pl.scratch_len,
                full: u32::from(pl.full),
                tail_start: pl.committed.saturating_sub(g.tail_rows),
                pad: [0; 3],
            };
            let w: &[u32] = bytemuck::cast_slice(std::slice::from_ref(&desc));
            for (i, &v) in w.iter().enumerate() {
                put(t.desc + 4 * (b as u64 * desc_words + i as u64), v);
            }
        }
        let points: Vec<KvFill> = order
            .iter()
            .map(|&a| KvFill {
                dst: a,
                count: 1,
                value: words[&a],
            })
            .collect();
        // One staging image for every list of this publish.
        let mut img = Image::default();
        let (fill_plan, fill_counts) = segments(&log.fills);
        let (step_plan, step_counts) = segments(&log.step_copies);
        let at_fill = img.push(&fill_plan);
        let at_fill_n = img.push(&fill_counts);
        let at_wb = img.push(&log.write_backs);
        let at_ranges = img.push(&ranges);
        let at_points = img.push(&points);
        let at_step = img.push(&step_plan);
        let at_step_n = img.push(&step_counts);
        let base = self.stage(&img.0)?;
        if std::mem::take(&mut self.fail_next_publish) {
            return Err(KvError::Unsupported("injected publish failure"));
        }
        let gpu = self.device().gpu().clone();
        let step = gpu.stream().clone();
        let copy = self.copy.clone();
        let ev = |s: &CudaStream| EventSignal::record(&gpu, s).map_err(cuda);
        let dev = &self.cpu.data.dev;
        // 1. Write-backs (step stream, after the kernels that wrote the rows).
        if !log.write_backs.is_empty() {
            // SAFETY: `n` KvCopy staged at `base + at_wb` (mapped pinned, readable until the
            // staging event recorded below passes); their rows and slots are live (control plane).
            unsafe {
                dev.write_back_async(
                    &step,
                    base + at_wb as u64,
                    log.write_backs.len() as u32,
                    0,
                    d.layers,
                )
            }
            .map_err(cuda)?;
            self.last_write_back = Some(ev(&step)?);
        }
        // 2. Fills (copy stream; after the last write-back; pages just taken were free).
        if !log.fills.is_empty() {
            if let Some(wb) = &self.last_write_back {
                wb.wait_on(&copy).map_err(cuda)?;
            }
            // SAFETY: segments staged at `base + at_fill` / `at_fill_n` (live until the staging
            // event, which the step stream records after waiting for this stream's fill event);
            // the destination rows belong to pages no reader or other stream's queued work
            // touches (free pages, fence; see the module docs).
            unsafe { copy_segments(dev, &copy, base, (at_fill, at_fill_n), fill_counts.len()) }?;
            ev(&copy)?.wait_on(&step).map_err(cuda)?;
        }
        // 3. Table patches (step stream, after the fills they map).
        // SAFETY: every entry names words of our tables (addresses built from `tables()` with
        // in-range indices above); ranges are disjoint or equal-valued, points are deduplicated;
        // staged until the staging event.
        unsafe {
            dev.fill_words_async(&step, base + at_ranges as u64, ranges.len() as u32)
                .map_err(cuda)?;
            dev.fill_words_async(&step, base + at_points as u64, points.len() as u32)
                .map_err(cuda)?;
        }
        // 4. Tail and draft rows of live sessions (step stream, after the write-backs).
        if !log.step_copies.is_empty() {
            // SAFETY: as the fills; the rows are the sessions' own tail / scratch rows, and every
            // earlier reader of them is earlier on this stream.
            unsafe { copy_segments(dev, &step, base, (at_step, at_step_n), step_counts.len()) }?;
        }
        let done = ev(&step)?;
        self.last_publish = Some(done.clone());
        if let (false, Some(wb)) = (log.write_backs.is_empty(), &self.last_write_back) {
            // The host store's byte view waits for it (no slice over bytes still being written).
            self.cpu.data.pinned_mut().set_last_write_back(wb.clone());
        }
        // The staging buffer is free again once the step stream passes `done` (which follows the
        // wait for the copy stream's fills).
        let staged = self
            .staging
            .iter_mut()
            .find(|s| s.buf.device_ptr() == base)
            .expect("staged above");
        staged.done = done.clone();
        staged.busy = false;
        if !log.write_backs.is_empty() || !log.step_copies.is_empty() {
            // Pages the step-stream copies touch stay allocated until they ran.
            self.cpu.fence().enter_signal(Box::new(done.clone()));
        }
        for b in freed {
            self.quarantine.push((b, done.clone()));
        }
        let c = &mut self.counters;
        c.flushes += 1;
        c.rows_filled += log.fills.len() as u64;
        c.rows_copied += log.step_copies.len() as u64;
        c.rows_written_back += log.write_backs.len() as u64;
        c.words_patched += points.len() as u64;
        c.ranges_reset += ranges.len() as u64;
        c.staged_bytes += img.0.len() as u64;
        Ok(())
    }

    /// Copies `image` into a free staging buffer (mapped pinned memory); returns its device
    /// address. A buffer is free once the event after its last reader passed (no host wait; a
    /// new buffer is allocated when none is free or large enough).
    fn stage(&mut self, image: &[u8]) -> Result<u64> {
        let need = image.len().max(16);
        let i = match self
            .staging
            .iter()
            .position(|s| !s.busy && s.buf.len() >= need && s.done.is_complete())
        {
            Some(i) => i,
            None => {
                let ctx = self.device().gpu().ctx().clone();
                let buf = PinnedBuffer::zeroed(&ctx, need.next_power_of_two().max(64 << 10))
                    .map_err(cuda)?;
                let done = EventSignal::unrecorded(self.device().gpu()).map_err(cuda)?;
                self.staging.push(Staging {
                    buf,
                    done,
                    busy: false,
                });
                self.staging.len() - 1
            }
        };
        let s = &mut self.staging[i];
        // Busy before anything is launched from it; `publish` frees it with its `done` event.
        s.busy = true;
        s.buf.as_mut_slice()[..image.len()].copy_from_slice(image);
        Ok(s.buf.device_ptr())
    }

    /// With [`GpuElasticPool::set_settle_readers`]: waits for the device, so every ticket ended
    /// before this call is complete when the control plane collects pages. Otherwise nothing.
    fn settle_readers(&mut self) -> Result<()> {
        if self.settle {
            self.counters.host_syncs += 1;
            self.device().gpu().synchronize().map_err(cuda)?;
        }
        Ok(())
    }

    /// Registers a GPU reader in the pool's fence (see [`ReadTicket`]'s orderings).
    fn register_reader(&self) -> ReadTicket {
        let reader = DeviceReader::default();
        self.cpu.fence().enter_signal(Box::new(reader.clone()));
        ReadTicket::with_end(Box::new(DeviceEnd {
            gpu: self.cpu.data.dev.gpu().clone(),
            reader,
        }))
    }

    fn plan_from_device(&self, copies: &[KvCopy]) -> Vec<RowCopy> {
        copies
            .iter()
            .map(|c| RowCopy {
                session: self
                    .pinned()
                    .session_at(c.slot)
                    .expect("plan rows name live slots"),
                position: c.position,
                dst_row: c.dst_row,
            })
            .collect()
    }

    fn device_errors_clean(&mut self, layer: u32) -> Result<()> {
        let mut e = self.cpu.data.dev.errors().map_err(cuda)?;
        // Overflow is not bad input: the step was served as far as the hot cache allowed (the
        // unserved picks are in the stats); clear the word so it does not accumulate.
        let overflowed = e.overflow > 0;
        e.overflow = 0;
        if overflowed && e.is_clean() {
            self.cpu.data.dev.clear_errors().map_err(cuda)?;
        }
        if !e.is_clean() {
            self.cpu.data.dev.clear_errors().map_err(cuda)?;
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
        let gpu = self.cpu.data.dev.gpu().clone();
        let stream = gpu.stream();
        match self.gcfg.backend {
            CopyBackend::Dma => self.cpu.data.dev.dma_copy_async(stream, copies, layer, 1),
            CopyBackend::Gather => {
                let ctx = gpu.ctx();
                let plan = DeviceBuffer::from_host(ctx, copies)?;
                let count = DeviceBuffer::from_host(ctx, &[copies.len() as u32])?;
                gpu.synchronize()?;
                // SAFETY: one segment of `copies.len()` entries in live device buffers that outlive
                // the launch (we synchronize below); the plan's rows were checked fresh.
                unsafe {
                    self.cpu.data.dev.replay_async(
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
        self.check_poison()?;
        // The same checks, errors and output fill as the CPU reference.
        self.cpu.validate_resolve(input, opts, out)?;
        let rows = input.topk.len() / input.k;
        let reqs = input.sessions.len();
        let slots: Vec<i32> = input
            .sessions
            .iter()
            .map(|&s| self.slot_of(s).map(|b| b as i32))
            .collect::<Result<_>>()?;
        let gpu = self.cpu.data.dev.gpu().clone();
        let ctx = gpu.ctx();
        let hot = self.cpu.data.dev.dims().hot_rows as usize;
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
            self.cpu
                .data
                .dev
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
        self.check_poison()?;
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
                    .cpu
                    .data
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
        self.check_poison()?;
        self.cpu.validate_prefetch(session, candidates, layer)?;
        let slot = self.slot_of(session)? as i32;
        let gpu = self.cpu.data.dev.gpu().clone();
        let ctx = gpu.ctx();
        let hot = self.cpu.data.dev.dims().hot_rows as usize;
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
            self.cpu.data.dev.prefetch_async(
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
