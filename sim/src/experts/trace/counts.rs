//! Readers for engines' expert-load counts: vLLM's EPLB expert-load window and SGLang's
//! expert-distribution recorder. They hold counts, not per-token routes, so they become an
//! [`expert_residency::CounterDump`] for seed fitting (`tierkit experts fit-seed
//! --eplb-counts FILE`), never a replayable [`super::Trace`].
//!
//! Both engines keep these counts as torch tensors; SGLang `torch.save`s them to a `.pt` pickle.
//! This reader takes them as JSON (a `.pt` file is refused with the command that converts it):
//!
//! ```sh
//! python -c 'import sys, json, torch; d = torch.load(sys.argv[1], weights_only=False);
//! t = lambda v: v.tolist() if hasattr(v, "tolist") else v
//! json.dump({k: ([{a: t(b) for a, b in r.items()} for r in v] if k == "records" else t(v))
//!            for k, v in d.items()}, open(sys.argv[2], "w"))' dump.pt dump.json
//! ```
//!
//! Accepted documents (unknown keys are ignored; counts are non-negative integers, or finite
//! non-negative numbers):
//!
//! | key | shape | source |
//! | --- | --- | --- |
//! | `expert_load_window` | `[window, layers, physical]` int32 | vLLM `vllm/distributed/eplb/eplb_state.py`, `EplbState.expert_load_window` (one forward pass per window slot; dummy steps are not recorded) |
//! | `expert_load_pass` | `[layers, physical]` int32 | vLLM, `EplbState.expert_load_pass` (one pass) |
//! | `logical_count` | `[buffered passes, layers, logical]` or `[layers, logical]` | SGLang `python/sglang/srt/eplb/expert_distribution.py`, `_StatAccumulator.dump` (`stat` mode; already mapped to logical experts) |
//! | `records` | list of `{"global_physical_count": [layers, physical], ...}` | SGLang `_DetailAccumulator.dump` (`per_pass` / `per_token` modes) |
//! | a bare array | `[layers, experts]` or `[window, layers, experts]` | any |
//! | an object keyed by layer | `{"1": [747, 12, ...], "3": [...]}` (arrays of counts per expert id) or `{"1": {"0": 747, "1": 12, ...}, ...}` (objects keyed by expert id), at the top level or under any one key (`{"expert_usage_by_layer": {...}}`) | published per-layer dumps |
//!
//! Layers keyed by strings need not be contiguous (`"1"`, `"3"`, ..., `"11"`): they are sorted by
//! the number each key ends in (`"layer_3"` → 3) and renumbered `0, 1, ...` in that order; the
//! mapping is in the [`CountsReport`] (`fit-seed` prints it). Expert keys are expert ids (not
//! renumbered); a missing expert counts 0. A document with none of these says which keys it has.
//!
//! A 3-D tensor is summed over its first axis. Physical experts are folded onto logical ones
//! with `physical_to_logical_map` (vLLM) or `last_physical_to_logical_map` (SGLang), shape
//! `[layers, physical]`, when present; without a map, physical expert `p` is logical expert
//! `p mod E` (vLLM's initial arrangement: the routed experts, then the redundant copies in
//! order), where `E` is [`CountsOptions::experts_per_layer`] or, unset, the physical count.
//! The counts must be global (all EP ranks): vLLM's window is per rank, so sum or concatenate
//! the ranks' windows before saving.

use super::lines::{open_document, read_rest};
use super::tensor::Tensor;
use super::TraceError;
use expert_residency::CounterDump;
use std::path::Path;

pub use super::tensor::MAX_TENSOR_VALUES;

/// Options of [`read_counts`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountsOptions {
    /// Logical experts per layer (default: from the map, else the physical count).
    pub experts_per_layer: Option<u32>,
    /// Expected MoE layers (checked when given).
    pub layers: Option<u32>,
}

#[derive(serde::Deserialize)]
struct SgRecord {
    global_physical_count: Tensor,
}

#[derive(serde::Deserialize)]
struct Document {
    name: Option<String>,
    expert_load_window: Option<Tensor>,
    expert_load_pass: Option<Tensor>,
    logical_count: Option<Tensor>,
    records: Option<Vec<SgRecord>>,
    physical_to_logical_map: Option<Tensor>,
    last_physical_to_logical_map: Option<Tensor>,
}

/// A torch `.pt` file: a zip archive (torch ≥ 1.6) or a raw pickle (protocol 2+).
fn is_pickle(head: &[u8]) -> bool {
    head.starts_with(b"PK\x03\x04") || head.first() == Some(&0x80)
}

fn pickle_error(path: &str) -> TraceError {
    TraceError::UnknownFormat {
        path: path.into(),
        reason: "a torch pickle (`.pt`), not JSON: convert it first, e.g. `python -c 'import sys, \
                 json, torch; d = torch.load(sys.argv[1], weights_only=False); \
                 json.dump({k: (v.tolist() if hasattr(v, \"tolist\") else v) for k, v in \
                 d.items()}, open(sys.argv[2], \"w\"))' dump.pt dump.json` (docs/experts.md has \
                 the command for `records` dumps)"
            .into(),
    }
}

/// `[layers, experts]` counts: layers, experts, the counts row-major.
type Matrix = (usize, usize, Vec<f64>);

/// Sums a rank-2 or rank-3 tensor to `[layers, experts]`.
fn to_matrix(t: Tensor, what: &str, path: &str) -> Result<Matrix, TraceError> {
    let bad = |m: String| TraceError::malformed(path, 1, format!("{what}: {m}"));
    if let Some(v) = t.first_negative() {
        return Err(bad(format!(
            "count {v} is not a finite non-negative number"
        )));
    }
    match t.shape.as_slice() {
        [l, e] => Ok((*l, *e, t.values)),
        [_, l, e] => {
            let cell = l * e;
            let mut sum = vec![0.0; cell];
            if cell > 0 {
                for chunk in t.values.chunks_exact(cell) {
                    for (s, v) in sum.iter_mut().zip(chunk) {
                        *s += v;
                    }
                }
            }
            Ok((*l, *e, sum))
        }
        s => Err(bad(format!(
            "shape {s:?}: expected [layers, experts] or [window, layers, experts]"
        ))),
    }
}

/// What [`read_counts_report`] found besides the counts: where they were, and how layers keyed
/// by strings were renumbered.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CountsReport {
    /// Where the counts were: a key (`expert_load_window`, `expert_usage_by_layer`, ...),
    /// `(array)` for a bare array, `(object)` for a top-level object keyed by layer.
    pub source: String,
    /// For counts keyed by layer strings: the keys in the order they became layers `0, 1, ...`
    /// (sorted by the number they end in). Empty when the layers were an array already.
    pub layer_keys: Vec<String>,
}

impl CountsReport {
    /// `"0 ← \"1\", 1 ← \"3\", ..."`: the renumbering of layers keyed by strings, or `None`
    /// when no key was renumbered (keys `"0".."L-1"` in order, or an array).
    pub fn renumbering(&self) -> Option<String> {
        let identity = self
            .layer_keys
            .iter()
            .enumerate()
            .all(|(i, k)| k.trim() == i.to_string());
        if self.layer_keys.is_empty() || identity {
            return None;
        }
        Some(
            self.layer_keys
                .iter()
                .enumerate()
                .map(|(i, k)| format!("{i} ← {k:?}"))
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

/// Reads an EPLB / expert-distribution counts file into a [`CounterDump`] (see the module docs
/// for the accepted documents).
///
/// # Errors
/// As [`read_counts_report`].
pub fn read_counts(path: &Path, opts: &CountsOptions) -> Result<CounterDump, TraceError> {
    read_counts_report(path, opts).map(|(d, _)| d)
}

/// As [`read_counts`], with a [`CountsReport`] (where the counts were, how layers keyed by
/// strings were renumbered: the CLI prints it).
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::UnknownFormat`] for a `.pt` pickle or zip (with the
/// conversion command) or a document without counts (naming the keys it has);
/// [`TraceError::Malformed`] (file, line 1 or the JSON error's line) for invalid JSON, a
/// ragged, negative or non-finite tensor, a map whose shape differs from the counts', a map
/// entry not below the logical experts, two layer keys naming one layer;
/// [`TraceError::ShapeMismatch`] for layers other than [`CountsOptions::layers`];
/// [`TraceError::TooLarge`] for a document above [`super::lines::MAX_DOCUMENT_BYTES`] (a
/// document keyed by strings: above [`MAX_KEYED_BYTES`]) or [`MAX_TENSOR_VALUES`] numbers, or a
/// shape above the bounds of [`expert_residency::Geometry`]; [`TraceError::Empty`] for all-zero
/// counts.
pub fn read_counts_report(
    path: &Path,
    opts: &CountsOptions,
) -> Result<(CounterDump, CountsReport), TraceError> {
    let p = path.display().to_string();
    // The head decides pickle or JSON before anything else is read (`/dev/zero` stops here).
    let (head, rest) = open_document(path, 16)?;
    if is_pickle(&head) {
        return Err(pickle_error(&p));
    }
    // Every document read here is a JSON object or array: a head that opens neither is refused
    // now, not after reading up to the document cap (`/dev/zero` read a whole GiB first).
    if let Some(b) = head.iter().copied().find(|b| !b.is_ascii_whitespace()) {
        if b != b'{' && b != b'[' {
            return Err(TraceError::malformed(
                &p,
                1,
                format!(
                    "not a JSON counts document: it starts with byte {b:#04x}, not '{{' or '['"
                ),
            ));
        }
    }
    let bytes = read_rest(head, rest, &p)?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("counts")
        .to_string();
    read_counts_bytes_report(&bytes, &p, stem, opts)
}

/// As [`read_counts`], from bytes in memory; `path` names them in errors, `name` is the dump's
/// name unless the document has one.
///
/// # Errors
/// As [`read_counts_report`].
pub fn read_counts_bytes(
    bytes: &[u8],
    path: &str,
    name: String,
    opts: &CountsOptions,
) -> Result<CounterDump, TraceError> {
    read_counts_bytes_report(bytes, path, name, opts).map(|(d, _)| d)
}

/// As [`read_counts_report`], from bytes in memory.
///
/// # Errors
/// As [`read_counts_report`].
pub fn read_counts_bytes_report(
    bytes: &[u8],
    path: &str,
    name: String,
    opts: &CountsOptions,
) -> Result<(CounterDump, CountsReport), TraceError> {
    if is_pickle(bytes) {
        return Err(pickle_error(path));
    }
    let json_err =
        |e: serde_json::Error| TraceError::malformed(path, e.line() as u64, e.to_string());
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    let mut report = CountsReport::default();
    let (name, counts, map) = if first == Some(b'[') {
        let t: Tensor = serde_json::from_slice(bytes).map_err(json_err)?;
        report.source = "(array)".into();
        (name, to_matrix(t, "counts", path)?, None)
    } else {
        let doc: Document = serde_json::from_slice(bytes).map_err(json_err)?;
        let name = doc.name.unwrap_or(name);
        let map = doc
            .physical_to_logical_map
            .or(doc.last_physical_to_logical_map);
        let (key, counts) = if let Some(t) = doc.expert_load_window {
            (
                "expert_load_window",
                to_matrix(t, "expert_load_window", path)?,
            )
        } else if let Some(t) = doc.expert_load_pass {
            ("expert_load_pass", to_matrix(t, "expert_load_pass", path)?)
        } else if let Some(t) = doc.logical_count {
            ("logical_count", to_matrix(t, "logical_count", path)?)
        } else if let Some(records) = doc.records {
            ("records", sum_records(records, path)?)
        } else {
            let (counts, keyed) = keyed_counts(bytes, path)?;
            report = keyed;
            return finish(name, counts, None, opts, path).map(|d| (d, report));
        };
        report.source = key.into();
        (name, counts, map)
    };
    finish(name, counts, map, opts, path).map(|d| (d, report))
}

/// Sums SGLang's per-pass `records` to one `[layers, physical]` matrix.
fn sum_records(records: Vec<SgRecord>, path: &str) -> Result<Matrix, TraceError> {
    let mut acc: Option<Matrix> = None;
    for (i, r) in records.into_iter().enumerate() {
        let (l, e, v) = to_matrix(
            r.global_physical_count,
            "records[].global_physical_count",
            path,
        )?;
        match &mut acc {
            None => acc = Some((l, e, v)),
            Some((al, ae, sum)) if *al == l && *ae == e => {
                sum.iter_mut().zip(&v).for_each(|(s, x)| *s += x)
            }
            Some((al, ae, _)) => {
                return Err(TraceError::malformed(
                    path,
                    1,
                    format!("records[{i}] has shape [{l}, {e}], records[0] [{al}, {ae}]"),
                ))
            }
        }
    }
    acc.ok_or_else(|| TraceError::Empty(format!("{path}: `records` is empty")))
}

/// Folds, checks and wraps `[layers, physical]` counts.
fn finish(
    name: String,
    counts: Matrix,
    map: Option<Tensor>,
    opts: &CountsOptions,
    path: &str,
) -> Result<CounterDump, TraceError> {
    let (layers, physical, values) = counts;
    let (experts, counts) = fold(layers, physical, values, map, opts, path)?;
    if let Some(want) = opts.layers {
        if want as usize != layers {
            return Err(TraceError::ShapeMismatch(format!(
                "{path}: the counts have {layers} layers, {want} were asked for"
            )));
        }
    }
    if counts.iter().all(|&c| c == 0.0) {
        return Err(TraceError::Empty(format!(
            "{path}: every count is zero (was the recorder started before the traffic?)"
        )));
    }
    let too_large = |m: String| TraceError::TooLarge(format!("{path}: {m}"));
    let l = u32::try_from(layers).map_err(|_| too_large(format!("{layers} layers")))?;
    let e = u32::try_from(experts).map_err(|_| too_large(format!("{experts} experts")))?;
    CounterDump::new(name, l, e, counts).map_err(|e| too_large(e.to_string()))
}

/// Largest document read as counts keyed by strings (16 MiB: parsed whole into a JSON tree, so
/// the cap bounds memory; a 61-layer × 288-expert dump is about 200 kB).
pub const MAX_KEYED_BYTES: usize = 16 << 20;

/// The layer a key names: the number it ends in (`"3"`, `"layer_3"`, `"model.layers.3"`).
fn layer_number(key: &str) -> Option<u64> {
    let t = key.trim();
    let end = t.len() - t.bytes().rev().take_while(|b| !b.is_ascii_digit()).count();
    let digits = t[..end]
        .bytes()
        .rev()
        .take_while(u8::is_ascii_digit)
        .count();
    t[end - digits..end].parse().ok()
}

/// One layer's counts: `(expert id, count)` pairs.
type Row = Vec<(usize, f64)>;

/// One layer's counts from an array of counts or an object keyed by expert id.
fn layer_row(v: &serde_json::Value) -> Result<Row, String> {
    let count = |x: &serde_json::Value| -> Result<f64, String> {
        match x.as_f64() {
            Some(c) if c.is_finite() && c >= 0.0 => Ok(c),
            _ => Err(format!("count {x} is not a finite non-negative number")),
        }
    };
    match v {
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(e, x)| count(x).map(|c| (e, c)))
            .collect(),
        serde_json::Value::Object(o) => o
            .iter()
            .map(|(k, x)| {
                let e: u32 = k
                    .trim()
                    .parse()
                    .map_err(|_| format!("expert key {k:?} is not an integer id"))?;
                if e >= expert_residency::MAX_EXPERTS_PER_LAYER {
                    return Err(format!(
                        "expert id {e} is not below {}",
                        expert_residency::MAX_EXPERTS_PER_LAYER
                    ));
                }
                count(x).map(|c| (e as usize, c))
            })
            .collect(),
        other => Err(format!(
            "a layer's counts are {other}, not an array or object"
        )),
    }
}

/// `[layers, experts]` counts from an object keyed by layer, with the keys in layer order.
fn layer_map(
    o: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Matrix, Vec<String>), String> {
    if o.is_empty() {
        return Err("no layer".into());
    }
    let mut layers: Vec<(u64, &String, Row)> = Vec::new();
    for (k, v) in o {
        let n = layer_number(k).ok_or_else(|| format!("key {k:?} names no layer number"))?;
        layers.push((n, k, layer_row(v).map_err(|m| format!("layer {k:?}: {m}"))?));
    }
    layers.sort_by_key(|(n, _, _)| *n);
    if let Some(w) = layers.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!(
            "keys {:?} and {:?} both name layer {}",
            w[0].1, w[1].1, w[0].0
        ));
    }
    let experts = layers
        .iter()
        .flat_map(|(_, _, r)| r.iter().map(|&(e, _)| e + 1))
        .max()
        .unwrap_or(0);
    let cells = layers.len().saturating_mul(experts);
    if cells as u64 > expert_residency::MAX_CELLS {
        return Err(format!(
            "{} layers × {experts} experts exceed the bound of {} cells",
            layers.len(),
            expert_residency::MAX_CELLS
        ));
    }
    let mut values = vec![0.0; cells];
    for (l, (_, _, row)) in layers.iter().enumerate() {
        for &(e, c) in row {
            values[l * experts + e] += c;
        }
    }
    let keys = layers.iter().map(|(_, k, _)| (*k).clone()).collect();
    Ok(((layers.len(), experts, values), keys))
}

/// Counts keyed by layer strings: the top-level object, or the first key whose value is such an
/// object. The error names the keys found.
fn keyed_counts(bytes: &[u8], path: &str) -> Result<(Matrix, CountsReport), TraceError> {
    if bytes.len() > MAX_KEYED_BYTES {
        return Err(TraceError::TooLarge(format!(
            "{path}: {} bytes: a counts document without a known key (expert_load_window, \
             logical_count, records) is read whole and may hold at most {MAX_KEYED_BYTES} bytes",
            bytes.len()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| TraceError::malformed(path, e.line() as u64, e.to_string()))?;
    let Some(top) = v.as_object() else {
        return Err(TraceError::UnknownFormat {
            path: path.into(),
            reason: format!("a JSON {}, not counts", json_kind(&v)),
        });
    };
    let found = |s: String, (counts, keys)| {
        Ok((
            counts,
            CountsReport {
                source: s,
                layer_keys: keys,
            },
        ))
    };
    let mut why = match layer_map(top) {
        Ok(m) => return found("(object)".into(), m),
        Err(m) => format!("as layers: {m}"),
    };
    for (k, inner) in top {
        if let Some(o) = inner.as_object() {
            match layer_map(o) {
                Ok(m) => return found(k.clone(), m),
                Err(m) => why = format!("under {k:?}: {m}"),
            }
        }
    }
    let keys: Vec<&str> = top.keys().map(String::as_str).take(20).collect();
    Err(TraceError::UnknownFormat {
        path: path.into(),
        reason: format!(
            "no counts: the top-level keys are {keys:?}{}; expected `expert_load_window` or \
             `expert_load_pass` (vLLM EPLB), `logical_count` or `records` (SGLang expert \
             distribution), a bare [layers, experts] array, or an object keyed by layer \
             (`{{\"1\": {{\"0\": 747, ...}}, ...}}` or `{{\"1\": [747, ...], ...}}`, at the top or \
             under one key); last attempt {why}",
            if top.len() > 20 { " (first 20)" } else { "" }
        ),
    })
}

/// `object`, `array`, ... for messages.
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// Folds `[layers, physical]` counts onto `[layers, logical]` experts.
fn fold(
    layers: usize,
    physical: usize,
    values: Vec<f64>,
    map: Option<Tensor>,
    opts: &CountsOptions,
    path: &str,
) -> Result<(usize, Vec<f64>), TraceError> {
    let bad = |m: String| TraceError::malformed(path, 1, m);
    if opts.experts_per_layer == Some(0) {
        // It used to index an empty table (a panic).
        return Err(TraceError::ShapeMismatch(format!(
            "{path}: 0 logical experts per layer asked for (--experts); give at least 1"
        )));
    }
    let logical_of: Box<dyn Fn(usize, usize) -> usize> = match &map {
        Some(m) => {
            if m.shape != [layers, physical] {
                return Err(bad(format!(
                    "physical_to_logical_map has shape {:?}, the counts [{layers}, {physical}]",
                    m.shape
                )));
            }
            Box::new(|l, p| m.values[l * physical + p] as usize)
        }
        None => {
            let e = opts
                .experts_per_layer
                .map_or(physical, |e| e as usize)
                .max(1);
            Box::new(move |_, p| p % e)
        }
    };
    let experts = match (opts.experts_per_layer, &map) {
        (Some(e), _) => e as usize,
        (None, Some(m)) => {
            (m.values.iter().fold(0.0f64, |a, &b| a.max(b)) as usize).saturating_add(1)
        }
        (None, None) => physical,
    };
    if let Some(m) = &map {
        if let Some(&bad_id) = m
            .values
            .iter()
            .find(|&&v| v < 0.0 || v.fract() != 0.0 || v as usize >= experts)
        {
            return Err(bad(format!(
                "physical_to_logical_map entry {bad_id} is not a logical expert below {experts}"
            )));
        }
    }
    let cells = layers
        .checked_mul(experts)
        .filter(|&c| c as u64 <= expert_residency::MAX_CELLS);
    let Some(cells) = cells else {
        return Err(TraceError::TooLarge(format!(
            "{path}: {layers} layers × {experts} experts"
        )));
    };
    let mut out = vec![0.0; cells];
    for l in 0..layers {
        for p in 0..physical {
            out[l * experts + logical_of(l, p)] += values[l * physical + p];
        }
    }
    Ok((experts, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str, opts: &CountsOptions) -> Result<CounterDump, TraceError> {
        read_counts_bytes(s.as_bytes(), "c.json", "c".into(), opts)
    }

    #[test]
    fn vllm_window_sums_and_folds_redundant_experts() {
        // 2 passes, 2 layers, 3 physical experts: 2 logical + 1 redundant copy of expert 0.
        let s = r#"{"expert_load_window": [[[1, 2, 3], [0, 1, 0]], [[1, 0, 1], [2, 0, 0]]]}"#;
        let d = read(
            s,
            &CountsOptions {
                experts_per_layer: Some(2),
                layers: Some(2),
            },
        )
        .unwrap();
        assert_eq!((d.layers, d.experts_per_layer), (2, 2));
        assert_eq!(d.counts, vec![2.0 + 4.0, 2.0, 2.0, 1.0]);
        let with_map =
            r#"{"expert_load_pass": [[1, 2, 3]], "physical_to_logical_map": [[1, 0, 1]]}"#;
        let d = read(with_map, &CountsOptions::default()).unwrap();
        assert_eq!(d.counts, vec![2.0, 4.0]);
        let bare = read("[[0, 5], [1, 1]]", &CountsOptions::default()).unwrap();
        assert_eq!(bare.counts, vec![0.0, 5.0, 1.0, 1.0]);
    }

    #[test]
    fn zero_logical_experts_is_an_error_not_a_panic() {
        // `fit-seed --eplb-counts F --experts 0` indexed an empty table (a panic).
        for s in [
            "[[1, 2, 3], [4, 5, 6]]",
            r#"{"expert_load_pass": [[1, 2, 3]]}"#,
            r#"{"1": [747, 3], "3": [1, 2]}"#,
        ] {
            let e = read(
                s,
                &CountsOptions {
                    experts_per_layer: Some(0),
                    layers: None,
                },
            )
            .unwrap_err();
            assert!(matches!(e, TraceError::ShapeMismatch(_)), "{s}: {e}");
            assert!(
                e.to_string().contains("(--experts); give at least 1"),
                "{e}"
            );
        }
    }

    #[test]
    fn sglang_stat_and_detail_dumps() {
        let stat = r#"{"rank": 0, "logical_count": [[[1, 0]], [[2, 3]]], "average_utilization_rate_over_window": null}"#;
        assert_eq!(
            read(stat, &CountsOptions::default()).unwrap().counts,
            vec![3.0, 3.0]
        );
        let detail = r#"{"records": [{"forward_pass_id": 1, "global_physical_count": [[1, 0, 2]]},
            {"forward_pass_id": 2, "global_physical_count": [[0, 1, 1]]}],
            "last_physical_to_logical_map": [[0, 1, 0]]}"#;
        assert_eq!(
            read(detail, &CountsOptions::default()).unwrap().counts,
            vec![4.0, 1.0]
        );
    }

    #[test]
    fn bad_documents_are_typed_errors() {
        let none = CountsOptions::default();
        for (s, check) in [
            ("[[1, 2], [3]]", "ragged"),
            ("[[1, -2]]", "non-negative"),
            ("[[[[1]]]]", "more than 3"),
            ("[[1, [2]]]", "ragged"),
            ("{\"other\": 1}", "no counts"),
            (
                "{\"expert_load_pass\": [[1, 2]], \"physical_to_logical_map\": [[0]]}",
                "shape",
            ),
            (
                "{\"expert_load_pass\": [[1, 2]], \"physical_to_logical_map\": [[0, 1.5]]}",
                "not a logical",
            ),
            ("[[0, 0]]", "zero"),
            ("[1, 2]", "shape"),
        ] {
            let e = read(s, &none).unwrap_err().to_string();
            assert!(e.contains(check), "{s}: {e}");
        }
        let e = read_counts_bytes(b"PK\x03\x04rest", "d.pt", "d".into(), &none).unwrap_err();
        assert!(
            matches!(e, TraceError::UnknownFormat { .. }) && e.to_string().contains("torch.load"),
            "{e}"
        );
        let e = read(
            "[[1, 2]]",
            &CountsOptions {
                layers: Some(3),
                ..none.clone()
            },
        )
        .unwrap_err();
        assert!(matches!(e, TraceError::ShapeMismatch(_)), "{e}");
    }
}
