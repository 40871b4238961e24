//! The exact CPU [`Resolver`]: the KV resolve kernel contract (`cuda-kernels/DESIGN.md`,
//! "KV resolve kernel contract") run on the host, byte for byte the GPU kernels' decisions.

use hashbrown::HashSet;

use super::ElasticPool;
use crate::control::SessionState;
use crate::data::SessionId;
use crate::error::{KvError, Result};
use crate::resolve::{
    row_positions, OutputLayout, ResolveInput, ResolveOptions, ResolveOutput, ResolvePlan,
    ResolveStats, Resolved, Resolver, RowCopy,
};
use crate::ticket::ReadTicket;

impl ElasticPool {
    /// Physical row of a valid position (tail → scratch → page → the hot cache of layer group
    /// `group`); `None` if not resident.
    #[inline]
    fn locate(
        &self,
        r: &SessionState,
        group: usize,
        p: u32,
        tail_start: u32,
        stats: &mut ResolveStats,
    ) -> Option<u32> {
        let g = &self.ctl.geometry;
        if p >= r.committed {
            stats.scratch_hits += 1;
            return Some(self.scratch_row(r, p - r.committed));
        }
        if p >= tail_start {
            stats.tail_hits += 1;
            return Some(self.tail_row(r, p));
        }
        let pg = r
            .pages
            .table()
            .get((p / g.page_rows) as usize)
            .copied()
            .unwrap_or(-1);
        if pg >= 0 {
            stats.page_hits += 1;
            return Some(g.page_row(pg as u32, p));
        }
        let slot = r.hot[group].lookup(p)?;
        stats.hot_hits += 1;
        Some(self.fixed_row(r, slot))
    }

    fn apply_copies(&mut self, copies: &[RowCopy], layers: std::ops::Range<u32>) {
        for c in copies {
            for layer in layers.clone() {
                self.data
                    .copy_host_row(c.session, c.position, layer, c.dst_row);
            }
        }
    }
}

impl Resolver for ElasticPool {
    fn resolve_with(
        &mut self,
        input: &ResolveInput<'_>,
        opts: &ResolveOptions<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved> {
        let checked = self.validate_resolve(input, opts, out)?;
        let hot_needed = checked.need;
        let mut stats = ResolveStats::default();
        let mut copies = Vec::new();
        let g = self.ctl.geometry;
        // The layer group's hot cache serves the picks; misses fill every layer of the group.
        let group = g.group_of(input.layer) as usize;
        // Hot-cache bookkeeping: pin hits, install misses into victims (never this call's rows),
        // in first-appearance order while a victim exists (the contract's "Overflow": a step
        // needing more rows than the cache has is served as far as evictable rows last; the
        // kernel's sweep makes the same choices, including one failing sweep at the end).
        // (`hot_needed` has one entry per session of the call, in order; the sessions are distinct.)
        for (ri, need) in hot_needed.iter().enumerate() {
            let s = input.sessions[ri];
            let r = self.ctl.sessions.get_mut(&s).expect("validated");
            // Every session named by the call starts its next call number (direct ones too: a
            // prefetch after this resolve pins with it).
            r.call[group] += 1;
            if need.is_empty() {
                if r.fully_held(&g) {
                    stats.direct_sessions += 1;
                }
                continue;
            }
            let call = r.call[group];
            let hot = &mut r.hot[group];
            let mut misses = Vec::new();
            for &p in need {
                match hot.lookup(p) {
                    Some(slot) => hot.touch(slot, call),
                    None => misses.push(p),
                }
            }
            for &p in &misses {
                let Some(slot) = hot.victim(call) else {
                    break;
                };
                hot.install(slot, p, call);
                let dst_row = g.fixed_row(&r.fixed_pages, slot);
                copies.push(RowCopy {
                    session: s,
                    position: p,
                    dst_row,
                });
                stats.misses += 1;
            }
        }
        self.apply_copies(&copies, g.group_layers(input.layer));
        self.ctl.counters.miss_tokens += stats.misses;
        // Outputs: every element written (padding past rows × k and rows too). With block ids
        // (validated: none < -1) a row's k ids stand for k × block positions, each resolved as a
        // position pick; the positions at or beyond the row's bound come out -1.
        let (k, block) = (input.k, opts.block());
        let width = k * block;
        for (ri, &s) in input.sessions.iter().enumerate() {
            let r = &self.ctl.sessions[&s];
            let tail_start = r.committed.saturating_sub(g.tail_rows);
            for row in input.query_start_loc[ri] as usize..input.query_start_loc[ri + 1] as usize {
                let bound = opts.query_seq_lens.map_or(input.seq_lens[ri], |q| q[row]);
                let picks = row_positions(&input.topk[row * k..(row + 1) * k], block, bound);
                let mut valid = 0usize;
                for (j, p) in (row * width..(row + 1) * width).zip(picks) {
                    let at = if p < 0 {
                        -1
                    } else {
                        match self.locate(r, group, p as u32, tail_start, &mut stats) {
                            Some(x) => x as i32,
                            None => {
                                stats.unserved += 1;
                                -1
                            }
                        }
                    };
                    match opts.layout {
                        OutputLayout::InPlace => out.indices[j] = at,
                        OutputLayout::Packed if at >= 0 => out.indices[row * width + valid] = at,
                        OutputLayout::Packed => {}
                    }
                    valid += usize::from(at >= 0);
                }
                if opts.layout == OutputLayout::Packed {
                    out.indices[row * width + valid..(row + 1) * width].fill(-1);
                }
                out.valid_count[row] = valid as i32;
                stats.picks += valid as u64;
            }
        }
        // Every valid pick is served or counted unserved.
        debug_assert_eq!(stats.picks + stats.unserved, checked.picks);
        // Validated: query_start_loc covers rows 0..rows exactly; the rest is padding.
        let rows = input.topk.len() / k;
        out.indices[rows * width..].fill(-1);
        out.valid_count[rows..].fill(0);
        Ok(Resolved {
            plan: ResolvePlan {
                copies,
                group: group as u32,
            },
            stats,
            ticket: ReadTicket::host(self.ctl.pages.fence()),
        })
    }

    fn replay(&mut self, plan: &ResolvePlan, layer: u32) -> Result<()> {
        self.validate_replay(plan, layer)?;
        let group = plan.group as usize;
        for c in &plan.copies {
            let r = self.session(c.session)?;
            let ok = r.hot[group]
                .lookup(c.position)
                .is_some_and(|slot| self.fixed_row(r, slot) == c.dst_row);
            if !ok {
                return Err(KvError::StalePlan {
                    session: c.session,
                    position: c.position,
                    row: c.dst_row,
                });
            }
        }
        self.apply_copies(&plan.copies, layer..layer + 1);
        Ok(())
    }

    fn prefetch(
        &mut self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<ResolvePlan> {
        self.validate_prefetch(session, candidates, layer)?;
        let r = self.session(session)?;
        let g = self.ctl.geometry;
        let group = g.group_of(layer) as usize;
        let call = r.call[group];
        let tail_start = r.committed.saturating_sub(g.tail_rows);
        let mut copies = Vec::new();
        let r = self.ctl.sessions.get_mut(&session).expect("live");
        // As in resolve: pin every hit first, then place the distinct misses (first appearance
        // order) while victims last, so a prefetch never evicts one of its own candidates. The
        // GPU back-end makes the same decisions.
        let mut misses = Vec::new();
        let mut seen = HashSet::new();
        for &p in candidates {
            if p < 0 {
                continue;
            }
            let p = p as u32;
            if p >= tail_start
                || r.pages
                    .table()
                    .get((p / g.page_rows) as usize)
                    .is_some_and(|&pg| pg >= 0)
            {
                continue;
            }
            if let Some(slot) = r.hot[group].lookup(p) {
                r.hot[group].touch(slot, call);
            } else if seen.insert(p) {
                misses.push(p);
            }
        }
        for p in misses {
            let Some(slot) = r.hot[group].victim(call) else {
                break;
            };
            r.hot[group].install(slot, p, call);
            copies.push(RowCopy {
                session,
                position: p,
                dst_row: g.fixed_row(&r.fixed_pages, slot),
            });
        }
        self.apply_copies(&copies, g.group_layers(layer));
        self.ctl.counters.prefetch_tokens += copies.len() as u64;
        Ok(ResolvePlan {
            copies,
            group: group as u32,
        })
    }
}
