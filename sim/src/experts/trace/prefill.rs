//! A synthetic prefill in front of a decode trace: what a real serving log holds before its
//! decode steps (a prompt's tokens in one forward pass), for decode-only logs such as the public
//! Mixtral ones.
//!
//! Each segment of the trace (from its start or a shift to the next shift: one request, one log
//! file of a joined directory) gets one prefill step of `prompt_tokens` tokens in front. Prompt
//! token `i` routes, in every layer, like a token of a step of that segment drawn at random, so
//! the prefill has the segment's per-layer popularity and is coherent across layers (the same
//! drawing as [`super::rawlog`]'s generated prompt). A prefill of 135 tokens at top-2 gives 270
//! picks per layer in one step, against ~2 per decode step: a policy that counts picks sees the
//! prompt outweigh a hundred decode steps, while the link pays for it once (one step).
//!
//! The prefill step starts its segment: a shift at decode step `s` moves to the index of the
//! prefill in front of it. `StepPicks` carry no pass kind, so the replay feeds the prefill to the
//! controller as any other step, as an engine that counts every pass would.

use super::{StepPicks, Trace, TraceError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Most prompt tokens per prefill step (a long-context prompt; bounds the step's size).
pub const MAX_PREFILL_TOKENS: u32 = 1 << 17;

/// `trace` with a prefill step of `prompt_tokens` tokens in front of each segment (see the module
/// docs), drawn with `seed` (same seed, same trace). `prompt_tokens` 0 returns the trace as it is.
///
/// The trace's steps must hold whole tokens (`top_k` ids each, as every reader and the generator
/// give); a segment with no routed token gets no prefill.
///
/// # Errors
/// [`TraceError::InvalidScenario`] for more than [`MAX_PREFILL_TOKENS`] prompt tokens or a step
/// holding a partial token.
pub fn with_prefill(trace: &Trace, prompt_tokens: u32, seed: u64) -> Result<Trace, TraceError> {
    if prompt_tokens > MAX_PREFILL_TOKENS {
        return Err(TraceError::InvalidScenario(format!(
            "a prefill of {prompt_tokens} tokens is above the bound of {MAX_PREFILL_TOKENS}"
        )));
    }
    let k = trace.shape.top_k.max(1) as usize;
    if let Some(s) = trace
        .steps
        .iter()
        .position(|s| s.layers.iter().any(|l| l.len() % k != 0))
    {
        return Err(TraceError::InvalidScenario(format!(
            "{}: step {s} holds a partial token (picks not a multiple of top-k {k})",
            trace.name
        )));
    }
    if prompt_tokens == 0 {
        return Ok(trace.clone());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = trace.steps.len();
    let mut bounds: Vec<usize> = std::iter::once(0)
        .chain(trace.shifts.iter().map(|&s| s as usize).filter(|&s| s < n))
        .collect();
    bounds.push(n);
    let mut steps = Vec::with_capacity(n + bounds.len());
    let mut shifts = Vec::new();
    for w in bounds.windows(2) {
        let seg = &trace.steps[w[0]..w[1]];
        if w[0] > 0 {
            shifts.push(steps.len() as u64);
        }
        if let Some(p) = prompt(seg, trace.shape.layers as usize, k, prompt_tokens, &mut rng) {
            steps.push(p);
        }
        steps.extend_from_slice(seg);
    }
    Ok(Trace {
        name: format!("{}+prefill{prompt_tokens}", trace.name),
        shape: trace.shape,
        steps,
        shifts,
    })
}

/// Every token of `steps` as (step, token) (a step's tokens: its fullest layer's picks over
/// `k`): what a generated prompt token copies, here and in [`super::rawlog`].
pub(super) fn token_donors(steps: &[StepPicks], k: usize) -> Vec<(usize, usize)> {
    steps
        .iter()
        .enumerate()
        .flat_map(|(s, st)| {
            let t = st.layers.iter().map(|l| l.len() / k).max().unwrap_or(0);
            (0..t).map(move |t| (s, t))
        })
        .collect()
}

/// One prefill step of `tokens` tokens, each a copy (in every layer) of a token of `seg` drawn
/// at random; `None` if `seg` routes no token.
fn prompt(
    seg: &[StepPicks],
    layers: usize,
    k: usize,
    tokens: u32,
    rng: &mut ChaCha8Rng,
) -> Option<StepPicks> {
    let donors = token_donors(seg, k);
    if donors.is_empty() {
        return None;
    }
    let mut step = StepPicks {
        layers: vec![Vec::with_capacity(tokens as usize * k); layers],
    };
    for _ in 0..tokens {
        let (s, t) = donors[rng.random_range(0..donors.len())];
        for (l, out) in step.layers.iter_mut().enumerate() {
            if let Some(ids) = seg[s].layers.get(l).and_then(|x| x.get(t * k..(t + 1) * k)) {
                out.extend_from_slice(ids);
            }
        }
    }
    Some(step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::TraceShape;

    fn decode_trace() -> Trace {
        // 2 layers × 4 experts, top-2, batch 1; a shift at step 3. Segment 0 uses experts 0/1
        // only, segment 1 experts 2/3 only.
        let step = |a: u32| StepPicks {
            layers: vec![vec![a, a + 1], vec![a + 1, a]],
        };
        Trace {
            name: "t".into(),
            shape: TraceShape {
                layers: 2,
                experts_per_layer: 4,
                top_k: 2,
            },
            steps: vec![step(0), step(0), step(0), step(2), step(2)],
            shifts: vec![3],
        }
    }

    #[test]
    fn a_prefill_step_starts_each_segment_with_its_own_popularity() {
        let t = decode_trace();
        let p = with_prefill(&t, 7, 1).unwrap();
        p.validate().unwrap();
        assert_eq!(p.steps.len(), 7);
        assert_eq!(p.shifts, vec![4], "the shift moves to the second prefill");
        assert_eq!(p.name, "t+prefill7");
        for (i, seg) in [(0usize, 0u32), (4, 2)] {
            let pre = &p.steps[i];
            for l in &pre.layers {
                assert_eq!(l.len(), 14, "7 tokens × top-2 in every layer");
                assert!(l.iter().all(|&e| e == seg || e == seg + 1), "{l:?}");
            }
        }
        // The decode steps follow unchanged.
        assert_eq!(&p.steps[1..4], &t.steps[0..3]);
        assert_eq!(&p.steps[5..], &t.steps[3..]);
        // Same seed, same trace; 0 tokens: unchanged.
        assert_eq!(with_prefill(&t, 7, 1).unwrap(), p);
        assert_eq!(with_prefill(&t, 0, 1).unwrap(), t);
    }

    #[test]
    fn bad_input_is_refused() {
        let t = decode_trace();
        assert!(with_prefill(&t, MAX_PREFILL_TOKENS + 1, 1).is_err());
        let mut partial = t.clone();
        partial.steps[1].layers[0].pop();
        let e = with_prefill(&partial, 3, 1).unwrap_err().to_string();
        assert!(e.contains("step 1"), "{e}");
    }
}
