//! The control plane: everything about *where* rows are, nothing that moves bytes. Sessions and
//! their lengths ([`SessionState`]), who holds each arena page ([`ArenaPages`]: fixed pages and
//! revocable history loans behind the reader fence), borrowed-page tables, hot-cache CLOCK state
//! ([`HotCache`]), and the decisions of admission, reclaim, hand-back and growth (made by
//! [`crate::ElasticPool`]'s methods, applied to the data plane afterwards).

mod hot;
mod pages;
mod session;

pub use hot::HotCache;
pub(crate) use pages::ArenaPages;
pub use pages::PageCounts;
pub(crate) use session::SessionState;

use std::collections::BTreeMap;

use crate::data::SessionId;
use crate::layout::Geometry;
use crate::pool::{ImportState, PoolConfig, PoolCounters, TransferCounters};

/// The control plane's state of one pool.
#[derive(Debug)]
pub(crate) struct Control {
    pub(crate) geometry: Geometry,
    pub(crate) config: PoolConfig,
    pub(crate) pages: ArenaPages,
    pub(crate) sessions: BTreeMap<SessionId, SessionState>,
    pub(crate) grow_cursor: SessionId,
    pub(crate) counters: PoolCounters,
    /// Imports in flight (rows reserved, not committed).
    pub(crate) imports: BTreeMap<SessionId, ImportState>,
    /// `between_steps` calls before an uncommitted import times out.
    pub(crate) import_timeout: u32,
    pub(crate) transfers: TransferCounters,
}
