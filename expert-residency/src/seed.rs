//! Seed maps: boot maps fitted offline from counter dumps, merged dumps, held-out coverage.

use crate::error::{ExpertError, Result};
use crate::geometry::Geometry;
use crate::picks::StepPicks;
use crate::rowmap::ResidencyMap;

/// Per-`(layer, expert)` pick counts saved from a run (or summed from a trace), `[layers ×
/// experts]` row-major. Counts are f64 so that weighted merges stay dumps (integers up to 2^53
/// are exact).
///
/// Deserializing checks the dump as [`CounterDump::new`] does (a short `counts`, a negative count
/// or a huge shape is a serde error). The fields are public: a dump edited by hand is checked
/// again by every function that reads it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawCounterDump")]
pub struct CounterDump {
    /// Where the counts come from (domain, run id...).
    pub name: String,
    /// MoE layers.
    pub layers: u32,
    /// Experts per layer.
    pub experts_per_layer: u32,
    /// Counts, `[layers × experts_per_layer]` row-major.
    pub counts: Vec<f64>,
}

/// The serialized form of a [`CounterDump`], checked on the way in.
#[derive(serde::Deserialize)]
#[serde(remote = "Self")]
struct RawCounterDump {
    name: String,
    layers: u32,
    experts_per_layer: u32,
    counts: Vec<f64>,
}

named_fields!(@de RawCounterDump, "a counter dump");

impl TryFrom<RawCounterDump> for CounterDump {
    type Error = ExpertError;
    fn try_from(r: RawCounterDump) -> Result<Self> {
        CounterDump::new(r.name, r.layers, r.experts_per_layer, r.counts)
    }
}

/// Largest counter dump file [`CounterDump::load`] reads: 32 bytes per cell of the largest
/// shape ([`crate::MAX_CELLS`]; a count up to 2^53 takes at most 17 digits and a separator) plus
/// 1 MiB, 513 MiB.
pub const MAX_DUMP_FILE_BYTES: u64 = 32 * crate::MAX_CELLS + (1 << 20);

impl CounterDump {
    /// Reads a dump saved as JSON (`{"name", "layers", "experts_per_layer", "counts"}`) and
    /// checks it as [`CounterDump::new`] does. The read is bounded ([`tier_core::read_json`], at
    /// most [`MAX_DUMP_FILE_BYTES`], parsed while it streams): `/dev/zero` fails at its first
    /// byte.
    ///
    /// Errors: [`ExpertError::Format`] naming the file for a missing or unreadable file, a
    /// directory, a file above the cap, bad JSON or a dump that fails the checks.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        tier_core::read_json(path, MAX_DUMP_FILE_BYTES)
            .map_err(|e| ExpertError::Format(e.to_string()))
    }

    /// A dump from counts.
    ///
    /// Errors: [`ExpertError::InvalidGeometry`] for zero layers or experts, or a shape above the bounds
    /// of [`Geometry`] ([`crate::MAX_LAYERS`], [`crate::MAX_EXPERTS_PER_LAYER`],
    /// [`crate::MAX_CELLS`]); [`ExpertError::LengthMismatch`] unless `counts` has `layers ×
    /// experts_per_layer` entries; [`ExpertError::InvalidConfig`] for a negative or non-finite count.
    pub fn new(
        name: impl Into<String>,
        layers: u32,
        experts_per_layer: u32,
        counts: Vec<f64>,
    ) -> Result<Self> {
        let d = CounterDump {
            name: name.into(),
            layers,
            experts_per_layer,
            counts,
        };
        d.validate()?;
        Ok(d)
    }

    /// Checks the dump (see [`CounterDump::new`] for the errors).
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 || self.experts_per_layer == 0 {
            return Err(ExpertError::InvalidGeometry(
                "dump with zero layers or experts".into(),
            ));
        }
        crate::geometry::check_bank_size(self.layers, self.experts_per_layer)
            .map_err(|m| ExpertError::InvalidGeometry(format!("dump {:?}: {m}", self.name)))?;
        let n = self.layers as usize * self.experts_per_layer as usize;
        if self.counts.len() != n {
            return Err(ExpertError::LengthMismatch {
                expected: n,
                found: self.counts.len(),
            });
        }
        if let Some(c) = self.counts.iter().find(|c| !(c.is_finite() && **c >= 0.0)) {
            return Err(ExpertError::InvalidConfig(format!("count {c} is not ≥ 0")));
        }
        Ok(())
    }

    /// A dump of a u32 counter snapshot ([`crate::PickCounters::snapshot`]). Errors: those of
    /// [`CounterDump::new`]; [`ExpertError::OutOfMemory`] if the counts cannot be allocated.
    pub fn from_snapshot(
        name: impl Into<String>,
        geometry: &Geometry,
        snapshot: &[u32],
    ) -> Result<Self> {
        let counts = tier_core::alloc::try_collect(
            snapshot.len(),
            snapshot.iter().map(|&c| c as f64),
            "counter dump",
        )?;
        Self::new(name, geometry.layers, geometry.experts_per_layer, counts)
    }

    /// The picks of `steps` summed per `(layer, expert)` for a `layers × experts` model (e.g. the
    /// steps an engine recorded, or a window of a routing trace).
    ///
    /// Errors: [`ExpertError::EmptyTrace`] for no step, [`ExpertError::InvalidGeometry`] for a shape with zero
    /// or too many cells, [`ExpertError::LengthMismatch`] for a step with the wrong number of layers,
    /// [`ExpertError::ExpertOutOfRange`], [`ExpertError::OutOfMemory`] for counts the host cannot
    /// allocate.
    pub fn from_steps(
        name: impl Into<String>,
        layers: u32,
        experts: u32,
        steps: &[StepPicks],
    ) -> Result<Self> {
        let name = name.into();
        if steps.is_empty() {
            return Err(ExpertError::EmptyTrace(format!("{name}: no step")));
        }
        if layers == 0 || experts == 0 {
            return Err(ExpertError::InvalidGeometry(format!(
                "{name}: zero layers or experts"
            )));
        }
        crate::geometry::check_bank_size(layers, experts)
            .map_err(|m| ExpertError::InvalidGeometry(format!("{name:?}: {m}")))?;
        let mut counts =
            tier_core::alloc::try_filled(layers as usize * experts as usize, 0f64, "counter dump")?;
        for s in steps {
            if s.layers.len() != layers as usize {
                return Err(ExpertError::LengthMismatch {
                    expected: layers as usize,
                    found: s.layers.len(),
                });
            }
            for (l, picks) in s.layers.iter().enumerate() {
                for &e in picks {
                    if e >= experts {
                        return Err(ExpertError::ExpertOutOfRange { expert: e, experts });
                    }
                    counts[l * experts as usize + e as usize] += 1.0;
                }
            }
        }
        Self::new(name, layers, experts, counts)
    }

    /// One layer's counts, `[experts]`.
    pub fn layer(&self, layer: u32) -> Option<&[f64]> {
        let e = self.experts_per_layer as usize;
        self.counts
            .get(layer as usize * e..(layer as usize + 1) * e)
    }

    /// Checks the dump itself ([`CounterDump::validate`]) and that it has `g`'s shape.
    fn check_geometry(&self, g: &Geometry) -> Result<()> {
        self.validate()?;
        if self.layers == g.layers && self.experts_per_layer == g.experts_per_layer {
            Ok(())
        } else {
            Err(ExpertError::GeometryMismatch {
                expected: format!("{} layers × {} experts", g.layers, g.experts_per_layer),
                found: format!(
                    "dump {:?}: {} layers × {} experts",
                    self.name, self.layers, self.experts_per_layer
                ),
            })
        }
    }
}

/// The top `k` expert ids of `counts`, busiest first; ties go to the lower id (deterministic).
pub(crate) fn top_k_experts(counts: &[f64], k: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..counts.len() as u32).collect();
    ids.sort_by(|&a, &b| {
        counts[b as usize]
            .total_cmp(&counts[a as usize])
            .then(a.cmp(&b))
    });
    ids.truncate(k);
    ids
}

/// Fits a boot map: the top `hot_per_layer` experts of each layer of `dump`, busiest in slot 0;
/// ties go to the lower id.
///
/// Errors: [`ExpertError::GeometryMismatch`] if the dump's shape differs from `geometry`; the errors
/// of [`CounterDump::validate`] for a dump edited into an invalid state; geometry errors.
pub fn fit_seed_map(
    model: impl Into<String>,
    geometry: &Geometry,
    dump: &CounterDump,
) -> Result<ResidencyMap> {
    geometry.validate()?;
    dump.check_geometry(geometry)?;
    let e = geometry.experts_per_layer as usize;
    let hot = dump
        .counts
        .chunks_exact(e)
        .map(|row| top_k_experts(row, geometry.hot_per_layer as usize))
        .collect();
    ResidencyMap::from_hot_sets(model, *geometry, hot)
}

/// `Σ row` and the scale it was summed at: 1, or `1 / max(row)` when the plain sum overflows to
/// infinity (counts near `f64::MAX`). Ratios of sums taken at one scale are unaffected.
fn scaled_total(row: &[f64], scale: f64) -> f64 {
    row.iter().map(|c| c * scale).sum()
}

/// The scale at which every partial sum of `counts` stays finite: 1 unless the plain total
/// overflows, then `1 / max(counts)`.
fn sum_scale(counts: &[f64]) -> f64 {
    if counts.iter().sum::<f64>().is_finite() {
        1.0
    } else {
        1.0 / counts.iter().copied().fold(0.0, f64::max)
    }
}

/// Merges dumps with weights: each dump is first normalised per layer to sum 1 (so a long run
/// does not drown a short one), then `Σ weight × share`. The result is a dump of shares.
///
/// Errors: [`ExpertError::EmptyTrace`] for no dump, [`ExpertError::GeometryMismatch`] for dumps of different
/// shapes, [`ExpertError::InvalidConfig`] for a negative, non-finite or all-zero weight; the errors of
/// [`CounterDump::validate`]; [`ExpertError::OutOfMemory`] for counts the host cannot allocate.
pub fn merge_dumps(dumps: &[(&CounterDump, f64)]) -> Result<CounterDump> {
    let (first, _) = dumps
        .first()
        .ok_or_else(|| ExpertError::EmptyTrace("no dump to merge".into()))?;
    let (layers, experts) = (first.layers, first.experts_per_layer);
    if dumps.iter().any(|(_, w)| !(w.is_finite() && *w >= 0.0))
        || dumps.iter().all(|(_, w)| *w == 0.0)
    {
        return Err(ExpertError::InvalidConfig(
            "merge weights must be ≥ 0, not all 0".into(),
        ));
    }
    let mut out = tier_core::alloc::try_filled(first.counts.len(), 0f64, "counter dump")?;
    for (d, w) in dumps {
        if d.layers != layers || d.experts_per_layer != experts {
            return Err(ExpertError::GeometryMismatch {
                expected: format!("{layers} layers × {experts} experts"),
                found: format!("dump {:?}: {} × {}", d.name, d.layers, d.experts_per_layer),
            });
        }
        d.validate()?;
        for (o, row) in out
            .chunks_exact_mut(experts as usize)
            .zip(d.counts.chunks_exact(experts as usize))
        {
            let scale = sum_scale(row);
            let total = scaled_total(row, scale);
            if total > 0.0 {
                o.iter_mut()
                    .zip(row)
                    .for_each(|(o, c)| *o += w * (c * scale) / total);
            }
        }
    }
    let name = dumps
        .iter()
        .map(|(d, w)| format!("{w}×{}", d.name))
        .collect::<Vec<_>>()
        .join("+");
    CounterDump::new(name, layers, experts, out)
}

/// Share of a dump's picks a map serves from HBM (1 − cold share), per layer and overall.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Coverage {
    /// Hot share per layer, `[layers]` (0 for a layer with no picks).
    pub per_layer: Vec<f64>,
    /// Hot share of all picks (0 if none).
    pub overall: f64,
}

impl Coverage {
    /// `1 − overall`: the cold share the map would give on that traffic.
    pub fn cold_share(&self) -> f64 {
        1.0 - self.overall
    }
}

/// The coverage `map` would give on `dump` (held-out check: fit on one dump, measure on another).
/// Counts near `f64::MAX` are summed at a common scale, so the shares stay exact ratios.
///
/// Errors: [`ExpertError::GeometryMismatch`]; the errors of [`CounterDump::validate`].
pub fn seed_coverage(map: &ResidencyMap, dump: &CounterDump) -> Result<Coverage> {
    dump.check_geometry(map.geometry())?;
    let e = dump.experts_per_layer as usize;
    // Counts near f64::MAX would sum to infinity: sum at a common scale (1 for any real dump).
    let scale = sum_scale(&dump.counts);
    let (mut hot_all, mut total_all) = (0.0, 0.0);
    let per_layer = map
        .layers()
        .iter()
        .zip(dump.counts.chunks_exact(e))
        .map(|(row, counts)| {
            let total = scaled_total(counts, scale);
            let hot: f64 = row
                .hot_experts()
                .iter()
                .map(|&x| counts[x as usize] * scale)
                .sum();
            hot_all += hot;
            total_all += total;
            if total > 0.0 {
                hot / total
            } else {
                0.0
            }
        })
        .collect();
    Ok(Coverage {
        per_layer,
        overall: if total_all > 0.0 {
            hot_all / total_all
        } else {
            0.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_merge_cover() {
        let g = Geometry::new(2, 4, 2, 1).unwrap();
        let a = CounterDump::new("a", 2, 4, vec![5., 1., 5., 0., 0., 0., 3., 9.]).unwrap();
        let m = fit_seed_map("m", &g, &a).unwrap();
        assert_eq!(m.hot_sets(), vec![vec![0, 2], vec![3, 2]]);
        let c = seed_coverage(&m, &a).unwrap();
        assert!((c.per_layer[0] - 10.0 / 11.0).abs() < 1e-12);
        assert!((c.overall - 22.0 / 23.0).abs() < 1e-12);
        let b = CounterDump::new("b", 2, 4, vec![0., 10., 0., 10., 1., 1., 0., 0.]).unwrap();
        assert_eq!(seed_coverage(&m, &b).unwrap().per_layer[0], 0.0);
        let mg = merge_dumps(&[(&a, 1.0), (&b, 3.0)]).unwrap();
        // layer 0: a shares [5,1,5,0]/11, b shares [0,.5,0,.5] ×3
        assert_eq!(top_k_experts(mg.layer(0).unwrap(), 2), vec![1, 3]);
        assert!(merge_dumps(&[]).is_err());
        assert!(merge_dumps(&[(&a, -1.0)]).is_err());
        let other = Geometry::new(3, 4, 2, 1).unwrap();
        assert!(matches!(
            fit_seed_map("m", &other, &a),
            Err(ExpertError::GeometryMismatch { .. })
        ));
        assert!(CounterDump::new("x", 2, 4, vec![0.; 7]).is_err());
    }

    #[test]
    fn malformed_dumps_are_errors_not_panics() {
        let g = Geometry::new(2, 4, 2, 1).unwrap();
        // Short counts: serde refuses it; edited by hand, fit and coverage refuse it.
        let e = serde_json::from_str::<CounterDump>(
            r#"{"name": "s", "layers": 2, "experts_per_layer": 4, "counts": [1, 2]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("length mismatch"), "{e}");
        for json in [
            r#"{"name": "n", "layers": 1, "experts_per_layer": 2, "counts": [1, -2]}"#,
            r#"{"name": "z", "layers": 0, "experts_per_layer": 2, "counts": []}"#,
            r#"{"name": "h", "layers": 100000, "experts_per_layer": 100000, "counts": []}"#,
        ] {
            assert!(serde_json::from_str::<CounterDump>(json).is_err(), "{json}");
        }
        let ok = CounterDump::new("a", 2, 4, vec![1.; 8]).unwrap();
        let back: CounterDump = serde_json::from_str(&serde_json::to_string(&ok).unwrap()).unwrap();
        assert_eq!(back, ok);
        let mut short = ok.clone();
        short.counts.truncate(3);
        assert!(matches!(
            fit_seed_map("m", &g, &short),
            Err(ExpertError::LengthMismatch { .. })
        ));
        let map = fit_seed_map("m", &g, &ok).unwrap();
        assert!(matches!(
            seed_coverage(&map, &short),
            Err(ExpertError::LengthMismatch { .. })
        ));
        assert!(merge_dumps(&[(&ok, 1.0), (&short, 1.0)]).is_err());
    }

    #[test]
    fn huge_counts_do_not_overflow_coverage() {
        let g = Geometry::new(1, 4, 2, 1).unwrap();
        let big = f64::MAX / 2.0;
        let d = CounterDump::new("big", 1, 4, vec![big, big, big, 0.0]).unwrap();
        let map = fit_seed_map("m", &g, &d).unwrap();
        let c = seed_coverage(&map, &d).unwrap();
        assert!((c.overall - 2.0 / 3.0).abs() < 1e-12, "{c:?}");
        assert!((c.per_layer[0] - 2.0 / 3.0).abs() < 1e-12, "{c:?}");
        let m = merge_dumps(&[(&d, 1.0)]).unwrap();
        assert!((m.counts[0] - 1.0 / 3.0).abs() < 1e-12, "{:?}", m.counts);
    }
}
