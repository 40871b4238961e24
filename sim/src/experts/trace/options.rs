//! What [`read_trace`](super::read_trace) is told: the format, geometry hints, missing rows, warm-up.

use super::{TraceError, TraceShape};

/// Trace file formats [`read_trace`](super::read_trace) understands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// Detect: binary magic bytes, then the `.json` extension, then the keys of the first JSONL line.
    #[default]
    Auto,
    /// tierkit binary trace ([`binary`](super::binary)).
    Binary,
    /// A whole [`Trace`](super::Trace) serialized as one JSON document.
    Json,
    /// Mixtral per-token decode JSONL ([`mixtral`](super::mixtral)).
    MixtralJsonl,
    /// Engine-logger JSONL ([`logger`](super::logger)).
    LoggerJsonl,
    /// Engine routing logs numbering each row inside its forward pass ([`vllm`](super::vllm)): the vLLM
    /// MoE routing logger (`{"type": "route", "token_idx", "layer", "topk_ids"}` after a meta
    /// line) and the raw per-row layout (`token_pos`/`token_idx`/`pos` + `experts`/`topk_ids`/
    /// ...), passes cut by file order ([`rows`](super::rows)).
    RoutesJsonl,
    /// Per-request routing captures returned by vLLM (`--enable-return-routed-experts`) and
    /// SGLang (`return_routed_experts`): JSON or JSONL responses ([`capture`](super::capture)).
    CaptureJson,
    /// llama.cpp's routing-trace CSV (`layer,expert` rows, or `phase,token,layer,rank,expert`)
    /// ([`llamacpp`](super::llamacpp)).
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

/// Options of [`read_trace`](super::read_trace). Geometry hints left `None` come from the file (binary header,
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
    /// ([`passes`](super::passes)); by default they are dropped.
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
