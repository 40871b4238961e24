//! [`DeferredMaps`]: page-table entries of borrowed pages whose fill may still run
//! ([`super::MapAfterFill::Deferred`]), grouped by the fill's signal (one per publish).

use hashbrown::{HashMap, HashSet};
#[cfg(test)]
use tier_core::CompletionSignal;

/// A page-table entry key: `(session slot, logical page)`.
pub(crate) type MapKey = (u32, u32);

/// The page of an entry dropped before its fill passed (no physical page is `u32::MAX`: page
/// tables hold `i32`).
const DROPPED: u32 = u32::MAX;

/// One publish's deferred entries: its fill's signal and the entries `(key, page)` sorted by key,
/// unique; a dropped entry stays in place with page [`DROPPED`] (a binary search finds a key
/// without a hash map per publish).
#[derive(Debug)]
struct Batch<S> {
    fill: S,
    maps: Vec<(MapKey, u32)>,
    /// Entries not dropped.
    live: usize,
}

/// Deferred mappings: per publish that queued page fills, the signal after those fills and the
/// entries `(slot, logical) → physical page` it maps once complete. An entry leaves by
/// [`DeferredMaps::take_ready`] (its fill passed: map it) or is dropped (the page was reclaimed,
/// or its session finished, before that: never map it).
#[derive(Debug)]
pub(crate) struct DeferredMaps<S> {
    batches: Vec<Batch<S>>,
    /// Entries per slot (a slot with any is served without the direct path).
    per_slot: HashMap<u32, u32>,
    len: usize,
    /// [`DeferredMaps::try_take_ready`]'s per-batch answers, kept so that a publish with maps
    /// waiting allocates nothing once warm.
    done: Vec<bool>,
}

impl<S> Default for DeferredMaps<S> {
    fn default() -> Self {
        Self {
            batches: Vec::new(),
            per_slot: HashMap::new(),
            len: 0,
            done: Vec::new(),
        }
    }
}

/// Calls `f(slot, n)` for each run of `n` consecutive entries of one slot in `entries` (sorted by
/// key, so a slot's entries are one run), skipping dropped ones.
fn slot_runs(entries: &[(MapKey, u32)], mut f: impl FnMut(u32, u32)) {
    let mut run: Option<(u32, u32)> = None;
    for &((slot, _), page) in entries {
        if page == DROPPED {
            continue;
        }
        match &mut run {
            Some((s, n)) if *s == slot => *n += 1,
            _ => {
                if let Some((s, n)) = run {
                    f(s, n);
                }
                run = Some((slot, 1));
            }
        }
    }
    if let Some((s, n)) = run {
        f(s, n);
    }
}

impl<S> DeferredMaps<S> {
    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `slot` has an entry waiting.
    pub(crate) fn has_slot(&self, slot: u32) -> bool {
        self.per_slot.contains_key(&slot)
    }

    fn forget(per_slot: &mut HashMap<u32, u32>, slot: u32, n: u32) {
        if let Some(c) = per_slot.get_mut(&slot) {
            *c -= n;
            if *c == 0 {
                per_slot.remove(&slot);
            }
        }
    }

    /// Adds the entries `maps` of one publish (sorted by key, unique: [`super::patches::page_entries`]),
    /// mapped once `fill` is complete. A key must not be waiting already (the control plane
    /// unmaps an entry before lending it again, which drops it).
    pub(crate) fn push(&mut self, fill: S, maps: Vec<(MapKey, u32)>) {
        debug_assert!(maps.windows(2).all(|w| w[0].0 < w[1].0), "sorted, unique");
        if maps.is_empty() {
            return;
        }
        let per_slot = &mut self.per_slot;
        slot_runs(&maps, |slot, n| *per_slot.entry(slot).or_insert(0) += n);
        self.len += maps.len();
        self.batches.push(Batch {
            fill,
            live: maps.len(),
            maps,
        });
    }

    /// Drops the entry of `key` (its page was unmapped); returns whether one waited.
    pub(crate) fn drop_key(&mut self, key: MapKey) -> bool {
        for b in &mut self.batches {
            if let Ok(i) = b.maps.binary_search_by_key(&key, |e| e.0) {
                if b.maps[i].1 != DROPPED {
                    b.maps[i].1 = DROPPED;
                    b.live -= 1;
                    Self::forget(&mut self.per_slot, key.0, 1);
                    self.len -= 1;
                    return true;
                }
            }
        }
        false
    }

    /// Drops every entry of the freed `slots`; returns how many.
    pub(crate) fn drop_slots(&mut self, slots: &HashSet<u32>) -> usize {
        if slots.is_empty() || self.len == 0 {
            return 0;
        }
        let before = self.len;
        for b in &mut self.batches {
            b.maps
                .retain(|&((slot, _), page)| page != DROPPED && !slots.contains(&slot));
            b.live = b.maps.len();
        }
        for s in slots {
            self.per_slot.remove(s);
        }
        self.len = self.batches.iter().map(|b| b.live).sum();
        self.batches.retain(|b| b.live > 0);
        before - self.len
    }

    /// Takes the entries whose fill is complete (polled without waiting without failing: a
    /// signal that cannot report an error), `(slot, logical, page)`.
    #[cfg(test)]
    pub(crate) fn take_ready(&mut self) -> Vec<(u32, u32, u32)>
    where
        S: CompletionSignal,
    {
        match self.try_take_ready(|s| Ok::<_, std::convert::Infallible>(s.is_complete())) {
            Ok(v) => v,
            Err(e) => match e {},
        }
    }

    /// [`DeferredMaps::take_ready`] with the fill's completion asked of `query`, whose error
    /// (e.g. a failed `cuEventQuery`: a broken context) is returned instead of leaving the
    /// entries waiting forever. On an error nothing is taken. Entries come out by batch, each
    /// batch's in key order.
    pub(crate) fn try_take_ready<E>(
        &mut self,
        query: impl Fn(&S) -> Result<bool, E>,
    ) -> Result<Vec<(u32, u32, u32)>, E> {
        // Every batch is asked before anything is taken (an error takes nothing); the answers go
        // to a kept buffer (lost only on that error path).
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        for b in &self.batches {
            done.push(b.live > 0 && query(&b.fill)?);
        }
        let mut out = Vec::new();
        let per_slot = &mut self.per_slot;
        let mut i = 0;
        self.batches.retain(|b| {
            let complete = done[i];
            i += 1;
            if b.live == 0 {
                return false;
            }
            if !complete {
                return true;
            }
            out.reserve(b.live);
            out.extend(
                b.maps
                    .iter()
                    .filter(|e| e.1 != DROPPED)
                    .map(|&((slot, logical), page)| (slot, logical, page)),
            );
            slot_runs(&b.maps, |slot, n| Self::forget(per_slot, slot, n));
            false
        });
        self.len -= out.len();
        self.done = done;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_core::FlagSignal;

    fn maps(entries: &[(u32, u32, u32)]) -> Vec<(MapKey, u32)> {
        let mut v: Vec<(MapKey, u32)> = entries.iter().map(|&(s, l, p)| ((s, l), p)).collect();
        v.sort();
        v
    }

    /// A fill not yet complete maps nothing; once it completes its entries come out once.
    #[test]
    fn entries_wait_for_their_fill() {
        let mut d = DeferredMaps::default();
        let (a, b) = (FlagSignal::new(), FlagSignal::new());
        d.push(a.clone(), maps(&[(0, 1, 10), (0, 2, 11)]));
        d.push(b.clone(), maps(&[(1, 0, 12)]));
        assert_eq!(d.len(), 3);
        assert!(d.take_ready().is_empty());
        b.complete();
        assert_eq!(d.take_ready(), vec![(1, 0, 12)]);
        assert!(d.has_slot(0) && !d.has_slot(1));
        a.complete();
        let mut r = d.take_ready();
        r.sort();
        assert_eq!(r, vec![(0, 1, 10), (0, 2, 11)]);
        assert_eq!(d.len(), 0);
        assert!(!d.has_slot(0));
        assert!(d.take_ready().is_empty(), "taken once");
    }

    /// Reclaim before mapping: the entry is dropped and never mapped, even after the fill; a
    /// later lend of the same key (after the unmap) waits for its own fill.
    /// A failing completion query is returned, and nothing is taken or lost.
    #[test]
    fn a_failed_query_is_an_error_and_keeps_the_entries() {
        let mut d = DeferredMaps::default();
        let (a, b) = (FlagSignal::new(), FlagSignal::new());
        d.push(a.clone(), maps(&[(0, 1, 10)]));
        d.push(b.clone(), maps(&[(1, 0, 12)]));
        a.complete();
        let broken = |s: &FlagSignal| {
            if s.is_complete() {
                Ok(true)
            } else {
                Err("query failed")
            }
        };
        assert_eq!(d.try_take_ready(broken), Err("query failed"));
        assert_eq!(d.len(), 2);
        assert!(d.has_slot(0) && d.has_slot(1));
        b.complete();
        let mut got = d.take_ready();
        got.sort();
        assert_eq!(got, vec![(0, 1, 10), (1, 0, 12)]);
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn reclaim_before_mapping_drops_the_entry() {
        let mut d = DeferredMaps::default();
        let first = FlagSignal::new();
        d.push(first.clone(), maps(&[(3, 5, 20), (3, 6, 21)]));
        assert!(d.drop_key((3, 5)));
        assert!(!d.drop_key((3, 5)), "dropped once");
        let second = FlagSignal::new();
        d.push(second.clone(), maps(&[(3, 5, 40)]));
        first.complete();
        assert_eq!(
            d.take_ready(),
            vec![(3, 6, 21)],
            "the old page is never mapped"
        );
        assert!(d.has_slot(3));
        second.complete();
        assert_eq!(d.take_ready(), vec![(3, 5, 40)]);
        assert!(!d.has_slot(3));
    }

    /// Finish before mapping: every entry of the freed slot goes; other slots keep theirs.
    #[test]
    fn finished_slot_drops_its_entries() {
        let mut d = DeferredMaps::default();
        let f = FlagSignal::new();
        d.push(f.clone(), maps(&[(2, 0, 1), (2, 1, 2), (4, 0, 3)]));
        let freed: HashSet<u32> = [2].into_iter().collect();
        assert_eq!(d.drop_slots(&freed), 2);
        assert_eq!(d.len(), 1);
        assert!(!d.has_slot(2) && d.has_slot(4));
        f.complete();
        assert_eq!(d.take_ready(), vec![(4, 0, 3)]);
    }
}
