//! The shape of a MoE model's expert bank and of its hot (HBM) set.

use crate::error::{Error, Result};

/// The expert bank of a MoE model and the size of its hot set.
///
/// Every MoE layer has `experts_per_layer` experts of `expert_bytes` bytes each; exactly
/// `hot_per_layer` of them live in HBM ("hot"), the rest in pinned host memory ("cold").
/// Build it with [`Geometry::new`], which validates it.
///
/// Example: OLMoE-1B-7B has 16 layers of 64 experts (top-8); a 25% HBM budget is
/// `Geometry::new(16, 64, 16, bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// MoE layers.
    pub layers: u32,
    /// Experts per layer (every expert id is below this).
    pub experts_per_layer: u32,
    /// Experts kept in HBM per layer (`1..=experts_per_layer`).
    pub hot_per_layer: u32,
    /// Bytes of one expert's weights (all matrices of one expert, as the executor moves them).
    pub expert_bytes: u64,
}

impl Geometry {
    /// A validated geometry.
    ///
    /// Errors: [`Error::InvalidGeometry`] for zero layers, zero experts, zero hot experts or zero
    /// bytes, [`Error::HotExceedsExperts`] if `hot_per_layer > experts_per_layer`.
    pub fn new(
        layers: u32,
        experts_per_layer: u32,
        hot_per_layer: u32,
        expert_bytes: u64,
    ) -> Result<Self> {
        let g = Geometry {
            layers,
            experts_per_layer,
            hot_per_layer,
            expert_bytes,
        };
        g.validate()?;
        Ok(g)
    }

    /// Checks the fields (see [`Geometry::new`] for the errors).
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 {
            return Err(Error::InvalidGeometry("zero layers".into()));
        }
        if self.experts_per_layer == 0 {
            return Err(Error::InvalidGeometry("zero experts per layer".into()));
        }
        if self.hot_per_layer == 0 {
            return Err(Error::InvalidGeometry("zero hot experts per layer".into()));
        }
        if self.hot_per_layer > self.experts_per_layer {
            return Err(Error::HotExceedsExperts {
                hot: self.hot_per_layer,
                experts: self.experts_per_layer,
            });
        }
        if self.expert_bytes == 0 {
            return Err(Error::InvalidGeometry("zero expert bytes".into()));
        }
        Ok(())
    }

    /// Number of `(layer, expert)` cells: `layers × experts_per_layer`.
    pub fn cells(&self) -> usize {
        self.layers as usize * self.experts_per_layer as usize
    }

    /// Errors with [`Error::LayerOutOfRange`] unless `layer < layers`.
    pub fn check_layer(&self, layer: u32) -> Result<()> {
        if layer < self.layers {
            Ok(())
        } else {
            Err(Error::LayerOutOfRange {
                layer,
                layers: self.layers,
            })
        }
    }

    /// Errors with [`Error::ExpertOutOfRange`] unless `expert < experts_per_layer`.
    pub fn check_expert(&self, expert: u32) -> Result<()> {
        if expert < self.experts_per_layer {
            Ok(())
        } else {
            Err(Error::ExpertOutOfRange {
                expert,
                experts: self.experts_per_layer,
            })
        }
    }

    /// Errors with [`Error::TopKTooWide`] unless `1 <= top_k <= experts_per_layer`.
    pub fn check_top_k(&self, top_k: u32) -> Result<()> {
        if top_k >= 1 && top_k <= self.experts_per_layer {
            Ok(())
        } else {
            Err(Error::TopKTooWide {
                top_k,
                experts: self.experts_per_layer,
            })
        }
    }

    /// Errors with [`Error::GeometryMismatch`] unless the expert bank (layers, experts, hot set)
    /// of `other` equals this one. `expert_bytes` must match as well.
    pub fn check_same(&self, other: &Geometry) -> Result<()> {
        if self == other {
            Ok(())
        } else {
            Err(Error::GeometryMismatch {
                expected: self.to_string(),
                found: other.to_string(),
            })
        }
    }
}

impl std::fmt::Display for Geometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers × {} experts, {} hot, {} B/expert",
            self.layers, self.experts_per_layer, self.hot_per_layer, self.expert_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_geometry() {
        assert!(matches!(
            Geometry::new(0, 8, 2, 1),
            Err(Error::InvalidGeometry(_))
        ));
        assert!(matches!(
            Geometry::new(2, 0, 0, 1),
            Err(Error::InvalidGeometry(_))
        ));
        assert!(matches!(
            Geometry::new(2, 8, 0, 1),
            Err(Error::InvalidGeometry(_))
        ));
        assert_eq!(
            Geometry::new(2, 8, 9, 1),
            Err(Error::HotExceedsExperts { hot: 9, experts: 8 })
        );
        assert!(matches!(
            Geometry::new(2, 8, 2, 0),
            Err(Error::InvalidGeometry(_))
        ));
        let g = Geometry::new(2, 8, 8, 4).unwrap();
        assert_eq!(g.cells(), 16);
        assert!(g.check_expert(7).is_ok());
        assert_eq!(
            g.check_expert(8),
            Err(Error::ExpertOutOfRange {
                expert: 8,
                experts: 8
            })
        );
        assert!(g.check_top_k(8).is_ok());
        assert!(matches!(g.check_top_k(9), Err(Error::TopKTooWide { .. })));
        assert!(matches!(g.check_top_k(0), Err(Error::TopKTooWide { .. })));
        assert!(g.check_layer(2).is_err());
    }
}
