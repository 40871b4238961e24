//! [`SlotBooks`]: which session holds each slot of a slot-based host store (the CPU pool's
//! region store and the GPU pool's pinned store, both `[max_slots][max_history][layers][row_bytes]`),
//! and when a freed slot may be taken again.
//!
//! A slot is taken by a live or importing session. It is free for a new session only when no
//! session holds it, the device passed the work queued before it was freed (`blocked`, the GPU
//! store) and no export still reads it (`exports`: rows a transfer agent reads stay pinned until
//! it reports completion, even after the session finished).

use hashbrown::HashMap;

use crate::data::SessionId;

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
