//! What host-memory bytes cost a step: the link model of the byte-true scoreboard.
//!
//! A grouped GEMM reads a cold expert's weights in place over the host link once per step,
//! however many tokens picked it; a swap copies the whole expert over the same link. A
//! [`LinkModel`] turns a step's bytes into a modelled stall (µs the step waits on the link):
//!
//! - `read_us = host_read_bytes / read_gbps` (in-place reads are on the critical path);
//! - `copy_us = swap_bytes / copy_gbps`;
//! - [`CopyMode::StopsStep`]: `stall_us = read_us + copy_us + swap_copies × copy_fixed_us`;
//! - [`CopyMode::SharesLink`]: copies run asynchronously on a side stream but over the same link
//!   as the in-place reads, so they hide only behind the step's off-link time `hide_us`:
//!   `stall_us = read_us + max(0, copy_us − hide_us) + swap_copies × copy_fixed_us`.
//!
//! GB/s are 10⁹ bytes per second, so `bytes / (GB/s × 10³)` is µs. The presets' numbers and their
//! sources are on [`LinkModel::h200_pcie`] and [`LinkModel::gb300_c2c`]; `sim/DESIGN.md`
//! ("Scoreboard definitions") states the same model.

use expert_residency::{ExpertError, Result};

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

/// A host link: rates, how copies meet the step, fixed costs. Serde; see the module docs for the
/// stall formula.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkModel {
    /// Preset or user name (`h200-pcie`, `gb300-c2c`).
    pub name: String,
    /// In-place reads of cold experts by the GEMM, GB/s (10⁹ bytes/s; finite, > 0).
    pub read_gbps: f64,
    /// Swap copies host → HBM, GB/s (10⁹ bytes/s; finite, > 0).
    pub copy_gbps: f64,
    /// Whether copies stop the step or overlap it on a shared link.
    pub copy_mode: CopyMode,
    /// Stall added per swap copy besides its bytes, µs (finite, ≥ 0): table flip, contention.
    pub copy_fixed_us: f64,
    /// [`CopyMode::SharesLink`] only: copy time per step that hides behind the step's off-link
    /// work, µs (finite, ≥ 0).
    pub hide_us: f64,
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
    /// The H200 test machine, PCIe Gen5 x16 (`../shared/limits/h200-pcie.md`, measured
    /// 2026-11-29 and 2026-12-01):
    /// - in-place reads **47 GB/s**: the GPU gather from mapped pinned host memory (46.4–46.5 GB/s,
    ///   re-measured 47.3 GB/s with the project's kernel; "use 47 GB/s");
    /// - copies **55 GB/s**: one 17.93 MiB expert row H2D in 342 µs (55.0 GB/s; the 1 GiB H2D
    ///   ceiling is 55.6 GB/s);
    /// - copies asynchronous on a copy stream, sharing the link ([`CopyMode::SharesLink`]);
    /// - **26.2 µs** per copy: the added step time per applied swap measured by
    ///   `gpu_bench_experts` (`benches/README.md`), copy hidden behind a 1.37 ms step;
    /// - `hide_us` **0**: the replay knows no step compute time, so no copy time is assumed
    ///   hidden (set it to a measured off-link step time to credit the overlap).
    pub fn h200_pcie() -> Self {
        LinkModel {
            name: "h200-pcie".into(),
            read_gbps: 47.0,
            copy_gbps: 55.0,
            copy_mode: CopyMode::SharesLink,
            copy_fixed_us: 26.2,
            hide_us: 0.0,
        }
    }

    /// GB300 NVLink-C2C as the published GB300 expert-residency recipe reports it:
    /// - in-place reads **340 GB/s**;
    /// - a 17.93 MiB expert copy takes **~72 µs** and stops the step ([`CopyMode::StopsStep`]):
    ///   `copy_gbps` = 17.93 × 2²⁰ bytes / 72 µs = **261.1 GB/s**, no fixed cost besides.
    pub fn gb300_c2c() -> Self {
        LinkModel {
            name: "gb300-c2c".into(),
            read_gbps: 340.0,
            copy_gbps: 261.1,
            copy_mode: CopyMode::StopsStep,
            copy_fixed_us: 0.0,
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

    /// Checks the rates (finite, > 0) and the fixed costs (finite, ≥ 0).
    ///
    /// Errors: [`ExpertError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [("read_gbps", self.read_gbps), ("copy_gbps", self.copy_gbps)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ExpertError::InvalidConfig(format!(
                    "link {}: {field} must be finite and > 0, got {v}",
                    self.name
                )));
            }
        }
        for (field, v) in [
            ("copy_fixed_us", self.copy_fixed_us),
            ("hide_us", self.hide_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ExpertError::InvalidConfig(format!(
                    "link {}: {field} must be finite and ≥ 0, got {v}",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// µs to read `bytes` in place (`bytes / (read_gbps × 10³)`).
    pub fn read_us(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.read_gbps * 1e3)
    }

    /// µs of link time to copy `bytes` (`bytes / (copy_gbps × 10³)`, no fixed cost).
    pub fn copy_us(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.copy_gbps * 1e3)
    }

    /// The modelled stall of one step, µs, from its in-place read bytes, its swap copies and
    /// their bytes (see the module docs).
    pub fn stall_us(&self, read_bytes: u64, copies: u64, copy_bytes: u64) -> f64 {
        let copy = self.copy_us(copy_bytes);
        let copy_stall = match self.copy_mode {
            CopyMode::StopsStep => copy,
            CopyMode::SharesLink => (copy - self.hide_us).max(0.0),
        };
        self.read_us(read_bytes) + copy_stall + copies as f64 * self.copy_fixed_us
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
        assert!((h.read_us(47_000_000) - 1000.0).abs() < 1e-9);
        // One 17.93 MiB copy at 55 GB/s: 341.8 µs (measured 342 µs).
        assert!((h.copy_us(EXPERT) - 341.84).abs() < 0.01);
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
        assert!((g.copy_us(EXPERT) - 72.0).abs() < 0.01);
        assert!((g.read_us(340_000) - 1.0).abs() < 1e-12);
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
        for bad in [
            LinkModel {
                read_gbps: 0.0,
                ..LinkModel::h200_pcie()
            },
            LinkModel {
                copy_gbps: f64::NAN,
                ..LinkModel::h200_pcie()
            },
            LinkModel {
                hide_us: -1.0,
                ..LinkModel::h200_pcie()
            },
            LinkModel {
                copy_fixed_us: f64::INFINITY,
                ..LinkModel::h200_pcie()
            },
        ] {
            assert!(matches!(bad.validate(), Err(ExpertError::InvalidConfig(_))));
        }
        let json = serde_json::to_string(&LinkModel::gb300_c2c()).unwrap();
        assert!(json.contains("\"copy_mode\":\"stops-step\""), "{json}");
        let back: LinkModel = serde_json::from_str(&json).unwrap();
        assert_eq!(back, LinkModel::gb300_c2c());
    }
}
