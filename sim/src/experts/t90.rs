//! T90: how many steps a policy takes to recover after a traffic shift (the published recipe's
//! adaptation figure), computed from a per-step cold-share series.

/// T90 of a cold-share series after a shift, with the figures it was computed from.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct T90 {
    /// Step (index into the series) of the shift.
    pub shift_step: u64,
    /// Steady-state cold share the series settles to (mean over the segment's tail).
    pub steady: f64,
    /// Cold-share excess over `steady` just after the shift (mean over the first smoothing window).
    pub initial_excess: f64,
    /// Steps from the shift until the smoothed cold share is within 10% of `initial_excess` above
    /// `steady`; `Some(0)` if there was no excess; `None` if it never got there.
    pub steps: Option<u64>,
    /// `steps × step_time_s`, if a step time was given.
    pub seconds: Option<f64>,
}

/// T90 of `series` (per-step cold share) after the shift at `shift`, over the segment
/// `[shift, end)`:
/// - `steady` = mean of the last `steady_fraction` of the segment (at least one step);
/// - smoothed(t) = mean of `series[t .. t + smooth]` (clipped to the segment);
/// - `initial_excess` = smoothed(shift) − steady;
/// - T90 = the first `t − shift` with smoothed(t) ≤ steady + 0.1 × initial_excess.
///
/// Returns `None` for an empty segment.
pub fn t90(
    series: &[f64],
    shift: usize,
    end: usize,
    steady_fraction: f64,
    smooth: usize,
    step_time_s: Option<f64>,
) -> Option<T90> {
    let end = end.min(series.len());
    if shift >= end {
        return None;
    }
    let seg = &series[shift..end];
    let tail = ((seg.len() as f64 * steady_fraction).ceil() as usize).clamp(1, seg.len());
    let steady = mean(&seg[seg.len() - tail..]);
    let smooth = smooth.max(1);
    // Prefix sums for O(1) window means.
    let mut prefix = Vec::with_capacity(seg.len() + 1);
    prefix.push(0.0);
    for &x in seg {
        prefix.push(prefix.last().copied().unwrap_or(0.0) + x);
    }
    let win = |t: usize| {
        let b = (t + smooth).min(seg.len());
        (prefix[b] - prefix[t]) / (b - t) as f64
    };
    let initial_excess = win(0) - steady;
    let steps = if initial_excess <= 1e-9 {
        Some(0)
    } else {
        let target = steady + 0.1 * initial_excess;
        (0..seg.len()).find(|&t| win(t) <= target).map(|t| t as u64)
    };
    Some(T90 {
        shift_step: shift as u64,
        steady,
        initial_excess,
        steps,
        seconds: match (steps, step_time_s) {
            (Some(s), Some(dt)) => Some(s as f64 * dt),
            _ => None,
        },
    })
}

pub(crate) fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t90_of_exponential_decay() {
        // Cold share 0.1 before, jumps to 0.6 at 100, decays to 0.2 with time constant 50 steps.
        let mut s = vec![0.1; 100];
        for t in 0..2000 {
            s.push(0.2 + 0.4 * (-(t as f64) / 50.0).exp());
        }
        let r = t90(&s, 100, s.len(), 0.25, 1, Some(0.02)).unwrap();
        assert!((r.steady - 0.2).abs() < 1e-6);
        assert!((r.initial_excess - 0.4).abs() < 1e-6);
        // exp(-t/50) = 0.1 at t = 50 ln 10 = 115.1
        assert_eq!(r.steps, Some(116));
        assert!((r.seconds.unwrap() - 2.32).abs() < 1e-9);
        let flat = vec![0.3; 50];
        assert_eq!(t90(&flat, 10, 50, 0.25, 8, None).unwrap().steps, Some(0));
        assert!(t90(&flat, 50, 50, 0.25, 8, None).is_none());
    }
}
