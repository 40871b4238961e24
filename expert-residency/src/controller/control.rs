//! Run-time control of the controller: the [`ControlMessage`] an engine or operator sends
//! (freeze / unfreeze, baseline reset), and the counter-reset check of every drain.

use super::Controller;
use crate::config::OnCounterReset;
use crate::counters::{first_backwards_cell, COUNTER_RESET_DELTA};
use crate::error::{ExpertError, Result};

/// A control message, as JSON `{"freeze": false, "baseline": true}` (the published GB300
/// expert-residency recipe's message: after warm-up, take the counter table as the new baseline
/// and start swapping). Absent fields (and `null`) leave that control alone; an unknown field is
/// an error, as in [`crate::ControllerConfig`].
///
/// Applied by [`Controller::apply_control`]: `baseline: true` first
/// ([`Controller::reset_baseline`] with the snapshot given), then `freeze: true`
/// ([`Controller::freeze`]) or `freeze: false` ([`Controller::unfreeze`]).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(remote = "Self")]
#[serde(default, deny_unknown_fields)]
pub struct ControlMessage {
    /// `Some(true)`: freeze the map (counting and draining go on, nothing is swapped; queued
    /// swaps are cancelled). `Some(false)`: unfreeze. `None`: unchanged.
    pub freeze: Option<bool>,
    /// `Some(true)`: baseline reset (forget the EMA, the cold-share window and the shift
    /// detector; the given counter snapshot becomes the reference, so counts before now, such as
    /// warm-up, never reach the EMA). `Some(false)` / `None`: nothing.
    pub baseline: Option<bool>,
}

named_fields!(ControlMessage, "a control message");

impl ControlMessage {
    /// Parses a JSON control message (e.g. `{"freeze": false, "baseline": true}`).
    ///
    /// Errors: [`ExpertError::Format`] for malformed JSON, a wrong type or an unknown field.
    pub fn from_json(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| ExpertError::Format(format!("control message: {e}")))
    }

    /// The message as one line of JSON (absent controls as `null`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a control message serializes")
    }
}

impl Controller {
    /// Applies a [`ControlMessage`]. `snapshot` is the current counter table (`[layers ×
    /// experts]` u32, row-major: [`crate::PickCounters::snapshot`], or a device table drained
    /// just now); it is read only when the message asks for a baseline reset and may be `None`
    /// otherwise.
    ///
    /// Errors (nothing changed): [`ExpertError::BaselineWithoutCounters`] if `baseline` is
    /// `true` and `snapshot` is `None`, [`ExpertError::LengthMismatch`] if it is of the wrong
    /// length.
    pub fn apply_control(&mut self, msg: &ControlMessage, snapshot: Option<&[u32]>) -> Result<()> {
        if msg.baseline == Some(true) {
            let snap = snapshot.ok_or(ExpertError::BaselineWithoutCounters)?;
            // reset_baseline checks the length before changing anything
            self.reset_baseline(snap)?;
        }
        match msg.freeze {
            Some(true) => self.freeze(),
            Some(false) => self.unfreeze(),
            None => {}
        }
        Ok(())
    }

    /// Counter resets found (and re-baselined) by drains so far.
    pub fn counter_resets(&self) -> u64 {
        self.counter_resets
    }

    /// The counter-reset check of a drain of `snap` (length checked by the caller), before any
    /// state changes: `Ok(true)` if the table went backwards and the config re-baselines,
    /// `Ok(false)` if it did not go backwards, [`ExpertError::CounterReset`] under
    /// [`OnCounterReset::Error`].
    pub(super) fn check_counter_reset(&self, snap: &[u32]) -> Result<bool> {
        // Every drain pays this scan: a branch-free pass (the high bit of the wrap-around deltas,
        // OR-ed over a chunk) answers the usual "no"; only a table that went backwards is searched
        // for its first cell.
        if snap.len() == self.prev.len() && !any_backwards(snap, &self.prev) {
            return Ok(false);
        }
        let Some(cell) = first_backwards_cell(snap, &self.prev)? else {
            return Ok(false);
        };
        match self.cfg.on_counter_reset {
            OnCounterReset::Rebaseline => Ok(true),
            OnCounterReset::Error => {
                let experts = self.map.geometry().experts_per_layer as usize;
                Err(ExpertError::CounterReset {
                    layer: (cell / experts) as u32,
                    expert: (cell % experts) as u32,
                    previous: self.prev[cell],
                    current: snap[cell],
                })
            }
        }
    }
}

/// Whether some cell of `new` went backwards from `old` (wrap-around delta ≥
/// [`COUNTER_RESET_DELTA`] = 2^31, i.e. the delta's high bit), as [`first_backwards_cell`] finds,
/// without stopping at each cell (so the loop vectorises).
fn any_backwards(new: &[u32], old: &[u32]) -> bool {
    const _: () = assert!(COUNTER_RESET_DELTA == 1 << 31);
    new.chunks(256).zip(old.chunks(256)).any(|(n, o)| {
        n.iter()
            .zip(o)
            .fold(0u32, |acc, (&n, &o)| acc | n.wrapping_sub(o))
            >= COUNTER_RESET_DELTA
    })
}
