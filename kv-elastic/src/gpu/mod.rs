//! The GPU back-end (feature `cuda`): [`GpuElasticPool`] resolves on the device with the kernels
//! of `cuda_kernels::KvKernels`, behind the same [`crate::Resolver`] trait as the CPU reference, on the
//! device state of [`GpuArena`] (session-slot tables, arena, mapped pinned host store).

mod arena;
mod pool;

pub use arena::GpuArena;
/// The copy back-ends of the GPU pool (re-exported from `cuda_kernels`).
pub use cuda_kernels::CopyBackend;
pub use pool::{GpuElasticPool, GpuPoolConfig};
