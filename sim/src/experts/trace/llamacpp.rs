//! Reader for llama.cpp's routing-trace CSV ([`super::TraceFormat::RoutingCsv`]).
//!
//! Source: the `moe-trace` example of llama.cpp (open PR #28544, "examples : add moe-trace to
//! log MoE expert routing decisions"): an eval callback reads every `ffn_moe_topk-<layer>` id
//! tensor (`[n_tokens, top_k]` int32, one per MoE layer per micro-batch) and writes one CSV row
//! per routed pick, `layer,expert`, to `MOE_TRACE_OUT` (default `moe_trace.csv`), for a prompt
//! evaluation and a greedy continuation. A fork of it adds the token and the phase,
//! `phase,token,layer,rank,expert`. Rows come in graph order: for each micro-batch, layer by
//! layer, each layer's tokens in order with their top-k picks.
//!
//! Columns are found by the header, case-insensitive: `layer` (or `layer_id`, `il`), `expert`
//! (or `expert_id`, `id`), optionally `token` (or `token_idx`, `token_pos`, `pos`, `position`)
//! and `phase` (or `pass`: `prefill`/`decode`/..., [`super::passes::parse_pass_kind`]); other
//! columns (`rank`) are ignored. A file without a header has two columns, `layer,expert`. Lines
//! starting with `#` are comments. Repeated header lines (traces concatenated) are skipped.
//!
//! **Steps.** Rows are cut into forward passes by file order ([`super::rows`]): a pass (one
//! micro-batch: the prompt, or one decode token) is a run of non-decreasing layers. With a
//! token column, a token's picks in one layer form one row and the missing-row count is in
//! tokens; without one, every pick is a row and the count is in picks. Top-k, unless given
//! ([`ReadOptions::top_k`]), is the widest token row with a token column, else the fewest picks
//! a layer has in any pass (a one-token decode pass has exactly top-k).
//!
//! Every line is bounded ([`super::lines::MAX_LINE_BYTES`]), as are blank-line runs and picks.

use super::lines::{PickBudget, MAX_BLANK_RUN, MAX_LINE_BYTES};
use super::rows::Aligner;
use super::{ReadOptions, ReadReport, Trace, TraceError, TraceFormat, TraceShape};
use std::io::Read;
use std::path::Path;

/// Whether a first line reads as a routing CSV: a header with `layer` and `expert` columns, or
/// two or more comma-separated integers.
pub fn looks_like_csv(line: &str) -> bool {
    let fields: Vec<String> = line
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_ascii_lowercase())
        .collect();
    if fields.len() < 2 {
        return false;
    }
    let header = Columns::from_header(&fields).is_some();
    header || fields.iter().all(|f| f.parse::<i64>().is_ok())
}

/// Column indices.
#[derive(Clone, Copy, Debug)]
struct Columns {
    layer: usize,
    expert: usize,
    token: Option<usize>,
    phase: Option<usize>,
}

impl Columns {
    fn from_header(fields: &[String]) -> Option<Columns> {
        let find = |names: &[&str]| fields.iter().position(|f| names.contains(&f.as_str()));
        Some(Columns {
            layer: find(&["layer", "layer_id", "layer_idx", "il"])?,
            expert: find(&["expert", "expert_id", "expert_ids", "id"])?,
            token: find(&["token", "token_idx", "token_pos", "pos", "position"]),
            phase: find(&["phase", "pass", "kind"]),
        })
    }
}

/// A reader that fails a line longer than [`MAX_LINE_BYTES`] or a run of more than
/// [`MAX_BLANK_RUN`] newlines, so the CSV parser never holds a huge field.
struct Capped<R> {
    inner: R,
    line: usize,
    blank_run: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            if b == b'\n' {
                self.blank_run = if self.line == 0 {
                    self.blank_run + 1
                } else {
                    0
                };
                self.line = 0;
                if self.blank_run > MAX_BLANK_RUN {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("more than {MAX_BLANK_RUN} blank lines in a row"),
                    ));
                }
            } else {
                self.line += 1;
                if self.line > MAX_LINE_BYTES {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("line longer than {MAX_LINE_BYTES} bytes: not a routing CSV"),
                    ));
                }
            }
        }
        Ok(n)
    }
}

/// Reads a llama.cpp routing CSV into a trace, with its [`ReadReport`].
///
/// # Errors
/// As [`read_csv_from`].
pub fn read_csv(path: &Path, opts: &ReadOptions) -> Result<(Trace, ReadReport), TraceError> {
    let p = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|e| TraceError::io(&p, e))?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("trace")
        .to_string();
    read_csv_from(f, &p, opts, name)
}

/// As [`read_csv`], from any reader; `path` names it in errors.
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::Malformed`] (file and line) for a line longer than the
/// bound, a header without `layer`/`expert` columns, a headerless line of other than two
/// columns, a field that is not a non-negative integer, an unknown phase;
/// [`TraceError::LayerOutOfRange`], [`TraceError::ExpertOutOfRange`] (file and line);
/// [`TraceError::TooLarge`] past [`super::lines::MAX_PICKS`] or a shape above the bounds;
/// [`TraceError::Empty`] for no row.
pub fn read_csv_from<R: Read>(
    reader: R,
    path: &str,
    opts: &ReadOptions,
    name: String,
) -> Result<(Trace, ReadReport), TraceError> {
    let capped = Capped {
        inner: reader,
        line: 0,
        blank_run: 0,
    };
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(capped);
    let mut cols: Option<Columns> = None;
    let mut aligner = Aligner::default();
    let mut budget = PickBudget::default();
    let (mut max_layer, mut max_id) = (None::<u32>, None::<u32>);
    let mut width = std::collections::HashMap::<(u32, u64), u32>::new();
    let mut max_width = 0u32;
    let mut last_key = None;
    let mut record = csv::StringRecord::new();
    loop {
        let more = csv.read_record(&mut record).map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            match e.into_kind() {
                csv::ErrorKind::Io(io) => TraceError::malformed(path, line, io.to_string()),
                k => TraceError::malformed(path, line, format!("{k:?}")),
            }
        })?;
        if !more {
            break;
        }
        let line = record.position().map_or(0, |p| p.line());
        let malformed = |m: String| TraceError::malformed(path, line, m);
        let fields: Vec<String> = record
            .iter()
            .map(|f| f.trim_matches('"').to_ascii_lowercase())
            .collect();
        if let Some(c) = Columns::from_header(&fields) {
            // A repeated header (concatenated traces) is skipped.
            if cols.is_none() {
                cols = Some(c);
            }
            continue;
        }
        let c = match cols {
            Some(c) => c,
            None if fields.len() == 2 => {
                let c = Columns {
                    layer: 0,
                    expert: 1,
                    token: None,
                    phase: None,
                };
                cols = Some(c);
                c
            }
            None => {
                return Err(malformed(format!(
                    "a line of {} fields and no header: give a header naming the `layer` and \
                     `expert` columns (and `token`, `phase`), or two columns `layer,expert`",
                    fields.len()
                )))
            }
        };
        let int = |i: usize, what: &str| -> Result<u64, TraceError> {
            let f = fields
                .get(i)
                .ok_or_else(|| malformed(format!("no {what} column (field {})", i + 1)))?;
            f.parse::<u64>()
                .map_err(|_| malformed(format!("{what} {f:?} is not a non-negative integer")))
        };
        let layer = int(c.layer, "layer")?;
        let expert = int(c.expert, "expert")?;
        let token = c.token.map(|i| int(i, "token")).transpose()?;
        let kind = match c.phase.and_then(|i| fields.get(i)) {
            None => None,
            Some(s) => Some(super::passes::parse_pass_kind(s).ok_or_else(|| {
                malformed(format!(
                    "unknown phase {s:?} (expected prefill, decode, warmup, profile or draft)"
                ))
            })?),
        };
        let layer = u32::try_from(layer)
            .ok()
            .filter(|&l| opts.layers.is_none_or(|n| l < n))
            .ok_or_else(|| TraceError::LayerOutOfRange {
                location: format!("{path}:{line}"),
                layer,
                layers: opts.layers.unwrap_or(u32::MAX),
            })?;
        let expert = u32::try_from(expert)
            .ok()
            .filter(|&e| opts.experts_per_layer.is_none_or(|n| e < n))
            .ok_or_else(|| TraceError::ExpertOutOfRange {
                location: format!("{path}:{line}"),
                expert,
                experts: opts.experts_per_layer.unwrap_or(u32::MAX),
            })?;
        budget.charge(1, path, line)?;
        max_layer = max_layer.max(Some(layer));
        max_id = max_id.max(Some(expert));
        if let Some(t) = token {
            // Widest (layer, token) row; the map is cleared at each new row key.
            let key = (layer, t);
            if last_key != Some(key) {
                width.clear();
                last_key = Some(key);
            }
            let w = width.entry(key).or_insert(0);
            *w += 1;
            max_width = max_width.max(*w);
        }
        aligner.push_pick(layer, token, kind, expert);
    }
    let Some(max_layer) = max_layer else {
        return Err(TraceError::Empty(format!("{path}: no routing row")));
    };
    let past = |what: &str, m: u32| {
        m.checked_add(1).ok_or_else(|| {
            TraceError::TooLarge(format!("{path}: {what} {m} leaves no room for a count"))
        })
    };
    let layers = match opts.layers {
        Some(l) => l,
        None => past("layer", max_layer)?,
    };
    let experts = match opts.experts_per_layer {
        Some(e) => e,
        None => past("expert id", max_id.unwrap_or(0))?,
    };
    TraceShape {
        layers,
        experts_per_layer: experts,
        top_k: 1,
    }
    .validate()?;
    let with_tokens = cols.is_some_and(|c| c.token.is_some());
    let (steps, passes, rows) = aligner.finish(layers, opts.keep_dummy_passes, &name)?;
    let top_k = match opts.top_k {
        Some(k) => k,
        None if with_tokens => max_width.max(1),
        None => steps
            .iter()
            .flat_map(|s| s.layers.iter().map(Vec::len))
            .filter(|&n| n > 0)
            .min()
            .unwrap_or(1) as u32,
    }
    .min(experts);
    let shape = TraceShape {
        layers,
        experts_per_layer: experts,
        top_k,
    };
    shape.validate()?;
    let mut report = ReadReport::of(TraceFormat::RoutingCsv);
    report.rows = rows;
    report.passes = passes;
    if !with_tokens {
        report.notes.push(format!(
            "no token column: rows and missing rows are counted in picks; top-k {top_k} is the \
             fewest picks of a layer in one pass (give --top-k to set it)"
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

    fn read(s: &str) -> Result<(Trace, ReadReport), TraceError> {
        read_csv_from(s.as_bytes(), "t.csv", &ReadOptions::default(), "t".into())
    }

    #[test]
    fn upstream_layer_expert_rows() {
        // Prompt of 2 tokens (top-2) over 2 layers, then 2 decode tokens.
        let s = "layer,expert\n0,1\n0,2\n0,3\n0,1\n1,4\n1,5\n1,6\n1,7\n0,2\n0,3\n1,1\n1,0\n0,5\n0,6\n1,2\n1,3\n";
        let (t, r) = read(s).unwrap();
        assert_eq!(t.steps.len(), 3);
        assert_eq!(t.steps[0].layers, vec![vec![1, 2, 3, 1], vec![4, 5, 6, 7]]);
        assert_eq!(t.steps[2].layers, vec![vec![5, 6], vec![2, 3]]);
        assert_eq!(t.shape.top_k, 2);
        assert_eq!(t.shape.experts_per_layer, 8);
        assert_eq!(r.rows.rows, 16);
        assert_eq!(r.rows.missing_rows, 0);
        // No header: the same.
        let (t2, _) = read(s.split_once('\n').unwrap().1).unwrap();
        assert_eq!(t2.steps, t.steps);
    }

    #[test]
    fn fork_columns_with_token_and_phase() {
        let s = "phase,token,layer,rank,expert\n\
                 prefill,0,0,0,1\nprefill,0,0,1,2\nprefill,1,0,0,3\nprefill,1,0,1,4\n\
                 prefill,0,1,0,5\nprefill,0,1,1,6\n\
                 decode,2,0,0,7\ndecode,2,0,1,0\ndecode,2,1,0,1\ndecode,2,1,1,2\n";
        let (t, r) = read(s).unwrap();
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.steps[0].layers, vec![vec![1, 2, 3, 4], vec![5, 6]]);
        assert_eq!(t.steps[1].layers, vec![vec![7, 0], vec![1, 2]]);
        assert_eq!(t.shape.top_k, 2);
        // Layer 1 lacks token 1 of the prompt.
        assert_eq!(r.rows.missing_rows, 1);
        assert_eq!(r.rows.rows, 5);
    }

    #[test]
    fn bad_lines_are_typed() {
        for (s, want) in [
            ("layer,expert\n0,x\n", "not a non-negative integer"),
            ("0,1,2\n", "no header"),
            ("phase,layer,expert\nverify,0,1\n", "unknown phase"),
            ("", "no routing row"),
        ] {
            let e = read(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s:?}: {e}");
        }
        assert!(looks_like_csv("layer,expert"));
        assert!(looks_like_csv("3,17"));
        assert!(!looks_like_csv("{\"layer\": 0}"));
    }
}
