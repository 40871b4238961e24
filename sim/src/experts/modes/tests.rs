use expert_residency::StepPicks;

use super::*;
use crate::experts::replay::{replay_with, PolicySpec, ReplayOptions};
use crate::experts::trace::{synth, TraceShape};

const B: u64 = 47_000_000; // 1000 µs in place at 47 GB/s

fn trace(layers: u32, experts: u32, steps: &[&[&[u32]]]) -> Trace {
    Trace {
        name: "t".into(),
        shape: TraceShape {
            layers,
            experts_per_layer: experts,
            top_k: 2,
        },
        steps: steps
            .iter()
            .map(|s| StepPicks {
                layers: s.iter().map(|l| l.to_vec()).collect(),
            })
            .collect(),
        shifts: vec![],
    }
}

fn rows_of(t: &Trace, g: &Geometry, p: ModePolicy, link: LinkModel) -> Vec<ModeRow> {
    let opts = ModeOptions {
        link,
        cpu: CpuChannel::h200(),
    };
    mode_rows(
        t,
        g,
        &[("p".into(), "first-k".into(), p)],
        &EngineMode::ALL,
        &opts,
    )
    .unwrap()
}

/// A fixed first-K map {0} of 1 layer × 4 experts; steps [1, 2], [1, 1], [0]: 3 distinct cold
/// experts in 2 steps (2 + 1), 4 cold picks of 5.
/// - in place: 3 reads × 1000 µs = 3000 µs over 3 steps;
/// - copy-on-miss: 3 copies × (854.545 + 26.2) µs;
/// - read-or-copy on H200 prices: a copy is cheaper than a read, so the same as copy-on-miss;
/// - cpu: step 0 splits 2 (one each: 1000 / 0.9), step 1 puts 1 on the CPU (927.0 µs).
#[test]
fn fixed_map_in_every_mode_by_hand() {
    let g = Geometry::new(1, 4, 1, B).unwrap();
    let t = trace(1, 4, &[&[&[1, 2]], &[&[1, 1]], &[&[0]]]);
    let m = ResidencyMap::first_k("t", g).unwrap();
    let rows = rows_of(&t, &g, ModePolicy::Map(m), LinkModel::h200_pcie());
    assert_eq!(rows.len(), 4);
    let copy = B as f64 / 55e3 + 26.2;
    let cpu = B as f64 / 50.7e3;
    let want = [3000.0, 3.0 * copy, 3.0 * copy, 1000.0 / 0.9 + cpu];
    for (r, w) in rows.iter().zip(want) {
        assert!(
            (r.stall_ms_per_step * 1e3 * 3.0 - w).abs() < 1e-6,
            "{:?}: {} vs {w}",
            r.mode,
            r.stall_ms_per_step * 3e3
        );
        assert!((r.miss_share - 0.8).abs() < 1e-12);
    }
    assert_eq!(
        rows.iter()
            .map(|r| (r.reads, r.copies, r.cpu))
            .collect::<Vec<_>>(),
        [(3, 0, 0), (0, 3, 0), (0, 3, 0), (1, 0, 2)]
    );
    assert_eq!(rows[0].vs_in_place, Some(1.0));
    assert!((rows[1].vs_in_place.unwrap() - 3.0 * copy / 3000.0).abs() < 1e-12);
    // GB300: a read (138.2 µs) is cheaper than a copy (180.0 µs) with no reuse: read-or-copy
    // reads, as in place.
    let m = ResidencyMap::first_k("t", g).unwrap();
    let rows = rows_of(&t, &g, ModePolicy::Map(m), LinkModel::gb300_c2c());
    assert_eq!(rows[2].reads, 3);
    assert_eq!(rows[2].stall_ms_per_step, rows[0].stall_ms_per_step);
}

/// In place, the map-driven replay charges what the scoreboard's replay charges, step for step
/// summed (the controller rows and the fixed maps).
#[test]
fn in_place_matches_the_scoreboard_replay() {
    let mut cfg = synth::SynthConfig::default_scenario();
    cfg.steps = 300;
    cfg.phases[1].start_step = 150;
    let t = synth::generate(&cfg).unwrap();
    let s = t.shape;
    let g = Geometry::new(s.layers, s.experts_per_layer, 16, 1 << 20).unwrap();
    let first_k = ResidencyMap::first_k("t", g).unwrap();
    for (spec, p) in [
        (PolicySpec::Static(None), ModePolicy::Map(first_k.clone())),
        (
            PolicySpec::Controller(None, Box::default()),
            ModePolicy::Controller(first_k.clone(), Box::default()),
        ),
        (
            PolicySpec::Controller(None, Box::new(recency_config())),
            ModePolicy::Controller(first_k.clone(), Box::new(recency_config())),
        ),
    ] {
        let rep = replay_with(
            &t,
            &g,
            &spec,
            &ControllerConfig::default(),
            &ReplayOptions::default(),
        )
        .unwrap();
        let rows = rows_of(&t, &g, p, LinkModel::h200_pcie());
        let r = &rows[0];
        assert_eq!(r.mode, EngineMode::InPlace);
        assert_eq!(r.reads, rep.bytes.cold_unique_pairs, "{}", spec.name());
        assert_eq!(r.copies, rep.bytes.swap_copies, "{}", spec.name());
        let rel = (r.stall_ms_per_step * 1e3 - rep.bytes.mean_stall_us_per_step).abs()
            / rep.bytes.mean_stall_us_per_step;
        assert!(rel < 1e-9, "{}: {rel}", spec.name());
        assert!((r.miss_share - rep.cold_share_overall).abs() < 1e-12);
        // Copy-on-miss under the same policy: no reads, its copies at least the misses.
        let c = &rows[1];
        assert_eq!(c.reads, 0);
        assert!(c.copies >= rep.bytes.cold_unique_pairs);
        // CPU: never slower than the link alone (the split may put everything on the link).
        assert!(rows[3].stall_ms_per_step <= r.stall_ms_per_step + 1e-12);
    }
}

/// The default table: every mode × six policies, grouped by mode, deterministic.
#[test]
fn default_table_has_every_mode_and_is_deterministic() {
    let mut cfg = synth::SynthConfig::default_scenario();
    cfg.steps = 120;
    cfg.phases[1].start_step = 60;
    let t = synth::generate(&cfg).unwrap();
    let s = t.shape;
    let g = Geometry::new(s.layers, s.experts_per_layer, 16, 1 << 20).unwrap();
    let seed = ResidencyMap::first_k("seed", g).unwrap();
    let pol = mode_policies(&t, &g, &seed, Boot::FirstK).unwrap();
    let opts = ModeOptions::default();
    let a = mode_rows(&t, &g, &pol, &EngineMode::ALL, &opts).unwrap();
    let b = mode_rows(&t, &g, &pol, &EngineMode::ALL, &opts).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.len(), 24);
    assert!(a[..6].iter().all(|r| r.mode == EngineMode::InPlace));
    assert!(a[18..].iter().all(|r| r.mode == EngineMode::Cpu));
    let one = mode_rows(&t, &g, &pol, &[EngineMode::CopyOnMiss], &opts).unwrap();
    assert_eq!(one, a[6..12].to_vec());
    let banks: Vec<&str> = a[..6].iter().map(|r| r.bank.as_str()).collect();
    assert_eq!(
        banks,
        [
            "per-layer",
            "per-layer",
            "per-layer",
            "per-layer",
            "per-layer",
            "shared"
        ]
    );
    let table = render_modes(&a);
    assert!(table.contains("copy-on-miss") && table.contains("shared"));
    assert!(modes_legend(&opts).contains("lowest id"));
    // Bad CPU prices are typed errors.
    let bad = ModeOptions {
        cpu: CpuChannel {
            cpu_gbps: f64::NAN,
            together: 0.9,
        },
        ..ModeOptions::default()
    };
    assert!(matches!(
        mode_rows(&t, &g, &pol, &EngineMode::ALL, &bad),
        Err(ExpertError::InvalidConfig(_))
    ));
}
