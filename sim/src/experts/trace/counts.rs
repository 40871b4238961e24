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
//!
//! A 3-D tensor is summed over its first axis. Physical experts are folded onto logical ones
//! with `physical_to_logical_map` (vLLM) or `last_physical_to_logical_map` (SGLang), shape
//! `[layers, physical]`, when present; without a map, physical expert `p` is logical expert
//! `p mod E` (vLLM's initial arrangement: the routed experts, then the redundant copies in
//! order), where `E` is [`CountsOptions::experts_per_layer`] or, unset, the physical count.
//! The counts must be global (all EP ranks): vLLM's window is per rank, so sum or concatenate
//! the ranks' windows before saving.

use super::lines::{open_document, read_rest};
use super::TraceError;
use expert_residency::CounterDump;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use std::path::Path;

/// Most numbers one counts document may hold (2^26: a 1,000-pass vLLM window of 61 layers × 288
/// physical experts has 17.6 M).
pub const MAX_COUNT_VALUES: usize = 1 << 26;

/// Options of [`read_counts`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountsOptions {
    /// Logical experts per layer (default: from the map, else the physical count).
    pub experts_per_layer: Option<u32>,
    /// Expected MoE layers (checked when given).
    pub layers: Option<u32>,
}

/// A dense tensor of rank 1 to 3, row-major.
#[derive(Debug, Default, PartialEq)]
struct Tensor {
    shape: Vec<usize>,
    values: Vec<f64>,
}

impl<'de> serde::Deserialize<'de> for Tensor {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut t = Tensor::default();
        let mut leaf_depth = None;
        d.deserialize_seq(Level {
            t: &mut t,
            depth: 0,
            leaf_depth: &mut leaf_depth,
        })?;
        let depth = leaf_depth.unwrap_or(1);
        t.shape.truncate(depth);
        Ok(t)
    }
}

/// One nesting level of a [`Tensor`] being read.
struct Level<'a> {
    t: &'a mut Tensor,
    depth: usize,
    leaf_depth: &'a mut Option<usize>,
}

impl<'de> DeserializeSeed<'de> for Level<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Level<'_> {
    fn number<E: de::Error>(self, v: f64) -> Result<(), E> {
        if !(v.is_finite() && v >= 0.0) {
            return Err(E::custom(format!(
                "count {v} is not a finite non-negative number"
            )));
        }
        match *self.leaf_depth {
            None => *self.leaf_depth = Some(self.depth),
            Some(d) if d != self.depth => {
                return Err(E::custom(
                    "ragged tensor: numbers and lists mixed at one level",
                ))
            }
            _ => {}
        }
        if self.t.values.len() >= MAX_COUNT_VALUES {
            return Err(E::custom(format!(
                "more than {MAX_COUNT_VALUES} counts; sum the window over passes before saving"
            )));
        }
        self.t.values.push(v);
        Ok(())
    }
}

impl<'de> Visitor<'de> for Level<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a nested array of counts ([layers, experts] or [window, layers, experts])")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.number(v as f64)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.number(v as f64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.number(v)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= 3 {
            return Err(de::Error::custom("tensor of more than 3 dimensions"));
        }
        if self.leaf_depth.is_some_and(|d| d <= self.depth) {
            return Err(de::Error::custom(
                "ragged tensor: numbers and lists mixed at one level",
            ));
        }
        let mut n = 0usize;
        while seq
            .next_element_seed(Level {
                t: &mut *self.t,
                depth: self.depth + 1,
                leaf_depth: &mut *self.leaf_depth,
            })?
            .is_some()
        {
            n += 1;
        }
        // Inner levels finish first: an unset length is `usize::MAX` until its level is seen.
        let shape = &mut self.t.shape;
        if shape.len() <= self.depth {
            shape.resize(self.depth + 1, usize::MAX);
        }
        if shape[self.depth] == usize::MAX {
            shape[self.depth] = n;
        } else if shape[self.depth] != n {
            return Err(de::Error::custom(format!(
                "ragged tensor: {n} entries where a sibling has {}",
                shape[self.depth]
            )));
        }
        Ok(())
    }
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

/// Sums a rank-2 or rank-3 tensor to `[layers, experts]`.
fn to_matrix(t: Tensor, what: &str, path: &str) -> Result<(usize, usize, Vec<f64>), TraceError> {
    let bad = |m: String| TraceError::malformed(path, 1, format!("{what}: {m}"));
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

/// Reads an EPLB / expert-distribution counts file into a [`CounterDump`] (see the module docs
/// for the accepted documents).
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::UnknownFormat`] for a `.pt` pickle or zip (with the
/// conversion command) or a document without any known counts key;
/// [`TraceError::Malformed`] (file, line 1 or the JSON error's line) for invalid JSON, a
/// ragged, negative or non-finite tensor, a map whose shape differs from the counts', a map
/// entry not below the logical experts; [`TraceError::ShapeMismatch`] for layers other than
/// [`CountsOptions::layers`]; [`TraceError::TooLarge`] for a document above
/// [`super::lines::MAX_DOCUMENT_BYTES`] or [`MAX_COUNT_VALUES`] numbers, or a shape above the
/// bounds of [`expert_residency::Geometry`]; [`TraceError::Empty`] for all-zero counts.
pub fn read_counts(path: &Path, opts: &CountsOptions) -> Result<CounterDump, TraceError> {
    let p = path.display().to_string();
    // The head decides pickle or JSON before anything else is read (`/dev/zero` stops here).
    let (head, rest) = open_document(path, 16)?;
    if is_pickle(&head) {
        return Err(pickle_error(&p));
    }
    let bytes = read_rest(head, rest, &p)?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("counts")
        .to_string();
    read_counts_bytes(&bytes, &p, stem, opts)
}

/// As [`read_counts`], from bytes in memory; `path` names them in errors, `name` is the dump's
/// name unless the document has one.
///
/// # Errors
/// As [`read_counts`].
pub fn read_counts_bytes(
    bytes: &[u8],
    path: &str,
    name: String,
    opts: &CountsOptions,
) -> Result<CounterDump, TraceError> {
    if is_pickle(bytes) {
        return Err(pickle_error(path));
    }

    let json_err =
        |e: serde_json::Error| TraceError::malformed(path, e.line() as u64, e.to_string());
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    let (name, counts, map) = if first == Some(b'[') {
        let t: Tensor = serde_json::from_slice(bytes).map_err(json_err)?;
        (name, to_matrix(t, "counts", path)?, None)
    } else {
        let doc: Document = serde_json::from_slice(bytes).map_err(json_err)?;
        let name = doc.name.unwrap_or(name);
        let map = doc
            .physical_to_logical_map
            .or(doc.last_physical_to_logical_map);
        let counts = if let Some(t) = doc.expert_load_window {
            to_matrix(t, "expert_load_window", path)?
        } else if let Some(t) = doc.expert_load_pass {
            to_matrix(t, "expert_load_pass", path)?
        } else if let Some(t) = doc.logical_count {
            to_matrix(t, "logical_count", path)?
        } else if let Some(records) = doc.records {
            let mut acc: Option<(usize, usize, Vec<f64>)> = None;
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
            acc.ok_or_else(|| TraceError::Empty(format!("{path}: `records` is empty")))?
        } else {
            return Err(TraceError::UnknownFormat {
                path: path.into(),
                reason: "no counts: expected `expert_load_window` or `expert_load_pass` (vLLM \
                         EPLB), `logical_count` or `records` (SGLang expert distribution), or a \
                         bare [layers, experts] array"
                    .into(),
            });
        };
        (name, counts, map)
    };
    let (layers, physical, values) = counts;
    let logical = fold(layers, physical, values, map, opts, path)?;
    let (experts, counts) = logical;
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
        (None, Some(m)) => m.values.iter().fold(0.0f64, |a, &b| a.max(b)) as usize + 1,
        (None, None) => physical,
    };
    if let Some(m) = &map {
        if let Some(&bad_id) = m
            .values
            .iter()
            .find(|&&v| v.fract() != 0.0 || v as usize >= experts)
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
