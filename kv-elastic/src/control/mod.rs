//! The control plane: everything about *where* rows are, nothing that moves bytes. Sessions and
//! their lengths ([`SessionState`]), who holds each arena page ([`ArenaPages`]: fixed pages and
//! revocable history loans behind the reader fence), borrowed-page tables, hot-cache CLOCK state
//! ([`HotCache`]), and the decisions of admission, reclaim, hand-back and growth (made by
//! [`crate::ElasticPool`]'s methods, applied to the data plane afterwards). The pool's state of
//! this plane, with its config and counters, is the pool's `Control` (the pool owns it; this
//! module names nothing of the pool's).

mod hot;
mod pages;
mod session;

pub use hot::HotCache;
pub(crate) use pages::ArenaPages;
pub use pages::PageCounts;
pub(crate) use session::SessionState;
