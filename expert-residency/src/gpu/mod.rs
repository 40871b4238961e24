//! The GPU executor (`cuda` feature): [`GpuExecutor`] implements [`SwapExecutor`] on top of an
//! [`ExpertBankGpu`]: all experts in pinned host memory (the source of truth), the hot ones in
//! HBM slots plus one spare slot per layer, and a device indirection table `(layer, expert) →
//! u64 address` at a fixed address (CUDA-graph safe). The memory is this module's
//! [`ExpertStore`] (on `cuda-kernels`' device memory types), the kernels are `cuda-kernels`'
//! ([`cuda_kernels::TableUpdater`]); the residency state and the protocol below are this
//! module's.
//!
//! A swap (incoming cold expert in, outgoing hot expert out):
//! 1. `begin` ([`ExpertBankGpu::begin_swap`]) checks the swap against the executor's mirror of
//!    the controller's map (a swap planned at another generation is refused:
//!    [`crate::ExpertError::StaleSwap`]), makes the copy stream wait on the GPU for the spare slot's
//!    reader fence, enqueues the host → spare-slot copy and returns at once; steps keep running.
//! 2. `commit_ready` (at a step boundary) asks the controller (`accept`) about each swap whose
//!    copy completed, in begin order, then flips the accepted ones with one tiny kernel on the
//!    step stream after a GPU-side wait on the copy-done event (incoming → its new slot,
//!    outgoing → its pinned host address, still readable in place); refused ones are discarded
//!    (the spare keeps unreferenced bytes). Copies still running stay in flight
//!    ([`CommitMode::Deferred`]), or, in [`CommitMode::Wait`], the step stream waits for them on
//!    the GPU before the flip. A flip never exposes a half-copied slot either way. The mirror
//!    applies each flipped swap, as the controller applies each swap reported committed: one
//!    generation for map, executor and bank.
//! 3. The outgoing expert's old slot becomes the layer's spare behind a reader fence (a
//!    [`cuda_kernels::EventSignal`] recorded on the step stream right after the flip, i.e.
//!    after the last step that could read the old slot); the next copy into it waits for that
//!    event on the GPU (the host never blocks). `expert-residency/DESIGN.md` ("GPU executor")
//!    says why this is an event wait and not a `tier_core::EpochFence`.
//!
//! Weights are read-only, so nothing is written back. Engines read expert weights through
//! [`GpuExecutor::table_ptr`]. Source: the published GB300 recipe paid 1.3–2.4 ms of step time
//! per applied swap by copying on the main stream between steps; here the copy is off the step
//! stream and the step pays only the flip launch.
#![cfg_attr(docsrs, doc(cfg(feature = "cuda")))]

mod bank;
mod executor;
mod placement;
mod store;

pub use bank::{CommitMode, CommittedSwap, ExpertBankGpu};
pub use executor::GpuExecutor;
pub use store::ExpertStore;

#[cfg(doc)]
use crate::executor::SwapExecutor;
