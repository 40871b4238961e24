//! # cuda-kernels
//!
//! GPU kernels and GPU memory primitives shared by the tierkit tiers: an NVRTC kernel registry,
//! device and pinned host buffers, the expert pick-counting kernel, row copies, and the fused
//! resolve/dedup/fetch kernel of the KV tier. Every kernel has a CPU reference with the same
//! semantics, which the tests compare against. Depends on `tier-core` alone.
//!
//! (Will hold: the kernels of the GPU issues; nothing is implemented yet.)
