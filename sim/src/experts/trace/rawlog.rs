//! Writes a trace as a raw engine routing log, the way real logs come: a layer-major prefill of
//! a generated prompt, then every decode step at position 0, with a share of the rows dropped at
//! random. The readers must take such a log as it is ([`super::rows`]); tests and the CLI's
//! users make one from real decode traces (the Mixtral logs) to check that they do.
//!
//! Lines: `{"token_pos": p, "layer": l, "experts": [e1, ..., ek]}` (the id and position field
//! names are [`RawLogConfig::id_field`] and [`RawLogConfig::position_field`]). The prompt's
//! tokens are drawn from the trace itself: prompt token `i` routes, in every layer, like a token
//! of a step drawn at random (so its picks have the trace's per-layer popularity and are coherent
//! across layers). A decode step of `b` tokens logs positions `0..b` in every layer.

use super::{StepPicks, Trace, TraceError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Write;

/// How [`write_raw_log`] writes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RawLogConfig {
    /// Prompt tokens of the generated prefill (0: no prefill).
    pub prompt_tokens: u32,
    /// Share of (token, layer) rows dropped at random, in `[0, 1)`. A token never loses its row
    /// in every layer (one row is kept), so every dropped row is one a reader can count.
    pub drop_share: f64,
    /// RNG seed (same seed, same log).
    pub seed: u64,
    /// Name of the expert-id field (`experts`, `topk_ids`, ...).
    pub id_field: String,
    /// Name of the position field (`token_pos`, `token_idx`, `pos`).
    pub position_field: String,
}

impl Default for RawLogConfig {
    fn default() -> Self {
        RawLogConfig {
            prompt_tokens: 135,
            drop_share: 0.03,
            seed: 7,
            id_field: "experts".into(),
            position_field: "token_pos".into(),
        }
    }
}

/// What [`write_raw_log`] wrote: the trace a reader should rebuild and the rows it dropped.
#[derive(Clone, Debug, PartialEq)]
pub struct RawLog {
    /// The steps as a reader rebuilds them: the prefill step (if any), then the decode steps,
    /// without the dropped rows' picks.
    pub expected: Trace,
    /// Rows written.
    pub rows_written: u64,
    /// Rows dropped.
    pub rows_dropped: u64,
    /// Rows the trace itself lacks (a token without picks in a layer, as in the public
    /// Mixtral logs): never written, so a reader counts them missing too.
    pub rows_absent: u64,
}

/// Writes `trace` (its steps are the decode steps; `top_k` ids per token) as a raw routing log
/// to `out` (see the module docs).
///
/// # Errors
/// [`TraceError::InvalidScenario`] for a drop share outside `[0, 1)` or a trace whose steps do
/// not hold whole tokens of `top_k` ids; [`TraceError::Io`] (path `"<writer>"`).
pub fn write_raw_log<W: Write>(
    trace: &Trace,
    cfg: &RawLogConfig,
    mut out: W,
) -> Result<RawLog, TraceError> {
    if !(0.0..1.0).contains(&cfg.drop_share) {
        return Err(TraceError::InvalidScenario(format!(
            "drop share {} is not in [0, 1)",
            cfg.drop_share
        )));
    }
    let k = trace.shape.top_k.max(1) as usize;
    let layers = trace.shape.layers as usize;
    if trace
        .steps
        .iter()
        .flat_map(|s| &s.layers)
        .any(|l| l.len() % k != 0)
    {
        return Err(TraceError::InvalidScenario(format!(
            "{}: a step holds a partial token (picks not a multiple of top-k {k})",
            trace.name
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    // The prompt: each token copies one token of a random step, in every layer.
    let donors = super::prefill::token_donors(&trace.steps, k);
    let token_of = |s: usize, t: usize, l: usize| -> &[u32] {
        trace.steps[s].layers[l]
            .get(t * k..(t + 1) * k)
            .unwrap_or(&[])
    };
    let mut passes: Vec<Vec<Vec<&[u32]>>> = Vec::new(); // pass → token → layer → ids
    if cfg.prompt_tokens > 0 && !donors.is_empty() {
        let prompt = (0..cfg.prompt_tokens)
            .map(|_| {
                let (s, t) = donors[rng.random_range(0..donors.len())];
                (0..layers).map(|l| token_of(s, t, l)).collect()
            })
            .collect();
        passes.push(prompt);
    }
    for (s, st) in trace.steps.iter().enumerate() {
        let tokens = st.layers.iter().map(|l| l.len() / k).max().unwrap_or(0);
        passes.push(
            (0..tokens)
                .map(|t| (0..layers).map(|l| token_of(s, t, l)).collect())
                .collect(),
        );
    }
    let io = |e| TraceError::io("<writer>", e);
    let (mut written, mut dropped, mut absent) = (0u64, 0u64, 0u64);
    let mut steps = Vec::with_capacity(passes.len());
    for pass in &passes {
        // Which (token, layer) rows survive; a token keeps at least one logged row.
        let keep: Vec<Vec<bool>> = pass
            .iter()
            .map(|tok| {
                let mut k: Vec<bool> = tok
                    .iter()
                    .map(|ids| ids.is_empty() || rng.random::<f64>() >= cfg.drop_share)
                    .collect();
                if !k
                    .iter()
                    .zip(tok)
                    .any(|(&kept, ids)| kept && !ids.is_empty())
                {
                    if let Some(first) = tok.iter().position(|ids| !ids.is_empty()) {
                        k[first] = true;
                    }
                }
                k
            })
            .collect();
        let mut step = StepPicks {
            layers: vec![Vec::new(); layers],
        };
        // Layer-major: layer 0's tokens, then layer 1's, ...
        for (l, picks) in step.layers.iter_mut().enumerate() {
            for (p, tok) in pass.iter().enumerate() {
                let ids = tok[l];
                if ids.is_empty() {
                    absent += 1;
                    continue;
                }
                if !keep[p][l] {
                    dropped += 1;
                    continue;
                }
                let list: Vec<String> = ids.iter().map(u32::to_string).collect();
                writeln!(
                    out,
                    "{{\"{}\": {p}, \"layer\": {l}, \"{}\": [{}]}}",
                    cfg.position_field,
                    cfg.id_field,
                    list.join(", ")
                )
                .map_err(io)?;
                written += 1;
                picks.extend_from_slice(ids);
            }
        }
        steps.push(step);
    }
    out.flush().map_err(io)?;
    Ok(RawLog {
        expected: Trace {
            name: trace.name.clone(),
            shape: trace.shape,
            steps,
            shifts: Vec::new(),
        },
        rows_written: written,
        rows_dropped: dropped,
        rows_absent: absent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::{read_trace_report, test_util, ReadOptions, TraceFormat};

    #[test]
    fn a_synthetic_raw_log_reads_back_with_its_drops_counted() {
        let mut cfg = crate::experts::trace::synth::SynthConfig::default_scenario();
        cfg.steps = 30;
        cfg.tokens_per_step = 1;
        cfg.phases.truncate(1);
        let t = crate::experts::trace::synth::generate(&cfg).unwrap();
        let raw = RawLogConfig {
            prompt_tokens: 20,
            drop_share: 0.05,
            ..RawLogConfig::default()
        };
        let p = test_util::temp_path("raw.jsonl");
        let f = std::fs::File::create(&p).unwrap();
        let log = write_raw_log(&t, &raw, std::io::BufWriter::new(f)).unwrap();
        assert!(log.rows_dropped > 0);
        let opts = ReadOptions {
            layers: Some(t.shape.layers),
            experts_per_layer: Some(t.shape.experts_per_layer),
            top_k: Some(t.shape.top_k),
            ..ReadOptions::default()
        };
        let (back, report) = read_trace_report(&p, &opts).unwrap();
        assert_eq!(report.format, TraceFormat::RoutesJsonl);
        assert_eq!(back.steps, log.expected.steps);
        assert_eq!(report.rows.rows, log.rows_written);
        assert_eq!(log.rows_absent, 0);
        assert_eq!(report.rows.missing_rows, log.rows_dropped);
        assert!(write_raw_log(
            &t,
            &RawLogConfig {
                drop_share: 1.0,
                ..raw
            },
            Vec::new()
        )
        .is_err());
    }
}
