//! [`ReadReport`]: what a read found besides the steps.

use super::{passes, rows, TraceFormat};

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
