//! What host-memory bytes cost a step: the link model of the byte-true scoreboard.
//!
//! A grouped GEMM reads a cold expert's weights in place over the host link once per step,
//! however many tokens picked it; a swap copies the whole expert over the same link. A
//! [`LinkModel`] turns a step's bytes into a modelled stall (µs the step waits on the link). The
//! prices and their arithmetic are the library's [`LinkCost`] (`read_us`, `copy_link_us`,
//! `copy_fixed_us`: what the cost-aware policy prices swaps with); the model adds only how copies
//! meet the step:
//!
//! - `read_us = host_read_bytes / read_gbps` (in-place reads are on the critical path);
//! - `copy_us = swap_bytes / copy_gbps` ([`LinkCost::copy_link_us`]);
//! - [`CopyMode::StopsStep`]: `stall_us = read_us + copy_us + swap_copies × copy_fixed_us`;
//! - [`CopyMode::SharesLink`]: copies run asynchronously on a side stream but over the same link
//!   as the in-place reads, so they hide only behind the step's off-link time `hide_us`:
//!   `stall_us = read_us + max(0, copy_us − hide_us) + swap_copies × copy_fixed_us`.
//!
//! GB/s are 10⁹ bytes per second, so `bytes / (GB/s × 10³)` is µs. The presets' numbers and their
//! sources are on [`LinkCost::h200_pcie`] and [`LinkCost::gb300_c2c`]; `sim/DESIGN.md`
//! ("Scoreboard definitions") states the same model.

use expert_residency::{ExpertError, LinkCost, Result};

/// How swap copies meet the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyMode {
    /// A copy stops the step: its whole link time is stall (the published GB300 recipe).
    StopsStep,
    /// Copies are asynchronous (a copy stream) but share the link with the in-place reads: only
    /// the part of a step's copy time beyond [`LinkModel::hide_us`] is stall.
    SharesLink,
}

/// A host link: its prices ([`LinkCost`]), how copies meet the step, the copy time a step hides.
/// Serde, as one flat object (`name`, `read_gbps`, `copy_gbps`, `copy_mode`, `copy_fixed_us`,
/// `hide_us`; an unknown field is an error); see the module docs for the stall formula.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "LinkFields", into = "LinkFields")]
pub struct LinkModel {
    /// Preset or user name (`h200-pcie`, `gb300-c2c`).
    pub name: String,
    /// The prices: in-place reads, copies, the fixed cost per copy (the library's type).
    pub cost: LinkCost,
    /// Whether copies stop the step or overlap it on a shared link.
    pub copy_mode: CopyMode,
    /// [`CopyMode::SharesLink`] only: copy time per step that hides behind the step's off-link
    /// work, µs (finite, ≥ 0).
    pub hide_us: f64,
}

/// [`LinkModel`]'s JSON: the prices flat beside the rest, as before the model was built on
/// [`LinkCost`].
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkFields {
    name: String,
    read_gbps: f64,
    copy_gbps: f64,
    copy_mode: CopyMode,
    copy_fixed_us: f64,
    hide_us: f64,
}

impl From<LinkFields> for LinkModel {
    fn from(f: LinkFields) -> Self {
        LinkModel {
            name: f.name,
            cost: LinkCost {
                read_gbps: f.read_gbps,
                copy_gbps: f.copy_gbps,
                copy_fixed_us: f.copy_fixed_us,
            },
            copy_mode: f.copy_mode,
            hide_us: f.hide_us,
        }
    }
}

impl From<LinkModel> for LinkFields {
    fn from(m: LinkModel) -> Self {
        LinkFields {
            name: m.name,
            read_gbps: m.cost.read_gbps,
            copy_gbps: m.cost.copy_gbps,
            copy_mode: m.copy_mode,
            copy_fixed_us: m.cost.copy_fixed_us,
            hide_us: m.hide_us,
        }
    }
}

impl Default for LinkModel {
    /// [`LinkModel::h200_pcie`].
    fn default() -> Self {
        Self::h200_pcie()
    }
}

/// The preset names [`LinkModel::preset`] knows.
pub const LINK_PRESETS: [&str; 2] = ["h200-pcie", "gb300-c2c"];

impl LinkModel {
    /// The H200 test machine, PCIe Gen5 x16: the prices of [`LinkCost::h200_pcie`] (47 GB/s in
    /// place, 55 GB/s copies, 26.2 µs per copy), copies asynchronous on a copy stream, sharing
    /// the link ([`CopyMode::SharesLink`]), and `hide_us` **0**: the replay knows no step compute
    /// time, so no copy time is assumed hidden (set it to a measured off-link step time to credit
    /// the overlap).
    pub fn h200_pcie() -> Self {
        LinkModel {
            name: "h200-pcie".into(),
            cost: LinkCost::h200_pcie(),
            copy_mode: CopyMode::SharesLink,
            hide_us: 0.0,
        }
    }

    /// GB300 NVLink-C2C as the published GB300 expert-residency recipe reports it: the prices of
    /// [`LinkCost::gb300_c2c`] (340 GB/s in place, a 17.93 MiB copy in ~72 µs), and a copy stops
    /// the step ([`CopyMode::StopsStep`]).
    pub fn gb300_c2c() -> Self {
        LinkModel {
            name: "gb300-c2c".into(),
            cost: LinkCost::gb300_c2c(),
            copy_mode: CopyMode::StopsStep,
            hide_us: 0.0,
        }
    }

    /// A preset by name ([`LINK_PRESETS`]).
    ///
    /// Errors: [`ExpertError::InvalidConfig`] naming the known presets.
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "h200-pcie" => Ok(Self::h200_pcie()),
            "gb300-c2c" => Ok(Self::gb300_c2c()),
            _ => Err(ExpertError::InvalidConfig(format!(
                "unknown link preset {name:?} (known: {})",
                LINK_PRESETS.join(", ")
            ))),
        }
    }

    /// Checks the prices ([`LinkCost::validate`]) and `hide_us` (finite, ≥ 0).
    ///
    /// Errors: [`ExpertError::InvalidConfig`] naming the link and the field.
    pub fn validate(&self) -> Result<()> {
        let named = |m: String| ExpertError::InvalidConfig(format!("link {}: {m}", self.name));
        self.cost.validate().map_err(|e| match e {
            ExpertError::InvalidConfig(m) => named(m),
            e => e,
        })?;
        if !(self.hide_us.is_finite() && self.hide_us >= 0.0) {
            return Err(named(format!(
                "hide_us must be finite and ≥ 0, got {}",
                self.hide_us
            )));
        }
        Ok(())
    }

    /// The modelled stall of one step, µs, from its in-place read bytes, its swap copies and
    /// their bytes (see the module docs).
    pub fn stall_us(&self, read_bytes: u64, copies: u64, copy_bytes: u64) -> f64 {
        let copy = self.cost.copy_link_us(copy_bytes);
        let copy_stall = match self.copy_mode {
            CopyMode::StopsStep => copy,
            CopyMode::SharesLink => (copy - self.hide_us).max(0.0),
        };
        self.cost.read_us(read_bytes) + copy_stall + copies as f64 * self.cost.copy_fixed_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPERT: u64 = 18_800_968; // 17.93 MiB, rounded up to a byte

    #[test]
    fn presets_arithmetic() {
        let h = LinkModel::h200_pcie();
        h.validate().unwrap();
        // 47 GB/s: 47,000 bytes per µs.
        assert!((h.cost.read_us(47_000_000) - 1000.0).abs() < 1e-9);
        // One 17.93 MiB copy at 55 GB/s: 341.8 µs (measured 342 µs).
        assert!((h.cost.copy_link_us(EXPERT) - 341.84).abs() < 0.01);
        // Shared link, nothing hidden: read + copy + 26.2 µs per copy.
        let s = h.stall_us(47_000_000, 1, EXPERT);
        assert!((s - (1000.0 + 341.836 + 26.2)).abs() < 0.01, "{s}");
        let hidden = LinkModel {
            hide_us: 500.0,
            ..h.clone()
        };
        assert!((hidden.stall_us(47_000_000, 1, EXPERT) - 1026.2).abs() < 1e-9);
        let g = LinkModel::gb300_c2c();
        g.validate().unwrap();
        // The published figure: a 17.93 MiB copy in ~72 µs, stopping the step.
        assert!((g.cost.copy_link_us(EXPERT) - 72.0).abs() < 0.01);
        assert!((g.cost.read_us(340_000) - 1.0).abs() < 1e-12);
        let stop = LinkModel {
            hide_us: 1e9,
            ..g.clone()
        };
        assert!(
            (stop.stall_us(0, 1, EXPERT) - 72.0).abs() < 0.01,
            "hide_us ignored"
        );
        assert_eq!(h.stall_us(0, 0, 0), 0.0);
        assert_eq!(LinkModel::preset("gb300-c2c").unwrap(), g);
        assert_eq!(LinkModel::default(), h);
    }

    #[test]
    fn bad_links_are_typed_errors() {
        assert!(matches!(
            LinkModel::preset("nvlink"),
            Err(ExpertError::InvalidConfig(m)) if m.contains("h200-pcie")
        ));
        let priced = |cost: LinkCost| LinkModel {
            cost,
            ..LinkModel::h200_pcie()
        };
        for bad in [
            priced(LinkCost {
                read_gbps: 0.0,
                ..LinkCost::h200_pcie()
            }),
            priced(LinkCost {
                copy_gbps: f64::NAN,
                ..LinkCost::h200_pcie()
            }),
            LinkModel {
                hide_us: -1.0,
                ..LinkModel::h200_pcie()
            },
            priced(LinkCost {
                copy_fixed_us: f64::INFINITY,
                ..LinkCost::h200_pcie()
            }),
        ] {
            assert!(matches!(bad.validate(), Err(ExpertError::InvalidConfig(_))));
        }
        let json = serde_json::to_string(&LinkModel::gb300_c2c()).unwrap();
        assert!(json.contains("\"copy_mode\":\"stops-step\""), "{json}");
        // The prices stay flat beside the rest (the JSON of reports written before).
        assert!(json.contains("\"read_gbps\":340.0"), "{json}");
        let back: LinkModel = serde_json::from_str(&json).unwrap();
        assert_eq!(back, LinkModel::gb300_c2c());
        let e = serde_json::from_str::<LinkModel>(&json.replace("hide_us", "hide")).unwrap_err();
        assert!(e.to_string().contains("hide"), "{e}");
    }
}
