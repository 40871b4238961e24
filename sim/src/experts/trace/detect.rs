//! Trace format detection from a file's first MiB.

use super::{binary, llamacpp, vllm, TraceError, TraceFormat};
use std::path::Path;

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
