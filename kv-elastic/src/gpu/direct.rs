//! The direct-batch word's bookkeeping: which live slots the last written descriptors call full.
//!
//! The resolve kernels read one device word (`cuda_kernels::KvTables::direct`): while it is 1,
//! every live slot's whole history is resident, so a call reads no position table and takes no
//! hot-cache path (`cuda-kernels/DESIGN.md`, "Direct batches"). The word must follow the
//! descriptors exactly — set only while *every* live slot is full — so its value is derived here
//! from each descriptor write, in the order they reach the device.

/// Live slots and how many of them are not full, from every descriptor written (see the module).
#[derive(Clone, Debug, Default)]
pub(crate) struct DirectBatch {
    /// Per slot: `None` when not live, else the descriptor's `full` flag.
    slots: Vec<Option<bool>>,
    live: usize,
    not_full: usize,
    /// The word's value once the writes reported so far reached the device.
    on: bool,
}

impl DirectBatch {
    pub(crate) fn new(slots: usize) -> Self {
        DirectBatch {
            slots: vec![None; slots],
            ..Default::default()
        }
    }

    /// Records slot `slot`'s new descriptor (`None`: not live, else its `full` flag) and returns
    /// the word's new value when it changes (`Some(1)`: every live slot is full, at least one;
    /// `Some(0)`: no longer). The caller writes it in the same stream order as the descriptor.
    ///
    /// # Panics
    /// If `slot` is out of range (the callers check slots first).
    pub(crate) fn note(&mut self, slot: u32, full: Option<bool>) -> Option<u32> {
        let before = std::mem::replace(&mut self.slots[slot as usize], full);
        if let Some(f) = before {
            self.live -= 1;
            self.not_full -= usize::from(!f);
        }
        if let Some(f) = full {
            self.live += 1;
            self.not_full += usize::from(!f);
        }
        let on = self.live > 0 && self.not_full == 0;
        (on != self.on).then(|| {
            self.on = on;
            u32::from(on)
        })
    }

    /// The word's value (as it will be once the reported writes ran).
    pub(crate) fn on(&self) -> bool {
        self.on
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a model that recomputes the word from every slot after each write: the
        /// reported changes, replayed, always give the model's value.
        #[test]
        fn the_word_follows_every_descriptor(writes in prop::collection::vec((0u32..6, 0u8..3), 0..200)) {
            let mut d = DirectBatch::new(6);
            let mut model: Vec<Option<bool>> = vec![None; 6];
            let mut word = 0u32;
            for (slot, kind) in writes {
                let full = match kind { 0 => None, 1 => Some(false), _ => Some(true) };
                model[slot as usize] = full;
                if let Some(v) = d.note(slot, full) {
                    prop_assert_ne!(v, word, "a change is reported only when the value changes");
                    word = v;
                }
                let live: Vec<bool> = model.iter().flatten().copied().collect();
                let want = !live.is_empty() && live.iter().all(|&f| f);
                prop_assert_eq!(word == 1, want);
                prop_assert_eq!(d.on(), want);
            }
        }
    }

    #[test]
    fn no_live_slot_is_not_a_direct_batch() {
        let mut d = DirectBatch::new(2);
        assert_eq!(d.note(0, Some(true)), Some(1));
        assert_eq!(d.note(1, Some(false)), Some(0));
        assert_eq!(d.note(1, Some(true)), Some(1));
        assert_eq!(d.note(0, None), None);
        assert_eq!(d.note(1, None), Some(0));
    }
}
