//! [`CountLauncher`]: counting one layer's strided `topk_ids` into a table the caller owns (a
//! torch tensor, an engine's buffer), under the caller's control block. The torch op
//! `tierkit::count_topk` and the C entry point `tierkit_count_topk_cuda` launch it on the
//! engine's stream; [`crate::PickCounterGpu`] is the form that owns its table and drains it.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::IdsDtype;
use crate::device::{Gpu, COUNT_MODULE};
use crate::error::{drv, CudaError, Result};

/// One layer's router output on the device, `[tokens, k]` with a row stride (elements, `>= k`;
/// the column stride is 1), e.g. a torch tensor's `data_ptr()` / `stride(0)` or llama.cpp's
/// strided `ffn_moe_topk` view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedIds {
    /// Device pointer of element `[0, 0]`, aligned for `dtype`.
    pub ptr: u64,
    /// Element type.
    pub dtype: IdsDtype,
    /// Token rows.
    pub tokens: u32,
    /// Picks per token.
    pub k: u32,
    /// Elements between consecutive rows (`>= k`).
    pub row_stride: u64,
}

/// The caller's counter memory: `table` u32 `[layers][experts]`, `rejected` one u32 (out-of-range
/// ids), `control` u32 `[4]` (layout at [`crate::CountControl`]; 0 = count every row), all device
/// pointers that stay allocated until the launch has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountTarget {
    /// u32 `[layers][experts]`, 4-byte aligned.
    pub table: u64,
    /// One u32 for rejected picks.
    pub rejected: u64,
    /// u32 `[4]` control block, or 0 (no control: every row counted).
    pub control: u64,
    /// Layers of the table.
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
}

/// Typed launcher of `tierkit_count_strided_i32` / `_i64` (functions loaded once per [`Gpu`]).
#[derive(Debug, Clone)]
pub struct CountLauncher {
    f_i32: CudaFunction,
    f_i64: CudaFunction,
}

/// The checks of [`CountLauncher::launch`] (host only; nothing is launched on an error).
pub fn check_strided(ids: &StridedIds, layer: u32, target: &CountTarget) -> Result<()> {
    if ids.tokens == 0 || ids.k == 0 {
        return Err(CudaError::Shape {
            what: "topk_ids (an extent is zero)",
            expected: 1,
            got: 0,
        });
    }
    if ids.row_stride < ids.k as u64 {
        return Err(CudaError::Shape {
            what: "topk_ids row stride (elements, at least k)",
            expected: ids.k as u64,
            got: ids.row_stride,
        });
    }
    if ids.tokens as u64 * ids.k as u64 > u32::MAX as u64 {
        return Err(CudaError::OutOfRange {
            what: "tokens * k",
            value: ids.tokens as u64 * ids.k as u64,
            limit: u32::MAX as u64,
        });
    }
    let cells = target.layers as u64 * target.experts as u64;
    if cells == 0 || cells >= u32::MAX as u64 {
        return Err(CudaError::OutOfRange {
            what: "counts layers * experts",
            value: cells,
            limit: u32::MAX as u64,
        });
    }
    if layer >= target.layers {
        return Err(CudaError::OutOfRange {
            what: "layer",
            value: layer as u64,
            limit: target.layers as u64,
        });
    }
    let aligned = |p: u64, a: u64| p != 0 && p.is_multiple_of(a);
    if !aligned(ids.ptr, ids.dtype.size() as u64) {
        return Err(CudaError::Dtype {
            what: "topk_ids pointer (null or misaligned for dtype)",
            expected: ids.dtype.name(),
            got: "misaligned pointer",
        });
    }
    if !aligned(target.table, 4)
        || !aligned(target.rejected, 4)
        || (target.control != 0 && !target.control.is_multiple_of(4))
    {
        return Err(CudaError::Dtype {
            what: "counts / rejected / control pointer (null or not 4-byte aligned)",
            expected: "uint32",
            got: "misaligned pointer",
        });
    }
    Ok(())
}

impl CountLauncher {
    /// Loads the kernels (compiling [`COUNT_MODULE`] on first use in this context).
    ///
    /// # Errors
    /// NVRTC or module-load errors.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(CountLauncher {
            f_i32: gpu.function(&COUNT_MODULE, "tierkit_count_strided_i32")?,
            f_i64: gpu.function(&COUNT_MODULE, "tierkit_count_strided_i64")?,
        })
    }

    /// Enqueues the count of `ids` into layer `layer` of `target` on `stream`: one launch, no
    /// allocation, no synchronisation, capturable (the control block is read when the kernel
    /// runs, so a replayed graph sees the values written before each replay). CPU reference:
    /// [`crate::count_picks_cpu_ctl`] on the gathered rows.
    ///
    /// # Errors
    /// The errors of [`check_strided`] (nothing enqueued); CUDA launch errors.
    ///
    /// # Safety
    /// `ids` addresses `tokens` rows of `k` elements at `row_stride`, and `target`'s pointers
    /// the documented sizes, in device memory of `stream`'s context that stays allocated until
    /// the kernel has run; the context is current on this thread.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        ids: &StridedIds,
        layer: u32,
        target: &CountTarget,
    ) -> Result<()> {
        check_strided(ids, layer, target)?;
        let f = match ids.dtype {
            IdsDtype::I32 => &self.f_i32,
            IdsDtype::I64 => &self.f_i64,
        };
        let n = ids.tokens * ids.k;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 1024), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(f);
        b.arg(&ids.ptr)
            .arg(&ids.tokens)
            .arg(&ids.k)
            .arg(&ids.row_stride)
            .arg(&layer)
            .arg(&target.layers)
            .arg(&target.experts)
            .arg(&target.table)
            .arg(&target.rejected)
            .arg(&target.control);
        // SAFETY: the argument list matches `tierkit_count_strided_{i32,i64}` (ptr, u32, u32, u64,
        // u32 x3, ptr x3); the kernel reads ids[t * row_stride + j] for t < tokens, j < k, writes
        // table cells below layers * experts or the rejected word, and reads 2 control words
        // (caller's contract for every pointer).
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_count_strided)"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> StridedIds {
        StridedIds {
            ptr: 256,
            dtype: IdsDtype::I64,
            tokens: 4,
            k: 2,
            row_stride: 2,
        }
    }
    fn target() -> CountTarget {
        CountTarget {
            table: 1024,
            rejected: 2048,
            control: 0,
            layers: 2,
            experts: 8,
        }
    }

    #[test]
    fn strided_views_are_checked_before_launch() {
        assert!(check_strided(&ids(), 1, &target()).is_ok());
        let bad_stride = StridedIds {
            row_stride: 1,
            ..ids()
        };
        assert!(matches!(
            check_strided(&bad_stride, 0, &target()),
            Err(CudaError::Shape { .. })
        ));
        let misaligned = StridedIds { ptr: 260, ..ids() };
        assert!(matches!(
            check_strided(&misaligned, 0, &target()),
            Err(CudaError::Dtype { .. })
        ));
        assert!(matches!(
            check_strided(&ids(), 2, &target()),
            Err(CudaError::OutOfRange { .. })
        ));
        let empty = StridedIds { tokens: 0, ..ids() };
        assert!(check_strided(&empty, 0, &target()).is_err());
        let bad_ctl = CountTarget {
            control: 2,
            ..target()
        };
        assert!(check_strided(&ids(), 0, &bad_ctl).is_err());
    }
}
