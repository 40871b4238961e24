//! Rowmaps: which experts of each layer are hot (in an HBM slot) and which are not resident
//! (cold: read in place from pinned host memory).

use crate::error::{ExpertError, Result};
use crate::executor::PlannedSwap;
use crate::geometry::Geometry;
use tier_core::alloc::{try_collect, try_copied, try_filled};
use tier_core::{CoreError, PageMap, NOT_RESIDENT};

/// Format tag written into saved maps.
pub const MAP_FORMAT: &str = "tierkit.expert-residency.rowmap";
/// Version of the saved map format.
pub const MAP_VERSION: u32 = 1;
/// Largest saved map [`ResidencyMap::load`] reads: 16 bytes per hot expert of the largest
/// geometry ([`crate::MAX_CELLS`]; pretty JSON of ids below 2^20 takes at most 15) plus 1 MiB,
/// 257 MiB.
pub const MAX_MAP_FILE_BYTES: u64 = 16 * crate::MAX_CELLS + (1 << 20);

/// One layer's rowmap: a [`tier_core::PageMap`] with experts as logical entries and hot slots as
/// physical pages (expert → slot, [`NOT_RESIDENT`] for a cold expert), plus the inverse table
/// slot → expert.
///
/// The page map's generation is the layer's one generation: it starts at 0 and every applied swap
/// bumps it by exactly one ([`tier_core::PageMap::move_page`]), which planned swaps are stamped
/// with and executors and banks check against.
///
/// Invariant: exactly `hot` experts are hot, each in a distinct slot `0..hot`, and the two tables
/// are inverse to each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowMap {
    map: PageMap,
    expert_in: Vec<u32>,
}

impl RowMap {
    /// A layer map whose hot slot `i` holds `hot[i]`, at generation 0.
    ///
    /// Errors: [`ExpertError::ExpertOutOfRange`] for an id `>= experts`, [`ExpertError::InvalidRowMap`] for a
    /// duplicate id or an empty hot set, [`ExpertError::HotExceedsExperts`] if `hot` is longer than
    /// `experts`, [`ExpertError::OutOfMemory`] if the `4 × experts`-byte table cannot be
    /// allocated.
    pub fn from_hot(experts: u32, hot: &[u32]) -> Result<Self> {
        if hot.is_empty() {
            return Err(ExpertError::InvalidRowMap("empty hot set".into()));
        }
        if hot.len() > experts as usize {
            return Err(ExpertError::HotExceedsExperts {
                hot: hot.len() as u32,
                experts,
            });
        }
        let mut table = try_filled(experts as usize, NOT_RESIDENT, "residency map table")?;
        for (slot, &e) in hot.iter().enumerate() {
            if e >= experts {
                return Err(ExpertError::ExpertOutOfRange { expert: e, experts });
            }
            if table[e as usize] != NOT_RESIDENT {
                return Err(ExpertError::InvalidRowMap(format!(
                    "expert {e} is hot twice"
                )));
            }
            table[e as usize] = slot as i32;
        }
        Ok(RowMap {
            map: PageMap::from_table(table)?,
            expert_in: try_copied(hot, "residency map hot set")?,
        })
    }

    /// Experts of the layer.
    pub fn experts(&self) -> u32 {
        self.map.len()
    }

    /// Hot slots of the layer.
    pub fn hot_count(&self) -> u32 {
        self.expert_in.len() as u32
    }

    /// The hot slot of `expert`, or `None` if it is cold (or out of range).
    #[inline]
    pub fn slot_of(&self, expert: u32) -> Option<u32> {
        match self.map.table().get(expert as usize) {
            Some(&s) if s >= 0 => Some(s as u32),
            _ => None,
        }
    }

    /// Whether `expert` is hot (false for out-of-range ids).
    #[inline]
    pub fn is_hot(&self, expert: u32) -> bool {
        self.slot_of(expert).is_some()
    }

    /// The expert in hot slot `slot`, if `slot < hot_count()`.
    pub fn expert_in_slot(&self, slot: u32) -> Option<u32> {
        self.expert_in.get(slot as usize).copied()
    }

    /// Hot experts in slot order (`[hot]` u32 ids).
    pub fn hot_experts(&self) -> &[u32] {
        &self.expert_in
    }

    /// The expert → slot table, `[experts]` i32, [`NOT_RESIDENT`] (-1) for cold experts: Pod,
    /// mirror it to a device as-is.
    #[inline]
    pub fn table(&self) -> &[i32] {
        self.map.table()
    }

    /// The underlying page map (experts → hot slots, with the layer's generation).
    pub fn page_map(&self) -> &PageMap {
        &self.map
    }

    /// Generation of the layer: starts at 0, +1 on every applied swap.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.map.generation()
    }

    /// Checks that `swap` (already known to target this layer) applies now: generation current,
    /// `outgoing` in `slot`, `incoming` cold.
    ///
    /// Errors: [`ExpertError::StaleSwap`] (the page map's stale generation, with the layer),
    /// [`ExpertError::ExpertOutOfRange`], [`ExpertError::InvalidSwap`].
    pub fn check_swap(&self, swap: &PlannedSwap) -> Result<()> {
        self.map
            .check_generation(swap.generation)
            .map_err(|e| stale(swap.layer, e))?;
        let experts = self.experts();
        for e in [swap.incoming, swap.outgoing] {
            if e >= experts {
                return Err(ExpertError::ExpertOutOfRange { expert: e, experts });
            }
        }
        if self.expert_in_slot(swap.slot) != Some(swap.outgoing) {
            return Err(ExpertError::InvalidSwap(format!(
                "expert {} is not in slot {} of layer {}",
                swap.outgoing, swap.slot, swap.layer
            )));
        }
        if self.is_hot(swap.incoming) {
            return Err(ExpertError::InvalidSwap(format!(
                "expert {} is already hot in layer {}",
                swap.incoming, swap.layer
            )));
        }
        Ok(())
    }

    /// Applies a checked swap (see [`RowMap::check_swap`]) as one page-map change: the generation
    /// goes up by exactly one. On error nothing changes (also
    /// [`tier_core::CoreError::GenerationExhausted`], as [`ExpertError::Core`], for a map at
    /// [`tier_core::MAX_GENERATION`]).
    pub fn apply(&mut self, swap: &PlannedSwap) -> Result<()> {
        self.check_swap(swap)?;
        self.map.move_page(swap.outgoing, swap.incoming)?;
        self.expert_in[swap.slot as usize] = swap.incoming;
        Ok(())
    }
}

/// tier-core's stale generation as the crate's [`ExpertError::StaleSwap`] (same variant as ever).
fn stale(layer: u32, e: CoreError) -> ExpertError {
    match e {
        CoreError::StaleGeneration { expected, actual } => ExpertError::StaleSwap {
            layer,
            expected,
            actual,
        },
        other => ExpertError::Core(other),
    }
}

/// The rowmaps of every MoE layer of one model, with the model's name and geometry: what a seed
/// map file holds and what the controller evolves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResidencyMap {
    model: String,
    geometry: Geometry,
    layers: Vec<RowMap>,
}

/// The saved form of a [`ResidencyMap`] (versioned JSON).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(remote = "Self")]
pub struct MapFile {
    /// Always [`MAP_FORMAT`].
    pub format: String,
    /// Format version, [`MAP_VERSION`].
    pub version: u32,
    /// Model name (free text, e.g. `"olmoe-1b-7b"`).
    pub model: String,
    /// The geometry the map was built for.
    pub geometry: Geometry,
    /// Hot experts per layer in slot order, `[layers][hot_per_layer]`.
    pub hot: Vec<Vec<u32>>,
}

named_fields!(MapFile, "a rowmap file");

impl MapFile {
    /// Reads a saved map as it is on disk, unchecked ([`ResidencyMap::from_file`] checks it
    /// against a geometry): a bounded read ([`tier_core::read_json`], at most
    /// [`MAX_MAP_FILE_BYTES`], parsed while it streams), for callers that read the file before
    /// they know the geometry.
    ///
    /// Errors: [`ExpertError::Format`] naming the file for a missing or unreadable file, a
    /// directory, a file above the cap, or JSON that is not a map file.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        tier_core::read_json(path, MAX_MAP_FILE_BYTES)
            .map_err(|e| ExpertError::Format(e.to_string()))
    }
}

impl ResidencyMap {
    /// The "static first-K" map: experts `0..hot_per_layer` hot in every layer (a uniform map: it
    /// knows nothing of the traffic).
    ///
    /// Errors: geometry errors; [`ExpertError::OutOfMemory`] if the map's tables (`4 × experts`
    /// bytes per layer) cannot be allocated.
    pub fn first_k(model: impl Into<String>, geometry: Geometry) -> Result<Self> {
        geometry.validate()?;
        let hot = try_collect(
            geometry.hot_per_layer as usize,
            0..geometry.hot_per_layer,
            "residency map hot set",
        )?;
        let layers = (0..geometry.layers)
            .map(|_| RowMap::from_hot(geometry.experts_per_layer, &hot))
            .collect::<Result<_>>()?;
        Ok(ResidencyMap {
            model: model.into(),
            geometry,
            layers,
        })
    }

    /// A map from hot sets, `hot[layer]` listing the hot experts in slot order.
    ///
    /// Errors: [`ExpertError::LengthMismatch`] if `hot` does not have `layers` entries,
    /// [`ExpertError::InvalidRowMap`] if a layer does not have exactly `hot_per_layer` distinct experts,
    /// [`ExpertError::ExpertOutOfRange`] for a bad id; invalid geometry errors;
    /// [`ExpertError::OutOfMemory`] if the tables cannot be allocated.
    pub fn from_hot_sets(
        model: impl Into<String>,
        geometry: Geometry,
        hot: Vec<Vec<u32>>,
    ) -> Result<Self> {
        geometry.validate()?;
        if hot.len() != geometry.layers as usize {
            return Err(ExpertError::LengthMismatch {
                expected: geometry.layers as usize,
                found: hot.len(),
            });
        }
        let mut layers = Vec::with_capacity(hot.len());
        for (l, h) in hot.iter().enumerate() {
            if h.len() != geometry.hot_per_layer as usize {
                return Err(ExpertError::InvalidRowMap(format!(
                    "layer {l} has {} hot experts, geometry wants {}",
                    h.len(),
                    geometry.hot_per_layer
                )));
            }
            layers.push(RowMap::from_hot(geometry.experts_per_layer, h)?);
        }
        Ok(ResidencyMap {
            model: model.into(),
            geometry,
            layers,
        })
    }

    /// The model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// All layers' rowmaps, `[layers]`.
    pub fn layers(&self) -> &[RowMap] {
        &self.layers
    }

    /// One layer's rowmap. Errors: [`ExpertError::LayerOutOfRange`].
    pub fn layer(&self, layer: u32) -> Result<&RowMap> {
        self.geometry.check_layer(layer)?;
        Ok(&self.layers[layer as usize])
    }

    /// Whether `expert` of `layer` is hot (false for out-of-range ids).
    #[inline]
    pub fn is_hot(&self, layer: u32, expert: u32) -> bool {
        self.layers
            .get(layer as usize)
            .is_some_and(|m| m.is_hot(expert))
    }

    /// Whether `expert` of `layer` is hot, for ids from outside (bindings, engine input).
    /// Errors: [`ExpertError::LayerOutOfRange`], [`ExpertError::ExpertOutOfRange`].
    pub fn is_hot_checked(&self, layer: u32, expert: u32) -> Result<bool> {
        self.geometry.check_layer(layer)?;
        self.geometry.check_expert(expert)?;
        Ok(self.is_hot(layer, expert))
    }

    /// Hot sets per layer in slot order, `[layers][hot_per_layer]`.
    pub fn hot_sets(&self) -> Vec<Vec<u32>> {
        self.layers
            .iter()
            .map(|m| m.hot_experts().to_vec())
            .collect()
    }

    /// Whether the two maps hold the same hot *sets* (slot order ignored).
    pub fn same_hot_sets(&self, other: &ResidencyMap) -> bool {
        self.geometry == other.geometry
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(a, b)| a.hot_experts().iter().all(|&e| b.is_hot(e)))
    }

    /// Checks that `swap` applies now (layer in range, generation current, ids consistent).
    pub fn check_swap(&self, swap: &PlannedSwap) -> Result<()> {
        self.geometry.check_layer(swap.layer)?;
        self.layers[swap.layer as usize].check_swap(swap)
    }

    /// Applies one swap; errors ([`ExpertError::StaleSwap`], [`ExpertError::InvalidSwap`], range errors) leave
    /// the map unchanged.
    pub fn apply(&mut self, swap: &PlannedSwap) -> Result<()> {
        self.geometry.check_layer(swap.layer)?;
        self.layers[swap.layer as usize].apply(swap)
    }

    /// The swaps that turn this map's hot sets into `target`'s (slot order of `target` is not
    /// reproduced: an incoming expert takes the slot of the expert it replaces). Within a layer the
    /// swaps are stamped with consecutive generations, so they must be applied in order.
    ///
    /// Errors: [`ExpertError::GeometryMismatch`] if `target` has another geometry.
    pub fn plan_transition(&self, target: &ResidencyMap) -> Result<Vec<PlannedSwap>> {
        self.geometry.check_same(&target.geometry)?;
        let mut out = Vec::new();
        for (l, (cur, tgt)) in self.layers.iter().zip(&target.layers).enumerate() {
            let leaving = cur.hot_experts().iter().filter(|&&e| !tgt.is_hot(e));
            let arriving = tgt.hot_experts().iter().filter(|&&e| !cur.is_hot(e));
            for (generation, (&outgoing, &incoming)) in
                (cur.generation()..).zip(leaving.zip(arriving))
            {
                let slot = cur.slot_of(outgoing).expect("leaving expert is hot");
                out.push(PlannedSwap {
                    layer: l as u32,
                    incoming,
                    outgoing,
                    slot,
                    generation,
                });
            }
        }
        Ok(out)
    }

    /// The saved form.
    pub fn to_file(&self) -> MapFile {
        MapFile {
            format: MAP_FORMAT.into(),
            version: MAP_VERSION,
            model: self.model.clone(),
            geometry: self.geometry,
            hot: self.hot_sets(),
        }
    }

    /// Versioned JSON (pretty, deterministic).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.to_file()).expect("map file serializes")
    }

    /// Loads a map saved by [`ResidencyMap::to_json`] and checks it against the model's geometry.
    ///
    /// Errors: [`ExpertError::Format`] for bad JSON, another format tag or an unsupported version,
    /// [`ExpertError::GeometryMismatch`] if the saved geometry differs from `expected`, rowmap errors for
    /// invalid hot sets.
    pub fn from_json(json: &str, expected: &Geometry) -> Result<Self> {
        let file: MapFile =
            serde_json::from_str(json).map_err(|e| ExpertError::Format(e.to_string()))?;
        Self::from_file(file, expected)
    }

    /// Builds a map from its saved form, checked against `expected` (see [`ResidencyMap::from_json`]).
    pub fn from_file(file: MapFile, expected: &Geometry) -> Result<Self> {
        if file.format != MAP_FORMAT {
            return Err(ExpertError::Format(format!(
                "format tag {:?}, expected {MAP_FORMAT:?}",
                file.format
            )));
        }
        if file.version != MAP_VERSION {
            return Err(ExpertError::Format(format!(
                "map version {} unsupported (this build reads {MAP_VERSION})",
                file.version
            )));
        }
        expected.validate()?;
        expected.check_same(&file.geometry)?;
        Self::from_hot_sets(file.model, file.geometry, file.hot)
    }

    /// Saves [`ResidencyMap::to_json`] to `path`. Errors: [`ExpertError::Format`] with the I/O error.
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        std::fs::write(path, self.to_json())
            .map_err(|e| ExpertError::Format(format!("{}: {e}", path.display())))
    }

    /// Loads a map from `path` (see [`ResidencyMap::from_json`]). The read is bounded
    /// ([`tier_core::read_json`], at most [`MAX_MAP_FILE_BYTES`], parsed while it streams):
    /// `/dev/zero` or a huge file fails without being held in memory.
    ///
    /// Errors: as [`ResidencyMap::from_json`], [`ExpertError::Format`] naming the file (a
    /// missing or unreadable file, a directory, a file above the cap, bad JSON, another format
    /// tag or version).
    pub fn load(path: &std::path::Path, expected: &Geometry) -> Result<Self> {
        Self::from_file(MapFile::load(path)?, expected).map_err(|e| match e {
            ExpertError::Format(m) => ExpertError::Format(format!("{}: {m}", path.display())),
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry::new(2, 8, 3, 16).unwrap()
    }

    #[test]
    fn is_hot_checked_refuses_ids_out_of_range() {
        let m = ResidencyMap::first_k("m", geo()).unwrap();
        let g = geo();
        assert!(m.is_hot_checked(0, 0).unwrap());
        assert!(!m.is_hot_checked(0, g.hot_per_layer).unwrap());
        assert!(matches!(
            m.is_hot_checked(g.layers, 0),
            Err(ExpertError::LayerOutOfRange { .. })
        ));
        assert!(matches!(
            m.is_hot_checked(0, g.experts_per_layer),
            Err(ExpertError::ExpertOutOfRange { .. })
        ));
    }

    #[test]
    fn swap_and_generation() {
        let mut m = ResidencyMap::first_k("t", geo()).unwrap();
        let s = PlannedSwap {
            layer: 1,
            incoming: 6,
            outgoing: 1,
            slot: 1,
            generation: 0,
        };
        m.apply(&s).unwrap();
        assert!(m.is_hot(1, 6) && !m.is_hot(1, 1));
        assert_eq!(m.layer(1).unwrap().generation(), 1);
        assert_eq!(m.layer(1).unwrap().table()[6], 1);
        // Same swap again: stale.
        assert!(matches!(m.apply(&s), Err(ExpertError::StaleSwap { .. })));
        let before = m.clone();
        let bad = PlannedSwap {
            generation: 1,
            incoming: 0,
            ..s
        };
        assert!(matches!(m.apply(&bad), Err(ExpertError::InvalidSwap(_))));
        let bad = PlannedSwap {
            generation: 1,
            incoming: 9,
            outgoing: 6,
            ..s
        };
        assert!(matches!(
            m.apply(&bad),
            Err(ExpertError::ExpertOutOfRange { .. })
        ));
        assert_eq!(m, before);
    }

    #[test]
    fn json_round_trip_and_geometry_check() {
        let g = geo();
        let m =
            ResidencyMap::from_hot_sets("olmoe", g, vec![vec![7, 2, 5], vec![0, 1, 3]]).unwrap();
        let j = m.to_json();
        let back = ResidencyMap::from_json(&j, &g).unwrap();
        assert_eq!(back.hot_sets(), m.hot_sets());
        assert_eq!(back.model(), "olmoe");
        let other = Geometry::new(2, 8, 4, 16).unwrap();
        assert!(matches!(
            ResidencyMap::from_json(&j, &other),
            Err(ExpertError::GeometryMismatch { .. })
        ));
        let j2 = j.replace("\"version\": 1", "\"version\": 9");
        assert!(matches!(
            ResidencyMap::from_json(&j2, &g),
            Err(ExpertError::Format(_))
        ));
        assert!(matches!(
            ResidencyMap::from_json("{", &g),
            Err(ExpertError::Format(_))
        ));
    }

    #[test]
    fn bad_hot_sets() {
        let g = geo();
        assert!(matches!(
            ResidencyMap::from_hot_sets("x", g, vec![vec![1, 1, 2], vec![0, 1, 2]]),
            Err(ExpertError::InvalidRowMap(_))
        ));
        assert!(matches!(
            ResidencyMap::from_hot_sets("x", g, vec![vec![1, 2], vec![0, 1, 2]]),
            Err(ExpertError::InvalidRowMap(_))
        ));
        assert!(matches!(
            ResidencyMap::from_hot_sets("x", g, vec![vec![1, 2, 8], vec![0, 1, 2]]),
            Err(ExpertError::ExpertOutOfRange { .. })
        ));
        assert!(matches!(
            ResidencyMap::from_hot_sets("x", g, vec![vec![0, 1, 2]]),
            Err(ExpertError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn transition_reaches_target() {
        let g = geo();
        let mut a = ResidencyMap::first_k("x", g).unwrap();
        let b = ResidencyMap::from_hot_sets("x", g, vec![vec![7, 2, 5], vec![0, 6, 1]]).unwrap();
        for s in a.plan_transition(&b).unwrap() {
            a.apply(&s).unwrap();
        }
        assert!(a.same_hot_sets(&b));
    }

    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        #[derive(Clone, Debug)]
        enum Op {
            /// Swap slot `slot % hot` of `layer` with the `pick`-th cold expert; `stale` uses an
            /// old generation, `wrong` names an expert that is not in the slot.
            Swap {
                layer: u32,
                slot: u32,
                pick: u32,
                stale: bool,
                wrong: bool,
            },
            /// Move to a random target map through `plan_transition`.
            Transition(Vec<u32>),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0..3u32, 0..4u32, 0..16u32, prop::bool::weighted(0.2), prop::bool::weighted(0.1))
                    .prop_map(|(layer, slot, pick, stale, wrong)| Op::Swap { layer, slot, pick, stale, wrong }),
                1 => prop::collection::vec(0..1000u32, 3).prop_map(Op::Transition),
            ]
        }

        fn check(m: &ResidencyMap, model: &[BTreeSet<u32>]) {
            for (row, set) in m.layers().iter().zip(model) {
                let hot: BTreeSet<u32> = row.hot_experts().iter().copied().collect();
                assert_eq!(&hot, set);
                assert_eq!(row.hot_experts().len(), 4);
                for e in 0..row.experts() {
                    match row.slot_of(e) {
                        Some(s) => assert_eq!(row.expert_in_slot(s), Some(e)),
                        None => assert!(!set.contains(&e)),
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn rowmap_matches_model(ops in prop::collection::vec(op(), 1..60)) {
                let g = Geometry::new(3, 10, 4, 1).unwrap();
                let mut m = ResidencyMap::first_k("p", g).unwrap();
                let mut model: Vec<BTreeSet<u32>> = vec![(0..4).collect(); 3];
                for op in ops {
                    match op {
                        Op::Swap { layer, slot, pick, stale, wrong } => {
                            let row = m.layer(layer).unwrap();
                            let slot = slot % 4;
                            let cold: Vec<u32> = (0..10).filter(|&e| !row.is_hot(e)).collect();
                            let incoming = cold[pick as usize % cold.len()];
                            let mut outgoing = row.expert_in_slot(slot).unwrap();
                            if wrong {
                                outgoing = row.expert_in_slot((slot + 1) % 4).unwrap();
                            }
                            let gen0 = row.generation();
                            let swap = PlannedSwap {
                                layer, incoming, outgoing, slot,
                                generation: if stale { gen0.wrapping_sub(1) } else { gen0 },
                            };
                            let before = m.clone();
                            let r = m.apply(&swap);
                            if stale || wrong {
                                prop_assert!(r.is_err());
                                prop_assert_eq!(&m, &before);
                            } else {
                                prop_assert!(r.is_ok());
                                prop_assert_eq!(m.layer(layer).unwrap().generation(), gen0 + 1);
                                model[layer as usize].remove(&outgoing);
                                model[layer as usize].insert(incoming);
                            }
                        }
                        Op::Transition(seeds) => {
                            let hot: Vec<Vec<u32>> = seeds.iter().map(|&s| {
                                let mut v: Vec<u32> = (0..10).collect();
                                v.rotate_left((s % 10) as usize);
                                if s % 3 == 0 { v.reverse(); }
                                v.truncate(4);
                                v
                            }).collect();
                            let target = ResidencyMap::from_hot_sets("p", g, hot.clone()).unwrap();
                            for s in m.plan_transition(&target).unwrap() {
                                m.apply(&s).unwrap();
                            }
                            prop_assert!(m.same_hot_sets(&target));
                            model = hot.into_iter().map(|h| h.into_iter().collect()).collect();
                        }
                    }
                    check(&m, &model);
                }
            }
        }
    }
}
