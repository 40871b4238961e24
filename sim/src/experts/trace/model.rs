//! A trace in memory: [`Trace`] and its [`TraceShape`], their checks, joins and warm-up cuts.

use super::{StepPicks, TraceError};

/// The shape a trace claims for itself (checked against a [`expert_residency::Geometry`] before a replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceShape {
    /// MoE layers per step.
    pub layers: u32,
    /// Experts per layer (every id in the trace is below this).
    pub experts_per_layer: u32,
    /// Experts picked per routed token (top-k).
    pub top_k: u32,
}

/// A whole routing trace held in memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    /// A short name (file stem, or scenario name for synthetic traces).
    pub name: String,
    /// The trace's shape.
    pub shape: TraceShape,
    /// The steps, in order.
    pub steps: Vec<StepPicks>,
    /// Step indices at which the traffic is known to shift (synthetic domain shifts); empty for
    /// real traces unless given.
    pub shifts: Vec<u64>,
}

impl TraceShape {
    /// Checks the shape itself: non-zero layers and experts, `1 <= top_k <= experts_per_layer`,
    /// and the bounds of [`expert_residency::Geometry`]: `layers ≤` [`expert_residency::MAX_LAYERS`],
    /// `experts_per_layer ≤` [`expert_residency::MAX_EXPERTS_PER_LAYER`], `layers × experts_per_layer ≤`
    /// [`expert_residency::MAX_CELLS`] (so a tiny file cannot make a reader allocate per-cell tables of
    /// gigabytes).
    ///
    /// # Errors
    /// [`TraceError::ShapeMismatch`] for zero fields, [`TraceError::TooLarge`] above the bounds,
    /// [`TraceError::TopKTooWide`] for a top-k of zero or above the experts per layer.
    pub fn validate(&self) -> Result<(), TraceError> {
        if self.layers == 0 || self.experts_per_layer == 0 {
            return Err(TraceError::ShapeMismatch(format!(
                "layers ({}) and experts_per_layer ({}) must be non-zero",
                self.layers, self.experts_per_layer
            )));
        }
        expert_residency::Geometry::check_shape(self.layers, self.experts_per_layer)
            .map_err(|e| TraceError::TooLarge(format!("trace shape: {e}")))?;
        if self.top_k == 0 || self.top_k > self.experts_per_layer {
            return Err(TraceError::TopKTooWide {
                location: "trace shape".into(),
                found: self.top_k.into(),
                allowed: self.experts_per_layer,
            });
        }
        Ok(())
    }
}

impl Trace {
    /// Total expert lookups (picks) over all steps and layers.
    pub fn lookups(&self) -> u64 {
        self.steps
            .iter()
            .flat_map(|s| s.layers.iter())
            .map(|l| l.len() as u64)
            .sum()
    }

    /// Checks the whole trace against its own shape: at least one step and one lookup, every step
    /// with `shape.layers` layers, every id below `experts_per_layer`, shifts inside the trace and
    /// increasing.
    ///
    /// # Errors
    /// [`TraceError::Empty`], [`TraceError::LayerCountMismatch`] (a step with the wrong number of
    /// layers), [`TraceError::ExpertOutOfRange`], [`TraceError::TopKTooWide`],
    /// [`TraceError::ShapeMismatch`] (shifts).
    pub fn validate(&self) -> Result<(), TraceError> {
        self.shape.validate()?;
        if self.steps.is_empty() {
            return Err(TraceError::Empty(format!("{}: no step", self.name)));
        }
        for (s, step) in self.steps.iter().enumerate() {
            if step.layers.len() != self.shape.layers as usize {
                return Err(TraceError::LayerCountMismatch {
                    location: format!("{}: step {s}", self.name),
                    found: step.layers.len() as u64,
                    layers: self.shape.layers,
                });
            }
            for (l, ids) in step.layers.iter().enumerate() {
                if let Some(&bad) = ids.iter().find(|&&e| e >= self.shape.experts_per_layer) {
                    return Err(TraceError::ExpertOutOfRange {
                        location: format!("{}: step {s} layer {l}", self.name),
                        expert: bad.into(),
                        experts: self.shape.experts_per_layer,
                    });
                }
            }
        }
        if self.lookups() == 0 {
            return Err(TraceError::Empty(format!(
                "{}: {} steps but no expert lookup",
                self.name,
                self.steps.len()
            )));
        }
        let n = self.steps.len() as u64;
        if self.shifts.iter().any(|&s| s >= n) || self.shifts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TraceError::ShapeMismatch(format!(
                "{}: shifts {:?} must increase and lie below the step count {n}",
                self.name, self.shifts
            )));
        }
        Ok(())
    }

    /// Drops the first `n` steps (warm-up); shifts move with the steps, shifts inside the dropped
    /// part disappear.
    pub fn skip_steps(&mut self, n: u64) {
        let n_usize = (n as usize).min(self.steps.len());
        self.steps.drain(..n_usize);
        self.shifts = self
            .shifts
            .iter()
            .filter(|&&s| s >= n && s > 0)
            .map(|&s| s - n)
            .filter(|&s| s > 0)
            .collect();
    }

    /// Joins traces of the same shape end to end; every join becomes a shift (the traffic of
    /// another file is another workload). The name is the parts' names joined with `+`.
    ///
    /// # Errors
    /// [`TraceError::Empty`] for no part, [`TraceError::ShapeMismatch`] when shapes differ or a
    /// part's shifts overflow a `u64` once moved.
    pub fn concat(parts: Vec<Trace>) -> Result<Trace, TraceError> {
        let mut it = parts.into_iter();
        let mut out = it
            .next()
            .ok_or_else(|| TraceError::Empty("no trace given".into()))?;
        for t in it {
            if t.shape != out.shape {
                return Err(TraceError::ShapeMismatch(format!(
                    "{} has shape {:?}, {} has {:?}",
                    out.name, out.shape, t.name, t.shape
                )));
            }
            let base = out.steps.len() as u64;
            let moved = t
                .shifts
                .iter()
                .map(|&s| s.checked_add(base))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    TraceError::ShapeMismatch(format!(
                        "{}: shifts {:?} overflow when joined after {base} steps",
                        t.name, t.shifts
                    ))
                })?;
            out.shifts.push(base);
            out.shifts.extend(moved);
            out.name = format!("{}+{}", out.name, t.name);
            out.steps.extend(t.steps);
        }
        out.shifts.retain(|&s| s > 0);
        out.shifts.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::test_util::tiny;

    #[test]
    fn validate_catches_bad_ids_and_empty() {
        let mut t = tiny(3);
        t.validate().unwrap();
        t.steps[1].layers[1][0] = 4;
        assert!(matches!(
            t.validate(),
            Err(TraceError::ExpertOutOfRange { expert: 4, .. })
        ));
        let e = tiny(0).validate().unwrap_err();
        assert!(matches!(e, TraceError::Empty(_)), "{e}");
        let mut t = tiny(2);
        for s in &mut t.steps {
            for l in &mut s.layers {
                l.clear();
            }
        }
        assert!(matches!(t.validate(), Err(TraceError::Empty(_))));
        let mut t = tiny(2);
        t.shape.top_k = 5;
        assert!(matches!(t.validate(), Err(TraceError::TopKTooWide { .. })));
    }

    #[test]
    fn concat_and_skip_move_shifts() {
        let mut a = tiny(3);
        a.shifts = vec![1];
        let b = tiny(4);
        let mut c = Trace::concat(vec![a, b]).unwrap();
        assert_eq!(c.steps.len(), 7);
        assert_eq!(c.shifts, vec![1, 3]);
        c.skip_steps(2);
        assert_eq!(c.steps.len(), 5);
        assert_eq!(c.shifts, vec![1]);
        let mut other = tiny(1);
        other.shape.experts_per_layer = 8;
        assert!(matches!(
            Trace::concat(vec![tiny(1), other]),
            Err(TraceError::ShapeMismatch(_))
        ));
    }

    #[test]
    fn huge_shapes_layer_counts_and_shift_overflow_are_typed() {
        let mut t = tiny(1);
        t.shape.experts_per_layer = u32::MAX;
        assert!(matches!(t.validate(), Err(TraceError::TooLarge(_))));
        let mut t = tiny(1);
        t.shape.layers = expert_residency::MAX_LAYERS + 1;
        assert!(matches!(t.shape.validate(), Err(TraceError::TooLarge(_))));
        // A step listing fewer layers than the shape says so in words.
        let mut t = tiny(2);
        t.steps[1].layers.pop();
        let e = t.validate().unwrap_err();
        assert!(
            matches!(
                e,
                TraceError::LayerCountMismatch {
                    found: 1,
                    layers: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("lists 1 layers, the trace shape has 2"),
            "{e}"
        );
        // Shifts that overflow once moved behind the first part.
        let mut b = tiny(2);
        b.shifts = vec![u64::MAX];
        assert!(matches!(
            Trace::concat(vec![tiny(3), b]),
            Err(TraceError::ShapeMismatch(_))
        ));
        // The top-k message reads as a range.
        let mut t = tiny(1);
        t.shape.top_k = 0;
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("top-k 0 is outside the allowed 1..=4"), "{e}");
    }
}
