//! One step's routing decisions, the unit the counters record.

/// One forward pass (one decode step): the experts picked in every MoE layer.
///
/// `layers[l]` holds the expert ids picked in layer `l` by every routed token of the step,
/// flattened `[tokens × top_k]` (u32 expert ids, each `< experts_per_layer`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepPicks {
    /// Picked expert ids per layer, `[layers][tokens × top_k]`.
    pub layers: Vec<Vec<u32>>,
}
