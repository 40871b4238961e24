//! Reader for per-token Mixtral decode routing traces (JSONL).
//!
//! One record per (problem, decode token, layer):
//! `{"dataset": "gsm8k", "problem_id": 0, "layer": 0..31, "experts": [e1, e2],
//!   "gating_probs": [p1, p2], "token_idx": 0}` (expert ids in gate order; `gating_probs` is
//! optional and ignored). Records may come in any order (the public files are layer-major
//! within a problem).
//!
//! Steps: each decode token of each problem is one step of batch 1. Problems follow each other
//! in the order of their first record in the file; tokens within a problem are in `token_idx`
//! order. The shape defaults to Mixtral-8x7B's (32 layers, 8 experts, top-2) unless
//! [`ReadOptions`] says otherwise.
//!
//! Missing rows: the public files lack a few (token, layer) rows, all in the last tokens of a
//! problem (logging stopped mid-token). With [`MissingRows::EmptyLayer`] (default) such a token
//! stays a step and the missing layers simply see no lookup from it; with
//! [`MissingRows::DropToken`] the token is dropped. A token index with no row at all is skipped.
//! A duplicate (problem, token, layer) row is a [`TraceError::Malformed`] error.

use super::{MissingRows, ReadOptions, ReadReport, StepPicks, Trace, TraceError, TraceShape};
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;

/// Mixtral-8x7B: MoE layers.
pub const MIXTRAL_LAYERS: u32 = 32;
/// Mixtral-8x7B: experts per layer.
pub const MIXTRAL_EXPERTS: u32 = 8;
/// Mixtral-8x7B: top-k.
pub const MIXTRAL_TOP_K: u32 = 2;

#[derive(serde::Deserialize)]
struct Record {
    #[serde(default)]
    dataset: String,
    problem_id: i64,
    layer: i64,
    /// The ids, under any of [`super::vllm::ID_FIELDS`] (the public files: `experts`).
    #[serde(flatten)]
    ids: super::vllm::IdFields,
    token_idx: i64,
}

type Problem = BTreeMap<u64, Vec<Option<Vec<u32>>>>;

/// Reads a Mixtral decode JSONL file into a trace (warm-up skipping is left to
/// [`super::read_trace`]).
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::Malformed`] with file and line for a line that is not a
/// record, a negative field or a duplicate row; [`TraceError::LayerOutOfRange`],
/// [`TraceError::ExpertOutOfRange`], [`TraceError::TopKTooWide`],
/// [`TraceError::DuplicateExpert`] with file and line; [`TraceError::TooLarge`] for a shape
/// (from the options) above the bounds of [`TraceShape::validate`]; [`TraceError::Empty`] for a
/// file without records.
pub fn read_mixtral(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    read_mixtral_report(path, opts).map(|(t, _)| t)
}

/// As [`read_mixtral`], with the [`ReadReport`]: rows read, (token, layer) rows missing from
/// the tokens kept, and a note on the tokens dropped ([`MissingRows::DropToken`]).
///
/// # Errors
/// As [`read_mixtral`].
pub fn read_mixtral_report(
    path: &Path,
    opts: &ReadOptions,
) -> Result<(Trace, ReadReport), TraceError> {
    let p = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|e| TraceError::io(&p, e))?;
    read_mixtral_from_report(std::io::BufReader::new(f), &p, opts, file_stem(path))
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("trace")
        .to_string()
}

/// As [`read_mixtral`], from any buffered reader; `path` names it in errors.
///
/// # Errors
/// As [`read_mixtral`].
pub fn read_mixtral_from<R: BufRead>(
    reader: R,
    path: &str,
    opts: &ReadOptions,
    name: String,
) -> Result<Trace, TraceError> {
    read_mixtral_from_report(reader, path, opts, name).map(|(t, _)| t)
}

/// As [`read_mixtral_report`], from any buffered reader.
///
/// # Errors
/// As [`read_mixtral`].
pub fn read_mixtral_from_report<R: BufRead>(
    reader: R,
    path: &str,
    opts: &ReadOptions,
    name: String,
) -> Result<(Trace, ReadReport), TraceError> {
    let shape = TraceShape {
        layers: opts.layers.unwrap_or(MIXTRAL_LAYERS),
        experts_per_layer: opts.experts_per_layer.unwrap_or(MIXTRAL_EXPERTS),
        top_k: opts.top_k.unwrap_or(MIXTRAL_TOP_K),
    };
    shape.validate()?;
    let nl = shape.layers as usize;
    // Problems in order of first appearance, and a key → position index (one lookup per record).
    let mut order: Vec<(String, i64)> = Vec::new();
    let mut index: HashMap<(String, i64), usize> = HashMap::new();
    let mut problems: Vec<Problem> = Vec::new();
    let mut report = ReadReport::of(super::TraceFormat::MixtralJsonl);
    for item in super::jsonl_lines::<Record, _>(reader, path) {
        let (lineno, mut r) = item?;
        let malformed = |reason: String| TraceError::malformed(path, lineno, reason);
        let Some(experts) = r.ids.take() else {
            return Err(malformed(format!(
                "a record needs its expert ids under one of {:?}",
                super::vllm::ID_FIELDS
            )));
        };
        report.rows.rows += 1;
        let loc = || format!("{path}:{lineno}");
        if r.layer < 0 || r.token_idx < 0 || r.problem_id < 0 {
            return Err(malformed("negative layer, token_idx or problem_id".into()));
        }
        if r.layer >= shape.layers as i64 {
            return Err(TraceError::LayerOutOfRange {
                location: loc(),
                layer: r.layer as u64,
                layers: shape.layers,
            });
        }
        if experts.len() > shape.top_k as usize {
            return Err(TraceError::TopKTooWide {
                location: loc(),
                found: experts.len() as u64,
                allowed: shape.top_k,
            });
        }
        let ids = super::check_ids(&experts, Some(shape.experts_per_layer), false, path, lineno)?;
        let key = (r.dataset, r.problem_id);
        let pi = match index.get(&key) {
            Some(&pi) => pi,
            None => {
                index.insert(key.clone(), order.len());
                order.push(key);
                problems.push(BTreeMap::new());
                order.len() - 1
            }
        };
        let row = problems[pi]
            .entry(r.token_idx as u64)
            .or_insert_with(|| vec![None; nl]);
        let slot = &mut row[r.layer as usize];
        if slot.is_some() {
            return Err(malformed(format!(
                "duplicate row for problem {} token {} layer {}",
                order[pi].1, r.token_idx, r.layer
            )));
        }
        *slot = Some(ids);
    }
    let mut steps = Vec::new();
    let mut dropped = 0u64;
    for problem in problems {
        for (_, row) in problem {
            let missing = row.iter().filter(|r| r.is_none()).count() as u64;
            if missing > 0 && opts.missing_rows == MissingRows::DropToken {
                dropped += 1;
                continue;
            }
            report.rows.missing_rows += missing;
            report.rows.passes_with_missing_rows += u64::from(missing > 0);
            steps.push(StepPicks {
                layers: row.into_iter().map(Option::unwrap_or_default).collect(),
            });
        }
    }
    if steps.is_empty() {
        return Err(TraceError::Empty(format!("{path}: no routing record")));
    }
    if dropped > 0 {
        report.notes.push(format!(
            "{dropped} tokens lacking a row in some layer dropped (--missing-rows drop-token)"
        ));
    }
    Ok((
        Trace {
            name,
            shape,
            steps,
            shifts: Vec::new(),
        },
        report,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::{read_trace, read_traces, stats, test_util, TraceFormat};

    fn rec(problem: i64, token: i64, layer: i64, experts: [i64; 2]) -> String {
        format!(
            r#"{{"dataset": "d", "problem_id": {problem}, "layer": {layer}, "experts": [{}, {}], "gating_probs": [0.6, 0.4], "token_idx": {token}}}"#,
            experts[0], experts[1]
        )
    }

    fn opts2() -> ReadOptions {
        ReadOptions {
            layers: Some(2),
            ..Default::default()
        }
    }

    fn read_str(s: &str, opts: &ReadOptions) -> Result<Trace, TraceError> {
        read_mixtral_from(s.as_bytes(), "m.jsonl", opts, "m".into())
    }

    #[test]
    fn good_lines_layer_major_with_missing_rows() {
        // Layer-major like the public files; token 1 lacks layer 1.
        let text = [
            rec(0, 0, 0, [7, 0]),
            rec(0, 1, 0, [5, 6]),
            rec(0, 0, 1, [1, 2]),
            String::new(),
            rec(1, 0, 0, [3, 4]),
            rec(1, 0, 1, [4, 3]),
        ]
        .join("\n");
        let t = read_str(&text, &opts2()).unwrap();
        assert_eq!(t.shape.experts_per_layer, 8);
        assert_eq!(t.steps.len(), 3);
        assert_eq!(t.steps[0].layers, vec![vec![7, 0], vec![1, 2]]);
        assert_eq!(t.steps[1].layers, vec![vec![5, 6], vec![]]);
        assert_eq!(t.steps[2].layers, vec![vec![3, 4], vec![4, 3]]);
        let drop = ReadOptions {
            missing_rows: MissingRows::DropToken,
            ..opts2()
        };
        assert_eq!(read_str(&text, &drop).unwrap().steps.len(), 2);
    }

    #[test]
    fn bad_lines_are_typed_errors_with_file_and_line() {
        let good = rec(0, 0, 0, [1, 2]);
        let e = read_str(&format!("{good}\n{{\"layer\": 0, oops"), &opts2()).unwrap_err();
        assert!(
            matches!(&e, TraceError::Malformed { line: 2, path, .. } if path == "m.jsonl"),
            "{e}"
        );
        assert!(e.to_string().starts_with("m.jsonl:2:"), "{e}");
        let e = read_str(&format!("{good}\n{}", rec(0, 1, 0, [1, 8])), &opts2()).unwrap_err();
        assert!(
            matches!(&e, TraceError::ExpertOutOfRange { expert: 8, location, .. } if location == "m.jsonl:2"),
            "{e}"
        );
        let e = read_str(&rec(0, 0, 2, [1, 2]), &opts2()).unwrap_err();
        assert!(matches!(e, TraceError::LayerOutOfRange { layer: 2, .. }));
        let wide = r#"{"problem_id": 0, "layer": 0, "experts": [1, 2, 3], "token_idx": 0}"#;
        let e = read_str(wide, &opts2()).unwrap_err();
        assert!(matches!(
            e,
            TraceError::TopKTooWide {
                found: 3,
                allowed: 2,
                ..
            }
        ));
        let e = read_str(&format!("{good}\n{good}"), &opts2()).unwrap_err();
        assert!(matches!(e, TraceError::Malformed { line: 2, .. }), "{e}");
        assert!(matches!(
            read_str("\n", &opts2()),
            Err(TraceError::Empty(_))
        ));
        let e = read_str(&rec(0, 0, 0, [3, 3]), &opts2()).unwrap_err();
        assert!(
            matches!(&e, TraceError::DuplicateExpert { expert: 3, location } if location == "m.jsonl:1"),
            "{e}"
        );
    }

    #[test]
    fn huge_shapes_from_options_are_refused() {
        for (layers, experts) in [(1_000_000_000, 8), (32, 4_000_000_000)] {
            let opts = ReadOptions {
                layers: Some(layers),
                experts_per_layer: Some(experts),
                ..Default::default()
            };
            let e = read_str(&rec(0, 0, 0, [1, 2]), &opts).unwrap_err();
            assert!(matches!(e, TraceError::TooLarge(_)), "{e}");
        }
    }

    #[test]
    fn many_problems_read_in_linear_time() {
        // 20k one-record problems: a linear search per record was quadratic (seconds in debug).
        let text: String = (0..20_000).map(|p| rec(p, 0, 0, [1, 2]) + "\n").collect();
        let t = read_str(&text, &opts2()).unwrap();
        assert_eq!(t.steps.len(), 20_000);
        assert_eq!(t.steps[19_999].layers[0], vec![1, 2]);
    }

    #[test]
    fn real_mixtral_traces_read_and_reuse_matches_published_range() {
        let Some(shared) = test_util::shared_dir("real Mixtral trace test") else {
            return;
        };
        let dir = shared.join("data/moe/mixtral-decode");
        let g = dir.join("gsm8k_2_routing.jsonl");
        assert_eq!(
            crate::experts::trace::detect_format(&g).unwrap(),
            TraceFormat::MixtralJsonl
        );
        let t = read_trace(&g, &ReadOptions::default()).unwrap();
        assert_eq!(t.shape.layers, 32);
        assert_eq!(t.steps.len(), 168 + 79);
        let both = read_traces(&[dir], &ReadOptions::default()).unwrap();
        assert_eq!(both.steps.len(), 168 + 79 + 83 + 255);
        assert_eq!(both.shifts, vec![247]);
        let reuse = stats::reuse_per_layer(&both).unwrap();
        let mean = reuse.iter().sum::<f64>() / reuse.len() as f64;
        assert!((0.32..=0.42).contains(&mean), "mean reuse {mean}");
    }
}
