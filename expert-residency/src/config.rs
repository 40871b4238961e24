//! Controller configuration: the shared knobs (drain cadence, fixed or adapted to the traffic,
//! EMA half-life, swap caps and budgets, the window, the shift response, boot freeze, counter
//! resets) and the policy with its own config ([`PolicyConfig`]); the link's prices
//! ([`LinkCost`]).

use crate::error::{bad, positive, ExpertError, Result};
use crate::link::LinkCost;
use crate::policy::{CostConfig, PolicyConfig, PolicyKind, RatioConfig};

/// How the controller counts, decays and swaps: the knobs every policy shares, and `policy`,
/// the [`crate::SwapPolicy`] to build with its own config.
///
/// [`Default`] is the **cost-aware** default ([`PolicyConfig::Cost`], `CostPolicy`):
/// heat in touched steps, a half-life and drain cadence that adapt to the observed traffic
/// ([`AdaptiveCadence`]: the same defaults serve batch 1 and batch 256), the H200 PCIe link's
/// costs ([`LinkCost::h200_pcie`]), a swap budget of 1 GiB per step, 2 swaps per layer per drain,
/// 8 swaps begun per step, no shift response. [`ControllerConfig::published_recipe`] is the
/// published GB300 recipe (ratio policy, drain every 64 steps, half-life 500 steps): the seed
/// defaults of the issue, unchanged.
///
/// JSON: an object of the fields below (missing fields take their defaults; an unknown field is
/// an error: a typo must not silently fall back to a default), `policy` an object tagged by
/// `kind` (`{"policy": {"kind": "ratio", "ratio": 1.25}}`, see [`PolicyConfig`]). The flat shape
/// of configs written before the per-policy configs is still read: `policy` as a name
/// (`"cost"`, `"ratio"`, `"recency"`; absent: `"cost"`) with the policies' knobs at the top
/// level, `ratio` (a number), `cost` (`{"payback", "z"}`) and `link` (a [`LinkCost`]); the named
/// policy takes its own from them, the others' are ignored (they were unused). Top-level knobs
/// beside a `policy` object are an error naming the new shape. A config is written in the new
/// shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ControllerConfig {
    /// Steps between drains (≥ 1). With [`ControllerConfig::adaptive`] set, the most steps
    /// between drains (the adapted cadence is never slower).
    pub drain_every: u32,
    /// EMA half-life of pick counts, in steps (finite, > 0). With
    /// [`ControllerConfig::adaptive`] set, the half-life before the first drain (then adapted).
    pub half_life_steps: f64,
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
    /// The policy [`crate::Controller::new`] builds and its own config: the cost-aware policy
    /// (default), the published GB300 recipe's ratio policy, or capped recency.
    pub policy: PolicyConfig,
    /// Drain cadence and half-life adapted to the observed traffic (`None`: fixed
    /// `drain_every` and `half_life_steps`, as the published recipe).
    pub adaptive: Option<AdaptiveCadence>,
    /// Bytes of swap copies begun per step, all layers together (`None`: no byte budget, only
    /// `max_swaps_per_step`). At least one swap per step is always allowed: the budget is
    /// `max(1, budget / expert_bytes)` swaps, and never more than `max_swaps_per_step`.
    pub swap_budget_bytes_per_step: Option<u64>,
}

/// The fields a controller config is read from: the shared knobs, `policy` as a name or an
/// object, and the flat shape's policy knobs (configs written before the per-policy configs).
#[derive(serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ConfigFields {
    drain_every: u32,
    half_life_steps: f64,
    max_swaps_per_layer: u32,
    max_swaps_per_step: u32,
    window_drains: u32,
    shift_response: Option<ShiftResponse>,
    boot_frozen: bool,
    on_counter_reset: OnCounterReset,
    policy: Option<PolicyField>,
    adaptive: Option<AdaptiveCadence>,
    swap_budget_bytes_per_step: Option<u64>,
    /// Flat shape: the ratio policy's knob.
    ratio: Option<f64>,
    /// Flat shape: the cost-aware policy's margins.
    cost: Option<FlatCostKnobs>,
    /// Flat shape: the cost-aware policy's link prices.
    link: Option<LinkCost>,
}

impl Default for ConfigFields {
    fn default() -> Self {
        let d = ControllerConfig::default();
        ConfigFields {
            drain_every: d.drain_every,
            half_life_steps: d.half_life_steps,
            max_swaps_per_layer: d.max_swaps_per_layer,
            max_swaps_per_step: d.max_swaps_per_step,
            window_drains: d.window_drains,
            shift_response: d.shift_response,
            boot_frozen: d.boot_frozen,
            on_counter_reset: d.on_counter_reset,
            policy: None,
            adaptive: d.adaptive,
            swap_budget_bytes_per_step: d.swap_budget_bytes_per_step,
            ratio: None,
            cost: None,
            link: None,
        }
    }
}

/// The flat shape's `cost` object: the cost-aware policy's margins (its link prices were the
/// top-level `link`).
#[derive(serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(default, deny_unknown_fields)]
struct FlatCostKnobs {
    payback: f64,
    z: f64,
}

named_fields!(@de FlatCostKnobs, "the cost knobs");

impl Default for FlatCostKnobs {
    fn default() -> Self {
        let d = CostConfig::default();
        FlatCostKnobs {
            payback: d.payback,
            z: d.z,
        }
    }
}

/// `policy` as read: a name (the flat shape) or a [`PolicyConfig`] object.
enum PolicyField {
    Name(PolicyKind),
    Config(PolicyConfig),
}

impl<'de> serde::Deserialize<'de> for PolicyField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = PolicyField;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a policy config as an object of named fields tagged by `kind` \
                     ({\"kind\": \"ratio\", \"ratio\": 1.5}), or a policy name",
                )
            }
            fn visit_str<E: serde::de::Error>(
                self,
                name: &str,
            ) -> std::result::Result<Self::Value, E> {
                use serde::de::IntoDeserializer;
                use serde::Deserialize;
                PolicyKind::deserialize(name.into_deserializer()).map(PolicyField::Name)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                // The derived (inherent, `remote = "Self"`) reading of the tagged object.
                PolicyConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(PolicyField::Config)
            }
        }
        d.deserialize_any(Either)
    }
}

impl ConfigFields {
    /// The config these fields describe (the flat shape's knobs folded into its named policy).
    fn into_config(self) -> std::result::Result<ControllerConfig, String> {
        let flat = [
            ("ratio", self.ratio.is_some()),
            ("cost", self.cost.is_some()),
            ("link", self.link.is_some()),
        ];
        let policy = match self.policy {
            Some(PolicyField::Config(p)) => {
                if let Some((knob, _)) = flat.iter().find(|(_, given)| *given) {
                    return Err(format!(
                        "`{knob}` at the top level is the flat config shape, where `policy` is a \
                         name (\"policy\": \"ratio\"); with `policy` an object, give the \
                         policy's knobs inside it: {{\"policy\": {{\"kind\": \"ratio\", \
                         \"ratio\": 1.5}}}} or {{\"policy\": {{\"kind\": \"cost\", \
                         \"payback\": 1.5, \"z\": 1.0, \"link\": {{...}}}}}}"
                    ));
                }
                p
            }
            Some(PolicyField::Name(kind)) => self.flat_policy(kind),
            None => self.flat_policy(PolicyKind::Cost),
        };
        Ok(ControllerConfig {
            drain_every: self.drain_every,
            half_life_steps: self.half_life_steps,
            max_swaps_per_layer: self.max_swaps_per_layer,
            max_swaps_per_step: self.max_swaps_per_step,
            window_drains: self.window_drains,
            shift_response: self.shift_response,
            boot_frozen: self.boot_frozen,
            on_counter_reset: self.on_counter_reset,
            policy,
            adaptive: self.adaptive,
            swap_budget_bytes_per_step: self.swap_budget_bytes_per_step,
        })
    }

    /// The flat shape: policy `kind` tuned by its own top-level knobs (the others' are ignored,
    /// as they always were unused).
    fn flat_policy(&self, kind: PolicyKind) -> PolicyConfig {
        match kind {
            PolicyKind::Cost => {
                let knobs =
                    self.cost
                        .as_ref()
                        .map_or_else(FlatCostKnobs::default, |c| FlatCostKnobs {
                            payback: c.payback,
                            z: c.z,
                        });
                PolicyConfig::Cost(CostConfig {
                    payback: knobs.payback,
                    z: knobs.z,
                    link: self.link.clone().unwrap_or_default(),
                })
            }
            PolicyKind::Ratio => PolicyConfig::Ratio(RatioConfig {
                ratio: self.ratio.unwrap_or(RatioConfig::default().ratio),
            }),
            kind => PolicyConfig::default_for(kind),
        }
    }
}

impl<'de> serde::Deserialize<'de> for ControllerConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ControllerConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a controller config as an object of named fields")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<ControllerConfig, A::Error> {
                use serde::Deserialize;
                ConfigFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?
                    .into_config()
                    .map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// Drain cadence and EMA half-life adapted to the traffic, so that the same defaults serve
/// batch 1 and batch 256 (tierkit's; the published recipe's fixed 64 / 500 steps were chosen for
/// a lane of 267,226 steps).
///
/// At each drain the controller measures the experts touched per step per layer `S` (from the
/// picks, see `CostPolicy`; smoothed over drains) and sets the half-life to
/// `touches_per_half_life × experts_per_layer / S` steps (clamped to `[min_half_life_steps,
/// max_half_life_steps]`): an average expert gathers `touches_per_half_life` touched steps per
/// half-life, whatever the batch. The next drain comes `half-life / drains_per_half_life` steps
/// later (at least 1, at most `drain_every`). The first drain comes after one step. Missing
/// fields take their defaults; an unknown field is an error.
///
/// The defaults (12 touched steps per half-life, 48 drains per half-life: a drain every
/// `experts / (4 S)` steps, a quarter of an average expert's time between touches) replaced 4 and
/// 4 after a sweep over the done-when suite (`docs/experts.md`, "Knob sweep behind the
/// defaults"): the longer memory ranks weakly skewed experts better (512 experts top-10: 1.21× →
/// 1.15× the best static map in hindsight), the finer drains let the swaps it then finds begin
/// sooner, and Mixtral decode and the OLMoE scenarios stay within their bounds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(default, deny_unknown_fields)]
pub struct AdaptiveCadence {
    /// Touched steps of an average expert per half-life (finite, > 0). Default 12.
    pub touches_per_half_life: f64,
    /// Drains per half-life (finite, ≥ 1). Default 48.
    pub drains_per_half_life: f64,
    /// Shortest half-life, steps (finite, > 0). Default 2.
    pub min_half_life_steps: f64,
    /// Longest half-life, steps (finite, ≥ the shortest). Default 4,096.
    pub max_half_life_steps: f64,
}

named_fields!(AdaptiveCadence, "an adaptive cadence");

impl Default for AdaptiveCadence {
    fn default() -> Self {
        AdaptiveCadence {
            touches_per_half_life: 12.0,
            drains_per_half_life: 48.0,
            min_half_life_steps: 2.0,
            max_half_life_steps: 4096.0,
        }
    }
}

/// What a drain does with a counter snapshot in which some cell is below the previous snapshot
/// (wrap-around delta ≥ 2^31: a drop read as a reset, never as 2^31 picks in one interval). JSON: `"rebaseline"` / `"error"`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
            max_swaps_per_layer: 2,
            max_swaps_per_step: 8,
            window_drains: 8,
            shift_response: None,
            boot_frozen: false,
            on_counter_reset: OnCounterReset::Rebaseline,
            policy: PolicyConfig::default(),
            adaptive: Some(AdaptiveCadence::default()),
            swap_budget_bytes_per_step: Some(1 << 30),
        }
    }
}

/// Shift response: a cold-share jump detector that, for a while, shortens the EMA half-life and
/// raises the per-layer swap cap so the hot set follows new traffic faster (per-step cap unchanged).
///
/// Drains are pooled until they hold at least `min_picks` picks (all layers), so that drain 1 and
/// drain 8 see the same detector. The pooled cold share `c` is compared with a baseline `b` (an
/// EMA of past pooled cold shares, half-life `baseline_half_life_drains` pooled tests): a jump is
/// `c ≥ jump_ratio × b` and `c − b ≥ max(jump_min, z · √(b(1 − b) / picks))`, the last term
/// being the binomial standard error of a cold share measured on `picks` lookups (sampling
/// noise). A jump decays the EMA as if `forget_steps` more steps had passed (at
/// the boosted half-life) and boosts for `boost_drains` drains (a new jump re-arms it); then the
/// normal half-life and cap come back.
/// Missing fields take their defaults when deserialized; an unknown field is an error.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
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
    /// Standard errors of sampling noise a jump must clear (finite, ≥ 0; 0 = off). Default 4.
    pub z: f64,
    /// Picks (all layers) a pooled test holds at least (≥ 1). Default 512.
    pub min_picks: u64,
}

named_fields!(ShiftResponse, "a shift response");

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
            z: 4.0,
            min_picks: 512,
        }
    }
}

/// Largest [`ControllerConfig::window_drains`] (1,024 drains: 65,536 steps at the default
/// cadence). The controller keeps `layers × window_drains` window cells.
pub const MAX_WINDOW_DRAINS: u32 = 1024;

/// Largest controller config file [`ControllerConfig::load`] reads: 1 MiB (a config is under
/// 2 KiB).
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

impl ControllerConfig {
    /// Reads a config from a JSON file (a JSON object; missing fields take their defaults) and
    /// validates it. The read is bounded ([`tier_core::read_json`], at most
    /// [`MAX_CONFIG_FILE_BYTES`]): `/dev/zero` or a huge file fails without being held in memory.
    ///
    /// Errors: [`ExpertError::Format`] naming the file for a missing or unreadable file, a
    /// directory, a file above the cap, bad JSON, an array, a wrong type or an unknown field;
    /// [`ExpertError::InvalidConfig`] for an out-of-range value.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let cfg: Self = tier_core::read_json(path, MAX_CONFIG_FILE_BYTES)
            .map_err(|e| ExpertError::Format(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every field: the shared knobs, then the policy's config
    /// ([`PolicyConfig::validate`]). For callers that check a config before using it (a file,
    /// a command line); [`crate::Controller::new`] checks each part once itself.
    ///
    /// Errors: [`ExpertError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        self.validate_knobs()?;
        self.policy.validate()
    }

    /// Checks the knobs every policy shares (not `policy`: its constructor checks its own).
    /// Errors: [`ExpertError::InvalidConfig`] naming the field.
    pub(crate) fn validate_knobs(&self) -> Result<()> {
        if self.drain_every == 0 {
            return Err(bad("drain_every must be ≥ 1".into()));
        }
        positive("half_life_steps", self.half_life_steps)?;
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
            if !(s.z.is_finite() && s.z >= 0.0) {
                return Err(bad(format!("shift z must be finite and ≥ 0, got {}", s.z)));
            }
            if s.min_picks == 0 {
                return Err(bad("shift min_picks must be ≥ 1".into()));
            }
        }
        if let Some(a) = &self.adaptive {
            positive("adaptive.touches_per_half_life", a.touches_per_half_life)?;
            positive("adaptive.min_half_life_steps", a.min_half_life_steps)?;
            if !(a.drains_per_half_life.is_finite() && a.drains_per_half_life >= 1.0) {
                return Err(bad(format!(
                    "adaptive.drains_per_half_life must be finite and ≥ 1, got {}",
                    a.drains_per_half_life
                )));
            }
            if !(a.max_half_life_steps.is_finite()
                && a.max_half_life_steps >= a.min_half_life_steps)
            {
                return Err(bad(format!(
                    "adaptive.max_half_life_steps must be finite and ≥ min_half_life_steps, got {}",
                    a.max_half_life_steps
                )));
            }
        }
        if self.swap_budget_bytes_per_step == Some(0) {
            return Err(bad(
                "swap_budget_bytes_per_step must be ≥ 1 when given".into()
            ));
        }
        Ok(())
    }

    /// The published GB300 recipe ("EMA drain + ratio hysteresis"), the crate's defaults before
    /// the cost-aware policy: [`PolicyConfig::Ratio`] at ratio 1.5, drain every 64 steps, EMA
    /// half-life 500 steps (fixed), 2 swaps per layer per drain, 8 swaps begun per step, no byte
    /// budget, no shift response.
    pub fn published_recipe() -> Self {
        ControllerConfig {
            policy: PolicyConfig::Ratio(RatioConfig::default()),
            adaptive: None,
            swap_budget_bytes_per_step: None,
            ..Self::default()
        }
    }

    /// [`ControllerConfig::published_recipe`] with the default [`ShiftResponse`] switched on.
    pub fn with_shift_response() -> Self {
        ControllerConfig {
            shift_response: Some(ShiftResponse::default()),
            ..Self::published_recipe()
        }
    }

    /// Swaps begun per step: `max_swaps_per_step`, lowered to `max(1, budget / expert_bytes)`
    /// under a byte budget.
    pub fn swaps_per_step(&self, expert_bytes: u64) -> u32 {
        match self.swap_budget_bytes_per_step {
            Some(b) => {
                let n = (b / expert_bytes.max(1)).clamp(1, u32::MAX as u64) as u32;
                n.min(self.max_swaps_per_step)
            }
            None => self.max_swaps_per_step,
        }
    }
}

#[cfg(test)]
mod tests;
