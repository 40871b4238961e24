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
//! **Raw per-row layout** (one file, every layer): records without `type`, one per routed token
//! per layer, `{"token_pos": p, "layer": L, "experts": [...]}`. Field names vary between loggers
//! and all of these are read: the expert ids under any of [`ID_FIELDS`] (`topk_ids`, `experts`,
//! `selected_experts`, `expert_ids`, `routed_experts`), the row's position in its forward pass
//! under any of [`POSITION_FIELDS`] (`token_idx`, `token_pos`, `pos`; optional in one file), the
//! layer under any of [`LAYER_FIELDS`]. The usual layout: the prefill written layer-major
//! (layer 0's positions 0..n, then layer 1's, ...), then every decode step logging its token at
//! position 0 in every layer.
//!
//! Either record may carry a pass kind, `"pass"` or `"phase"`: `"prefill" | "decode" | "warmup" |
//! "profile" | "draft"` (see [`passes::parse_pass_kind`]), mapped onto
//! [`expert_residency::PassKind`].
//!
//! Passes: the rows of ONE file (any layers) are cut into passes by file order
//! ([`super::rows`]): a
//! pass is a run of non-decreasing layers, positions increasing within a layer. A row the log
//! lost leaves its layer without that token in that pass; lost rows are counted in the
//! [`ReadReport`], never a refusal. Several per-layer files (`moe_layer{L}.jsonl`) are merged
//! pass by pass ([`passes`]): each layer's rows are cut where the position does not increase,
//! pass `i` of every layer is step `i` (a position is then required). Dummy profiling and
//! warm-up passes are dropped unless [`ReadOptions::keep_dummy_passes`].
//!
//! Shape: from [`ReadOptions`], else the meta record, else inferred: layers = largest logged
//! layer + 1 (a layer that was not logged is present with no picks: a directory holding only
//! `moe_layer3.jsonl` gives 4 layers, layers 0–2 empty), experts = largest id + 1, top-k =
//! widest row. A record without a `layer` takes the layer from its file name
//! (`…layer{L}.jsonl`).

use super::lines::PickBudget;
use super::passes::{self, LayerLog};
use super::rows::Aligner;
use super::{ReadOptions, ReadReport, Trace, TraceError, TraceFormat, TraceShape};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// One line of a routing log. Field names vary between loggers: each accepted name is its own
/// field (a line naming two of them takes the first in the order below, never a "duplicate
/// field" error).
#[derive(serde::Deserialize)]
struct Record {
    #[serde(rename = "type")]
    kind: Option<String>,
    layer: Option<i64>,
    layer_id: Option<i64>,
    layer_idx: Option<i64>,
    token_idx: Option<i64>,
    token_pos: Option<i64>,
    pos: Option<i64>,
    #[serde(flatten)]
    ids: IdFields,
    #[serde(rename = "pass")]
    pass_kind: Option<String>,
    phase: Option<String>,
    num_experts: Option<u32>,
    experts_per_layer: Option<u32>,
    top_k: Option<u32>,
    num_experts_per_tok: Option<u32>,
    layers: Option<u32>,
    num_moe_layers: Option<u32>,
    model: Option<String>,
    name: Option<String>,
}

/// Names of the expert-id field, in the order a record's is looked for.
pub const ID_FIELDS: [&str; 5] = [
    "topk_ids",
    "experts",
    "selected_experts",
    "expert_ids",
    "routed_experts",
];

/// Names of the position field (the row inside its forward pass), in order.
pub const POSITION_FIELDS: [&str; 3] = ["token_idx", "token_pos", "pos"];

/// Names of the layer field, in order.
pub const LAYER_FIELDS: [&str; 3] = ["layer", "layer_id", "layer_idx"];

/// A per-row record's expert ids under each accepted name ([`ID_FIELDS`]), flattened into the
/// records of every per-row reader (routing logs, Mixtral, engine logger).
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct IdFields {
    topk_ids: Option<Vec<i64>>,
    experts: Option<Vec<i64>>,
    selected_experts: Option<Vec<i64>>,
    expert_ids: Option<Vec<i64>>,
    routed_experts: Option<Vec<i64>>,
}

impl IdFields {
    /// The ids under the first name present, in [`ID_FIELDS`] order.
    pub(crate) fn take(&mut self) -> Option<Vec<i64>> {
        self.topk_ids
            .take()
            .or(self.experts.take())
            .or(self.selected_experts.take())
            .or(self.expert_ids.take())
            .or(self.routed_experts.take())
    }
}

impl Record {
    fn position(&self) -> Option<i64> {
        self.token_idx.or(self.token_pos).or(self.pos)
    }
    fn layer(&self) -> Option<i64> {
        self.layer.or(self.layer_id).or(self.layer_idx)
    }
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
    /// Per-layer logs merged pass by pass (several files, one layer each).
    logs: BTreeMap<u32, LayerLog>,
    /// One file of any layers, cut into passes by file order ([`rows`]).
    aligner: Option<Aligner>,
    budget: PickBudget,
}

impl State {
    fn new(opts: &ReadOptions, file_order: bool) -> Self {
        State {
            layers: opts.layers,
            experts: opts.experts_per_layer,
            top_k: opts.top_k,
            aligner: file_order.then(Aligner::default),
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

/// Reads one routing log (see the module docs) into a trace, with what was read: passes found
/// and dropped, rows read and missing.
///
/// # Errors
/// As [`read_routes_files`].
pub fn read_routes(path: &Path, opts: &ReadOptions) -> Result<(Trace, ReadReport), TraceError> {
    read_routes_files(&[path.to_path_buf()], opts)
}

/// Reads one routing log of any layers (passes cut by file order, [`super::rows`]) or several
/// per-layer logs (merged pass by pass, [`passes`]) into ONE trace (see the module docs). The
/// name is the meta record's `model`/`name`, else the directory name for several files, else
/// the file stem.
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::Malformed`] (file and line) for a line that is not a JSON
/// object, a route without expert ids ([`ID_FIELDS`]), a route of a per-layer log without a
/// position ([`POSITION_FIELDS`]), a route without a layer ([`LAYER_FIELDS`]) in a file whose
/// name names none, a negative index, an id below `-1`, an unknown `pass` kind;
/// [`TraceError::LayerOutOfRange`], [`TraceError::ExpertOutOfRange`],
/// [`TraceError::TopKTooWide`], [`TraceError::DuplicateExpert`] (file and line);
/// [`TraceError::ShapeMismatch`] for a meta record contradicting the options or another file, a
/// layer logged in two files, or per-layer logs disagreeing on passes or tokens;
/// [`TraceError::TooLarge`] for a shape above the bounds or more than
/// [`super::lines::MAX_PICKS`] picks; [`TraceError::Empty`] for no route, or only dummy passes.
/// Rows missing from one file are counted in the report, never an error.
pub fn read_routes_files(
    paths: &[PathBuf],
    opts: &ReadOptions,
) -> Result<(Trace, ReadReport), TraceError> {
    let mut st = State::new(opts, paths.len() == 1);
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
) -> Result<(Trace, ReadReport), TraceError> {
    let mut st = State::new(opts, true);
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
        let (lineno, mut r) = item?;
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
        let Some(raw) = r.ids.take() else {
            return Err(malformed(format!(
                "a route record needs its expert ids under one of {ID_FIELDS:?} (records of \
                 another `type` are skipped)"
            )));
        };
        let row = match r.position() {
            Some(p) => {
                Some(u64::try_from(p).map_err(|_| malformed(format!("position {p} is negative")))?)
            }
            None if st.aligner.is_some() => None,
            None => {
                return Err(malformed(format!(
                    "a route record of a per-layer log needs its row inside the forward pass \
                     under one of {POSITION_FIELDS:?}"
                )))
            }
        };
        let layer = match (r.layer(), file_layer) {
            (Some(l), _) => u32::try_from(l)
                .map_err(|_| malformed(format!("layer {l} is not in 0..={}", u32::MAX)))?,
            (None, Some(l)) => l,
            (None, None) => {
                return Err(malformed(format!(
                    "a route record needs its layer under one of {LAYER_FIELDS:?} (or a file \
                     named `moe_layer{{L}}.jsonl`)"
                )))
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
        let kind = match r.pass_kind.as_deref().or(r.phase.as_deref()) {
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
        if let Some(a) = &mut st.aligner {
            a.push(layer, row, kind, ids);
            continue;
        }
        let log = st.logs.entry(layer).or_insert_with(|| LayerLog::new(path));
        if log.file != path {
            return Err(TraceError::ShapeMismatch(format!(
                "{}: layer {layer} is also logged in {}; give each layer's log once",
                loc(),
                log.file
            )));
        }
        log.push(row.unwrap_or(0), kind, ids, lineno);
    }
    Ok(())
}

fn finish(
    mut st: State,
    opts: &ReadOptions,
    default_name: String,
) -> Result<(Trace, ReadReport), TraceError> {
    let name = st.name.take().unwrap_or(default_name);
    let Some(max_layer) = st.max_layer else {
        return Err(TraceError::Empty(format!(
            "{name}: no route record (a routing log holds `{{\"type\": \"route\", \"token_idx\", \
             \"layer\", \"topk_ids\"}}` or `{{\"token_pos\", \"layer\", \"experts\"}}` lines)"
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
    let mut report = ReadReport {
        format: TraceFormat::RoutesJsonl,
        ..ReadReport::default()
    };
    let steps = match st.aligner.take() {
        Some(a) => {
            let (steps, passes, rows) = a.finish(shape.layers, opts.keep_dummy_passes, &name)?;
            report.passes = passes;
            report.rows = rows;
            steps
        }
        None => {
            let (steps, passes) =
                passes::assemble(&mut st.logs, shape.layers, opts.keep_dummy_passes, &name)?;
            report.passes = passes;
            steps
        }
    };
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
