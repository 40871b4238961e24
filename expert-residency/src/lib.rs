//! # expert-residency
//!
//! Adaptive hot/cold residency of MoE experts. A MoE model whose experts do not all fit in HBM
//! keeps the busiest experts of each layer in HBM ("hot") and the rest in pinned host memory
//! ("cold"); expert use is skewed and follows the traffic, so this crate decides, step by step,
//! which experts are hot. The scoreboard is the **cold share**: the fraction of expert lookups
//! served from host memory (0 is perfect).
//!
//! Pieces: [`Geometry`] and per-layer [`RowMap`]s (on tier-core's `PageMap`, one generation per
//! layer; [`ResidencyMap`], saved as versioned JSON); [`PickCounters`] (one relaxed atomic add per
//! pick, the GPU counting kernel's layout); the [`Controller`] (EMA drain, generation-checked
//! swaps under per-layer / per-step caps and a byte budget, a cadence adapted to the traffic,
//! freeze, optional shift response) asking a [`SwapPolicy`] what to swap (`CostPolicy` by
//! default: a swap must save more host bytes than its copy costs on the link; `RatioPolicy`,
//! the published "EMA drain + ratio hysteresis" recipe; `RecencyPolicy`, capped LRU; each with
//! its own config, [`PolicyConfig`]); the [`SwapExecutor`] trait with [`MemoryExecutor`] and
//! [`NullExecutor`]
//! (the GPU executor is `gpu::GpuExecutor`, `cuda` feature); seed maps fitted offline
//! ([`fit_seed_map`]). Traces, replays, oracles and the scoreboard live in the `tierkit-sim`
//! crate.
//!
//! ```
//! use expert_residency::{Controller, ControllerConfig, Geometry, NullExecutor, PickCounters,
//!     ResidencyMap};
//! let g = Geometry::new(2, 8, 2, 1 << 20)?;             // 2 layers × 8 experts, 2 hot
//! let mut ctl = Controller::new(ResidencyMap::first_k("toy", g)?, ControllerConfig {
//!     drain_every: 4, ..ControllerConfig::default() })?;
//! let counters = PickCounters::new(&g)?;
//! let mut exec = NullExecutor::new();
//! for _ in 0..16 {
//!     for l in 0..2 { counters.record(l, 7)?; counters.record(l, 6)?; } // experts 6, 7 are busy
//!     ctl.step(&counters, &mut exec)?;
//! }
//! assert!(ctl.map().is_hot(0, 7) && ctl.map().is_hot(1, 6));
//! # Ok::<(), expert_residency::ExpertError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod named_fields;

mod config;
mod controller;
mod counters;
mod error;
mod executor;
mod geometry;
mod link;
mod memory;
mod picks;
mod policy;
mod router_ids;
mod rowmap;
mod seed;
mod telemetry;

#[cfg(feature = "cuda")]
pub mod gpu;

pub use config::{
    AdaptiveCadence, ControllerConfig, OnCounterReset, ShiftResponse, MAX_CONFIG_FILE_BYTES,
    MAX_WINDOW_DRAINS,
};
pub use controller::{ControlMessage, Controller, StepReport};
pub use counters::{PassKind, PauseGuard, PickCounters};
pub use error::{ExpertError, Result};
pub use executor::{NullExecutor, PlannedSwap, SwapCompletion, SwapExecutor, SwapOutcome};
pub use geometry::{Geometry, MAX_CELLS, MAX_EXPERTS_PER_LAYER, MAX_LAYERS};
pub use link::LinkCost;
pub use memory::{checksum, MemoryExecutor};
pub use picks::StepPicks;
pub use policy::{
    CostConfig, LayerHeat, PolicyConfig, RatioConfig, RecencyConfig, SwapChoice, SwapPolicy,
};
pub use router_ids::{strided_len, RouterIds};
pub use rowmap::{MapFile, ResidencyMap, RowMap, MAP_FORMAT, MAP_VERSION, MAX_MAP_FILE_BYTES};
pub use seed::{
    fit_seed_map, merge_dumps, seed_coverage, CounterDump, Coverage, MAX_DUMP_FILE_BYTES,
};
pub use telemetry::{DrainTelemetry, SwapStats};
pub use tier_core::NOT_RESIDENT;
