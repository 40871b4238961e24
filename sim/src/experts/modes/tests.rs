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
    // The optima, by hand: copy-on-miss (Belady's MIN, 1 slot, free boot {1}): step 0 copies 2
    // and keeps 1 (touched again at step 1), step 2 copies 0: 2 copies. In place (min-cost
    // flow): read 2 at step 0, copy 0 in after step 1 (cheaper than reading it): 1000 µs + one
    // copy. Read-or-copy: the copy-on-miss optimum; cpu: none.
    let opts = ModeOptions::default();
    let o = mode_optima(&t, &g, &EngineMode::ALL, &opts, None).unwrap();
    let stall = |mode, bank: &str| {
        o.rows
            .iter()
            .find(|r| r.mode == mode && r.bank == bank)
            .map(|r| r.stall_ms_per_step * 3e3)
    };
    for bank in ["per-layer", "shared"] {
        assert!((stall(EngineMode::InPlace, bank).unwrap() - (1000.0 + copy)).abs() < 1e-6);
        assert!((stall(EngineMode::CopyOnMiss, bank).unwrap() - 2.0 * copy).abs() < 1e-6);
        assert!((stall(EngineMode::ReadOrCopy, bank).unwrap() - 2.0 * copy).abs() < 1e-6);
        assert_eq!(stall(EngineMode::Cpu, bank), None);
    }
    let mut rows = rows;
    o.fill(&mut rows);
    assert!((rows[0].vs_optimum.unwrap() - 3000.0 / (1000.0 + copy)).abs() < 1e-9);
    assert!((rows[1].vs_optimum.unwrap() - 1.5).abs() < 1e-9);
    assert_eq!(rows[3].vs_optimum, None);
    let m = ResidencyMap::first_k("t", g).unwrap();
    let rows = rows_of(&t, &g, ModePolicy::Map(m), LinkModel::gb300_c2c());
    // GB300: read-or-copy's optimum is not computed (a read is cheaper than a copy).
    let o = mode_optima(
        &t,
        &g,
        &[EngineMode::ReadOrCopy],
        &ModeOptions {
            link: LinkModel::gb300_c2c(),
            ..ModeOptions::default()
        },
        None,
    )
    .unwrap();
    assert!(o.rows.is_empty() && o.notes.len() == 2, "{o:?}");
    assert_eq!(rows[2].reads, 3);
    assert_eq!(rows[2].stall_ms_per_step, rows[0].stall_ms_per_step);
}

/// In place, the map-driven replay charges what the scoreboard's replay charges, step for step
/// summed (the controller rows and the fixed maps), and the scoreboard's `lru (uncapped)` row is
/// the per-layer LRU bank's in-place row, whatever the order of picks within a step.
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
        (
            PolicySpec::Lru(None),
            ModePolicy::Lru(BankScope::PerLayer, Some(first_k.clone())),
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
    // Reversing every layer's picks moves no row of the scoreboard's LRU.
    let mut rev = t.clone();
    for st in &mut rev.steps {
        for l in &mut st.layers {
            l.reverse();
        }
    }
    let lru = |t: &Trace| {
        let o = ReplayOptions::default();
        replay_with(
            t,
            &g,
            &PolicySpec::Lru(None),
            &ControllerConfig::default(),
            &o,
        )
        .unwrap()
        .bytes
    };
    assert_eq!(lru(&t), lru(&rev));
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
    let optima = mode_optima(&t, &g, &EngineMode::ALL, &opts, None).unwrap();
    // In place and copy-on-miss, per layer and shared; none for cpu, nor for read-or-copy (a
    // 1 MiB expert's copy, 45.3 µs with its fixed cost, is dearer than its read, 22.3 µs).
    assert_eq!(optima.rows.len(), 4);
    assert_eq!(optima.notes.len(), 4);
    assert!(optima
        .notes
        .iter()
        .all(|n| n.starts_with("cpu ") || n.starts_with("read-or-copy ")));
    let mut filled = a.clone();
    optima.fill(&mut filled);
    for r in &filled {
        match r.mode {
            EngineMode::Cpu | EngineMode::ReadOrCopy => assert_eq!(r.vs_optimum, None),
            _ => assert!(r.vs_optimum.unwrap() >= 1.0 - 1e-9, "{r:?}"),
        }
    }
    let table = render_modes(&filled, &optima.rows);
    assert!(table.contains("copy-on-miss") && table.contains("shared"));
    assert!(table.contains("offline optimum") && table.contains("vs optimum"));
    assert!(modes_legend(&opts).contains("Belady's MIN"));
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

/// The default's row: in place, cpu (and read-or-copy where a read is cheaper) it is the
/// controller's row, unchanged; in copy-on-miss (and read-or-copy where a copy is cheaper than
/// one read) it is the [`DuelBank`] replay, and on the default scenario's first 300 steps at
/// batch 1 and 32 it stalls no more than the per-layer LRU bank.
#[test]
fn default_row_is_the_controller_in_place_and_the_duel_bank_on_a_miss() {
    for tokens in [1, 32] {
        let mut cfg = synth::SynthConfig::default_scenario();
        cfg.steps = 300;
        cfg.tokens_per_step = tokens;
        cfg.phases[1].start_step = 150;
        let t = synth::generate(&cfg).unwrap();
        let s = t.shape;
        for (link, b) in [
            (LinkModel::h200_pcie(), 12 << 20),
            (LinkModel::gb300_c2c(), 12 << 20),
        ] {
            let g = Geometry::new(s.layers, s.experts_per_layer, 16, b).unwrap();
            let fk = ResidencyMap::first_k("t", g).unwrap();
            let ctl = rows_of(
                &t,
                &g,
                ModePolicy::Controller(fk.clone(), Box::default()),
                link.clone(),
            );
            let def = rows_of(
                &t,
                &g,
                ModePolicy::Default(fk.clone(), Box::default()),
                link.clone(),
            );
            let lru = rows_of(
                &t,
                &g,
                ModePolicy::Lru(BankScope::PerLayer, Some(fk.clone())),
                link.clone(),
            );
            assert_eq!(def[0], ctl[0]);
            assert_eq!(def[3], ctl[3]);
            let mut bank = DuelBank::new(&g, &fk, ControllerConfig::default(), &link).unwrap();
            let (mut copies, mut us) = (0, 0.0);
            for st in &t.steps {
                let c = bank.step(st).unwrap();
                copies += c.serving_copies;
                us += c.stall_us;
            }
            assert_eq!(def[1].copies, copies);
            assert_eq!((def[1].reads, def[1].cpu), (0, 0));
            assert!((def[1].stall_ms_per_step * 1e3 * 300.0 - us).abs() < 1e-6 * us);
            let copy_first = price::read_or_copy(&link, b, 0.0) == price::Channel::Copy;
            if copy_first {
                assert_eq!(def[2].copies, def[1].copies);
                assert_eq!(def[2].stall_ms_per_step, def[1].stall_ms_per_step);
            } else {
                assert_eq!(def[2], ctl[2]);
            }
            assert!(
                def[1].stall_ms_per_step <= lru[1].stall_ms_per_step * 1.01,
                "batch {tokens}: {} vs {}",
                def[1].stall_ms_per_step,
                lru[1].stall_ms_per_step
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// Every row of the modes table (all six policies, both boots' first-K) stalls at least the
    /// offline optimum of its mode and bank, on small random traces, on both link presets.
    #[test]
    fn every_row_is_at_or_above_its_optimum(
        hot in 1u32..4,
        raw in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(0u32..6, 0..4), 2),
            1..40,
        ),
        gb300 in proptest::bool::ANY,
    ) {
        let steps: Vec<StepPicks> = raw
            .into_iter()
            .map(|layers| StepPicks { layers })
            .collect();
        let t = Trace {
            name: "t".into(),
            shape: TraceShape { layers: 2, experts_per_layer: 6, top_k: 3 },
            steps,
            shifts: vec![],
        };
        let g = Geometry::new(2, 6, hot, B).unwrap();
        let seed = ResidencyMap::first_k("seed", g).unwrap();
        let pol = mode_policies(&t, &g, &seed, Boot::FirstK).unwrap();
        let opts = ModeOptions {
            link: if gb300 { LinkModel::gb300_c2c() } else { LinkModel::h200_pcie() },
            ..ModeOptions::default()
        };
        let mut rows = mode_rows(&t, &g, &pol, &EngineMode::ALL, &opts).unwrap();
        let optima = mode_optima(&t, &g, &EngineMode::ALL, &opts, None).unwrap();
        optima.fill(&mut rows);
        for r in &rows {
            let o = optima.rows.iter().find(|o| o.mode == r.mode && o.bank == r.bank);
            if let Some(o) = o {
                proptest::prop_assert!(
                    r.stall_ms_per_step >= o.stall_ms_per_step * (1.0 - 1e-9),
                    "{r:?} below {o:?}"
                );
            }
        }
        // The shared bank's optimum is at most the per-layer one's (it may move slots).
        for mode in [EngineMode::InPlace, EngineMode::CopyOnMiss] {
            let s = |bank: &str| optima.rows.iter()
                .find(|o| o.mode == mode && o.bank == bank).unwrap().stall_ms_per_step;
            proptest::prop_assert!(s("shared") <= s("per-layer") * (1.0 + 1e-9));
        }
    }
}
