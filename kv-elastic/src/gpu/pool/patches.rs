//! The host side of a publish's table patches, without hashing: single-word patches where the
//! last write of a word wins ([`WordPatches`]), and the borrowed-page entries of a publish window
//! split into words patched now and mappings deferred until their fill ([`page_entries`]). A
//! whole history's admission logs thousands of page-table entries; these are a few passes over
//! `Vec`s (the entries come in a few ascending runs, which the stable sort merges in linear
//! time), where hash maps cost a hashed insert, lookup and removal per page.

use cuda_kernels::KvFill;

use super::deferred::MapKey;

/// The last entry of each key of `entries` (call order), in key order: a stable sort (equal keys
/// keep their call order; O(n) for a few ascending runs), then each run of one key kept as one
/// entry with its last value.
pub(crate) fn last_per_key<K: Ord + Copy, V: Copy>(mut entries: Vec<(K, V)>) -> Vec<(K, V)> {
    entries.sort_by_key(|e| e.0);
    // `dedup_by` hands (later, kept) pairs: the kept entry takes the later value.
    entries.dedup_by(|later, kept| {
        if later.0 == kept.0 {
            kept.1 = later.1;
            true
        } else {
            false
        }
    });
    entries
}

/// Single-word patches `(device address, value)` of one publish, in call order; the last one of a
/// word wins ([`WordPatches::into_points`] keeps one entry per word, as the patch kernel needs:
/// its entries run in parallel).
#[derive(Debug, Default)]
pub(crate) struct WordPatches(Vec<(u64, u32)>);

impl WordPatches {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    #[inline]
    pub(crate) fn put(&mut self, addr: u64, value: u32) {
        self.0.push((addr, value));
    }

    /// One single-word fill per word written, with its last value, in address order.
    pub(crate) fn into_points(self) -> Vec<KvFill> {
        last_per_key(self.0)
            .into_iter()
            .map(|(dst, value)| KvFill {
                dst,
                count: 1,
                value,
            })
            .collect()
    }
}

/// The page-table entries `(slot, logical page, physical page or -1)` of one publish window, in
/// call order, for the slots `live` says are still held and logical pages below `max_pages`:
/// every entry becomes a word of `words` (at `page_tab + 4 × (slot × max_pages + logical)`),
/// except, with `defer`, the mappings (page ≥ 0), which wait for their fill: returned as the
/// window's last mapping of each entry still mapped at the window's end (an unmap later in the
/// window cancels it), sorted by key. Unmaps are patched at once in either mode.
pub(crate) fn page_entries(
    pages: &[(u32, u32, i32)],
    live: impl Fn(u32) -> bool,
    max_pages: u64,
    page_tab: u64,
    defer: bool,
    words: &mut WordPatches,
) -> Vec<(MapKey, u32)> {
    let mut window: Vec<(MapKey, i32)> = Vec::new();
    if defer {
        window.reserve(pages.len());
    }
    for &(b, logical, page) in pages {
        if !live(b) || logical as u64 >= max_pages {
            continue;
        }
        if defer {
            window.push(((b, logical), page));
            if page >= 0 {
                continue;
            }
        }
        words.put(
            page_tab + 4 * (b as u64 * max_pages + logical as u64),
            page as u32,
        );
    }
    let mut maps = last_per_key(window);
    maps.retain(|e| e.1 >= 0);
    maps.into_iter().map(|(k, p)| (k, p as u32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hashbrown::HashMap;

    /// The reference: a hash map in call order, last write wins (the publish before issue 29).
    fn reference(entries: &[(u64, u32)]) -> HashMap<u64, u32> {
        entries.iter().copied().collect()
    }

    #[test]
    fn last_write_of_each_word_wins() {
        let mut rng = 7u64;
        for n in [0usize, 1, 2, 17, 500, 7_812] {
            let mut w = WordPatches::with_capacity(n);
            let mut all = Vec::new();
            for i in 0..n {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Ascending runs with repeats and a few words written twice.
                let addr = 0x1000
                    + 4 * if rng >> 60 == 0 {
                        rng >> 40 & 63
                    } else {
                        i as u64
                    };
                let value = (rng >> 20) as u32;
                w.put(addr, value);
                all.push((addr, value));
            }
            let points = w.into_points();
            let want = reference(&all);
            assert_eq!(points.len(), want.len());
            assert!(points.windows(2).all(|p| p[0].dst < p[1].dst));
            for p in &points {
                assert_eq!((p.count, Some(&p.value)), (1, want.get(&p.dst)), "{p:?}");
            }
        }
    }

    /// The window's entries against the hash-map version of `publish` (remove, then insert the
    /// mappings; unmaps patched at once).
    #[test]
    fn page_entries_match_the_hash_map_window() {
        let pages = [
            (1, 0, 10),
            (1, 1, 11),
            (2, 0, 12),
            (1, 0, -1), // unmapped later in the window: no mapping
            (1, 2, 13),
            (2, 0, -1),
            (2, 0, 14), // unmapped, then mapped again: the new page
            (3, 0, 15), // a slot freed since
            (1, 9, 16), // past max_pages
        ];
        let (mp, tab) = (8u64, 0x100u64);
        for defer in [false, true] {
            let mut w = WordPatches::default();
            let maps = page_entries(&pages, |b| b != 3, mp, tab, defer, &mut w);
            let (mut words, mut window) = (Vec::new(), HashMap::new());
            for &(b, l, p) in &pages {
                if b == 3 || l as u64 >= mp {
                    continue;
                }
                if defer {
                    window.remove(&(b, l));
                    if p >= 0 {
                        window.insert((b, l), p as u32);
                        continue;
                    }
                }
                words.push((tab + 4 * (b as u64 * mp + l as u64), p as u32));
            }
            let mut want: Vec<(MapKey, u32)> = window.into_iter().collect();
            want.sort();
            assert_eq!(maps, want, "defer {defer}");
            let points = w.into_points();
            let want = reference(&words);
            assert_eq!(points.len(), want.len());
            assert!(points.iter().all(|p| want.get(&p.dst) == Some(&p.value)));
        }
    }

    /// The staging image: lists at 16-byte aligned offsets, written straight into the buffer
    /// as the assembled image was; replay segments of 64 rows, the last one short.
    #[test]
    fn image_places_lists_as_the_assembled_image_did() {
        use super::super::{segment_counts, Image};
        let (a, b, c) = ([1u32, 2, 3], [7u64], [9u8; 5]);
        let mut img = Image::default();
        assert_eq!(img.push(&a), 0);
        assert_eq!(img.push(&b), 16);
        assert_eq!(img.push::<u32>(&[]), 32);
        assert_eq!(img.push(&c), 32);
        assert_eq!(img.len(), 37);
        let mut buf = vec![0xeeu8; 64];
        img.write_into(&mut buf);
        assert_eq!(&buf[..12], bytemuck::cast_slice::<u32, u8>(&a));
        assert_eq!(&buf[16..24], bytemuck::cast_slice::<u64, u8>(&b));
        assert_eq!(&buf[32..37], &c);
        assert_eq!(buf[12], 0xee, "padding untouched");
        // Runs staged as their rows, as the expanded list would be.
        use crate::gpu::data::FillRun;
        let runs = [
            FillRun {
                slot: 2,
                position: 64,
                dst_row: 640,
                rows: 3,
            },
            FillRun {
                slot: 2,
                position: 128,
                dst_row: 128,
                rows: 2,
            },
        ];
        let rows: Vec<cuda_kernels::KvCopy> = runs.iter().flat_map(|r| r.copies()).collect();
        let mut img = Image::default();
        assert_eq!(img.push(&a), 0);
        assert_eq!(img.push_runs(&runs), 16);
        assert_eq!(img.push(&b), 96);
        let mut buf = vec![0u8; 128];
        img.write_into(&mut buf);
        assert_eq!(&buf[16..96], bytemuck::cast_slice::<_, u8>(&rows));
        assert_eq!(&buf[96..104], bytemuck::cast_slice::<u64, u8>(&b));
        assert_eq!(segment_counts(0), Vec::<u32>::new());
        assert_eq!(segment_counts(64), [64]);
        assert_eq!(segment_counts(130), [64, 64, 2]);
    }
}
