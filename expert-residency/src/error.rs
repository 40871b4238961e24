//! The crate's error type.

/// Everything that can go wrong in `expert-residency`. Every fallible call returns this and leaves
/// the state it was called on unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ExpertError {
    /// A geometry field is invalid (zero layers, zero experts, `hot_per_layer` of zero or above
    /// `experts_per_layer`, zero `expert_bytes`, ...).
    #[error("invalid geometry: {0}")]
    InvalidGeometry(String),
    /// `hot_per_layer` is larger than `experts_per_layer`.
    #[error("hot_per_layer {hot} exceeds experts_per_layer {experts}")]
    HotExceedsExperts {
        /// Hot experts asked for per layer.
        hot: u32,
        /// Experts per layer.
        experts: u32,
    },
    /// An expert id is not below `experts_per_layer`.
    #[error("expert id {expert} out of range (experts per layer: {experts})")]
    ExpertOutOfRange {
        /// The offending expert id.
        expert: u32,
        /// Experts per layer.
        experts: u32,
    },
    /// An expert id handed over as a signed or wide integer is not in `0..experts`
    /// ([`crate::RouterIds`], [`crate::PickCounters::record_layer`]).
    #[error("expert id {id} at {at} is out of range (experts per layer: {experts})")]
    ExpertIdOutOfRange {
        /// Where: `[token, column]` of a router view, or `element i` of a flat list.
        at: String,
        /// The offending id.
        id: i64,
        /// Experts per layer.
        experts: u32,
    },
    /// A router-ids view is inconsistent (a row stride below k, fewer ids than the view spans).
    #[error("router ids: {0}")]
    InvalidRouterIds(String),
    /// A layer index is not below `layers`.
    #[error("layer {layer} out of range (layers: {layers})")]
    LayerOutOfRange {
        /// The offending layer.
        layer: u32,
        /// Layers of the geometry.
        layers: u32,
    },
    /// Top-k is zero or wider than the experts of a layer.
    #[error("top-k {top_k} is invalid for {experts} experts per layer")]
    TopKTooWide {
        /// Top-k claimed by the trace or engine.
        top_k: u32,
        /// Experts per layer.
        experts: u32,
    },
    /// A rowmap, trace or counter dump was built for another geometry than the one in use.
    #[error("geometry mismatch: expected {expected}, found {found}")]
    GeometryMismatch {
        /// The geometry in use (or the field that differs), in words.
        expected: String,
        /// The geometry found, in words.
        found: String,
    },
    /// A control message asked for a baseline reset without the counter table it reads
    /// ([`crate::Controller::apply_control`] with `snapshot` `None`).
    #[error("a baseline reset (\"baseline\": true) reads the current pick counters, and none were given: pass them with the message (Python `apply_control(message, counters)`, C's `counters` argument, Rust `Some(snapshot)`), or leave `baseline` out")]
    BaselineWithoutCounters,
    /// A slice or table had the wrong length.
    #[error("length mismatch: expected {expected}, found {found}")]
    LengthMismatch {
        /// Expected length.
        expected: usize,
        /// Found length.
        found: usize,
    },
    /// A rowmap is not a valid hot set (duplicate expert, wrong count of hot experts, ...).
    #[error("invalid rowmap: {0}")]
    InvalidRowMap(String),
    /// A trace holds no step, or no lookup at all.
    #[error("empty trace: {0}")]
    EmptyTrace(String),
    /// A planned swap is stale: the layer's map moved since it was planned.
    #[error("stale swap in layer {layer}: planned at generation {expected}, map is at {actual}")]
    StaleSwap {
        /// Layer of the swap.
        layer: u32,
        /// Generation the swap was planned at.
        expected: u64,
        /// Generation of the layer now.
        actual: u64,
    },
    /// A swap does not fit the map (incoming already hot, outgoing not in the slot, ...).
    #[error("invalid swap: {0}")]
    InvalidSwap(String),
    /// A configuration value is out of its range.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// The executor refused a move (e.g. a swap already in flight for the layer).
    #[error("executor: {0}")]
    Executor(String),
    /// A CUDA call of the GPU executor failed (`cuda` feature): the typed `cuda-kernels` error,
    /// which carries the CUDA error name (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
    #[cfg(feature = "cuda")]
    #[error("cuda: {0}")]
    Cuda(#[from] cuda_kernels::CudaError),
    /// A drained counter table went backwards: `cell (layer, expert)` is below the previous
    /// snapshot (wrap-around delta ≥ 2^31), so the table was
    /// re-created, reset or replaced under the controller. Returned only with
    /// [`crate::OnCounterReset::Error`] (the default re-baselines instead); nothing changed: call
    /// [`crate::Controller::reset_baseline`] with the new table to go on.
    #[error(
        "counter table went backwards at layer {layer}, expert {expert}: {previous} -> {current} \
         (re-created or reset under the controller)"
    )]
    CounterReset {
        /// Layer of the first cell found backwards.
        layer: u32,
        /// Expert of that cell.
        expert: u32,
        /// The cell in the previous snapshot.
        previous: u32,
        /// The cell in this snapshot.
        current: u32,
    },
    /// A saved file could not be parsed or has an unsupported version.
    #[error("format: {0}")]
    Format(String),
    /// The host could not allocate a table the geometry or the caller's input asks for (pick
    /// counters, controller tables, maps, executor memory, a counter dump). Nothing changed.
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for (saturated at `u64::MAX`).
        bytes: u64,
    },
    /// An error from `tier-core` (EMA counters, maps); its allocation failures come as
    /// [`ExpertError::OutOfMemory`] instead.
    #[error(transparent)]
    Core(tier_core::CoreError),
}

impl From<tier_core::CoreError> for ExpertError {
    fn from(e: tier_core::CoreError) -> Self {
        match e {
            tier_core::CoreError::AllocationFailed { what, bytes } => {
                ExpertError::OutOfMemory { what, bytes }
            }
            e => ExpertError::Core(e),
        }
    }
}

/// Result alias with [`ExpertError`].
pub type Result<T, E = ExpertError> = std::result::Result<T, E>;

/// An `InvalidConfig` error with `msg`.
pub(crate) fn bad(msg: String) -> ExpertError {
    ExpertError::InvalidConfig(msg)
}

/// `InvalidConfig` unless `v` (the field `name`) is finite and > 0.
pub(crate) fn positive(name: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(format!("{name} must be finite and > 0, got {v}")))
    }
}
