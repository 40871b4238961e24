//! The GPU pool's transfers in place: its pinned store described for transfer agents, adopted
//! from engine memory (registered with CUDA once, never pinned twice), zero-copy imports whose
//! `commit` is bookkeeping only (the fills are enqueued on the copy stream as strided copies, no
//! history byte moves on the host) and pinned exports (see `crate::pool::transfer`).

use super::*;
use crate::data::{HostBytes, RegionDesc, StoreLayout, TeardownHook};
use crate::pool::{ImportInfo, Reserve, RowSpan, TransferCounters};

/// Engine-owned host memory for the GPU pool's pinned store (an `mmap`, a shared-memory segment
/// a transfer agent also registers): `len` bytes at `ptr`, and the value that owns them, dropped
/// after the pool unregistered the memory.
pub struct EngineHostMemory {
    ptr: *mut u8,
    len: usize,
    owner: Box<dyn Send>,
}

impl std::fmt::Debug for EngineHostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHostMemory")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl EngineHostMemory {
    /// `len` bytes at `ptr`, owned by `owner`.
    ///
    /// # Safety
    /// `ptr .. ptr + len` is readable and writable host memory (16-byte aligned) that stays
    /// mapped until `owner` is dropped, and nothing else writes it while the pool uses it except
    /// the writers the pool hands rows to (imports).
    pub unsafe fn new(ptr: *mut u8, len: usize, owner: Box<dyn Send>) -> Self {
        Self { ptr, len, owner }
    }
}

impl GpuElasticPool {
    /// As [`GpuElasticPool::with_arena`], with the pinned host store in engine-owned memory
    /// (`host`, at least `max_sessions × max_history × layers × row_bytes` bytes; its contents
    /// are kept). Memory the engine already pinned and mapped (`cudaHostRegister`,
    /// `cudaHostAlloc`) is used as it is; otherwise it is registered with CUDA here
    /// (`cuMemHostRegister`, `DEVICEMAP | PORTABLE`), once — never pinned twice. At drop the
    /// teardown hooks run first, then the memory is unregistered (if tierkit registered it), then
    /// `host`'s owner is dropped. [`GpuElasticPool::host_memory`] counts what tierkit pinned.
    ///
    /// # Errors
    /// As [`GpuElasticPool::with_arena`]; `Cuda(ForeignMemory)` for memory the driver cannot
    /// register (the owner is dropped) or that is too short.
    pub fn with_host_store(
        gpu: &Arc<Gpu>,
        geometry: Geometry,
        config: PoolConfig,
        gcfg: GpuPoolConfig,
        arena: Option<DeviceBuffer<u8>>,
        host: EngineHostMemory,
    ) -> Result<Self> {
        let ctx = gpu.ctx();
        // SAFETY: `EngineHostMemory::new`'s contract: live memory for the owner's life, which
        // the pool keeps until after the buffer is dropped.
        let pinned = unsafe { PinnedBuffer::borrowed(ctx, host.ptr, host.len, false) }
            // Not pinned and mapped yet: register it (once).
            // SAFETY: as above.
            .or_else(|_| unsafe { PinnedBuffer::borrowed(ctx, host.ptr, host.len, true) })
            .map_err(cuda)?;
        Self::with_buffers(
            gpu,
            geometry,
            config,
            gcfg,
            arena,
            Some((pinned, host.owner)),
        )
    }

    /// The pinned store's region and the layout of its rows (always present on the GPU pool).
    pub fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        self.cpu.region()
    }

    /// Host memory of the pinned store by tierkit's accounting.
    pub fn host_memory(&self) -> crate::HostMemory {
        self.cpu.host_memory()
    }

    /// Adds a teardown hook (a transfer agent's deregistration): it runs when the pool is
    /// dropped, before the pinned store is unregistered or freed.
    pub fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        self.cpu.on_teardown(hook)
    }

    /// [`ElasticPool::reserve`], then publishes (the reclaims made for a new import's fixed
    /// pages). A new import takes a free session slot (waiting for the device to pass a freed
    /// one only when no other is free). Extra errors: the GPU's capacity errors.
    pub fn reserve(&mut self, session: SessionId, rows: std::ops::Range<u32>) -> Result<Reserve> {
        self.check_poison()?;
        if !self.cpu.host().is_importing(session) {
            self.release_slots(false)?;
            if !self.pinned().has_free_slot() {
                self.release_slots(true)?;
            }
            self.settle_readers()?;
        }
        let r = self.cpu.reserve(session, rows);
        self.publish()?;
        r
    }

    /// [`ElasticPool::commit`], then publishes: bookkeeping only on the host. The session's
    /// slot tables, descriptor and fixed pages are patched on the step stream, its tail rows and
    /// borrowed pages filled from the pinned store on the copy stream (strided copies, one per
    /// run of pages and layer, with the default fill back-end), mapped after their fill as for an
    /// admission ([`MapAfterFill`]).
    pub fn commit(&mut self, session: SessionId) -> Result<Admission> {
        self.check_poison()?;
        let a = self.cpu.commit(session);
        self.publish()?;
        a
    }

    /// [`ElasticPool::abort`], then publishes.
    pub fn abort(&mut self, session: SessionId) -> Result<()> {
        self.check_poison()?;
        self.cpu.abort(session)?;
        self.publish()
    }

    /// See [`ElasticPool::set_import_timeout`].
    pub fn set_import_timeout(&mut self, steps: u32) -> Result<()> {
        self.cpu.set_import_timeout(steps)
    }

    /// Imports in flight.
    pub fn imports(&self) -> Vec<ImportInfo> {
        self.cpu.imports()
    }

    /// Running totals of imports and exports.
    pub fn transfer_counters(&self) -> TransferCounters {
        self.cpu.transfer_counters()
    }

    /// [`ElasticPool::export`]: first waits on the host for the last queued write-back (rows
    /// the device wrote must have landed before an agent reads them; no wait when it passed).
    pub fn export(&mut self, session: SessionId) -> Result<RowSpan> {
        self.check_poison()?;
        self.cpu.host().check_live(session)?;
        self.pinned().bytes(session)?;
        self.cpu.export(session)
    }

    /// [`ElasticPool::export_done`] (a finished session's slot is reused once the device passed
    /// its free and no export of it is open).
    pub fn export_done(&mut self, session: SessionId) -> Result<()> {
        self.check_poison()?;
        self.cpu.export_done(session)
    }
}
