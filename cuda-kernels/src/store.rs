//! [`ExpertStore`]: the GPU memory of an expert tier, with no residency state.
//!
//! All experts of all layers live in mapped pinned host memory (the source of truth, readable in
//! place by kernels over PCIe); `hot_per_layer + 1` HBM slots per layer sit in one device
//! allocation; a device-resident indirection table `(layer, expert) → u64 address` sits at a
//! fixed address (CUDA-graph safe). Which expert occupies which slot, and when a table entry
//! changes, is decided by the caller (`expert-residency`'s GPU bank); this type only allocates,
//! addresses and copies.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::device::Gpu;
use crate::error::{CudaError, Result};
use crate::geometry::StoreGeometry;
use crate::mem::{copy_htod_async, DeviceBuffer, PinnedBuffer};
use crate::raw;

/// Pinned host experts, HBM slots and the device indirection table of one expert tier.
#[derive(Debug)]
pub struct ExpertStore {
    gpu: Arc<Gpu>,
    geo: StoreGeometry,
    host: PinnedBuffer<u8>,
    hbm: DeviceBuffer<u8>,
    table: DeviceBuffer<u64>,
}

impl ExpertStore {
    /// Allocates the store: host experts zero-filled, HBM slots zero-filled, and the table
    /// pointing every `(layer, expert)` at its pinned host copy (every expert read in place).
    ///
    /// # Errors
    /// The errors of [`StoreGeometry::validate`] (before anything is allocated);
    /// [`CudaError::Driver`] with `CUDA_ERROR_OUT_OF_MEMORY` when HBM or pinnable host memory is
    /// short.
    pub fn new(gpu: &Arc<Gpu>, geo: StoreGeometry) -> Result<Self> {
        Self::with_memory(gpu, geo, None, None)
    }

    /// As [`ExpertStore::new`], over caller-owned memory where given: `host` holds the experts
    /// (`[layers][experts][expert_bytes]` u8 from its start, at least `host_bytes` bytes; its
    /// bytes are kept, not zeroed: the caller's weights are read in place) and `hbm` the slots (at
    /// least `hbm_bytes` bytes); `None` allocates that part. Build them with
    /// [`PinnedBuffer::borrowed`] / [`DeviceBuffer::borrowed`] in `gpu`'s context.
    ///
    /// # Errors
    /// As [`ExpertStore::new`]; [`CudaError::ForeignMemory`] for a buffer shorter than the
    /// geometry needs or of another device's context.
    pub fn with_memory(
        gpu: &Arc<Gpu>,
        geo: StoreGeometry,
        host: Option<PinnedBuffer<u8>>,
        hbm: Option<DeviceBuffer<u8>>,
    ) -> Result<Self> {
        geo.validate()?;
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
                    geo.host_bytes(),
                    h.ctx() == ctx,
                )?;
                h
            }
            None => PinnedBuffer::<u8>::zeroed(ctx, geo.host_bytes() as usize)?,
        };
        let hbm = match hbm {
            Some(d) => {
                check(
                    "expert HBM slots",
                    d.num_bytes(),
                    geo.hbm_bytes(),
                    d.ctx() == ctx,
                )?;
                d
            }
            None => DeviceBuffer::<u8>::zeroed(ctx, geo.hbm_bytes() as usize)?,
        };
        let cells = (geo.layers * geo.experts) as usize;
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
    pub fn geometry(&self) -> StoreGeometry {
        self.geo
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The indirection table: u64 `[layers][experts]` device addresses, at a fixed device
    /// address for the store's life. Change entries with [`crate::TableUpdater::launch`] on
    /// the stream that reads them, or [`ExpertStore::upload_table`] while no kernel reads them.
    pub fn table(&self) -> &DeviceBuffer<u64> {
        &self.table
    }

    /// Replaces the whole table synchronously (`table`: `[layers * experts]` device addresses);
    /// returns once the bytes are in place (it synchronises the context). No kernel may read the
    /// table meanwhile.
    ///
    /// # Errors
    /// [`CudaError::Shape`] for a wrong length (nothing written); [`CudaError::Driver`].
    pub fn upload_table(&mut self, table: &[u64]) -> Result<()> {
        self.table.upload(table)
    }

    /// Device address of the indirection table (what engine kernels take).
    pub fn table_ptr(&self) -> u64 {
        self.table.device_ptr()
    }

    /// Errors unless `layer < layers` and `expert < experts`.
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] naming the field.
    pub fn check(&self, layer: u32, expert: u32) -> Result<()> {
        if layer >= self.geo.layers {
            return Err(CudaError::OutOfRange {
                what: "layer",
                value: layer as u64,
                limit: self.geo.layers as u64,
            });
        }
        if expert >= self.geo.experts {
            return Err(CudaError::OutOfRange {
                what: "expert",
                value: expert as u64,
                limit: self.geo.experts as u64,
            });
        }
        Ok(())
    }

    /// Flat table index `layer * experts + expert` of a checked `(layer, expert)`: below
    /// `layers × experts`, which [`StoreGeometry::validate`] bounds to `u32`, so the `u32`
    /// arithmetic cannot overflow.
    pub fn cell(&self, layer: u32, expert: u32) -> u32 {
        layer * self.geo.experts + expert
    }

    /// Byte offset of a checked `(layer, expert)` in the host buffer (below `host_bytes`, which
    /// `validate` bounds to `isize::MAX`).
    fn host_offset(&self, layer: u32, expert: u32) -> usize {
        self.cell(layer, expert) as usize * self.geo.expert_bytes as usize
    }

    /// Device address of HBM slot `slot` of `layer` (`slot <= hot_per_layer`: `hot_per_layer + 1`
    /// slots per layer), or 0 (null) if `layer >= layers` or `slot > hot_per_layer`.
    pub fn slot_ptr(&self, layer: u32, slot: u32) -> u64 {
        if layer >= self.geo.layers || slot >= self.geo.slots_per_layer() {
            return 0;
        }
        // In range: the index is below layers × slots_per_layer, which validate bounds to u32.
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
    /// [`CudaError::OutOfRange`] for a bad `layer` or `expert`.
    pub fn host_expert(&self, layer: u32, expert: u32) -> Result<&[u8]> {
        self.check(layer, expert)?;
        let o = self.host_offset(layer, expert);
        Ok(&self.host.as_slice()[o..o + self.geo.expert_bytes as usize])
    }

    /// Mutable host copy of an expert (`expert_bytes` bytes). Do not write an expert while a
    /// copy from it is in flight (`&mut self` rules out [`ExpertStore::copy_to_slot_async`]
    /// callers holding `&self`, not copies they enqueued earlier).
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] for a bad `layer` or `expert`.
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
        let experts = self.geo.experts;
        // a caller's buffer may be longer than the geometry: only the experts' bytes
        let used = self.geo.host_bytes() as usize;
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
            });
        }
        Ok(())
    }

    /// Synchronous copy of the host copy of `(layer, expert)` into HBM slot `slot` of `layer`
    /// (`cuMemcpyHtoD`; it may still be landing on return: synchronise the context, e.g. with
    /// [`DeviceBuffer::upload`] or [`Gpu::synchronize`], before kernels read the slot). No
    /// kernel may read the slot meanwhile: call it with the device idle.
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] for a bad layer, expert or slot; [`CudaError::Driver`].
    pub fn copy_to_slot_sync(&self, layer: u32, expert: u32, slot: u32) -> Result<()> {
        self.check_slot(layer, slot)?;
        let src = self.host_expert(layer, expert)?;
        self.gpu
            .ctx()
            .bind_to_thread()
            .map_err(crate::error::drv("cuCtxSetCurrent"))?;
        // SAFETY: the slot lies inside our HBM allocation (checked above) and holds
        // `expert_bytes` bytes, as many as `src`; the context is bound just above.
        unsafe { raw::memcpy_htod_sync(self.slot_ptr(layer, slot), src, "cuMemcpyHtoD(slot)") }
    }

    /// Enqueues the copy of the host copy of `(layer, expert)` into HBM slot `slot` of `layer`
    /// on `stream` (`cuMemcpyHtoDAsync` from pinned memory: the full H2D rate, host not
    /// blocked). Order it after the slot's last readers (e.g. make `stream` wait on their
    /// event) and before its next readers (record an event after it).
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] for a bad layer, expert or slot (nothing enqueued);
    /// [`CudaError::Driver`].
    ///
    /// # Safety
    /// Until the copy completes: the host expert must not be written (no
    /// [`ExpertStore::host_expert_mut`] / [`ExpertStore::fill_host`] on it), and the store must
    /// not be dropped before `stream` is synchronised.
    pub unsafe fn copy_to_slot_async(
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
        }
    }

    /// The bytes of HBM slot `slot` of `layer`, after synchronising the context (waits for all
    /// work on the device).
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] for a bad layer or slot; [`CudaError::Driver`].
    pub fn download_slot(&self, layer: u32, slot: u32) -> Result<Vec<u8>> {
        self.check_slot(layer, slot)?;
        self.gpu.synchronize()?;
        let mut buf = vec![0u8; self.geo.expert_bytes as usize];
        // SAFETY: the slot lies inside our HBM allocation (checked above) and holds `buf.len()`
        // bytes; the device is idle (synchronised above) and the context bound by it.
        unsafe {
            raw::memcpy_dtoh_sync(&mut buf, self.slot_ptr(layer, slot), "cuMemcpyDtoH(slot)")
        }?;
        Ok(buf)
    }
}
