//! # expert-residency
//!
//! Adaptive hot/cold residency of MoE experts: per-layer rowmaps, pick counters, EMA drains,
//! the swap policy, seed maps fitted offline, and swap executors.
//!
//! (Will hold: the expert tier; nothing is implemented yet.)
