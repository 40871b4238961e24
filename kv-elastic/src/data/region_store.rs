//! [`RegionBytes`]: the CPU pool's host-store backing in one registrable [`HostRegion`]
//! (`u8 [max_slots][max_history][layers][row_bytes]`, the GPU pool's pinned-store layout, over
//! page-aligned host memory and no CUDA), and [`CpuBytes`], the CPU pool's backing: a `Vec` per
//! session ([`VecBytes`], the default) or a region.

use crate::data::host::sealed;
use crate::data::region::{HostMemory, HostRegion, RegionDesc, StoreLayout, TeardownHook};
use crate::data::slots::SlotBooks;
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
    region: HostRegion,
    layout: StoreLayout,
    books: SlotBooks,
}

// The region's bytes are reached through raw pointers only (no reference to the whole region is
// ever made), and every slice handed out covers a live session's committed rows.

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
        Ok(Self {
            books: SlotBooks::new(layout.max_slots),
            region,
            layout,
        })
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
        self.books.free_count()
    }

    fn slot_bytes(&self) -> usize {
        self.layout.slot_bytes() as usize
    }

    fn full(&self, what: &'static str, value: u64, limit: u64) -> KvError {
        KvError::StoreCapacity { what, value, limit }
    }

    /// Copies `bytes` to offset `off` of the region (no reference to the rest of it is made:
    /// transfer agents may be writing other slots meanwhile).
    fn write(&mut self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.region.len(), "inside the region");
        // SAFETY: `off .. off + bytes.len()` lies inside the region (checked above); the bytes
        // are past a live session's committed rows or in a slot just taken, which no transfer
        // agent was handed (imports and exports name other slots or committed rows), and
        // `&mut self` excludes other host writers.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.region.base().add(off), bytes.len())
        };
    }
}

impl sealed::Sealed for RegionBytes {}

impl HostBytes for RegionBytes {
    fn check_room(&self, history_bytes: usize) -> Result<()> {
        if history_bytes > self.slot_bytes() {
            return Err(self.full(
                "history length (max_history)",
                (history_bytes as u64).div_ceil(self.layout.token_bytes()),
                self.layout.max_history as u64 + 1,
            ));
        }
        if !self.books.has_free() {
            return Err(self.full(
                "sessions holding a slot (max_sessions)",
                self.books.held() as u64 + 1,
                self.layout.max_slots as u64 + 1,
            ));
        }
        Ok(())
    }

    fn create(&mut self, session: SessionId, history: &[u8]) -> Result<()> {
        self.check_room(history.len())?;
        let b = self.books.take(session).expect("checked room");
        self.write(b as usize * self.slot_bytes(), history);
        self.books.set_used(b, history.len());
        Ok(())
    }

    fn append(&mut self, session: SessionId, bytes: &[u8]) -> Result<()> {
        let b = self.books.slot_of(session).expect("checked live");
        let used = self.books.used(b);
        if used + bytes.len() > self.slot_bytes() {
            return Err(self.full(
                "history length (max_history)",
                ((used + bytes.len()) as u64).div_ceil(self.layout.token_bytes()),
                self.layout.max_history as u64 + 1,
            ));
        }
        self.write(b as usize * self.slot_bytes() + used, bytes);
        self.books.set_used(b, used + bytes.len());
        Ok(())
    }

    fn extend_device_written(&mut self, _session: SessionId, _bytes: usize) -> Result<()> {
        Err(KvError::Unsupported(
            "device-written appends need the GPU pool's pinned store",
        ))
    }

    fn bytes(&self, session: SessionId) -> Result<&[u8]> {
        let b = self.books.slot_of(session).expect("checked live");
        let off = b as usize * self.slot_bytes();
        // SAFETY: `off .. off + used` lies inside the region (slot `b`, `used <= slot_bytes`)
        // and holds the session's committed rows: only host writes past `used` (which need
        // `&mut self`, excluded while this borrow lives) and reads by export agents touch them.
        Ok(unsafe { std::slice::from_raw_parts(self.region.base().add(off), self.books.used(b)) })
    }

    fn remove(&mut self, session: SessionId) {
        self.books.free(session, false);
    }

    fn region(&self) -> Option<(RegionDesc, StoreLayout)> {
        Some((self.region.desc(), self.layout))
    }

    fn slot(&self, session: SessionId) -> Option<u32> {
        self.books.slot_of(session)
    }

    fn reserve_import(&mut self, session: SessionId) -> Result<u32> {
        self.check_room(0)?;
        Ok(self.books.take(session).expect("checked room"))
    }

    fn commit_import(&mut self, session: SessionId, bytes: usize) {
        let b = self.books.slot_of(session).expect("importing");
        self.books.set_used(b, bytes);
    }

    fn drop_import(&mut self, session: SessionId) {
        self.books.free(session, false);
    }

    fn pin_export(&mut self, session: SessionId) -> Result<()> {
        self.books.pin_export(session).expect("checked live");
        Ok(())
    }

    fn exports_of(&self, session: SessionId) -> u32 {
        self.books.exports_of(session)
    }

    fn unpin_export(&mut self, session: SessionId) -> bool {
        self.books.unpin_export(session)
    }

    fn memory(&self) -> HostMemory {
        HostMemory {
            store_bytes: self.layout.store_bytes(),
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
