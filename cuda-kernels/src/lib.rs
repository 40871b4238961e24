//! # cuda-kernels
//!
//! The GPU kernels both tierkit tiers launch, each with a typed launch and a CPU reference, and
//! the GPU memory they run on. No tier state and no policy: which expert is hot, or which KV
//! page lives where, is decided in `expert-residency` / `kv-elastic`.
//!
//! - Pick counting: [`PickCounterGpu`] (standalone `[layers, tokens, k]` count, stripes of the
//!   fused path folded at the drain, a count forked beside the last router, asynchronous
//!   drains), the header engines paste into their router ([`EXPERT_COUNT_CUH`]), and
//!   [`count_picks_cpu`] / [`fold_stripes_cpu`].
//! - Indirection tables: [`TableUpdater`] (`tierkit_table_update`) and
//!   [`apply_table_updates_cpu`]; the slot-id form [`SlotIdLauncher`] / [`table_slot_ids_cpu`].
//!   The expert tier's memory (pinned host experts, HBM slots, the table) is
//!   `expert-residency`'s (`expert_residency::gpu::ExpertStore`), built on these types.
//! - The KV resolve/dedup/fetch, replay, prefetch and write-back kernels: [`KvKernels`], launched
//!   on the caller's tables ([`KvTables`], [`KvDims`]); their semantics are the "KV resolve kernel
//!   contract" of the crate's `DESIGN.md`.
//! - Memory and sync: [`DeviceBuffer`], [`PinnedBuffer`], synchronous and asynchronous copies
//!   ([`copy_htod_sync`], [`copy_htod_async`], ...), [`EventSignal`] (a CUDA event as a
//!   `tier_core::CompletionSignal`), [`Gpu`] (context, step stream, NVRTC cache).
//!
//! Built on cudarc with dynamic loading, so it builds and its CPU tests run where no CUDA
//! exists; kernels are `.cu` files compiled by NVRTC at first use. `DESIGN.md` says why the
//! crate is cut this way; H200 figures are in `benches/README.md`.
//!
//! ```
//! use cuda_kernels::{count_picks_cpu, Gpu, PickCounterGpu, TopkShape};
//! // 2 layers x 2 tokens x top-2, 4 experts; -1 and 9 are rejected, never written.
//! let ids: Vec<i32> = vec![0, 1, 1, -1, 2, 3, 3, 9];
//! let mut table = vec![0u32; 2 * 4];
//! let rejected = count_picks_cpu(&ids, TopkShape::step(2, 2, 2), 0, 2, 4, &mut table)?;
//! assert_eq!((rejected, &table[..]), (2, &[1, 2, 0, 0, 0, 0, 1, 2][..]));
//! // The same count on a GPU, where one exists.
//! if let Some(gpu) = Gpu::try_default()? {
//!     let ids = cuda_kernels::DeviceBuffer::from_host(gpu.ctx(), &ids)?;
//!     let mut counter = PickCounterGpu::new(&gpu, 2, 4)?;
//!     counter.count(gpu.stream(), &ids, TopkShape::step(2, 2, 2), 0)?;
//!     counter.drain_async(gpu.stream())?;
//!     let snap = counter.wait_drain()?;
//!     assert_eq!((snap.rejected, snap.counts), (rejected, &table[..]));
//! } else {
//!     println!("SKIP: no CUDA device (the CPU half ran)");
//! }
//! # Ok::<(), cuda_kernels::CudaError>(())
//! ```

mod count;
mod device;
mod error;
mod mem;
mod raw;
mod signal;
mod table;

mod kv;

pub use count::{
    check_strided, count_picks_cpu, count_picks_cpu_ctl, fold_stripes_cpu, CountControl,
    CountLauncher, CountTarget, DrainSnapshot, IdsDtype, PickCounterGpu, StridedIds, TopkId,
    TopkIdsView, TopkShape, COUNT_CONTROL_ENABLED, COUNT_CONTROL_VALID_TOKENS, COUNT_CONTROL_WORDS,
    MAX_STRIPE_CELLS,
};
pub use device::{cuda_available, Gpu, KernelSource, COUNT_MODULE, EXPERT_COUNT_CUH, TABLE_MODULE};
pub use error::{CudaError, Result};
#[cfg(feature = "test-hooks")]
pub use kv::ResolveEngine;
pub use kv::{
    CopyBackend, KvCopy, KvDims, KvErrors, KvFill, KvKernels, KvResolveArgs, KvResolveOptions,
    KvSlotDesc, KvStats, KvTables, KV_ERR_WORDS, KV_FMT_CONTIGUOUS, KV_FMT_PAGED_SPLIT,
    KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED, KV_MODULE, KV_STATS, KV_UNCLAIMED,
};
pub use mem::{
    copy_dtoh_async, copy_dtoh_sync, copy_htod_async, copy_htod_sync, DeviceBuffer, HostBacking,
    PinnedBuffer,
};
pub use raw::ContextGuard;
pub use signal::EventSignal;
pub use table::{
    apply_table_updates_cpu, table_slot_ids_cpu, SlotIdLauncher, SlotLayout, TableUpdater,
    MAX_UPDATES_PER_LAUNCH,
};

/// Re-export of the cudarc driver API the public types use (streams, events, functions).
pub use cudarc::driver as cudarc_driver;
