//! [`PickCounterGpu`]: the GPU counter table, its counting launches, the stripes of the fused
//! path and the asynchronous drain.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::{check_target, CountControl, IdsDtype, TopkId, TopkIdsView, TopkShape};
use crate::device::{Gpu, COUNT_MODULE};
use crate::error::{drv, CudaError, Result};
use crate::mem::{copy_dtoh_async, DeviceBuffer, PinnedBuffer};
use crate::raw::Capture;

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
/// Counting controls: a 4-word device control block at a fixed address
/// ([`PickCounterGpu::control_ptr`], layout at [`CountControl`]) holds an enable flag and a
/// valid-token count that every launch of [`PickCounterGpu::count_raw`] /
/// [`PickCounterGpu::count_forked`] (and the header's `_ctl` calls) reads on the device, so a
/// captured CUDA graph sees the values written before each replay
/// ([`PickCounterGpu::set_enabled_async`], [`PickCounterGpu::set_valid_tokens_async`], or the
/// engine's own write). A new counter counts everything ([`CountControl::ALL`]).
///
/// Source: the SGLang/EPLB expert-load recorders (a device table bumped per pick), redesigned
/// after their faults: no batch-size cap (grid-stride loop), one launch per step, CUDA-graph-safe
/// fixed addresses, bad ids counted instead of written.
#[derive(Debug)]
pub struct PickCounterGpu {
    pub(super) gpu: Arc<Gpu>,
    pub(super) layers: u32,
    pub(super) experts: u32,
    pub(super) table: DeviceBuffer<u32>,
    pub(super) snapshot: PinnedBuffer<u32>,
    pub(super) drain_stream: Arc<CudaStream>,
    pub(super) step_mark: CudaEvent,
    pub(super) drain_done: CudaEvent,
    pub(super) drain_pending: bool,
    f_i32: CudaFunction,
    f_i64: CudaFunction,
    /// The control block, u32 `[COUNT_CONTROL_WORDS]` (`[enabled, valid_tokens, 0, 0]`).
    pub(super) control: DeviceBuffer<u32>,
    pub(super) f_set_control: CudaFunction,
    /// Stripes of the fused path, u32 `[layers][num_stripes][experts]` (`None` when 0).
    pub(super) stripes: Option<DeviceBuffer<u32>>,
    pub(super) num_stripes: u32,
    pub(super) f_fold: CudaFunction,
    /// Branch stream of [`PickCounterGpu::count_forked`], and its fork and join events.
    pub(super) branch: Arc<CudaStream>,
    pub(super) fork_mark: CudaEvent,
    pub(super) join_mark: CudaEvent,
    pub(super) fork_pending: bool,
    /// The capture state of the stream the pending fork was made on (`Capture::None` outside a
    /// capture; never `Invalidated`: count_forked refuses it).
    pub(super) fork_capture: Capture,
}

/// Makes `later` wait (on the GPU) for the work queued on `earlier` so far, through `mark`.
pub(super) fn order_after(
    mark: &CudaEvent,
    earlier: &CudaStream,
    later: &CudaStream,
) -> Result<()> {
    mark.record(earlier).map_err(drv("cuEventRecord"))?;
    later.wait(mark).map_err(drv("cuStreamWaitEvent"))
}

/// Most u32 cells of the fused path's stripes buffer (`layers × stripes × experts`): 2^30, 4 GiB.
pub const MAX_STRIPE_CELLS: u64 = 1 << 30;

/// Validates a stripes geometry (before anything is allocated); returns its cells.
pub(super) fn check_stripes(layers: u32, experts: u32, num_stripes: u32) -> Result<u64> {
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
        let control = DeviceBuffer::<u32>::from_host(ctx, &CountControl::ALL.to_words())?;
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
            f_i32: gpu.function(&COUNT_MODULE, "tierkit_count_ctl_i32")?,
            f_i64: gpu.function(&COUNT_MODULE, "tierkit_count_ctl_i64")?,
            f_set_control: gpu.function(&COUNT_MODULE, "tierkit_count_set_control")?,
            control,
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
    /// layers `layer0 .. layer0 + ids.shape.layers`, under the control block as it is when the
    /// launch runs: nothing if disabled, and only token rows below the valid-token count
    /// (CPU reference: [`crate::count_picks_cpu_ctl`]).
    ///
    /// # Errors
    /// [`CudaError::Shape`] if `ids.bytes` does not match the shape and dtype,
    /// [`CudaError::OutOfRange`] for a layer range outside the table; CUDA launch errors.
    pub fn count_raw(&self, stream: &CudaStream, ids: &TopkIdsView, layer0: u32) -> Result<()> {
        self.check_ids(ids, layer0)?;
        self.launch_count(stream, ids, layer0)
    }

    /// The launch of [`PickCounterGpu::count_raw`], for a view `check_ids` has accepted.
    pub(super) fn launch_count(
        &self,
        stream: &CudaStream,
        ids: &TopkIdsView,
        layer0: u32,
    ) -> Result<()> {
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
        let (k, ctl) = (ids.shape.k, self.control_ptr());
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(f);
        b.arg(&ids.ptr)
            .arg(&n)
            .arg(&per_layer)
            .arg(&k)
            .arg(&layer0)
            .arg(&self.layers)
            .arg(&self.experts)
            .arg(&table)
            .arg(&rejected)
            .arg(&ctl);
        // SAFETY: argument list matches `tierkit_count_ctl_{i32,i64}` (ptr, u32 x6, ptr, ptr,
        // ptr); `ids` holds `n` elements of the declared dtype (bytes checked by check_ids), the
        // kernel writes only table[layer * experts + e] with layer < layers, e < experts, or the
        // rejected word, all inside our allocation of layers * experts + 1 words, and reads the
        // 4-word control block, which lives as long as `self`.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_count_ctl)"))?;
        Ok(())
    }
}

impl PickCounterGpu {
    /// The checks of [`PickCounterGpu::count_raw`], before anything is recorded or launched.
    pub(super) fn check_ids(&self, ids: &TopkIdsView, layer0: u32) -> Result<()> {
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
        order_after(&self.step_mark, stream, &self.drain_stream)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
