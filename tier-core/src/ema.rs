//! Decaying (EMA) counters with a half-life in steps.

use crate::alloc::try_filled;
use crate::error::{CoreError, Result};

/// A table of exponentially decaying counters ("heat"), one `f64` per entry
/// (expert, page, ...).
///
/// [`fold`](Self::fold) decays every value by `0.5^(elapsed_steps /
/// half_life_steps)` and then adds the counts seen in those steps, so a count
/// loses half its weight every `half_life_steps` steps. Both tiers use it:
/// expert pick counts, KV page hits.
///
/// Serde: `{values, half_life_steps}`; on load the table must be non-empty,
/// the half-life finite and `> 0`, and every value finite and `>= 0`
/// ([`CoreError::InvalidCounterValue`] otherwise), as `fold` keeps them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawCounters")]
pub struct DecayingCounters {
    values: Vec<f64>,
    half_life_steps: f64,
}

#[derive(serde::Deserialize)]
struct RawCounters {
    values: Vec<f64>,
    half_life_steps: f64,
}

impl TryFrom<RawCounters> for DecayingCounters {
    type Error = CoreError;
    fn try_from(r: RawCounters) -> Result<Self> {
        if r.values.is_empty() {
            return Err(CoreError::ZeroCapacity);
        }
        check_half_life(r.half_life_steps)?;
        // NaN is not finite either.
        if let Some(i) = r.values.iter().position(|&v| !(v.is_finite() && v >= 0.0)) {
            return Err(CoreError::InvalidCounterValue { index: i as u64 });
        }
        Ok(DecayingCounters {
            values: r.values,
            half_life_steps: r.half_life_steps,
        })
    }
}

fn check_half_life(h: f64) -> Result<()> {
    if h.is_finite() && h > 0.0 {
        Ok(())
    } else {
        Err(CoreError::InvalidHalfLife)
    }
}

impl DecayingCounters {
    /// `len` counters at 0 with the given half-life (steps).
    ///
    /// # Errors
    /// [`CoreError::ZeroCapacity`] if `len == 0`; [`CoreError::InvalidHalfLife`]
    /// if `half_life_steps` is not finite or `<= 0`;
    /// [`CoreError::AllocationFailed`] if `len * 8` bytes cannot be allocated.
    pub fn new(len: usize, half_life_steps: f64) -> Result<Self> {
        if len == 0 {
            return Err(CoreError::ZeroCapacity);
        }
        check_half_life(half_life_steps)?;
        Ok(DecayingCounters {
            values: try_filled(len, 0.0, "decaying counters")?,
            half_life_steps,
        })
    }

    /// Number of counters.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Always false (a table has at least one counter); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The half-life, in steps.
    pub fn half_life_steps(&self) -> f64 {
        self.half_life_steps
    }

    /// Changes the half-life (steps); values are kept.
    ///
    /// # Errors
    /// [`CoreError::InvalidHalfLife`]; the old half-life is kept then.
    pub fn set_half_life(&mut self, half_life_steps: f64) -> Result<()> {
        check_half_life(half_life_steps)?;
        self.half_life_steps = half_life_steps;
        Ok(())
    }

    /// The factor `0.5^(elapsed_steps / half_life_steps)` that `fold` applies.
    pub fn decay_factor(&self, elapsed_steps: u64) -> f64 {
        (-(elapsed_steps as f64) / self.half_life_steps).exp2()
    }

    /// Decays every value by `0.5^(elapsed_steps / half_life)`, then adds
    /// `deltas[i]` (counts seen in those steps). `elapsed_steps == 0` adds
    /// without decay.
    ///
    /// # Errors
    /// [`CoreError::LengthMismatch`] if `deltas.len() != len()`; nothing
    /// changes then.
    pub fn fold(&mut self, deltas: &[u64], elapsed_steps: u64) -> Result<()> {
        if deltas.len() != self.values.len() {
            return Err(CoreError::LengthMismatch {
                expected: self.values.len(),
                actual: deltas.len(),
            });
        }
        let f = self.decay_factor(elapsed_steps);
        for (v, &d) in self.values.iter_mut().zip(deltas) {
            *v = *v * f + d as f64;
        }
        Ok(())
    }

    /// All values (decayed counts).
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// Value `i`, or `None` if out of range.
    pub fn get(&self, i: usize) -> Option<f64> {
        self.values.get(i).copied()
    }

    /// Sets every value to 0 (half-life kept).
    pub fn reset(&mut self) {
        self.values.fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_every_half_life() {
        let mut c = DecayingCounters::new(2, 4.0).unwrap();
        c.fold(&[8, 0], 0).unwrap();
        c.fold(&[0, 1], 4).unwrap();
        assert_eq!(c.values(), &[4.0, 1.0]);
        c.fold(&[0, 0], 8).unwrap();
        assert_eq!(c.get(0), Some(1.0));
        assert_eq!(c.get(2), None);
        c.reset();
        assert_eq!(c.values(), &[0.0, 0.0]);
    }

    #[test]
    fn bad_input() {
        assert_eq!(
            DecayingCounters::new(1, 0.0).unwrap_err(),
            CoreError::InvalidHalfLife
        );
        assert_eq!(
            DecayingCounters::new(1, f64::NAN).unwrap_err(),
            CoreError::InvalidHalfLife
        );
        assert_eq!(
            DecayingCounters::new(0, 1.0).unwrap_err(),
            CoreError::ZeroCapacity
        );
        let mut c = DecayingCounters::new(2, 1.0).unwrap();
        c.fold(&[3, 3], 0).unwrap();
        let before = c.clone();
        assert_eq!(
            c.fold(&[1], 1).unwrap_err(),
            CoreError::LengthMismatch {
                expected: 2,
                actual: 1
            }
        );
        assert_eq!(
            c.set_half_life(-1.0).unwrap_err(),
            CoreError::InvalidHalfLife
        );
        assert_eq!(c, before);
    }

    #[test]
    fn serde_round_trip_validates() {
        let c = DecayingCounters::new(2, 3.0).unwrap();
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<DecayingCounters>(&s).unwrap(), c);
        let bad = r#"{"values":[1.0],"half_life_steps":-2.0}"#;
        assert!(serde_json::from_str::<DecayingCounters>(bad).is_err());
    }

    #[test]
    fn load_rejects_negative_and_non_finite_values() {
        let load = |values: Vec<f64>, half_life_steps: f64| {
            DecayingCounters::try_from(RawCounters {
                values,
                half_life_steps,
            })
        };
        for (values, index) in [
            (vec![-5.0, 1e308], 0),
            (vec![1.0, f64::NAN], 1),
            (vec![0.0, 2.0, f64::INFINITY], 2),
            (vec![f64::NEG_INFINITY], 0),
            (vec![3.0, -f64::MIN_POSITIVE], 1),
        ] {
            assert_eq!(
                load(values, 1.0).unwrap_err(),
                CoreError::InvalidCounterValue { index }
            );
        }
        assert_eq!(load(vec![], 1.0).unwrap_err(), CoreError::ZeroCapacity);
        assert_eq!(
            load(vec![1.0], f64::INFINITY).unwrap_err(),
            CoreError::InvalidHalfLife
        );
        // JSON has no NaN, so the breaker's case is a negative count.
        let negative = r#"{"values":[-5.0, 1e308],"half_life_steps":1.0}"#;
        let err = serde_json::from_str::<DecayingCounters>(negative).unwrap_err();
        assert!(err.to_string().contains("counter 0"), "{err}");
        // Finite, non-negative values (the largest included) load as they are
        // and stay finite through a fold.
        let mut c = load(vec![0.0, f64::MAX], 2.0).unwrap();
        c.fold(&[u64::MAX, u64::MAX], 0).unwrap();
        assert!(c.values().iter().all(|v| v.is_finite()));
    }
}
