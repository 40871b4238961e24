//! Descriptive statistics of a trace (measurement only, no policy): step-to-step reuse and
//! per-expert pick shares. Used to calibrate and check the synthetic generator against real
//! traces and by `tierkit experts inspect`.

use super::{Trace, TraceError};

/// Previous-step reuse probability per layer: over every routed token `i` of a step and every
/// expert it picked, the fraction also picked by token `i` of the previous step in the same layer
/// (the Mixtral decode traces measure 0.34–0.40; 0.25 at random for top-2 of 8).
///
/// Tokens are matched by position in the flattened `[tokens × top_k]` layer, so a pair of steps
/// counts only when both hold the same number of picks, a multiple of top-k. Steps that start a
/// shift are not compared with their predecessor. A layer with no comparable pair reports `NaN`;
/// layers a step lists beyond the shape's are ignored.
///
/// # Errors
/// The errors of [`super::TraceShape::validate`] (zero top-k, a shape above the size bounds).
pub fn reuse_per_layer(trace: &Trace) -> Result<Vec<f64>, TraceError> {
    trace.shape.validate()?;
    let k = trace.shape.top_k as usize;
    let nl = trace.shape.layers as usize;
    let mut hits = vec![0u64; nl];
    let mut total = vec![0u64; nl];
    // Sorted copy: `Trace::validate` wants increasing shifts, but an unvalidated trace may not
    // have them; a binary search per step keeps this O(steps × log shifts).
    let mut shifts = trace.shifts.clone();
    shifts.sort_unstable();
    for (s, pair) in trace.steps.windows(2).enumerate() {
        if shifts.binary_search(&(s as u64 + 1)).is_ok() {
            continue;
        }
        for l in 0..nl.min(pair[0].layers.len()).min(pair[1].layers.len()) {
            let (prev, cur) = (&pair[0].layers[l], &pair[1].layers[l]);
            if prev.len() != cur.len() || cur.is_empty() || cur.len() % k != 0 {
                continue;
            }
            for (p, c) in prev.chunks_exact(k).zip(cur.chunks_exact(k)) {
                hits[l] += c.iter().filter(|e| p.contains(e)).count() as u64;
                total[l] += k as u64;
            }
        }
    }
    Ok(hits
        .iter()
        .zip(&total)
        .map(|(&h, &t)| {
            if t == 0 {
                f64::NAN
            } else {
                h as f64 / t as f64
            }
        })
        .collect())
}

/// Pick share of every expert per layer over the steps `range` (`[layers][experts]`, each row
/// summing to 1, or all zero for a layer without picks). A range past the end is cut to the
/// trace.
///
/// # Errors
/// The errors of [`super::TraceShape::validate`]; [`TraceError::LayerCountMismatch`] for a step
/// listing more layers than the shape; [`TraceError::ExpertOutOfRange`] for an id not below the
/// experts per layer. Nothing is returned in part.
pub fn pick_shares(
    trace: &Trace,
    range: std::ops::Range<usize>,
) -> Result<Vec<Vec<f64>>, TraceError> {
    trace.shape.validate()?;
    let experts = trace.shape.experts_per_layer;
    let e = experts as usize;
    let mut counts = vec![vec![0u64; e]; trace.shape.layers as usize];
    let end = range.end.min(trace.steps.len());
    let start = range.start.min(end);
    for (s, step) in trace.steps[start..end].iter().enumerate() {
        if step.layers.len() > counts.len() {
            return Err(TraceError::LayerCountMismatch {
                location: format!("{}: step {}", trace.name, start + s),
                found: step.layers.len() as u64,
                layers: trace.shape.layers,
            });
        }
        for (l, ids) in step.layers.iter().enumerate() {
            for &id in ids {
                let c =
                    counts[l]
                        .get_mut(id as usize)
                        .ok_or_else(|| TraceError::ExpertOutOfRange {
                            location: format!("{}: step {} layer {l}", trace.name, start + s),
                            expert: id.into(),
                            experts,
                        })?;
                *c += 1;
            }
        }
    }
    Ok(counts
        .into_iter()
        .map(|c| {
            let t: u64 = c.iter().sum();
            c.iter()
                .map(|&v| if t == 0 { 0.0 } else { v as f64 / t as f64 })
                .collect()
        })
        .collect())
}

/// Share of picks taken by the `n` most picked experts of a share vector (e.g. the top-25% share
/// the OLMoE figures quote).
pub fn top_n_share(shares: &[f64], n: usize) -> f64 {
    let mut s = shares.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s.iter().take(n).sum()
}

/// Total-variation distance between two share vectors (`½ Σ |a − b|`).
pub fn total_variation(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::{StepPicks, TraceShape};

    #[test]
    fn reuse_counts_positional_overlap() {
        let t = Trace {
            name: "r".into(),
            shape: TraceShape {
                layers: 1,
                experts_per_layer: 8,
                top_k: 2,
            },
            steps: vec![
                StepPicks {
                    layers: vec![vec![0, 1, 2, 3]],
                },
                StepPicks {
                    layers: vec![vec![1, 5, 6, 7]],
                },
                StepPicks {
                    layers: vec![vec![1, 5, 6, 7]],
                },
            ],
            shifts: vec![2],
        };
        // Only the pair (0,1) counts: token 0 keeps 1 of 2, token 1 keeps 0 of 2.
        assert_eq!(reuse_per_layer(&t).unwrap(), vec![0.25]);
        let s = pick_shares(&t, 0..1).unwrap();
        assert_eq!(s[0][..4], [0.25; 4]);
        assert_eq!(top_n_share(&s[0], 2), 0.5);
        assert_eq!(total_variation(&[1.0, 0.0], &[0.0, 1.0]), 1.0);
    }

    #[test]
    fn malformed_traces_are_errors_not_panics() {
        let ok = Trace {
            name: "m".into(),
            shape: TraceShape {
                layers: 1,
                experts_per_layer: 4,
                top_k: 2,
            },
            steps: vec![StepPicks {
                layers: vec![vec![0, 1]],
            }],
            shifts: vec![],
        };
        let mut zero_k = ok.clone();
        zero_k.shape.top_k = 0;
        assert!(matches!(
            reuse_per_layer(&zero_k),
            Err(TraceError::TopKTooWide { .. })
        ));
        let mut bad_id = ok.clone();
        bad_id.steps[0].layers[0][1] = 9;
        assert!(matches!(
            pick_shares(&bad_id, 0..1),
            Err(TraceError::ExpertOutOfRange { expert: 9, .. })
        ));
        let mut extra = ok.clone();
        extra.steps[0].layers.push(vec![1]);
        assert!(matches!(
            pick_shares(&extra, 0..1),
            Err(TraceError::LayerCountMismatch { found: 2, .. })
        ));
        // Unsorted shifts do not break the skip (an unvalidated trace).
        let mut t = ok.clone();
        t.steps = vec![t.steps[0].clone(); 4];
        t.shifts = vec![3, 1];
        assert_eq!(reuse_per_layer(&t).unwrap(), vec![1.0]);
        assert_eq!(pick_shares(&ok, 5..9).unwrap(), vec![vec![0.0; 4]]);
    }
}
