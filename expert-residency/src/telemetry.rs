//! Telemetry: swap counts and one record per drain (a JSON line each).

/// Running swap counts of a controller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SwapStats {
    /// Swaps the policy planned (or a map transition requested).
    pub planned: u64,
    /// Swaps the executor committed and the rowmap applied.
    pub applied: u64,
    /// Swaps rejected because the layer's map moved since they were planned (stale generation),
    /// at begin or at commit time. Never applied.
    pub rejected: u64,
    /// Swaps the executor failed (refused at begin, or copy failed). Never applied.
    pub failed: u64,
    /// Swaps dropped without being tried: queued or in flight when the controller was frozen or
    /// its baseline reset.
    pub cancelled: u64,
}

/// One drain's record; [`DrainTelemetry::to_json_line`] gives the JSON line.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DrainTelemetry {
    /// Step count at this drain (steps completed since the controller started).
    pub step: u64,
    /// Drain index, from 1.
    pub drain: u64,
    /// Steps folded by this drain (usually `drain_every`).
    pub elapsed_steps: u64,
    /// Picks counted in the drained interval (all layers).
    pub picks: u64,
    /// Cold share of the interval's picks (0 = all served from HBM; 0 if no picks), estimated
    /// with the rowmap as it is at the drain. Per pick: the link pays per touched expert, see
    /// [`DrainTelemetry::cold_share_touched`] and [`DrainTelemetry::host_bytes_per_step`].
    pub cold_share: f64,
    /// Cold share over the sliding window of the last `window_drains` drains.
    pub cold_share_window: f64,
    /// Cold share per layer over the sliding window, `[layers]`.
    pub cold_share_per_layer: Vec<f64>,
    /// Expert touches of the interval: distinct (step, layer, expert) the steps routed to, the
    /// unit the host link pays in (an expert read once per step however many tokens pick it).
    /// Estimated from the interval's pick counts (`1 − (1 − λ/T)^T` per expert, exact at batch 1;
    /// the controller's `touch.rs`), on the drains of a controller that estimates touches anyway:
    /// the default cost-aware policy, the recency policy, the adaptive cadence. `None` under a
    /// policy that learns from picks alone (the ratio recipe: estimating would cost it ~15× its
    /// drain) and in older lines.
    #[serde(default)]
    pub touched: Option<f64>,
    /// Cold share of the interval's expert touches: the share of touched experts the link
    /// serves (0 if none). Above [`DrainTelemetry::cold_share`] whenever hot experts are picked
    /// by several tokens a step. `None` as [`DrainTelemetry::touched`].
    #[serde(default)]
    pub cold_share_touched: Option<f64>,
    /// [`DrainTelemetry::cold_share_touched`] over the sliding window of the last
    /// `window_drains` drains. `None` as [`DrainTelemetry::touched`].
    #[serde(default)]
    pub cold_share_touched_window: Option<f64>,
    /// Host bytes the link moves per step for the interval's cold touches, read in place:
    /// cold touches × expert bytes ÷ steps (bytes per step; estimated like `touched`). `None`
    /// as [`DrainTelemetry::touched`].
    #[serde(default)]
    pub host_bytes_per_step: Option<f64>,
    /// Swaps planned by this drain.
    pub planned: u32,
    /// Swaps queued (planned, not begun) after planning.
    pub queued: u32,
    /// Swaps in flight in the executor.
    pub in_flight: u32,
    /// Running totals.
    pub totals: SwapStats,
    /// Whether the controller is frozen (counting, never swapping).
    pub frozen: bool,
    /// EMA half-life in force, in steps.
    pub half_life_steps: f64,
    /// Per-layer swap cap in force.
    pub max_swaps_per_layer: u32,
    /// Whether this drain detected a traffic shift (shift response on).
    pub shift_detected: bool,
    /// Drains of shift-response boost left (0 = normal policy).
    pub boost_drains_left: u32,
    /// Whether this drain found the counter table gone backwards and re-baselined (its interval
    /// was dropped: no picks folded, nothing planned). Absent in older lines: false.
    #[serde(default)]
    pub counter_reset: bool,
    /// Counter resets re-baselined so far (running total). Absent in older lines: 0.
    #[serde(default)]
    pub counter_resets: u64,
}

impl DrainTelemetry {
    /// One line of JSON (no newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("telemetry serializes")
    }
}
