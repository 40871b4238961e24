//! Routing traces: the steps a replay feeds through the controller, their readers and the
//! calibrated synthetic generator.

/// One forward pass (one decode step): the experts picked in every MoE layer.
///
/// `layers[l]` holds the expert ids picked in layer `l` by every routed token of the step,
/// flattened `[tokens × top_k]` (u32 expert ids, each `< experts_per_layer`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepPicks {
    /// Picked expert ids per layer, `[layers][tokens × top_k]`.
    pub layers: Vec<Vec<u32>>,
}

/// The shape a trace claims for itself (checked against a [`crate::Geometry`] before a replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceShape {
    /// MoE layers per step.
    pub layers: u32,
    /// Experts per layer (every id in the trace is below this).
    pub experts_per_layer: u32,
    /// Experts picked per routed token (top-k).
    pub top_k: u32,
}

/// A whole routing trace held in memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    /// A short name (file stem, or scenario name for synthetic traces).
    pub name: String,
    /// The trace's shape.
    pub shape: TraceShape,
    /// The steps, in order.
    pub steps: Vec<StepPicks>,
    /// Step indices at which the traffic is known to shift (synthetic domain shifts); empty for
    /// real traces unless given.
    pub shifts: Vec<u64>,
}
