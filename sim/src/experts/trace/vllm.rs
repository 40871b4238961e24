//! Reader for engine routing logs that number each row inside its forward pass: the vLLM MoE
//! routing-logger JSONL and the raw `token_pos` layout ([`super::TraceFormat::RoutesJsonl`]).
//!
//! **vLLM routing logger** (one file per logged layer, `moe_layer{L}.jsonl`):
//! - line 1, a meta record: `{"type": "meta", ...}`. Read keys (all optional): `num_experts`
//!   or `experts_per_layer` (experts per layer), `top_k` or `num_experts_per_tok`, `layers` or
//!   `num_moe_layers`, `model` or `name` (the trace's name). Other keys are ignored.
//! - one route record per routed token: `{"type": "route", "req_id": "r1", "token_idx": i,
//!   "layer": L, "topk_ids": [e1, ..., ek], "topk_weights": [w1, ..., wk]}`. `token_idx`
//!   (non-negative integer) is the row inside one forward pass and restarts at 0 at each pass;
//!   `topk_ids` are expert ids (integers, `-1` = router padding, skipped); `req_id` and
//!   `topk_weights` are ignored.
//! - any other `type` (stats, markers, ...) is skipped.
//!
//! **Raw `token_pos` layout** (one file, every layer): records without `type`,
//! `{"token_pos": p, "layer": L, "topk_ids": [...]}`, where `p` is the row inside the pass. The
//! prefill is written layer-major (layer 0's rows 0..n, then layer 1's, ...) and every decode
//! step then logs its token at position 0 in every layer.
//!
//! Either record may carry a pass kind, `"pass": "prefill" | "decode" | "warmup" | "profile" |
//! "draft"` (see [`passes::parse_pass_kind`]), mapped onto [`expert_residency::PassKind`].
//!
//! Passes and layers: see [`passes`]. Each layer's rows are cut into passes where the row number
//! does not increase (or the kind changes); pass `i` of every layer is step `i`. Rows within a
//! pass must be logged in increasing row order (both loggers do). Dummy profiling and warm-up
//! passes are dropped unless [`ReadOptions::keep_dummy_passes`].
//!
//! Shape: from [`ReadOptions`], else the meta record, else inferred: layers = largest logged
//! layer + 1 (a layer that was not logged is present with no picks: a directory holding only
//! `moe_layer3.jsonl` gives 4 layers, layers 0–2 empty), experts = largest id + 1, top-k =
//! widest row. A record without a `layer` takes the layer from its file name
//! (`…layer{L}.jsonl`).

use super::lines::PickBudget;
use super::passes::{self, LayerLog, PassCounts};
use super::{ReadOptions, Trace, TraceError, TraceShape};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

#[derive(serde::Deserialize)]
struct Record {
    #[serde(rename = "type")]
    kind: Option<String>,
    layer: Option<i64>,
    token_idx: Option<i64>,
    token_pos: Option<i64>,
    topk_ids: Option<Vec<i64>>,
    #[serde(rename = "pass")]
    pass_kind: Option<String>,
    num_experts: Option<u32>,
    experts_per_layer: Option<u32>,
    top_k: Option<u32>,
    num_experts_per_tok: Option<u32>,
    layers: Option<u32>,
    num_moe_layers: Option<u32>,
    model: Option<String>,
    name: Option<String>,
}

/// Geometry gathered from the options and meta records while reading.
#[derive(Default)]
struct State {
    layers: Option<u32>,
    experts: Option<u32>,
    top_k: Option<u32>,
    name: Option<String>,
    max_layer: Option<u32>,
    max_id: Option<u32>,
    max_width: u32,
    logs: BTreeMap<u32, LayerLog>,
    budget: PickBudget,
}

impl State {
    fn new(opts: &ReadOptions) -> Self {
        State {
            layers: opts.layers,
            experts: opts.experts_per_layer,
            top_k: opts.top_k,
            ..State::default()
        }
    }
}

/// The layer a per-layer log's file name names: `moe_layer3.jsonl`, `layer_03.jsonl` → 3.
pub fn layer_of_file(path: &Path) -> Option<u32> {
    if path.extension().and_then(|x| x.to_str()) != Some("jsonl") {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let at = stem.rfind("layer")?;
    let digits = stem[at + "layer".len()..].trim_start_matches(['_', '-']);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Reads one routing log (see the module docs) into a trace, with the counts of passes found
/// and dropped.
///
/// # Errors
/// As [`read_routes_files`].
pub fn read_routes(path: &Path, opts: &ReadOptions) -> Result<(Trace, PassCounts), TraceError> {
    read_routes_files(&[path.to_path_buf()], opts)
}

/// Reads per-layer routing logs (or one log of every layer) and merges them into ONE trace,
/// pass by pass (see the module docs). The name is the meta record's `model`/`name`, else the
/// directory name for several files, else the file stem.
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::Malformed`] (file and line) for a line that is not a JSON
/// object, a route without `topk_ids`, without `token_idx`/`token_pos`, or without `layer` in a
/// file whose name names none, a negative index, an id below `-1`, an unknown `pass` kind;
/// [`TraceError::LayerOutOfRange`], [`TraceError::ExpertOutOfRange`],
/// [`TraceError::TopKTooWide`], [`TraceError::DuplicateExpert`] (file and line);
/// [`TraceError::ShapeMismatch`] for a meta record contradicting the options or another file, a
/// layer logged in two files, or layers disagreeing on passes or tokens;
/// [`TraceError::TooLarge`] for a shape above the bounds or more than
/// [`super::lines::MAX_PICKS`] picks; [`TraceError::Empty`] for no route, or only dummy passes.
pub fn read_routes_files(
    paths: &[PathBuf],
    opts: &ReadOptions,
) -> Result<(Trace, PassCounts), TraceError> {
    let mut st = State::new(opts);
    for path in paths {
        let p = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|e| TraceError::io(&p, e))?;
        read_into(std::io::BufReader::new(f), &p, layer_of_file(path), &mut st)?;
    }
    let default_name = match paths {
        [one] => one.file_stem(),
        _ => paths
            .first()
            .and_then(|p| p.parent())
            .and_then(|d| d.file_name()),
    }
    .and_then(|s| s.to_str())
    .unwrap_or("routes")
    .to_string();
    finish(st, opts, default_name)
}

/// As [`read_routes`], from any buffered reader; `path` names it in errors and `name` is the
/// trace's name unless a meta record gives one.
///
/// # Errors
/// As [`read_routes_files`].
pub fn read_routes_from<R: BufRead>(
    reader: R,
    path: &str,
    opts: &ReadOptions,
    name: String,
) -> Result<(Trace, PassCounts), TraceError> {
    let mut st = State::new(opts);
    read_into(reader, path, None, &mut st)?;
    finish(st, opts, name)
}

fn meta_field(
    slot: &mut Option<u32>,
    field: &str,
    found: Option<u32>,
    loc: &str,
) -> Result<(), TraceError> {
    match (*slot, found) {
        (Some(a), Some(b)) if a != b => Err(TraceError::ShapeMismatch(format!(
            "{loc}: meta record says {field} = {b}, but {a} was given or read before"
        ))),
        (None, Some(b)) => {
            *slot = Some(b);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn read_into<R: BufRead>(
    reader: R,
    path: &str,
    file_layer: Option<u32>,
    st: &mut State,
) -> Result<(), TraceError> {
    for item in super::jsonl_lines::<Record, _>(reader, path) {
        let (lineno, r) = item?;
        let loc = || format!("{path}:{lineno}");
        let malformed = |reason: String| TraceError::malformed(path, lineno, reason);
        match r.kind.as_deref() {
            Some("meta") => {
                meta_field(
                    &mut st.experts,
                    "experts_per_layer",
                    r.num_experts.or(r.experts_per_layer),
                    &loc(),
                )?;
                meta_field(
                    &mut st.top_k,
                    "top_k",
                    r.top_k.or(r.num_experts_per_tok),
                    &loc(),
                )?;
                meta_field(
                    &mut st.layers,
                    "layers",
                    r.layers.or(r.num_moe_layers),
                    &loc(),
                )?;
                if st.name.is_none() {
                    st.name = r.model.or(r.name);
                }
                continue;
            }
            Some("route") | None => {}
            // Stats, markers and whatever else a logger writes between routes.
            Some(_) => continue,
        }
        let Some(raw) = r.topk_ids else {
            return Err(malformed(
                "a route record needs `topk_ids` (records of another `type` are skipped)".into(),
            ));
        };
        let Some(row) = r.token_idx.or(r.token_pos) else {
            return Err(malformed(
                "a route record needs `token_idx` (vLLM routing logger) or `token_pos` (raw \
                 layout): the row inside its forward pass"
                    .into(),
            ));
        };
        let Ok(row) = u64::try_from(row) else {
            return Err(malformed(format!("row index {row} is negative")));
        };
        let layer = match (r.layer, file_layer) {
            (Some(l), _) => u32::try_from(l)
                .map_err(|_| malformed(format!("layer {l} is not in 0..={}", u32::MAX)))?,
            (None, Some(l)) => l,
            (None, None) => {
                return Err(malformed(
                    "a route record needs `layer` (or a file named `moe_layer{L}.jsonl`)".into(),
                ))
            }
        };
        if let Some(layers) = st.layers {
            if layer >= layers {
                return Err(TraceError::LayerOutOfRange {
                    location: loc(),
                    layer: layer.into(),
                    layers,
                });
            }
        }
        let kind = match r.pass_kind.as_deref() {
            None => None,
            Some(s) => Some(passes::parse_pass_kind(s).ok_or_else(|| {
                malformed(format!(
                    "unknown pass kind {s:?} (expected prefill, decode, warmup, profile or draft)"
                ))
            })?),
        };
        let ids = super::check_ids(&raw, st.experts, true, path, lineno)?;
        let width = ids.len() as u32;
        if let Some(k) = st.top_k {
            if width > k {
                return Err(TraceError::TopKTooWide {
                    location: loc(),
                    found: width.into(),
                    allowed: k,
                });
            }
        }
        st.budget.charge(ids.len().max(1), path, lineno)?;
        st.max_layer = st.max_layer.max(Some(layer));
        st.max_id = st.max_id.max(ids.iter().copied().max());
        st.max_width = st.max_width.max(width);
        let log = st.logs.entry(layer).or_insert_with(|| LayerLog::new(path));
        if log.file != path {
            return Err(TraceError::ShapeMismatch(format!(
                "{}: layer {layer} is also logged in {}; give each layer's log once",
                loc(),
                log.file
            )));
        }
        log.push(row, kind, ids, lineno);
    }
    Ok(())
}

fn finish(
    mut st: State,
    opts: &ReadOptions,
    default_name: String,
) -> Result<(Trace, PassCounts), TraceError> {
    let name = st.name.take().unwrap_or(default_name);
    let Some(max_layer) = st.max_layer else {
        return Err(TraceError::Empty(format!(
            "{name}: no route record (a routing log holds `{{\"type\": \"route\", \"token_idx\", \
             \"layer\", \"topk_ids\"}}` lines)"
        )));
    };
    let past = |what: &str, m: u32| {
        m.checked_add(1).ok_or_else(|| {
            TraceError::TooLarge(format!("{name}: {what} {m} leaves no room for a count"))
        })
    };
    let shape = TraceShape {
        layers: match st.layers {
            Some(l) => l,
            None => past("layer", max_layer)?,
        },
        experts_per_layer: match (st.experts, st.max_id) {
            (Some(e), _) => e,
            (None, Some(m)) => past("expert id", m)?,
            (None, None) => 1,
        },
        top_k: st.top_k.unwrap_or(st.max_width.max(1)),
    };
    shape.validate()?;
    let (steps, counts) =
        passes::assemble(&mut st.logs, shape.layers, opts.keep_dummy_passes, &name)?;
    Ok((
        Trace {
            name,
            shape,
            steps,
            shifts: Vec::new(),
        },
        counts,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_come_from_file_names() {
        for (name, want) in [
            ("moe_layer3.jsonl", Some(3)),
            ("d/layer_07.jsonl", Some(7)),
            ("moe_layer.jsonl", None),
            ("moe_layer3.json", None),
            ("gsm8k_2_routing.jsonl", None),
            ("layer3b.jsonl", None),
        ] {
            assert_eq!(layer_of_file(Path::new(name)), want, "{name}");
        }
    }

    #[test]
    fn meta_records_fill_and_check_the_shape() {
        let text = "{\"type\":\"meta\",\"num_experts\":8,\"top_k\":2,\"model\":\"m\"}\n\
                    {\"type\":\"route\",\"req_id\":\"r\",\"token_idx\":0,\"layer\":1,\"topk_ids\":[7,1]}\n";
        let (t, _) =
            read_routes_from(text.as_bytes(), "f", &ReadOptions::default(), "x".into()).unwrap();
        assert_eq!(t.name, "m");
        assert_eq!(
            t.shape,
            TraceShape {
                layers: 2,
                experts_per_layer: 8,
                top_k: 2
            }
        );
        let opts = ReadOptions {
            experts_per_layer: Some(16),
            ..ReadOptions::default()
        };
        let e = read_routes_from(text.as_bytes(), "f", &opts, "x".into()).unwrap_err();
        assert!(matches!(e, TraceError::ShapeMismatch(_)), "{e}");
        let bad = "{\"type\":\"meta\",\"num_experts\":4}\n{\"type\":\"route\",\"token_idx\":0,\"layer\":0,\"topk_ids\":[5]}\n";
        let e =
            read_routes_from(bad.as_bytes(), "f", &ReadOptions::default(), "x".into()).unwrap_err();
        assert!(
            matches!(&e, TraceError::ExpertOutOfRange { location, .. } if location == "f:2"),
            "{e}"
        );
    }
}
