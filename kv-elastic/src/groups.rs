//! [`LayerGroups`]: which layers share one indexer's top-k picks, and so one hot cache per
//! session.

use std::ops::Range;

use crate::error::{KvError, Result};

/// Most layers (arena planes) a `Geometry` may have (DeepSeek-V3 has 61); the layer
/// groups' bitsets are this wide.
pub const MAX_LAYERS: u32 = 4096;

/// Words of the explicit partition's bitset (one bit per layer, [`MAX_LAYERS`] bits).
const WORDS: usize = MAX_LAYERS as usize / 64;

/// A partition of a geometry's layers into contiguous *layer groups*: the layers that resolve the
/// same top-k picks. Each group keeps its own hot-cache state per session (position → hot row,
/// CLOCK marks, call counter; the rows themselves are the session's hot rows in the group's own
/// layer planes), and a resolve or prefetch at any layer of a group fetches its misses into
/// **every** layer of the group. So a hot row only ever maps a position whose bytes are in all
/// of its group's planes, whatever order an engine resolves its layers in: a row a resolve
/// returns always holds the bytes of the layer it was asked for.
///
/// - [`LayerGroups::per_layer`] (the default): every layer its own group, for models whose every
///   layer has its own indexer (DeepSeek-V3.2's and GLM-5's DeepSeek Sparse Attention: each layer
///   picks its own top-k). Exact for any order of resolves.
/// - [`LayerGroups::one`] or [`LayerGroups::every`]`(n)` or [`LayerGroups::from_sizes`]: layers
///   that share one indexer's picks (shared-index models, which run the indexer at a group's first
///   layer and reuse its picks in the next ones): one resolve serves the whole group, its misses
///   copied into all the group's planes at once (one launch instead of a resolve plus a replay per
///   layer).
///
/// Cost of a group (per session slot): on the CPU pool `13 × hot_rows + 4 × history` bytes of
/// host memory; on the GPU pool `4 × max_history + 20 × hot_rows + 12` bytes of HBM (the
/// `position → hot row` table dominates; `kv_elastic::gpu::GpuArena::hot_table_bytes` gives the
/// total). Declare groups as wide as the model's indexer sharing allows.
///
/// Serialized (JSON) as `"per_layer"`, `"one"`, `{"every": n}` or a list of group sizes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerGroups(Repr);

// `Copy` (a field of the `Copy` `Geometry`), so the explicit bitset stays inline (516 bytes).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Repr {
    /// Groups of `n` consecutive layers (the last holds what is left); `n = 1`: per layer.
    Every(u32),
    /// One group holding every layer.
    One,
    /// Explicit sizes: bit `l` of `starts` is set where a group starts (bit 0 always), `layers`
    /// is the sum of the sizes (the geometry's layer count must equal it).
    Sizes { starts: [u64; WORDS], layers: u32 },
}

impl Default for LayerGroups {
    /// [`LayerGroups::per_layer`].
    fn default() -> Self {
        LayerGroups::per_layer()
    }
}

impl std::fmt::Debug for LayerGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Repr::Every(1) => f.write_str("LayerGroups::per_layer()"),
            Repr::Every(n) => write!(f, "LayerGroups::every({n})"),
            Repr::One => f.write_str("LayerGroups::one()"),
            Repr::Sizes { layers, .. } => {
                write!(f, "LayerGroups::from_sizes({:?})", self.sizes(layers))
            }
        }
    }
}

impl LayerGroups {
    /// Every layer its own group (the default): per-layer indexers (DeepSeek-V3.2).
    pub const fn per_layer() -> Self {
        LayerGroups(Repr::Every(1))
    }

    /// One group holding every layer: one indexer's picks serve the whole model.
    pub const fn one() -> Self {
        LayerGroups(Repr::One)
    }

    /// Groups of `n` consecutive layers, the last one holding what is left (`every(1)` is
    /// [`LayerGroups::per_layer`]). Errors: `InvalidGeometry` for `n == 0`.
    pub fn every(n: u32) -> Result<Self> {
        if n == 0 {
            return Err(KvError::InvalidGeometry(
                "layer_groups: a group holds at least one layer",
            ));
        }
        Ok(LayerGroups(Repr::Every(n)))
    }

    /// Explicit group sizes, in layer order: group `i` holds the next `sizes[i]` layers (a mixture
    /// of per-layer and shared groups, e.g. `[1, 1, 4, 4]`). The geometry's `layers` must equal
    /// their sum ([`crate::Geometry::validate`]).
    ///
    /// # Errors
    /// `InvalidGeometry` for an empty list, a zero size, or a sum above [`MAX_LAYERS`].
    pub fn from_sizes(sizes: &[u32]) -> Result<Self> {
        if sizes.is_empty() {
            return Err(KvError::InvalidGeometry("layer_groups: at least one group"));
        }
        let mut starts = [0u64; WORDS];
        let mut at = 0u64;
        for &n in sizes {
            if n == 0 {
                return Err(KvError::InvalidGeometry(
                    "layer_groups: a group holds at least one layer",
                ));
            }
            if at < MAX_LAYERS as u64 {
                starts[(at / 64) as usize] |= 1 << (at % 64);
            }
            at += n as u64; // a sum past MAX_LAYERS is refused below
        }
        if at > MAX_LAYERS as u64 {
            return Err(KvError::InvalidGeometry(
                "layer_groups: the group sizes sum to more than MAX_LAYERS (4096)",
            ));
        }
        Ok(LayerGroups(Repr::Sizes {
            starts,
            layers: at as u32,
        }))
    }

    /// Checks the partition against a geometry of `layers` layers (explicit sizes must sum to
    /// it). Errors: `InvalidGeometry`.
    pub fn validate(&self, layers: u32) -> Result<()> {
        match self.0 {
            Repr::Sizes { layers: sum, .. } if sum != layers => Err(KvError::InvalidGeometry(
                "layer_groups: the group sizes must sum to layers",
            )),
            Repr::Every(0) => Err(KvError::InvalidGeometry(
                "layer_groups: a group holds at least one layer",
            )),
            _ => Ok(()),
        }
    }

    /// Groups of a geometry of `layers` layers.
    pub fn count(&self, layers: u32) -> u32 {
        match self.0 {
            Repr::Every(n) => layers.div_ceil(n.max(1)),
            Repr::One => u32::from(layers > 0),
            Repr::Sizes { starts, .. } => Self::ones_below(&starts, layers),
        }
    }

    /// The group holding `layer` (`layer < layers`; a layer past the end maps past the last group).
    pub fn group_of(&self, layer: u32) -> u32 {
        match self.0 {
            Repr::Every(n) => layer / n.max(1),
            Repr::One => 0,
            Repr::Sizes { starts, .. } => {
                Self::ones_below(&starts, layer.saturating_add(1).min(MAX_LAYERS)) - 1
            }
        }
    }

    /// The layers of group `group` in a geometry of `layers` layers (empty past the last group).
    pub fn layers(&self, group: u32, layers: u32) -> Range<u32> {
        match self.0 {
            Repr::Every(n) => {
                let n = n.max(1) as u64;
                let lo = (group as u64 * n).min(layers as u64) as u32;
                lo..((group as u64 + 1) * n).min(layers as u64) as u32
            }
            Repr::One if group == 0 => 0..layers,
            Repr::One => layers..layers,
            Repr::Sizes { starts, .. } => {
                let mut seen = 0u32;
                let mut lo = None;
                for l in 0..layers.min(MAX_LAYERS) {
                    if starts[(l / 64) as usize] & (1 << (l % 64)) != 0 {
                        if let Some(lo) = lo {
                            return lo..l;
                        }
                        if seen == group {
                            lo = Some(l);
                        }
                        seen += 1;
                    }
                }
                match lo {
                    Some(lo) => lo..layers,
                    None => layers..layers,
                }
            }
        }
    }

    /// The layers of the group holding `layer`.
    pub fn group_layers(&self, layer: u32, layers: u32) -> Range<u32> {
        self.layers(self.group_of(layer), layers)
    }

    /// The group sizes for a geometry of `layers` layers, in layer order.
    pub fn sizes(&self, layers: u32) -> Vec<u32> {
        (0..self.count(layers))
            .map(|g| self.layers(g, layers).len() as u32)
            .collect()
    }

    /// Set bits of `starts` below bit `end`.
    fn ones_below(starts: &[u64; WORDS], end: u32) -> u32 {
        let end = end.min(MAX_LAYERS);
        let (full, rest) = ((end / 64) as usize, end % 64);
        let mut n: u32 = starts[..full].iter().map(|w| w.count_ones()).sum();
        if rest > 0 {
            n += (starts[full] & ((1u64 << rest) - 1)).count_ones();
        }
        n
    }
}

/// The JSON form (see [`LayerGroups`]).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Wire {
    Name(String),
    Every { every: u32 },
    Sizes(Vec<u32>),
}

impl serde::Serialize for LayerGroups {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self.0 {
            Repr::Every(1) => Wire::Name("per_layer".into()),
            Repr::Every(n) => Wire::Every { every: n },
            Repr::One => Wire::Name("one".into()),
            Repr::Sizes { layers, .. } => Wire::Sizes(self.sizes(layers)),
        }
        .serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for LayerGroups {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error;
        match Wire::deserialize(d)? {
            Wire::Name(n) if n == "per_layer" => Ok(LayerGroups::per_layer()),
            Wire::Name(n) if n == "one" => Ok(LayerGroups::one()),
            Wire::Name(n) => Err(D::Error::custom(format!(
                "layer_groups: unknown name {n:?} (expected \"per_layer\", \"one\", {{\"every\": n}} or a list of group sizes)"
            ))),
            Wire::Every { every } => LayerGroups::every(every).map_err(D::Error::custom),
            Wire::Sizes(v) => LayerGroups::from_sizes(&v).map_err(D::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The partition as (group of each layer, layers of each group), checked for consistency.
    fn table(g: &LayerGroups, layers: u32) -> Vec<Range<u32>> {
        let n = g.count(layers);
        let ranges: Vec<_> = (0..n).map(|i| g.layers(i, layers)).collect();
        let mut next = 0;
        for (i, r) in ranges.iter().enumerate() {
            assert_eq!(r.start, next, "{g:?}: contiguous");
            assert!(!r.is_empty(), "{g:?}: group {i} empty");
            for l in r.clone() {
                assert_eq!(g.group_of(l), i as u32, "{g:?}: layer {l}");
                assert_eq!(g.group_layers(l, layers), r.clone());
            }
            next = r.end;
        }
        assert_eq!(next, layers, "{g:?}: covers every layer");
        assert_eq!(g.sizes(layers).iter().sum::<u32>(), layers);
        ranges
    }

    #[test]
    fn partitions_cover_every_layer_once() {
        assert_eq!(table(&LayerGroups::per_layer(), 3), vec![0..1, 1..2, 2..3]);
        assert_eq!(table(&LayerGroups::one(), 5), vec![0..5]);
        assert_eq!(
            table(&LayerGroups::every(2).unwrap(), 5),
            vec![0..2, 2..4, 4..5]
        );
        let mixed = LayerGroups::from_sizes(&[1, 1, 3, 2]).unwrap();
        assert_eq!(table(&mixed, 7), vec![0..1, 1..2, 2..5, 5..7]);
        mixed.validate(7).unwrap();
        assert!(mixed.validate(6).is_err());
        // Groups across a bitset word boundary, and the largest geometry.
        let wide = LayerGroups::from_sizes(&[63, 2, 4031]).unwrap();
        assert_eq!(table(&wide, MAX_LAYERS), vec![0..63, 63..65, 65..4096]);
        let per = LayerGroups::from_sizes(&vec![1; MAX_LAYERS as usize]).unwrap();
        assert_eq!(table(&per, MAX_LAYERS).len(), MAX_LAYERS as usize);
        assert_eq!(table(&LayerGroups::per_layer(), MAX_LAYERS).len(), 4096);
    }

    #[test]
    fn bad_partitions_are_typed_errors() {
        let bad = |r: Result<LayerGroups>| matches!(r, Err(KvError::InvalidGeometry(_)));
        assert!(bad(LayerGroups::from_sizes(&[])));
        assert!(bad(LayerGroups::from_sizes(&[2, 0])));
        assert!(bad(LayerGroups::from_sizes(&[4096, 1])));
        assert!(bad(LayerGroups::from_sizes(&[u32::MAX, u32::MAX])));
        assert!(bad(LayerGroups::every(0)));
    }

    #[test]
    fn serde_round_trips_every_form() {
        for (g, json) in [
            (LayerGroups::per_layer(), r#""per_layer""#),
            (LayerGroups::one(), r#""one""#),
            (LayerGroups::every(4).unwrap(), r#"{"every":4}"#),
            (LayerGroups::from_sizes(&[1, 3]).unwrap(), "[1,3]"),
        ] {
            assert_eq!(serde_json::to_string(&g).unwrap(), json);
            assert_eq!(serde_json::from_str::<LayerGroups>(json).unwrap(), g);
        }
        for bad in [r#""two""#, "[0]", "[]", r#"{"every":0}"#, "-1", "{}"] {
            assert!(serde_json::from_str::<LayerGroups>(bad).is_err(), "{bad}");
        }
    }
}
