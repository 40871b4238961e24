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

mod detect;
mod error;
mod model;
mod options;
mod parse;
mod read;
mod report;

pub use detect::detect_format;
pub use error::TraceError;
pub use expert_residency::StepPicks;
pub use model::{Trace, TraceShape};
pub use options::{MissingRows, ReadOptions, TraceFormat};
pub(crate) use parse::{check_ids, jsonl_lines};
pub use read::{read_trace, read_trace_report, read_traces, read_traces_report};
pub use report::ReadReport;

#[cfg(test)]
pub(crate) mod test_util {
    use super::{StepPicks, Trace, TraceShape};
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

    /// A tiny valid trace: 2 layers × 4 experts, top-2, `steps` steps, no shift.
    pub fn tiny(steps: usize) -> Trace {
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
}
