//! The per-session hot cache: a fixed number of device rows holding recently picked history
//! positions, replaced by CLOCK (second chance). Rows used by the current step are pinned.

use tier_core::alloc::{try_filled, try_reserve};

use crate::error::Result;

/// Sentinel for "no slot" / "no position" in the flat tables.
const NONE: i32 = -1;

/// One session's hot cache: `hot_rows` slots, CLOCK replacement (HiSparse keeps a per-session hot
/// buffer of 2 × top-k with LRU; CLOCK is the usual O(1) approximation).
///
/// Both directions are flat `i32` tables (O(1), Pod, mirrorable to the GPU as-is): `slot → position`
/// (`hot_rows` entries) and `position → slot` (one entry per committed position, like SGLang's
/// `req_to_token`). A slot touched by the current call carries that call's stamp and is never chosen
/// as a victim in the same call, so a step's hits are never overwritten by its own misses. The newest
/// tokens are pinned in the session's tail (see [`crate::ElasticPool`]), not here.
#[derive(Debug, Clone)]
pub struct HotCache {
    slot_pos: Vec<i32>,
    /// `position → slot`, filled lazily: entries at and past its length are `NONE`. Its capacity
    /// covers `history` from the start (allocated, fallibly, not written: a GPU pool, whose hot
    /// caches live on the device, never touches the pages of a long history's table).
    pos_slot: Vec<i32>,
    /// Positions the table covers (committed history).
    history: usize,
    referenced: Vec<bool>,
    stamp: Vec<u64>,
    hand: usize,
}

impl HotCache {
    /// An empty cache of `hot_rows` slots for a history of `history` positions. It allocates
    /// `13 × hot_rows + 4 × history` bytes (the position table's are written only as far as a
    /// position is installed).
    ///
    /// # Panics
    /// When the host cannot allocate them (sizes from caller input: [`HotCache::try_new`]).
    pub fn new(hot_rows: u32, history: u32) -> Self {
        Self::try_new(hot_rows, history).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`HotCache::new`], or `OutOfMemory` when the host cannot allocate the tables.
    pub fn try_new(hot_rows: u32, history: u32) -> Result<Self> {
        let (rows, what) = (hot_rows as usize, "hot-cache tables");
        Ok(Self {
            slot_pos: try_filled(rows, NONE, what)?,
            pos_slot: {
                let mut v = Vec::new();
                try_reserve(&mut v, history as usize, "hot-cache position table")?;
                v
            },
            history: history as usize,
            referenced: try_filled(rows, false, what)?,
            stamp: try_filled(rows, 0, what)?,
            hand: 0,
        })
    }

    /// Reserves room for a history of `history` positions, so a [`HotCache::grow`] up to it
    /// allocates nothing. Errors: `OutOfMemory` (nothing changed).
    pub fn reserve(&mut self, history: u32) -> Result<()> {
        let extra = (history as usize).saturating_sub(self.pos_slot.len());
        // `try_reserve` counts from the length: capacity for `history` positions afterwards.
        Ok(try_reserve(
            &mut self.pos_slot,
            extra,
            "hot-cache position table",
        )?)
    }

    /// Slots.
    pub fn rows(&self) -> u32 {
        self.slot_pos.len() as u32
    }

    /// Grows the position table to `history` positions (history is append-only); allocates
    /// nothing after a [`HotCache::reserve`] of at least `history`.
    pub fn grow(&mut self, history: u32) {
        let history = history as usize;
        if history > self.history {
            self.history = history;
            // Without a `reserve` first, this allocates (as a resize would have).
            self.pos_slot
                .reserve(history.saturating_sub(self.pos_slot.len()));
        }
    }

    /// The slot holding `position`, if any (O(1)).
    #[inline]
    pub fn lookup(&self, position: u32) -> Option<u32> {
        match self.pos_slot.get(position as usize) {
            Some(&s) if s >= 0 => Some(s as u32),
            _ => None,
        }
    }

    /// The position held by `slot`, if any.
    pub fn position_of(&self, slot: u32) -> Option<u32> {
        match self.slot_pos.get(slot as usize) {
            Some(&p) if p >= 0 => Some(p as u32),
            _ => None,
        }
    }

    /// Marks a hit: sets the reference bit and pins the slot for call `call` (calls start at 1).
    #[inline]
    pub fn touch(&mut self, slot: u32, call: u64) {
        self.referenced[slot as usize] = true;
        self.stamp[slot as usize] = call;
    }

    /// Slots not pinned by `call`.
    pub fn evictable(&self, call: u64) -> usize {
        self.stamp.iter().filter(|&&s| s != call).count()
    }

    /// Picks a victim slot not pinned by `call` (CLOCK sweep: at most two turns), or `None` if
    /// every slot is pinned or the cache has no slot at all.
    pub fn victim(&mut self, call: u64) -> Option<u32> {
        let n = self.slot_pos.len();
        if n == 0 {
            return None;
        }
        for _ in 0..2 * n + 1 {
            let s = self.hand;
            self.hand = (self.hand + 1) % n;
            if self.stamp[s] == call {
                continue;
            }
            if self.slot_pos[s] == NONE {
                return Some(s as u32);
            }
            if self.referenced[s] {
                self.referenced[s] = false;
                continue;
            }
            return Some(s as u32);
        }
        None
    }

    /// Puts `position` into `slot` (evicting what was there) and pins it for `call`.
    /// `position` must be inside the position table (see [`HotCache::grow`]).
    pub fn install(&mut self, slot: u32, position: u32, call: u64) {
        let old = self.slot_pos[slot as usize];
        if old >= 0 {
            self.pos_slot[old as usize] = NONE;
        }
        self.slot_pos[slot as usize] = position as i32;
        let p = position as usize;
        assert!(
            p < self.history,
            "position {p} past the hot cache's history {}",
            self.history
        );
        if p >= self.pos_slot.len() {
            // Within the capacity reserved for `history`: no allocation.
            self.pos_slot.resize(p + 1, NONE);
        }
        self.pos_slot[p] = slot as i32;
        self.referenced[slot as usize] = false;
        self.stamp[slot as usize] = call;
    }

    /// Positions currently cached.
    pub fn occupied(&self) -> usize {
        self.slot_pos.iter().filter(|&&p| p >= 0).count()
    }

    /// The `slot → position` table (`-1` = empty).
    pub fn slot_table(&self) -> &[i32] {
        &self.slot_pos
    }

    /// Checks that both tables describe the same mapping (every occupied slot's position maps
    /// back to it, every mapped position's slot holds it) and that every cached position is below
    /// `committed`; the first inconsistency otherwise.
    pub fn check(&self, committed: u32) -> std::result::Result<(), String> {
        for (s, &p) in self.slot_pos.iter().enumerate() {
            if p >= 0 && (p as u32 >= committed || self.lookup(p as u32) != Some(s as u32)) {
                return Err(format!("hot row {s} holds position {p}, which maps elsewhere or is not committed ({committed})"));
            }
        }
        for (p, &s) in self.pos_slot.iter().enumerate() {
            if s >= 0 && self.position_of(s as u32) != Some(p as u32) {
                return Err(format!(
                    "position {p} maps to hot row {s}, which holds another"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_evicts_slots_pinned_by_the_call() {
        let mut h = HotCache::new(3, 10);
        for (i, p) in [4u32, 5, 6].into_iter().enumerate() {
            let v = h.victim(1).unwrap();
            h.install(v, p, 1);
            assert_eq!(h.lookup(p), Some(v), "{i}");
        }
        assert_eq!(h.victim(1), None);
        // Call 2 hits 5: the victim must be 4's or 6's slot.
        let s5 = h.lookup(5).unwrap();
        h.touch(s5, 2);
        let v = h.victim(2).unwrap();
        assert_ne!(v, s5);
        h.install(v, 7, 2);
        assert_eq!(h.lookup(7), Some(v));
        assert_eq!(h.occupied(), 3);
        assert_eq!(h.evictable(2), 1);
    }

    #[test]
    fn the_position_table_is_written_only_as_far_as_installs_reach() {
        let mut h = HotCache::try_new(2, 1 << 20).unwrap();
        // Reserved for the whole history, nothing written yet.
        assert!(h.pos_slot.capacity() >= 1 << 20);
        assert_eq!(h.pos_slot.len(), 0);
        assert_eq!(h.lookup(5), None);
        let cap = h.pos_slot.capacity();
        h.install(1, 1000, 1);
        assert_eq!(
            (h.lookup(1000), h.lookup(999), h.lookup(1001)),
            (Some(1), None, None)
        );
        assert_eq!(h.pos_slot.len(), 1001);
        assert_eq!(
            h.pos_slot.capacity(),
            cap,
            "no reallocation inside the history"
        );
        h.install(1, 3, 2); // evicts 1000
        assert_eq!((h.lookup(1000), h.lookup(3)), (None, Some(1)));
        h.check(1 << 20).unwrap();
        // Growth past the history: reserved, then installable without reallocating again.
        h.reserve((1 << 20) + 64).unwrap();
        h.grow((1 << 20) + 64);
        let cap = h.pos_slot.capacity();
        h.install(0, (1 << 20) + 63, 3);
        assert_eq!(h.lookup((1 << 20) + 63), Some(0));
        assert_eq!(h.pos_slot.capacity(), cap);
    }

    #[test]
    fn an_empty_cache_has_no_victim() {
        let mut h = HotCache::new(0, 10);
        assert_eq!(h.victim(1), None);
        assert_eq!(h.rows(), 0);
    }

    #[test]
    fn second_chance_spares_referenced_slots() {
        let mut h = HotCache::new(2, 10);
        h.install(0, 1, 1);
        h.install(1, 2, 1);
        h.touch(0, 2); // position 1 referenced in call 2
                       // Call 3: slot 0 has its reference bit, slot 1 does not -> slot 1 goes first.
        assert_eq!(h.victim(3), Some(1));
    }
}
