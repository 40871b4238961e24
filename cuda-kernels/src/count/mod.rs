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
//!
//! ## Counting controls (warm-up, padding)
//!
//! Every counter owns a device control block (`u32 [4]`: `enabled`, `valid_tokens`, two
//! reserved words; [`CountControl`]) at a fixed address. The counting kernels read it on the
//! device at each launch: a disabled launch counts nothing, and token rows at or above
//! `valid_tokens` (the padding of a graph-captured batch, dummy rows) are skipped in every
//! layer. Write it with [`PickCounterGpu::set_enabled_async`] /
//! [`PickCounterGpu::set_valid_tokens_async`] on the step stream before the step (outside the
//! graph: the graph then reads the new values at replay), or from the engine through
//! [`PickCounterGpu::control_ptr`]. The fused header's `tierkit_count_pick_striped_ctl` takes the
//! same pointer. Defaults count everything, so callers that never touch it see no change.
//!
//! Modules: the CPU references (`cpu.rs`), the counter and its drain (`gpu.rs`), the controls
//! (`control.rs`), the count forked onto a branch stream (`forked.rs`).

mod control;
mod cpu;
mod forked;
mod gpu;
mod strided;

pub use control::{
    CountControl, COUNT_CONTROL_ENABLED, COUNT_CONTROL_VALID_TOKENS, COUNT_CONTROL_WORDS,
};
pub use cpu::{count_picks_cpu, count_picks_cpu_ctl, fold_stripes_cpu};
pub use gpu::{DrainSnapshot, PickCounterGpu, MAX_STRIPE_CELLS};
pub use strided::{check_strided, CountLauncher, CountTarget, StridedIds};

use crate::error::{CudaError, Result};

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

pub(crate) fn check_target(shape: TopkShape, layer0: u32, layers: u32) -> Result<()> {
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
