//! kv-elastic's device side: the fused resolve / dedup / fetch kernel, plan replay, candidate
//! prefetch, write-back to the host store, and two copy back-ends (GPU-thread zero-copy gather and
//! `cuMemcpyBatchAsync` DMA).
//!
//! [`KvResolveGpu`] owns every table at a fixed device address (CUDA-graph capturable): per request
//! slot a descriptor ([`KvSlotDesc`]), its fixed pages (hot cache, tail, scratch), its borrowed-page
//! table, and its hot-cache state (`position → slot`, `slot → position`, CLOCK reference bits, pin
//! stamps, hand); the device arena (`[layers][arena_rows][row_bytes]`, one allocation); and the host
//! store in mapped pinned memory (`[max_slots][max_history][layers][row_bytes]`, read in place by the
//! kernels over PCIe).
//!
//! The kernels implement the semantics of `kv-elastic`'s CPU reference (`ElasticPool`): tail →
//! scratch → borrowed page → hot cache → miss; misses deduplicated per request over all its rows (in
//! order of first appearance), placed into CLOCK victims that skip the slots pinned by the current
//! call, so the GPU's replacement decisions equal the CPU's bit for bit (warp 0 of the request's
//! block replays the CPU's sequential sweep with ballots; see `kernels/kv_resolve.cu`). Invalid picks
//! (`< -1`, `>= seq_len`), unknown request slots and malformed `query_start_loc` never read or write
//! out of bounds: they come out as `-1` and are counted in the error words ([`KvErrors`]).
//!
//! Source: HiSparse / its adaptive variant (per-request hot buffer, deduplicated miss fetch),
//! FlashMLA's sparse `indices` + `topk_length` outputs, vLLM's `query_start_loc`.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use cudarc::driver::{
    result, sys, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use crate::device::{Gpu, KernelSource};
use crate::error::{drv, CudaError, Result};
use crate::mem::{DeviceBuffer, PinnedBuffer};

/// The kv-elastic kernels (`kernels/kv_resolve.cu`).
pub const KV_MODULE: KernelSource = KernelSource {
    name: "kv_resolve",
    code: include_str!("../kernels/kv_resolve.cu"),
};

/// Threads per block of the resolve and prefetch kernels (one block per request).
pub const KV_BLOCK: u32 = 512;

/// Per-request counters written by the resolve kernel (`u32 [reqs][KV_STATS]`): picks, tail hits,
/// scratch hits, page hits, hot hits (including picks of rows fetched this call), misses (distinct
/// rows fetched), direct path (1 if the whole history is resident), invalid picks.
pub const KV_STATS: usize = 8;

/// Sizes of the device tables (all counts; `row_bytes` in bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KvDims {
    /// Bytes per token row per layer (656 for DeepSeek fp8 MLA).
    pub row_bytes: u32,
    /// Layers (arena planes).
    pub layers: u32,
    /// Rows per page.
    pub page_rows: u32,
    /// Hot-cache rows per request.
    pub hot_rows: u32,
    /// Tail rows per request (position `p` at tail row `p % tail_rows`).
    pub tail_rows: u32,
    /// Scratch rows per request (draft tokens).
    pub scratch_rows: u32,
    /// Fixed pages per request (`ceil((hot + tail + scratch) / page_rows)`).
    pub fixed_pages: u32,
    /// Request slots (rows of every per-request table).
    pub max_slots: u32,
    /// Positions per request slot in the host store and the `position → slot` table.
    pub max_history: u32,
    /// Entries of each slot's borrowed-page table (`ceil(max_history / page_rows)`).
    pub max_pages: u32,
    /// Rows per arena plane.
    pub arena_rows: u32,
    /// Padding (0).
    pub pad0: u32,
}

// SAFETY: `KvDims` is `repr(C)`, Pod, and matches `struct KvDims` in kv_resolve.cu field for field.
unsafe impl DeviceRepr for KvDims {}

impl KvDims {
    /// Checks that every extent is non-zero and every index fits the kernels' 32-bit arithmetic.
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] naming the first bad field.
    pub fn validate(&self) -> Result<()> {
        let nz = [
            ("row_bytes", self.row_bytes),
            ("layers", self.layers),
            ("page_rows", self.page_rows),
            ("hot_rows", self.hot_rows),
            ("tail_rows", self.tail_rows),
            ("fixed_pages", self.fixed_pages),
            ("max_slots", self.max_slots),
            ("max_history", self.max_history),
            ("max_pages", self.max_pages),
            ("arena_rows", self.arena_rows),
        ];
        for (what, v) in nz {
            if v == 0 {
                return Err(CudaError::OutOfRange {
                    what,
                    value: 0,
                    limit: 0,
                });
            }
        }
        let fixed_rows = self.hot_rows as u64 + self.tail_rows as u64 + self.scratch_rows as u64;
        if fixed_rows > self.fixed_pages as u64 * self.page_rows as u64 {
            return Err(CudaError::OutOfRange {
                what: "hot + tail + scratch rows (fixed pages too few)",
                value: fixed_rows,
                limit: self.fixed_pages as u64 * self.page_rows as u64 + 1,
            });
        }
        if (self.max_pages as u64) < (self.max_history as u64).div_ceil(self.page_rows as u64) {
            return Err(CudaError::OutOfRange {
                what: "max_pages (below ceil(max_history / page_rows))",
                value: self.max_pages as u64,
                limit: u32::MAX as u64,
            });
        }
        if self.arena_rows > i32::MAX as u32 || self.max_history > i32::MAX as u32 {
            return Err(CudaError::OutOfRange {
                what: "arena_rows / max_history (int32 indices)",
                value: self.arena_rows.max(self.max_history) as u64,
                limit: i32::MAX as u64,
            });
        }
        if self.hot_rows > (1 << 30) {
            return Err(CudaError::OutOfRange {
                what: "hot_rows",
                value: self.hot_rows as u64,
                limit: 1 << 30,
            });
        }
        Ok(())
    }

    /// Bytes of one arena plane.
    pub fn plane_bytes(&self) -> usize {
        self.arena_rows as usize * self.row_bytes as usize
    }

    /// Bytes of one token across layers in the host store.
    pub fn token_bytes(&self) -> usize {
        self.layers as usize * self.row_bytes as usize
    }

    /// Byte offset of `(slot, position, layer)` in the host store.
    pub fn host_offset(&self, slot: u32, position: u32, layer: u32) -> usize {
        ((slot as usize * self.max_history as usize + position as usize) * self.layers as usize
            + layer as usize)
            * self.row_bytes as usize
    }
}

/// One request slot's placement as the host last published it (between steps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KvSlotDesc {
    /// 1 if the slot holds a live request.
    pub live: u32,
    /// Committed positions.
    pub committed: u32,
    /// Draft tokens in scratch (positions `committed..committed + scratch_len`).
    pub scratch_len: u32,
    /// 1 if the whole history is resident (tail + borrowed pages): the direct path.
    pub full: u32,
    /// First tail position (`committed - min(committed, tail_rows)`).
    pub tail_start: u32,
    /// Padding (0).
    pub pad: [u32; 3],
}

/// One row copy of a plan: `(slot, position)` of the host store ↔ arena row `dst_row`
/// (a hot-cache row for fetches, the source row for write-backs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct KvCopy {
    /// Request slot.
    pub slot: u32,
    /// Position in the request's history.
    pub position: u32,
    /// Arena row.
    pub dst_row: u32,
    /// Padding (0).
    pub pad: u32,
}

/// How misses are copied from the host store into the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyBackend {
    /// GPU threads read the mapped pinned host store in place (16-byte loads, a warp per row), inside
    /// the fused kernel: no host involvement, graph capturable; competes with compute for SMs.
    Gather,
    /// The copy engines (`cuMemcpyBatchAsync`, one descriptor per row): leaves the SMs alone but
    /// needs the plan on the host first (a download between the resolve and the copies).
    Dma,
}

/// Error counters the kernels keep on the device (cumulative until [`KvResolveGpu::clear_errors`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvErrors {
    /// Requests whose slot is out of range or not live, or whose `seq_len` is out of range.
    pub bad_request: u32,
    /// Picks `< -1` or `>= seq_len` (written as `-1`).
    pub bad_position: u32,
    /// Misses that found no evictable hot row (written as `-1`).
    pub overflow: u32,
    /// Calls with a malformed `query_start_loc` (every row written as `-1`).
    pub bad_qsl: u32,
    /// Plan entries whose destination row no longer holds the position (replay check).
    pub stale_plan: u32,
}

impl KvErrors {
    /// Whether every counter is zero.
    pub fn is_clean(&self) -> bool {
        *self == KvErrors::default()
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct KvTables {
    desc: u64,
    fixed_pages: u64,
    page_tab: u64,
    pos_slot: u64,
    slot_pos: u64,
    referenced: u64,
    stamp: u64,
    hand: u64,
    first: u64,
    call: u64,
    arena: u64,
    host: u64,
    err: u64,
}
// SAFETY: `repr(C)` of 13 u64 device pointers, matching `struct KvTables` in kv_resolve.cu.
unsafe impl DeviceRepr for KvTables {}

const ERR_WORDS: usize = 8;
const UNCLAIMED: i32 = i32::MAX;

/// Device buffers of one fused resolve call (raw device pointers, e.g. tensors' `data_ptr()`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvResolveArgs {
    /// `int32 [rows, k]` picked positions (`-1` = padding).
    pub topk: u64,
    /// `int32 [reqs + 1]` query rows per request.
    pub query_start_loc: u64,
    /// `int32 [reqs]` visible positions per request.
    pub seq_lens: u64,
    /// `int32 [reqs]` request slot of each request.
    pub req_slot: u64,
    /// Requests.
    pub reqs: u32,
    /// Query rows.
    pub rows: u32,
    /// Picks per row.
    pub k: u32,
    /// Arena plane the misses are fetched into.
    pub layer: u32,
    /// `int32 [rows, k]` output arena rows (`-1` padding).
    pub indices: u64,
    /// `int32 [rows]` output valid picks per row.
    pub valid_count: u64,
    /// `KvCopy [reqs][hot_rows]` output plan (request `r`'s copies at `r * hot_rows`).
    pub plan: u64,
    /// `u32 [reqs]` output plan entries per request.
    pub plan_count: u64,
    /// `u32 [reqs][KV_STATS]` output counters.
    pub stats: u64,
}

/// kv-elastic's device state and kernels (see the module docs).
#[derive(Debug)]
pub struct KvResolveGpu {
    gpu: Arc<Gpu>,
    dims: KvDims,
    desc: DeviceBuffer<KvSlotDesc>,
    fixed_pages: DeviceBuffer<i32>,
    page_tab: DeviceBuffer<i32>,
    pos_slot: DeviceBuffer<i32>,
    slot_pos: DeviceBuffer<i32>,
    referenced: DeviceBuffer<u32>,
    stamp: DeviceBuffer<u64>,
    hand: DeviceBuffer<u32>,
    first: DeviceBuffer<i32>,
    call: DeviceBuffer<u64>,
    arena: DeviceBuffer<u8>,
    host: PinnedBuffer<u8>,
    err: DeviceBuffer<u32>,
    f_resolve: CudaFunction,
    f_replay: CudaFunction,
    f_prefetch: CudaFunction,
    f_write_back: CudaFunction,
    f_resident: CudaFunction,
    f_attend: CudaFunction,
}

fn launch_err(name: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    drv(name)
}

impl KvResolveGpu {
    /// Allocates every table (hot caches empty, no slot live, call counter 1 as in the CPU
    /// reference), the arena (`layers × arena_rows × row_bytes` bytes, zeroed) and the mapped
    /// pinned host store (`max_slots × max_history × layers × row_bytes` bytes).
    ///
    /// # Errors
    /// [`KvDims::validate`]'s errors; CUDA errors (e.g. `CUDA_ERROR_OUT_OF_MEMORY`); NVRTC errors.
    pub fn new(gpu: &Arc<Gpu>, dims: KvDims) -> Result<Self> {
        dims.validate()?;
        let ctx = gpu.ctx();
        let slots = dims.max_slots as usize;
        let hist = slots * dims.max_history as usize;
        let hot = slots * dims.hot_rows as usize;
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
        let minus = |n: usize| DeviceBuffer::from_host(ctx, &vec![-1i32; n]);
        Ok(KvResolveGpu {
            desc: DeviceBuffer::zeroed(ctx, slots)?,
            fixed_pages: DeviceBuffer::zeroed(ctx, slots * dims.fixed_pages as usize)?,
            page_tab: minus(slots * dims.max_pages as usize)?,
            pos_slot: minus(hist)?,
            slot_pos: minus(hot)?,
            referenced: DeviceBuffer::zeroed(ctx, hot)?,
            stamp: DeviceBuffer::zeroed(ctx, hot)?,
            hand: DeviceBuffer::zeroed(ctx, slots)?,
            first: DeviceBuffer::from_host(ctx, &vec![UNCLAIMED; hist])?,
            call: DeviceBuffer::from_host(ctx, &[1u64, 0])?,
            arena: DeviceBuffer::zeroed(ctx, arena_bytes)?,
            host: PinnedBuffer::zeroed(ctx, host_bytes)?,
            err: DeviceBuffer::zeroed(ctx, ERR_WORDS)?,
            f_resolve: gpu.function(&KV_MODULE, "tierkit_kv_resolve")?,
            f_replay: gpu.function(&KV_MODULE, "tierkit_kv_replay")?,
            f_prefetch: gpu.function(&KV_MODULE, "tierkit_kv_prefetch")?,
            f_write_back: gpu.function(&KV_MODULE, "tierkit_kv_write_back")?,
            f_resident: gpu.function(&KV_MODULE, "tierkit_kv_resident_indices")?,
            f_attend: gpu.function(&KV_MODULE, "tierkit_kv_attend")?,
            gpu: gpu.clone(),
            dims,
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

    fn tables(&self) -> KvTables {
        KvTables {
            desc: self.desc.device_ptr(),
            fixed_pages: self.fixed_pages.device_ptr(),
            page_tab: self.page_tab.device_ptr(),
            pos_slot: self.pos_slot.device_ptr(),
            slot_pos: self.slot_pos.device_ptr(),
            referenced: self.referenced.device_ptr(),
            stamp: self.stamp.device_ptr(),
            hand: self.hand.device_ptr(),
            first: self.first.device_ptr(),
            call: self.call.device_ptr(),
            arena: self.arena.device_ptr(),
            host: self.host.device_ptr(),
            err: self.err.device_ptr(),
        }
    }

    /// Device pointer of arena plane `layer` (`[arena_rows][row_bytes]`).
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
                what: "request slot",
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
            .map_err(drv("cuCtxSetCurrent"))
    }

    /// Publishes one slot's placement (synchronous; between steps, nothing in flight reads it):
    /// descriptor, fixed pages (`fixed_pages` physical page ids) and borrowed-page table (`-1` =
    /// not resident; shorter tables are padded with `-1`).
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
            .any(|&p| p >= pages as i32 || (p < 0 && p != -1))
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
        pt.resize(d.max_pages as usize, -1);
        self.bind()?;
        // SAFETY: each destination range lies inside its buffer (slot < max_slots, lengths checked);
        // synchronous copies, and the caller guarantees no kernel in flight reads the tables.
        unsafe {
            result::memcpy_htod_sync(self.desc.device_ptr_at(slot as usize)?, &[desc])
                .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(
                self.fixed_pages
                    .device_ptr_at(slot as usize * d.fixed_pages as usize)?,
                fixed_pages,
            )
            .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(
                self.page_tab
                    .device_ptr_at(slot as usize * d.max_pages as usize)?,
                &pt,
            )
            .map_err(drv("cuMemcpyHtoD"))?;
        }
        Ok(())
    }

    /// Empties one slot's hot cache (all slots free, hand 0, stamps 0, position table `-1`) and
    /// marks the slot not live (synchronous). Call when a request takes or leaves the slot.
    pub fn reset_slot(&mut self, slot: u32) -> Result<()> {
        self.check_slot(slot)?;
        let d = self.dims;
        let (h, n) = (d.hot_rows as usize, d.max_history as usize);
        let s = slot as usize;
        self.bind()?;
        // SAFETY: in-bounds ranges of our buffers (slot < max_slots); synchronous copies while no
        // kernel reads the slot.
        unsafe {
            result::memcpy_htod_sync(self.desc.device_ptr_at(s)?, &[KvSlotDesc::default()])
                .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(self.slot_pos.device_ptr_at(s * h)?, &vec![-1i32; h])
                .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(self.referenced.device_ptr_at(s * h)?, &vec![0u32; h])
                .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(self.stamp.device_ptr_at(s * h)?, &vec![0u64; h])
                .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(self.hand.device_ptr_at(s)?, &[0u32])
                .map_err(drv("cuMemcpyHtoD"))?;
            result::memcpy_htod_sync(self.pos_slot.device_ptr_at(s * n)?, &vec![-1i32; n])
                .map_err(drv("cuMemcpyHtoD"))?;
        }
        Ok(())
    }

    /// Writes `bytes` (whole rows) into plane `layer` from row `row0` (synchronous).
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
        let off = layer as usize * self.dims.plane_bytes() + row0 as usize * rb;
        self.bind()?;
        // SAFETY: `off + bytes.len()` lies inside the arena (checked above); synchronous copy.
        unsafe { result::memcpy_htod_sync(self.arena.device_ptr() + off as u64, bytes) }
            .map_err(drv("cuMemcpyHtoD"))
    }

    /// Downloads plane `layer` (synchronous; waits for the device first).
    pub fn download_plane(&self, layer: u32) -> Result<Vec<u8>> {
        self.check_layers(layer, 1)?;
        self.gpu.synchronize()?;
        let mut out = vec![0u8; self.dims.plane_bytes()];
        self.bind()?;
        // SAFETY: the plane lies inside the arena; `out` has exactly plane_bytes bytes.
        unsafe {
            result::memcpy_dtoh_sync(
                &mut out,
                self.arena.device_ptr() + (layer as usize * self.dims.plane_bytes()) as u64,
            )
        }
        .map_err(drv("cuMemcpyDtoH"))?;
        Ok(out)
    }

    /// Downloads one slot's hot-cache `slot → position` table and its hand (synchronous; tests).
    pub fn download_hot(&self, slot: u32) -> Result<(Vec<i32>, u32)> {
        self.check_slot(slot)?;
        self.gpu.synchronize()?;
        let h = self.dims.hot_rows as usize;
        let mut sp = vec![0i32; h];
        let mut hand = [0u32];
        self.bind()?;
        // SAFETY: in-bounds ranges; synchronous copies after a device synchronize.
        unsafe {
            result::memcpy_dtoh_sync(&mut sp, self.slot_pos.device_ptr_at(slot as usize * h)?)
                .map_err(drv("cuMemcpyDtoH"))?;
            result::memcpy_dtoh_sync(&mut hand, self.hand.device_ptr_at(slot as usize)?)
                .map_err(drv("cuMemcpyDtoH"))?;
        }
        Ok((sp, hand[0]))
    }

    /// The hot slot holding `position` of `slot` (synchronous; `None` if not cached).
    pub fn hot_slot_of(&self, slot: u32, position: u32) -> Result<Option<u32>> {
        self.check_slot(slot)?;
        if position >= self.dims.max_history {
            return Ok(None);
        }
        let mut v = [0i32];
        self.bind()?;
        // SAFETY: in-bounds element; synchronous copy.
        unsafe {
            result::memcpy_dtoh_sync(
                &mut v,
                self.pos_slot.device_ptr_at(
                    slot as usize * self.dims.max_history as usize + position as usize,
                )?,
            )
        }
        .map_err(drv("cuMemcpyDtoH"))?;
        Ok((v[0] >= 0).then_some(v[0] as u32))
    }

    /// Reads the device error counters (synchronous).
    pub fn errors(&self) -> Result<KvErrors> {
        let e = self.err.download()?;
        Ok(KvErrors {
            bad_request: e[0],
            bad_position: e[1],
            overflow: e[2],
            bad_qsl: e[3],
            stale_plan: e[4],
        })
    }

    /// Zeroes the device error counters (synchronous).
    pub fn clear_errors(&mut self) -> Result<()> {
        self.err.upload(&[0u32; ERR_WORDS])
    }

    /// Launches the fused resolve on `stream` (asynchronous, graph capturable: only the
    /// device buffers of `a` are read and written). Grid `reqs + 1` blocks of [`KV_BLOCK`] threads;
    /// `backend == Gather` copies the misses into `a.layer` inside the kernel, `Dma` leaves them in
    /// the plan for [`KvResolveGpu::dma_copy_async`].
    ///
    /// # Safety
    /// Every pointer of `a` must address a live device buffer of the documented shape; no other
    /// stream may touch the tables or the hot rows while the kernel runs.
    pub unsafe fn resolve_async(
        &self,
        stream: &CudaStream,
        a: &KvResolveArgs,
        backend: CopyBackend,
    ) -> Result<()> {
        self.check_layers(a.layer, 1)?;
        if a.k == 0 {
            return Err(CudaError::Shape {
                what: "k",
                expected: 1,
                got: 0,
            });
        }
        let d = self.dims;
        let t = self.tables();
        let fetch = u32::from(backend == CopyBackend::Gather);
        let mut b = stream.launch_builder(&self.f_resolve);
        b.arg(&d)
            .arg(&t)
            .arg(&a.topk)
            .arg(&a.query_start_loc)
            .arg(&a.seq_lens)
            .arg(&a.req_slot)
            .arg(&a.reqs)
            .arg(&a.rows)
            .arg(&a.k)
            .arg(&a.layer)
            .arg(&fetch)
            .arg(&a.indices)
            .arg(&a.valid_count)
            .arg(&a.plan)
            .arg(&a.plan_count)
            .arg(&a.stats);
        let cfg = LaunchConfig {
            grid_dim: (a.reqs + 1, 1, 1),
            block_dim: (KV_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_resolve; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(tierkit_kv_resolve)"))?;
        Ok(())
    }

    /// Replays plan segments into layers `l0 .. l0 + nl` (asynchronous): `segments` blocks, block `b`
    /// copies `plan[b * stride ..][.. count[b]]` (the resolve's output layout with
    /// `stride = hot_rows`), a warp per row from the mapped host store.
    ///
    /// # Safety
    /// `plan` holds `segments × stride` [`KvCopy`] and `count` `segments` u32 on the device; the
    /// plan's destination rows still hold its positions (see [`KvResolveGpu::check_plan_async`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn replay_async(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.replay_launch(stream, plan, count, segments, stride, l0, nl, 0) }
    }

    /// Counts plan entries whose destination row no longer holds the position into the
    /// `stale_plan` error word (asynchronous; copies nothing).
    ///
    /// # Safety
    /// As [`KvResolveGpu::replay_async`].
    pub unsafe fn check_plan_async(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.replay_launch(stream, plan, count, segments, stride, 0, 1, 1) }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn replay_launch(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
        check: u32,
    ) -> Result<()> {
        self.check_layers(l0, nl)?;
        if segments == 0 {
            return Ok(());
        }
        let d = self.dims;
        let t = self.tables();
        let mut b = stream.launch_builder(&self.f_replay);
        b.arg(&d)
            .arg(&t)
            .arg(&plan)
            .arg(&count)
            .arg(&stride)
            .arg(&l0)
            .arg(&nl)
            .arg(&check);
        let cfg = LaunchConfig {
            grid_dim: (segments, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_replay; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(tierkit_kv_replay)"))?;
        Ok(())
    }

    /// Launches the candidate prefetch (asynchronous; run it on a side stream ordered by events
    /// after the step's resolve and before the layers that need it). Block `b` handles request slot
    /// `slots[b]` with candidates `cand[b * stride ..][.. cand_count[b]]`: hits are pinned for the
    /// current call, misses (first appearance order) take CLOCK victims while any is evictable and
    /// are copied into layers `l0 .. l0 + nl`. Outputs as the resolve's plan (`plan[b * hot_rows]`).
    ///
    /// # Safety
    /// Device buffers of the documented shapes; no resolve of the same slots in flight.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn prefetch_async(
        &self,
        stream: &CudaStream,
        slots: u64,
        cand: u64,
        cand_count: u64,
        requests: u32,
        stride: u32,
        l0: u32,
        nl: u32,
        plan: u64,
        plan_count: u64,
    ) -> Result<()> {
        self.check_layers(l0, nl)?;
        if requests == 0 {
            return Ok(());
        }
        let d = self.dims;
        let t = self.tables();
        let mut b = stream.launch_builder(&self.f_prefetch);
        b.arg(&d)
            .arg(&t)
            .arg(&slots)
            .arg(&cand)
            .arg(&cand_count)
            .arg(&stride)
            .arg(&l0)
            .arg(&nl)
            .arg(&plan)
            .arg(&plan_count);
        let cfg = LaunchConfig {
            grid_dim: (requests, 1, 1),
            block_dim: (KV_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_prefetch; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(tierkit_kv_prefetch)"))?;
        Ok(())
    }

    /// Writes arena rows back to the host store (asynchronous, ordered on `stream` after the
    /// kernels that produced them, no host sync): `items[i] = (slot, position, src arena row)`,
    /// layers `l0 .. l0 + nl`, a warp per row with 16-byte stores into mapped pinned memory.
    /// Entries out of range are skipped and counted as `bad_request`.
    ///
    /// # Safety
    /// `items` holds `n` [`KvCopy`] on the device; the host must not read the rows until the
    /// stream passes this launch.
    pub unsafe fn write_back_async(
        &self,
        stream: &CudaStream,
        items: u64,
        n: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        self.check_layers(l0, nl)?;
        if n == 0 {
            return Ok(());
        }
        let d = self.dims;
        let t = self.tables();
        let warps = n as u64 * nl as u64;
        let blocks = warps.div_ceil(8);
        if blocks > i32::MAX as u64 {
            return Err(CudaError::OutOfRange {
                what: "write-back rows",
                value: warps,
                limit: i32::MAX as u64,
            });
        }
        let mut b = stream.launch_builder(&self.f_write_back);
        b.arg(&d).arg(&t).arg(&items).arg(&n).arg(&l0).arg(&nl);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_write_back; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(tierkit_kv_write_back)"))?;
        Ok(())
    }

    /// The DMA back-end: copies `copies` (host list: `(slot, position, dst_row)`) from the pinned host
    /// store into layers `l0 .. l0 + nl` with one `cuMemcpyBatchAsync` (one descriptor per row and
    /// layer, source order = stream order).
    ///
    /// # Errors
    /// `OutOfRange` for entries outside the tables; the driver's error (e.g.
    /// `CUDA_ERROR_NOT_SUPPORTED` on drivers before 12.8).
    pub fn dma_copy_async(
        &self,
        stream: &CudaStream,
        copies: &[KvCopy],
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        self.dma_copy_async_with(stream, copies, l0, nl, true)
    }

    /// [`KvResolveGpu::dma_copy_async`] with the copy hint chosen: `prefer_overlap = true` sets
    /// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE` (the default of `dma_copy_async`), `false` leaves
    /// the driver's default.
    pub fn dma_copy_async_with(
        &self,
        stream: &CudaStream,
        copies: &[KvCopy],
        l0: u32,
        nl: u32,
        prefer_overlap: bool,
    ) -> Result<()> {
        self.check_layers(l0, nl)?;
        let d = self.dims;
        if copies.is_empty() {
            return Ok(());
        }
        let n = copies.len() * nl as usize;
        let mut dsts = Vec::with_capacity(n);
        let mut srcs = Vec::with_capacity(n);
        let host = self.host.host_ptr() as u64;
        for l in l0..l0 + nl {
            for c in copies {
                if c.slot >= d.max_slots || c.position >= d.max_history || c.dst_row >= d.arena_rows
                {
                    return Err(CudaError::OutOfRange {
                        what: "DMA copy (slot, position or row)",
                        value: c.dst_row as u64,
                        limit: d.arena_rows as u64,
                    });
                }
                dsts.push(
                    self.arena.device_ptr()
                        + (l as usize * d.plane_bytes() + c.dst_row as usize * d.row_bytes as usize)
                            as u64,
                );
                srcs.push(host + d.host_offset(c.slot, c.position, l) as u64);
            }
        }
        let mut sizes = vec![d.row_bytes as usize; n];
        // SAFETY: zero-initialised C struct; every field we rely on is set below.
        let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
        attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        attr.srcLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST;
        attr.dstLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        attr.flags = if prefer_overlap {
            sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32
        } else {
            sys::CUmemcpyFlags::CU_MEMCPY_FLAG_DEFAULT as u32
        };
        let mut idx = [0usize];
        self.bind()?;
        // SAFETY: `dsts`/`srcs`/`sizes` hold `n` entries each; every source lies inside the pinned
        // host store and every destination inside the arena (checked above); the arrays are read
        // during the call (the driver copies the descriptors), the pinned memory outlives the copy
        // (owned by self; the caller keeps self alive until the stream passes the copy).
        unsafe {
            sys::cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                &mut attr,
                idx.as_mut_ptr(),
                1,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(drv("cuMemcpyBatchAsync"))
    }

    /// Baseline of a fully resident cache (what an engine without tiering runs): positions → rows
    /// through a block table (`int32 [reqs][max_blocks]`), `-1` for invalid picks. Asynchronous.
    ///
    /// # Safety
    /// Device buffers of the documented shapes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn resident_indices_async(
        &self,
        stream: &CudaStream,
        topk: u64,
        qsl: u64,
        seq_lens: u64,
        block_table: u64,
        max_blocks: u32,
        page_rows: u32,
        reqs: u32,
        k: u32,
        indices: u64,
        valid_count: u64,
    ) -> Result<()> {
        if reqs == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.f_resident);
        b.arg(&topk)
            .arg(&qsl)
            .arg(&seq_lens)
            .arg(&block_table)
            .arg(&max_blocks)
            .arg(&page_rows)
            .arg(&reqs)
            .arg(&k)
            .arg(&indices)
            .arg(&valid_count);
        let cfg = LaunchConfig {
            grid_dim: (reqs, 1, 1),
            block_dim: (KV_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_resident_indices.
        unsafe { b.launch(cfg) }
            .map_err(launch_err("cuLaunchKernel(tierkit_kv_resident_indices)"))?;
        Ok(())
    }

    /// Sparse-attention stand-in (gather + dot) over plane `layer`: for each query row, the mean over
    /// its valid picks of `dot(row bytes, q)`; `q` is `f32 [row_bytes]`, `out` `f32 [rows]`.
    /// Needs `row_bytes % 16 == 0`. Asynchronous.
    ///
    /// # Safety
    /// Device buffers of the documented shapes; `indices` hold rows inside the arena or `-1`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attend_async(
        &self,
        stream: &CudaStream,
        layer: u32,
        indices: u64,
        valid_count: u64,
        rows: u32,
        k: u32,
        q: u64,
        out: u64,
    ) -> Result<()> {
        let rb = self.dims.row_bytes;
        if !rb.is_multiple_of(16) {
            return Err(CudaError::Shape {
                what: "row_bytes (multiple of 16 for the attention stand-in)",
                expected: rb.next_multiple_of(16) as u64,
                got: rb as u64,
            });
        }
        if rows == 0 {
            return Ok(());
        }
        let plane = self.plane_ptr(layer)?;
        let mut b = stream.launch_builder(&self.f_attend);
        b.arg(&plane)
            .arg(&rb)
            .arg(&indices)
            .arg(&valid_count)
            .arg(&k)
            .arg(&q)
            .arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: rb * 4,
        };
        // SAFETY: argument list matches tierkit_kv_attend.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(tierkit_kv_attend)"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel_structs() {
        assert_eq!(std::mem::size_of::<KvDims>(), 48);
        assert_eq!(std::mem::size_of::<KvSlotDesc>(), 32);
        assert_eq!(std::mem::size_of::<KvCopy>(), 16);
        assert_eq!(std::mem::size_of::<KvTables>(), 13 * 8);
    }

    #[test]
    fn dims_validation_is_typed() {
        let d = KvDims {
            row_bytes: 656,
            layers: 2,
            page_rows: 64,
            hot_rows: 4096,
            tail_rows: 128,
            scratch_rows: 8,
            fixed_pages: 67,
            max_slots: 4,
            max_history: 1000,
            max_pages: 16,
            arena_rows: 64 * 1000,
            pad0: 0,
        };
        d.validate().unwrap();
        assert!(matches!(
            KvDims {
                fixed_pages: 10,
                ..d
            }
            .validate(),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            KvDims { max_pages: 1, ..d }.validate(),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            KvDims { hot_rows: 0, ..d }.validate(),
            Err(CudaError::OutOfRange {
                what: "hot_rows",
                ..
            })
        ));
        assert_eq!(d.host_offset(1, 2, 1), ((1000 + 2) * 2 + 1) * 656);
    }
}
