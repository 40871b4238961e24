//! What one step costs in each engine mode: the arithmetic, on counts of experts.
//!
//! Every price is the link's ([`LinkModel`], built on the library's
//! [`expert_residency::LinkCost`]) or the CPU channel's ([`CpuChannel`]); nothing here restates a
//! rate. `b` is the bytes of one expert.

use expert_residency::{ExpertError, Result};

use crate::experts::link::LinkModel;

/// The host CPU as a second channel for cold experts: it computes an expert's FFN from host
/// memory at `cpu_gbps` of weights, in parallel with the link's in-place reads; when both run in
/// one layer, each keeps `together` of its solo rate.
///
/// Defaults ([`CpuChannel::h200`]): the H200 machine's measurement, `benches/README.md`, "The
/// link and the CPU together" (`benches/python/moe_channels.py`, Mixtral experts of 352 MB, 16
/// threads): the CPU alone 50.7 GB/s of weights; in-place reads and the CPU together 91.6 GB/s,
/// **0.90** of their solo sum (50.6 + 50.7 GB/s measured in the same run). The link's own rates
/// stay the link model's.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuChannel {
    /// Weights the CPU computes through, GB/s (10⁹ bytes/s; finite, > 0).
    pub cpu_gbps: f64,
    /// Fraction of its solo rate each channel keeps while both run (finite, in `(0, 1]`).
    pub together: f64,
}

impl Default for CpuChannel {
    /// [`CpuChannel::h200`].
    fn default() -> Self {
        Self::h200()
    }
}

impl CpuChannel {
    /// The H200 machine's CPU: 50.7 GB/s of weights, 0.90 together with the link (see the type).
    pub fn h200() -> Self {
        CpuChannel {
            cpu_gbps: 50.7,
            together: 0.90,
        }
    }

    /// Checks `cpu_gbps` (finite, > 0) and `together` (finite, in `(0, 1]`).
    ///
    /// Errors: [`ExpertError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.cpu_gbps.is_finite() && self.cpu_gbps > 0.0) {
            return Err(ExpertError::InvalidConfig(format!(
                "cpu_gbps must be finite and > 0, got {}",
                self.cpu_gbps
            )));
        }
        if !(self.together.is_finite() && self.together > 0.0 && self.together <= 1.0) {
            return Err(ExpertError::InvalidConfig(format!(
                "cpu together factor must be in (0, 1], got {}",
                self.together
            )));
        }
        Ok(())
    }

    /// µs the CPU alone takes to compute through `bytes` of weights.
    pub fn cpu_us(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.cpu_gbps * 1e3)
    }

    /// The per-expert split of one layer's `n` cold experts of `b` bytes between the link (read
    /// in place) and the CPU: `(on_link, µs)` with the least time
    /// `max(k · read_us(b), (n − k) · cpu_us(b)) / f`, `f = together` when both channels have
    /// work, else 1; ties go to the link. `n` is small (≤ experts per layer): every `k` is tried.
    pub fn split(&self, link: &LinkModel, n: u64, b: u64) -> (u64, f64) {
        let (r, c) = (link.cost.read_us(b), self.cpu_us(b));
        let mut best = (n, n as f64 * r);
        for k in (0..n).rev() {
            let f = if k == 0 { 1.0 } else { self.together };
            let t = (k as f64 * r).max((n - k) as f64 * c) / f;
            if t < best.1 {
                best = (k, t);
            }
        }
        best
    }
}

/// How a cold expert is served in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// Read in place over the link.
    Read,
    /// Copied into HBM and computed there.
    Copy,
}

/// Read in place or copy, for one expert in one step: copy iff one copy is priced at most the
/// in-place reads it replaces, this step's and `reuse` expected further touched steps while the
/// copy stays resident (`copy_us(b) ≤ read_us(b) × (1 + reuse)`).
pub(crate) fn read_or_copy(link: &LinkModel, b: u64, reuse: f64) -> Channel {
    if link.cost.copy_us(b) <= link.cost.read_us(b) * (1.0 + reuse) {
        Channel::Copy
    } else {
        Channel::Read
    }
}

/// The critical-path µs of `copies` copies that serve the step they run in (a miss copied into
/// HBM before its layer computes): their link time and fixed cost, never hidden.
pub(crate) fn serving_copies_us(link: &LinkModel, copies: u64, b: u64) -> f64 {
    copies as f64 * link.cost.copy_us(b)
}

/// The µs of `copies` boundary copies (swaps for the next step) beside a step, as the link
/// model prices them ([`LinkModel::stall_us`] with no read).
pub(crate) fn boundary_copies_us(link: &LinkModel, copies: u64, b: u64) -> f64 {
    link.stall_us(0, copies, copies.saturating_mul(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_puts_experts_where_the_layer_ends_first() {
        let link = LinkModel::h200_pcie();
        let cpu = CpuChannel::h200();
        let b = 47_000_000; // 1000 µs in place at 47 GB/s
        let c = cpu.cpu_us(b); // 927.0 µs on the CPU at 50.7 GB/s
        assert_eq!(cpu.split(&link, 0, b), (0, 0.0));
        // One expert: the CPU alone is faster than the link alone.
        let (k, t) = cpu.split(&link, 1, b);
        assert_eq!(k, 0);
        assert!((t - c).abs() < 1e-9, "{t}");
        // Two: one each, both at 0.90 of their rate: max(1000, 927) / 0.9.
        let (k, t) = cpu.split(&link, 2, b);
        assert_eq!(k, 1);
        assert!((t - 1000.0 / 0.9).abs() < 1e-9, "{t}");
        // Three: 1 on the link, 2 on the CPU: max(1000, 1854.4) / 0.9 = 2060.4; 2 + 1: 2222.2.
        let (k, t) = cpu.split(&link, 3, b);
        assert_eq!(k, 1);
        assert!((t - 2.0 * c / 0.9).abs() < 1e-9, "{t}");
        // A CPU so slow it never helps: all on the link.
        let slow = CpuChannel {
            cpu_gbps: 1.0,
            together: 0.9,
        };
        assert_eq!(slow.split(&link, 3, b), (3, 3000.0));
        assert!(CpuChannel {
            cpu_gbps: 0.0,
            together: 0.9
        }
        .validate()
        .is_err());
        assert!(CpuChannel {
            cpu_gbps: 1.0,
            together: 1.5
        }
        .validate()
        .is_err());
        CpuChannel::h200().validate().unwrap();
    }

    #[test]
    fn read_or_copy_follows_the_prices() {
        let b = 18_800_968;
        // H200 PCIe: a copy (341.8 + 26.2 µs) is cheaper than one in-place read (400.0 µs).
        let h = LinkModel::h200_pcie();
        assert_eq!(read_or_copy(&h, b, 0.0), Channel::Copy);
        // GB300 C2C: a copy (72.0 µs) is 1.30 reads (55.3 µs): it pays from 0.30 reuses on.
        let g = LinkModel::gb300_c2c();
        assert_eq!(read_or_copy(&g, b, 0.0), Channel::Read);
        assert_eq!(read_or_copy(&g, b, 0.25), Channel::Read);
        assert_eq!(read_or_copy(&g, b, 0.35), Channel::Copy);
        assert!((serving_copies_us(&h, 2, b) - 2.0 * (341.836 + 26.2)).abs() < 0.01);
        assert!((boundary_copies_us(&h, 1, b) - (341.836 + 26.2)).abs() < 0.01);
        let hidden = LinkModel {
            hide_us: 1000.0,
            ..h.clone()
        };
        // Boundary copies hide behind hide_us; serving copies never do.
        assert!((boundary_copies_us(&hidden, 1, b) - 26.2).abs() < 1e-9);
        assert!((serving_copies_us(&hidden, 1, b) - (341.836 + 26.2)).abs() < 0.01);
    }
}
