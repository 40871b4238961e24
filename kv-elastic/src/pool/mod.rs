//! [`ElasticPool`]: the exact CPU pool. Its fields are the two planes: the control plane
//! ([`crate::control`]: sessions, page loans, page tables, hot-cache CLOCK state, decisions) and the
//! data plane ([`crate::data`]: the host store and the CPU arena's bytes). Jobs, one module each:
//! `lifecycle` (admit, append, drafts, finish, reclaim, between steps), `validate` (a resolve's
//! input checks, shared with the GPU back-end), `cpu_resolve` (the [`Resolver`] reference).

use std::collections::BTreeMap;

use crate::control::{ArenaPages, PageCounts, SessionState};
use crate::data::{
    CpuBytes, CpuData, DataPlane, HostRegion, HostStore, RegionBytes, SessionId, StoreConfig,
    StoreLayout,
};
use crate::error::{KvError, Result};
use crate::layout::Geometry;
#[cfg(doc)]
use crate::resolve::Resolver;

mod cpu_resolve;
mod lifecycle;
mod transfer;
mod validate;

pub(crate) use transfer::ImportState;
pub use transfer::{ImportInfo, Reserve, RowSpan, TransferCounters, DEFAULT_IMPORT_TIMEOUT_STEPS};

/// The control plane's state of one pool ([`crate::control`]'s types, the pool's config and
/// counters).
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

/// How the pool places history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolConfig {
    /// Lend free HBM as elastic history pages (Adaptive HiSparse). `false` = fixed hot cache only
    /// (HiSparse).
    pub elastic: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self { elastic: true }
    }
}

/// The outcome of [`ElasticPool::admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted; `borrowed_pages` elastic pages hold the newest history pages.
    Admitted {
        /// Elastic pages borrowed at admission.
        borrowed_pages: u32,
    },
    /// Not admitted yet: borrowed pages were reclaimed, but `pending` pages still wait for readers
    /// in flight. Nothing about the session was created; call again after the readers complete.
    Waiting {
        /// Pages waiting behind reader fences.
        pending: u32,
    },
}

/// Options of [`ElasticPool::admit_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdmitOptions {
    /// Most elastic pages the admission borrows for the session's history (newest first, free
    /// pages only). `u32::MAX` (the default, [`ElasticPool::admit`]'s) borrows as much as is
    /// free; 0 admits the session on its hot cache alone, its history served from host until
    /// pages are lent to it.
    pub max_borrowed_pages: u32,
}

impl Default for AdmitOptions {
    fn default() -> Self {
        Self {
            max_borrowed_pages: u32::MAX,
        }
    }
}

/// Options of [`ElasticPool::between_steps_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepOptions {
    /// Lend free pages to sessions missing history (the elastic tier's growth, including pages
    /// taken back under pressure: promotion back). `true` by default ([`ElasticPool::between_steps`]);
    /// `false` only hands back finished sessions' pages and frees pages whose readers left, for
    /// a caller that decides itself who grows ([`ElasticPool::lend`]).
    pub growth: bool,
}

impl Default for StepOptions {
    fn default() -> Self {
        Self { growth: true }
    }
}

/// Running totals of the pool's activity (rows are per layer; bytes cover all layers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolCounters {
    /// Sessions admitted.
    pub admitted: u64,
    /// Sessions finished.
    pub finished: u64,
    /// Elastic pages lent (at admission and by growth between steps).
    pub pages_lent: u64,
    /// Elastic pages reclaimed under pressure.
    pub pages_reclaimed: u64,
    /// Elastic pages of finished sessions handed back.
    pub pages_handed_back: u64,
    /// Tokens copied host → arena into elastic pages (all layers each).
    pub page_fill_tokens: u64,
    /// Distinct demand misses (tokens fetched host → hot cache by resolves).
    pub miss_tokens: u64,
    /// Tokens fetched by prefetches.
    pub prefetch_tokens: u64,
}

/// What [`ElasticPool::between_steps`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepMaintenance {
    /// Pages of finished sessions moved to the fence this step.
    pub handed_back: u32,
    /// Pages that became free (readers gone).
    pub collected: u32,
    /// Pages lent to sessions missing history.
    pub grown: u32,
    /// Imports that timed out at this call (see [`ElasticPool::reserve`]).
    pub imports_expired: u32,
}

/// A live session's placement (see [`ElasticPool::placement`]).
#[derive(Clone, Copy, Debug)]
pub struct SessionPlacement<'a> {
    /// Physical page of each fixed page (hot cache, tail, scratch rows in that order).
    pub fixed_pages: &'a [u32],
    /// Borrowed history pages: physical page of logical page `j` (positions
    /// `j × page_rows..(j + 1) × page_rows`), [`tier_core::NOT_RESIDENT`] when not resident.
    pub page_table: &'a [i32],
    /// Committed positions.
    pub committed: u32,
    /// Draft tokens in scratch.
    pub scratch_len: u32,
    /// Whole history resident (tail + borrowed pages).
    pub full: bool,
}
/// The elastic KV pool and its exact CPU resolver (after HiSparse; see the crate docs for the data
/// flow and `kv-elastic/DESIGN.md` for the design).
///
/// Arena rows of a session: fixed local rows `0..hot_rows` are hot-cache slots,
/// `hot_rows..hot_rows + tail_rows` the tail ring (position `p` at `p % tail_rows`), then the scratch
/// rows; they live in the session's fixed pages. History page `j` (positions
/// `j × page_rows..(j + 1) × page_rows`, complete pages only) may be borrowed: physical row
/// `page × page_rows + p % page_rows`.
///
/// `D` is the data plane that executes the control plane's decisions: [`CpuData`] (the default,
/// the exact CPU reference with its arena in host memory) or the GPU back-end's `gpu::GpuData`
/// (feature `cuda`), which `gpu::GpuElasticPool` drives.
pub struct ElasticPool<D: DataPlane = CpuData> {
    /// Control plane: sessions, loans, page tables, hot caches, counters.
    pub(crate) ctl: Control,
    /// Data plane: committed history (source of truth) and the arena's bytes.
    pub(crate) data: D,
}

impl<D: DataPlane> std::fmt::Debug for ElasticPool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElasticPool")
            .field("geometry", &self.ctl.geometry)
            .field("config", &self.ctl.config)
            .field("sessions", &self.ctl.sessions.len())
            .field("free_pages", &self.ctl.pages.free_count())
            .field("counters", &self.ctl.counters)
            .finish()
    }
}

impl ElasticPool {
    /// A pool for `geometry` (validated: `InvalidGeometry`, `ArenaTooSmall`; see
    /// [`Geometry::validate`] for the bounds). The arena starts zeroed; every page is free. It takes
    /// `layers × plane_bytes` bytes of host memory (zeroed lazily by the allocator); when the host
    /// cannot allocate them: `OutOfMemory`.
    pub fn new(geometry: Geometry, config: PoolConfig) -> Result<Self> {
        geometry.validate()?;
        let data = CpuData::new(&geometry, CpuBytes::vec())?;
        Self::with_data(geometry, config, data)
    }

    /// As [`ElasticPool::new`], with the host store in one registrable region of
    /// `store.max_sessions × store.max_history × token_bytes` bytes (page-aligned, mapped by
    /// tierkit, locked in RAM with `store.lock`): the layout of the GPU pool's pinned store,
    /// which transfer agents register once ([`ElasticPool::region`]) and write imports into /
    /// read exports from in place ([`ElasticPool::reserve`], [`ElasticPool::export`]).
    ///
    /// # Errors
    /// As [`ElasticPool::new`]; `InvalidConfig` for a zero `max_sessions` / `max_history`, or a
    /// store whose size overflows 64 bits; `OutOfMemory` when the region cannot be mapped or
    /// locked.
    pub fn with_store(geometry: Geometry, config: PoolConfig, store: StoreConfig) -> Result<Self> {
        // Validated once, before the region is allocated (`with_region_checked` does not again).
        geometry.validate()?;
        let layout = StoreLayout {
            max_slots: store.max_sessions,
            max_history: store.max_history,
            layers: geometry.layers,
            row_bytes: geometry.row_bytes,
        };
        let total = layout.checked_store_bytes().ok_or_else(|| {
            KvError::InvalidConfig(format!(
                "a host store of max_sessions {} × max_history {} × {} bytes per token overflows \
                 64 bits",
                store.max_sessions,
                store.max_history,
                layout.token_bytes()
            ))
        })?;
        let bytes = usize::try_from(total).map_err(|_| KvError::OutOfMemory {
            what: "host store region",
            bytes: total,
        })?;
        if bytes == 0 {
            return Err(KvError::InvalidConfig(
                "a host store needs max_sessions and max_history > 0".into(),
            ));
        }
        let region = HostRegion::allocate(bytes, geometry.token_bytes(), store.lock)?;
        Self::with_region_checked(geometry, config, layout, region)
    }

    /// As [`ElasticPool::with_store`], on a region the caller built: [`HostRegion::adopt`] of
    /// engine-owned memory (an `mmap`, a shared-memory segment), or [`HostRegion::allocate`].
    /// `layout` must have the geometry's `layers` and `row_bytes`.
    ///
    /// # Errors
    /// As [`ElasticPool::new`]; `InvalidConfig` for a layout that does not match the geometry or
    /// does not fit in the region.
    pub fn with_region(
        geometry: Geometry,
        config: PoolConfig,
        layout: StoreLayout,
        region: HostRegion,
    ) -> Result<Self> {
        geometry.validate()?;
        Self::with_region_checked(geometry, config, layout, region)
    }

    /// [`ElasticPool::with_region`] for a validated `geometry`.
    fn with_region_checked(
        geometry: Geometry,
        config: PoolConfig,
        layout: StoreLayout,
        region: HostRegion,
    ) -> Result<Self> {
        if layout.layers != geometry.layers || layout.row_bytes != geometry.row_bytes {
            return Err(KvError::InvalidConfig(format!(
                "store layout of {} layers × {} bytes, the geometry has {} × {}",
                layout.layers, layout.row_bytes, geometry.layers, geometry.row_bytes
            )));
        }
        let data = CpuData::new(
            &geometry,
            CpuBytes::region(RegionBytes::new(region, layout)?),
        )?;
        Self::with_data(geometry, config, data)
    }

    /// Bounded teardown of a region-backed store, between steps while the engine shuts down:
    /// runs the teardown hooks (agents' deregistration; first call), then unlocks at most
    /// `max_bytes` (at least one page) of the region; returns the bytes still locked. Call until
    /// it returns 0; the pool's drop does whatever is left. Errors: `Unsupported` for a store
    /// without a region.
    pub fn release_store_step(&mut self, max_bytes: usize) -> Result<usize> {
        let r = self
            .data
            .host_mut()
            .backing_mut()
            .as_region_mut()
            .ok_or(KvError::Unsupported("the host store has no region"))?;
        Ok(r.host_region_mut().release_step(max_bytes))
    }

    /// One layer's arena plane (`u8 [arena_pages][page_bytes]`, [`Geometry::plane_bytes`] bytes:
    /// `u8 [arena_rows][row_bytes]` for the contiguous format; [`Geometry::plane_row`] reads a row
    /// of it in any format). Errors: `LayerOutOfRange`.
    pub fn plane(&self, layer: u32) -> Result<&[u8]> {
        self.data
            .arena()
            .plane(layer)
            .ok_or(KvError::LayerOutOfRange {
                layer,
                layers: self.ctl.geometry.layers,
            })
    }

    /// One arena row of one layer as the token's `value ‖ scale` bytes (`row_bytes` bytes: the
    /// row itself for [`RowFormat::Contiguous`](crate::RowFormat), borrowed; its two segments
    /// gathered for `PagedSplit`, owned), or `None` when out of range.
    pub fn arena_row(&self, layer: u32, row: i32) -> Option<std::borrow::Cow<'_, [u8]>> {
        self.data.arena().row(layer, row)
    }
}

impl<D: DataPlane> ElasticPool<D> {
    /// A pool for a validated `geometry` on the data plane `data` (which holds no session yet).
    /// Every caller validated the geometry first, once (`ElasticPool::new`, `with_store`,
    /// `with_region`, the GPU pool's constructor): it is not checked again here.
    pub(crate) fn with_data(geometry: Geometry, config: PoolConfig, data: D) -> Result<Self> {
        let pages = ArenaPages::new(geometry.arena_pages)?;
        Ok(Self {
            ctl: Control {
                geometry,
                config,
                pages,
                sessions: BTreeMap::new(),
                grow_cursor: 0,
                counters: PoolCounters::default(),
                imports: BTreeMap::new(),
                import_timeout: DEFAULT_IMPORT_TIMEOUT_STEPS,
                transfers: TransferCounters::default(),
            },
            data,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.ctl.geometry
    }

    /// The placement configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.ctl.config
    }

    /// The host store.
    pub fn host(&self) -> &HostStore<D::Bytes> {
        self.data.host()
    }

    /// The data plane.
    pub fn data(&self) -> &D {
        &self.data
    }

    /// Page counts (free, fixed, history, pending behind the reader fence, queued for hand-back).
    pub fn pages(&self) -> PageCounts {
        self.ctl.pages.counts()
    }

    /// The reader fence: a page reclaimed or handed back becomes free only once every reader
    /// registered before (every [`crate::ReadTicket`] in flight) has completed.
    pub fn fence(&self) -> &tier_core::EpochFence {
        self.ctl.pages.fence()
    }

    /// Running totals.
    pub fn counters(&self) -> &PoolCounters {
        &self.ctl.counters
    }

    /// Sessions admitted and not finished.
    pub fn active_sessions(&self) -> usize {
        self.ctl.sessions.len()
    }

    /// Ids of admitted, unfinished sessions (ascending).
    pub fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.ctl.sessions.keys().copied()
    }

    /// Committed length of a live session.
    pub fn committed_len(&self, session: SessionId) -> Result<u32> {
        self.session(session).map(|r| r.committed)
    }

    /// Draft tokens in a live session's scratch.
    pub fn scratch_len(&self, session: SessionId) -> Result<u32> {
        self.session(session).map(|r| r.scratch_len)
    }

    /// Elastic pages a live session holds.
    pub fn borrowed_pages(&self, session: SessionId) -> Result<u32> {
        self.session(session).map(|r| r.pages.mapped_count())
    }

    /// Whether a live session holds its whole history (tail + borrowed pages): the direct path.
    pub fn holds_all(&self, session: SessionId) -> Result<bool> {
        self.session(session)
            .map(|r| r.fully_held(&self.ctl.geometry))
    }

    /// Where a live session's rows are, for a device mirror (the GPU back-end publishes this between
    /// steps): its fixed pages (hot-cache rows, then tail, then scratch, `page_rows` per page), its
    /// borrowed-page table ([`tier_core::NOT_RESIDENT`] = not resident), committed and draft lengths, and whether the whole
    /// history is resident (direct path). Errors: `UnknownSession`, `SessionFinished`.
    pub fn placement(&self, session: SessionId) -> Result<SessionPlacement<'_>> {
        let r = self.session(session)?;
        Ok(SessionPlacement {
            fixed_pages: &r.fixed_pages,
            page_table: r.pages.table(),
            committed: r.committed,
            scratch_len: r.scratch_len,
            full: r.fully_held(&self.ctl.geometry),
        })
    }

    /// A live session's hot cache of layer group `group` (CLOCK state: `slot → position` table,
    /// lookups), read-only. Errors: `UnknownSession`, `SessionFinished`, `LayerOutOfRange`
    /// (naming the group and the group count) for a group past the last.
    pub fn hot_cache(&self, session: SessionId, group: u32) -> Result<&crate::control::HotCache> {
        let r = self.session(session)?;
        r.hot.get(group as usize).ok_or(KvError::LayerOutOfRange {
            layer: group,
            layers: r.hot.len() as u32,
        })
    }

    /// Elastic pages lent to live sessions.
    pub fn elastic_lent(&self) -> u32 {
        self.ctl
            .sessions
            .values()
            .map(|r| r.pages.mapped_count())
            .sum()
    }

    fn session(&self, session: SessionId) -> Result<&SessionState> {
        self.data.host().check_live(session)?;
        self.ctl
            .sessions
            .get(&session)
            .ok_or(KvError::UnknownSession(session))
    }

    /// History pages a session of `committed` positions wants resident (borrowed pages can hold):
    /// the complete pages covering positions outside its tail, `min(ceil((committed −
    /// tail_rows) / page_rows), committed / page_rows)`.
    pub fn wanted_pages(&self, committed: u32) -> u32 {
        let g = &self.ctl.geometry;
        committed
            .saturating_sub(g.tail_rows)
            .div_ceil(g.page_rows)
            .min(committed / g.page_rows)
    }

    #[inline]
    fn fixed_row(&self, r: &SessionState, local: u32) -> u32 {
        self.ctl.geometry.fixed_row(&r.fixed_pages, local)
    }

    #[inline]
    fn tail_row(&self, r: &SessionState, position: u32) -> u32 {
        self.fixed_row(
            r,
            self.ctl.geometry.hot_rows + position % self.ctl.geometry.tail_rows,
        )
    }

    #[inline]
    fn scratch_row(&self, r: &SessionState, i: u32) -> u32 {
        self.fixed_row(
            r,
            self.ctl.geometry.hot_rows + self.ctl.geometry.tail_rows + i,
        )
    }
}
