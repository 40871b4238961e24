//! Forward passes rebuilt from per-row routing logs, and the dummy/warm-up filter.
//!
//! Engines log one row per routed token per layer, numbered by its row inside the forward pass
//! (vLLM's `token_idx`, a raw logger's `token_pos`). The rows of one layer are cut into passes
//! where that number does not increase (it restarts at 0 each pass), or where the row's pass
//! kind changes. Pass `i` of every logged layer is then step `i` of the trace: every layer must
//! show the same number of passes, and pass `i` the same number of rows in every layer (the same
//! tokens went through every layer).
//!
//! **Dummy passes.** vLLM's profiling run (8,192 identical rows) and its warm-up (256 identical
//! rows) route copies of one dummy token: every row of the pass picks the same experts, and the
//! counts they leave behind say nothing about real traffic (a seed map fitted on them "serves
//! 90% of the picks"). A pass is dropped when:
//! - its rows name a pass kind that [`PassKind::is_counted`] rejects (`warmup`, `profile`,
//!   `draft`); or
//! - it names no kind, holds at least [`MIN_DUMMY_ROWS`] rows and, in every logged layer, every
//!   row equals the first.
//!
//! A pass named `prefill` or `decode` is always kept. [`ReadOptions::keep_dummy_passes`]
//! (`--keep-dummy-passes`) keeps every pass.
//!
//! [`ReadOptions::keep_dummy_passes`]: super::ReadOptions::keep_dummy_passes

use super::{StepPicks, TraceError};
use expert_residency::PassKind;
use std::collections::BTreeMap;

/// Fewest rows a pass without a kind must hold to be taken for a dummy when all its rows are
/// identical. Below it, a small decode batch whose tokens happen to agree is kept.
pub const MIN_DUMMY_ROWS: usize = 16;

/// Reads a pass-kind field (`"pass": "decode"`), case-insensitive: `prefill`, `decode`,
/// `warmup` (`warm_up`, `warm-up`, `cuda_graph_capture`), `profile` (`profiling`, `dummy`),
/// `draft` (`spec_draft`). `None` for anything else.
pub fn parse_pass_kind(s: &str) -> Option<PassKind> {
    let k = s.trim().to_ascii_lowercase().replace(['-', ' '], "_");
    Some(match k.as_str() {
        "prefill" | "extend" => PassKind::Prefill,
        "decode" => PassKind::Decode,
        "warmup" | "warm_up" | "cuda_graph_capture" => PassKind::Warmup,
        "profile" | "profiling" | "dummy" => PassKind::Profile,
        "draft" | "spec_draft" => PassKind::Draft,
        _ => return None,
    })
}

/// The rows one layer routed in one pass.
#[derive(Debug)]
struct LayerPass {
    kind: Option<PassKind>,
    rows: Vec<Vec<u32>>,
    /// `FILE:LINE` of the pass's first row.
    at: String,
}

/// One layer's rows, cut into passes as they are pushed.
#[derive(Debug, Default)]
pub(crate) struct LayerLog {
    passes: Vec<LayerPass>,
    last_row: Option<u64>,
    /// The file the layer was read from.
    pub(crate) file: String,
}

impl LayerLog {
    pub(crate) fn new(file: &str) -> Self {
        Self {
            file: file.to_string(),
            ..Self::default()
        }
    }

    /// Appends row number `row` of a pass (its expert ids), read at `line` of this layer's file.
    pub(crate) fn push(&mut self, row: u64, kind: Option<PassKind>, ids: Vec<u32>, line: u64) {
        let restart = match (self.passes.last(), self.last_row) {
            (Some(p), Some(last)) => row <= last || p.kind != kind,
            _ => true,
        };
        if restart {
            self.passes.push(LayerPass {
                kind,
                rows: Vec::new(),
                at: format!("{}:{line}", self.file),
            });
        }
        self.last_row = Some(row);
        if let Some(p) = self.passes.last_mut() {
            p.rows.push(ids);
        }
    }
}

/// What the pass filter did (for messages and `inspect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PassCounts {
    /// Passes found in the log.
    pub passes: u64,
    /// Passes dropped because every row was identical (dummy profiling or warm-up).
    pub dropped_identical: u64,
    /// Passes dropped because their kind is not counted (warm-up, profile, draft).
    pub dropped_kind: u64,
}

/// Merges per-layer logs (layer index → log) into steps of `layers` layers, pass by pass, and
/// drops dummy passes unless `keep_dummy`. `name` names the trace in errors.
///
/// # Errors
/// [`TraceError::ShapeMismatch`] when the layers show different numbers of passes, or one pass
/// different numbers of rows in two layers (naming both files and the pass's first line);
/// [`TraceError::Empty`] when no pass is left.
pub(crate) fn assemble(
    logs: &mut BTreeMap<u32, LayerLog>,
    layers: u32,
    keep_dummy: bool,
    name: &str,
) -> Result<(Vec<StepPicks>, PassCounts), TraceError> {
    let Some((&first_layer, first)) = logs.iter().next() else {
        return Err(TraceError::Empty(format!("{name}: no routing record")));
    };
    let n = first.passes.len();
    let first_file = first.file.clone();
    for (&l, log) in logs.iter() {
        if log.passes.len() != n {
            return Err(TraceError::ShapeMismatch(format!(
                "{name}: layer {first_layer} ({first_file}) shows {n} forward passes, layer {l} ({}) \
                 shows {}; per-layer logs must cover the same passes (was one cut short? trim the \
                 others to the same passes)",
                log.file,
                log.passes.len()
            )));
        }
    }
    let mut counts = PassCounts {
        passes: n as u64,
        ..PassCounts::default()
    };
    let mut steps = Vec::new();
    let mut taken: Vec<_> = logs
        .iter_mut()
        .map(|(&l, log)| (l, std::mem::take(&mut log.passes).into_iter()))
        .collect();
    for i in 0..n {
        let parts: Vec<(u32, LayerPass)> = taken
            .iter_mut()
            .filter_map(|(l, it)| it.next().map(|p| (*l, p)))
            .collect();
        let (l0, p0) = &parts[0];
        for (l, p) in &parts[1..] {
            if p.rows.len() != p0.rows.len() {
                return Err(TraceError::ShapeMismatch(format!(
                    "{name}: forward pass {i} routes {} tokens in layer {l0} (from {}) but {} in \
                     layer {l} (from {}); every layer of a pass routes the same tokens",
                    p0.rows.len(),
                    p0.at,
                    p.rows.len(),
                    p.at
                )));
            }
        }
        let kind = parts.iter().find_map(|(_, p)| p.kind);
        let identical = kind.is_none()
            && p0.rows.len() >= MIN_DUMMY_ROWS
            && parts
                .iter()
                .all(|(_, p)| p.rows.iter().all(|r| *r == p.rows[0]));
        if !keep_dummy {
            if kind.is_some_and(|k| !k.is_counted()) {
                counts.dropped_kind += 1;
                continue;
            }
            if identical {
                counts.dropped_identical += 1;
                continue;
            }
        }
        let mut step = StepPicks {
            layers: vec![Vec::new(); layers as usize],
        };
        for (l, p) in parts {
            step.layers[l as usize] = p.rows.concat();
        }
        steps.push(step);
    }
    if steps.is_empty() {
        return Err(TraceError::Empty(format!(
            "{name}: all {n} forward passes are dummy or warm-up passes ({} with identical rows, \
             {} of a non-counted kind); pass --keep-dummy-passes to keep them",
            counts.dropped_identical, counts.dropped_kind
        )));
    }
    Ok((steps, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_loosely() {
        assert_eq!(parse_pass_kind("Decode"), Some(PassKind::Decode));
        assert_eq!(parse_pass_kind("warm-up"), Some(PassKind::Warmup));
        assert_eq!(parse_pass_kind("dummy"), Some(PassKind::Profile));
        assert_eq!(parse_pass_kind("verify"), None);
    }

    fn log(rows: &[(u64, Option<PassKind>, Vec<u32>)]) -> LayerLog {
        let mut l = LayerLog::new("f");
        for (i, (r, k, ids)) in rows.iter().enumerate() {
            l.push(*r, *k, ids.clone(), i as u64 + 1);
        }
        l
    }

    #[test]
    fn restarts_and_kind_changes_cut_passes() {
        let d = Some(PassKind::Decode);
        let l = log(&[
            (0, None, vec![1]),
            (1, None, vec![2]),
            (0, None, vec![3]),
            (1, d, vec![4]),
            (3, d, vec![5]),
        ]);
        let sizes: Vec<usize> = l.passes.iter().map(|p| p.rows.len()).collect();
        assert_eq!(sizes, vec![2, 1, 2]);
    }

    #[test]
    fn identical_passes_drop_unless_kept_or_named() {
        let mut rows: Vec<_> = (0..MIN_DUMMY_ROWS as u64)
            .map(|r| (r, None, vec![1, 2]))
            .collect();
        rows.extend((0..MIN_DUMMY_ROWS as u64).map(|r| (r, Some(PassKind::Prefill), vec![1, 2])));
        rows.push((0, Some(PassKind::Warmup), vec![3, 4]));
        rows.push((0, None, vec![5, 6]));
        let mut logs = BTreeMap::from([(1, log(&rows))]);
        let (steps, c) = assemble(&mut logs, 2, false, "t").unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[1].layers, vec![vec![], vec![5, 6]]);
        assert_eq!(
            c,
            PassCounts {
                passes: 4,
                dropped_identical: 1,
                dropped_kind: 1
            }
        );
        let mut logs = BTreeMap::from([(1, log(&rows))]);
        assert_eq!(assemble(&mut logs, 2, true, "t").unwrap().0.len(), 4);
    }

    #[test]
    fn layers_must_agree_on_passes_and_rows() {
        let a = log(&[(0, None, vec![1]), (0, None, vec![2])]);
        let b = log(&[(0, None, vec![1])]);
        let mut logs = BTreeMap::from([(0, a), (1, b)]);
        let e = assemble(&mut logs, 2, false, "t").unwrap_err();
        assert!(matches!(e, TraceError::ShapeMismatch(_)), "{e}");
        let a = log(&[(0, None, vec![1]), (1, None, vec![2])]);
        let b = log(&[(0, None, vec![1])]);
        let mut logs = BTreeMap::from([(0, a), (1, b)]);
        let e = assemble(&mut logs, 2, false, "t").unwrap_err().to_string();
        assert!(e.contains("routes 2 tokens in layer 0"), "{e}");
    }
}
