//! The data plane: bytes, and nothing about where they should be. The host store holds every
//! session's committed history (the source of truth); the CPU arena holds the arena rows the CPU
//! back-end reads. The GPU back-end's arena is [`crate::gpu::GpuArena`] (feature `cuda`).

mod arena;
mod host;

pub(crate) use arena::CpuArena;
pub use host::{HostStore, SessionId};
