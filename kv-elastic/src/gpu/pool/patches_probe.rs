//! The page-table planning of a publish, for `commit_probe`'s timing without a device: the
//! `Vec` version `publish` runs ([`plan`]) and a replica of the hash-map version it replaced
//! ([`hashed_plan`]). Both return the single-word patches (the deferred ones after their fill
//! passed, as the later publish patches them): sorted by address, or in first-write order.

use hashbrown::{HashMap, HashSet};
use tier_core::FlagSignal;

use super::deferred::{DeferredMaps, MapKey};
use super::patches::{page_entries, WordPatches};

const TAB: u64 = 0x7f00_0000_0000;

/// `publish`'s planning: `page_entries`, then (deferred) the maps through `DeferredMaps`.
pub(crate) fn plan(pages: &[(u32, u32, i32)], mp: u64, defer: bool) -> Vec<(u64, u32)> {
    let mut words = WordPatches::with_capacity(pages.len() + 64);
    let maps = page_entries(pages, |_| true, mp, TAB, defer, &mut words);
    let mut slots: Vec<u32> = Vec::new();
    for &((b, _), _) in &maps {
        if slots.last() != Some(&b) {
            slots.push(b);
        }
    }
    let mut out: Vec<(u64, u32)> = points(words);
    if defer {
        let mut d = DeferredMaps::default();
        let fill = FlagSignal::new();
        d.push(fill.clone(), maps);
        fill.complete();
        let ready = d.take_ready();
        let mut later = WordPatches::with_capacity(ready.len() + 64);
        for &(slot, logical, page) in &ready {
            later.put(TAB + 4 * (slot as u64 * mp + logical as u64), page);
        }
        out.extend(points(later));
    }
    std::hint::black_box(slots);
    out
}

fn points(w: WordPatches) -> Vec<(u64, u32)> {
    w.into_points()
        .into_iter()
        .map(|p| (p.dst, p.value))
        .collect()
}

/// The hash-map version (before issue 29's change): words and their first-write order, the
/// window's maps, their slots, and the deferred batch with its per-slot counts, per entry.
pub(crate) fn hashed_plan(pages: &[(u32, u32, i32)], mp: u64, defer: bool) -> Vec<(u64, u32)> {
    let patch = |words: HashMap<u64, u32>, order: Vec<u64>| -> Vec<(u64, u32)> {
        order.iter().map(|&a| (a, words[&a])).collect()
    };
    let hint = pages.len() + 64;
    let mut words: HashMap<u64, u32> = HashMap::with_capacity(hint);
    let mut order: Vec<u64> = Vec::with_capacity(hint);
    let mut window: HashMap<MapKey, u32> =
        HashMap::with_capacity(if defer { pages.len() } else { 0 });
    for &(b, logical, page) in pages {
        if (logical as u64) < mp {
            if defer {
                window.remove(&(b, logical));
                if page >= 0 {
                    window.insert((b, logical), page as u32);
                    continue;
                }
            }
            let a = TAB + 4 * (b as u64 * mp + logical as u64);
            if words.insert(a, page as u32).is_none() {
                order.push(a);
            }
        }
    }
    let slots: HashSet<u32> = window.keys().map(|&(b, _)| b).collect();
    std::hint::black_box(slots);
    let mut out = patch(words, order);
    if defer {
        // The batch's per-slot counts and entries, then taken entry by entry.
        let mut per_slot: HashMap<u32, u32> = HashMap::new();
        for &(slot, _) in window.keys() {
            *per_slot.entry(slot).or_insert(0) += 1;
        }
        let mut ready = Vec::new();
        for (&(slot, logical), &page) in window.iter() {
            if let Some(n) = per_slot.get_mut(&slot) {
                *n -= 1;
                if *n == 0 {
                    per_slot.remove(&slot);
                }
            }
            ready.push((slot, logical, page));
        }
        let mut words: HashMap<u64, u32> = HashMap::with_capacity(ready.len() + 64);
        let mut order = Vec::with_capacity(ready.len() + 64);
        for &(slot, logical, page) in &ready {
            let a = TAB + 4 * (slot as u64 * mp + logical as u64);
            if words.insert(a, page).is_none() {
                order.push(a);
            }
        }
        out.extend(patch(words, order));
    }
    out
}

/// A gather publish's row list staged as `publish` does now: written into `pinned` from the
/// runs ([`super::Image::push_runs`]), its segment counts after it; returns the staged length.
pub(crate) fn stage_direct(runs: &[crate::gpu::data::FillRun], pinned: &mut [u8]) -> usize {
    let rows: usize = runs.iter().map(|r| r.rows as usize).sum();
    let counts = super::segment_counts(rows);
    let mut img = super::Image::default();
    img.push_runs(runs);
    img.push(&counts);
    img.write_into(pinned);
    img.len()
}

/// The same as before issue 29's change: the list copied into replay segments, both pushed into
/// an assembled image, the image copied into `pinned`.
pub(crate) fn stage_assembled(runs: &[crate::gpu::data::FillRun], pinned: &mut [u8]) -> usize {
    let mut rows: Vec<cuda_kernels::KvCopy> = Vec::new();
    rows.extend(runs.iter().flat_map(|r| r.copies()));
    let n = rows.len() as u32;
    let counts: Vec<u32> = (0..n.div_ceil(64)).map(|b| (n - b * 64).min(64)).collect();
    let plan = rows.to_vec();
    let mut img: Vec<u8> = Vec::new();
    for bytes in [
        bytemuck::cast_slice::<_, u8>(&plan),
        bytemuck::cast_slice(&counts),
    ] {
        let at = img.len().next_multiple_of(16);
        img.resize(at, 0);
        img.extend_from_slice(bytes);
    }
    pinned[..img.len()].copy_from_slice(&img);
    img.len()
}
