//! Controller configuration: drain cadence, EMA half-life, the ratio, swap caps and the shift
//! response.

use crate::error::{ExpertError, Result};

/// How the controller counts, decays and swaps. [`Default`] gives the seed defaults of the issue:
/// drain every 64 steps, EMA half-life 500 steps, ratio 1.5, 2 swaps per layer per drain, 8 swaps
/// begun per step, no shift response.
/// Missing fields take their defaults when deserialized; an unknown field is an error (a typo
/// must not silently fall back to a default).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Steps between drains (≥ 1).
    pub drain_every: u32,
    /// EMA half-life of pick counts, in steps (finite, > 0).
    pub half_life_steps: f64,
    /// A cold expert replaces a hot one only if its EMA is at least `ratio` times the hot one's
    /// (≥ 1, finite): hysteresis against churn. The knob of [`crate::RatioPolicy`] (the policy of
    /// [`crate::Controller::new`]); unused by other policies.
    pub ratio: f64,
    /// Swaps planned per layer per drain (≥ 1).
    pub max_swaps_per_layer: u32,
    /// Swaps begun per step, all layers together (≥ 1): bounds the copy traffic per step.
    pub max_swaps_per_step: u32,
    /// Sliding window of the cold-share telemetry, in drains (`1..=`[`MAX_WINDOW_DRAINS`]).
    pub window_drains: u32,
    /// Optional response to a traffic shift (tierkit's extension beyond the seed policy).
    pub shift_response: Option<ShiftResponse>,
    /// Start frozen ([`crate::Controller::freeze`]): counting and draining go on, nothing is
    /// swapped until a [`crate::ControlMessage`] `{"freeze": false}` (or
    /// [`crate::Controller::unfreeze`]). For engines whose warm-up and graph capture run
    /// through the controller: boot frozen, then send `{"freeze": false, "baseline": true}`
    /// when serving starts (the published GB300 recipe's control message). Default false.
    pub boot_frozen: bool,
    /// What a drain does when the counter table went backwards (a device table re-created or
    /// zeroed under the controller would otherwise read as ~2^32 phantom picks per cell):
    /// re-baseline (default) or a typed error. See [`OnCounterReset`].
    pub on_counter_reset: OnCounterReset,
}

/// What a drain does with a counter snapshot in which some cell is below the previous snapshot
/// (wrap-around delta ≥ [`crate::COUNTER_RESET_DELTA`]). JSON: `"rebaseline"` / `"error"`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum OnCounterReset {
    /// Take the snapshot as the new reference and drop the interval (no picks folded, nothing
    /// planned; the EMA and the map are kept); counted in
    /// [`DrainTelemetry::counter_resets`](crate::DrainTelemetry::counter_resets). The engine
    /// needs to do nothing: at most one drain interval of counts is lost.
    #[default]
    Rebaseline,
    /// Refuse the drain with [`crate::ExpertError::CounterReset`], changing nothing; the engine
    /// calls [`crate::Controller::reset_baseline`] with the new table.
    Error,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            drain_every: 64,
            half_life_steps: 500.0,
            ratio: 1.5,
            max_swaps_per_layer: 2,
            max_swaps_per_step: 8,
            window_drains: 8,
            shift_response: None,
            boot_frozen: false,
            on_counter_reset: OnCounterReset::Rebaseline,
        }
    }
}

/// Shift response: a cold-share jump detector that, for a while, shortens the EMA half-life and
/// raises the per-layer swap cap so the hot set follows new traffic faster (per-step cap unchanged).
///
/// At each drain the interval's cold share `c` is compared with a baseline (an EMA of past drains'
/// cold shares, half-life `baseline_half_life_drains`): a jump is `c ≥ jump_ratio × baseline` and
/// `c ≥ baseline + jump_min`. A jump decays the EMA as if `forget_steps` more steps had passed (at
/// the boosted half-life) and boosts for `boost_drains` drains (a new jump re-arms it); then the
/// normal half-life and cap come back.
/// Missing fields take their defaults when deserialized; an unknown field is an error.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShiftResponse {
    /// Relative jump over the baseline that counts as a shift (> 1).
    pub jump_ratio: f64,
    /// Absolute jump over the baseline (cold-share points, 0..1) that counts as a shift.
    pub jump_min: f64,
    /// Half-life of the cold-share baseline, in drains (> 0).
    pub baseline_half_life_drains: f64,
    /// EMA half-life while boosted, in steps (> 0).
    pub boost_half_life_steps: f64,
    /// Swaps planned per layer per drain while boosted (≥ 1).
    pub boost_swaps_per_layer: u32,
    /// Drains the boost lasts after the last jump (≥ 1).
    pub boost_drains: u32,
    /// Extra steps of decay applied to the EMA when a jump is detected (0 keeps the history;
    /// 200 at a 100-step half-life scales it by 1/4).
    pub forget_steps: u64,
}

impl Default for ShiftResponse {
    fn default() -> Self {
        ShiftResponse {
            jump_ratio: 1.3,
            jump_min: 0.04,
            baseline_half_life_drains: 4.0,
            boost_half_life_steps: 100.0,
            boost_swaps_per_layer: 8,
            boost_drains: 12,
            forget_steps: 200,
        }
    }
}

/// Largest [`ControllerConfig::window_drains`] (1,024 drains: 65,536 steps at the default
/// cadence). The controller keeps `layers × window_drains` window cells.
pub const MAX_WINDOW_DRAINS: u32 = 1024;

fn bad(msg: String) -> ExpertError {
    ExpertError::InvalidConfig(msg)
}

fn positive(name: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(format!("{name} must be finite and > 0, got {v}")))
    }
}

impl ControllerConfig {
    /// Checks every field. Errors: [`ExpertError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.drain_every == 0 {
            return Err(bad("drain_every must be ≥ 1".into()));
        }
        positive("half_life_steps", self.half_life_steps)?;
        if !(self.ratio.is_finite() && self.ratio >= 1.0) {
            return Err(bad(format!(
                "ratio must be finite and ≥ 1, got {}",
                self.ratio
            )));
        }
        if self.max_swaps_per_layer == 0 || self.max_swaps_per_step == 0 {
            return Err(bad("swap caps must be ≥ 1".into()));
        }
        if self.window_drains == 0 || self.window_drains > MAX_WINDOW_DRAINS {
            return Err(bad(format!(
                "window_drains must be in 1..={MAX_WINDOW_DRAINS}, got {}",
                self.window_drains
            )));
        }
        if let Some(s) = &self.shift_response {
            if !(s.jump_ratio.is_finite() && s.jump_ratio > 1.0) {
                return Err(bad(format!("jump_ratio must be > 1, got {}", s.jump_ratio)));
            }
            if !(s.jump_min.is_finite() && (0.0..1.0).contains(&s.jump_min)) {
                return Err(bad(format!(
                    "jump_min must be in [0, 1), got {}",
                    s.jump_min
                )));
            }
            positive("baseline_half_life_drains", s.baseline_half_life_drains)?;
            positive("boost_half_life_steps", s.boost_half_life_steps)?;
            if s.boost_swaps_per_layer == 0 || s.boost_drains == 0 {
                return Err(bad(
                    "boost_swaps_per_layer and boost_drains must be ≥ 1".into()
                ));
            }
        }
        Ok(())
    }

    /// The defaults with the default [`ShiftResponse`] switched on.
    pub fn with_shift_response() -> Self {
        ControllerConfig {
            shift_response: Some(ShiftResponse::default()),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_json_takes_defaults_and_validation_names_fields() {
        let c: ControllerConfig =
            serde_json::from_str(r#"{"drain_every": 32, "shift_response": {"jump_ratio": 2.0}}"#)
                .unwrap();
        assert_eq!(c.drain_every, 32);
        assert_eq!(c.half_life_steps, 500.0);
        let sr = c.shift_response.clone().unwrap();
        assert_eq!((sr.jump_ratio, sr.boost_drains), (2.0, 12));
        c.validate().unwrap();
        for bad in [
            ControllerConfig {
                drain_every: 0,
                ..ControllerConfig::default()
            },
            ControllerConfig {
                half_life_steps: f64::NAN,
                ..ControllerConfig::default()
            },
            ControllerConfig {
                max_swaps_per_step: 0,
                ..ControllerConfig::default()
            },
            ControllerConfig {
                shift_response: Some(ShiftResponse {
                    jump_ratio: 1.0,
                    ..ShiftResponse::default()
                }),
                ..ControllerConfig::default()
            },
        ] {
            assert!(matches!(bad.validate(), Err(ExpertError::InvalidConfig(_))));
        }
    }

    #[test]
    fn window_is_bounded_and_unknown_fields_are_rejected() {
        let c: ControllerConfig = serde_json::from_str(r#"{"window_drains": 100000000}"#).unwrap();
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("window_drains"), "{e}");
        let at_bound = ControllerConfig {
            window_drains: MAX_WINDOW_DRAINS,
            ..ControllerConfig::default()
        };
        at_bound.validate().unwrap();
        let e = serde_json::from_str::<ControllerConfig>(r#"{"drain_evry": 32}"#).unwrap_err();
        assert!(e.to_string().contains("drain_evry"), "{e}");
        let e = serde_json::from_str::<ControllerConfig>(
            r#"{"shift_response": {"jump_ratio": 2.0, "jump": 1}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("jump"), "{e}");
        // Missing fields still default.
        let c: ControllerConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, ControllerConfig::default());
    }

    #[test]
    fn counting_controls_in_json_and_old_configs_still_load() {
        // a config written before boot_frozen / on_counter_reset existed
        let old = r#"{"drain_every": 16, "half_life_steps": 64.0, "ratio": 1.5,
            "max_swaps_per_layer": 4, "max_swaps_per_step": 16, "window_drains": 8,
            "shift_response": null}"#;
        let c: ControllerConfig = serde_json::from_str(old).unwrap();
        assert!(!c.boot_frozen);
        assert_eq!(c.on_counter_reset, OnCounterReset::Rebaseline);
        let c: ControllerConfig =
            serde_json::from_str(r#"{"boot_frozen": true, "on_counter_reset": "error"}"#).unwrap();
        assert!(c.boot_frozen);
        assert_eq!(c.on_counter_reset, OnCounterReset::Error);
        c.validate().unwrap();
        // round trip
        let back: ControllerConfig =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let e = serde_json::from_str::<ControllerConfig>(r#"{"on_counter_reset": "ignore"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("ignore"), "{e}");
    }
}
