//! Expert pick counting: the CPU reference, the standalone counting kernel and the GPU counter
//! table with its asynchronous drain.
//!
//! Counts `topk_ids` (`[tokens, k]` for one layer or `[layers, tokens, k]` for a whole step,
//! int32 or int64) into the `layers × experts` u32 table of `expert-residency` (row-major
//! `[layer][expert]`, cumulative, wrapping at 2^32). Picks with an expert id outside
//! `0..experts` are never written: they are counted in a rejected-picks word the host reads at
//! the drain. The fused path is the header [`crate::EXPERT_COUNT_CUH`]: its recommended call,
//! `tierkit_count_pick_striped`, adds each pick at the end of the router into the warp's own
//! stripe, a copy of the table ([`PickCounterGpu::with_stripes`]); the drain folds the stripes
//! into the table. `tierkit_count_pick` adds to the table directly.
//!
//! ## The fused path in an engine
//!
//! Host side: `let counter = PickCounterGpu::with_stripes(&gpu, layers, experts, max_warps)?;`
//! pass `counter.stripes_ptr()`, `counter.num_stripes()`, `counter.table_ptr()` and
//! `counter.rejected_ptr()` to the router kernel (fixed addresses: safe to capture in a CUDA
//! graph), and every N steps call `counter.drain_async(&step_stream)?` then
//! `counter.poll_drain()?` (or `wait_drain`) and hand the snapshot to `expert-residency`. Device
//! side, at the end of the router kernel (after it stores `topk_ids`), from each lane that holds
//! a pick:
//!
//! ```text
//! #include "expert_count.cuh"   // cuda_kernels::EXPERT_COUNT_CUH
//! const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;  // 1-D blocks
//! const unsigned lane = threadIdx.x & 31;   // lane j < k holds the token's j-th pick here
//! if (lane < k && !is_padding_row)
//!     tierkit_count_pick_striped(stripes, num_stripes, warp, table, err,
//!                                layer, layers, (long long)my_pick, experts);
//! ```
//!
//! Cost on the H200 (stand-in routers, 40 layers × 256 tokens × top-6 of 64): 4.5–5.3 µs of GPU
//! time per 40-layer step, plus 2.8 µs per drain for the fold (`benches/README.md`).
//!
//! ## The cheapest exact path: the last router fused, the rest forked
//!
//! Where each MoE layer's router writes its `topk_ids` into its own slice of one
//! `[layers, tokens, k]` step buffer, only the LAST layer's router needs the fused call: right
//! before launching it, `counter.count_forked(&step_stream, &view_of_layers_before_last, 0)?`
//! counts the earlier layers on a branch stream that runs alongside it, and
//! `counter.join_forked(&step_stream)?` at the end of the step joins the branch (both capture
//! into a CUDA graph). Measured on the H200: 0.18–0.45 µs added per 40-layer step, exact after
//! every step (`benches/README.md`, "Forked count").

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::device::{Gpu, COUNT_MODULE};
use crate::error::{drv, CudaError, Result};
use crate::mem::{copy_dtoh_async, DeviceBuffer, PinnedBuffer};

/// Element type of `topk_ids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdsDtype {
    /// `int32` ids.
    I32,
    /// `int64` ids (PyTorch's default `topk` index dtype).
    I64,
}

impl IdsDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            IdsDtype::I32 => 4,
            IdsDtype::I64 => 8,
        }
    }
    /// Name as in PyTorch (`int32`, `int64`).
    pub fn name(self) -> &'static str {
        match self {
            IdsDtype::I32 => "int32",
            IdsDtype::I64 => "int64",
        }
    }
}

/// An integer type usable as a top-k id (`i32`, `i64`).
pub trait TopkId: bytemuck::Pod + Copy {
    /// The matching [`IdsDtype`].
    const DTYPE: IdsDtype;
    /// Widened value.
    fn as_i64(self) -> i64;
}
impl TopkId for i32 {
    const DTYPE: IdsDtype = IdsDtype::I32;
    fn as_i64(self) -> i64 {
        self as i64
    }
}
impl TopkId for i64 {
    const DTYPE: IdsDtype = IdsDtype::I64;
    fn as_i64(self) -> i64 {
        self
    }
}

/// Shape of a `topk_ids` buffer: `[layers, tokens, k]` (`layers = 1` for one layer's `[tokens, k]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkShape {
    /// Layers in the buffer (1 for a single layer's `[tokens, k]`).
    pub layers: u32,
    /// Tokens per layer.
    pub tokens: u32,
    /// Picks per token (top-k).
    pub k: u32,
}

impl TopkShape {
    /// One layer's `[tokens, k]`.
    pub fn layer(tokens: u32, k: u32) -> Self {
        TopkShape {
            layers: 1,
            tokens,
            k,
        }
    }
    /// A whole step's `[layers, tokens, k]`.
    pub fn step(layers: u32, tokens: u32, k: u32) -> Self {
        TopkShape { layers, tokens, k }
    }
    /// Total picks (elements).
    pub fn picks(&self) -> u64 {
        self.layers as u64 * self.tokens as u64 * self.k as u64
    }
}

/// A `topk_ids` buffer on the device given by raw pointer (e.g. a PyTorch tensor's
/// `data_ptr()`), with its dtype, shape and allocation size in bytes (checked against the shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkIdsView {
    /// Device pointer of element `[0, 0, 0]` (contiguous, row-major).
    pub ptr: u64,
    /// Bytes the caller owns at `ptr`.
    pub bytes: u64,
    /// Element type.
    pub dtype: IdsDtype,
    /// Shape.
    pub shape: TopkShape,
}

fn check_target(shape: TopkShape, layer0: u32, layers: u32) -> Result<()> {
    if shape.layers == 0 || shape.tokens == 0 || shape.k == 0 {
        return Err(CudaError::Shape {
            what: "topk_ids (an extent is zero)",
            expected: 1,
            got: 0,
        });
    }
    if layer0 as u64 + shape.layers as u64 > layers as u64 {
        return Err(CudaError::OutOfRange {
            what: "topk_ids layer range end (layer0 + layers)",
            value: layer0 as u64 + shape.layers as u64,
            limit: layers as u64 + 1,
        });
    }
    if shape.tokens as u64 * shape.k as u64 > u32::MAX as u64 {
        return Err(CudaError::OutOfRange {
            what: "tokens * k",
            value: shape.tokens as u64 * shape.k as u64,
            limit: u32::MAX as u64,
        });
    }
    Ok(())
}

/// CPU reference of the counting kernel: adds the picks of `ids` (shape `shape`, covering layers
/// `layer0 .. layer0 + shape.layers`) into `table` (`[layers][experts]` u32, wrapping adds) and
/// returns the number of rejected picks (id outside `0..experts`).
///
/// # Errors
/// [`CudaError::Shape`] if `ids` or `table` have the wrong length, [`CudaError::OutOfRange`] if
/// the layer range does not fit in `layers`. Nothing is written on error.
pub fn count_picks_cpu<I: TopkId>(
    ids: &[I],
    shape: TopkShape,
    layer0: u32,
    layers: u32,
    experts: u32,
    table: &mut [u32],
) -> Result<u32> {
    check_target(shape, layer0, layers)?;
    if ids.len() as u64 != shape.picks() {
        return Err(CudaError::Shape {
            what: "topk_ids",
            expected: shape.picks(),
            got: ids.len() as u64,
        });
    }
    let want = layers as u64 * experts as u64;
    if table.len() as u64 != want {
        return Err(CudaError::Shape {
            what: "count table (layers * experts)",
            expected: want,
            got: table.len() as u64,
        });
    }
    let per_layer = shape.tokens as usize * shape.k as usize;
    let mut rejected = 0u32;
    for (i, id) in ids.iter().enumerate() {
        let layer = layer0 as usize + i / per_layer;
        let e = id.as_i64();
        if e >= 0 && e < experts as i64 {
            let c = &mut table[layer * experts as usize + e as usize];
            *c = c.wrapping_add(1);
        } else {
            rejected = rejected.wrapping_add(1);
        }
    }
    Ok(rejected)
}

/// A drained copy of the counter table, borrowed from the pinned snapshot buffer.
#[derive(Debug, Clone, Copy)]
pub struct DrainSnapshot<'a> {
    /// Cumulative counts, `[layers][experts]` row-major (wrapping u32).
    pub counts: &'a [u32],
    /// Cumulative rejected picks (out-of-range ids) since the counter was created (wrapping).
    pub rejected: u32,
}

/// The GPU pick-counter table (`layers × experts` u32 + one rejected-picks word, one allocation)
/// with the counting kernels and an asynchronous drain to pinned host memory on a side stream.
///
/// Source: the SGLang/EPLB expert-load recorders (a device table bumped per pick), redesigned
/// after their faults: no batch-size cap (grid-stride loop), one launch per step, CUDA-graph-safe
/// fixed addresses, bad ids counted instead of written.
#[derive(Debug)]
pub struct PickCounterGpu {
    gpu: Arc<Gpu>,
    layers: u32,
    experts: u32,
    table: DeviceBuffer<u32>,
    snapshot: PinnedBuffer<u32>,
    drain_stream: Arc<CudaStream>,
    step_mark: CudaEvent,
    drain_done: CudaEvent,
    drain_pending: bool,
    f_i32: CudaFunction,
    f_i64: CudaFunction,
    /// Stripes of the fused path, u32 `[layers][num_stripes][experts]` (`None` when 0).
    stripes: Option<DeviceBuffer<u32>>,
    num_stripes: u32,
    f_fold: CudaFunction,
    /// Branch stream of [`PickCounterGpu::count_forked`], and its fork and join events.
    branch: Arc<CudaStream>,
    fork_mark: CudaEvent,
    join_mark: CudaEvent,
    fork_pending: bool,
    /// The capture state of the stream the pending fork was made on (`Capture::None` outside a
    /// capture; never `Invalidated`: count_forked refuses it).
    fork_capture: Capture,
}

/// Where a stream stands with CUDA graph capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capture {
    /// Not capturing.
    None,
    /// Part of the active capture with this id (ids are unique for the process's lifetime).
    Active(u64),
    /// Part of a capture invalidated by an error: it can never produce a graph.
    Invalidated,
}

/// The capture state of `stream` (`cuStreamGetCaptureInfo`).
fn capture_state(stream: &CudaStream) -> Result<Capture> {
    stream
        .context()
        .bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    // SAFETY: `stream` is a live stream of the bound context; the two out-pointers are valid
    // locals, and the optional outputs (graph, dependencies, edge data, count) are null, which
    // the driver accepts (only the status is required).
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(drv("cuStreamGetCaptureInfo"))?;
    // the id is defined only while the capture is active
    Ok(match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Capture::None,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Capture::Active(id),
        _ => Capture::Invalidated,
    })
}

/// Most u32 cells of the fused path's stripes buffer (`layers × stripes × experts`): 2^30, 4 GiB.
pub const MAX_STRIPE_CELLS: u64 = 1 << 30;

/// Validates a stripes geometry (before anything is allocated); returns its cells.
fn check_stripes(layers: u32, experts: u32, num_stripes: u32) -> Result<u64> {
    if num_stripes == 0 {
        return Err(CudaError::OutOfRange {
            what: "num_stripes (must be at least 1; use PickCounterGpu::new for none)",
            value: 0,
            limit: u32::MAX as u64,
        });
    }
    if layers > 65_535 {
        return Err(CudaError::OutOfRange {
            what: "layers (fold grid y)",
            value: layers as u64,
            limit: 65_536,
        });
    }
    let cells = layers as u64 * experts as u64 * num_stripes as u64;
    if cells > MAX_STRIPE_CELLS {
        return Err(CudaError::OutOfRange {
            what: "layers * experts * num_stripes (fused-path stripes)",
            value: cells,
            limit: MAX_STRIPE_CELLS + 1,
        });
    }
    Ok(cells)
}

/// CPU reference of `tierkit_fold_stripes`: `table[l][e] += Σ_s stripes[l][s][e]` (wrapping
/// u32), then every stripe cell is zeroed. `stripes`: `[layers][num_stripes][experts]`, `table`:
/// `[layers][experts]` (the rejected word, if present after the table, is left alone).
///
/// # Errors
/// [`CudaError::Shape`] if the slices do not match the geometry.
pub fn fold_stripes_cpu(
    stripes: &mut [u32],
    num_stripes: u32,
    layers: u32,
    experts: u32,
    table: &mut [u32],
) -> Result<()> {
    let (s, l, e) = (num_stripes as usize, layers as usize, experts as usize);
    if stripes.len() as u64 != l as u64 * s as u64 * e as u64 {
        return Err(CudaError::Shape {
            what: "stripes (layers * num_stripes * experts)",
            expected: l as u64 * s as u64 * e as u64,
            got: stripes.len() as u64,
        });
    }
    if table.len() < l * e {
        return Err(CudaError::Shape {
            what: "table (layers * experts)",
            expected: (l * e) as u64,
            got: table.len() as u64,
        });
    }
    for layer in 0..l {
        for stripe in 0..s {
            let row = &mut stripes[(layer * s + stripe) * e..(layer * s + stripe + 1) * e];
            for (t, c) in table[layer * e..(layer + 1) * e]
                .iter_mut()
                .zip(row.iter_mut())
            {
                *t = t.wrapping_add(*c);
                *c = 0;
            }
        }
    }
    Ok(())
}

impl PickCounterGpu {
    /// A zeroed counter for `layers × experts`.
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] for a zero or overflowing geometry; CUDA/NVRTC errors.
    pub fn new(gpu: &Arc<Gpu>, layers: u32, experts: u32) -> Result<Self> {
        let cells = layers as u64 * experts as u64;
        if cells == 0 || cells >= u32::MAX as u64 {
            return Err(CudaError::OutOfRange {
                what: "layers * experts",
                value: cells,
                limit: u32::MAX as u64,
            });
        }
        let ctx = gpu.ctx();
        let table = DeviceBuffer::<u32>::zeroed(ctx, cells as usize + 1)?;
        let snapshot = PinnedBuffer::<u32>::zeroed(ctx, cells as usize + 1)?;
        let drain_stream = gpu.new_stream()?;
        let step_mark = ctx.new_event(None).map_err(drv("cuEventCreate"))?;
        let drain_done = ctx.new_event(None).map_err(drv("cuEventCreate"))?;
        let branch = gpu.new_stream()?;
        let fork_mark = ctx.new_event(None).map_err(drv("cuEventCreate"))?;
        let join_mark = ctx.new_event(None).map_err(drv("cuEventCreate"))?;
        Ok(PickCounterGpu {
            stripes: None,
            num_stripes: 0,
            f_fold: gpu.function(&COUNT_MODULE, "tierkit_fold_stripes")?,
            f_i32: gpu.function(&COUNT_MODULE, "tierkit_count_i32")?,
            f_i64: gpu.function(&COUNT_MODULE, "tierkit_count_i64")?,
            gpu: gpu.clone(),
            layers,
            experts,
            table,
            snapshot,
            drain_stream,
            step_mark,
            drain_done,
            drain_pending: false,
            branch,
            fork_mark,
            join_mark,
            fork_pending: false,
            fork_capture: Capture::None,
        })
    }

    /// A zeroed counter plus `num_stripes` stripes per layer for the recommended fused path,
    /// `tierkit_count_pick_striped` in [`crate::EXPERT_COUNT_CUH`]: pass
    /// [`PickCounterGpu::stripes_ptr`] and `num_stripes` to the router kernel, and each warp's
    /// index as its stripe. Size `num_stripes` to the warps of the router launches that matter
    /// (one warp per token: the decode batch). A warp given an index beyond it adds to the
    /// table: exact, but the slowest form; launches with more warps (prefill) can pass
    /// `warp & (num_stripes - 1)` with a power-of-two `num_stripes`, sharing stripes instead.
    /// Memory: `layers × num_stripes × experts × 4` bytes of HBM (40 × 256 × 64: 2.5 MiB);
    /// [`PickCounterGpu::drain_async`] folds the stripes into the table first, in time that
    /// grows with that size (2.8 µs for 40 × 256 × 64 on the H200, once per drain).
    ///
    /// # Errors
    /// [`CudaError::OutOfRange`] if `num_stripes` is 0, `layers` exceeds 65,535 (the fold's
    /// grid) or the stripes exceed [`MAX_STRIPE_CELLS`] cells, checked before anything is
    /// allocated; then as [`PickCounterGpu::new`].
    pub fn with_stripes(
        gpu: &Arc<Gpu>,
        layers: u32,
        experts: u32,
        num_stripes: u32,
    ) -> Result<Self> {
        let cells = check_stripes(layers, experts, num_stripes)?;
        let mut c = Self::new(gpu, layers, experts)?;
        c.stripes = Some(DeviceBuffer::<u32>::zeroed(gpu.ctx(), cells as usize)?);
        c.num_stripes = num_stripes;
        Ok(c)
    }

    /// Device pointer of the fused path's stripes, u32 `[layers][num_stripes][experts]`
    /// (0 without stripes; pass [`PickCounterGpu::num_stripes`] = 0 with it and every pick goes
    /// to the table).
    pub fn stripes_ptr(&self) -> u64 {
        self.stripes.as_ref().map_or(0, |b| b.device_ptr())
    }

    /// Stripes per layer (0 without stripes).
    pub fn num_stripes(&self) -> u32 {
        self.num_stripes
    }

    /// Folds the stripes into the table on `stream` (`table += Σ stripes`, stripes zeroed), one
    /// launch; a no-op without stripes. [`PickCounterGpu::drain_async`] calls it: call it
    /// directly only to read the table some other way. `stream` must be the stream the routers
    /// run on (the fold must not overlap a router writing the stripes).
    ///
    /// # Errors
    /// CUDA launch errors.
    pub fn fold_stripes(&self, stream: &CudaStream) -> Result<()> {
        let Some(stripes) = &self.stripes else {
            return Ok(());
        };
        let cfg = LaunchConfig {
            grid_dim: (self.experts.div_ceil(32), self.layers, 1),
            block_dim: (32, 32, 1),
            shared_mem_bytes: 0,
        };
        let (sp, tp) = (stripes.device_ptr(), self.table_ptr());
        let mut b = stream.launch_builder(&self.f_fold);
        b.arg(&sp)
            .arg(&self.num_stripes)
            .arg(&self.layers)
            .arg(&self.experts)
            .arg(&tp);
        // SAFETY: argument list matches `tierkit_fold_stripes` (ptr, u32 x3, ptr); the kernel
        // touches stripes[l][s][e] for l < layers, s < num_stripes, e < experts (the buffer's
        // size, checked at construction) and table[l][e] inside the table allocation.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_fold_stripes)"))?;
        Ok(())
    }

    /// Layers of the table.
    pub fn layers(&self) -> u32 {
        self.layers
    }

    /// Experts per layer.
    pub fn experts(&self) -> u32 {
        self.experts
    }

    /// Device pointer of the `[layers][experts]` u32 table (pass to the fused header function).
    pub fn table_ptr(&self) -> u64 {
        self.table.device_ptr()
    }

    /// Device pointer of the rejected-picks u32 (the `err` argument of the fused header function).
    pub fn rejected_ptr(&self) -> u64 {
        self.table.device_ptr() + 4 * (self.layers as u64 * self.experts as u64)
    }

    /// Counts a `topk_ids` buffer given by raw device pointer, in one launch on `stream`, into
    /// layers `layer0 .. layer0 + ids.shape.layers`.
    ///
    /// # Errors
    /// [`CudaError::Shape`] if `ids.bytes` does not match the shape and dtype,
    /// [`CudaError::OutOfRange`] for a layer range outside the table; CUDA launch errors.
    pub fn count_raw(&self, stream: &CudaStream, ids: &TopkIdsView, layer0: u32) -> Result<()> {
        self.check_ids(ids, layer0)?;
        self.launch_count(stream, ids, layer0)
    }

    /// The launch of [`PickCounterGpu::count_raw`], for a view `check_ids` has accepted.
    fn launch_count(&self, stream: &CudaStream, ids: &TopkIdsView, layer0: u32) -> Result<()> {
        let f = match ids.dtype {
            IdsDtype::I32 => &self.f_i32,
            IdsDtype::I64 => &self.f_i64,
        };
        let n = ids.shape.picks() as u32;
        let per_layer: u32 = ids.shape.tokens * ids.shape.k;
        // 4 picks per thread
        let blocks = n.div_ceil(1024).clamp(1, 1024);
        let table = self.table_ptr();
        let rejected = self.rejected_ptr();
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(f);
        b.arg(&ids.ptr)
            .arg(&n)
            .arg(&per_layer)
            .arg(&layer0)
            .arg(&self.layers)
            .arg(&self.experts)
            .arg(&table)
            .arg(&rejected);
        // SAFETY: argument list matches `tierkit_count_{i32,i64}` (ptr, u32 x5, ptr, ptr);
        // `ids` holds `n` elements of the declared dtype (bytes checked by check_ids), the kernel
        // writes only table[layer * experts + e] with layer < layers, e < experts, or the
        // rejected word, all inside our allocation of layers * experts + 1 words.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_count)"))?;
        Ok(())
    }

    /// Counts `ids` as [`PickCounterGpu::count_raw`] does, but on the counter's own branch
    /// stream, forked from `stream` at this point of its work: the count runs concurrently with
    /// whatever `stream` runs next, until [`PickCounterGpu::join_forked`] makes `stream` wait for
    /// it. Fork and join are event record/wait pairs, so both can be captured in a CUDA graph
    /// with the step (capture `stream`; the branch joins the capture through the fork event).
    ///
    /// Use: when the router of each MoE layer writes its `topk_ids` into its own slice of one
    /// `[layers, tokens, k]` step buffer, fork the count of layers `0 ..= layers - 2` right
    /// before the last MoE layer's router, let that router count its own picks with the fused
    /// header (`tierkit_count_pick_striped`), and join at the end of the step. Measured on the
    /// H200 (stand-in routers, 40 layers × 256 tokens × top-6 of 64, CUDA graph, five
    /// machines): 0.18–0.45 µs added per 40-layer step, against 4.5–5.3 µs for the fused call in
    /// every router and 2.4–2.5 µs for the same count launched on `stream` after the last router
    /// (`benches/README.md`, "Forked count"). Engines without this API do the same with two
    /// events and a second stream (record on the step stream, the branch waits, launch
    /// `tierkit_count_i32` / `_i64` of `count.cu` on the branch, record on the branch, the step
    /// stream waits).
    ///
    /// Rules:
    /// - The branch only reads `ids`: nothing may write or free them before the join (with
    ///   PyTorch, keep the tensor alive and unused until then: the caching allocator does not
    ///   know the branch stream).
    /// - Fork and join in the same capture, or both outside any capture: `join_forked` checks
    ///   it ([`CudaError::Capture`]). A capture that ends without the join fails (CUDA reports
    ///   an unjoined branch); the next `join_forked` then drops that fork, which never ran.
    /// - A captured graph holds the table's and the ids' addresses: the counter and the ids
    ///   must outlive every graph that captured them. `stream` must belong to the counter's
    ///   context ([`crate::Gpu::ctx`]).
    /// - [`PickCounterGpu::drain_async`] joins first, so a drain never copies a table the
    ///   branch is still adding to.
    ///
    /// # Errors
    /// As [`PickCounterGpu::count_raw`] (shape, dtype, range: checked before the fork, so a
    /// rejected call records nothing); [`CudaError::InFlight`] if the previous forked count has
    /// not been joined; [`CudaError::Capture`] if `stream`'s capture is invalidated (nothing
    /// recorded); CUDA errors. After a CUDA error past the fork (unlike the crate's other calls)
    /// the fork may stay pending ([`PickCounterGpu::fork_pending`]): inside a capture, discard
    /// the capture, then `join_forked` drops the fork (returning [`CudaError::Capture`]);
    /// outside one, `join_forked` waits for it. If the join event itself could not be recorded
    /// outside a capture, the branch is synchronised before the error is returned, and nothing
    /// stays pending.
    pub fn count_forked(
        &mut self,
        stream: &CudaStream,
        ids: &TopkIdsView,
        layer0: u32,
    ) -> Result<()> {
        if self.fork_pending {
            return Err(CudaError::InFlight(
                "forked count not joined (call join_forked)",
            ));
        }
        self.check_ids(ids, layer0)?;
        let capture = capture_state(stream)?;
        if capture == Capture::Invalidated {
            return Err(CudaError::Capture(
                "count_forked on a stream whose capture is invalidated",
            ));
        }
        self.fork_mark
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        self.branch
            .wait(&self.fork_mark)
            .map_err(drv("cuStreamWaitEvent"))?;
        // forked from here on: the join must follow whatever happens next
        self.fork_pending = true;
        self.fork_capture = capture;
        let launched = self.launch_count(&self.branch, ids, layer0);
        let recorded = self
            .join_mark
            .record(&self.branch)
            .map_err(drv("cuEventRecord"));
        if recorded.is_err() && capture == Capture::None {
            // the join event does not cover this launch: settle the branch here instead, so
            // no later join or drain can run ahead of it
            self.branch
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))?;
            self.fork_pending = false;
        }
        launched.and(recorded)
    }

    /// Makes `stream` wait for the pending [`PickCounterGpu::count_forked`] (a no-op when none
    /// is pending). Call it on the stream that forked (or one in the same capture), before
    /// anything overwrites the counted ids and before a captured graph ends.
    ///
    /// # Errors
    /// [`CudaError::Capture`] if the fork was made inside a capture that has ended or been
    /// invalidated since (the fork is dropped: it never ran, and the capture cannot produce a
    /// graph; unlike the crate's other errors this one changes state), or if `stream` is not in
    /// the capture the fork was made in (the fork stays pending: join it from a stream in that
    /// capture, or from any stream outside a capture for a fork made outside one); CUDA errors.
    pub fn join_forked(&mut self, stream: &CudaStream) -> Result<()> {
        if !self.fork_pending {
            return Ok(());
        }
        if let Capture::Active(_) = self.fork_capture {
            if capture_state(&self.branch)? != self.fork_capture {
                // ended (or invalidated): the captured fork can never run
                self.fork_pending = false;
                self.fork_capture = Capture::None;
                return Err(CudaError::Capture(
                    "the forked count's capture ended or was invalidated before join_forked: \
                     the fork was dropped",
                ));
            }
        }
        if capture_state(stream)? != self.fork_capture {
            return Err(CudaError::Capture(
                "join_forked on a stream outside the capture the fork was made in (or inside one \
                 for a fork made outside any capture)",
            ));
        }
        stream
            .wait(&self.join_mark)
            .map_err(drv("cuStreamWaitEvent"))?;
        self.fork_pending = false;
        self.fork_capture = Capture::None;
        Ok(())
    }

    /// Whether a [`PickCounterGpu::count_forked`] has not been joined yet.
    pub fn fork_pending(&self) -> bool {
        self.fork_pending
    }

    /// The checks of [`PickCounterGpu::count_raw`], before anything is recorded or launched.
    fn check_ids(&self, ids: &TopkIdsView, layer0: u32) -> Result<()> {
        check_target(ids.shape, layer0, self.layers)?;
        let need = ids.shape.picks() * ids.dtype.size() as u64;
        if ids.bytes != need {
            return Err(CudaError::Shape {
                what: "topk_ids bytes (layers * tokens * k * dtype size)",
                expected: need,
                got: ids.bytes,
            });
        }
        if ids.ptr == 0 || !ids.ptr.is_multiple_of(ids.dtype.size() as u64) {
            return Err(CudaError::Dtype {
                what: "topk_ids pointer (null or misaligned for dtype)",
                expected: ids.dtype.name(),
                got: "misaligned pointer",
            });
        }
        if ids.shape.picks() > 1 << 31 {
            return Err(CudaError::OutOfRange {
                what: "picks per launch (layers * tokens * k)",
                value: ids.shape.picks(),
                limit: (1 << 31) + 1,
            });
        }
        Ok(())
    }

    /// Counts a typed device buffer of ids with shape `shape` (see [`PickCounterGpu::count_raw`]).
    pub fn count<I: TopkId>(
        &self,
        stream: &CudaStream,
        ids: &DeviceBuffer<I>,
        shape: TopkShape,
        layer0: u32,
    ) -> Result<()> {
        if ids.len() as u64 != shape.picks() {
            return Err(CudaError::Shape {
                what: "topk_ids",
                expected: shape.picks(),
                got: ids.len() as u64,
            });
        }
        self.count_raw(
            stream,
            &TopkIdsView {
                ptr: ids.device_ptr(),
                bytes: ids.num_bytes() as u64,
                dtype: I::DTYPE,
                shape,
            },
            layer0,
        )
    }

    /// Starts a drain: joins a pending [`PickCounterGpu::count_forked`] into `stream` (the step
    /// stream; [`PickCounterGpu::join_forked`] says which streams may join), folds the
    /// fused path's stripes into the table on `stream` (one small
    /// launch, only with [`PickCounterGpu::with_stripes`]), then the side stream waits for
    /// the work queued so far on `stream` (the step stream that counts) and copies the table and
    /// the rejected word to pinned host memory. The step stream is never blocked.
    ///
    /// # Errors
    /// [`CudaError::InFlight`] if the previous drain has not been collected
    /// ([`PickCounterGpu::poll_drain`] / [`PickCounterGpu::wait_drain`]); the errors of
    /// [`PickCounterGpu::join_forked`] (nothing else is done then); CUDA errors.
    pub fn drain_async(&mut self, stream: &CudaStream) -> Result<()> {
        if self.drain_pending {
            return Err(CudaError::InFlight("previous drain not collected"));
        }
        self.join_forked(stream)?;
        self.fold_stripes(stream)?;
        self.step_mark
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        self.drain_stream
            .wait(&self.step_mark)
            .map_err(drv("cuStreamWaitEvent"))?;
        let bytes = self.table.num_bytes();
        // SAFETY: snapshot and table have the same length; the host does not read the snapshot
        // until `drain_done` completes (`drain_pending` guards `poll_drain`/`wait_drain`), and both
        // buffers live as long as `self` (Drop of the buffers synchronises).
        unsafe {
            copy_dtoh_async(
                self.snapshot.as_mut_slice().as_mut_ptr() as *mut u8,
                self.table.device_ptr(),
                bytes,
                &self.drain_stream,
            )?
        };
        self.drain_done
            .record(&self.drain_stream)
            .map_err(drv("cuEventRecord"))?;
        self.drain_pending = true;
        Ok(())
    }

    fn snapshot_view(&self) -> DrainSnapshot<'_> {
        let all = self.snapshot.as_slice();
        let cells = all.len() - 1;
        DrainSnapshot {
            counts: &all[..cells],
            rejected: all[cells],
        }
    }

    /// The drained snapshot if the drain's copy has completed (non-blocking), else `None`.
    ///
    /// # Errors
    /// [`CudaError::InFlight`] if no drain was started; CUDA errors from the copy.
    pub fn poll_drain(&mut self) -> Result<Option<DrainSnapshot<'_>>> {
        if !self.drain_pending {
            return Err(CudaError::InFlight("no drain started"));
        }
        if !self
            .drain_done
            .try_is_complete()
            .map_err(drv("cuEventQuery"))?
        {
            return Ok(None);
        }
        self.drain_pending = false;
        Ok(Some(self.snapshot_view()))
    }

    /// Waits for the drain's copy and returns the snapshot.
    pub fn wait_drain(&mut self) -> Result<DrainSnapshot<'_>> {
        if !self.drain_pending {
            return Err(CudaError::InFlight("no drain started"));
        }
        self.drain_done
            .synchronize()
            .map_err(drv("cuEventSynchronize"))?;
        self.drain_pending = false;
        Ok(self.snapshot_view())
    }

    /// The GPU this counter lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

/// Flags for timing events (`CU_EVENT_DEFAULT`; `new_event(None)` disables timing).
pub const TIMING_EVENT: Option<sys::CUevent_flags> = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_reference_counts_and_rejects() {
        let shape = TopkShape::step(2, 2, 2);
        let ids: Vec<i64> = vec![0, 1, 1, 3, 2, -1, 7, 2];
        let mut table = vec![0u32; 2 * 4];
        let rej = count_picks_cpu(&ids, shape, 0, 2, 4, &mut table).unwrap();
        assert_eq!(rej, 2);
        assert_eq!(table, vec![1, 2, 0, 1, 0, 0, 2, 0]);
    }

    #[test]
    fn cpu_reference_layer_offset_and_errors_leave_table() {
        let mut table = vec![0u32; 3 * 4];
        let ids: Vec<i32> = vec![3, 3, 0];
        assert_eq!(
            count_picks_cpu(&ids, TopkShape::layer(3, 1), 2, 3, 4, &mut table).unwrap(),
            0
        );
        assert_eq!(&table[8..], &[1, 0, 0, 2]);
        let before = table.clone();
        assert!(matches!(
            count_picks_cpu(&ids, TopkShape::layer(3, 1), 3, 3, 4, &mut table),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            count_picks_cpu(&ids, TopkShape::layer(2, 1), 0, 3, 4, &mut table),
            Err(CudaError::Shape { .. })
        ));
        assert!(matches!(
            count_picks_cpu(&ids, TopkShape::layer(3, 1), 0, 3, 4, &mut table[..5]),
            Err(CudaError::Shape { .. })
        ));
        assert_eq!(table, before);
    }

    #[test]
    fn cpu_reference_wraps() {
        let mut table = vec![u32::MAX; 1];
        count_picks_cpu(&[0i32], TopkShape::layer(1, 1), 0, 1, 1, &mut table).unwrap();
        assert_eq!(table, vec![0]);
    }

    #[test]
    fn stripe_geometry_is_checked_before_allocation() {
        assert_eq!(check_stripes(40, 64, 256).unwrap(), 40 * 64 * 256);
        for (l, e, s) in [(40, 64, 0), (65_536, 1, 1), (4096, 4096, 4096)] {
            assert!(matches!(
                check_stripes(l, e, s),
                Err(CudaError::OutOfRange { .. })
            ));
        }
    }

    #[test]
    fn cpu_fold_adds_every_stripe_and_zeroes_them() {
        // 2 layers x 3 stripes x 2 experts
        let mut stripes: Vec<u32> = (1..=12).collect();
        stripes[0] = u32::MAX; // wraps with the table's 1
        let mut table = vec![1u32, 0, 0, 5, 77]; // + a trailing rejected word, left alone
        fold_stripes_cpu(&mut stripes, 3, 2, 2, &mut table).unwrap();
        let l0 = [1u32.wrapping_add(u32::MAX).wrapping_add(3 + 5), 2 + 4 + 6];
        assert_eq!(table, vec![l0[0], l0[1], 7 + 9 + 11, 5 + 8 + 10 + 12, 77]);
        assert!(stripes.iter().all(|&c| c == 0));
        let before = table.clone();
        assert!(matches!(
            fold_stripes_cpu(&mut stripes[..11], 3, 2, 2, &mut table),
            Err(CudaError::Shape { .. })
        ));
        assert!(matches!(
            fold_stripes_cpu(&mut stripes, 3, 2, 2, &mut table[..3]),
            Err(CudaError::Shape { .. })
        ));
        assert_eq!(table, before);
    }
}
