//! # tierkit-bindings
//!
//! Will hold the Python (PyO3, torch tensors) and C ABI bindings of the tierkit tiers, in a later
//! issue. Public types of the tiers are kept plain (ids, `Pod` tables, raw device pointers as
//! `u64`) so that they cross the FFI boundary as they are. Nothing is implemented yet.
