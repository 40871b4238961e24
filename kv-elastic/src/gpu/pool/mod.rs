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
//! | tail rows of sessions admitted since the last publish (fixed pages): host store → arena rows | copy stream ([`MapAfterFill::Ordered`]); step stream ([`MapAfterFill::Deferred`]) | ordered: as the page fills; deferred: in step-stream order (the pages were free, so every fill into them passed) |
//! | page fills (borrowed pages just lent: loans, growth, admissions' history): host store → arena rows (copy engines: one `cuMemcpyBatchAsync` descriptor per run of consecutive positions on consecutive rows, one-layer stores; else the `tierkit_kv_replay` gather, a warp per row) | copy stream | waits for the last write-back event (history the device wrote), then runs beside the step in flight; records the *fill event* (deferred: entered in the reader fence) |
//! | write-backs: arena rows → host store (`tierkit_kv_write_back`; accepted drafts, rows the engine wrote, [`GpuElasticPool::append_written`]) | step stream | after the kernels that wrote the rows; records the write-back event |
//! | table patches (`tierkit_kv_fill_words`): slot resets, descriptors, fixed pages, page-table entries of pages mapped (after their fill) and unmapped (reclaim) | step stream | ordered: waits for this publish's fill event; deferred: a borrowed page's entry is patched by the first later publish that finds its fill event complete (`cuEventQuery`, no wait), the step stream never waits for the copy stream. Either way a page is mapped only once its rows hold its bytes; before every later resolve |
//! | tail / draft rows of live sessions: host store → arena rows | step stream | after the resolves queued before (which may read the rows they overwrite) |
//!
//! Deferred mapping ([`GpuElasticPool::set_map_after_fill`]). Until its entry is patched a lent
//! page's positions resolve as misses from the pinned store (exact bytes), and the session's
//! descriptor keeps the hot-cache path (`full = 0`) while any of its entries waits. Every
//! interleaving drops or delays what it must: an entry is dropped when its page is unmapped
//! (reclaim) or its slot freed (finish) before it was applied, so a stale page is never mapped;
//! a page reclaimed or handed back while its fill may still run stays pending until the fill
//! event (a fence reader) passed, so no later owner's fill or fixed-page write races it; a freed
//! slot's pinned bytes (which the fill reads) are reused only after the copy stream passed the
//! freeing publish; a staging buffer the gather fills read is reused only after their event.
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

mod deferred;
mod host_calls;
mod patches;
#[cfg(test)]
pub(super) mod patches_probe;
mod publish;
mod resolve;
mod transfer;

pub use transfer::EngineHostMemory;

use deferred::DeferredMaps;

use std::sync::Arc;

use std::sync::OnceLock;

use bytemuck::Pod;
use cuda_kernels::cudarc_driver::CudaStream;
#[cfg(feature = "test-hooks")]
use cuda_kernels::ResolveEngine;
use cuda_kernels::{
    CopyBackend, KvCopy, KvFill, KvResolveArgs, KvResolveOptions, KvSlotDesc, KvStats,
    KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED, KV_STATS,
};
use cuda_kernels::{CudaError, DeviceBuffer, EventSignal, Gpu, PinnedBuffer};
use hashbrown::HashSet;
use tier_core::CompletionSignal;

use super::data::{DraftReads, FillRun, GpuData, PinnedBytes};
use super::GpuArena;
use crate::data::SessionId;
use crate::error::{KvError, Result};
use crate::layout::Geometry;
use crate::pool::{Admission, AdmitOptions, ElasticPool, PoolConfig, StepMaintenance, StepOptions};
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
    /// Of `rows_filled`, rows the copy engines filled (DMA runs, [`GpuElasticPool::set_fill_backend`]).
    pub rows_filled_dma: u64,
    /// DMA descriptors those fills took (one per run of consecutive positions on consecutive rows).
    pub fill_descriptors: u64,
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
    /// Borrowed pages whose mapping was deferred until their fill completed
    /// ([`MapAfterFill::Deferred`]).
    pub maps_deferred: u64,
    /// Of those, pages mapped by a later publish once their fill event had passed.
    pub maps_applied: u64,
    /// Of those, deferred mappings dropped unapplied (the page was reclaimed or its session
    /// finished before its fill completed).
    pub maps_dropped: u64,
}

/// When a borrowed page (loan, growth, an admission's history) becomes visible to resolves:
/// see [`GpuElasticPool::set_map_after_fill`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapAfterFill {
    /// The step stream waits for each publish's page fills before its table patches: every step
    /// queued after an admission or growth waits for the copy, and the pool's decisions equal the
    /// CPU reference's call for call (`tests/gpu_exactness.rs`). The default.
    #[default]
    Ordered,
    /// Borrowed pages are mapped by a later publish (or `between_steps`) that finds their fill
    /// event complete (`cuEventQuery`, no wait); until then their positions resolve as misses
    /// from the pinned host store (exact bytes, slower), so steps never wait for the copy.
    Deferred,
}

/// A mapped pinned staging buffer and the event after its last reader.
#[derive(Debug)]
struct Staging {
    buf: PinnedBuffer<u8>,
    done: EventSignal,
    /// With deferred mapping: the copy-stream event after the page fills that read this buffer
    /// (the step stream no longer waits for them, so `done` does not cover them).
    copy_done: Option<EventSignal>,
    /// Taken by a publish that has not recorded `done` yet (stays set if that publish fails:
    /// queued kernels may read the buffer, and the pool is poisoned anyway).
    busy: bool,
}

/// The lists of one publish as laid out in one staging buffer: each at a 16-byte aligned offset,
/// copied once, from its own slice straight into the pinned buffer ([`Image::write_into`]; no
/// image is assembled on the host first), a gather fill's rows written there from their runs
/// ([`Image::push_runs`]: no host list of a whole history's rows).
#[derive(Default)]
struct Image<'a> {
    pieces: Vec<(usize, Piece<'a>)>,
    len: usize,
}

/// One list of an [`Image`].
enum Piece<'a> {
    Bytes(&'a [u8]),
    /// The rows of these runs, one [`KvCopy`] each ([`FillRun::copies`]).
    Runs(&'a [FillRun]),
}

impl<'a> Image<'a> {
    /// Places `items` after the lists placed so far; returns their offset.
    fn push<T: Pod>(&mut self, items: &'a [T]) -> usize {
        let bytes: &[u8] = bytemuck::cast_slice(items);
        self.place(Piece::Bytes(bytes), bytes.len())
    }

    /// Places the rows of `runs` (one [`KvCopy`] per row, in run order) as [`Image::push`] would
    /// place them expanded; returns their offset.
    fn push_runs(&mut self, runs: &'a [FillRun]) -> usize {
        let rows: usize = runs.iter().map(|r| r.rows as usize).sum();
        self.place(Piece::Runs(runs), rows * std::mem::size_of::<KvCopy>())
    }

    fn place(&mut self, piece: Piece<'a>, bytes: usize) -> usize {
        let at = self.len.next_multiple_of(16);
        self.pieces.push((at, piece));
        self.len = at + bytes;
        at
    }

    /// Bytes from the first list's start to the last one's end.
    fn len(&self) -> usize {
        self.len
    }

    /// Copies every list to its offset in `dst` (at least [`Image::len`] bytes; the padding
    /// between lists is left as it was: no kernel reads it).
    fn write_into(&self, dst: &mut [u8]) {
        const ROW: usize = std::mem::size_of::<KvCopy>();
        for (at, piece) in &self.pieces {
            match piece {
                Piece::Bytes(bytes) => dst[*at..*at + bytes.len()].copy_from_slice(bytes),
                Piece::Runs(runs) => {
                    let mut o = *at;
                    for c in runs.iter().flat_map(|r| r.copies()) {
                        dst[o..o + ROW].copy_from_slice(bytemuck::bytes_of(&c));
                        o += ROW;
                    }
                }
            }
        }
    }
}

/// Rows per segment of the copy lists handed to the replay kernel (one block per segment).
const SEGMENT: u32 = 64;

/// The replay segments of a copy list of `n` rows (the list itself is the plan, as it is:
/// `segments × SEGMENT` rows, the last segment short): each segment's row count.
fn segment_counts(n: usize) -> Vec<u32> {
    let n = n as u32;
    (0..n.div_ceil(SEGMENT))
        .map(|b| (n - b * SEGMENT).min(SEGMENT))
        .collect()
}

/// Copies the staged replay segments at `base + at.0` (plan) / `base + at.1` (counts) from the
/// pinned store into every layer of their rows, on `stream`.
///
/// # Safety
/// As [`GpuArena::fill_rows_async`]: the staging stays readable until `stream` passes the launch.
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
        dev.fill_rows_async(
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
    /// Freed session slots and the events (step stream; copy stream with deferred mapping, whose
    /// page fills may still read the slot's pinned bytes) after which nothing queued touches them.
    quarantine: Vec<(u32, EventSignal, Option<EventSignal>)>,
    /// When borrowed pages are mapped ([`MapAfterFill`]).
    map_after_fill: MapAfterFill,
    /// Page-table entries of borrowed pages whose fill may still run (deferred mapping).
    deferred: DeferredMaps<EventSignal>,
    /// Draft bytes in the pinned store that queued step copies may still read (see
    /// [`DraftReads`]): a host write over them waits first.
    draft_reads: DraftReads<EventSignal>,
    /// The event recorded at the end of the last publish that queued work.
    last_publish: Option<EventSignal>,
    settle: bool,
    /// The resolve kernel (`ResolveEngine::Auto` unless a test set another).
    #[cfg(feature = "test-hooks")]
    engine: ResolveEngine,
    /// How page fills run on the copy stream ([`CopyBackend::Dma`] unless set).
    fill_backend: CopyBackend,
    /// Set by a failed publish: every later call fails with [`KvError::Poisoned`].
    poisoned: Option<String>,
    fail_next_publish: bool,
    miss_tokens: u64,
    counters: GpuFlushCounters,
    /// The engine's host memory under the pinned store (adopted), dropped last: after the
    /// teardown hooks (in `cpu`'s host store) and the unregistration (in its `GpuArena`).
    _host_owner: Option<Box<dyn Send>>,
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
        Self::with_arena(gpu, geometry, config, gcfg, None)
    }

    /// As [`GpuElasticPool::new`], with the arena in caller-owned device memory where `arena` is
    /// given (at least `layers × arena_rows × row_bytes` bytes from its start, built with
    /// [`DeviceBuffer::borrowed`] in `gpu`'s context; zeroed here, as an owned arena is). The
    /// pool's rows live there, so an engine's attention kernel reads its own tensor.
    ///
    /// # Errors
    /// As [`GpuElasticPool::new`]; [`KvError::Cuda`] with `CudaError::ForeignMemory` for an
    /// arena that is too short or of another device.
    pub fn with_arena(
        gpu: &Arc<Gpu>,
        geometry: Geometry,
        config: PoolConfig,
        gcfg: GpuPoolConfig,
        arena: Option<DeviceBuffer<u8>>,
    ) -> Result<Self> {
        Self::with_buffers(gpu, geometry, config, gcfg, arena, None)
    }

    /// The pool on its buffers: the arena as [`GpuElasticPool::with_arena`], and the pinned host
    /// store in `host` (with the owner to drop after it) where given.
    pub(super) fn with_buffers(
        gpu: &Arc<Gpu>,
        geometry: Geometry,
        config: PoolConfig,
        gcfg: GpuPoolConfig,
        arena: Option<DeviceBuffer<u8>>,
        host: Option<(PinnedBuffer<u8>, Box<dyn Send>)>,
    ) -> Result<Self> {
        // The geometry's one validation, then its one conversion into the kernels' terms.
        geometry.validate()?;
        let dims = gcfg.kv_dims(&geometry)?;
        let (host, host_owner) = match host {
            Some((h, owner)) => (Some(h), Some(owner)),
            None => (None, None),
        };
        let dev =
            GpuArena::from_checked(gpu, dims, geometry.layer_groups, arena, host).map_err(cuda)?;
        let cpu = ElasticPool::with_data(geometry, config, GpuData::new(dev))?;
        let mut pool = Self {
            cpu,
            gcfg,
            copy: gpu.new_stream().map_err(cuda)?,
            staging: Vec::new(),
            last_write_back: None,
            quarantine: Vec::new(),
            map_after_fill: MapAfterFill::Ordered,
            deferred: DeferredMaps::default(),
            draft_reads: DraftReads::default(),
            last_publish: None,
            settle: false,
            #[cfg(feature = "test-hooks")]
            engine: ResolveEngine::default(),
            fill_backend: CopyBackend::Dma,
            poisoned: None,
            fail_next_publish: false,
            miss_tokens: 0,
            counters: GpuFlushCounters::default(),
            _host_owner: host_owner,
        };
        // One staging buffer sized for an admission of a whole history (a commit of an import):
        // that publish allocates no pinned memory on its host call.
        let first = pool.new_staging(pool.admission_staging_bytes())?;
        pool.staging.push(first);
        Ok(pool)
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

    /// The resolve kernel [`Resolver::resolve`] launches (a test hook, feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    pub fn resolve_engine(&self) -> ResolveEngine {
        self.engine
    }

    /// Switches the resolve kernel (a test hook, feature `test-hooks`: every kernel gives
    /// identical results; the tests run each).
    #[cfg(feature = "test-hooks")]
    pub fn set_resolve_engine(&mut self, engine: ResolveEngine) {
        self.engine = engine;
    }

    /// How page fills (admissions, growth) copy history into the arena on the copy stream:
    /// [`CopyBackend::Dma`] (default) coalesces the rows into runs of consecutive positions on
    /// consecutive arena rows and copies each with the copy engines (`cuMemcpyBatchAsync`, one
    /// descriptor per run: near the H2D ceiling for whole pages); it applies where the host store
    /// holds a run's rows back to back (one layer), and the gather kernel runs otherwise.
    /// [`CopyBackend::Gather`]: always the gather kernel (a warp per row, zero-copy reads).
    pub fn set_fill_backend(&mut self, backend: CopyBackend) {
        self.fill_backend = backend;
    }

    /// The page-fill back-end (see [`GpuElasticPool::set_fill_backend`]).
    pub fn fill_backend(&self) -> CopyBackend {
        self.fill_backend
    }

    /// When borrowed pages (loans, growth, an admission's history pages) are mapped after their
    /// fill on the copy stream. [`MapAfterFill::Ordered`] (default): the step stream waits for
    /// the fills of each publish before its table patches (steps queued after an admission wait
    /// for the whole copy; decisions equal the CPU reference's). [`MapAfterFill::Deferred`]
    /// (for engines): the step stream waits only for fills into fixed pages (new sessions' tails,
    /// small); each later publish (every control operation, `between_steps`, or
    /// [`GpuElasticPool::publish`] itself) maps the pages whose fill event has passed, polled
    /// without blocking. Until then their positions resolve as misses from the pinned host store
    /// (exact bytes; a session with pages still unmapped takes the hot-cache path, not the direct
    /// one). A page reclaimed, or whose session finished, before its mapping drops the mapping.
    /// Switching back to `Ordered` keeps mapping the pages still deferred as their fills pass.
    pub fn set_map_after_fill(&mut self, mode: MapAfterFill) {
        self.map_after_fill = mode;
    }

    /// See [`GpuElasticPool::set_map_after_fill`].
    pub fn map_after_fill(&self) -> MapAfterFill {
        self.map_after_fill
    }

    /// Borrowed pages lent but not yet mapped on the device (their fill had not passed at the
    /// last publish; always 0 with [`MapAfterFill::Ordered`] from the start).
    pub fn deferred_maps(&self) -> usize {
        self.deferred.len()
    }

    /// With `true`, every control operation that frees pages (admit, reclaim, between steps)
    /// first waits for the device, so every ticket ended before it is complete and the pool
    /// frees exactly the pages the CPU reference frees for the same calls (tests comparing the
    /// two). Default `false`: no host wait; pages free when the GPU passed their readers. A test
    /// hook (feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
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
            if let Some((_, ev, copy)) = self.quarantine.first() {
                for e in std::iter::once(ev).chain(copy) {
                    e.event()
                        .synchronize()
                        .map_err(|e| cuda(CudaError::driver("cuEventSynchronize", e)))?;
                }
                self.counters.host_syncs += 1;
            }
        }
        let mut i = 0;
        while i < self.quarantine.len() {
            let (_, ev, copy) = &self.quarantine[i];
            if ev.is_complete() && copy.as_ref().is_none_or(|c| c.is_complete()) {
                let (slot, _, _) = self.quarantine.swap_remove(i);
                self.cpu.data.pinned_mut().unblock(slot);
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}
