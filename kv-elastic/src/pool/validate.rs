//! A resolve's input checks, shared by every back-end (the CPU reference and the GPU pool run the
//! same checks and return the same errors).

use hashbrown::HashSet;

use super::ElasticPool;
use crate::data::DataPlane;
use crate::data::SessionId;
use crate::error::{KvError, Result};
use crate::resolve::{
    row_positions, ResolveInput, ResolveOptions, ResolveOutput, ResolvePlan, MAX_BLOCK_POSITIONS,
    MAX_CANDIDATES,
};

/// What a batch's checks found.
#[derive(Debug)]
pub(crate) struct CheckedBatch {
    /// The distinct positions per batch entry that need the hot cache (first appearance order).
    pub need: Vec<Vec<u32>>,
    /// Valid picks (positions, block ids expanded) of the batch: what a resolve serves at most.
    pub picks: u64,
}

impl<D: DataPlane> ElasticPool<D> {
    /// Checks a batch; returns the distinct positions per batch entry that need the hot cache
    /// (first appearance order) and the valid picks. A step needing more than `hot_rows` of them
    /// is valid: it is served as far as evictable rows last (see the resolvers). Block ids
    /// ([`ResolveOptions::block_positions`]) are checked as the positions they stand for.
    pub(crate) fn validate_batch(
        &self,
        input: &ResolveInput<'_>,
        opts: &ResolveOptions<'_>,
    ) -> Result<CheckedBatch> {
        let g = &self.ctl.geometry;
        let reqs = input.sessions.len();
        if input.layer >= g.layers {
            return Err(KvError::LayerOutOfRange {
                layer: input.layer,
                layers: g.layers,
            });
        }
        if input.query_start_loc.len() != reqs + 1 {
            return Err(KvError::LengthMismatch {
                what: "query_start_loc",
                expected: reqs + 1,
                actual: input.query_start_loc.len(),
            });
        }
        if input.seq_lens.len() != reqs {
            return Err(KvError::LengthMismatch {
                what: "seq_lens",
                expected: reqs,
                actual: input.seq_lens.len(),
            });
        }
        if input.k == 0 {
            return Err(KvError::LengthMismatch {
                what: "k",
                expected: 1,
                actual: 0,
            });
        }
        if !input.topk.len().is_multiple_of(input.k) {
            return Err(KvError::LengthMismatch {
                what: "topk (rows × k)",
                expected: input.topk.len().div_ceil(input.k) * input.k,
                actual: input.topk.len(),
            });
        }
        if opts.block_positions > MAX_BLOCK_POSITIONS {
            return Err(KvError::BlockPositionsOutOfRange {
                block_positions: opts.block_positions,
                max: MAX_BLOCK_POSITIONS,
            });
        }
        let block = opts.block();
        if input.k as u64 * block as u64 > i32::MAX as u64 {
            return Err(KvError::LengthMismatch {
                what: "output row width k × block_positions (at most i32::MAX)",
                expected: i32::MAX as usize,
                actual: input.k.saturating_mul(block),
            });
        }
        let rows = input.topk.len() / input.k;
        let qsl = input.query_start_loc;
        if qsl[0] != 0 {
            return Err(KvError::BadQueryStartLoc("query_start_loc[0] must be 0"));
        }
        if qsl.windows(2).any(|w| w[1] < w[0]) {
            return Err(KvError::BadQueryStartLoc(
                "query_start_loc must be non-decreasing",
            ));
        }
        if qsl[reqs] as usize != rows || qsl[reqs] < 0 {
            return Err(KvError::BadQueryStartLoc(
                "query_start_loc[reqs] must equal the number of topk rows",
            ));
        }
        if let Some(q) = opts.query_seq_lens {
            if q.len() != rows {
                return Err(KvError::LengthMismatch {
                    what: "query_seq_lens",
                    expected: rows,
                    actual: q.len(),
                });
            }
        }
        let mut seen = HashSet::with_capacity(reqs);
        let mut hot_needed = Vec::with_capacity(reqs);
        let mut picks = 0u64;
        for (ri, &s) in input.sessions.iter().enumerate() {
            let r = self.session(s)?;
            if !seen.insert(s) {
                return Err(KvError::DuplicateSession(s));
            }
            let seq_len = input.seq_lens[ri];
            let available = r.committed + r.scratch_len;
            if seq_len < 1 || seq_len as u32 > available {
                return Err(KvError::SeqLenOutOfRange {
                    session: s,
                    seq_len,
                    available,
                });
            }
            let tail_start = r.committed.saturating_sub(g.tail_rows);
            let full = r.fully_held(&self.ctl.geometry);
            let mut need = Vec::new();
            let mut need_set = if full {
                HashSet::new()
            } else {
                HashSet::with_capacity(2 * input.k)
            };
            for row in qsl[ri] as usize..qsl[ri + 1] as usize {
                let bound = match opts.query_seq_lens {
                    None => seq_len,
                    Some(q) => {
                        if q[row] < 1 || q[row] > seq_len {
                            return Err(KvError::QuerySeqLenOutOfRange {
                                row,
                                query_seq_len: q[row],
                                seq_len,
                            });
                        }
                        q[row]
                    }
                };
                for p in row_positions(
                    &input.topk[row * input.k..(row + 1) * input.k],
                    block,
                    bound,
                ) {
                    if p < -1 || p >= bound {
                        return Err(KvError::PositionOutOfRange {
                            row,
                            position: p,
                            seq_len: bound,
                        });
                    }
                    picks += u64::from(p >= 0);
                    if p < 0 || full {
                        continue;
                    }
                    let p = p as u32;
                    if p >= tail_start {
                        continue;
                    }
                    let j = (p / g.page_rows) as usize;
                    if r.pages.table().get(j).is_some_and(|&pg| pg >= 0) {
                        continue;
                    }
                    if need_set.insert(p) {
                        need.push(p);
                    }
                }
            }
            hot_needed.push(need);
        }
        Ok(CheckedBatch {
            need: hot_needed,
            picks,
        })
    }

    /// A resolve's checks, shared by every back-end: output shapes (`indices` at least `rows × k ×
    /// B`, `valid_count` at least `rows`; longer buffers are padding) and
    /// [`Self::validate_batch`]'s errors; on an input error the outputs are filled with `-1` / `0`
    /// when their lengths suffice. Returns the distinct non-resident positions per session and the
    /// valid picks.
    pub(crate) fn validate_resolve(
        &self,
        input: &ResolveInput<'_>,
        opts: &ResolveOptions<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<CheckedBatch> {
        let rows = input.topk.len().checked_div(input.k).unwrap_or(0);
        let picks = input.topk.len().saturating_mul(opts.block());
        let lengths_ok = out.indices.len() >= picks && out.valid_count.len() >= rows;
        match self.validate_batch(input, opts) {
            Ok(h) if lengths_ok => Ok(h),
            Ok(_) => Err(if out.indices.len() < picks {
                KvError::LengthMismatch {
                    what: "indices (at least rows × k × block_positions)",
                    expected: picks,
                    actual: out.indices.len(),
                }
            } else {
                KvError::LengthMismatch {
                    what: "valid_count (at least rows)",
                    expected: rows,
                    actual: out.valid_count.len(),
                }
            }),
            Err(e) => {
                if lengths_ok {
                    out.indices.fill(-1);
                    out.valid_count.fill(0);
                }
                Err(e)
            }
        }
    }

    /// A replay's checks, shared by every back-end: `LayerOutOfRange`, `LayerOutsideGroup` (the
    /// plan's rows are hot rows of `plan.group`, which another group's planes use for other
    /// positions).
    pub(crate) fn validate_replay(&self, plan: &ResolvePlan, layer: u32) -> Result<()> {
        let g = &self.ctl.geometry;
        if layer >= g.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: g.layers,
            });
        }
        if g.group_of(layer) != plan.group {
            let r = g.layer_groups.layers(plan.group, g.layers);
            return Err(KvError::LayerOutsideGroup {
                layer,
                group: plan.group,
                first: r.start,
                end: r.end,
            });
        }
        Ok(())
    }

    /// A prefetch's checks, shared by every back-end: `LayerOutOfRange`, `TooManyCandidates`,
    /// session errors, `PositionOutOfRange` (a candidate `< -1` or not committed). Returns the
    /// session's committed length.
    pub(crate) fn validate_prefetch(
        &self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<u32> {
        if layer >= self.ctl.geometry.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: self.ctl.geometry.layers,
            });
        }
        if candidates.len() > MAX_CANDIDATES {
            return Err(KvError::TooManyCandidates {
                given: candidates.len(),
                max: MAX_CANDIDATES,
            });
        }
        let committed = self.session(session)?.committed;
        for (i, &p) in candidates.iter().enumerate() {
            if p < -1 || p >= committed as i32 {
                return Err(KvError::PositionOutOfRange {
                    row: i,
                    position: p,
                    seq_len: committed as i32,
                });
            }
        }
        Ok(committed)
    }
}
