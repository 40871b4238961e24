//! Swap executors: what moves an expert's bytes from host memory into HBM.
//!
//! The controller ([`crate::Controller`]) decides *which* experts swap; an executor moves the bytes
//! and flips the engine's `(layer, expert) → weights` indirection table. The trait is shaped for an
//! asynchronous (GPU) executor that reads experts through an expert → slot table at a fixed address
//! (as TensorRT-LLM's ExpertId → SlotId table does, so captured CUDA graphs stay valid):
//!
//! 1. [`SwapExecutor::begin`] starts copying the incoming expert host → the layer's spare HBM slot
//!    (on a copy stream) and returns at once.
//! 2. At each step boundary the controller calls [`SwapExecutor::commit_ready`]; for every swap whose
//!    bytes are fully in place the executor asks the controller (`accept`) whether the swap is still
//!    current (the layer generation it was planned at), then flips the table entries (incoming →
//!    HBM slot, outgoing → its host copy) or discards the copy.
//! 3. The controller changes its [`crate::ResidencyMap`] only for swaps reported
//!    [`SwapOutcome::Committed`]. It never begins a second swap in a layer that has one in flight,
//!    so an executor needs one spare HBM slot per layer. The outgoing expert's old slot becomes the
//!    layer's spare once no reader can still use it (the executor's reader fence); until then
//!    [`SwapExecutor::can_begin`] answers `false` for that layer.
//!
//! [`MemoryExecutor`](crate::MemoryExecutor) is the in-memory executor (byte buffers standing in for
//! HBM and host) that checks every move with checksums; the GPU executor lives in `gpu.rs` behind the
//! `cuda` feature.

use crate::error::Result;
use crate::geometry::Geometry;

/// One planned swap: expert `incoming` (cold) takes hot slot `slot` of `layer` from expert
/// `outgoing` (hot), valid only while the layer's rowmap generation is `generation`.
///
/// Plain `#[repr(C)]` Pod (24 bytes) so it can cross to a GPU executor or over FFI.
/// `slot` is the rowmap's logical hot slot (`0..hot_per_layer`); a GPU executor keeps its own
/// physical placement (hot slots plus one spare per layer).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    bytemuck::Pod,
    bytemuck::Zeroable,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PlannedSwap {
    /// MoE layer.
    pub layer: u32,
    /// The cold expert moving into HBM.
    pub incoming: u32,
    /// The hot expert leaving HBM (its host copy stays valid; nothing is copied back).
    pub outgoing: u32,
    /// The rowmap hot slot `incoming` takes over from `outgoing`.
    pub slot: u32,
    /// The layer's rowmap generation this swap was planned against; a swap whose generation no
    /// longer matches is rejected (counted, never applied).
    pub generation: u64,
}

/// What became of a begun swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum SwapOutcome {
    /// The bytes are in place and the table entries were flipped: the controller applies it.
    Committed,
    /// The controller's `accept` refused it (stale generation): the copy was discarded, the table
    /// untouched.
    Discarded,
    /// The executor could not complete the move (copy error): nothing was flipped.
    Failed,
}

/// A swap that left the executor, with its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SwapCompletion {
    /// The swap as begun.
    pub swap: PlannedSwap,
    /// What happened to it.
    pub outcome: SwapOutcome,
}

/// Moves expert bytes host → HBM and flips the engine's expert table; see the module docs for the
/// protocol.
///
/// Contract the controller keeps: at most one swap in flight per layer; `begin` only when
/// `can_begin(layer)`; `commit_ready` only at step boundaries (no forward pass is reading the
/// table while entries flip, or the flip is stream-ordered for a GPU executor).
pub trait SwapExecutor {
    /// Whether a swap in `layer` may begin now (a spare slot is free and no swap of that layer is
    /// in flight). Default: always.
    fn can_begin(&self, layer: u32) -> bool {
        let _ = layer;
        true
    }

    /// Starts the move of `swap.incoming` host → the layer's spare HBM slot. An async executor
    /// returns as soon as the copy is enqueued; a synchronous one may finish the copy here.
    ///
    /// Errors: the swap is refused and nothing was started (bad ids, no spare slot, a swap
    /// already in flight in that layer, device error).
    fn begin(&mut self, swap: &PlannedSwap) -> Result<()>;

    /// At a step boundary: for each begun swap whose bytes are fully in place, in begin order,
    /// calls `accept(&swap)`; on `true` flips the table entries (`incoming` → its HBM slot,
    /// `outgoing` → its host copy) and reports [`SwapOutcome::Committed`], on `false` discards
    /// the copy and reports [`SwapOutcome::Discarded`]. Swaps still copying stay in flight and
    /// are not reported. Failed copies are reported [`SwapOutcome::Failed`].
    fn commit_ready(
        &mut self,
        accept: &mut dyn FnMut(&PlannedSwap) -> bool,
    ) -> Result<Vec<SwapCompletion>>;

    /// Swaps begun and not yet reported by `commit_ready`.
    fn in_flight(&self) -> usize;

    /// The geometry of the bank this executor moves experts in (layers, experts per layer, hot
    /// slots, bytes per expert), if it holds one. [`crate::Controller::step`] and
    /// [`crate::Controller::step_with`] refuse an executor whose geometry differs from the
    /// controller's map ([`crate::ExpertError::GeometryMismatch`], nothing changed) instead of
    /// handing it swaps that would all fail. Default `None`: an executor without a bank (as
    /// [`NullExecutor`]) fits any map.
    fn geometry(&self) -> Option<Geometry> {
        None
    }

    /// Waits until every in-flight copy is in place, so that the next `commit_ready` reports all
    /// of them (shutdown, tests, restoring a map). Default: nothing to wait for.
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Errors with [`crate::ExpertError::Executor`] if `pending` (an executor's begun, uncommitted swaps)
/// already holds a swap of `layer`: the one-in-flight-per-layer rule executors enforce in `begin`.
pub(crate) fn check_layer_idle(pending: &[PlannedSwap], layer: u32) -> Result<()> {
    if pending.iter().any(|s| s.layer == layer) {
        Err(crate::ExpertError::Executor(format!(
            "layer {layer} already has a swap in flight"
        )))
    } else {
        Ok(())
    }
}

/// An executor that moves nothing and confirms every accepted swap at the next step boundary:
/// for replays that only measure the policy (cold share), not the byte moves.
#[derive(Clone, Debug, Default)]
pub struct NullExecutor {
    pending: Vec<PlannedSwap>,
}

impl NullExecutor {
    /// A new executor with nothing in flight.
    pub fn new() -> Self {
        Self::default()
    }
}

impl SwapExecutor for NullExecutor {
    fn can_begin(&self, layer: u32) -> bool {
        check_layer_idle(&self.pending, layer).is_ok()
    }

    fn begin(&mut self, swap: &PlannedSwap) -> Result<()> {
        check_layer_idle(&self.pending, swap.layer)?;
        self.pending.push(*swap);
        Ok(())
    }

    fn commit_ready(
        &mut self,
        accept: &mut dyn FnMut(&PlannedSwap) -> bool,
    ) -> Result<Vec<SwapCompletion>> {
        Ok(self
            .pending
            .drain(..)
            .map(|swap| SwapCompletion {
                outcome: if accept(&swap) {
                    SwapOutcome::Committed
                } else {
                    SwapOutcome::Discarded
                },
                swap,
            })
            .collect())
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}
