//! Reading trace files: one file in its (detected) format, or several joined.

use super::{
    binary, capture, detect_format, lines, llamacpp, logger, mixtral, vllm, ReadOptions,
    ReadReport, Trace, TraceError, TraceFormat,
};
use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::test_util::{temp_path, tiny};

    #[test]
    fn json_round_trip_and_detection() {
        let t = tiny(3);
        let p = temp_path("rt.json");
        std::fs::write(&p, serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(detect_format(&p).unwrap(), TraceFormat::Json);
        assert_eq!(read_trace(&p, &ReadOptions::default()).unwrap(), t);
        let p2 = temp_path("empty.jsonl");
        std::fs::write(&p2, "\n\n").unwrap();
        assert!(matches!(
            read_trace(&p2, &ReadOptions::default()),
            Err(TraceError::Empty(_))
        ));
    }
}
