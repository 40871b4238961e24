//! Touched steps from pick counts: the heat in the unit the link pays for, estimated from a
//! drain interval's pick deltas alone (so host counters and GPU-drained snapshots give the same).
//!
//! Over an interval of `n` steps an expert with `d` picks has `λ = d / n` picks per step. Each
//! token picks an expert at most once, so with `T` tokens per step the chance that a step touches
//! the expert is `τ = 1 − (1 − λ/T)^T` (independent tokens). `T` is not in the counts; it is
//! estimated as `max(1, max_e λ_e)` (a lower bound: exact at batch 1, where `τ = λ`; at large
//! batches `τ` tends to `1 − e^{−λ}` either way, and a low `T` overestimates `τ` by at most a
//! few points). The interval contributes `n · τ` touched steps.

/// `τ = 1 − (1 − λ/T)^T` for `λ ≥ 0`, `T ≥ 1` (clamped to `[0, 1]`), to ~1e-6.
#[cfg(test)]
fn touch_prob(lambda: f64, tokens: f64) -> f64 {
    touch_prob_inv(lambda, tokens, 1.0 / tokens)
}

/// [`touch_prob`] with `1 / tokens` precomputed (the drain's inner loop).
#[inline]
pub(super) fn touch_prob_inv(lambda: f64, tokens: f64, inv_tokens: f64) -> f64 {
    if lambda <= 0.0 {
        return 0.0;
    }
    if tokens <= 1.0 {
        return lambda.min(1.0);
    }
    let q = lambda * inv_tokens;
    if q >= 1.0 {
        return 1.0;
    }
    // −T ln(1 − q) = λ · (1 + q/2 + q²/3 + …): the series for small q, ln_1p beyond.
    let y = if q <= 0.25 {
        lambda * (1.0 + q * (0.5 + q * (1.0 / 3.0 + q * (0.25 + q * (0.2 + q * (1.0 / 6.0))))))
    } else {
        -tokens * (-q).ln_1p()
    };
    1.0 - exp_neg(y)
}

/// `e^{−y}` for `y ≥ 0`, relative error below 1e-7 (a bit-level `2^x` with a degree-7
/// polynomial: a drain evaluates it once per touched cell and `exp` would dominate the drain).
#[inline]
pub(super) fn exp_neg(y: f64) -> f64 {
    let x = -y * std::f64::consts::LOG2_E;
    if x < -1000.0 || x.is_nan() {
        return 0.0;
    }
    // Round to nearest by a truncating cast (one instruction; `f64::round` is a libm call on
    // baseline x86-64): x ≤ 0, so trunc(x − 0.5) = ceil(x − 0.5) and r = x − i ∈ (−0.5, 0.5].
    let i = (x - 0.5) as i64;
    let r = x - i as f64;
    // 2^r on [-0.5, 0.5]: Taylor of e^{r ln 2} to degree 7 (error < 1e-8 relative).
    let t = r * std::f64::consts::LN_2;
    let p = 1.0
        + t * (1.0
            + t * (0.5
                + t * (1.0 / 6.0
                    + t * (1.0 / 24.0 + t * (1.0 / 120.0 + t * (1.0 / 720.0 + t / 5040.0))))));
    let e = i + 1023;
    if e <= 0 {
        return 0.0;
    }
    p * f64::from_bits((e as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_probability_matches_the_closed_form() {
        assert_eq!(touch_prob(0.0, 5.0), 0.0);
        assert_eq!(touch_prob(0.3, 1.0), 0.3);
        assert_eq!(touch_prob(2.0, 2.0), 1.0);
        for &t in &[2.0, 7.0, 32.0, 256.0, 4096.0] {
            for k in 1..200 {
                let lambda = t * k as f64 / 200.0;
                let exact = 1.0 - (1.0 - lambda / t).powf(t);
                let got = touch_prob(lambda, t);
                assert!(
                    (got - exact).abs() < 1e-4,
                    "λ {lambda} T {t}: {got} vs {exact}"
                );
            }
        }
        for y in [0.0, 1e-9, 0.5, 1.0, 3.3, 20.0, 700.0] {
            let (a, b) = (exp_neg(y), (-y).exp());
            assert!((a - b).abs() <= 1e-7 * b + 1e-300, "{y}: {a} vs {b}");
        }
        assert_eq!(exp_neg(1e6), 0.0);
        assert_eq!(exp_neg(f64::NAN), 0.0);
    }
}
