//! # tier-core
//!
//! The mechanisms every tierkit tier shares, in plain Rust with no GPU dependency:
//! pages in fixed-capacity pools, logical-to-physical page maps, revocable loans,
//! epoch-based reader fences and decaying (EMA) counters.
//!
//! (Work in progress: the modules land in the issue that builds this crate.)
