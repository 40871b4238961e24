//! Reader for the common engine-logger shape: one JSON object per routed token per layer.
//!
//! Lines (blank lines are ignored; unknown keys such as `"token"` or `"topk_weights"` too):
//!
//! - **record**: `{"layer": l, "topk_ids": [e1, ..., ek]}` (the ids under any of
//!   [`super::vllm::ID_FIELDS`], the layer under any of [`super::vllm::LAYER_FIELDS`]), optionally with `"step": n` (alias
//!   `"forward_pass": n`) naming the forward pass it belongs to. An id of `-1` is padding (a token
//!   dropped by the router) and is skipped; any other negative id is malformed.
//! - **boundary marker**: `{"forward_pass_end": true}` closes the current forward pass.
//! - **header** (optional, before any record): `{"tierkit_trace": 1, "layers": 16,
//!   "experts_per_layer": 64, "top_k": 8, "name": "..."}` (every field but `tierkit_trace`
//!   optional).
//!
//! Forward-pass boundaries, in order of precedence:
//! 1. a record whose `step`/`forward_pass` differs from the current pass's starts a new step
//!    (the values must increase; gaps are not materialised as empty steps);
//! 2. a marker line closes the current step;
//! 3. when the file has neither step fields nor markers, a new step starts whenever the layer
//!    index does not increase (one sequence decoding, logged token by token).
//!
//! Shape: from [`ReadOptions`], else the header, else inferred (layers = largest layer + 1,
//! experts = largest id + 1, top-k = widest record). With a geometry given, an id at or above the
//! experts per layer, a layer at or above the layers, or a record wider than top-k is a typed
//! error naming the file and line. Warm-up passes are dropped by [`ReadOptions::skip_steps`].

use super::{ReadOptions, StepPicks, Trace, TraceError, TraceShape};
use std::io::BufRead;
use std::path::Path;

#[derive(serde::Deserialize, Default)]
struct Line {
    layer: Option<i64>,
    layer_id: Option<i64>,
    layer_idx: Option<i64>,
    #[serde(flatten)]
    ids: super::vllm::IdFields,
    step: Option<u64>,
    forward_pass: Option<u64>,
    forward_pass_end: Option<bool>,
    tierkit_trace: Option<u32>,
    layers: Option<u32>,
    experts_per_layer: Option<u32>,
    top_k: Option<u32>,
    name: Option<String>,
}

enum Item {
    Record {
        line: u64,
        layer: u32,
        ids: Vec<u32>,
        step: Option<u64>,
    },
    End,
}

/// Reads an engine-logger JSONL file (warm-up skipping is left to [`super::read_trace`]).
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::Malformed`] (file and line) for a line that is not a JSON
/// object, a record without `layer`/`topk_ids`, a negative id other than `-1`, a step number
/// going backwards or a header after the first record; [`TraceError::LayerOutOfRange`],
/// [`TraceError::ExpertOutOfRange`], [`TraceError::TopKTooWide`] (file and line);
/// [`TraceError::DuplicateExpert`] (file and line) for a record listing one expert twice;
/// [`TraceError::ShapeMismatch`] when the header contradicts the options;
/// [`TraceError::TooLarge`] for a shape (given or inferred) above the bounds of
/// [`TraceShape::validate`]; [`TraceError::Empty`].
pub fn read_logger(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let p = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|e| TraceError::io(&p, e))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("trace")
        .to_string();
    read_logger_from(std::io::BufReader::new(f), &p, opts, stem)
}

/// As [`read_logger`], from any buffered reader; `path` names it in errors, `name` is the
/// trace's name unless the header gives one.
///
/// # Errors
/// As [`read_logger`].
pub fn read_logger_from<R: BufRead>(
    reader: R,
    path: &str,
    opts: &ReadOptions,
    name: String,
) -> Result<Trace, TraceError> {
    let mut name = name;
    let mut hint = (opts.layers, opts.experts_per_layer, opts.top_k);
    let mut items = Vec::new();
    let mut any_step_field = false;
    let mut any_marker = false;
    let (mut max_layer, mut max_id, mut max_width) = (None::<u32>, None::<u32>, 0u32);
    for item in super::jsonl_lines::<Line, _>(reader, path) {
        let (lineno, mut l) = item?;
        let malformed = |reason: String| TraceError::malformed(path, lineno, reason);
        let loc = || format!("{path}:{lineno}");
        if l.tierkit_trace.is_some() {
            if !items.is_empty() {
                return Err(malformed("header line after the first record".into()));
            }
            for (field, from_opts, from_file) in [
                ("layers", &mut hint.0, l.layers),
                ("experts_per_layer", &mut hint.1, l.experts_per_layer),
                ("top_k", &mut hint.2, l.top_k),
            ] {
                match (*from_opts, from_file) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(TraceError::ShapeMismatch(format!(
                            "{}: header says {field} = {b}, {a} was asked for",
                            loc()
                        )))
                    }
                    (None, Some(b)) => *from_opts = Some(b),
                    _ => {}
                }
            }
            if let Some(n) = l.name {
                name = n;
            }
            continue;
        }
        if l.forward_pass_end == Some(true) {
            any_marker = true;
            items.push(Item::End);
            continue;
        }
        let (Some(layer), Some(raw)) = (l.layer.or(l.layer_id).or(l.layer_idx), l.ids.take())
        else {
            return Err(malformed(format!(
                "a record needs a layer ({:?}) and expert ids ({:?}) (or use a \
                 `forward_pass_end` marker)",
                super::vllm::LAYER_FIELDS,
                super::vllm::ID_FIELDS
            )));
        };
        let Ok(layer) = u32::try_from(layer) else {
            return Err(malformed(format!(
                "layer {layer} is not in 0..={}",
                u32::MAX
            )));
        };
        if let Some(layers) = hint.0 {
            if layer >= layers {
                return Err(TraceError::LayerOutOfRange {
                    location: loc(),
                    layer: layer.into(),
                    layers,
                });
            }
        }
        let ids = super::check_ids(&raw, hint.1, true, path, lineno)?;
        let width = ids.len() as u32;
        if let Some(k) = hint.2 {
            if width > k {
                return Err(TraceError::TopKTooWide {
                    location: loc(),
                    found: width.into(),
                    allowed: k,
                });
            }
        }
        let step = l.step.or(l.forward_pass);
        any_step_field |= step.is_some();
        max_layer = max_layer.max(Some(layer));
        max_id = max_id.max(ids.iter().copied().max());
        max_width = max_width.max(width);
        items.push(Item::Record {
            line: lineno,
            layer,
            ids,
            step,
        });
    }
    let Some(max_layer) = max_layer else {
        return Err(TraceError::Empty(format!("{path}: no routing record")));
    };
    // Inferred sizes are one past the largest index; u32::MAX itself has no successor.
    let past = |what: &str, m: u32| {
        m.checked_add(1).ok_or_else(|| {
            TraceError::TooLarge(format!("{path}: {what} {m} leaves no room for a count"))
        })
    };
    let shape = TraceShape {
        layers: match hint.0 {
            Some(l) => l,
            None => past("layer", max_layer)?,
        },
        experts_per_layer: match (hint.1, max_id) {
            (Some(e), _) => e,
            (None, Some(m)) => past("expert id", m)?,
            (None, None) => 1,
        },
        top_k: hint.2.unwrap_or(max_width.max(1)),
    };
    shape.validate()?;
    let infer_by_layer = !any_step_field && !any_marker;
    let nl = shape.layers as usize;
    let mut steps = Vec::new();
    let mut cur: Option<StepPicks> = None;
    let mut cur_step: Option<u64> = None;
    let mut last_layer: Option<u32> = None;
    for item in items {
        match item {
            Item::End => {
                steps.extend(cur.take());
                cur_step = None;
                last_layer = None;
            }
            Item::Record {
                line,
                layer,
                ids,
                step,
            } => {
                let new_step = match (step, cur_step) {
                    (Some(s), Some(c)) if s < c => {
                        return Err(TraceError::Malformed {
                            path: path.to_string(),
                            line,
                            reason: format!("step {s} after step {c}: steps must not go back"),
                        })
                    }
                    (Some(s), Some(c)) => s != c,
                    _ => infer_by_layer && last_layer.is_some_and(|p| layer <= p),
                };
                if new_step {
                    steps.extend(cur.take());
                }
                if step.is_some() {
                    cur_step = step;
                }
                last_layer = Some(layer);
                cur.get_or_insert_with(|| StepPicks {
                    layers: vec![Vec::new(); nl],
                })
                .layers[layer as usize]
                    .extend(ids);
            }
        }
    }
    steps.extend(cur.take());
    Ok(Trace {
        name,
        shape,
        steps,
        shifts: Vec::new(),
    })
}

/// Writes a trace in the engine-logger shape: a header line, then one
/// `{"step": s, "layer": l, "topk_ids": [...]}` line per routed token per layer (each layer's
/// picks split into tokens of `top_k` ids). [`read_logger`] reads it back to the same trace.
///
/// # Errors
/// [`TraceError::Io`] (path shown as `"<writer>"`).
pub fn write_logger<W: std::io::Write>(trace: &Trace, mut out: W) -> Result<W, TraceError> {
    let io = |e| TraceError::io("<writer>", e);
    let header = serde_json::json!({
        "tierkit_trace": 1,
        "layers": trace.shape.layers,
        "experts_per_layer": trace.shape.experts_per_layer,
        "top_k": trace.shape.top_k,
        "name": trace.name,
    });
    writeln!(out, "{header}").map_err(io)?;
    let k = trace.shape.top_k.max(1) as usize;
    for (s, step) in trace.steps.iter().enumerate() {
        for (l, ids) in step.layers.iter().enumerate() {
            for tok in ids.chunks(k) {
                let list: Vec<String> = tok.iter().map(u32::to_string).collect();
                writeln!(
                    out,
                    "{{\"step\": {s}, \"layer\": {l}, \"topk_ids\": [{}]}}",
                    list.join(", ")
                )
                .map_err(io)?;
            }
        }
    }
    out.flush().map_err(io)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::{read_trace, test_util, TraceFormat};

    fn read(s: &str, opts: &ReadOptions) -> Result<Trace, TraceError> {
        read_logger_from(s.as_bytes(), "log.jsonl", opts, "log".into())
    }

    #[test]
    fn step_field_boundaries_and_header() {
        let text = r#"{"tierkit_trace": 1, "layers": 2, "experts_per_layer": 16, "top_k": 2, "name": "eng"}
{"step": 0, "layer": 0, "topk_ids": [1, 2]}
{"step": 0, "layer": 0, "topk_ids": [3, -1]}
{"step": 0, "layer": 1, "topk_ids": [4, 5]}
{"step": 3, "layer": 0, "topk_ids": [15, 0], "topk_weights": [0.5, 0.5]}
"#;
        let t = read(text, &ReadOptions::default()).unwrap();
        assert_eq!(t.name, "eng");
        assert_eq!(t.shape.experts_per_layer, 16);
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.steps[0].layers, vec![vec![1, 2, 3], vec![4, 5]]);
        assert_eq!(t.steps[1].layers, vec![vec![15, 0], vec![]]);
    }

    #[test]
    fn writer_round_trips_through_the_reader() {
        let mut cfg = crate::experts::trace::synth::SynthConfig::default_scenario();
        cfg.steps = 6;
        cfg.tokens_per_step = 3;
        cfg.phases.truncate(1);
        let t = crate::experts::trace::synth::generate(&cfg).unwrap();
        let bytes = write_logger(&t, Vec::new()).unwrap();
        let back = read(
            std::str::from_utf8(&bytes).unwrap(),
            &ReadOptions::default(),
        )
        .unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn marker_boundaries_and_inferred_shape() {
        let text = "{\"layer\": 0, \"topk_ids\": [1, 2]}\n{\"layer\": 0, \"topk_ids\": [3, 2]}\n{\"forward_pass_end\": true}\n{\"layer\": 1, \"topk_ids\": [0, 6]}\n{\"forward_pass_end\": true}\n";
        let t = read(text, &ReadOptions::default()).unwrap();
        assert_eq!(
            t.shape,
            TraceShape {
                layers: 2,
                experts_per_layer: 7,
                top_k: 2
            }
        );
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.steps[0].layers[0], vec![1, 2, 3, 2]);
    }

    #[test]
    fn layer_order_boundaries_without_fields_and_skip() {
        let mut text = String::new();
        for tok in 0..4 {
            for layer in 0..3 {
                text.push_str(&format!(
                    "{{\"layer\": {layer}, \"topk_ids\": [{tok}, 7]}}\n"
                ));
            }
        }
        let p = test_util::temp_path("infer.jsonl");
        std::fs::write(&p, &text).unwrap();
        assert_eq!(
            crate::experts::trace::detect_format(&p).unwrap(),
            TraceFormat::LoggerJsonl
        );
        let opts = ReadOptions {
            skip_steps: 1,
            experts_per_layer: Some(8),
            ..Default::default()
        };
        let t = read_trace(&p, &opts).unwrap();
        assert_eq!(t.steps.len(), 3);
        assert_eq!(t.steps[0].layers, vec![vec![1, 7]; 3]);
        let all = ReadOptions {
            skip_steps: 4,
            ..Default::default()
        };
        assert!(matches!(read_trace(&p, &all), Err(TraceError::Empty(_))));
    }

    #[test]
    fn bad_lines_are_typed_errors_with_file_and_line() {
        let opts = ReadOptions {
            layers: Some(2),
            experts_per_layer: Some(8),
            top_k: Some(2),
            ..Default::default()
        };
        let ok = "{\"layer\": 0, \"topk_ids\": [1, 2]}\n";
        type Check = fn(&TraceError) -> bool;
        let cases: Vec<(String, Check)> = vec![
            (format!("{ok}not json\n"), |e| {
                matches!(e, TraceError::Malformed { line: 2, .. })
            }),
            (format!("{ok}{{\"layer\": 0}}\n"), |e| {
                matches!(e, TraceError::Malformed { line: 2, .. })
            }),
            (format!("{ok}{{\"layer\": 0, \"topk_ids\": [8, 1]}}\n"), |e| {
                matches!(e, TraceError::ExpertOutOfRange { expert: 8, location, .. } if location == "log.jsonl:2")
            }),
            (format!("{ok}{{\"layer\": 0, \"topk_ids\": [1, 2, 3]}}\n"), |e| {
                matches!(e, TraceError::TopKTooWide { found: 3, allowed: 2, .. })
            }),
            (format!("{ok}{{\"layer\": 5, \"topk_ids\": [1]}}\n"), |e| {
                matches!(e, TraceError::LayerOutOfRange { layer: 5, .. })
            }),
            (format!("{ok}{{\"layer\": 0, \"topk_ids\": [-3]}}\n"), |e| {
                matches!(e, TraceError::Malformed { line: 2, .. })
            }),
            (
                "{\"step\": 2, \"layer\": 0, \"topk_ids\": [1]}\n{\"step\": 1, \"layer\": 0, \"topk_ids\": [1]}\n".into(),
                |e| matches!(e, TraceError::Malformed { line: 2, .. }),
            ),
            (format!("{ok}{{\"tierkit_trace\": 1}}\n"), |e| {
                matches!(e, TraceError::Malformed { line: 2, .. })
            }),
            ("{\"tierkit_trace\": 1, \"layers\": 4}\n".into(), |e| {
                matches!(e, TraceError::ShapeMismatch(_))
            }),
            ("\n\n".into(), |e| matches!(e, TraceError::Empty(_))),
        ];
        for (text, check) in cases {
            let e = read(&text, &opts).unwrap_err();
            assert!(check(&e), "input {text:?} gave {e:?}");
        }
        let e = read(&format!("{ok}nope\n"), &opts).unwrap_err().to_string();
        assert!(e.starts_with("log.jsonl:2: malformed"), "{e}");
        let e = read(
            &format!("{ok}{{\"layer\": 0, \"topk_ids\": [3, 3]}}\n"),
            &opts,
        )
        .unwrap_err();
        assert!(
            matches!(&e, TraceError::DuplicateExpert { expert: 3, location } if location == "log.jsonl:2"),
            "{e}"
        );
    }

    #[test]
    fn huge_or_wrapping_indices_are_typed_errors() {
        let none = ReadOptions::default();
        // 2^32 used to be read as layer 0.
        let e = read("{\"layer\": 4294967296, \"topk_ids\": [1, 2]}\n", &none).unwrap_err();
        assert!(matches!(e, TraceError::Malformed { line: 1, .. }), "{e}");
        // Layer or id u32::MAX: the inferred count would wrap.
        for text in [
            "{\"layer\": 4294967295, \"topk_ids\": [1]}\n",
            "{\"layer\": 0, \"topk_ids\": [4294967295]}\n",
        ] {
            let e = read(text, &none).unwrap_err();
            assert!(matches!(e, TraceError::TooLarge(_)), "{text}: {e}");
        }
        // A huge inferred shape is refused before any per-layer table is built.
        for text in [
            "{\"layer\": 1000000000, \"topk_ids\": [1]}\n",
            "{\"layer\": 0, \"topk_ids\": [4000000000]}\n",
        ] {
            let e = read(text, &none).unwrap_err();
            assert!(matches!(e, TraceError::TooLarge(_)), "{text}: {e}");
        }
        // Padding may repeat.
        let t = read("{\"layer\": 0, \"topk_ids\": [1, -1, -1]}\n", &none).unwrap();
        assert_eq!(t.steps[0].layers[0], vec![1]);
    }
}
