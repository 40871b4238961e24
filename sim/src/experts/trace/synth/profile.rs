//! [`DomainProfile`]: expert popularity of one domain, from measured anchor layers.

use super::super::olmoe;
use super::super::{TraceError, TraceShape};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Expert popularity of one domain: `shares[layer][expert]`, each row summing to 1.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DomainProfile {
    /// Domain name (e.g. `github`).
    pub name: String,
    /// Pick share per layer and expert id.
    pub shares: Vec<Vec<f64>>,
}

impl DomainProfile {
    /// Builds a profile for `layers` layers from measured anchor layers `(layer, shares)`.
    ///
    /// An anchor layer keeps its measured shares and expert ids. Any other layer `l` sits at
    /// position `x = l · last_anchor / (layers − 1)` between anchors `a ≤ x ≤ b` (`t = (x−a)/(b−a)`):
    /// its **sorted** share curve is the linear mix `(1−t)·sorted(a) + t·sorted(b)` (so the skew
    /// moves smoothly between measured layers), the expert ranking is the nearest anchor's (ties to
    /// the lower one), and ids are then relabelled by a fixed per-layer permutation (ChaCha8,
    /// seeded by the layer only). The relabelling is the same for every domain, so the overlap
    /// between domains' hot sets at a layer is the nearest anchor's, as measured.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for no anchor, anchors of different widths, negative or
    /// non-finite shares, or zero `layers`; [`TraceError::TooLarge`] for `layers × experts` above
    /// the bounds of [`TraceShape::validate`].
    pub fn from_anchors(
        name: &str,
        anchors: &[(u32, Vec<f64>)],
        layers: u32,
    ) -> Result<Self, TraceError> {
        let bad = |m: String| TraceError::InvalidScenario(format!("profile {name}: {m}"));
        if anchors.is_empty() || layers == 0 {
            return Err(bad("needs at least one anchor layer and one layer".into()));
        }
        let experts = anchors[0].1.len();
        // Bound the profile (`layers × experts` shares) before building it.
        u32::try_from(experts)
            .map_err(|_| format!("{experts} experts"))
            .and_then(|e| {
                expert_residency::Geometry::check_shape(layers, e).map_err(|e| e.to_string())
            })
            .map_err(|m| TraceError::TooLarge(format!("profile {name}: {m}")))?;
        let mut anchors: Vec<(u32, Vec<f64>)> = anchors.to_vec();
        anchors.sort_by_key(|a| a.0);
        for (l, s) in &mut anchors {
            if s.len() != experts || experts == 0 {
                return Err(bad(format!("anchor layer {l} has {} experts", s.len())));
            }
            if s.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!(
                    "anchor layer {l} has a negative or non-finite share"
                )));
            }
            let t: f64 = s.iter().sum();
            if t <= 0.0 {
                return Err(bad(format!("anchor layer {l} has no pick")));
            }
            s.iter_mut().for_each(|v| *v /= t);
        }
        let last = anchors.last().map_or(0, |a| a.0) as f64;
        let sorted = |s: &[f64]| {
            let mut order: Vec<usize> = (0..s.len()).collect();
            order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            order
        };
        let mut shares = Vec::with_capacity(layers as usize);
        for l in 0..layers {
            let x = if layers == 1 {
                0.0
            } else {
                l as f64 * last / (layers - 1) as f64
            };
            if let Some(a) = anchors.iter().find(|a| (a.0 as f64 - x).abs() < 1e-9) {
                shares.push(a.1.clone());
                continue;
            }
            let bi = anchors
                .iter()
                .position(|a| a.0 as f64 > x)
                .unwrap_or(anchors.len() - 1);
            let ai = bi.saturating_sub(1);
            let (a, b) = (&anchors[ai], &anchors[bi]);
            let t = if b.0 == a.0 {
                0.0
            } else {
                ((x - a.0 as f64) / (b.0 - a.0) as f64).clamp(0.0, 1.0)
            };
            let (oa, ob) = (sorted(&a.1), sorted(&b.1));
            let rank_order = if t <= 0.5 { &oa } else { &ob };
            let mut perm: Vec<usize> = (0..experts).collect();
            let mut rng = ChaCha8Rng::seed_from_u64(0x7472_6163_6500_0000 ^ l as u64);
            for i in (1..experts).rev() {
                perm.swap(i, rng.random_range(0..=i));
            }
            let mut row = vec![0.0; experts];
            for r in 0..experts {
                let v = (1.0 - t) * a.1[oa[r]] + t * b.1[ob[r]];
                row[perm[rank_order[r]]] = v;
            }
            shares.push(row);
        }
        Ok(Self {
            name: name.to_string(),
            shares,
        })
    }

    /// The OLMoE-1B-7B profile of a domain (`arxiv`, `book`, `c4`, `github`, `tulu`,
    /// `wikipedia`) from the in-code fitted figures, spread over `layers` layers.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for an unknown domain or zero layers.
    pub fn olmoe(domain: &str, layers: u32) -> Result<Self, TraceError> {
        Self::from_anchors(domain, &olmoe::olmoe_anchor_shares(domain)?, layers)
    }

    /// A profile fitted from a parsed `routing-counts.json` (any model in it, e.g. `olmoe`,
    /// `mistral`), spread over `layers` layers.
    ///
    /// # Errors
    /// [`TraceError::InvalidScenario`] for missing entries or ids not below `experts`.
    pub fn from_routing_counts(
        json: &serde_json::Value,
        model: &str,
        domain: &str,
        experts: u32,
        layers: u32,
    ) -> Result<Self, TraceError> {
        let anchors: Vec<(u32, Vec<f64>)> = olmoe::routing_counts(json, model, domain, experts)?
            .into_iter()
            .map(|(l, c)| (l, c.into_iter().map(|v| v as f64).collect()))
            .collect();
        Self::from_anchors(domain, &anchors, layers)
    }

    pub(super) fn validate(&self, shape: &TraceShape) -> Result<(), TraceError> {
        let bad = |m: String| TraceError::InvalidScenario(format!("profile {}: {m}", self.name));
        if self.shares.len() != shape.layers as usize {
            return Err(bad(format!(
                "{} layers, the shape has {}",
                self.shares.len(),
                shape.layers
            )));
        }
        for (l, row) in self.shares.iter().enumerate() {
            if row.len() != shape.experts_per_layer as usize {
                return Err(bad(format!("layer {l} has {} experts", row.len())));
            }
            if row.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!("layer {l} has a negative or non-finite share")));
            }
            let nonzero = row.iter().filter(|&&v| v > 0.0).count();
            if nonzero < shape.top_k as usize {
                return Err(bad(format!(
                    "layer {l}: only {nonzero} experts with a non-zero share for top-{}",
                    shape.top_k
                )));
            }
        }
        Ok(())
    }
}
