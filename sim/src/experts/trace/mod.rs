//! Routing traces: the steps a replay feeds through the controller, their readers and writers,
//! and the calibrated synthetic generator.
//!
//! A [`Trace`] is a list of [`StepPicks`] (one forward pass each: the expert ids every routed token
//! picked in every MoE layer) with its [`TraceShape`] and the steps at which the traffic is known
//! to shift. It comes from one of these sources:
//!
//! | source | module | notes |
//! | --- | --- | --- |
//! | tierkit binary trace (`.tkt`) | [`binary`] | compact, little-endian, documented byte layout; for long traces |
//! | Mixtral per-token decode JSONL | [`mixtral`] | `{"dataset","problem_id","layer","experts","gating_probs","token_idx"}` |
//! | engine-logger JSONL | [`logger`] | `{"layer": l, "topk_ids": [...]}` per routed token, with step fields or boundary marker lines |
//! | engine routing logs | [`vllm`] | vLLM MoE routing logger (`moe_layer{L}.jsonl`: meta line, `{"type": "route", "token_idx", "layer", "topk_ids"}`), raw per-row logs (ids under `topk_ids`/`experts`/`selected_experts`/`expert_ids`/`routed_experts`, position under `token_idx`/`token_pos`/`pos`); one file's passes cut by file order with lost rows counted ([`rows`]), per-layer files merged pass by pass ([`passes`]), dummy passes dropped |
//! | per-request captures | [`capture`] | vLLM `--enable-return-routed-experts` (`routed_experts`, `prompt_routed_experts`: nested lists or base64 `.npy`), SGLang `return_routed_experts` (`meta_info.routed_experts`: base64 int32) |
//! | llama.cpp routing CSV | [`llamacpp`] | `moe-trace` (`layer,expert` rows per pick; `phase,token,layer,rank,expert`) |
//! | synthetic generator | [`synth`] | per-layer popularity fitted from the OLMoE counts, Mixtral-like step-to-step reuse, scheduled domain shifts |
//!
//! Engine expert-load counts (vLLM EPLB windows, SGLang expert-distribution dumps) are counts,
//! not routes: [`counts`] reads them (also objects keyed by layer strings) into an
//! [`expert_residency::CounterDump`] for seed fitting. [`rawlog`] writes a trace back as a raw
//! per-row log with rows dropped, the way real logs come; [`prefill`] puts a synthetic prefill
//! step in front of a decode-only trace. [`read_trace_report`] returns what the
//! readers found ([`ReadReport`]: rows read and missing, passes dropped).
//! Every text reader is bounded ([`lines`]): line length, blank-line runs, total picks.
//!
//! A whole [`Trace`] also round-trips through JSON with `serde` (format [`TraceFormat::Json`]).
//! [`read_trace`] reads any of them (auto-detected by magic bytes, extension or first line) and
//! applies the [`ReadOptions`] (geometry hints, warm-up steps to drop). Every reader reports bad input
//! as a typed [`TraceError`]: a malformed line with its file and line number, an expert id not below
//! the experts per layer, a top-k wider than the geometry, an empty trace, a truncated binary trace
//! with its byte offset.
//!
//! ```
//! use tierkit_sim::experts::trace::{synth, binary, stats};
//! let mut cfg = synth::SynthConfig::default_scenario();
//! cfg.steps = 40;
//! cfg.phases[1].start_step = 20;
//! let trace = synth::generate(&cfg).unwrap();
//! let mut bytes = Vec::new();
//! binary::write_binary(&trace, &mut bytes).unwrap();
//! let back = binary::read_binary_bytes(&bytes, "mem").unwrap();
//! assert_eq!(back, trace);
//! assert_eq!(stats::reuse_per_layer(&trace).unwrap().len(), 16);
//! ```

pub mod binary;
pub mod capture;
pub mod counts;
pub mod lines;
pub mod llamacpp;
pub mod logger;
pub mod mixtral;
pub mod olmoe;
pub mod passes;
pub mod prefill;
pub mod rawlog;
pub mod rows;
pub mod stats;
pub mod synth;
mod tensor;
pub mod vllm;

use std::path::Path;

pub use expert_residency::StepPicks;

/// The shape a trace claims for itself (checked against a [`expert_residency::Geometry`] before a replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceShape {
    /// MoE layers per step.
    pub layers: u32,
    /// Experts per layer (every id in the trace is below this).
    pub experts_per_layer: u32,
    /// Experts picked per routed token (top-k).
    pub top_k: u32,
}

/// A whole routing trace held in memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    /// A short name (file stem, or scenario name for synthetic traces).
    pub name: String,
    /// The trace's shape.
    pub shape: TraceShape,
    /// The steps, in order.
    pub steps: Vec<StepPicks>,
    /// Step indices at which the traffic is known to shift (synthetic domain shifts); empty for
    /// real traces unless given.
    pub shifts: Vec<u64>,
}

/// Everything that can go wrong reading, writing or generating a trace.
///
/// `location` fields read `FILE:LINE` for text formats, `FILE@OFFSET` for binary ones and
/// `step S layer L` for in-memory traces.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A text line is not valid JSON or lacks a required field.
    #[error("{path}:{line}: malformed trace line: {reason}")]
    Malformed {
        /// The file.
        path: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong, in words.
        reason: String,
    },
    /// An expert id is not below the experts per layer.
    #[error("{location}: expert id {expert} out of range (experts per layer: {experts})")]
    ExpertOutOfRange {
        /// Where (`FILE:LINE`, `FILE@OFFSET` or `step S layer L`).
        location: String,
        /// The offending id.
        expert: u64,
        /// Experts per layer.
        experts: u32,
    },
    /// A layer index is not below the layers of the trace.
    #[error("{location}: layer {layer} out of range (layers: {layers})")]
    LayerOutOfRange {
        /// Where.
        location: String,
        /// The offending layer.
        layer: u64,
        /// Layers of the trace.
        layers: u32,
    },
    /// A routed token picks more experts than the geometry's top-k, or top-k is zero or wider
    /// than the experts per layer.
    #[error("{location}: top-k {found} is outside the allowed 1..={allowed}")]
    TopKTooWide {
        /// Where.
        location: String,
        /// The top-k found.
        found: u64,
        /// The most the geometry allows.
        allowed: u32,
    },
    /// A step lists another number of layers than the trace's shape.
    #[error("{location}: the step lists {found} layers, the trace shape has {layers}")]
    LayerCountMismatch {
        /// Where (`NAME: step S`).
        location: String,
        /// Layers listed by the step.
        found: u64,
        /// Layers of the shape.
        layers: u32,
    },
    /// A routed token lists the same expert twice (top-k picks of one token are distinct in
    /// every engine).
    #[error("{location}: expert {expert} appears twice in one token's top-k")]
    DuplicateExpert {
        /// Where (`FILE:LINE`).
        location: String,
        /// The repeated expert id.
        expert: u32,
    },
    /// A shape or scenario above the crate's size bounds ([`expert_residency::MAX_LAYERS`],
    /// [`expert_residency::MAX_EXPERTS_PER_LAYER`], [`expert_residency::MAX_CELLS`], the synthetic generator's limits).
    #[error("too large: {0}")]
    TooLarge(String),
    /// The trace holds no step, or no expert lookup at all (after dropping warm-up steps).
    #[error("empty trace: {0}")]
    Empty(String),
    /// A binary trace ends before the data its header announces.
    #[error("{path}: truncated binary trace at byte offset {offset}: {what} needs {needed} bytes, {available} left")]
    Truncated {
        /// The file.
        path: String,
        /// Byte offset where the missing data starts.
        offset: u64,
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A binary trace does not start with the tierkit magic bytes.
    #[error("{path}: not a tierkit binary trace (bad magic bytes)")]
    BadMagic {
        /// The file.
        path: String,
    },
    /// A binary trace of a version this build does not read.
    #[error(
        "{path}: unsupported binary trace version {version} (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The file.
        path: String,
        /// Version in the file.
        version: u32,
        /// Version this build reads and writes.
        supported: u32,
    },
    /// A binary trace is inconsistent (bad header field, trailing bytes, ...).
    #[error("{path}: corrupt binary trace at byte offset {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// Byte offset of the inconsistency.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Two traces, or a trace and a geometry hint, disagree on the shape.
    #[error("shape mismatch: {0}")]
    ShapeMismatch(String),
    /// The trace format could not be recognised.
    #[error("{path}: unknown trace format: {reason}")]
    UnknownFormat {
        /// The file.
        path: String,
        /// Why detection failed.
        reason: String,
    },
    /// A synthetic scenario or profile is invalid (zero steps, shares that do not sum to one,
    /// fewer experts with non-zero share than top-k, unknown domain, ...).
    #[error("invalid synthetic scenario: {0}")]
    InvalidScenario(String),
}

impl TraceError {
    pub(crate) fn io(path: &str, source: std::io::Error) -> Self {
        TraceError::Io {
            path: path.to_string(),
            source,
        }
    }

    /// Names the file `path` in an error of [`Trace::validate`] (which only knows the trace's
    /// name), unless the message already starts with it.
    fn in_file(self, path: &str) -> Self {
        let at = |m: String| {
            if m.starts_with(path) {
                m
            } else {
                format!("{path}: {m}")
            }
        };
        match self {
            TraceError::ShapeMismatch(m) => TraceError::ShapeMismatch(at(m)),
            TraceError::TooLarge(m) => TraceError::TooLarge(at(m)),
            TraceError::Empty(m) => TraceError::Empty(at(m)),
            TraceError::LayerCountMismatch {
                location,
                found,
                layers,
            } => TraceError::LayerCountMismatch {
                location: at(location),
                found,
                layers,
            },
            TraceError::ExpertOutOfRange {
                location,
                expert,
                experts,
            } => TraceError::ExpertOutOfRange {
                location: at(location),
                expert,
                experts,
            },
            TraceError::TopKTooWide {
                location,
                found,
                allowed,
            } => TraceError::TopKTooWide {
                location: at(location),
                found,
                allowed,
            },
            other => other,
        }
    }

    pub(crate) fn malformed(path: &str, line: u64, reason: impl Into<String>) -> Self {
        TraceError::Malformed {
            path: path.to_string(),
            line,
            reason: reason.into(),
        }
    }
}

/// Parses the non-blank lines of a JSONL reader as `T`, yielding 1-based line numbers. Lines
/// are bounded ([`lines::MAX_LINE_BYTES`], [`lines::MAX_BLANK_RUN`]): `/dev/zero` or one huge
/// line fails at line 1 without being held in memory.
pub(crate) fn jsonl_lines<'a, T, R>(
    reader: R,
    path: &'a str,
) -> impl Iterator<Item = Result<(u64, T), TraceError>> + 'a
where
    T: serde::de::DeserializeOwned,
    R: std::io::BufRead + 'a,
{
    lines::BoundedLines::new(reader, path).map(move |item| {
        let (lineno, l) = item?;
        serde_json::from_str(&l)
            .map(|v| (lineno, v))
            .map_err(|e| TraceError::malformed(path, lineno, e.to_string()))
    })
}

/// Checks the raw ids of one routed token at `path:line`: `-1` is skipped when `padding` allows
/// it, other negatives are malformed, ids at or above `experts` (when known) are out of range, an
/// id listed twice is a [`TraceError::DuplicateExpert`].
pub(crate) fn check_ids(
    raw: &[i64],
    experts: Option<u32>,
    padding: bool,
    path: &str,
    line: u64,
) -> Result<Vec<u32>, TraceError> {
    let mut ids = Vec::with_capacity(raw.len());
    for &e in raw {
        if e == -1 && padding {
            continue;
        }
        if e < 0 || e > u32::MAX as i64 {
            return Err(TraceError::malformed(
                path,
                line,
                format!("invalid expert id {e}"),
            ));
        }
        if let Some(experts) = experts {
            if e >= experts as i64 {
                return Err(TraceError::ExpertOutOfRange {
                    location: format!("{path}:{line}"),
                    expert: e as u64,
                    experts,
                });
            }
        }
        ids.push(e as u32);
    }
    if let Some(expert) = first_duplicate(&ids) {
        return Err(TraceError::DuplicateExpert {
            location: format!("{path}:{line}"),
            expert,
        });
    }
    Ok(ids)
}

/// The first id (in sorted order for long lists) that appears twice in `ids`, if any.
fn first_duplicate(ids: &[u32]) -> Option<u32> {
    if ids.len() <= 32 {
        // Top-k lists are short: a quadratic scan allocates nothing.
        return ids
            .iter()
            .enumerate()
            .find(|&(i, e)| ids[..i].contains(e))
            .map(|(_, &e)| e);
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Trace file formats [`read_trace`] understands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// Detect: binary magic bytes, then the `.json` extension, then the keys of the first JSONL line.
    #[default]
    Auto,
    /// tierkit binary trace ([`binary`]).
    Binary,
    /// A whole [`Trace`] serialized as one JSON document.
    Json,
    /// Mixtral per-token decode JSONL ([`mixtral`]).
    MixtralJsonl,
    /// Engine-logger JSONL ([`logger`]).
    LoggerJsonl,
    /// Engine routing logs numbering each row inside its forward pass ([`vllm`]): the vLLM
    /// MoE routing logger (`{"type": "route", "token_idx", "layer", "topk_ids"}` after a meta
    /// line) and the raw per-row layout (`token_pos`/`token_idx`/`pos` + `experts`/`topk_ids`/
    /// ...), passes cut by file order ([`rows`]).
    RoutesJsonl,
    /// Per-request routing captures returned by vLLM (`--enable-return-routed-experts`) and
    /// SGLang (`return_routed_experts`): JSON or JSONL responses ([`capture`]).
    CaptureJson,
    /// llama.cpp's routing-trace CSV (`layer,expert` rows, or `phase,token,layer,rank,expert`)
    /// ([`llamacpp`]).
    RoutingCsv,
}

/// What to do with a (token, layer) row that a per-token trace lacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingRows {
    /// Keep the token: the layers it has rows for count, the missing layers see no lookup from it.
    #[default]
    EmptyLayer,
    /// Drop every token that lacks a row in any layer.
    DropToken,
}

/// Options of [`read_trace`]. Geometry hints left `None` come from the file (binary header,
/// logger header line, Mixtral defaults) or are inferred from the data.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadOptions {
    /// The format (default: auto-detect).
    pub format: TraceFormat,
    /// MoE layers; a record with a layer at or above this is an error.
    pub layers: Option<u32>,
    /// Experts per layer; an id at or above this is an error.
    pub experts_per_layer: Option<u32>,
    /// Top-k; a token picking more experts is an error.
    pub top_k: Option<u32>,
    /// Warm-up steps (forward passes) to drop from the start of each file.
    pub skip_steps: u64,
    /// What to do with missing (token, layer) rows in per-token formats.
    pub missing_rows: MissingRows,
    /// Keep dummy profiling, warm-up and other non-counted passes of routing logs
    /// ([`passes`]); by default they are dropped.
    #[serde(default)]
    pub keep_dummy_passes: bool,
}

impl ReadOptions {
    /// Checks a shape the file declares against the hints, filling nothing.
    pub(crate) fn check_shape(&self, shape: &TraceShape, path: &str) -> Result<(), TraceError> {
        let pairs = [
            ("layers", self.layers, shape.layers),
            (
                "experts_per_layer",
                self.experts_per_layer,
                shape.experts_per_layer,
            ),
            ("top_k", self.top_k, shape.top_k),
        ];
        for (field, hint, found) in pairs {
            if let Some(h) = hint {
                if h != found {
                    return Err(TraceError::ShapeMismatch(format!(
                        "{path}: {field} is {found} in the file, {h} was asked for"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl TraceShape {
    /// Checks the shape itself: non-zero layers and experts, `1 <= top_k <= experts_per_layer`,
    /// and the bounds of [`expert_residency::Geometry`]: `layers ≤` [`expert_residency::MAX_LAYERS`],
    /// `experts_per_layer ≤` [`expert_residency::MAX_EXPERTS_PER_LAYER`], `layers × experts_per_layer ≤`
    /// [`expert_residency::MAX_CELLS`] (so a tiny file cannot make a reader allocate per-cell tables of
    /// gigabytes).
    ///
    /// # Errors
    /// [`TraceError::ShapeMismatch`] for zero fields, [`TraceError::TooLarge`] above the bounds,
    /// [`TraceError::TopKTooWide`] for a top-k of zero or above the experts per layer.
    pub fn validate(&self) -> Result<(), TraceError> {
        if self.layers == 0 || self.experts_per_layer == 0 {
            return Err(TraceError::ShapeMismatch(format!(
                "layers ({}) and experts_per_layer ({}) must be non-zero",
                self.layers, self.experts_per_layer
            )));
        }
        expert_residency::Geometry::check_shape(self.layers, self.experts_per_layer)
            .map_err(|e| TraceError::TooLarge(format!("trace shape: {e}")))?;
        if self.top_k == 0 || self.top_k > self.experts_per_layer {
            return Err(TraceError::TopKTooWide {
                location: "trace shape".into(),
                found: self.top_k.into(),
                allowed: self.experts_per_layer,
            });
        }
        Ok(())
    }
}

impl Trace {
    /// Total expert lookups (picks) over all steps and layers.
    pub fn lookups(&self) -> u64 {
        self.steps
            .iter()
            .flat_map(|s| s.layers.iter())
            .map(|l| l.len() as u64)
            .sum()
    }

    /// Checks the whole trace against its own shape: at least one step and one lookup, every step
    /// with `shape.layers` layers, every id below `experts_per_layer`, shifts inside the trace and
    /// increasing.
    ///
    /// # Errors
    /// [`TraceError::Empty`], [`TraceError::LayerCountMismatch`] (a step with the wrong number of
    /// layers), [`TraceError::ExpertOutOfRange`], [`TraceError::TopKTooWide`],
    /// [`TraceError::ShapeMismatch`] (shifts).
    pub fn validate(&self) -> Result<(), TraceError> {
        self.shape.validate()?;
        if self.steps.is_empty() {
            return Err(TraceError::Empty(format!("{}: no step", self.name)));
        }
        for (s, step) in self.steps.iter().enumerate() {
            if step.layers.len() != self.shape.layers as usize {
                return Err(TraceError::LayerCountMismatch {
                    location: format!("{}: step {s}", self.name),
                    found: step.layers.len() as u64,
                    layers: self.shape.layers,
                });
            }
            for (l, ids) in step.layers.iter().enumerate() {
                if let Some(&bad) = ids.iter().find(|&&e| e >= self.shape.experts_per_layer) {
                    return Err(TraceError::ExpertOutOfRange {
                        location: format!("{}: step {s} layer {l}", self.name),
                        expert: bad.into(),
                        experts: self.shape.experts_per_layer,
                    });
                }
            }
        }
        if self.lookups() == 0 {
            return Err(TraceError::Empty(format!(
                "{}: {} steps but no expert lookup",
                self.name,
                self.steps.len()
            )));
        }
        let n = self.steps.len() as u64;
        if self.shifts.iter().any(|&s| s >= n) || self.shifts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TraceError::ShapeMismatch(format!(
                "{}: shifts {:?} must increase and lie below the step count {n}",
                self.name, self.shifts
            )));
        }
        Ok(())
    }

    /// Drops the first `n` steps (warm-up); shifts move with the steps, shifts inside the dropped
    /// part disappear.
    pub fn skip_steps(&mut self, n: u64) {
        let n_usize = (n as usize).min(self.steps.len());
        self.steps.drain(..n_usize);
        self.shifts = self
            .shifts
            .iter()
            .filter(|&&s| s >= n && s > 0)
            .map(|&s| s - n)
            .filter(|&s| s > 0)
            .collect();
    }

    /// Joins traces of the same shape end to end; every join becomes a shift (the traffic of
    /// another file is another workload). The name is the parts' names joined with `+`.
    ///
    /// # Errors
    /// [`TraceError::Empty`] for no part, [`TraceError::ShapeMismatch`] when shapes differ or a
    /// part's shifts overflow a `u64` once moved.
    pub fn concat(parts: Vec<Trace>) -> Result<Trace, TraceError> {
        let mut it = parts.into_iter();
        let mut out = it
            .next()
            .ok_or_else(|| TraceError::Empty("no trace given".into()))?;
        for t in it {
            if t.shape != out.shape {
                return Err(TraceError::ShapeMismatch(format!(
                    "{} has shape {:?}, {} has {:?}",
                    out.name, out.shape, t.name, t.shape
                )));
            }
            let base = out.steps.len() as u64;
            let moved = t
                .shifts
                .iter()
                .map(|&s| s.checked_add(base))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    TraceError::ShapeMismatch(format!(
                        "{}: shifts {:?} overflow when joined after {base} steps",
                        t.name, t.shifts
                    ))
                })?;
            out.shifts.push(base);
            out.shifts.extend(moved);
            out.name = format!("{}+{}", out.name, t.name);
            out.steps.extend(t.steps);
        }
        out.shifts.retain(|&s| s > 0);
        out.shifts.dedup();
        Ok(out)
    }
}

/// What a read found besides the steps: the format, rows read and missing, passes dropped,
/// capture rows without a routed expert. The CLI prints it ([`ReadReport::lines`]) and puts it
/// in its JSON report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadReport {
    /// The format read (detected or given).
    pub format: TraceFormat,
    /// Rows read and missing (per-row formats: routing logs, Mixtral, captures, CSV).
    pub rows: rows::RowCounts,
    /// Forward passes found and dropped as dummy or warm-up passes (routing logs).
    pub passes: passes::PassCounts,
    /// Capture rows (one token, one layer) that name no routed expert: all `-1`, or all one id
    /// (the zero-filled rows of dense layers). Skipped.
    pub padding_rows: u64,
    /// Anything else worth saying (how steps were formed, an assumption made).
    pub notes: Vec<String>,
}

impl ReadReport {
    /// A report of `format` with nothing counted.
    pub fn of(format: TraceFormat) -> Self {
        ReadReport {
            format,
            ..ReadReport::default()
        }
    }

    /// Adds another file's counts (the format stays the first file's).
    pub fn absorb(&mut self, other: ReadReport) {
        self.rows.rows += other.rows.rows;
        self.rows.missing_rows += other.rows.missing_rows;
        self.rows.passes_with_missing_rows += other.rows.passes_with_missing_rows;
        self.passes.passes += other.passes.passes;
        self.passes.dropped_identical += other.passes.dropped_identical;
        self.passes.dropped_kind += other.passes.dropped_kind;
        self.padding_rows += other.padding_rows;
        self.notes.extend(other.notes);
    }

    /// Human-readable lines: what was read, what is missing, what was dropped. Empty for a
    /// native trace (binary or JSON lines) read whole.
    pub fn lines(&self) -> Vec<String> {
        let fmt = serde_json::to_value(self.format)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        // Native formats (binary, JSON lines) count no rows: they have nothing to report unless
        // a note or a dropped pass says otherwise.
        let mut out = Vec::new();
        if self.rows.rows > 0 {
            out.push(format!("read as {fmt}: {} rows", self.rows.rows));
        }
        if self.rows.missing_rows > 0 {
            out.push(format!(
                "{} (token, layer) rows missing in {} forward passes: those layers have no \
                 pick from those tokens (counted, not refused)",
                self.rows.missing_rows, self.rows.passes_with_missing_rows
            ));
        } else if self.rows.rows > 0 {
            out.push("no (token, layer) row missing".into());
        }
        let p = &self.passes;
        if p.dropped_identical + p.dropped_kind > 0 {
            out.push(format!(
                "{} of {} forward passes dropped: {} dummy (every row identical), {} of a \
                 non-counted kind (--keep-dummy-passes keeps them)",
                p.dropped_identical + p.dropped_kind,
                p.passes,
                p.dropped_identical,
                p.dropped_kind
            ));
        }
        if self.padding_rows > 0 {
            out.push(format!(
                "{} capture rows name no routed expert (dense layers or padding): skipped",
                self.padding_rows
            ));
        }
        out.extend(self.notes.iter().cloned());
        out
    }
}

/// Reads one trace file in the given (or detected) format, drops `opts.skip_steps` warm-up
/// steps and validates the result ([`Trace::validate`]; its errors name the file).
///
/// # Errors
/// Any [`TraceError`]; [`TraceError::Empty`] when nothing is left after the warm-up.
pub fn read_trace(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    read_trace_report(path, opts).map(|(t, _)| t)
}

/// As [`read_trace`], with the [`ReadReport`] (rows missing, passes dropped, ...).
///
/// # Errors
/// As [`read_trace`].
pub fn read_trace_report(
    path: &Path,
    opts: &ReadOptions,
) -> Result<(Trace, ReadReport), TraceError> {
    let p = path.display().to_string();
    let format = match opts.format {
        TraceFormat::Auto => detect_format(path)?,
        f => f,
    };
    let (mut trace, report) = match format {
        TraceFormat::Binary => {
            let (head, rest) = lines::open_document(path, binary::MAGIC.len())?;
            if head.len() == binary::MAGIC.len() && head != binary::MAGIC {
                return Err(TraceError::BadMagic { path: p });
            }
            let bytes = lines::read_rest(head, rest, &p)?;
            let t = binary::read_binary_bytes(&bytes, &p)?;
            opts.check_shape(&t.shape, &p)?;
            (t, ReadReport::of(format))
        }
        TraceFormat::Json => {
            let (head, rest) = lines::open_document(path, 0)?;
            let reader = std::io::Read::chain(std::io::Cursor::new(head), rest);
            let t: Trace = match serde_json::from_reader(reader) {
                Ok(t) => t,
                Err(e) => return Err(json_trace_error(path, e)),
            };
            opts.check_shape(&t.shape, &p)?;
            (t, ReadReport::of(format))
        }
        TraceFormat::MixtralJsonl => mixtral::read_mixtral_report(path, opts)?,
        TraceFormat::LoggerJsonl => (logger::read_logger(path, opts)?, ReadReport::of(format)),
        TraceFormat::RoutesJsonl => vllm::read_routes(path, opts)?,
        TraceFormat::CaptureJson => capture::read_capture(path, opts)?,
        TraceFormat::RoutingCsv => llamacpp::read_csv(path, opts)?,
        TraceFormat::Auto => unreachable!("resolved above"),
    };
    trace.skip_steps(opts.skip_steps);
    if trace.steps.is_empty() {
        return Err(TraceError::Empty(format!(
            "{p}: no step left after skipping {} warm-up steps",
            opts.skip_steps
        )));
    }
    trace.validate().map_err(|e| e.in_file(&p))?;
    Ok((trace, report))
}

/// The error for a `.json` file that is not a [`Trace`]: the JSON error when the document is
/// not valid JSON, else the top-level keys it has and where such a file is read.
fn json_trace_error(path: &Path, e: serde_json::Error) -> TraceError {
    let p = path.display().to_string();
    let malformed = |e: serde_json::Error| TraceError::Malformed {
        path: p.clone(),
        line: e.line() as u64,
        reason: e.to_string(),
    };
    if e.is_syntax() || e.is_eof() || e.is_io() {
        return malformed(e);
    }
    let keys = lines::open_document(path, 0).ok().and_then(|(head, rest)| {
        let r = std::io::Read::chain(std::io::Cursor::new(head), rest);
        serde_json::from_reader::<_, TopKeys>(r).ok()
    });
    match keys {
        Some(TopKeys(Some(keys))) if !keys.iter().any(|k| k == "steps") => {
            TraceError::UnknownFormat {
                path: p,
                reason: format!(
                    "a JSON object with the top-level keys {keys:?}, not a tierkit trace \
                     (`name`, `shape`, `steps`); a per-request routing capture has \
                     `routed_experts`, `prompt_routed_experts`, `meta_info` or `choices` \
                     (--format capture-json); expert counts (`expert_load_window`, \
                     `logical_count`, an object keyed by layer, ...) are read by `tierkit \
                     experts fit-seed --eplb-counts FILE`"
                ),
            }
        }
        _ => malformed(e),
    }
}

/// The top-level keys of a JSON document (at most 32), or `None` for a document that is not an
/// object. Values are skipped without being held.
struct TopKeys(Option<Vec<String>>);

impl<'de> serde::Deserialize<'de> for TopKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TopKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<TopKeys, A::Error> {
                let mut keys = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    m.next_value::<serde::de::IgnoredAny>()?;
                    if keys.len() < 32 {
                        keys.push(k);
                    }
                }
                Ok(TopKeys(Some(keys)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> Result<TopKeys, A::Error> {
                while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(TopKeys(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads several files (or every `*.jsonl`, `*.tkt`, `*.json` and `*.csv` file of a directory,
/// in name order) with [`read_trace`] and joins them with [`Trace::concat`]: each file boundary
/// is a shift.
///
/// Per-layer routing logs are the exception: when every file is named `…layer{L}.jsonl`
/// ([`vllm::layer_of_file`], e.g. vLLM's `moe_layer{L}.jsonl`) and is a routing log
/// ([`TraceFormat::RoutesJsonl`], detected or given), they are merged pass by pass into ONE
/// trace of `max L + 1` layers ([`vllm::read_routes_files`]), with no shift; a layer without a
/// file has no picks.
///
/// # Errors
/// Any [`TraceError`] of a part; [`TraceError::Empty`] for an empty list or directory.
pub fn read_traces(paths: &[std::path::PathBuf], opts: &ReadOptions) -> Result<Trace, TraceError> {
    read_traces_report(paths, opts).map(|(t, _)| t)
}

/// As [`read_traces`], with the files' [`ReadReport`]s added up.
///
/// # Errors
/// As [`read_traces`].
pub fn read_traces_report(
    paths: &[std::path::PathBuf],
    opts: &ReadOptions,
) -> Result<(Trace, ReadReport), TraceError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let p = path.display().to_string();
            let mut found: Vec<_> = std::fs::read_dir(path)
                .map_err(|e| TraceError::io(&p, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    matches!(
                        f.extension().and_then(|x| x.to_str()),
                        Some("jsonl" | "tkt" | "json" | "csv")
                    )
                })
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(TraceError::Empty(format!(
                    "{p}: no trace file in directory"
                )));
            }
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    if files.len() > 1 && is_per_layer_set(&files, opts)? {
        let (mut t, report) = vllm::read_routes_files(&files, opts)?;
        let name = t.name.clone();
        t.skip_steps(opts.skip_steps);
        if t.steps.is_empty() {
            return Err(TraceError::Empty(format!(
                "{name}: no step left after skipping {} warm-up steps",
                opts.skip_steps
            )));
        }
        t.validate()?;
        return Ok((t, report));
    }
    let mut parts = Vec::with_capacity(files.len());
    let mut report: Option<ReadReport> = None;
    for f in &files {
        let (t, r) = read_trace_report(f, opts)?;
        parts.push(t);
        match &mut report {
            None => report = Some(r),
            Some(acc) => acc.absorb(r),
        }
    }
    let t = Trace::concat(parts)?;
    t.validate()?;
    Ok((t, report.unwrap_or_default()))
}

/// Whether `files` are per-layer routing logs to merge into one trace.
fn is_per_layer_set(files: &[std::path::PathBuf], opts: &ReadOptions) -> Result<bool, TraceError> {
    if !files.iter().all(|f| vllm::layer_of_file(f).is_some()) {
        return Ok(false);
    }
    Ok(match opts.format {
        TraceFormat::RoutesJsonl => true,
        TraceFormat::Auto => detect_format(&files[0])? == TraceFormat::RoutesJsonl,
        _ => false,
    })
}

/// Keys of a capture (vLLM / SGLang per-request routing) at the top of a response.
const CAPTURE_KEYS: [&str; 5] = [
    "routed_experts",
    "prompt_routed_experts",
    "meta_info",
    "choices",
    "outputs",
];

/// Detects the format of a file from its first MiB: binary magic bytes; the `.tkt` extension;
/// `.json` (a tierkit trace, unless the head names capture keys: [`TraceFormat::CaptureJson`]);
/// `.csv` ([`TraceFormat::RoutingCsv`]); then the first non-blank line. A JSON object line:
/// `"type": "meta"`/`"route"` (vLLM routing logger), or a layer field with expert ids under any
/// of [`vllm::ID_FIELDS`] and a position under any of [`vllm::POSITION_FIELDS`] and no
/// `step`/`forward_pass`: [`TraceFormat::RoutesJsonl`]; the same with `problem_id`: Mixtral;
/// ids without a position, or `tierkit_trace`, or `forward_pass_end`: engine logger; capture
/// keys (`routed_experts` as a nested list or base64 string, `meta_info`, `choices`, no layer)
/// or a bare nested array: [`TraceFormat::CaptureJson`]. A line of comma-separated fields with
/// `layer` and `expert` columns, or of integers: [`TraceFormat::RoutingCsv`].
///
/// # Errors
/// [`TraceError::Io`], [`TraceError::UnknownFormat`] (naming the keys found and the ones looked
/// for), [`TraceError::Empty`] for a file of blank lines.
pub fn detect_format(path: &Path) -> Result<TraceFormat, TraceError> {
    use std::io::Read;
    let p = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|e| TraceError::io(&p, e))?;
    // The first line of a JSONL trace is short; 1 MiB is plenty to hold it.
    let mut head = Vec::new();
    f.take(1 << 20)
        .read_to_end(&mut head)
        .map_err(|e| TraceError::io(&p, e))?;
    if head.starts_with(&binary::MAGIC) {
        return Ok(TraceFormat::Binary);
    }
    let text = String::from_utf8_lossy(&head);
    let named = |k: &str| text.contains(&format!("\"{k}\""));
    match path.extension().and_then(|x| x.to_str()) {
        // The binary reader reports the bad magic bytes.
        Some("tkt") => return Ok(TraceFormat::Binary),
        Some("json") => {
            let trace = named("shape") && named("steps");
            let capture =
                CAPTURE_KEYS.iter().any(|k| named(k)) || text.trim_start().starts_with('[');
            return Ok(if capture && !trace {
                TraceFormat::CaptureJson
            } else {
                TraceFormat::Json
            });
        }
        Some("csv") => return Ok(TraceFormat::RoutingCsv),
        _ => {}
    }
    let Some(line) = text.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return Err(TraceError::Empty(format!("{p}: empty file")));
    };
    if line.starts_with('[') {
        return Ok(TraceFormat::CaptureJson);
    }
    if !line.starts_with('{') && llamacpp::looks_like_csv(line) {
        return Ok(TraceFormat::RoutingCsv);
    }
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| TraceError::UnknownFormat {
            path: p.clone(),
            reason: format!("first line is neither a JSON object nor a routing CSV ({e})"),
        })?;
    let has = |k: &str| v.get(k).is_some();
    let typed = matches!(
        v.get("type").and_then(|t| t.as_str()),
        Some("meta" | "route")
    );
    // A per-row record's ids are a flat list; a capture's `routed_experts` is nested or base64.
    let flat_ids = vllm::ID_FIELDS.iter().any(|k| {
        v.get(k).is_some_and(|x| {
            x.as_array()
                .is_some_and(|a| a.iter().all(|e| e.is_number()))
        })
    });
    let layer = vllm::LAYER_FIELDS.iter().any(|k| has(k));
    let position = vllm::POSITION_FIELDS.iter().any(|k| has(k));
    let stepped = has("step") || has("forward_pass");
    if typed || (flat_ids && layer && position && !stepped && !has("problem_id")) {
        Ok(TraceFormat::RoutesJsonl)
    } else if flat_ids && has("problem_id") && has("token_idx") {
        Ok(TraceFormat::MixtralJsonl)
    } else if (flat_ids && layer) || has("tierkit_trace") || has("forward_pass_end") {
        Ok(TraceFormat::LoggerJsonl)
    } else if has("steps") && has("shape") {
        Ok(TraceFormat::Json)
    } else if CAPTURE_KEYS.iter().any(|k| has(k)) && !layer {
        Ok(TraceFormat::CaptureJson)
    } else {
        let keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).take(20).collect())
            .unwrap_or_default();
        Err(TraceError::UnknownFormat {
            path: p,
            reason: format!(
                "the first line has the keys {keys:?}; a routing record needs a layer ({:?}) \
                 and expert ids ({:?}), with a position ({:?}) for a routing log; a capture \
                 needs {CAPTURE_KEYS:?}; a vLLM routing logger line `\"type\": \"meta\"` or \
                 `\"route\"`; give --format",
                vllm::LAYER_FIELDS,
                vllm::ID_FIELDS,
                vllm::POSITION_FIELDS
            ),
        })
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::PathBuf;

    /// A fresh file path in the temp dir, unique per test and process.
    pub fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tierkit-trace-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// `../shared` seen from the repo root, or `None` (with a printed message) when absent.
    pub fn shared_dir(what: &str) -> Option<PathBuf> {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
        if d.join("data/moe").is_dir() {
            Some(d)
        } else {
            println!("SKIP {what}: ../shared/data/moe is absent");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(steps: usize) -> Trace {
        Trace {
            name: "t".into(),
            shape: TraceShape {
                layers: 2,
                experts_per_layer: 4,
                top_k: 2,
            },
            steps: (0..steps)
                .map(|i| StepPicks {
                    layers: vec![vec![0, (i % 4) as u32], vec![1, 2]],
                })
                .collect(),
            shifts: vec![],
        }
    }

    #[test]
    fn validate_catches_bad_ids_and_empty() {
        let mut t = tiny(3);
        t.validate().unwrap();
        t.steps[1].layers[1][0] = 4;
        assert!(matches!(
            t.validate(),
            Err(TraceError::ExpertOutOfRange { expert: 4, .. })
        ));
        let e = tiny(0).validate().unwrap_err();
        assert!(matches!(e, TraceError::Empty(_)), "{e}");
        let mut t = tiny(2);
        for s in &mut t.steps {
            for l in &mut s.layers {
                l.clear();
            }
        }
        assert!(matches!(t.validate(), Err(TraceError::Empty(_))));
        let mut t = tiny(2);
        t.shape.top_k = 5;
        assert!(matches!(t.validate(), Err(TraceError::TopKTooWide { .. })));
    }

    #[test]
    fn concat_and_skip_move_shifts() {
        let mut a = tiny(3);
        a.shifts = vec![1];
        let b = tiny(4);
        let mut c = Trace::concat(vec![a, b]).unwrap();
        assert_eq!(c.steps.len(), 7);
        assert_eq!(c.shifts, vec![1, 3]);
        c.skip_steps(2);
        assert_eq!(c.steps.len(), 5);
        assert_eq!(c.shifts, vec![1]);
        let mut other = tiny(1);
        other.shape.experts_per_layer = 8;
        assert!(matches!(
            Trace::concat(vec![tiny(1), other]),
            Err(TraceError::ShapeMismatch(_))
        ));
    }

    #[test]
    fn huge_shapes_layer_counts_and_shift_overflow_are_typed() {
        let mut t = tiny(1);
        t.shape.experts_per_layer = u32::MAX;
        assert!(matches!(t.validate(), Err(TraceError::TooLarge(_))));
        let mut t = tiny(1);
        t.shape.layers = expert_residency::MAX_LAYERS + 1;
        assert!(matches!(t.shape.validate(), Err(TraceError::TooLarge(_))));
        // A step listing fewer layers than the shape says so in words.
        let mut t = tiny(2);
        t.steps[1].layers.pop();
        let e = t.validate().unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::LayerCountMismatch {
                    found: 1,
                    layers: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("lists 1 layers, the trace shape has 2"),
            "{e}"
        );
        // Shifts that overflow once moved behind the first part.
        let mut b = tiny(2);
        b.shifts = vec![u64::MAX];
        assert!(matches!(
            Trace::concat(vec![tiny(3), b]),
            Err(TraceError::ShapeMismatch(_))
        ));
        // The top-k message reads as a range.
        let mut t = tiny(1);
        t.shape.top_k = 0;
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("top-k 0 is outside the allowed 1..=4"), "{e}");
    }

    #[test]
    fn duplicate_ids_within_a_token_are_rejected() {
        assert!(check_ids(&[1, 2, -1, -1], Some(4), true, "f", 3).is_ok());
        let e = check_ids(&[1, 2, 1], Some(4), false, "f", 3).unwrap_err();
        assert!(
            matches!(&e, TraceError::DuplicateExpert { expert: 1, location } if location == "f:3"),
            "{e}"
        );
        let long: Vec<i64> = (0..40).chain([7]).collect();
        assert!(matches!(
            check_ids(&long, None, false, "f", 1),
            Err(TraceError::DuplicateExpert { expert: 7, .. })
        ));
    }

    #[test]
    fn json_round_trip_and_detection() {
        let t = tiny(3);
        let p = test_util::temp_path("rt.json");
        std::fs::write(&p, serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(detect_format(&p).unwrap(), TraceFormat::Json);
        assert_eq!(read_trace(&p, &ReadOptions::default()).unwrap(), t);
        let p2 = test_util::temp_path("empty.jsonl");
        std::fs::write(&p2, "\n\n").unwrap();
        assert!(matches!(
            read_trace(&p2, &ReadOptions::default()),
            Err(TraceError::Empty(_))
        ));
    }
}
