//! The shape of a MoE model's expert bank and of its hot (HBM) set.

use crate::error::{ExpertError, Result};

/// Most MoE layers a [`Geometry`] or trace shape may have (4,096; real models have ≤ 100).
pub const MAX_LAYERS: u32 = 4096;
/// Most experts per layer a [`Geometry`] or trace shape may have (2^20 = 1,048,576; real models
/// have ≤ 512).
pub const MAX_EXPERTS_PER_LAYER: u32 = 1 << 20;
/// Most `(layer, expert)` cells, `layers × experts_per_layer`, a [`Geometry`] or trace shape may
/// have (2^24 = 16,777,216; DeepSeek-V3 has 58 × 256 = 14,848). Every per-cell table of the crate
/// (counters, EMA, rowmaps) is then at most 2^24 entries.
pub const MAX_CELLS: u64 = 1 << 24;

/// Checks `layers` and `experts` against [`MAX_LAYERS`], [`MAX_EXPERTS_PER_LAYER`] and
/// [`MAX_CELLS`]; the error names what is too large.
pub(crate) fn check_bank_size(layers: u32, experts: u32) -> std::result::Result<(), String> {
    if layers > MAX_LAYERS {
        return Err(format!("{layers} layers exceed the limit of {MAX_LAYERS}"));
    }
    if experts > MAX_EXPERTS_PER_LAYER {
        return Err(format!(
            "{experts} experts per layer exceed the limit of {MAX_EXPERTS_PER_LAYER}"
        ));
    }
    let cells = layers as u64 * experts as u64;
    if cells > MAX_CELLS {
        return Err(format!(
            "{layers} layers × {experts} experts = {cells} cells exceed the limit of {MAX_CELLS}"
        ));
    }
    Ok(())
}

/// The expert bank of a MoE model and the size of its hot set.
///
/// Every MoE layer has `experts_per_layer` experts of `expert_bytes` bytes each; exactly
/// `hot_per_layer` of them live in HBM ("hot"), the rest in pinned host memory ("cold").
/// Build it with [`Geometry::new`], which validates it. Bounds (generous; real models are far
/// below): `layers ≤` [`MAX_LAYERS`], `experts_per_layer ≤` [`MAX_EXPERTS_PER_LAYER`],
/// `layers × experts_per_layer ≤` [`MAX_CELLS`], and the whole bank,
/// `layers × experts_per_layer × expert_bytes`, must fit in a `u64` of bytes.
///
/// Example: OLMoE-1B-7B has 16 layers of 64 experts (top-8); a 25% HBM budget is
/// `Geometry::new(16, 64, 16, bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
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

named_fields!(Geometry, "a geometry");

impl Geometry {
    /// Checks a `layers × experts` shape against [`MAX_LAYERS`], [`MAX_EXPERTS_PER_LAYER`] and
    /// [`MAX_CELLS`] before anything of that shape is allocated (trace readers, profiles, dumps).
    ///
    /// Errors: [`ExpertError::InvalidGeometry`] naming what is too large.
    pub fn check_shape(layers: u32, experts: u32) -> Result<()> {
        check_bank_size(layers, experts).map_err(ExpertError::InvalidGeometry)
    }

    /// A validated geometry.
    ///
    /// Errors: [`ExpertError::InvalidGeometry`] for zero layers, zero experts, zero hot experts or zero
    /// bytes, for a bank above the bounds of [`Geometry`] (layers, experts, cells) or whose bytes
    /// overflow a `u64`; [`ExpertError::HotExceedsExperts`] if `hot_per_layer > experts_per_layer`.
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
            return Err(ExpertError::InvalidGeometry("zero layers".into()));
        }
        if self.experts_per_layer == 0 {
            return Err(ExpertError::InvalidGeometry(
                "zero experts per layer".into(),
            ));
        }
        if self.hot_per_layer == 0 {
            return Err(ExpertError::InvalidGeometry(
                "zero hot experts per layer".into(),
            ));
        }
        if self.hot_per_layer > self.experts_per_layer {
            return Err(ExpertError::HotExceedsExperts {
                hot: self.hot_per_layer,
                experts: self.experts_per_layer,
            });
        }
        if self.expert_bytes == 0 {
            return Err(ExpertError::InvalidGeometry("zero expert bytes".into()));
        }
        check_bank_size(self.layers, self.experts_per_layer)
            .map_err(ExpertError::InvalidGeometry)?;
        if self.bank_bytes().is_none() {
            return Err(ExpertError::InvalidGeometry(format!(
                "{} cells × {} bytes per expert overflow a u64",
                self.cells(),
                self.expert_bytes
            )));
        }
        Ok(())
    }

    /// Bytes of the whole expert bank, `layers × experts_per_layer × expert_bytes` (what pinned
    /// host memory holds), or `None` if it overflows a `u64` (never for a validated geometry).
    pub fn bank_bytes(&self) -> Option<u64> {
        (self.layers as u64)
            .checked_mul(self.experts_per_layer as u64)?
            .checked_mul(self.expert_bytes)
    }

    /// Bytes of the hot set, `layers × hot_per_layer × expert_bytes` (what HBM holds), or `None`
    /// if it overflows a `u64` (never for a validated geometry).
    pub fn hot_bytes(&self) -> Option<u64> {
        (self.layers as u64)
            .checked_mul(self.hot_per_layer as u64)?
            .checked_mul(self.expert_bytes)
    }

    /// HBM slots per layer: the `hot_per_layer` hot experts' slots plus one **spare**, the slot a
    /// swap copies its incoming expert into while the outgoing one is still read (the outgoing
    /// expert's slot then becomes the spare). The executors (`MemoryExecutor`, the GPU bank) lay
    /// out `layers × slots_per_layer()` slots; at boot the spare is the last one,
    /// [`Geometry::spare_slot`]. This is the one statement of the "hot + 1 slots" rule.
    pub fn slots_per_layer(&self) -> u32 {
        self.hot_per_layer.saturating_add(1)
    }

    /// The slot that is each layer's spare at boot (and after a map is loaded): the last of the
    /// [`Geometry::slots_per_layer`], `hot_per_layer` (the hot experts take slots
    /// `0..hot_per_layer` in map order).
    pub fn spare_slot(&self) -> u32 {
        self.hot_per_layer
    }

    /// Bytes of the HBM slots, `layers × slots_per_layer() × expert_bytes` (the hot set plus one
    /// spare per layer: what an executor's HBM holds), or `None` if it overflows a `u64`.
    pub fn hbm_bytes(&self) -> Option<u64> {
        (self.layers as u64)
            .checked_mul(self.slots_per_layer() as u64)?
            .checked_mul(self.expert_bytes)
    }

    /// Number of `(layer, expert)` cells: `layers × experts_per_layer`.
    pub fn cells(&self) -> usize {
        self.layers as usize * self.experts_per_layer as usize
    }

    /// Errors with [`ExpertError::LayerOutOfRange`] unless `layer < layers`.
    pub(crate) fn check_layer(&self, layer: u32) -> Result<()> {
        if layer < self.layers {
            Ok(())
        } else {
            Err(ExpertError::LayerOutOfRange {
                layer,
                layers: self.layers,
            })
        }
    }

    /// Errors with [`ExpertError::ExpertOutOfRange`] unless `expert < experts_per_layer`.
    pub fn check_expert(&self, expert: u32) -> Result<()> {
        if expert < self.experts_per_layer {
            Ok(())
        } else {
            Err(ExpertError::ExpertOutOfRange {
                expert,
                experts: self.experts_per_layer,
            })
        }
    }

    /// Errors with [`ExpertError::TopKTooWide`] unless `1 <= top_k <= experts_per_layer`.
    pub fn check_top_k(&self, top_k: u32) -> Result<()> {
        if top_k >= 1 && top_k <= self.experts_per_layer {
            Ok(())
        } else {
            Err(ExpertError::TopKTooWide {
                top_k,
                experts: self.experts_per_layer,
            })
        }
    }

    /// Errors with [`ExpertError::GeometryMismatch`] unless the expert bank (layers, experts, hot set)
    /// of `other` equals this one. `expert_bytes` must match as well.
    pub fn check_same(&self, other: &Geometry) -> Result<()> {
        if self == other {
            Ok(())
        } else {
            Err(ExpertError::GeometryMismatch {
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
            Err(ExpertError::InvalidGeometry(_))
        ));
        assert!(matches!(
            Geometry::new(2, 0, 0, 1),
            Err(ExpertError::InvalidGeometry(_))
        ));
        assert!(matches!(
            Geometry::new(2, 8, 0, 1),
            Err(ExpertError::InvalidGeometry(_))
        ));
        assert_eq!(
            Geometry::new(2, 8, 9, 1),
            Err(ExpertError::HotExceedsExperts { hot: 9, experts: 8 })
        );
        assert!(matches!(
            Geometry::new(2, 8, 2, 0),
            Err(ExpertError::InvalidGeometry(_))
        ));
        let g = Geometry::new(2, 8, 8, 4).unwrap();
        assert_eq!(g.cells(), 16);
        assert!(g.check_expert(7).is_ok());
        assert_eq!(
            g.check_expert(8),
            Err(ExpertError::ExpertOutOfRange {
                expert: 8,
                experts: 8
            })
        );
        assert!(g.check_top_k(8).is_ok());
        assert!(matches!(
            g.check_top_k(9),
            Err(ExpertError::TopKTooWide { .. })
        ));
        assert!(matches!(
            g.check_top_k(0),
            Err(ExpertError::TopKTooWide { .. })
        ));
        assert!(g.check_layer(2).is_err());
    }

    #[test]
    fn huge_geometries_are_rejected_not_allocated() {
        for (l, e, h, b) in [
            (u32::MAX, u32::MAX, 1, 1),
            (MAX_LAYERS + 1, 8, 1, 1),
            (2, MAX_EXPERTS_PER_LAYER + 1, 1, 1),
            (4096, 4097, 1, 1),
            (16, 64, 16, u64::MAX),
            (65536, 65536, 65535, 1 << 48),
        ] {
            let e = Geometry::new(l, e, h, b).unwrap_err();
            assert!(matches!(e, ExpertError::InvalidGeometry(_)), "{e}");
        }
        let at_bound = Geometry::new(16, MAX_EXPERTS_PER_LAYER, 4, 1 << 20).unwrap();
        assert_eq!(at_bound.cells() as u64, MAX_CELLS);
        assert_eq!(at_bound.bank_bytes(), Some(MAX_CELLS << 20));
        assert_eq!(at_bound.hot_bytes(), Some(64 << 20));
        assert_eq!(
            at_bound.hbm_bytes(),
            Some(80 << 20),
            "hot + 1 slots per layer"
        );
        assert_eq!((at_bound.slots_per_layer(), at_bound.spare_slot()), (5, 4));
        let e = Geometry::new(4096, 4097, 1, 1).unwrap_err().to_string();
        assert!(e.contains("exceed the limit"), "{e}");
    }
}
