//! [`ExpertStore`]: the GPU memory of an expert tier, with no residency state.
//!
//! All experts of all layers live in mapped pinned host memory (the source of truth, readable in
//! place by kernels over PCIe); [`Geometry::slots_per_layer`] HBM slots per layer (the hot ones
//! and a spare) sit in one device allocation; a device-resident indirection table `(layer,
//! expert) → u64 address` sits at a fixed address (CUDA-graph safe). Which expert occupies which
//! slot, and when a table entry changes, is decided by the caller ([`super::ExpertBankGpu`]);
//! this type only allocates, addresses and copies, on `cuda-kernels`' memory types.

use std::sync::Arc;

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{
    copy_dtoh_sync, copy_htod_async, copy_htod_sync, CudaError, DeviceBuffer, Gpu, PinnedBuffer,
};

use crate::error::{ExpertError, Result};
use crate::geometry::Geometry;

/// Largest byte total a store may hold in one tier (`isize::MAX`): the pinned host experts are
/// viewed as one Rust slice, and no Rust allocation or slice may exceed it.
const MAX_TIER_BYTES: u64 = isize::MAX as u64;

/// Pinned host experts, HBM slots and the device indirection table of one expert tier.
#[derive(Debug)]
pub struct ExpertStore {
    gpu: Arc<Gpu>,
    geo: Geometry,
    host: PinnedBuffer<u8>,
    hbm: DeviceBuffer<u8>,
    table: DeviceBuffer<u64>,
}

impl ExpertStore {
    /// Checks that `geo` can back a GPU store, without a device (pure arithmetic;
    /// [`ExpertStore::new`] calls it first): the tier's own rules ([`Geometry::validate`]), then
    /// the GPU's. The one place these are stated.
    ///
    /// [`Geometry`]'s bounds keep every index the store and the kernels use in `u32`: table cells
    /// `layers × experts_per_layer ≤ MAX_CELLS` (2^24), HBM slots `layers × slots_per_layer ≤
    /// MAX_CELLS + MAX_LAYERS`.
    ///
    /// # Errors
    /// The errors of [`Geometry::validate`]; [`ExpertError::InvalidGeometry`] if `expert_bytes` is
    /// not a multiple of 16 (the slots and the readers' 16-byte loads); [`ExpertError::Cuda`] with
    /// `CudaError::OutOfRange` if the host bytes ([`Geometry::bank_bytes`]) or the HBM bytes
    /// ([`Geometry::hbm_bytes`]) exceed `isize::MAX` (`limit` is then the largest
    /// `expert_bytes + 1` that fits).
    pub(crate) fn check_geometry(geo: &Geometry) -> Result<()> {
        geo.validate()?;
        if !geo.expert_bytes.is_multiple_of(16) {
            return Err(ExpertError::InvalidGeometry(format!(
                "expert_bytes {} is not a multiple of 16 (GPU bank; the next multiple is {})",
                geo.expert_bytes,
                geo.expert_bytes
                    .div_ceil(16)
                    .checked_mul(16)
                    .unwrap_or(u64::MAX - 15)
            )));
        }
        let units = (geo.cells() as u64).max(geo.layers as u64 * geo.slots_per_layer() as u64);
        let fits = |b: Option<u64>| b.is_some_and(|b| b <= MAX_TIER_BYTES);
        if !fits(geo.bank_bytes()) || !fits(geo.hbm_bytes()) {
            return Err(ExpertError::Cuda(CudaError::OutOfRange {
                what: "expert_bytes (host or HBM bytes of the store would exceed isize::MAX)",
                value: geo.expert_bytes,
                limit: MAX_TIER_BYTES / units + 1,
            }));
        }
        Ok(())
    }

    /// Allocates the store: host experts zero-filled, HBM slots zero-filled, and the table
    /// pointing every `(layer, expert)` at its pinned host copy (every expert read in place).
    ///
    /// # Errors
    /// The errors of `ExpertStore::check_geometry` (the tier's geometry rules, then the GPU's:
    /// an `expert_bytes` multiple of 16, byte totals within `isize::MAX`), before anything is
    /// allocated; [`ExpertError::Cuda`] with `CudaError::Driver` (`CUDA_ERROR_OUT_OF_MEMORY`)
    /// when HBM or pinnable host memory is short.
    pub fn new(gpu: &Arc<Gpu>, geo: Geometry) -> Result<Self> {
        Self::with_memory(gpu, geo, None, None)
    }

    /// As [`ExpertStore::new`], over caller-owned memory where given: `host` holds the experts
    /// (`[layers][experts][expert_bytes]` u8 from its start, at least `host_bytes` bytes; its
    /// bytes are kept, not zeroed: the caller's weights are read in place) and `hbm` the slots (at
    /// least [`Geometry::hbm_bytes`] bytes); `None` allocates that part. Build them with
    /// [`PinnedBuffer::borrowed`] / [`DeviceBuffer::borrowed`] in `gpu`'s context.
    ///
    /// # Errors
    /// As [`ExpertStore::new`]; [`ExpertError::Cuda`] with `CudaError::ForeignMemory` for a buffer
    /// shorter than the geometry needs or of another device's context.
    pub fn with_memory(
        gpu: &Arc<Gpu>,
        geo: Geometry,
        host: Option<PinnedBuffer<u8>>,
        hbm: Option<DeviceBuffer<u8>>,
    ) -> Result<Self> {
        Self::check_geometry(&geo)?;
        // Checked above: both totals fit isize::MAX.
        let (host_bytes, hbm_bytes) = (
            geo.bank_bytes().unwrap_or(u64::MAX),
            geo.hbm_bytes().unwrap_or(u64::MAX),
        );
        let ctx = gpu.ctx();
        let check = |what: &'static str, got: usize, need: u64, same_ctx: bool| {
            if !same_ctx {
                return Err(CudaError::ForeignMemory {
                    what,
                    reason: "belongs to another device's context".into(),
                });
            }
            if (got as u64) < need {
                return Err(CudaError::ForeignMemory {
                    what,
                    reason: format!("{got} bytes, the geometry needs {need}"),
                });
            }
            Ok(())
        };
        let host = match host {
            Some(h) => {
                check(
                    "expert host store",
                    h.num_bytes(),
                    host_bytes,
                    h.ctx() == ctx,
                )?;
                h
            }
            None => PinnedBuffer::<u8>::zeroed(ctx, host_bytes as usize)?,
        };
        let hbm = match hbm {
            Some(d) => {
                check("expert HBM slots", d.num_bytes(), hbm_bytes, d.ctx() == ctx)?;
                d
            }
            None => DeviceBuffer::<u8>::zeroed(ctx, hbm_bytes as usize)?,
        };
        let cells = geo.cells();
        let table = DeviceBuffer::<u64>::zeroed(ctx, cells)?;
        let mut store = ExpertStore {
            gpu: gpu.clone(),
            geo,
            host,
            hbm,
            table,
        };
        let cold: Vec<u64> = (0..cells as u32)
            .map(|c| store.host.device_ptr() + c as u64 * geo.expert_bytes)
            .collect();
        store.upload_table(&cold)?;
        Ok(store)
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The indirection table: u64 `[layers][experts]` device addresses, at a fixed device
    /// address for the store's life. Change entries with [`cuda_kernels::TableUpdater::launch`] on
    /// the stream that reads them, or `ExpertStore::upload_table` while no kernel reads them.
    pub fn table(&self) -> &DeviceBuffer<u64> {
        &self.table
    }

    /// Replaces the whole table synchronously (`table`: `[layers * experts]` device addresses);
    /// returns once the bytes are in place (it synchronises the context). No kernel may read the
    /// table meanwhile.
    ///
    /// # Errors
    /// [`ExpertError::Cuda`]: `CudaError::Shape` for a wrong length (nothing written),
    /// `CudaError::Driver`.
    pub(crate) fn upload_table(&mut self, table: &[u64]) -> Result<()> {
        Ok(self.table.upload(table)?)
    }

    /// Device address of the indirection table (what engine kernels take).
    pub fn table_ptr(&self) -> u64 {
        self.table.device_ptr()
    }

    /// Errors unless `layer < layers` and `expert < experts_per_layer`.
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] with `CudaError::OutOfRange` naming the field.
    pub(crate) fn check(&self, layer: u32, expert: u32) -> Result<()> {
        if layer >= self.geo.layers {
            return Err(CudaError::OutOfRange {
                what: "layer",
                value: layer as u64,
                limit: self.geo.layers as u64,
            }
            .into());
        }
        if expert >= self.geo.experts_per_layer {
            return Err(CudaError::OutOfRange {
                what: "expert",
                value: expert as u64,
                limit: self.geo.experts_per_layer as u64,
            }
            .into());
        }
        Ok(())
    }

    /// Flat table index `layer * experts + expert` of a checked `(layer, expert)`: below
    /// `layers × experts_per_layer`, which [`Geometry`]'s bounds keep below 2^24, so the `u32`
    /// arithmetic cannot overflow. A test hook (feature `test-hooks`: the store's GPU tests
    /// check table entries by cell); the bank computes cells itself.
    #[cfg(feature = "test-hooks")]
    pub fn cell(&self, layer: u32, expert: u32) -> u32 {
        self.cell_of(layer, expert)
    }

    /// `ExpertStore::cell`'s arithmetic, for the bank and the store.
    pub(crate) fn cell_of(&self, layer: u32, expert: u32) -> u32 {
        layer * self.geo.experts_per_layer + expert
    }

    /// Byte offset of a checked `(layer, expert)` in the host buffer (below `host_bytes`, which
    /// `ExpertStore::check_geometry` bounds to `isize::MAX`).
    fn host_offset(&self, layer: u32, expert: u32) -> usize {
        self.cell_of(layer, expert) as usize * self.geo.expert_bytes as usize
    }

    /// Device address of HBM slot `slot` of `layer` (`slot < slots_per_layer`, the spare
    /// included: [`Geometry::slots_per_layer`]), or 0 (null) if `layer >= layers` or `slot` is
    /// past the layer's slots.
    pub fn slot_ptr(&self, layer: u32, slot: u32) -> u64 {
        if layer >= self.geo.layers || slot >= self.geo.slots_per_layer() {
            return 0;
        }
        // In range: the index is below layers × slots_per_layer, which Geometry bounds to u32.
        let i = (layer * self.geo.slots_per_layer() + slot) as u64;
        self.hbm.device_ptr() + i * self.geo.expert_bytes
    }

    /// Mapped device address of the pinned host copy of `(layer, expert)`, or 0 (null) if
    /// `layer >= layers` or `expert >= experts`.
    pub fn host_device_ptr(&self, layer: u32, expert: u32) -> u64 {
        if self.check(layer, expert).is_err() {
            return 0;
        }
        self.host.device_ptr() + self.host_offset(layer, expert) as u64
    }

    /// The host copy of an expert (`expert_bytes` bytes).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] (`OutOfRange`) for a bad `layer` or `expert`.
    pub fn host_expert(&self, layer: u32, expert: u32) -> Result<&[u8]> {
        self.check(layer, expert)?;
        let o = self.host_offset(layer, expert);
        Ok(&self.host.as_slice()[o..o + self.geo.expert_bytes as usize])
    }

    /// Mutable host copy of an expert (`expert_bytes` bytes). Do not write an expert while a
    /// copy from it is in flight (`&mut self` rules out `ExpertStore::copy_to_slot_async`
    /// callers holding `&self`, not copies they enqueued earlier).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] (`OutOfRange`) for a bad `layer` or `expert`.
    pub fn host_expert_mut(&mut self, layer: u32, expert: u32) -> Result<&mut [u8]> {
        self.check(layer, expert)?;
        let o = self.host_offset(layer, expert);
        let n = self.geo.expert_bytes as usize;
        Ok(&mut self.host.as_mut_slice()[o..o + n])
    }

    /// Fills every host expert with `f(layer, expert, bytes)`, on up to `threads` threads (at
    /// least one). Same caveat as [`ExpertStore::host_expert_mut`].
    pub fn fill_host<F>(&mut self, threads: usize, f: F)
    where
        F: Fn(u32, u32, &mut [u8]) + Sync,
    {
        let n = self.geo.expert_bytes as usize;
        let experts = self.geo.experts_per_layer;
        // a caller's buffer may be longer than the geometry: only the experts' bytes (checked to
        // fit isize::MAX at construction)
        let used = self.geo.bank_bytes().unwrap_or(0) as usize;
        let chunks: Vec<(usize, &mut [u8])> = self.host.as_mut_slice()[..used]
            .chunks_mut(n)
            .enumerate()
            .collect();
        let threads = threads.max(1);
        let per = chunks.len().div_ceil(threads);
        let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
        let mut it = chunks.into_iter();
        loop {
            let g: Vec<_> = it.by_ref().take(per.max(1)).collect();
            if g.is_empty() {
                break;
            }
            groups.push(g);
        }
        let f = &f;
        std::thread::scope(|s| {
            for g in groups {
                s.spawn(move || {
                    for (i, buf) in g {
                        f(i as u32 / experts, i as u32 % experts, buf);
                    }
                });
            }
        });
    }

    fn check_slot(&self, layer: u32, slot: u32) -> Result<()> {
        if self.slot_ptr(layer, slot) == 0 {
            return Err(CudaError::OutOfRange {
                what: "HBM slot (layer, slot)",
                value: layer.max(slot) as u64,
                limit: self.geo.layers.min(self.geo.slots_per_layer()) as u64,
            }
            .into());
        }
        Ok(())
    }

    /// Synchronous copy of the host copy of `(layer, expert)` into HBM slot `slot` of `layer`
    /// (`cuMemcpyHtoD`; it may still be landing on return: synchronise the context, e.g. with
    /// [`DeviceBuffer::upload`] or [`Gpu::synchronize`], before kernels read the slot). No
    /// kernel may read the slot meanwhile: call it with the device idle.
    ///
    /// # Errors
    /// [`ExpertError::Cuda`]: `OutOfRange` for a bad layer, expert or slot, `Driver`.
    ///
    /// A test hook (feature `test-hooks`): writing a slot under a bank bypasses its placement;
    /// only the store's own GPU tests drive a store directly (the bank uses the crate's half).
    #[cfg(feature = "test-hooks")]
    pub fn copy_to_slot_sync(&self, layer: u32, expert: u32, slot: u32) -> Result<()> {
        self.copy_slot_sync(layer, expert, slot)
    }

    /// `ExpertStore::copy_to_slot_sync`'s body (the bank's boot fill).
    pub(crate) fn copy_slot_sync(&self, layer: u32, expert: u32, slot: u32) -> Result<()> {
        self.check_slot(layer, slot)?;
        let src = self.host_expert(layer, expert)?;
        // SAFETY: the slot lies inside our HBM allocation of the GPU's context (checked above)
        // and holds `expert_bytes` bytes, as many as `src`; no kernel touches it (caller's
        // contract: the device is idle).
        Ok(unsafe { copy_htod_sync(self.gpu.ctx(), self.slot_ptr(layer, slot), src) }?)
    }

    /// Enqueues the copy of the host copy of `(layer, expert)` into HBM slot `slot` of `layer`
    /// on `stream` (`cuMemcpyHtoDAsync` from pinned memory: the full H2D rate, host not
    /// blocked). Order it after the slot's last readers (e.g. make `stream` wait on their
    /// event) and before its next readers (record an event after it).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`]: `OutOfRange` for a bad layer, expert or slot (nothing enqueued),
    /// `Driver`.
    ///
    /// # Safety
    /// Until the copy completes: the host expert must not be written (no
    /// [`ExpertStore::host_expert_mut`] / [`ExpertStore::fill_host`] on it), and the store must
    /// not be dropped before `stream` is synchronised.
    ///
    /// A test hook (feature `test-hooks`), as `ExpertStore::copy_to_slot_sync`.
    #[cfg(feature = "test-hooks")]
    pub unsafe fn copy_to_slot_async(
        &self,
        layer: u32,
        expert: u32,
        slot: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        // SAFETY: the caller's contract is this function's, passed on unchanged.
        unsafe { self.copy_slot_async(layer, expert, slot, stream) }
    }

    /// `ExpertStore::copy_to_slot_async`'s body (the bank's swap copy).
    ///
    /// # Safety
    /// As `ExpertStore::copy_to_slot_async`.
    pub(crate) unsafe fn copy_slot_async(
        &self,
        layer: u32,
        expert: u32,
        slot: u32,
        stream: &CudaStream,
    ) -> Result<()> {
        self.check_slot(layer, slot)?;
        let src = self.host_expert(layer, expert)?;
        // SAFETY: the source is `expert_bytes` bytes of our pinned allocation, left unwritten and
        // alive until the copy completes (caller's contract); the destination is a slot of our
        // HBM allocation of the same size (checked above).
        unsafe {
            copy_htod_async(
                self.slot_ptr(layer, slot),
                src.as_ptr(),
                self.geo.expert_bytes as usize,
                stream,
            )
        }?;
        Ok(())
    }

    /// The bytes of HBM slot `slot` of `layer`, after synchronising the context (waits for all
    /// work on the device).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`]: `OutOfRange` for a bad layer or slot, `Driver`.
    ///
    /// A test hook (feature `test-hooks`: the store's GPU tests read slots back);
    /// [`ExpertStore::mismatches`] is the diagnostic for engines.
    #[cfg(feature = "test-hooks")]
    pub fn download_slot(&self, layer: u32, slot: u32) -> Result<Vec<u8>> {
        self.slot_bytes(layer, slot)
    }

    /// `ExpertStore::download_slot`'s body (the mismatch check).
    pub(crate) fn slot_bytes(&self, layer: u32, slot: u32) -> Result<Vec<u8>> {
        self.check_slot(layer, slot)?;
        self.gpu.synchronize()?;
        let mut buf = vec![0u8; self.geo.expert_bytes as usize];
        // SAFETY: the slot lies inside our HBM allocation of the GPU's context (checked above)
        // and holds `buf.len()` bytes; the device is idle (synchronised above).
        unsafe { copy_dtoh_sync(self.gpu.ctx(), &mut buf, self.slot_ptr(layer, slot)) }?;
        Ok(buf)
    }

    /// Checks the device state against a placement, after synchronising the device: every table
    /// entry must equal `entry(layer, expert)` and every HBM slot that `expert_in_slot(layer,
    /// slot)` names an expert for must hold exactly that expert's host bytes. Returns the number
    /// of mismatching entries plus mismatching slots (0 = consistent). A diagnostic: it downloads
    /// the table and the named slots (tests, benches, and the reference examples' final check).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] for a failed download; the errors of [`ExpertStore::host_expert`]
    /// for an expert `expert_in_slot` names out of range.
    pub fn mismatches(
        &self,
        entry: impl Fn(u32, u32) -> u64,
        expert_in_slot: impl Fn(u32, u32) -> Option<u32>,
    ) -> Result<u64> {
        let geo = self.geo;
        let table = self.table.download()?;
        let mut bad = 0u64;
        for l in 0..geo.layers {
            for e in 0..geo.experts_per_layer {
                if table[self.cell_of(l, e) as usize] != entry(l, e) {
                    bad += 1;
                }
            }
        }
        for l in 0..geo.layers {
            for s in 0..geo.slots_per_layer() {
                let Some(e) = expert_in_slot(l, s) else {
                    continue;
                };
                if self.slot_bytes(l, s)? != self.host_expert(l, e)? {
                    bad += 1;
                }
            }
        }
        Ok(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(layers: u32, experts: u32, hot_per_layer: u32, expert_bytes: u64) -> Geometry {
        Geometry {
            layers,
            experts_per_layer: experts,
            hot_per_layer,
            expert_bytes,
        }
    }

    fn check(g: Geometry) -> Result<()> {
        ExpertStore::check_geometry(&g)
    }

    /// The store's byte limit: `(value, limit)` of the `OutOfRange` it reports.
    fn byte_limit(g: Geometry) -> (u64, u64) {
        match check(g) {
            Err(ExpertError::Cuda(CudaError::OutOfRange { what, value, limit })) => {
                assert!(what.starts_with("expert_bytes"), "{what}");
                (value, limit)
            }
            other => panic!("{g:?}: expected the store's byte limit, got {other:?}"),
        }
    }

    #[test]
    fn geometry_validation() {
        // hot > experts, a size not a multiple of 16: refused; the sizes of a good one.
        assert!(matches!(
            check(geo(2, 4, 5, 16)),
            Err(ExpertError::HotExceedsExperts { hot: 5, experts: 4 })
        ));
        assert!(matches!(
            check(geo(2, 4, 2, 12)),
            Err(ExpertError::InvalidGeometry(m)) if m.contains("multiple of 16")
        ));
        let g = geo(2, 4, 2, 32);
        check(g).unwrap();
        assert_eq!(g.hbm_bytes(), Some(2 * 3 * 32));
        assert_eq!(g.bank_bytes(), Some(2 * 4 * 32));
    }

    /// Pure arithmetic, no GPU: every product the store indexes or allocates with is checked
    /// (the tier's bounds first, then the store's byte limit).
    #[test]
    fn geometry_validation_rejects_overflowing_products() {
        // The breaker's case: 65536 × 65536 cells wrapped the u32 table index to 0, and both
        // byte totals wrapped to 0. The tier's bounds refuse it (layers and cells above theirs).
        assert!(matches!(
            check(geo(65536, 65536, 65535, 1 << 48)),
            Err(ExpertError::InvalidGeometry(m)) if m.contains("exceed the limit")
        ));
        // Cells that fit u32 (65537 × 65535 = u32::MAX) and HBM slots that would not are far
        // past the tier's layer and cell bounds.
        assert!(matches!(
            check(geo(65537, 65535, 65535, 16)),
            Err(ExpertError::InvalidGeometry(_))
        ));
        assert!(matches!(
            check(geo(65537, 65535, 65534, 16)),
            Err(ExpertError::InvalidGeometry(_))
        ));
        // hot_per_layer + 1 spare slot would wrap: hot above the expert bound.
        let g = geo(1, u32::MAX, u32::MAX, 16);
        assert!(matches!(check(g), Err(ExpertError::InvalidGeometry(_))));
        assert_eq!(g.slots_per_layer(), u32::MAX, "saturates, never wraps to 0");
        // Byte totals: 16 cells × 2^62 bytes overflows u64 (the tier's bound); 16 × 2^59 fits a
        // u64, not isize::MAX, and the limit is the first expert_bytes that no longer fits.
        assert!(matches!(
            check(geo(4, 4, 2, 1 << 62)),
            Err(ExpertError::InvalidGeometry(_))
        ));
        assert_eq!(byte_limit(geo(4, 4, 2, 1 << 59)), (1 << 59, 1 << 59));
        check(geo(4, 4, 2, (1 << 59) - 16)).unwrap();
        // HBM is the larger tier when every expert is hot: 2 × 5 slots > 2 × 4 cells. Here the
        // host total fits (8 × (2^60 - 16) < 2^63) and only HBM does not.
        let g = geo(2, 4, 4, (1 << 60) - 16);
        assert!(g.bank_bytes().unwrap() <= isize::MAX as u64);
        assert_eq!(byte_limit(g).1, isize::MAX as u64 / 10 + 1);
        let g = geo(2, 4, 4, 16 * (isize::MAX as u64 / 160));
        check(g).unwrap();
        assert_eq!(g.hbm_bytes(), Some(10 * g.expert_bytes));
        // The multiple-of-16 hint no longer overflows near u64::MAX.
        match check(geo(1, 1, 1, u64::MAX)) {
            Err(ExpertError::InvalidGeometry(m)) => {
                assert!(m.contains(&(u64::MAX - 15).to_string()), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
}
