//! [`LinkCost`]: what a host link charges, the one statement of the link prices and their
//! arithmetic (the cost-aware policy's and the lab's link model's).

use crate::error::{bad, positive, Result};

/// What a host link charges: in-place reads of cold experts and swap copies. The one statement of
/// the link prices and their arithmetic: the cost-aware policy prices swaps with it, and
/// `tierkit-sim`'s link model (`LinkModel`) is built on it (adding only how copies meet the step).
/// Missing fields take the H200 PCIe values; an unknown field is an error.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
#[serde(default, deny_unknown_fields)]
pub struct LinkCost {
    /// In-place reads of cold experts by the grouped GEMM, GB/s (10⁹ bytes/s; finite, > 0).
    pub read_gbps: f64,
    /// Swap copies host → HBM, GB/s (10⁹ bytes/s; finite, > 0).
    pub copy_gbps: f64,
    /// Fixed cost per swap copy besides its bytes, µs (finite, ≥ 0): table flip, contention.
    pub copy_fixed_us: f64,
}

named_fields!(LinkCost, "a link cost");

impl Default for LinkCost {
    /// [`LinkCost::h200_pcie`].
    fn default() -> Self {
        Self::h200_pcie()
    }
}

impl LinkCost {
    /// The H200 test machine, PCIe Gen5 x16 (`docs/h200-ceilings.md` in the repository;
    /// `../shared/limits/h200-pcie.md`, measured 2026-11-29 and 2026-12-01):
    /// - in-place reads **47 GB/s**: the GPU gather from mapped pinned host memory (46.4–46.5
    ///   GB/s, re-measured 47.3 GB/s with the project's kernel; "use 47 GB/s");
    /// - copies **55 GB/s**: one 17.93 MiB expert row H2D in 342 µs (55.0 GB/s; the 1 GiB H2D
    ///   ceiling is 55.6 GB/s);
    /// - **26.2 µs** per copy: the added step time per applied swap measured by
    ///   `gpu_bench_experts` (`benches/README.md`), copy hidden behind a 1.37 ms step.
    pub fn h200_pcie() -> Self {
        LinkCost {
            read_gbps: 47.0,
            copy_gbps: 55.0,
            copy_fixed_us: 26.2,
        }
    }

    /// GB300 NVLink-C2C as the published GB300 expert-residency recipe reports it: in-place
    /// reads **340 GB/s**; a 17.93 MiB expert copy takes **~72 µs**, so `copy_gbps` = 17.93 ×
    /// 2²⁰ bytes / 72 µs = **261.1 GB/s**; no fixed cost besides.
    pub fn gb300_c2c() -> Self {
        LinkCost {
            read_gbps: 340.0,
            copy_gbps: 261.1,
            copy_fixed_us: 0.0,
        }
    }

    /// µs to read `bytes` in place once (`bytes / (read_gbps × 10³)`).
    pub fn read_us(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.read_gbps * 1e3)
    }

    /// µs of link time a copy of `bytes` takes (`bytes / (copy_gbps × 10³)`, no fixed cost).
    pub fn copy_link_us(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.copy_gbps * 1e3)
    }

    /// µs one swap copy of `bytes` costs ([`LinkCost::copy_link_us`] + `copy_fixed_us`).
    pub fn copy_us(&self, bytes: u64) -> f64 {
        self.copy_link_us(bytes) + self.copy_fixed_us
    }

    /// A swap copy's cost in in-place reads of the same expert (`copy_us / read_us`): how many
    /// more touched steps an incoming expert must serve from HBM than the outgoing one for the
    /// copy to pay (0.86 for any expert size above a few MB on the H200 PCIe link).
    pub(crate) fn copy_in_reads(&self, expert_bytes: u64) -> f64 {
        let r = self.read_us(expert_bytes.max(1));
        self.copy_us(expert_bytes.max(1)) / r
    }

    /// Checks the rates (finite, > 0) and the fixed cost (finite, ≥ 0).
    ///
    /// Errors: [`crate::ExpertError::InvalidConfig`] naming the field (`link.read_gbps`, ...).
    pub fn validate(&self) -> Result<()> {
        positive("link.read_gbps", self.read_gbps)?;
        positive("link.copy_gbps", self.copy_gbps)?;
        if !(self.copy_fixed_us.is_finite() && self.copy_fixed_us >= 0.0) {
            return Err(bad(format!(
                "link.copy_fixed_us must be finite and ≥ 0, got {}",
                self.copy_fixed_us
            )));
        }
        Ok(())
    }
}
