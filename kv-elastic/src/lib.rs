//! # kv-elastic
//!
//! The elastic sparse-attention KV pool (after HiSparse): every session's history in pinned host
//! memory, a small hot cache per request, and free HBM lent to requests as borrowed pages,
//! resolved exactly for the indexer's top-k positions.
//!
//! (Will hold: the KV tier; nothing is implemented yet.)
