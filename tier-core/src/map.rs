//! Logical-to-physical page map: a flat `i32` table, O(1) lookup.

use crate::alloc::{try_filled, try_reserve};
use crate::error::{CoreError, Result};
use crate::page::PageId;

/// Table value of a logical entry with no physical page (`-1`, as block tables
/// in vLLM/FlashMLA use it).
pub const NOT_RESIDENT: i32 = -1;

/// Largest physical page id a [`PageMap`] can hold (`i32::MAX`), since the
/// table is `i32`.
pub const MAX_MAPPED_PAGE: u32 = i32::MAX as u32;

/// Largest generation a [`PageMap`] can reach (`u64::MAX - 1`). A change to a
/// map at this generation is refused with [`CoreError::GenerationExhausted`]
/// instead of wrapping to 0, where a move planned at an old generation could
/// pass the staleness check again. Unreachable by counting (2^64 changes), but
/// a map loaded through serde can start anywhere up to it.
pub const MAX_GENERATION: u64 = u64::MAX - 1;

/// A logical-to-physical page map (a block table / rowmap).
///
/// Backed by one flat `Vec<i32>`: entry `i` holds the physical [`PageId`] of
/// logical page `i`, or [`NOT_RESIDENT`]. Lookup is one bounds check and one
/// load, independent of how many entries are mapped. [`table`](Self::table)
/// is a `bytemuck::Pod` view that can be copied to the GPU as-is.
///
/// Every change bumps a `u64` generation, so a move planned against one
/// generation can be rejected with [`check_generation`](Self::check_generation)
/// (or [`set_if_generation`](Self::set_if_generation)) if the map moved under
/// it. The map does not check that a physical page appears only once; the
/// [`PagePool`](crate::PagePool) or [`Lender`](crate::Lender) that hands out
/// pages guarantees that. Serde: `{table, mapped, generation}`; on load the
/// table is validated (no value below `-1`, at most `u32::MAX` entries), the
/// generation must be at most [`MAX_GENERATION`], and `mapped` is recomputed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawPageMap")]
pub struct PageMap {
    table: Vec<i32>,
    mapped: u32,
    generation: u64,
}

/// The serialized form, validated on the way in (no value below `-1`, the
/// generation at most `MAX_GENERATION`, the mapped count recomputed).
#[derive(serde::Deserialize)]
struct RawPageMap {
    table: Vec<i32>,
    generation: u64,
}

impl TryFrom<RawPageMap> for PageMap {
    type Error = CoreError;
    fn try_from(r: RawPageMap) -> Result<Self> {
        if u32::try_from(r.table.len()).is_err() {
            return Err(CoreError::OutOfRange {
                index: r.table.len() as u64,
                len: u64::from(u32::MAX),
            });
        }
        if r.generation > MAX_GENERATION {
            return Err(CoreError::GenerationExhausted {
                generation: r.generation,
            });
        }
        let mut mapped = 0u32;
        for (i, &v) in r.table.iter().enumerate() {
            if v < NOT_RESIDENT {
                return Err(CoreError::OutOfRange {
                    index: i as u64,
                    len: r.table.len() as u64,
                });
            }
            mapped += u32::from(v >= 0);
        }
        Ok(PageMap {
            table: r.table,
            mapped,
            generation: r.generation,
        })
    }
}

impl PageMap {
    /// Makes a map at generation 0 from a flat table (`i32 [len]`, a physical
    /// page id or [`NOT_RESIDENT`] per entry), validated as a loaded map is.
    ///
    /// # Errors
    /// [`CoreError::OutOfRange`] for a value below `-1` (its index) or more
    /// than `u32::MAX` entries.
    pub fn from_table(table: Vec<i32>) -> Result<Self> {
        Self::try_from(RawPageMap {
            table,
            generation: 0,
        })
    }

    /// Makes a map of `len` logical entries, all [`NOT_RESIDENT`], at
    /// generation 0. `len == 0` is allowed (a request with no history yet);
    /// grow it with [`resize`](Self::resize).
    ///
    /// # Errors
    /// [`CoreError::AllocationFailed`] if the `4 * len`-byte table cannot be
    /// allocated.
    pub fn new(len: u32) -> Result<Self> {
        Ok(PageMap {
            table: try_filled(len as usize, NOT_RESIDENT, "page map table")?,
            mapped: 0,
            generation: 0,
        })
    }

    /// Number of logical entries.
    #[inline]
    pub fn len(&self) -> u32 {
        self.table.len() as u32
    }

    /// Whether the map has no logical entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Number of entries mapped to a physical page.
    #[inline]
    pub fn mapped_count(&self) -> u32 {
        self.mapped
    }

    /// The physical page of logical entry `logical`, or `None` if not
    /// resident. O(1).
    ///
    /// # Errors
    /// [`CoreError::OutOfRange`] if `logical >= len()`.
    #[inline]
    pub fn get(&self, logical: u32) -> Result<Option<PageId>> {
        match self.table.get(logical as usize) {
            Some(&v) => Ok(decode(v)),
            None => Err(self.out_of_range(u64::from(logical))),
        }
    }

    /// Maps `logical` to `page`, returning the previous page (if any). Bumps
    /// the generation.
    ///
    /// # Errors
    /// [`CoreError::OutOfRange`] if `logical >= len()` or `page.0 >
    /// MAX_MAPPED_PAGE` (it would not fit the `i32` table);
    /// [`CoreError::GenerationExhausted`] if the map is at
    /// [`MAX_GENERATION`].
    pub fn set(&mut self, logical: u32, page: PageId) -> Result<Option<PageId>> {
        if page.0 > MAX_MAPPED_PAGE {
            return Err(CoreError::OutOfRange {
                index: u64::from(page.0),
                len: u64::from(MAX_MAPPED_PAGE) + 1,
            });
        }
        let next = self.next_generation();
        let slot = self.slot_mut(logical)?;
        let next = next?;
        let prev = decode(*slot);
        *slot = page.0 as i32;
        if prev.is_none() {
            self.mapped += 1;
        }
        self.generation = next;
        Ok(prev)
    }

    /// [`set`](Self::set), but only if the map is still at generation
    /// `expected` (a planned move).
    ///
    /// # Errors
    /// [`CoreError::StaleGeneration`] if the map moved; else as `set`.
    pub fn set_if_generation(
        &mut self,
        expected: u64,
        logical: u32,
        page: PageId,
    ) -> Result<Option<PageId>> {
        self.check_generation(expected)?;
        self.set(logical, page)
    }

    /// Moves the page of `from` to the unmapped entry `to` as one change:
    /// `from` becomes [`NOT_RESIDENT`], `to` holds the page, and the
    /// generation is bumped once (a rowmap swap: the incoming expert takes the
    /// outgoing one's slot). Returns the page moved.
    ///
    /// # Errors
    /// [`CoreError::OutOfRange`] if `from` or `to` is not below `len()`;
    /// [`CoreError::NotMapped`] if `from` has no page;
    /// [`CoreError::AlreadyMapped`] if `to` has one (also when `to == from`);
    /// [`CoreError::GenerationExhausted`] if the map is at
    /// [`MAX_GENERATION`]. Nothing changes on error.
    pub fn move_page(&mut self, from: u32, to: u32) -> Result<PageId> {
        let (source, target) = (self.get(from)?, self.get(to)?);
        let page = source.ok_or(CoreError::NotMapped { logical: from })?;
        if let Some(held) = target {
            return Err(CoreError::AlreadyMapped {
                logical: to,
                page: held.0,
            });
        }
        self.generation = self.next_generation()?;
        self.table[from as usize] = NOT_RESIDENT;
        self.table[to as usize] = page.0 as i32;
        Ok(page)
    }

    /// Unmaps `logical`, returning the page it had (if any). Bumps the
    /// generation only if something was mapped.
    ///
    /// # Errors
    /// [`CoreError::OutOfRange`] if `logical >= len()`;
    /// [`CoreError::GenerationExhausted`] if something was mapped and the map
    /// is at [`MAX_GENERATION`].
    pub fn clear(&mut self, logical: u32) -> Result<Option<PageId>> {
        let next = self.next_generation();
        let slot = self.slot_mut(logical)?;
        let prev = decode(*slot);
        if prev.is_some() {
            let next = next?;
            *slot = NOT_RESIDENT;
            self.mapped -= 1;
            self.generation = next;
        }
        Ok(prev)
    }

    /// Changes the number of logical entries to `new_len`. Growing appends
    /// [`NOT_RESIDENT`] entries; shrinking drops the tail, which must be
    /// unmapped. Bumps the generation if the length changed.
    ///
    /// # Errors
    /// [`CoreError::MappedTail`] if an entry at or beyond `new_len` is mapped;
    /// [`CoreError::GenerationExhausted`] if the length would change and the
    /// map is at [`MAX_GENERATION`];
    /// [`CoreError::AllocationFailed`] if the grown table cannot be allocated.
    pub fn resize(&mut self, new_len: u32) -> Result<()> {
        let n = new_len as usize;
        if n == self.table.len() {
            return Ok(());
        }
        if n < self.table.len() {
            if let Some(off) = self.table[n..].iter().position(|&v| v != NOT_RESIDENT) {
                return Err(CoreError::MappedTail {
                    logical: (n + off) as u32,
                });
            }
        }
        let next = self.next_generation()?;
        if n > self.table.len() {
            let extra = n - self.table.len();
            try_reserve(&mut self.table, extra, "page map table")?;
        }
        self.table.resize(n, NOT_RESIDENT);
        self.generation = next;
        Ok(())
    }

    /// Reserves room for `len` logical entries without changing the map, so a
    /// later [`resize`](Self::resize) up to `len` allocates nothing (a caller
    /// that must not fail half-way reserves first). Nothing changes on an
    /// error.
    ///
    /// # Errors
    /// [`CoreError::AllocationFailed`] if the table cannot be allocated.
    pub fn reserve(&mut self, len: u32) -> Result<()> {
        let extra = (len as usize).saturating_sub(self.table.len());
        try_reserve(&mut self.table, extra, "page map table")
    }

    /// The map's generation: starts at 0, bumped by every change, never above
    /// [`MAX_GENERATION`].
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Checks that the map is still at generation `expected`.
    ///
    /// # Errors
    /// [`CoreError::StaleGeneration`] if it is not.
    pub fn check_generation(&self, expected: u64) -> Result<()> {
        if expected == self.generation {
            Ok(())
        } else {
            Err(self.stale(expected))
        }
    }

    /// The flat table, `i32 [len]`: physical page id, or [`NOT_RESIDENT`]
    /// (`-1`). `Pod`, ready to copy to the GPU as-is (`bytemuck::cast_slice`
    /// for bytes).
    #[inline]
    pub fn table(&self) -> &[i32] {
        &self.table
    }

    /// Iterates `(logical, page)` over the mapped entries, in logical order.
    pub fn iter_mapped(&self) -> impl Iterator<Item = (u32, PageId)> + '_ {
        self.table
            .iter()
            .enumerate()
            .filter_map(|(i, &v)| decode(v).map(|p| (i as u32, p)))
    }

    #[inline]
    fn slot_mut(&mut self, logical: u32) -> Result<&mut i32> {
        let len = self.table.len() as u64;
        self.table
            .get_mut(logical as usize)
            .ok_or(CoreError::OutOfRange {
                index: u64::from(logical),
                len,
            })
    }

    /// The generation after one more change, or
    /// [`CoreError::GenerationExhausted`] at [`MAX_GENERATION`].
    #[inline]
    fn next_generation(&self) -> Result<u64> {
        if self.generation < MAX_GENERATION {
            Ok(self.generation + 1)
        } else {
            Err(CoreError::GenerationExhausted {
                generation: self.generation,
            })
        }
    }

    #[cold]
    fn out_of_range(&self, index: u64) -> CoreError {
        CoreError::OutOfRange {
            index,
            len: self.table.len() as u64,
        }
    }

    #[cold]
    fn stale(&self, expected: u64) -> CoreError {
        CoreError::StaleGeneration {
            expected,
            actual: self.generation,
        }
    }
}

#[inline]
fn decode(v: i32) -> Option<PageId> {
    // Only NOT_RESIDENT is negative in a table this type wrote.
    (v >= 0).then_some(PageId(v as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear_and_generation() {
        let mut m = PageMap::new(4).unwrap();
        assert_eq!(m.get(2).unwrap(), None);
        assert_eq!(m.set(2, PageId(9)).unwrap(), None);
        assert_eq!(m.set(2, PageId(5)).unwrap(), Some(PageId(9)));
        assert_eq!(m.mapped_count(), 1);
        assert_eq!(m.generation(), 2);
        assert_eq!(m.table(), &[-1, -1, 5, -1]);
        assert_eq!(m.clear(1).unwrap(), None);
        assert_eq!(m.generation(), 2, "clearing nothing is not a change");
        assert_eq!(m.clear(2).unwrap(), Some(PageId(5)));
        assert_eq!(m.generation(), 3);
        assert_eq!(m.mapped_count(), 0);
    }

    #[test]
    fn bad_input_leaves_state_unchanged() {
        let mut m = PageMap::new(2).unwrap();
        m.set(0, PageId(1)).unwrap();
        let before = m.clone();
        assert_eq!(
            m.get(2).unwrap_err(),
            CoreError::OutOfRange { index: 2, len: 2 }
        );
        assert!(m.set(5, PageId(0)).is_err());
        assert!(m.set(1, PageId(u32::MAX)).is_err());
        assert!(m.clear(2).is_err());
        assert_eq!(
            m.resize(0).unwrap_err(),
            CoreError::MappedTail { logical: 0 }
        );
        assert_eq!(
            m.set_if_generation(0, 1, PageId(3)).unwrap_err(),
            CoreError::StaleGeneration {
                expected: 0,
                actual: 1
            }
        );
        assert_eq!(m, before);
    }

    #[test]
    fn serde_round_trip_validates() {
        let mut m = PageMap::new(3).unwrap();
        m.set(1, PageId(4)).unwrap();
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<PageMap>(&s).unwrap(), m);
        let forged = r#"{"table":[-1,7,-5],"mapped":0,"generation":9}"#;
        assert!(serde_json::from_str::<PageMap>(forged).is_err());
        let lying = r#"{"table":[-1,7,2],"mapped":0,"generation":9}"#;
        assert_eq!(
            serde_json::from_str::<PageMap>(lying)
                .unwrap()
                .mapped_count(),
            2
        );
    }

    #[test]
    fn generation_stops_at_max_instead_of_wrapping() {
        // Used to panic (debug) or wrap to 0 (release) on the first change.
        let loaded = format!(r#"{{"table":[-1,3],"generation":{}}}"#, MAX_GENERATION - 1);
        let mut m: PageMap = serde_json::from_str(&loaded).unwrap();
        m.set(0, PageId(1)).unwrap();
        assert_eq!(m.generation(), MAX_GENERATION);
        let full = m.clone();
        let exhausted = CoreError::GenerationExhausted {
            generation: MAX_GENERATION,
        };
        assert_eq!(m.set(0, PageId(2)).unwrap_err(), exhausted);
        assert_eq!(
            m.set_if_generation(MAX_GENERATION, 0, PageId(2))
                .unwrap_err(),
            exhausted
        );
        assert_eq!(m.clear(1).unwrap_err(), exhausted);
        assert_eq!(m.resize(5).unwrap_err(), exhausted);
        assert_eq!(m.resize(3).unwrap_err(), exhausted);
        assert_eq!(m, full, "a refused change leaves the map as it was");
        // What is not a change still works, and so do the range checks.
        m.resize(2).unwrap();
        assert_eq!(m.clear(0).unwrap_err(), exhausted);
        assert_eq!(m.get(1).unwrap(), Some(PageId(3)));
        assert!(matches!(
            m.set(9, PageId(0)),
            Err(CoreError::OutOfRange { .. })
        ));
        // A map at MAX_GENERATION still round-trips.
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<PageMap>(&s).unwrap(), m);
    }

    #[test]
    fn load_rejects_a_generation_above_max() {
        let forged = r#"{"table":[-1],"generation":18446744073709551615}"#;
        let err = serde_json::from_str::<PageMap>(forged).unwrap_err();
        assert!(err.to_string().contains("exhausted"), "{err}");
        let ok = format!(r#"{{"table":[-1],"generation":{MAX_GENERATION}}}"#);
        assert_eq!(
            serde_json::from_str::<PageMap>(&ok).unwrap().generation(),
            MAX_GENERATION
        );
        assert_eq!(
            PageMap::try_from(RawPageMap {
                table: vec![-1],
                generation: u64::MAX
            })
            .unwrap_err(),
            CoreError::GenerationExhausted {
                generation: u64::MAX
            }
        );
    }

    #[test]
    fn move_page_is_one_change() {
        let mut m = PageMap::from_table(vec![0, -1, 1, -1]).unwrap();
        assert_eq!((m.generation(), m.mapped_count()), (0, 2));
        assert_eq!(m.move_page(2, 3).unwrap(), PageId(1));
        assert_eq!(m.table(), &[0, -1, -1, 1]);
        assert_eq!((m.generation(), m.mapped_count()), (1, 2));
        let before = m.clone();
        assert_eq!(
            m.move_page(1, 2).unwrap_err(),
            CoreError::NotMapped { logical: 1 }
        );
        assert_eq!(
            m.move_page(0, 3).unwrap_err(),
            CoreError::AlreadyMapped {
                logical: 3,
                page: 1
            }
        );
        assert_eq!(
            m.move_page(0, 0).unwrap_err(),
            CoreError::AlreadyMapped {
                logical: 0,
                page: 0
            }
        );
        assert_eq!(
            m.move_page(4, 1).unwrap_err(),
            CoreError::OutOfRange { index: 4, len: 4 }
        );
        assert_eq!(
            m.move_page(0, 9).unwrap_err(),
            CoreError::OutOfRange { index: 9, len: 4 }
        );
        // Range first: an unmapped `from` with an out-of-range `to` is out of range.
        assert_eq!(
            m.move_page(1, 9).unwrap_err(),
            CoreError::OutOfRange { index: 9, len: 4 }
        );
        assert_eq!(m, before, "a refused move changes nothing");
        let loaded = format!(r#"{{"table":[5,-1],"generation":{MAX_GENERATION}}}"#);
        let mut full: PageMap = serde_json::from_str(&loaded).unwrap();
        assert_eq!(
            full.move_page(0, 1).unwrap_err(),
            CoreError::GenerationExhausted {
                generation: MAX_GENERATION
            }
        );
        assert_eq!(full.table(), &[5, -1]);
        assert!(PageMap::from_table(vec![0, -2]).is_err());
    }

    #[test]
    fn resize_grows_and_shrinks_unmapped_tail() {
        let mut m = PageMap::new(0).unwrap();
        assert!(m.is_empty());
        m.resize(3).unwrap();
        m.set(0, PageId(0)).unwrap();
        m.resize(1).unwrap();
        assert_eq!(m.table(), &[0]);
        assert_eq!(m.iter_mapped().collect::<Vec<_>>(), vec![(0, PageId(0))]);
    }
}
