//! [`SlotBooks`]: which session holds each slot of a slot-based host store (the CPU pool's
//! region store and the GPU pool's pinned store, both `[max_slots][max_history][layers][row_bytes]`),
//! and when a freed slot may be taken again.
//!
//! A slot is taken by a live or importing session. It is free for a new session only when no
//! session holds it, the device passed the work queued before it was freed (`blocked`, the GPU
//! store) and no export still reads it (`exports`: rows a transfer agent reads stay pinned until
//! it reports completion, even after the session finished).

use hashbrown::HashMap;

use crate::data::{SessionId, StoreLayout};
use crate::error::{KvError, Result};

/// Slot ownership of a slot-based host store (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct SlotBooks {
    slot_of: HashMap<SessionId, u32>,
    session_of: Vec<Option<SessionId>>,
    /// Committed bytes of each slot.
    used: Vec<usize>,
    /// Freed slots the device may still touch.
    blocked: Vec<bool>,
    /// Open exports reading each slot.
    exports: Vec<u32>,
    /// The slot of each exported session (kept after its finish, until its last export ends).
    exported: HashMap<SessionId, u32>,
}

impl SlotBooks {
    pub(crate) fn new(slots: u32) -> Self {
        let n = slots as usize;
        Self {
            slot_of: HashMap::new(),
            session_of: vec![None; n],
            used: vec![0; n],
            blocked: vec![false; n],
            exports: vec![0; n],
            exported: HashMap::new(),
        }
    }

    pub(crate) fn slots(&self) -> usize {
        self.session_of.len()
    }

    pub(crate) fn slot_of(&self, session: SessionId) -> Option<u32> {
        self.slot_of.get(&session).copied()
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn session_at(&self, slot: u32) -> Option<SessionId> {
        self.session_of.get(slot as usize).copied().flatten()
    }

    /// Sessions holding a slot (live or importing).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn held(&self) -> usize {
        self.slot_of.len()
    }

    fn is_free(&self, b: usize) -> bool {
        self.session_of[b].is_none() && !self.blocked[b] && self.exports[b] == 0
    }

    /// Slots a new session could take now.
    pub(crate) fn free_count(&self) -> usize {
        (0..self.slots()).filter(|&b| self.is_free(b)).count()
    }

    pub(crate) fn has_free(&self) -> bool {
        (0..self.slots()).any(|b| self.is_free(b))
    }

    /// Takes the first free slot for `session` (`None`: none free).
    pub(crate) fn take(&mut self, session: SessionId) -> Option<u32> {
        let b = (0..self.slots()).find(|&b| self.is_free(b))?;
        self.slot_of.insert(session, b as u32);
        self.session_of[b] = Some(session);
        self.used[b] = 0;
        Some(b as u32)
    }

    pub(crate) fn used(&self, slot: u32) -> usize {
        self.used[slot as usize]
    }

    pub(crate) fn set_used(&mut self, slot: u32, bytes: usize) {
        self.used[slot as usize] = bytes;
    }

    /// Frees `session`'s slot; with `block` it stays unusable until [`SlotBooks::unblock`]
    /// (device work may still touch it). Exported slots stay unusable until their last export
    /// ends. Returns the slot.
    pub(crate) fn free(&mut self, session: SessionId, block: bool) -> Option<u32> {
        let b = self.slot_of.remove(&session)?;
        self.session_of[b as usize] = None;
        self.used[b as usize] = 0;
        self.blocked[b as usize] = block;
        Some(b)
    }

    /// A freed slot the device has passed.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn unblock(&mut self, slot: u32) {
        self.blocked[slot as usize] = false;
    }

    /// One more export reads a live session's slot; returns it.
    pub(crate) fn pin_export(&mut self, session: SessionId) -> Option<u32> {
        let b = self.slot_of(session)?;
        self.exports[b as usize] += 1;
        self.exported.insert(session, b);
        Some(b)
    }

    /// Open exports of `session` (live or finished).
    pub(crate) fn exports_of(&self, session: SessionId) -> u32 {
        self.exported
            .get(&session)
            .map_or(0, |&b| self.exports[b as usize])
    }

    /// One export of `session` ended; `false` when none was open.
    pub(crate) fn unpin_export(&mut self, session: SessionId) -> bool {
        let Some(&b) = self.exported.get(&session) else {
            return false;
        };
        self.exports[b as usize] -= 1;
        if self.exports[b as usize] == 0 {
            self.exported.remove(&session);
        }
        true
    }
}

/// The bytes of a slot-based host store and their books: `[max_slots][max_history][layers]
/// [row_bytes]` at `base` (the CPU pool's region, the GPU pool's pinned store). Bytes are reached
/// through raw pointers only: no reference to the whole store is made, so transfer agents and
/// kernels may read or write other slots meanwhile.
#[derive(Debug)]
pub(crate) struct SlotStore {
    base: *mut u8,
    len: usize,
    layout: StoreLayout,
    pub(crate) books: SlotBooks,
    /// The store's capacity error (`what`, value, limit).
    full: fn(&'static str, u64, u64) -> KvError,
}

// SAFETY: `base` points into memory owned beside this value (the region or the pinned buffer)
// that outlives it; the bytes are reached through `&self` / `&mut self` only (see `write` and
// `committed`), so Rust's aliasing rules apply as for a `Vec<u8>` field.
unsafe impl Send for SlotStore {}
// SAFETY: as above; `&self` hands out shared slices of committed rows only.
unsafe impl Sync for SlotStore {}

impl SlotStore {
    /// A store of `layout` over `len` bytes at `base`; `full` builds its capacity errors.
    ///
    /// # Safety
    /// `base .. base + len` is live, writable memory for the store's life, `layout.store_bytes()
    /// <= len`, and nothing writes it but this store and the writers it hands rows to.
    pub(crate) unsafe fn new(
        base: *mut u8,
        len: usize,
        layout: StoreLayout,
        full: fn(&'static str, u64, u64) -> KvError,
    ) -> Self {
        debug_assert!(layout.store_bytes() <= len as u64);
        Self {
            base,
            len,
            books: SlotBooks::new(layout.max_slots),
            layout,
            full,
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn layout(&self) -> StoreLayout {
        self.layout
    }

    fn slot_bytes(&self) -> usize {
        self.layout.slot_bytes() as usize
    }

    fn too_long(&self, bytes: usize) -> KvError {
        (self.full)(
            "history length (max_history)",
            (bytes as u64).div_ceil(self.layout.token_bytes()),
            self.layout.max_history as u64 + 1,
        )
    }

    /// Whether a new session of `history_bytes` committed bytes fits (a free slot, its length).
    pub(crate) fn check_room(&self, history_bytes: usize) -> Result<()> {
        if history_bytes > self.slot_bytes() {
            return Err(self.too_long(history_bytes));
        }
        if !self.books.has_free() {
            // Slots in use: live and importing sessions, and finished ones still read by an
            // export (or by queued device work). It used to count live sessions only: "live
            // sessions = 1, must stay below 2" for a slot an export kept.
            return Err((self.full)(
                "session slots in use (max_sessions; a finished session's slot stays taken \
                 until its exports end: export_done)",
                (self.books.slots() - self.books.free_count()) as u64 + 1,
                self.layout.max_slots as u64 + 1,
            ));
        }
        Ok(())
    }

    /// Copies `bytes` to byte offset `off` of the store.
    fn write(&mut self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len, "inside the store");
        // SAFETY: `off .. off + bytes.len()` lies inside the store (checked above; `new`'s
        // contract); `bytes` cannot overlap it mutably borrowed, and `&mut self` excludes other
        // host writers. No reader is handed these bytes: they are past a live session's committed
        // rows (the GPU pool first waits for queued copies reading drafts there, `DraftReads`) or
        // in a slot just taken (free: no export, no queued device work, no import writer).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) };
    }

    /// A new session with its first committed bytes; returns its slot.
    pub(crate) fn create(&mut self, session: SessionId, history: &[u8]) -> Result<u32> {
        self.check_room(history.len())?;
        let b = self.books.take(session).expect("checked room");
        self.write(b as usize * self.slot_bytes(), history);
        self.books.set_used(b, history.len());
        Ok(b)
    }

    /// Appends committed bytes (written by the host when `bytes` is given, else by a device
    /// write-back of `n` bytes).
    pub(crate) fn append(
        &mut self,
        session: SessionId,
        bytes: Option<&[u8]>,
        n: usize,
    ) -> Result<()> {
        let b = self.books.slot_of(session).expect("checked live");
        let used = self.books.used(b);
        if used + n > self.slot_bytes() {
            return Err(self.too_long(used + n));
        }
        if let Some(bytes) = bytes {
            self.write(b as usize * self.slot_bytes() + used, bytes);
        }
        self.books.set_used(b, used + n);
        Ok(())
    }

    /// Writes `token` at `position` of a live session's slot (below `max_history`, past its
    /// committed bytes).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn write_at(&mut self, session: SessionId, position: u32, token: &[u8]) {
        let b = self.books.slot_of(session).expect("live") as usize;
        let off = b * self.slot_bytes() + position as usize * self.layout.token_bytes() as usize;
        self.write(off, token);
    }

    /// The committed bytes of a live session.
    pub(crate) fn committed(&self, session: SessionId) -> &[u8] {
        let b = self.books.slot_of(session).expect("checked live");
        let off = b as usize * self.slot_bytes();
        // SAFETY: `off .. off + used` lies inside the store (slot `b`, `used <= slot_bytes`) and
        // holds the session's committed rows: host writes go past `used` and need `&mut self`
        // (excluded while this borrow lives); exports and kernels only read them (the GPU pool
        // waits for queued write-backs before calling this).
        unsafe { std::slice::from_raw_parts(self.base.add(off), self.books.used(b)) }
    }

    /// Takes a slot for an import of `session`.
    pub(crate) fn reserve_import(&mut self, session: SessionId) -> Result<u32> {
        self.check_room(0)?;
        Ok(self.books.take(session).expect("checked room"))
    }

    /// The import's first `bytes` bytes are committed; returns its slot.
    pub(crate) fn commit_import(&mut self, session: SessionId, bytes: usize) -> u32 {
        let b = self.books.slot_of(session).expect("importing");
        self.books.set_used(b, bytes);
        b
    }
}

/// The [`crate::HostBytes`] methods a slot store forwards to its [`SlotStore`] field `$f`:
/// slots, imports' slots (an importing slot was never named by device work: freed at once) and
/// export pins.
macro_rules! forward_slot_books {
    ($f:ident) => {
        fn slot(&self, session: SessionId) -> Option<u32> {
            self.$f.books.slot_of(session)
        }

        fn reserve_import(&mut self, session: SessionId) -> Result<u32> {
            self.$f.reserve_import(session)
        }

        fn drop_import(&mut self, session: SessionId) {
            self.$f.books.free(session, false);
        }

        fn pin_export(&mut self, session: SessionId) -> Result<()> {
            self.$f.books.pin_export(session).expect("checked live");
            Ok(())
        }

        fn exports_of(&self, session: SessionId) -> u32 {
            self.$f.books.exports_of(session)
        }

        fn unpin_export(&mut self, session: SessionId) -> bool {
            self.$f.books.unpin_export(session)
        }
    };
}
pub(crate) use forward_slot_books;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_and_blocked_slots_are_not_taken() {
        let mut b = SlotBooks::new(2);
        assert_eq!(b.take(7), Some(0));
        assert_eq!(b.pin_export(7), Some(0));
        assert_eq!(b.free(7, false), Some(0));
        assert_eq!(b.take(8), Some(1));
        assert_eq!(b.take(9), None, "slot 0 still exported");
        assert!(b.unpin_export(7));
        assert!(!b.unpin_export(7));
        assert_eq!(b.free(8, true), Some(1));
        assert_eq!(b.take(9), Some(0));
        assert_eq!(b.take(10), None, "slot 1 blocked");
        b.unblock(1);
        assert_eq!(b.take(10), Some(1));
        assert_eq!(b.free_count(), 0);
    }
}
