//! The GPU back-end (feature `cuda`): [`GpuElasticPool`] runs the control plane of
//! [`crate::ElasticPool`] on the data plane [`GpuData`] — the history once, in the mapped pinned
//! store ([`PinnedBytes`]), and the device state of [`GpuArena`] (session-slot tables, arena) —
//! publishing each control operation as O(changed) asynchronous work, and resolves on the device
//! with the kernels of `cuda_kernels::KvKernels`, behind the same [`crate::Resolver`] trait as the
//! CPU reference.

mod arena;
#[cfg(test)]
mod commit_probe;
mod data;
mod dims;
mod direct;
mod pool;
mod strided;

pub use arena::GpuArena;
/// The copy back-ends of the GPU pool (re-exported from `cuda_kernels`).
pub use cuda_kernels::CopyBackend;
/// The resolve kernels of the GPU pool (a test hook, feature `test-hooks`; re-exported from
/// `cuda_kernels`).
#[cfg(feature = "test-hooks")]
pub use cuda_kernels::ResolveEngine;
pub use data::{GpuData, PinnedBytes};
pub use pool::{EngineHostMemory, GpuElasticPool, GpuFlushCounters, GpuPoolConfig, MapAfterFill};
