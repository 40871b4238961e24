//! [`StoreGeometry`]: the shape of an expert store, checked without a device.

use crate::error::{CudaError, Result};

/// Geometry of an [`crate::ExpertStore`]: `layers × experts` experts of `expert_bytes` each in
/// pinned host memory, `layers × (hot_per_layer + 1)` HBM slots (the `+ 1` is each layer's spare
/// slot), and a `[layers][experts]` u64 indirection table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreGeometry {
    /// MoE layers.
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Hot experts (HBM slots, not counting the spare) per layer.
    pub hot_per_layer: u32,
    /// Bytes of one expert (all its weights), a multiple of 16.
    pub expert_bytes: u64,
}

/// Largest byte total a store may hold in one tier (`isize::MAX`): the pinned host experts are
/// viewed as one Rust slice, and no Rust allocation or slice may exceed it.
const MAX_TIER_BYTES: u64 = isize::MAX as u64;

impl StoreGeometry {
    /// Checks the geometry without touching a device (pure arithmetic; [`crate::ExpertStore::new`]
    /// calls it first).
    ///
    /// # Errors
    /// - [`CudaError::OutOfRange`] if `layers` or `experts` is 0; if `hot_per_layer > experts`
    ///   or `hot_per_layer == u32::MAX` (the spare slot would not be countable); if
    ///   `layers × experts` (indirection-table cells) or `layers × (hot_per_layer + 1)` (HBM
    ///   slots) exceeds `u32::MAX` (cells and slots are `u32` indices, on the device too); or if
    ///   `expert_bytes` makes [`host_bytes`](Self::host_bytes) or
    ///   [`hbm_bytes`](Self::hbm_bytes) exceed `isize::MAX` bytes (`limit` is then the largest
    ///   `expert_bytes + 1` that fits);
    /// - [`CudaError::Shape`] if `expert_bytes` is not a non-zero multiple of 16.
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 || self.experts == 0 {
            return Err(CudaError::OutOfRange {
                what: "layers/experts (zero)",
                value: 0,
                limit: 1,
            });
        }
        if self.hot_per_layer > self.experts {
            return Err(CudaError::OutOfRange {
                what: "hot_per_layer",
                value: self.hot_per_layer as u64,
                limit: self.experts as u64 + 1,
            });
        }
        let Some(slots) = self.hot_per_layer.checked_add(1) else {
            return Err(CudaError::OutOfRange {
                what: "hot_per_layer (hot_per_layer + 1 slots per layer must fit u32)",
                value: self.hot_per_layer as u64,
                limit: u32::MAX as u64,
            });
        };
        let cell_limit = u32::MAX as u64 + 1;
        let Some(cells) = self.layers.checked_mul(self.experts) else {
            return Err(CudaError::OutOfRange {
                what: "layers × experts (indirection-table cells)",
                value: self.layers as u64 * self.experts as u64,
                limit: cell_limit,
            });
        };
        let Some(slots_total) = self.layers.checked_mul(slots) else {
            return Err(CudaError::OutOfRange {
                what: "layers × (hot_per_layer + 1) (HBM slots)",
                value: self.layers as u64 * slots as u64,
                limit: cell_limit,
            });
        };
        if self.expert_bytes == 0 || !self.expert_bytes.is_multiple_of(16) {
            return Err(CudaError::Shape {
                what: "expert_bytes (a non-zero multiple of 16)",
                expected: self
                    .expert_bytes
                    .div_ceil(16)
                    .max(1)
                    .checked_mul(16)
                    .unwrap_or(u64::MAX - 15),
                got: self.expert_bytes,
            });
        }
        let units = u64::from(cells.max(slots_total));
        let fits = |n: u32| {
            u64::from(n)
                .checked_mul(self.expert_bytes)
                .is_some_and(|b| b <= MAX_TIER_BYTES)
        };
        if !fits(cells) || !fits(slots_total) {
            return Err(CudaError::OutOfRange {
                what: "expert_bytes (host or HBM bytes of the store would exceed isize::MAX)",
                value: self.expert_bytes,
                limit: MAX_TIER_BYTES / units + 1,
            });
        }
        Ok(())
    }
    /// HBM slots per layer (`hot_per_layer + 1`: the last extra one is the spare; saturates at
    /// `u32::MAX` for a geometry [`validate`](Self::validate) rejects).
    pub fn slots_per_layer(&self) -> u32 {
        self.hot_per_layer.saturating_add(1)
    }
    /// Bytes of pinned host memory the store holds (`layers × experts × expert_bytes`; saturates
    /// at `u64::MAX` for a geometry [`validate`](Self::validate) rejects, never wraps).
    pub fn host_bytes(&self) -> u64 {
        (self.layers as u64 * self.experts as u64).saturating_mul(self.expert_bytes)
    }
    /// Bytes of HBM the slots hold (`layers × (hot_per_layer + 1) × expert_bytes`; saturates at
    /// `u64::MAX` for a geometry [`validate`](Self::validate) rejects, never wraps).
    pub fn hbm_bytes(&self) -> u64 {
        (self.layers as u64 * (self.hot_per_layer as u64 + 1)).saturating_mul(self.expert_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_validation() {
        let g = StoreGeometry {
            layers: 2,
            experts: 4,
            hot_per_layer: 5,
            expert_bytes: 16,
        };
        assert!(g.validate().is_err());
        let g = StoreGeometry {
            layers: 2,
            experts: 4,
            hot_per_layer: 2,
            expert_bytes: 12,
        };
        assert!(g.validate().is_err());
        let g = StoreGeometry {
            layers: 2,
            experts: 4,
            hot_per_layer: 2,
            expert_bytes: 32,
        };
        assert!(g.validate().is_ok());
        assert_eq!(g.hbm_bytes(), 2 * 3 * 32);
        assert_eq!(g.host_bytes(), 2 * 4 * 32);
    }

    fn geo(layers: u32, experts: u32, hot_per_layer: u32, expert_bytes: u64) -> StoreGeometry {
        StoreGeometry {
            layers,
            experts,
            hot_per_layer,
            expert_bytes,
        }
    }

    fn rejected_field(g: StoreGeometry) -> (&'static str, u64, u64) {
        match g.validate() {
            Err(CudaError::OutOfRange { what, value, limit }) => (what, value, limit),
            other => panic!("{g:?}: expected OutOfRange, got {other:?}"),
        }
    }

    /// Pure arithmetic, no GPU: every product the store indexes or allocates with is checked.
    #[test]
    fn geometry_validation_rejects_overflowing_products() {
        // The breaker's case: 65536 × 65536 cells wrapped the u32 table index to 0, and both
        // byte totals wrapped to 0.
        let g = geo(65536, 65536, 65535, 1 << 48);
        let (what, value, limit) = rejected_field(g);
        assert!(what.contains("cells"), "{what}");
        assert_eq!((value, limit), (1 << 32, 1 << 32));
        assert_eq!((g.host_bytes(), g.hbm_bytes()), (u64::MAX, u64::MAX));
        // Cells fit exactly (65537 × 65535 = u32::MAX), HBM slots do not.
        let g = geo(65537, 65535, 65535, 16);
        let (what, value, _) = rejected_field(g);
        assert!(what.contains("HBM slots"), "{what}");
        assert_eq!(value, 65537 * 65536);
        assert!(geo(65537, 65535, 65534, 16).validate().is_ok());
        // hot_per_layer + 1 spare slot would wrap.
        let g = geo(1, u32::MAX, u32::MAX, 16);
        assert!(rejected_field(g).0.starts_with("hot_per_layer"));
        assert_eq!(g.slots_per_layer(), u32::MAX, "saturates, never wraps to 0");
        assert!(geo(1, u32::MAX, u32::MAX - 1, 16).validate().is_ok());
        // Byte totals: 16 cells × 2^62 bytes overflows u64; the limit is the first
        // expert_bytes that no longer fits isize::MAX.
        let (what, value, limit) = rejected_field(geo(4, 4, 2, 1 << 62));
        assert!(what.starts_with("expert_bytes"), "{what}");
        assert_eq!((value, limit), (1 << 62, 1 << 59));
        assert!(geo(4, 4, 2, (1 << 59) - 16).validate().is_ok());
        assert!(geo(4, 4, 2, 1 << 59).validate().is_err());
        // HBM is the larger tier when every expert is hot: 2 × 5 slots > 2 × 4 cells. Here the
        // host total fits (8 × (2^60 - 16) < 2^63) and only HBM does not.
        let g = geo(2, 4, 4, (1 << 60) - 16);
        assert!(g.host_bytes() <= isize::MAX as u64);
        let (_, _, limit) = rejected_field(g);
        assert_eq!(limit, isize::MAX as u64 / 10 + 1);
        let g = geo(2, 4, 4, 16 * (isize::MAX as u64 / 160));
        assert!(g.validate().is_ok());
        assert_eq!(g.hbm_bytes(), 10 * g.expert_bytes);
        // The multiple-of-16 hint no longer overflows near u64::MAX.
        assert_eq!(
            geo(1, 1, 0, u64::MAX).validate().unwrap_err(),
            CudaError::Shape {
                what: "expert_bytes (a non-zero multiple of 16)",
                expected: u64::MAX - 15,
                got: u64::MAX
            }
        );
    }
}
