//! # tierkit-sim
//!
//! The lab of tierkit: what measures the tiers, never what an engine runs. Routing-trace formats
//! and readers, the calibrated synthetic generators and their tables, replays through every
//! expert policy with the oracle and LRU references, T90, the one expert scoreboard
//! ([`experts::scoreboard`]) that the CLI and the examples print, and the KV serving simulation
//! with its arrival traces and top-k selection generator. The library crates (`expert-residency`,
//! `kv-elastic`) never depend on it.
//!
//! ```
//! use tierkit_sim::experts::{replay, trace::synth, PolicySpec};
//! use expert_residency::{ControllerConfig, Geometry};
//! let mut cfg = synth::SynthConfig::default_scenario();
//! cfg.steps = 200;
//! cfg.phases[1].start_step = 100;
//! let trace = synth::generate(&cfg)?;
//! let g = Geometry::new(trace.shape.layers, trace.shape.experts_per_layer, 16, 1 << 20)?;
//! let r = replay(&trace, &g, &PolicySpec::Static(None), &ControllerConfig::default())?;
//! assert!(r.cold_share_overall > 0.0 && r.cold_share_overall < 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod experts;
pub mod kv;
pub mod output;
pub mod table;
