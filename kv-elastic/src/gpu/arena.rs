//! [`GpuArena`]: the GPU back-end's device state — per session slot a descriptor, fixed pages,
//! borrowed-page table and hot-cache state (CLOCK), the device arena, and the host store in mapped
//! pinned memory — at fixed device addresses (CUDA-graph capturable), with the launchers of
//! [`cuda_kernels::KvKernels`] bound to it.

use std::sync::Arc;

use bytemuck::Pod;
use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{
    copy_dtoh_async, copy_htod_async, CudaError, DeviceBuffer, Gpu, PinnedBuffer, Result,
};
use cuda_kernels::{
    CopyBackend, KvCopy, KvDims, KvErrors, KvKernels, KvResolveArgs, KvResolveOptions, KvSlotDesc,
    KvTables, KV_ERR_WORDS, KV_UNCLAIMED,
};
use tier_core::NOT_RESIDENT;

use super::direct::DirectBatch;
use crate::LayerGroups;

mod launch;

/// The GPU back-end's device state (the tables of [`KvTables`]) and the kernels bound to it.
///
/// Layouts: arena `u8 [layers][arena_rows][row_bytes]` (one allocation, FlashMLA indexes one
/// array); host store `u8 [max_slots][max_history][layers][row_bytes]` in mapped pinned memory,
/// read in place by the kernels over PCIe / C2C; hot-cache tables one set per layer group
/// (`[groups][max_slots][...]`, [`GpuArena::tables`] gives a group's, [`GpuArena::hot_table_bytes`]
/// their HBM). The `*_async` launchers that take a layer act on that layer's group: a resolve or
/// prefetch fills every layer of the group, a replay copies only rows its group still maps. The synchronous methods (`set_slot`, `reset_slot`,
/// `upload_rows`, downloads) run between steps on the step stream ([`Gpu::stream`]) and wait for
/// it; the `*_async` launchers queue on the stream they are given.
#[derive(Debug)]
pub struct GpuArena {
    gpu: Arc<Gpu>,
    dims: KvDims,
    groups: LayerGroups,
    /// Layer groups (`groups.count(dims.layers)`).
    n_groups: u32,
    desc: DeviceBuffer<KvSlotDesc>,
    fixed_pages: DeviceBuffer<i32>,
    page_tab: DeviceBuffer<i32>,
    pos_slot: DeviceBuffer<i32>,
    slot_pos: DeviceBuffer<i32>,
    mark: DeviceBuffer<u64>,
    stamp: DeviceBuffer<u64>,
    hand: DeviceBuffer<u32>,
    first: DeviceBuffer<i32>,
    call: DeviceBuffer<u64>,
    arena: DeviceBuffer<u8>,
    host: PinnedBuffer<u8>,
    err: DeviceBuffer<u32>,
    /// The direct-batch word (`KvTables::direct`): 1 while every live slot is full.
    direct: DeviceBuffer<u32>,
    /// The descriptors written (through this arena or noted by the pool) the word follows.
    direct_batch: DirectBatch,
    kernels: KvKernels,
}

fn sync(stream: &CudaStream) -> Result<()> {
    stream
        .synchronize()
        .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
}

impl GpuArena {
    /// Allocates every table (hot caches empty, no slot live, every slot's call counter 1, the
    /// CPU reference's first value; one set of hot-cache tables per layer group of `groups`), the
    /// arena (`layers × arena_rows × row_bytes` bytes, zeroed) and the mapped pinned host store
    /// (`max_slots × max_history × layers × row_bytes` bytes), then loads the kernels.
    ///
    /// # Errors
    /// [`KvDims::validate`]'s errors; `OutOfRange` for `groups` not partitioning `dims.layers`;
    /// CUDA errors (e.g. `CUDA_ERROR_OUT_OF_MEMORY`); NVRTC errors.
    pub fn new(gpu: &Arc<Gpu>, dims: KvDims, groups: LayerGroups) -> Result<Self> {
        Self::with_arena(gpu, dims, groups, None)
    }

    /// As [`GpuArena::new`], with the arena in caller-owned device memory where `arena` is given
    /// (at least `layers × arena_rows × row_bytes` bytes from its start; zeroed here, as an owned
    /// arena is; built with [`DeviceBuffer::borrowed`] in `gpu`'s context).
    ///
    /// # Errors
    /// As [`GpuArena::new`]; [`CudaError::ForeignMemory`] for an arena shorter than the dims
    /// need or of another device's context.
    pub fn with_arena(
        gpu: &Arc<Gpu>,
        dims: KvDims,
        groups: LayerGroups,
        arena: Option<DeviceBuffer<u8>>,
    ) -> Result<Self> {
        Self::with_buffers(gpu, dims, groups, arena, None)
    }

    /// As [`GpuArena::with_arena`], with the host store in `host` where given: mapped pinned
    /// memory of `gpu`'s context, at least `max_slots × max_history × layers × row_bytes` bytes
    /// (engine-owned memory adopted with [`PinnedBuffer::borrowed`]; its contents are kept).
    ///
    /// # Errors
    /// As [`GpuArena::with_arena`]; [`CudaError::ForeignMemory`] for a host store that is too
    /// short or of another context.
    pub fn with_buffers(
        gpu: &Arc<Gpu>,
        dims: KvDims,
        groups: LayerGroups,
        arena: Option<DeviceBuffer<u8>>,
        host: Option<PinnedBuffer<u8>>,
    ) -> Result<Self> {
        // Dims a caller built by hand: the kernels' own check. (The pool converts a validated
        // geometry instead, `GpuPoolConfig::kv_dims`, and calls `from_checked` directly.)
        dims.validate()?;
        if groups.validate(dims.layers).is_err() {
            return Err(CudaError::OutOfRange {
                what: "layer groups (their sizes must sum to the layers)",
                value: groups.sizes(dims.layers).iter().map(|&n| n as u64).sum(),
                limit: dims.layers as u64 + 1,
            });
        }
        Self::from_checked(gpu, dims, groups, arena, host)
    }

    /// As [`GpuArena::with_buffers`], for `dims` and `groups` already known valid (`dims`
    /// converted from a validated geometry, whose layer groups partition its layers): nothing is
    /// checked again.
    pub(crate) fn from_checked(
        gpu: &Arc<Gpu>,
        dims: KvDims,
        groups: LayerGroups,
        arena: Option<DeviceBuffer<u8>>,
        host: Option<PinnedBuffer<u8>>,
    ) -> Result<Self> {
        let n_groups = groups.count(dims.layers);
        let ctx = gpu.ctx();
        let slots = dims.max_slots as usize;
        let hist = slots * dims.max_history as usize;
        let ng = n_groups as usize;
        let too_big = || CudaError::OutOfRange {
            what: "hot-cache tables (groups × max_slots × max_history)",
            value: u64::MAX,
            limit: isize::MAX as u64,
        };
        let group_hist = hist.checked_mul(ng).ok_or_else(too_big)?;
        let hot = (slots * dims.hot_rows as usize)
            .checked_mul(ng)
            .ok_or_else(too_big)?;
        let arena_bytes =
            dims.plane_bytes()
                .checked_mul(dims.layers as usize)
                .ok_or(CudaError::OutOfRange {
                    what: "arena bytes",
                    value: u64::MAX,
                    limit: isize::MAX as u64,
                })?;
        let host_bytes = hist
            .checked_mul(dims.token_bytes())
            .ok_or(CudaError::OutOfRange {
                what: "host store bytes",
                value: u64::MAX,
                limit: isize::MAX as u64,
            })?;
        let arena = match arena {
            Some(a) => {
                if a.ctx() != ctx {
                    return Err(CudaError::ForeignMemory {
                        what: "KV arena",
                        reason: "belongs to another device's context".into(),
                    });
                }
                if a.num_bytes() < arena_bytes {
                    return Err(CudaError::ForeignMemory {
                        what: "KV arena",
                        reason: format!("{} bytes, the dims need {arena_bytes}", a.num_bytes()),
                    });
                }
                a.zero_sync()?;
                a
            }
            None => DeviceBuffer::zeroed(ctx, arena_bytes)?,
        };
        let host = match host {
            Some(h) => {
                if h.ctx() != ctx {
                    return Err(CudaError::ForeignMemory {
                        what: "KV host store",
                        reason: "belongs to another device's context".into(),
                    });
                }
                if h.len() < host_bytes {
                    return Err(CudaError::ForeignMemory {
                        what: "KV host store",
                        reason: format!("{} bytes, the dims need {host_bytes}", h.len()),
                    });
                }
                h
            }
            None => PinnedBuffer::zeroed(ctx, host_bytes)?,
        };
        let minus = |n: usize| DeviceBuffer::from_host(ctx, &vec![NOT_RESIDENT; n]);
        Ok(GpuArena {
            desc: DeviceBuffer::zeroed(ctx, slots)?,
            fixed_pages: DeviceBuffer::zeroed(ctx, slots * dims.fixed_pages as usize)?,
            page_tab: minus(slots * dims.max_pages as usize)?,
            pos_slot: minus(group_hist)?,
            slot_pos: minus(hot)?,
            mark: DeviceBuffer::zeroed(ctx, hot)?,
            stamp: DeviceBuffer::zeroed(ctx, hot)?,
            hand: DeviceBuffer::zeroed(ctx, slots * ng)?,
            // Dedup claims live only within one call (reset by its end): one table for all groups.
            first: DeviceBuffer::from_host(ctx, &vec![KV_UNCLAIMED; hist])?,
            // Per-(group, slot) call counters at 1 (a resolve's first call is 2, a prefetch before
            // any resolve uses 1): a zeroed stamp (call 0) is never the current call's.
            call: DeviceBuffer::from_host(ctx, &vec![1u64; slots * ng])?,
            arena,
            host,
            err: DeviceBuffer::zeroed(ctx, KV_ERR_WORDS)?,
            direct: DeviceBuffer::zeroed(ctx, 1)?,
            direct_batch: DirectBatch::new(slots),
            kernels: KvKernels::new(gpu)?,
            gpu: gpu.clone(),
            dims,
            groups,
            n_groups,
        })
    }

    /// The dimensions.
    pub fn dims(&self) -> &KvDims {
        &self.dims
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The loaded kernels (to launch them on these tables by hand).
    pub fn kernels(&self) -> &KvKernels {
        &self.kernels
    }

    /// The layer groups (one set of hot-cache tables each).
    pub fn layer_groups(&self) -> LayerGroups {
        self.groups
    }

    /// Layer groups.
    pub fn group_count(&self) -> u32 {
        self.n_groups
    }

    /// Bytes of HBM the hot-cache tables take over all layer groups: per group and slot
    /// `4 × max_history` (position → hot row) `+ 20 × hot_rows` (hot row → position, CLOCK mark
    /// and stamp) `+ 12` (hand, call counter).
    pub fn hot_table_bytes(&self) -> u64 {
        let d = &self.dims;
        self.n_groups as u64
            * d.max_slots as u64
            * (4 * d.max_history as u64 + 20 * d.hot_rows as u64 + 12)
    }

    /// Device pointers of every table, the hot-cache tables (`pos_slot`, `slot_pos`, `mark`,
    /// `stamp`, `hand`, `call`) those of layer group `group` (valid while `self` lives): what a
    /// kernel launched by hand on a layer of that group takes.
    ///
    /// # Errors
    /// `OutOfRange` for a group past the last.
    pub fn tables(&self, group: u32) -> Result<KvTables> {
        if group >= self.n_groups {
            return Err(CudaError::OutOfRange {
                what: "layer group",
                value: group as u64,
                limit: self.n_groups as u64,
            });
        }
        let d = &self.dims;
        let (g, slots) = (group as u64, d.max_slots as u64);
        let hot = g * slots * d.hot_rows as u64;
        Ok(KvTables {
            desc: self.desc.device_ptr(),
            fixed_pages: self.fixed_pages.device_ptr(),
            page_tab: self.page_tab.device_ptr(),
            pos_slot: self.pos_slot.device_ptr() + 4 * g * slots * d.max_history as u64,
            slot_pos: self.slot_pos.device_ptr() + 4 * hot,
            mark: self.mark.device_ptr() + 8 * hot,
            stamp: self.stamp.device_ptr() + 8 * hot,
            hand: self.hand.device_ptr() + 4 * g * slots,
            first: self.first.device_ptr(),
            call: self.call.device_ptr() + 8 * g * slots,
            arena: self.arena.device_ptr(),
            host: self.host.device_ptr(),
            err: self.err.device_ptr(),
            direct: self.direct.device_ptr(),
        })
    }

    /// Records that slot `slot`'s descriptor is now `desc` (written by the caller, e.g. as a
    /// queued table patch) and returns the value the direct-batch word must take, if it changes:
    /// `Some(1)` when every live slot is now full, `Some(0)` when that stopped being so. The
    /// caller writes it in the same stream order as the descriptors (kv-elastic's publish puts
    /// both in one patch launch) and the arena then assumes it written.
    pub(crate) fn note_desc(&mut self, slot: u32, desc: &KvSlotDesc) -> Option<u32> {
        self.direct_batch
            .note(slot, (desc.live != 0).then_some(desc.full != 0))
    }

    /// Whether the direct-batch word is (or is queued to be) set: every live slot full, at least
    /// one. Resolves then take the direct path (`cuda-kernels/DESIGN.md`, "Direct batches").
    pub fn direct_batch(&self) -> bool {
        self.direct_batch.on()
    }

    /// Writes the direct-batch word as given, whatever the descriptors say (tests of the kernels'
    /// behaviour under a broken promise; synchronous). The next descriptor write recomputes it.
    #[cfg(feature = "test-hooks")]
    pub fn force_direct_word(&mut self, value: u32) -> Result<()> {
        self.put(self.direct.device_ptr(), &[value])
    }

    /// Writes `desc` as slot `slot`'s descriptor and keeps the direct-batch word in step (synchronous).
    fn put_desc(&mut self, slot: u32, desc: KvSlotDesc) -> Result<()> {
        self.put(self.desc.device_ptr_at(slot as usize)?, &[desc])?;
        if let Some(v) = self.note_desc(slot, &desc) {
            self.put(self.direct.device_ptr(), &[v])?;
        }
        Ok(())
    }

    /// The layer group of `layer` and its layers, checked.
    fn group_at(&self, layer: u32) -> Result<(u32, std::ops::Range<u32>)> {
        self.check_layers(layer, 1)?;
        let g = self.groups.group_of(layer);
        Ok((g, self.groups.layers(g, self.dims.layers)))
    }

    /// Device pointer of arena plane `layer` (`u8 [arena_rows][row_bytes]`).
    pub fn plane_ptr(&self, layer: u32) -> Result<u64> {
        self.check_layers(layer, 1)?;
        Ok(self.arena.device_ptr() + (layer as usize * self.dims.plane_bytes()) as u64)
    }

    /// The host store (mapped pinned memory, `[max_slots][max_history][layers][row_bytes]`).
    /// Do not write rows a kernel in flight reads.
    pub fn host_store(&self) -> &[u8] {
        self.host.as_slice()
    }

    /// Mutable host store (the control plane writes committed history here between steps).
    pub fn host_store_mut(&mut self) -> &mut [u8] {
        self.host.as_mut_slice()
    }

    /// The host store's base pointer (the allocation's own pointer, not a reborrow) and length,
    /// for the GPU pool's `PinnedBytes` view. Valid while `self` lives.
    pub(crate) fn host_base(&self) -> (*mut u8, usize) {
        (self.host.host_ptr() as *mut u8, self.host.len())
    }

    /// Who owns the host store's memory (tierkit's allocation, or the engine's, pinned by
    /// tierkit or already pinned).
    pub fn host_backing(&self) -> cuda_kernels::HostBacking {
        self.host.backing()
    }

    /// [`KvKernels::fill_words_async`] (table patches) on `stream`.
    ///
    /// # Safety
    /// As [`KvKernels::fill_words_async`]: `fills` holds `n` [`cuda_kernels::KvFill`] readable by
    /// the device until the stream passes the launch, naming words of these tables only.
    pub unsafe fn fill_words_async(&self, stream: &CudaStream, fills: u64, n: u32) -> Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.kernels.fill_words_async(stream, fills, n) }
    }

    fn check_layers(&self, l0: u32, nl: u32) -> Result<()> {
        if nl == 0 || l0 as u64 + nl as u64 > self.dims.layers as u64 {
            return Err(CudaError::OutOfRange {
                what: "layer range end",
                value: l0 as u64 + nl as u64,
                limit: self.dims.layers as u64 + 1,
            });
        }
        Ok(())
    }

    fn check_slot(&self, slot: u32) -> Result<()> {
        if slot >= self.dims.max_slots {
            return Err(CudaError::OutOfRange {
                what: "session slot",
                value: slot as u64,
                limit: self.dims.max_slots as u64,
            });
        }
        Ok(())
    }

    fn bind(&self) -> Result<()> {
        self.gpu
            .ctx()
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
    }

    /// Synchronous upload of `data` to device address `dst` on the step stream.
    fn put<T: Pod>(&self, dst: u64, data: &[T]) -> Result<()> {
        let stream = self.gpu.stream();
        self.bind()?;
        // SAFETY: the caller passes a destination range inside one of our buffers; `data` lives
        // until the stream synchronize below, so the copy completes while it is valid.
        unsafe {
            copy_htod_async(
                dst,
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                stream,
            )
        }?;
        sync(stream)
    }

    /// Synchronous download from device address `src` into `out` on the step stream.
    fn get<T: Pod>(&self, out: &mut [T], src: u64) -> Result<()> {
        let stream = self.gpu.stream();
        self.bind()?;
        // SAFETY: the caller passes a source range inside one of our buffers; `out` is borrowed
        // mutably until the stream synchronize below, so nothing else reads it during the copy.
        unsafe {
            copy_dtoh_async(
                out.as_mut_ptr().cast(),
                src,
                std::mem::size_of_val(out),
                stream,
            )
        }?;
        sync(stream)
    }

    /// Publishes one slot's placement (synchronous; between steps, nothing in flight reads it):
    /// descriptor, fixed pages (`fixed_pages` physical page ids) and borrowed-page table
    /// ([`NOT_RESIDENT`] = not resident; shorter tables are padded with it). The direct-batch word
    /// follows the descriptors ([`GpuArena::direct_batch`]): `desc.full = 1` is the caller's
    /// statement that every position below `committed` is in the tail or a mapped borrowed page.
    ///
    /// # Errors
    /// `OutOfRange` for the slot, `Shape` for table lengths or a descriptor whose committed +
    /// scratch length exceeds `max_history` or whose page ids exceed the arena.
    pub fn set_slot(
        &mut self,
        slot: u32,
        desc: KvSlotDesc,
        fixed_pages: &[i32],
        page_table: &[i32],
    ) -> Result<()> {
        self.check_slot(slot)?;
        let d = self.dims;
        if fixed_pages.len() != d.fixed_pages as usize {
            return Err(CudaError::Shape {
                what: "fixed pages",
                expected: d.fixed_pages as u64,
                got: fixed_pages.len() as u64,
            });
        }
        if page_table.len() > d.max_pages as usize {
            return Err(CudaError::Shape {
                what: "page table (at most max_pages)",
                expected: d.max_pages as u64,
                got: page_table.len() as u64,
            });
        }
        let pages = d.arena_rows / d.page_rows;
        if fixed_pages
            .iter()
            .chain(page_table)
            .any(|&p| p >= pages as i32 || (p < 0 && p != NOT_RESIDENT))
            || fixed_pages.iter().any(|&p| p < 0)
        {
            return Err(CudaError::OutOfRange {
                what: "page id",
                value: pages as u64,
                limit: pages as u64,
            });
        }
        if desc.committed as u64 + desc.scratch_len as u64 > d.max_history as u64
            || desc.scratch_len > d.scratch_rows
            || desc.tail_start > desc.committed
        {
            return Err(CudaError::Shape {
                what: "slot descriptor (committed + scratch within max_history)",
                expected: d.max_history as u64,
                got: desc.committed as u64 + desc.scratch_len as u64,
            });
        }
        let mut pt = page_table.to_vec();
        pt.resize(d.max_pages as usize, NOT_RESIDENT);
        let s = slot as usize;
        self.put(
            self.fixed_pages.device_ptr_at(s * d.fixed_pages as usize)?,
            fixed_pages,
        )?;
        self.put(self.page_tab.device_ptr_at(s * d.max_pages as usize)?, &pt)?;
        self.put_desc(slot, desc)
    }

    /// Empties one slot's hot cache (all hot slots free, hand 0, stamps 0, position table
    /// [`NOT_RESIDENT`]) and marks the slot not live (synchronous). Call when a session takes or
    /// leaves the slot.
    pub fn reset_slot(&mut self, slot: u32) -> Result<()> {
        self.check_slot(slot)?;
        self.put_desc(slot, KvSlotDesc::default())?;
        self.clear_hot_caches(slot)
    }

    /// Empties one live slot's hot caches, in every layer group (all hot slots free, reference
    /// marks and stamps 0, hand 0, position table [`NOT_RESIDENT`]) and keeps its descriptor,
    /// fixed pages and page table (synchronous; nothing in flight may read the slot). Resident
    /// rows (tail, scratch, borrowed pages) are unaffected; the next resolve fetches every
    /// hot-cache position again. Used to start comparisons from the same cold state without
    /// rebuilding the pool (a test hook, feature `test-hooks`: the peer comparison of
    /// `kv_gpu_bench`).
    ///
    /// # Errors
    /// `OutOfRange` for the slot; driver errors.
    #[cfg(feature = "test-hooks")]
    pub fn clear_hot(&mut self, slot: u32) -> Result<()> {
        self.clear_hot_caches(slot)
    }

    /// [`GpuArena::reset_slot`]'s hot-cache half (what `clear_hot` does).
    fn clear_hot_caches(&mut self, slot: u32) -> Result<()> {
        self.check_slot(slot)?;
        let d = self.dims;
        let (h, n) = (d.hot_rows as usize, d.max_history as usize);
        for g in 0..self.n_groups as usize {
            let s = g * d.max_slots as usize + slot as usize;
            self.put(self.slot_pos.device_ptr_at(s * h)?, &vec![-1i32; h])?;
            self.put(self.mark.device_ptr_at(s * h)?, &vec![0u64; h])?;
            self.put(self.stamp.device_ptr_at(s * h)?, &vec![0u64; h])?;
            self.put(self.hand.device_ptr_at(s)?, &[0u32])?;
            self.put(self.pos_slot.device_ptr_at(s * n)?, &vec![NOT_RESIDENT; n])?;
        }
        Ok(())
    }

    /// Writes `bytes` (whole rows, each `value ‖ scale`) into plane `layer` from row `row0`
    /// (synchronous; each row's segments where the row format puts them).
    pub fn upload_rows(&mut self, layer: u32, row0: u32, bytes: &[u8]) -> Result<()> {
        self.check_layers(layer, 1)?;
        let rb = self.dims.row_bytes as usize;
        let rows = bytes.len() / rb;
        if !bytes.len().is_multiple_of(rb) || row0 as usize + rows > self.dims.arena_rows as usize {
            return Err(CudaError::Shape {
                what: "arena rows upload",
                expected: (self.dims.arena_rows as u64 - row0 as u64) * rb as u64,
                got: bytes.len() as u64,
            });
        }
        let plane = self.arena.device_ptr() + (layer as usize * self.dims.plane_bytes()) as u64;
        if self.dims.scale_bytes == 0 {
            return self.put(plane + self.dims.row_segs(row0).0, bytes);
        }
        // A paged split row: its value and its scale to their places (KvDims::row_segs).
        let vb = self.dims.value_bytes as usize;
        for (i, row) in bytes.chunks(rb).enumerate() {
            let (v, s) = self.dims.row_segs(row0 + i as u32);
            self.put(plane + v, &row[..vb])?;
            self.put(plane + s, &row[vb..])?;
        }
        Ok(())
    }

    /// Downloads plane `layer` (synchronous; waits for the device first): `u8 [arena_pages]
    /// [fmt_page_bytes]` ([`KvDims::plane_bytes`]); `kv_elastic::Geometry::plane_row` reads a
    /// row of it as `value ‖ scale`.
    pub fn download_plane(&self, layer: u32) -> Result<Vec<u8>> {
        self.check_layers(layer, 1)?;
        self.gpu.synchronize()?;
        let mut out = vec![0u8; self.dims.plane_bytes()];
        self.get(&mut out, self.plane_ptr(layer)?)?;
        Ok(out)
    }

    /// The index of `(group, slot)` in the `[groups][max_slots]` hot-cache tables, checked.
    fn group_slot(&self, group: u32, slot: u32) -> Result<usize> {
        self.check_slot(slot)?;
        if group >= self.n_groups {
            return Err(CudaError::OutOfRange {
                what: "layer group",
                value: group as u64,
                limit: self.n_groups as u64,
            });
        }
        Ok(group as usize * self.dims.max_slots as usize + slot as usize)
    }

    /// Downloads one slot's `hot slot → position` table and hand in layer group `group`
    /// (synchronous; tests).
    pub fn download_hot(&self, slot: u32, group: u32) -> Result<(Vec<i32>, u32)> {
        let gs = self.group_slot(group, slot)?;
        self.gpu.synchronize()?;
        let h = self.dims.hot_rows as usize;
        let mut sp = vec![0i32; h];
        let mut hand = [0u32];
        self.get(&mut sp, self.slot_pos.device_ptr_at(gs * h)?)?;
        self.get(&mut hand, self.hand.device_ptr_at(gs)?)?;
        Ok((sp, hand[0]))
    }

    /// The hot slot holding `position` of session slot `slot` in layer group `group`
    /// (synchronous; `None` if not cached).
    pub fn hot_slot_of(&self, slot: u32, group: u32, position: u32) -> Result<Option<u32>> {
        let gs = self.group_slot(group, slot)?;
        if position >= self.dims.max_history {
            return Ok(None);
        }
        let mut v = [0i32];
        let at = gs * self.dims.max_history as usize + position as usize;
        self.get(&mut v, self.pos_slot.device_ptr_at(at)?)?;
        Ok((v[0] >= 0).then_some(v[0] as u32))
    }

    /// Reads the device error counters (synchronous).
    pub fn errors(&self) -> Result<KvErrors> {
        Ok(KvErrors::from_words(&self.err.download()?))
    }

    /// Zeroes the device error counters (synchronous).
    pub fn clear_errors(&mut self) -> Result<()> {
        self.err.upload(&[0u32; KV_ERR_WORDS])
    }
}
