//! The byte-true scoreboard on a hand-written trace: distinct cold pairs per step, swap copies
//! (net hot-set changes) for LRU and the adaptive controller, the link's stall, deterministic JSON.

use expert_residency::{ControllerConfig, Geometry, LinkCost};
use tierkit_sim::experts::scoreboard::{self, Boot, Policy};
use tierkit_sim::experts::trace::{StepPicks, Trace, TraceShape};
use tierkit_sim::experts::{replay_with, LinkModel, PolicySpec, ReplayOptions, StepBytes};

const EXPERT_BYTES: u64 = 1000;

/// 2 layers × 4 experts, top-2, 2 tokens per step (`[t0e0, t0e1, t1e0, t1e1]` per layer); 2
/// hot per layer, first-K hot = {0, 1}.
fn tiny() -> (Trace, Geometry) {
    let steps = [
        // Layer 0: cold 2 picked by both tokens (one read), cold 3 once. Layer 1: all hot.
        [[2, 3, 2, 0], [0, 1, 1, 0]],
        // Under first-K: layer 0 cold {2, 3}, layer 1 cold {3, 2}.
        [[2, 1, 2, 3], [3, 2, 3, 1]],
        [[0, 1, 0, 1], [0, 1, 1, 0]],
    ];
    let trace = Trace {
        name: "tiny".into(),
        shape: TraceShape {
            layers: 2,
            experts_per_layer: 4,
            top_k: 2,
        },
        steps: steps
            .iter()
            .map(|s| StepPicks {
                layers: s.iter().map(|l| l.to_vec()).collect(),
            })
            .collect(),
        shifts: vec![],
    };
    (trace, Geometry::new(2, 4, 2, EXPERT_BYTES).unwrap())
}

fn opts() -> ReplayOptions {
    ReplayOptions {
        window_steps: 2,
        per_step_bytes: true,
        ..ReplayOptions::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

/// `policy` on [`tiny`] at the default controller config.
fn run(
    policy: &PolicySpec,
    o: &ReplayOptions,
) -> expert_residency::Result<tierkit_sim::experts::ReplayReport> {
    let (t, g) = tiny();
    replay_with(&t, &g, policy, &ControllerConfig::default(), o)
}

/// What the H200 preset charges for a step: reads at 47 GB/s, copies at 55 GB/s + 26.2 µs each.
fn h200_stall(unique: u64, copies: u64) -> f64 {
    (unique * EXPERT_BYTES) as f64 / 47e3
        + (copies * EXPERT_BYTES) as f64 / 55e3
        + copies as f64 * 26.2
}

#[test]
fn static_map_reads_each_cold_expert_once_per_step() {
    let r = run(&PolicySpec::Static(None), &opts()).unwrap();
    let b = &r.bytes;
    let unique: Vec<u64> = b.per_step.iter().map(|s| s.cold_unique_pairs).collect();
    assert_eq!(unique, [2, 4, 0]);
    assert_eq!(r.cold_share_overall, 9.0 / 24.0);
    assert_eq!(b.cold_unique_pairs, 6);
    assert_eq!(b.host_read_bytes, 6 * EXPERT_BYTES);
    assert_eq!((b.swap_copies, b.swap_bytes), (0, 0));
    assert_eq!(b.total_bytes, 6000);
    assert_eq!(b.host_read_bytes_windows, [6000, 0]);
    assert_eq!(b.swap_bytes_windows, [0, 0]);
    assert!(close(b.stall_us, 6000.0 / 47e3));
    assert!(close(b.stall_us_windows[0], b.stall_us));
    assert!(close(b.mean_stall_us_per_step, b.stall_us / 3.0));
    // Steady state: the last 25% of 3 steps is the last step, which reads nothing.
    assert_eq!(r.steady_state.from_step, 2);
    assert_eq!(b.steady_bytes_per_step, 0.0);
    assert_eq!(b.expert_bytes, EXPERT_BYTES);
    assert_eq!(r.boot, "first-k");
}

#[test]
fn lru_counts_every_net_admission_as_a_copy() {
    let r = run(&PolicySpec::Lru(None), &opts()).unwrap();
    let b = &r.bytes;
    // Worked by hand. Eviction order: least recently used (step), then fewest picks at that
    // use, then lowest id; a step's misses are read with the map at its start, admitted at its
    // end. Boot {0, 1} per layer at step 0.
    // Step 0: L0 [2, 3, 2, 0]: 2 (2 picks) and 3 miss (3 cold lookups, 2 reads); {0, 1, 2, 3}
    //   → evict 1 (older), then 0 (1 pick at step 1, lower id than 3): {2, 3}, 2 copies.
    //   L1 all hot.
    // Step 1: L0 [2, 1, 2, 3]: 1 misses (1 read); 1 (1 pick) and 3 (1 pick) tie, 1 has the lower
    //   id: evicted, no copy. L1 [3, 2, 3, 1]: 3 (2 picks) and 2 miss (3 lookups, 2 reads); 0 (step
    //   1) then 1 (1 pick, lowest id) leave: {2, 3}, 2 copies.
    // Step 2: both layers [0, 1, 0, 1] against {2, 3}: 4 lookups, 2 reads, 2 copies each.
    assert_eq!(r.swaps.applied, 8);
    let steps: Vec<(u64, u64)> = b
        .per_step
        .iter()
        .map(|s| (s.cold_unique_pairs, s.swap_copies))
        .collect();
    assert_eq!(steps, [(2, 2), (3, 2), (4, 4)]);
    assert_eq!(r.cold_share_overall, 15.0 / 24.0);
    assert_eq!(b.host_read_bytes, 9 * EXPERT_BYTES);
    assert_eq!((b.swap_copies, b.swap_bytes), (8, 8 * EXPERT_BYTES));
    assert_eq!(b.total_bytes, 17 * EXPERT_BYTES);
    assert_eq!(b.host_read_bytes_windows, [5000, 4000]);
    assert_eq!(b.swap_bytes_windows, [4000, 4000]);
    for (s, want) in b.per_step.iter().zip([(2, 2), (3, 2), (4, 4)]) {
        assert_eq!(s.swap_bytes, s.swap_copies * EXPERT_BYTES);
        assert!(close(s.stall_us, h200_stall(want.0, want.1)), "{s:?}");
    }
    // The same trace with every layer's picks reversed: the same row.
    let (mut t, g) = tiny();
    t.steps
        .iter_mut()
        .flat_map(|s| s.layers.iter_mut())
        .for_each(|l| l.reverse());
    let rev = replay_with(
        &t,
        &g,
        &PolicySpec::Lru(None),
        &ControllerConfig::default(),
        &opts(),
    )
    .unwrap();
    assert_eq!(rev.bytes, r.bytes);
    // The GB300 preset: reads at 340 GB/s, copies at 261.1 GB/s stopping the step.
    let gb = ReplayOptions {
        link: LinkModel::gb300_c2c(),
        ..opts()
    };
    let r = run(&PolicySpec::Lru(None), &gb).unwrap();
    assert!(close(r.bytes.stall_us, 9000.0 / 340e3 + 8000.0 / 261.1e3));
}

#[test]
fn adaptive_swap_bytes_are_the_committed_swaps() {
    let (mut t, g) = tiny();
    // Repeat the trace so the controller has time to move.
    let steps = t.steps.clone();
    for _ in 0..5 {
        t.steps.extend(steps.iter().cloned());
    }
    let cfg = ControllerConfig {
        drain_every: 1,
        half_life_steps: 2.0,
        ..ControllerConfig::published_recipe()
    };
    let r = replay_with(&t, &g, &PolicySpec::Adaptive(None), &cfg, &opts()).unwrap();
    let b = &r.bytes;
    assert!(r.swaps.applied > 0);
    assert_eq!(b.swap_copies, r.swaps.applied);
    assert_eq!(b.swap_bytes, r.swaps.applied * EXPERT_BYTES);
    // Nothing can commit at the first boundary: a swap is begun there and committed at a later one.
    assert_eq!(b.per_step[0].swap_copies, 0);
    assert_eq!(
        b.per_step.iter().map(|s| s.swap_copies).max().unwrap(),
        r.max_swaps_per_step as u64
    );
    // Distinct cold pairs never exceed cold lookups and never exceed layers × (experts − hot).
    for s in &b.per_step {
        assert!(s.cold_unique_pairs <= 4);
        assert_eq!(s.host_read_bytes, s.cold_unique_pairs * EXPERT_BYTES);
        assert!(close(
            s.stall_us,
            h200_stall(s.cold_unique_pairs, s.swap_copies)
        ));
    }
    // Booted from a map, the report says so.
    let seed = expert_residency::ResidencyMap::from_hot_sets("s", g, vec![vec![2, 3], vec![0, 1]])
        .unwrap();
    let r = replay_with(&t, &g, &PolicySpec::Adaptive(Some(seed)), &cfg, &opts()).unwrap();
    assert_eq!(r.boot, "seed");
}

#[test]
fn byte_json_is_deterministic_and_the_scoreboard_prices_it() {
    let (t, g) = tiny();
    let cfg = ControllerConfig {
        drain_every: 1,
        ..ControllerConfig::default()
    };
    let (seed, _) = scoreboard::default_seed_map(&t, &g).unwrap();
    let specs = scoreboard::policy_specs_booted(&Policy::ALL, &t, &seed, Boot::Seed);
    let run = || scoreboard::run_policies(&t, &g, &cfg, &opts(), &specs, &|_| {}).unwrap();
    let a = serde_json::to_string(&run()).unwrap();
    assert_eq!(a, serde_json::to_string(&run()).unwrap());
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    let lru = &v[6]["report"];
    assert_eq!(v[6]["label"], "lru (uncapped)");
    assert_eq!(lru["boot"], "seed");
    assert_eq!(lru["bytes"]["link"]["name"], "h200-pcie");
    assert_eq!(lru["bytes"]["link"]["copy_mode"], "shares-link");
    assert_eq!(lru["bytes"]["per_step"].as_array().unwrap().len(), 3);
    let rows = scoreboard::summarize(&run());
    let boots: Vec<&str> = rows.iter().map(|r| r.boot.as_str()).collect();
    assert_eq!(
        boots,
        [
            "first-k",
            "seed",
            "seed",
            "seed",
            "seed",
            "seed",
            "seed",
            "hindsight",
            "hindsight",
            "optimal"
        ]
    );
    let best = rows
        .iter()
        .find(|r| r.label == scoreboard::BEST_STATIC_LABEL)
        .unwrap();
    assert_eq!(best.link, "h200-pcie");
    assert!(best.swap_gb == 0.0 && best.total_gb == best.host_read_gb);
    // Its own reference: bytes and stall ratios are 1 where it moves bytes at all.
    for x in [best.bytes_vs_best_static, best.stall_vs_best_static]
        .into_iter()
        .flatten()
    {
        assert!(close(x, 1.0));
    }
    let table = scoreboard::render(&rows);
    for col in [
        "boot",
        "host GB read",
        "swap GB",
        "stall ms/step",
        "bytes vs best static",
    ] {
        assert!(table.contains(col), "{table}");
    }
    let legend = scoreboard::legend(&opts(), &t);
    assert!(
        legend.contains("h200-pcie") && legend.contains("47 GB/s"),
        "{legend}"
    );
    // Old reports (before the byte fields) still read.
    let mut old: serde_json::Value = v[0]["report"].clone();
    let o = old.as_object_mut().unwrap();
    o.remove("bytes");
    o.remove("boot");
    let r: tierkit_sim::experts::ReplayReport = serde_json::from_value(old).unwrap();
    assert_eq!(r.bytes.per_step, Vec::<StepBytes>::new());
}

#[test]
fn a_bad_link_is_a_typed_error() {
    let o = ReplayOptions {
        link: LinkModel {
            cost: LinkCost {
                read_gbps: -1.0,
                ..LinkCost::h200_pcie()
            },
            ..LinkModel::h200_pcie()
        },
        ..opts()
    };
    let e = run(&PolicySpec::Static(None), &o).unwrap_err();
    assert!(e.to_string().contains("read_gbps"), "{e}");
}
