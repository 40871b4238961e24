//! # expert-residency
//!
//! Adaptive hot/cold residency of MoE experts: per-layer rowmaps, pick counters, EMA drains,
//! the swap policy, seed maps fitted offline, and swap executors.
//!
//! (Work in progress.)

pub mod trace;

#[cfg(feature = "cuda")]
pub mod gpu;
