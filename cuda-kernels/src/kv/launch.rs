//! [`KvKernels`]: the loaded KV kernels and their typed launchers. Every launcher is asynchronous
//! on the given stream and takes the caller's tables ([`KvTables`]) and their extents ([`KvDims`]);
//! none keeps state between calls, so a launch sequence is CUDA-graph capturable.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::abi::{
    KvCall, KV_CLASSIC_BLOCK, KV_LEAN512_BLOCK, KV_LEAN_BLOCK, KV_LEAN_MAX_FIXED_PAGES,
    KV_LEAN_MAX_HOT_ROWS, KV_LEAN_VICTIM_MAX, KV_REPLAY_CHECK, KV_REPLAY_COPY, KV_REPLAY_FRESH,
};
use super::fastdiv::KvDivs;
use super::{
    CopyBackend, KvCopy, KvDims, KvResolveArgs, KvResolveOptions, KvTables, ResolveEngine,
    KV_LAYOUT_PACKED, KV_MODULE,
};
use crate::device::Gpu;
use crate::error::{drv, CudaError, Result};
use crate::raw;

/// The fused resolve, replay / check-plan, prefetch and write-back kernels of `kv_resolve.cu`,
/// compiled for one [`Gpu`] (NVRTC at first use, cached per context).
#[derive(Debug, Clone)]
pub struct KvKernels {
    gpu: Arc<Gpu>,
    resolve: CudaFunction,
    resolve_lean: CudaFunction,
    resolve_lean512: CudaFunction,
    replay: CudaFunction,
    prefetch: CudaFunction,
    write_back: CudaFunction,
    fill_words: CudaFunction,
}

/// Checks a layer range `l0 .. l0 + nl` against `d.layers` (`OutOfRange` otherwise, and for `nl == 0`).
fn check_layers(d: &KvDims, l0: u32, nl: u32) -> Result<()> {
    if nl == 0 || l0 as u64 + nl as u64 > d.layers as u64 {
        return Err(CudaError::OutOfRange {
            what: "layer range end",
            value: l0 as u64 + nl as u64,
            limit: d.layers as u64 + 1,
        });
    }
    Ok(())
}

impl KvKernels {
    /// Loads the kernels on `gpu`.
    ///
    /// # Errors
    /// NVRTC compile errors and CUDA errors of the module load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(KvKernels {
            resolve: gpu.function(&KV_MODULE, "tierkit_kv_resolve")?,
            resolve_lean: gpu.function(&KV_MODULE, "tierkit_kv_resolve_lean")?,
            resolve_lean512: gpu.function(&KV_MODULE, "tierkit_kv_resolve_lean512")?,
            replay: gpu.function(&KV_MODULE, "tierkit_kv_replay")?,
            prefetch: gpu.function(&KV_MODULE, "tierkit_kv_prefetch")?,
            write_back: gpu.function(&KV_MODULE, "tierkit_kv_write_back")?,
            fill_words: gpu.function(&KV_MODULE, "tierkit_kv_fill_words")?,
            gpu: gpu.clone(),
        })
    }

    /// The GPU the kernels were loaded on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Launches the fused resolve on `stream` with the default options (in-place rows, per-session
    /// bounds, outputs of exactly `rows × k` / `rows`): [`KvKernels::resolve_async_with`] with
    /// [`KvResolveOptions::default`].
    ///
    /// # Errors
    /// As [`KvKernels::resolve_async_with`].
    ///
    /// # Safety
    /// As [`KvKernels::resolve_async_with`].
    pub unsafe fn resolve_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        a: &KvResolveArgs,
        backend: CopyBackend,
    ) -> Result<()> {
        // SAFETY: forwarded; the default options name no extra buffer.
        unsafe { self.resolve_async_with(stream, d, t, a, &KvResolveOptions::default(), backend) }
    }

    /// Launches the fused resolve on `stream` (graph capturable: only `t`, the buffers of `a` and
    /// `o.query_seq_lens` are read and written): the 512-thread lean kernel for decode-shaped
    /// calls, the 1024-thread one otherwise (`8 × ⌈hot_rows / 32⌉ + 4 × fixed_pages` bytes of
    /// dynamic shared memory, `2 × hot_rows` more up to 8192 hot rows), the classic kernel (512
    /// threads, no dynamic shared memory) for tables over 65,536 hot rows or 4,096 fixed pages;
    /// results are identical (`DESIGN.md`, "The resolve engine"). Grid `a.sessions + 1` blocks; `backend == Gather` copies the misses into layers `a.layer ..
    /// a.layer + max(o.fill_layers, 1)` inside the kernel (a layer group's planes), `Dma`
    /// leaves them in the plan for [`KvKernels::dma_copy_async`]. `o` selects the row layout
    /// (FlashMLA `topk_length`-compatible packing or in place), per-query causal bounds and
    /// oversized (padded) output buffers; see [`KvResolveOptions`] and the KV resolve kernel
    /// contract in `DESIGN.md`.
    ///
    /// # Errors
    /// `OutOfRange` for the layer range, `o.layout` or a row width `k × block_positions` over
    /// `i32::MAX`, `Shape` for `a.k == 0` or output lengths (`o.indices_len`, `o.valid_len`,
    /// `o.plan_count_len`) below `rows × k × block_positions` / `rows` / `sessions`, the driver's
    /// launch error.
    ///
    /// # Safety
    /// `t` holds live device buffers of the shapes [`KvTables`] lists for `d`; every pointer of `a`
    /// addresses a live device buffer of the documented shape (`indices` of `o.indices_len`
    /// entries and `valid_count` of `o.valid_len` when those are non-zero); `o.query_seq_lens` is
    /// 0 or a live `int32 [rows]`; no other stream touches the tables or the hot rows while the
    /// kernel runs.
    pub unsafe fn resolve_async_with(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        a: &KvResolveArgs,
        o: &KvResolveOptions,
        backend: CopyBackend,
    ) -> Result<()> {
        let fill_layers = o.fill_layers.max(1);
        check_layers(d, a.layer, fill_layers)?;
        if a.k == 0 {
            return Err(CudaError::Shape {
                what: "k",
                expected: 1,
                got: 0,
            });
        }
        if o.layout > KV_LAYOUT_PACKED {
            return Err(CudaError::OutOfRange {
                what: "output layout",
                value: o.layout as u64,
                limit: KV_LAYOUT_PACKED as u64 + 1,
            });
        }
        // Block ids: each of a row's k entries stands for `block` positions (the output columns).
        let block = o.block_positions.max(1);
        let width = a.k as u64 * block as u64;
        if width > i32::MAX as u64 {
            return Err(CudaError::OutOfRange {
                what: "output row width k × block_positions",
                value: width,
                limit: i32::MAX as u64 + 1,
            });
        }
        let width = width as u32;
        let picks = a.rows as u64 * width as u64;
        let indices_len = output_len(
            o.indices_len,
            picks,
            "indices entries (at least rows × k × block_positions)",
        )?;
        let valid_len = output_len(
            o.valid_len,
            a.rows as u64,
            "valid_count entries (at least rows)",
        )?;
        let plan_count_len = output_len(
            o.plan_count_len,
            a.sessions as u64,
            "plan_count entries (at least sessions)",
        )?;
        // Gather: the kernel copies the misses into the `fill_layers` planes from `a.layer`.
        let fetch = if backend == CopyBackend::Gather {
            fill_layers
        } else {
            0
        };
        let fits = d.hot_rows <= KV_LEAN_MAX_HOT_ROWS && d.fixed_pages <= KV_LEAN_MAX_FIXED_PAGES;
        // Candidate bitmaps (2 × ceil(hot_rows / 32) u32), then the entry's fixed pages.
        let smem = 8 * d.hot_rows.div_ceil(32) + 4 * d.fixed_pages;
        // The lean kernels' rank -> victim table (u16 per hot row) up to KV_LEAN_VICTIM_MAX hot rows.
        let lean_smem = smem
            + if d.hot_rows <= KV_LEAN_VICTIM_MAX {
                2 * d.hot_rows
            } else {
                0
            };
        #[cfg(feature = "test-hooks")]
        let engine = o.engine;
        #[cfg(not(feature = "test-hooks"))]
        let engine = ResolveEngine::Auto;
        let (func, threads, smem) = match engine.for_call(a.rows, a.sessions, width) {
            ResolveEngine::Lean if fits => (&self.resolve_lean, KV_LEAN_BLOCK, lean_smem),
            ResolveEngine::Lean512 if fits => (&self.resolve_lean512, KV_LEAN512_BLOCK, lean_smem),
            _ => (&self.resolve, KV_CLASSIC_BLOCK, 0),
        };
        // page_rows, tail_rows, the row width and the block as multipliers (the lean engine
        // divides by them per pick), and the batch shape the lean engine guesses its picks from.
        let divs = KvDivs::new(d.page_rows, d.tail_rows, width, a.rows, a.sessions, threads)
            .with_block(block);
        let call = KvCall {
            topk: a.topk,
            qsl: a.query_start_loc,
            seq_lens: a.seq_lens,
            session_slot: a.session_slot,
            indices: a.indices,
            valid_count: a.valid_count,
            plan: a.plan,
            plan_count: a.plan_count,
            stats: a.stats,
            qseq: o.query_seq_lens,
            idx_len: indices_len,
            valid_len,
            pc_len: plan_count_len,
            sessions: a.sessions,
            rows: a.rows,
            k: width,
            layer: a.layer,
            fetch,
            layout: o.layout,
            block,
            topk_k: a.k,
        };
        let mut b = stream.launch_builder(func);
        b.arg(d).arg(t).arg(&call).arg(&divs);
        let cfg = LaunchConfig {
            grid_dim: (a.sessions + 1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the argument list matches tierkit_kv_resolve / _lean / _lean512 (KvDims, KvTables,
        // KvCall, KvDivs by value, `repr(C)` as in kv_abi.cuh); the lean kernels' dynamic shared
        // memory holds their two bitmaps of ceil(hot_rows / 32) words, the fixed pages and the u16
        // victim table when hot_rows <= KV_LEAN_VICTIM_MAX (its condition in the kernel); the
        // classic kernel needs none; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_kv_resolve)"))?;
        Ok(())
    }

    /// Replays plan segments into layers `l0 .. l0 + nl`: `segments` blocks, block `b` copies
    /// `plan[b * stride ..][.. count[b]]` (the resolve's output layout with `stride = hot_rows`), a
    /// warp per row from the mapped host store.
    ///
    /// # Errors
    /// `OutOfRange` for the layer range, the driver's launch error.
    ///
    /// # Safety
    /// As [`KvKernels::resolve_async`] for `t`; `plan` holds `segments × stride` [`KvCopy`] and
    /// `count` `segments` u32 on the device; the plan's destination rows still hold its positions
    /// (see [`KvKernels::check_plan_async`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn replay_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.replay_launch(
                stream,
                d,
                t,
                plan,
                count,
                segments,
                stride,
                l0,
                nl,
                KV_REPLAY_COPY,
            )
        }
    }

    /// Replays plan segments into layers `l0 .. l0 + nl` as [`KvKernels::replay_async`] does,
    /// copying each entry only where its destination row still holds its position in `t`'s hot
    /// tables (a plan replayed into its own layer group); every other entry (stale, or a plan of
    /// another group, whose rows hold other positions in these planes) is skipped and counted in
    /// the `stale_plan` error word. What engines replay with.
    ///
    /// # Errors
    /// `OutOfRange` for the layer range, the driver's launch error.
    ///
    /// # Safety
    /// As [`KvKernels::replay_async`], without the freshness precondition.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn replay_fresh_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.replay_launch(
                stream,
                d,
                t,
                plan,
                count,
                segments,
                stride,
                l0,
                nl,
                KV_REPLAY_FRESH,
            )
        }
    }

    /// Counts plan entries whose destination row no longer holds the position into the
    /// `stale_plan` error word (copies nothing).
    ///
    /// # Errors
    /// The driver's launch error.
    ///
    /// # Safety
    /// As [`KvKernels::replay_async`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn check_plan_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe {
            self.replay_launch(
                stream,
                d,
                t,
                plan,
                count,
                segments,
                stride,
                0,
                1,
                KV_REPLAY_CHECK,
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn replay_launch(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
        check: u32,
    ) -> Result<()> {
        check_layers(d, l0, nl)?;
        if segments == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.replay);
        b.arg(d)
            .arg(t)
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
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_kv_replay)"))?;
        Ok(())
    }

    /// Launches the candidate prefetch (run it on a side stream ordered by events after the step's
    /// resolve and before the layers that need it). Block `b` handles session slot `slots[b]` with
    /// candidates `cand[b * stride ..][.. cand_count[b]]`: hits are pinned for the current call,
    /// misses (first appearance order) take CLOCK victims while any is evictable and are copied into
    /// layers `l0 .. l0 + nl`. Outputs as the resolve's plan (`plan[b * hot_rows]`, `plan_count[b]`).
    ///
    /// # Errors
    /// `OutOfRange` for the layer range, the driver's launch error.
    ///
    /// # Safety
    /// As [`KvKernels::resolve_async`] for `t`; `slots` `i32 [sessions]`, `cand`
    /// `i32 [sessions][stride]`, `cand_count` `u32 [sessions]`, `plan` `KvCopy [sessions][hot_rows]`,
    /// `plan_count` `u32 [sessions]` on the device; no resolve of the same slots in flight.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn prefetch_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        slots: u64,
        cand: u64,
        cand_count: u64,
        sessions: u32,
        stride: u32,
        l0: u32,
        nl: u32,
        plan: u64,
        plan_count: u64,
    ) -> Result<()> {
        check_layers(d, l0, nl)?;
        if sessions == 0 {
            return Ok(());
        }
        let mut b = stream.launch_builder(&self.prefetch);
        b.arg(d)
            .arg(t)
            .arg(&slots)
            .arg(&cand)
            .arg(&cand_count)
            .arg(&stride)
            .arg(&l0)
            .arg(&nl)
            .arg(&plan)
            .arg(&plan_count);
        let cfg = LaunchConfig {
            grid_dim: (sessions, 1, 1),
            block_dim: (KV_CLASSIC_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_prefetch; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_kv_prefetch)"))?;
        Ok(())
    }

    /// Writes arena rows back to the host store (ordered on `stream` after the kernels that
    /// produced them, no host sync): `items[i] = (slot, position, src arena row)`, layers
    /// `l0 .. l0 + nl`, a warp per row with 16-byte stores into mapped pinned memory. Entries out of
    /// range are skipped and counted as `bad_session`.
    ///
    /// # Errors
    /// `OutOfRange` for the layer range or more than `i32::MAX` blocks, the driver's launch error.
    ///
    /// # Safety
    /// As [`KvKernels::resolve_async`] for `t`; `items` holds `n` [`KvCopy`] on the device; the host
    /// must not read the rows until the stream passes this launch.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_back_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        items: u64,
        n: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        check_layers(d, l0, nl)?;
        if n == 0 {
            return Ok(());
        }
        let warps = n as u64 * nl as u64;
        let blocks = warps.div_ceil(8);
        if blocks > i32::MAX as u64 {
            return Err(CudaError::OutOfRange {
                what: "write-back rows",
                value: warps,
                limit: i32::MAX as u64,
            });
        }
        let mut b = stream.launch_builder(&self.write_back);
        b.arg(d).arg(t).arg(&items).arg(&n).arg(&l0).arg(&nl);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_write_back; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_kv_write_back)"))?;
        Ok(())
    }

    /// Table patches (`tierkit_kv_fill_words`): block `b` sets `fills[b].count` `u32` words at
    /// `fills[b].dst` to `fills[b].value`, in any order across blocks, ordered on `stream` with
    /// the kernels before and after it (graph capturable). `fills` may live in mapped pinned host
    /// memory (its device address): nothing is uploaded first.
    ///
    /// # Errors
    /// `OutOfRange` for `n > i32::MAX`, the driver's launch error.
    ///
    /// # Safety
    /// `fills` holds `n` [`super::KvFill`] readable by the device until the stream passes the launch;
    /// each names words inside a live device allocation no other stream touches meanwhile; no two
    /// entries name one word with different values.
    pub unsafe fn fill_words_async(&self, stream: &CudaStream, fills: u64, n: u32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n > i32::MAX as u32 {
            return Err(CudaError::OutOfRange {
                what: "table patches",
                value: n as u64,
                limit: i32::MAX as u64,
            });
        }
        let mut b = stream.launch_builder(&self.fill_words);
        b.arg(&fills).arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches tierkit_kv_fill_words; buffers per the caller's contract.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_kv_fill_words)"))?;
        Ok(())
    }

    /// The DMA back-end: copies `copies` (host list of `(slot, position, dst_row)`) from the pinned
    /// host store into layers `l0 .. l0 + nl` of the arena with one `cuMemcpyBatchAsync` (one
    /// descriptor per row and layer, layer-major, source order = stream order; two for a
    /// [`KV_FMT_PAGED_SPLIT`](super::KV_FMT_PAGED_SPLIT) row: its value, then its scale).
    /// `prefer_overlap = true` sets `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`, `false` leaves
    /// the driver's default.
    ///
    /// # Errors
    /// `OutOfRange` for the layer range or entries outside the tables (nothing is copied); the
    /// driver's error (e.g. `CUDA_ERROR_NOT_SUPPORTED` on drivers before 12.8).
    ///
    /// # Safety
    /// `t.arena` is a live device arena of `d`'s shape; `host_store` is the host address of the
    /// pinned host store `u8 [max_slots][max_history][layers][row_bytes]`; both stay allocated until
    /// the stream passes the copy.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dma_copy_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        host_store: *const u8,
        copies: &[KvCopy],
        l0: u32,
        nl: u32,
        prefer_overlap: bool,
    ) -> Result<()> {
        check_layers(d, l0, nl)?;
        if copies.is_empty() {
            return Ok(());
        }
        let n = copies.len() * nl as usize * if d.scale_bytes != 0 { 2 } else { 1 };
        let mut dsts = Vec::with_capacity(n);
        let mut srcs = Vec::with_capacity(n);
        let mut sizes = Vec::with_capacity(n);
        let host = host_store as u64;
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
                // The row's segments (KvDims::row_segs): one descriptor for the value, one more
                // for a paged split row's scale (host `value ‖ scale` to two arena places).
                let plane = t.arena + (l as usize * d.plane_bytes()) as u64;
                let (v, s) = d.row_segs(c.dst_row);
                let src = host + d.host_offset(c.slot, c.position, l) as u64;
                dsts.push(plane + v);
                srcs.push(src);
                sizes.push(d.value_bytes as usize);
                if d.scale_bytes != 0 {
                    dsts.push(plane + s);
                    srcs.push(src + d.value_bytes as u64);
                    sizes.push(d.scale_bytes as usize);
                }
            }
        }
        self.gpu
            .ctx()
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: three arrays of `n` entries; every source lies inside the pinned host store and
        // every destination inside the arena (rows and layers checked above; a row's segments lie
        // inside its plane by `KvDims::validate`'s format checks), alive per the caller's contract; the
        // context is bound above.
        unsafe { raw::memcpy_batch_async(&mut dsts, &mut srcs, &mut sizes, stream, prefer_overlap) }
    }

    /// Page fills by the copy engines: `copies` (host list of `(slot, position, dst_row)`, every
    /// layer of each row) coalesced into runs of consecutive positions of one slot landing on
    /// consecutive arena rows (`coalesce_runs`), each run one descriptor of `rows × row_bytes`
    /// bytes in one `cuMemcpyBatchAsync` on `stream` (with the overlap-with-compute hint). With one
    /// layer the host store holds a run's rows back to back, exactly as the arena plane does; with
    /// more layers a token's layers are interleaved in the host store, and a paged split row
    /// ([`KV_FMT_PAGED_SPLIT`](super::KV_FMT_PAGED_SPLIT)) is two extents per page, so for
    /// either this returns `Ok(None)` without copying and the caller uses the gather kernel
    /// ([`KvKernels::replay_async`]). Returns the number of descriptors.
    ///
    /// # Errors
    /// `OutOfRange` for entries outside the tables (nothing is copied); the driver's error.
    ///
    /// # Safety
    /// As [`KvKernels::dma_copy_async`].
    pub unsafe fn dma_runs_async(
        &self,
        stream: &CudaStream,
        d: &KvDims,
        t: &KvTables,
        host_store: *const u8,
        copies: &[KvCopy],
    ) -> Result<Option<usize>> {
        // A paged split run is two strided extents per page (values, scales) on the arena side:
        // left to the gather kernel (cuda-kernels/DESIGN.md, "Row formats").
        if d.layers != 1 || d.fmt != super::KV_FMT_CONTIGUOUS {
            return Ok(None);
        }
        if copies.is_empty() {
            return Ok(Some(0));
        }
        let runs = coalesce_runs(copies);
        let (mut dsts, mut srcs, mut sizes) = (
            Vec::with_capacity(runs.len()),
            Vec::with_capacity(runs.len()),
            Vec::with_capacity(runs.len()),
        );
        let host = host_store as u64;
        for &(c, rows) in &runs {
            if c.slot >= d.max_slots
                || c.position as u64 + rows as u64 > d.max_history as u64
                || c.dst_row as u64 + rows as u64 > d.arena_rows as u64
            {
                return Err(CudaError::OutOfRange {
                    what: "DMA fill run (slot, positions or rows)",
                    value: c.dst_row as u64 + rows as u64,
                    limit: d.arena_rows as u64,
                });
            }
            dsts.push(t.arena + c.dst_row as u64 * d.row_bytes as u64);
            srcs.push(host + d.host_offset(c.slot, c.position, 0) as u64);
            sizes.push(rows as usize * d.row_bytes as usize);
        }
        self.gpu
            .ctx()
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: three arrays of `runs.len()` entries; every run lies inside the pinned host
        // store (one layer: positions position .. + rows of one slot are contiguous) and inside
        // plane 0 of the arena (checked above); alive per the caller's contract.
        unsafe { raw::memcpy_batch_async(&mut dsts, &mut srcs, &mut sizes, stream, true) }?;
        Ok(Some(runs.len()))
    }
}

/// Groups row copies into maximal runs `(first copy, rows)`: after sorting by `(slot, position)`,
/// a copy extends the run before it when it has the same slot, the next position and the next
/// arena row. The copies' order does not matter to a fill (distinct destinations); duplicates
/// (the same slot and position twice) start a new run.
pub(crate) fn coalesce_runs(copies: &[KvCopy]) -> Vec<(KvCopy, u32)> {
    let mut sorted = copies.to_vec();
    sorted.sort_by_key(|c| (c.slot, c.position, c.dst_row));
    let mut runs: Vec<(KvCopy, u32)> = Vec::new();
    for c in sorted {
        if let Some((first, rows)) = runs.last_mut() {
            if first.slot == c.slot
                && first.position as u64 + *rows as u64 == c.position as u64
                && first.dst_row as u64 + *rows as u64 == c.dst_row as u64
            {
                *rows += 1;
                continue;
            }
        }
        runs.push((c, 1));
    }
    runs
}

/// The entries of an output buffer given as `given` (0 = exactly `need`); fewer than `need` is a
/// `Shape` error naming `what`.
fn output_len(given: u64, need: u64, what: &'static str) -> Result<u64> {
    let len = if given == 0 { need } else { given };
    if len < need {
        return Err(CudaError::Shape {
            what,
            expected: need,
            got: len,
        });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn c(slot: u32, position: u32, dst_row: u32) -> KvCopy {
        KvCopy::new(slot, position, dst_row)
    }

    #[test]
    fn runs_join_consecutive_positions_on_consecutive_rows_only() {
        // Page 5 (rows 320..) then page 2 (rows 128..) of slot 1, listed out of order; slot 0's
        // two rows on consecutive positions but not consecutive rows; a duplicate position.
        let mut copies = Vec::new();
        for i in 0..64 {
            copies.push(c(1, 64 + i, 128 + i));
        }
        for i in 0..64 {
            copies.push(c(1, i, 320 + i));
        }
        copies.push(c(0, 7, 10));
        copies.push(c(0, 8, 12));
        copies.push(c(0, 7, 10));
        copies.reverse();
        let runs = coalesce_runs(&copies);
        assert_eq!(
            runs,
            vec![
                (c(0, 7, 10), 1),
                (c(0, 7, 10), 1),
                (c(0, 8, 12), 1),
                (c(1, 0, 320), 64),
                (c(1, 64, 128), 64),
            ]
        );
        // Pages that follow each other in the arena make one run.
        let long: Vec<KvCopy> = (0..500).map(|i| c(3, 1000 + i, 64 + i)).collect();
        assert_eq!(coalesce_runs(&long), vec![(c(3, 1000, 64), 500)]);
        assert!(coalesce_runs(&[]).is_empty());
    }

    #[test]
    fn output_lengths_default_to_the_need_and_refuse_less() {
        assert_eq!(output_len(0, 4, "x").unwrap(), 4);
        assert_eq!(output_len(9, 4, "x").unwrap(), 9);
        assert!(matches!(
            output_len(3, 4, "plan_count entries (at least sessions)"),
            Err(CudaError::Shape {
                expected: 4,
                got: 3,
                ..
            })
        ));
    }
}
