//! # cuda-kernels
//!
//! GPU kernels and GPU memory primitives shared by the tierkit tiers, on cudarc (driver API +
//! NVRTC, loaded dynamically, so the crate builds and its CPU tests run where no CUDA exists).
//! Kernels are `.cu` files in `kernels/`, embedded with `include_str!`, compiled by NVRTC for
//! the device's compute capability at first use and cached per context ([`Gpu`]).
//!
//! - [`count`]: expert pick counting (standalone kernel over `[layers, tokens, k]` int32/int64
//!   `topk_ids`, the fused-path header [`EXPERT_COUNT_CUH`] with its per-warp stripes folded at
//!   the drain, the count forked onto a branch stream beside the last router
//!   ([`PickCounterGpu::count_forked`]), asynchronous drains) + CPU references.
//! - [`bank`]: the expert bank (pinned host experts, HBM slots + a spare per layer, device
//!   indirection table, copy stream, reader fences) used by `expert-residency`'s GPU executor.
//! - [`mem`]: device buffers and mapped pinned host buffers (raw `u64` device pointers).
//!
//! Every kernel has a CPU reference with the same semantics; GPU tests print
//! `SKIP: no CUDA device` and return where no device exists. Buffers hand out raw `u64` device
//! pointers and track no stream use: callers order work with streams and events (the bank's swap
//! protocol does this itself). H200 figures: `benches/README.md`.
//!
//! ```
//! use cuda_kernels::{count_picks_cpu, TopkShape};
//! // 2 layers x 2 tokens x top-2, 4 experts; -1 and 9 are rejected, never written.
//! let ids: Vec<i32> = vec![0, 1, 1, -1, 2, 3, 3, 9];
//! let mut table = vec![0u32; 2 * 4];
//! let rejected = count_picks_cpu(&ids, TopkShape::step(2, 2, 2), 0, 2, 4, &mut table).unwrap();
//! assert_eq!((rejected, &table[..]), (2, &[1, 2, 0, 0, 0, 0, 1, 2][..]));
//! if let Some(gpu) = cuda_kernels::gpu_or_skip() {
//!     let counter = cuda_kernels::PickCounterGpu::new(&gpu, 2, 4).unwrap();
//!     assert_ne!(counter.table_ptr(), 0);
//! }
//! ```

pub mod bank;
pub mod count;
pub mod device;
pub mod error;
pub mod kv;
pub mod mem;
pub mod signal;

pub use bank::{
    check_expert_pattern, write_expert_pattern, BankGeometry, CommitMode, CommittedSwap,
    ExpertBankGpu,
};
pub use count::{
    count_picks_cpu, fold_stripes_cpu, DrainSnapshot, IdsDtype, PickCounterGpu, TopkId,
    TopkIdsView, TopkShape, MAX_STRIPE_CELLS, TIMING_EVENT,
};
pub use device::{
    cuda_available, gpu_or_skip, Gpu, KernelSource, BANK_MODULE, COUNT_MODULE, EXPERT_COUNT_CUH,
};
pub use error::{CudaError, Result};
pub use mem::{copy_dtoh_async, copy_htod_async, DeviceBuffer, PinnedBuffer};
pub use signal::EventSignal;

/// Re-export of the cudarc driver API the public types use (streams, events, functions).
pub use cudarc::driver as cudarc_driver;
