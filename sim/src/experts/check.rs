//! A routing trace checked against a geometry before any replay or static map uses it.

use expert_residency::{ExpertError, Geometry, Result};

use crate::experts::trace::Trace;

/// Checks a trace against a geometry: same layers and experts, a valid top-k, at least one step
/// and one lookup, one row per layer in every step, every id in range.
///
/// Errors: [`ExpertError::GeometryMismatch`], [`ExpertError::TopKTooWide`], [`ExpertError::EmptyTrace`],
/// [`ExpertError::LengthMismatch`], [`ExpertError::ExpertOutOfRange`].
pub fn validate_trace(trace: &Trace, geometry: &Geometry) -> Result<u64> {
    geometry.validate()?;
    let s = trace.shape;
    if s.layers != geometry.layers || s.experts_per_layer != geometry.experts_per_layer {
        return Err(ExpertError::GeometryMismatch {
            expected: format!(
                "{} layers × {} experts",
                geometry.layers, geometry.experts_per_layer
            ),
            found: format!(
                "trace {:?}: {} layers × {} experts",
                trace.name, s.layers, s.experts_per_layer
            ),
        });
    }
    geometry.check_top_k(s.top_k)?;
    if trace.steps.is_empty() {
        return Err(ExpertError::EmptyTrace(format!(
            "trace {:?} has no step",
            trace.name
        )));
    }
    let mut lookups = 0u64;
    for step in &trace.steps {
        if step.layers.len() != geometry.layers as usize {
            return Err(ExpertError::LengthMismatch {
                expected: geometry.layers as usize,
                found: step.layers.len(),
            });
        }
        for picks in &step.layers {
            for &e in picks {
                geometry.check_expert(e)?;
            }
            lookups += picks.len() as u64;
        }
    }
    if lookups == 0 {
        return Err(ExpertError::EmptyTrace(format!(
            "trace {:?} has no lookup",
            trace.name
        )));
    }
    Ok(lookups)
}
