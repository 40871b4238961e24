//! Forward passes rebuilt from per-(token, layer) rows in file order, losing no pass to a
//! missing row.
//!
//! Engines log a forward pass layer by layer: a prefill of `n` tokens is written layer-major
//! (layer 0's rows `0..n`, then layer 1's, ...), each decode step then logs its token(s) in every
//! layer (often at position 0). Rows of one file are therefore cut into passes by file order: a
//! pass is a run of rows whose layer never decreases, and whose position (when the log has one)
//! increases within a layer. A new pass starts at a row whose
//! - layer is below the previous row's; or
//! - layer equals the previous row's and whose position does not exceed the previous row's; or
//! - pass kind (`"pass": "decode"`) differs from the previous row's.
//!
//! **Missing rows.** Real logs lose rows (a logger that drops lines under load; the Mixtral log
//! behind issue 25 lost 3%: a prefill layer holds 124–134 of 135 positions, a decode step logs
//! 26–32 of 32 layers). A missing row never shifts the passes after it: the layers of a pass
//! that lack a row simply have fewer picks (an empty pick list when the whole row of a decode
//! step is gone). They are counted: in each pass, every logged layer (a layer with a row anywhere
//! in the file) should route the pass's tokens (the positions seen in any layer of the pass, or,
//! without positions, as many rows as its fullest layer); each one it lacks is a missing row
//! ([`RowCounts::missing_rows`]). The one ambiguity: if a pass loses its last layers and the next
//! pass its first ones so that no layer decreases between them, the two merge; with independent
//! losses of a few percent this needs a whole run of ~`layers` rows lost in a row.
//!
//! **Dummy passes** are dropped as in [`super::passes`]: a pass whose kind is not counted, or one
//! of at least [`super::passes::MIN_DUMMY_ROWS`] rows (in its fullest layer) without a kind in
//! which every layer's rows are identical. [`super::ReadOptions::keep_dummy_passes`] keeps them.

use super::passes::{PassCounts, MIN_DUMMY_ROWS};
use super::{StepPicks, TraceError};
use expert_residency::PassKind;

/// One layer's rows within one pass.
#[derive(Debug)]
struct LayerRun {
    layer: u32,
    rows: u32,
    ids: Vec<u32>,
    /// The run's first row (ids), and whether every row so far equals it.
    first: Vec<u32>,
    identical: bool,
}

/// One pass being built.
#[derive(Debug, Default)]
struct Pass {
    kind: Option<PassKind>,
    runs: Vec<LayerRun>,
    /// Positions of the pass's rows (all layers), when the log has positions.
    positions: Vec<u64>,
    any_without_position: bool,
}

impl Pass {
    /// Tokens every logged layer should route in this pass.
    fn expected_rows(&mut self) -> u64 {
        if self.any_without_position || self.positions.is_empty() {
            return self.runs.iter().map(|r| r.rows as u64).max().unwrap_or(0);
        }
        self.positions.sort_unstable();
        self.positions.dedup();
        let n = self.positions.len() as u64;
        self.positions = Vec::new();
        n
    }
}

/// A closed pass: its picks per layer and what the missing-row count needs.
#[derive(Debug)]
struct Closed {
    kind: Option<PassKind>,
    expected: u64,
    runs: Vec<LayerRun>,
}

/// Rows read and missing in a per-row log (see the module docs), in [`super::ReadReport::rows`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RowCounts {
    /// Rows read (one per routed token per layer).
    pub rows: u64,
    /// (token, layer) rows the kept passes lack (see the module docs).
    pub missing_rows: u64,
    /// Kept passes that lack at least one row.
    pub passes_with_missing_rows: u64,
}

/// Cuts rows pushed in file order into passes (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Aligner {
    closed: Vec<Closed>,
    cur: Pass,
    last: Option<(u32, Option<u64>, Option<PassKind>)>,
    logged: std::collections::BTreeSet<u32>,
    rows: u64,
}

impl Aligner {
    /// Appends one row: `layer`, its position in the pass (if the log has one), its pass kind,
    /// its expert ids.
    pub(crate) fn push(
        &mut self,
        layer: u32,
        pos: Option<u64>,
        kind: Option<PassKind>,
        ids: Vec<u32>,
    ) {
        let new_pass = match self.last {
            None => false,
            Some((l, p, k)) => {
                layer < l
                    || (layer == l && matches!((pos, p), (Some(a), Some(b)) if a <= b))
                    || k != kind
            }
        };
        if new_pass {
            self.close();
        }
        self.last = Some((layer, pos, kind));
        self.rows += 1;
        self.logged.insert(layer);
        let pass = &mut self.cur;
        pass.kind = kind;
        match pos {
            Some(p) => pass.positions.push(p),
            None => pass.any_without_position = true,
        }
        match pass.runs.last_mut() {
            Some(run) if run.layer == layer => {
                run.rows += 1;
                run.identical &= run.first == ids;
                run.ids.extend_from_slice(&ids);
            }
            _ => pass.runs.push(LayerRun {
                layer,
                rows: 1,
                ids: ids.clone(),
                first: ids,
                identical: true,
            }),
        }
    }

    /// Appends one id to the current row of `layer` at `pos` (a CSV with one row per routed
    /// pick): a row with the same layer and position as the previous one continues its token.
    pub(crate) fn push_pick(
        &mut self,
        layer: u32,
        pos: Option<u64>,
        kind: Option<PassKind>,
        id: u32,
    ) {
        let same_token = pos.is_some() && self.last == Some((layer, pos, kind));
        match self.cur.runs.last_mut() {
            Some(run) if same_token && run.layer == layer => {
                run.ids.push(id);
                if run.rows == 1 {
                    run.first.push(id);
                }
            }
            _ => self.push(layer, pos, kind, vec![id]),
        }
    }

    fn close(&mut self) {
        let mut pass = std::mem::take(&mut self.cur);
        if pass.runs.is_empty() {
            return;
        }
        let expected = pass.expected_rows();
        self.closed.push(Closed {
            kind: pass.kind,
            expected,
            runs: pass.runs,
        });
    }

    /// The passes as steps of `layers` layers (every pushed layer must be below it), with the
    /// dummy filter applied unless `keep_dummy`, and the counts. `name` names the trace in
    /// errors.
    ///
    /// # Errors
    /// [`TraceError::Empty`] when no row was pushed or only dummy passes were.
    pub(crate) fn finish(
        mut self,
        layers: u32,
        keep_dummy: bool,
        name: &str,
    ) -> Result<(Vec<StepPicks>, PassCounts, RowCounts), TraceError> {
        self.close();
        let mut passes = PassCounts {
            passes: self.closed.len() as u64,
            ..PassCounts::default()
        };
        let mut rows = RowCounts {
            rows: self.rows,
            ..RowCounts::default()
        };
        if self.closed.is_empty() {
            return Err(TraceError::Empty(format!("{name}: no routing record")));
        }
        let logged = self.logged.len() as u64;
        let mut steps = Vec::with_capacity(self.closed.len());
        for pass in self.closed {
            let widest = pass.runs.iter().map(|r| r.rows).max().unwrap_or(0) as usize;
            let identical = pass.kind.is_none()
                && widest >= MIN_DUMMY_ROWS
                && pass.runs.iter().all(|r| r.identical);
            if !keep_dummy {
                if pass.kind.is_some_and(|k| !k.is_counted()) {
                    passes.dropped_kind += 1;
                    continue;
                }
                if identical {
                    passes.dropped_identical += 1;
                    continue;
                }
            }
            let present: u64 = pass
                .runs
                .iter()
                .map(|r| (r.rows as u64).min(pass.expected))
                .sum();
            let missing = (pass.expected * logged).saturating_sub(present);
            rows.missing_rows += missing;
            rows.passes_with_missing_rows += u64::from(missing > 0);
            let mut step = StepPicks {
                layers: vec![Vec::new(); layers as usize],
            };
            for run in pass.runs {
                step.layers[run.layer as usize] = run.ids;
            }
            steps.push(step);
        }
        if steps.is_empty() {
            return Err(TraceError::Empty(format!(
                "{name}: all {} forward passes are dummy or warm-up passes ({} with identical \
                 rows, {} of a non-counted kind); pass --keep-dummy-passes to keep them",
                passes.passes, passes.dropped_identical, passes.dropped_kind
            )));
        }
        Ok((steps, passes, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(i: u32) -> Vec<u32> {
        vec![i % 8, (i + 1) % 8]
    }

    #[test]
    fn layer_major_prefill_then_position_zero_decode_with_lost_rows() {
        let mut a = Aligner::default();
        // Prefill of 5 tokens over 3 layers, layer-major; layer 1 lost position 3.
        for l in 0..3u32 {
            for p in 0..5u64 {
                if (l, p) != (1, 3) {
                    a.push(l, Some(p), None, ids(l + p as u32));
                }
            }
        }
        // Four decode steps at position 0; step 2 lost layer 2, step 3 lost layer 0.
        for s in 0..4u32 {
            for l in 0..3u32 {
                if (s, l) != (2, 2) && (s, l) != (3, 0) {
                    a.push(l, Some(0), None, ids(10 + s + l));
                }
            }
        }
        let (steps, passes, rows) = a.finish(4, false, "t").unwrap();
        assert_eq!(steps.len(), 5);
        assert_eq!(passes.passes, 5);
        assert_eq!(steps[0].layers[1].len(), 4 * 2);
        assert_eq!(steps[0].layers[0].len(), 5 * 2);
        assert!(steps[3].layers[2].is_empty());
        assert!(steps[4].layers[0].is_empty());
        assert_eq!(steps[4].layers[1], ids(14));
        assert!(steps[1].layers[3].is_empty(), "an unlogged layer is empty");
        assert_eq!(
            rows,
            RowCounts {
                rows: 14 + 10,
                missing_rows: 3,
                passes_with_missing_rows: 3
            }
        );
    }

    #[test]
    fn picks_of_one_token_join_and_kinds_cut() {
        let mut a = Aligner::default();
        for (l, p, e) in [
            (0, 0, 1),
            (0, 0, 2),
            (0, 1, 3),
            (0, 1, 4),
            (1, 0, 5),
            (1, 0, 6),
        ] {
            a.push_pick(l, Some(p), Some(PassKind::Prefill), e);
        }
        a.push_pick(0, Some(2), Some(PassKind::Decode), 7);
        a.push_pick(0, Some(2), Some(PassKind::Decode), 0);
        let (steps, _, rows) = a.finish(2, false, "t").unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].layers, vec![vec![1, 2, 3, 4], vec![5, 6]]);
        assert_eq!(steps[1].layers, vec![vec![7, 0], vec![]]);
        assert_eq!(rows.rows, 4);
        assert_eq!(rows.missing_rows, 1 + 1);
    }

    #[test]
    fn identical_and_non_counted_passes_drop() {
        let mut a = Aligner::default();
        for p in 0..MIN_DUMMY_ROWS as u64 {
            a.push(0, Some(p), None, vec![1, 2]);
        }
        a.push(0, Some(0), Some(PassKind::Warmup), vec![3, 4]);
        a.push(0, Some(0), None, vec![5, 6]);
        let (steps, passes, _) = a.finish(1, false, "t").unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (passes.passes, passes.dropped_identical, passes.dropped_kind),
            (3, 1, 1)
        );
        assert!(Aligner::default().finish(1, false, "t").is_err());
    }
}
