//! [`RegionBytes`]: the CPU pool's host-store backing in one registrable [`HostRegion`]
//! (`u8 [max_slots][max_history][layers][row_bytes]`, the GPU pool's pinned-store layout, over
//! page-aligned host memory and no CUDA), and [`CpuBytes`], the CPU pool's backing: a `Vec` per
//! session ([`VecBytes`], the default) or a region.

use crate::data::host::sealed;
use crate::data::region::{HostMemory, HostRegion, RegionDesc, StoreLayout, TeardownHook};
use crate::data::slots::SlotStore;
use crate::data::{HostBytes, SessionId, VecBytes};
use crate::error::{KvError, Result};

/// How a region-backed host store is sized and where its memory comes from
/// ([`crate::ElasticPool::with_store`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreConfig {
    /// Session slots (live, importing and exported sessions each hold one).
    pub max_sessions: u32,
    /// Positions per slot (a session's committed history at most).
    pub max_history: u32,
    /// Lock the region in RAM (`mlock`, populating it now), as a pinned store is.
    pub lock: bool,
}

/// A host-store backing in one [`HostRegion`] (see the module docs): a session's history is
/// one contiguous run of its slot, so a transfer agent registers the region once and writes or
/// reads any session's rows in place.
#[derive(Debug)]
pub struct RegionBytes {
    /// The slots over the region's memory (declared first: dropped before the region).
    store: SlotStore,
    region: HostRegion,
}

impl RegionBytes {
    /// A store of `layout` over `region`. Errors: `InvalidConfig` for a region shorter than
    /// `layout.store_bytes()` or a layout with a zero field.
    pub fn new(region: HostRegion, layout: StoreLayout) -> Result<Self> {
        if layout.max_slots == 0 || layout.max_history == 0 || layout.token_bytes() == 0 {
            return Err(KvError::InvalidConfig(
                "a host store needs max_sessions, max_history, layers and row_bytes > 0".into(),
            ));
        }
        if (region.len() as u64) < layout.store_bytes() {
            return Err(KvError::InvalidConfig(format!(
                "host region of {} bytes, the store needs {}",
                region.len(),
                layout.store_bytes()
            )));
        }
        let full = |what, value, limit| KvError::StoreCapacity { what, value, limit };
        // SAFETY: the region's memory is mapped while `region` lives, which this value owns
        // (the store drops first); the layout fits (checked above); only the store and the
        // writers it hands rows to write it.
        let store = unsafe { SlotStore::new(region.base(), region.len(), layout, full) };
        Ok(Self { store, region })
    }

    /// The region.
    pub fn host_region(&self) -> &HostRegion {
        &self.region
    }

    /// Mutable region (bounded teardown: [`HostRegion::release_step`]).
    pub fn host_region_mut(&mut self) -> &mut HostRegion {
        &mut self.region
    }

    /// Slots a new session could take now.
    pub fn free_slots(&self) -> usize {
        self.store.books.free_count()
    }
}

impl sealed::Sealed for RegionBytes {}

impl HostBytes for RegionBytes {
    fn check_room(&self, history_bytes: usize) -> Result<()> {
        self.store.check_room(history_bytes)
    }

    fn create(&mut self, session: SessionId, history: &[u8]) -> Result<()> {
        self.store.create(session, history).map(|_| ())
    }

    fn append(&mut self, session: SessionId, bytes: &[u8]) -> Result<()> {
        self.store.append(session, Some(bytes), bytes.len())
    }

    fn extend_device_written(&mut self, _session: SessionId, _bytes: usize) -> Result<()> {
        Err(KvError::Unsupported(
            "device-written appends need the GPU pool's pinned store",
        ))
    }

    fn bytes(&self, session: SessionId) -> Result<&[u8]> {
        Ok(self.store.committed(session))
    }

    fn remove(&mut self, session: SessionId) {
        self.store.books.free(session, false);
    }

    fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        Some((self.region.desc(), self.store.layout()))
    }

    crate::data::forward_slot_books!(store);

    fn commit_import(&mut self, session: SessionId, bytes: usize) {
        self.store.commit_import(session, bytes);
    }

    fn memory(&self) -> HostMemory {
        HostMemory {
            store_bytes: self.store.layout().store_bytes(),
            ..self.region.memory()
        }
    }

    fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        self.region.on_teardown(hook);
        Ok(())
    }
}

/// The CPU pool's host-store backing: a `Vec` per session ([`VecBytes`], [`crate::ElasticPool::new`])
/// or one registrable region ([`RegionBytes`], [`crate::ElasticPool::with_store`]).
#[derive(Debug)]
pub struct CpuBytes(Backing);

#[derive(Debug)]
enum Backing {
    Vec(VecBytes),
    Region(Box<RegionBytes>),
}

impl CpuBytes {
    pub(crate) fn vec() -> Self {
        CpuBytes(Backing::Vec(VecBytes::default()))
    }

    pub(crate) fn region(r: RegionBytes) -> Self {
        CpuBytes(Backing::Region(Box::new(r)))
    }

    /// The region-backed store, if this is one.
    pub fn as_region(&self) -> Option<&RegionBytes> {
        match &self.0 {
            Backing::Region(r) => Some(r),
            Backing::Vec(_) => None,
        }
    }

    /// Mutable region-backed store, if this is one.
    pub fn as_region_mut(&mut self) -> Option<&mut RegionBytes> {
        match &mut self.0 {
            Backing::Region(r) => Some(r),
            Backing::Vec(_) => None,
        }
    }
}

impl sealed::Sealed for CpuBytes {}

/// Forwards a [`HostBytes`] method to the backing.
macro_rules! forward {
    ($self:ident, $b:ident => $e:expr) => {
        match &$self.0 {
            Backing::Vec($b) => $e,
            Backing::Region($b) => $e,
        }
    };
    (mut $self:ident, $b:ident => $e:expr) => {
        match &mut $self.0 {
            Backing::Vec($b) => $e,
            Backing::Region($b) => $e,
        }
    };
}

impl HostBytes for CpuBytes {
    fn check_room(&self, history_bytes: usize) -> Result<()> {
        forward!(self, b => b.check_room(history_bytes))
    }
    fn reserve_new(&mut self, history_bytes: usize) -> Result<()> {
        forward!(mut self, b => b.reserve_new(history_bytes))
    }
    fn release_reserved(&mut self) {
        forward!(mut self, b => b.release_reserved())
    }
    fn create(&mut self, session: SessionId, history: &[u8]) -> Result<()> {
        forward!(mut self, b => b.create(session, history))
    }
    fn append(&mut self, session: SessionId, bytes: &[u8]) -> Result<()> {
        forward!(mut self, b => b.append(session, bytes))
    }
    fn extend_device_written(&mut self, session: SessionId, bytes: usize) -> Result<()> {
        forward!(mut self, b => b.extend_device_written(session, bytes))
    }
    fn bytes(&self, session: SessionId) -> Result<&[u8]> {
        forward!(self, b => b.bytes(session))
    }
    fn remove(&mut self, session: SessionId) {
        forward!(mut self, b => b.remove(session))
    }
    fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        forward!(self, b => b.region())
    }
    fn slot(&self, session: SessionId) -> Option<u32> {
        forward!(self, b => b.slot(session))
    }
    fn reserve_import(&mut self, session: SessionId) -> Result<u32> {
        forward!(mut self, b => b.reserve_import(session))
    }
    fn commit_import(&mut self, session: SessionId, bytes: usize) {
        forward!(mut self, b => b.commit_import(session, bytes))
    }
    fn drop_import(&mut self, session: SessionId) {
        forward!(mut self, b => b.drop_import(session))
    }
    fn pin_export(&mut self, session: SessionId) -> Result<()> {
        forward!(mut self, b => b.pin_export(session))
    }
    fn exports_of(&self, session: SessionId) -> u32 {
        forward!(self, b => b.exports_of(session))
    }
    fn unpin_export(&mut self, session: SessionId) -> bool {
        forward!(mut self, b => b.unpin_export(session))
    }
    fn memory(&self) -> HostMemory {
        forward!(self, b => b.memory())
    }
    fn on_teardown(&mut self, hook: TeardownHook) -> Result<()> {
        forward!(mut self, b => b.on_teardown(hook))
    }
}
