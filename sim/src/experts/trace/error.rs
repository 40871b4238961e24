//! [`TraceError`]: everything that can go wrong reading, writing or generating a trace.

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
    pub(super) fn in_file(self, path: &str) -> Self {
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
