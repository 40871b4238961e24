//! The generator's tests: determinism, calibration against the targets, bounds.

use super::*;
use crate::experts::trace::{olmoe, stats, TraceShape};

fn small(steps: u64, shift: u64, seed: u64) -> SynthConfig {
    SynthConfig::olmoe_shift("github", "book", steps, shift, 16, seed).unwrap()
}

#[test]
fn same_seed_same_bytes_other_seed_differs() {
    let cfg = small(60, 30, 7);
    let a = write_binary(&cfg, Vec::new()).unwrap();
    let b = write_binary(&cfg, Vec::new()).unwrap();
    assert_eq!(a, b);
    let c = write_binary(&small(60, 30, 8), Vec::new()).unwrap();
    assert_ne!(a, c);
    let t = generate(&cfg).unwrap();
    assert_eq!(super::super::binary::read_binary_bytes(&a, "m").unwrap(), t);
    assert_eq!(t.shifts, vec![30]);
    t.validate().unwrap();
}

#[test]
fn calibration_reuse_and_popularity_match_targets() {
    // 2 domains x 16 layers; enough picks per layer to measure shares to ~0.01 TV.
    let cfg = small(1200, 600, 3);
    let t = generate(&cfg).unwrap();
    let reuse = stats::reuse_per_layer(&t).unwrap();
    for (l, r) in reuse.iter().enumerate() {
        assert!(
            (r - MIXTRAL_DECODE_REUSE).abs() < 0.03,
            "layer {l}: reuse {r}"
        );
    }
    let mean = reuse.iter().sum::<f64>() / reuse.len() as f64;
    assert!(
        (mean - MIXTRAL_DECODE_REUSE).abs() < 0.01,
        "mean reuse {mean}"
    );
    for (phase, range) in [(0, 0..600), (1, 600..1200)] {
        let measured = stats::pick_shares(&t, range).unwrap();
        for l in [0usize, 7, 15, 4] {
            let fitted = &cfg.domains[phase].shares[l];
            let tv = stats::total_variation(&measured[l], fitted);
            assert!(tv < 0.03, "phase {phase} layer {l}: TV {tv}");
            let (a, b) = (
                stats::top_n_share(&measured[l], 16),
                stats::top_n_share(fitted, 16),
            );
            assert!(
                (a - b).abs() < 0.03,
                "phase {phase} layer {l}: top-16 {a} vs {b}"
            );
        }
    }
}

#[test]
fn anchors_are_exact_and_other_layers_interpolate() {
    let p = DomainProfile::olmoe("github", 16).unwrap();
    let anchors = olmoe::olmoe_anchor_shares("github").unwrap();
    for (l, s) in &anchors {
        assert!(stats::total_variation(&p.shares[*l as usize], s) < 1e-12);
    }
    for row in &p.shares {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }
    // Layer 3 skew lies between layers 0 and 7.
    let top = |s: &[f64]| stats::top_n_share(s, 16);
    let (t0, t3, t7) = (top(&p.shares[0]), top(&p.shares[3]), top(&p.shares[7]));
    assert!(t0.min(t7) <= t3 && t3 <= t0.max(t7), "{t0} {t3} {t7}");
    // Relabelling is domain-independent: github's and book's hot sets overlap at layer 3
    // exactly as at the nearest anchor, layer 0.
    let b = DomainProfile::olmoe("book", 16).unwrap();
    let hot = |s: &[f64]| {
        let mut o: Vec<usize> = (0..s.len()).collect();
        o.sort_by(|&x, &y| s[y].total_cmp(&s[x]).then(x.cmp(&y)));
        o.truncate(16);
        o
    };
    let overlap = |a: &[f64], b: &[f64]| {
        let h = hot(b);
        hot(a).iter().filter(|e| h.contains(e)).count()
    };
    assert_eq!(
        overlap(&p.shares[3], &b.shares[3]),
        overlap(&p.shares[0], &b.shares[0])
    );
}

#[test]
fn zipf_scenario_has_its_skew_and_reuse() {
    let shape = TraceShape {
        layers: 3,
        experts_per_layer: 128,
        top_k: 8,
    };
    let cfg = SynthConfig::zipf(shape, 0.8, 400, 16, 5, 0.4).unwrap();
    assert_eq!(cfg.name, "zipf0.8-3x128x8");
    let norm: f64 = (1..=128).map(|r| (r as f64).powf(-0.8)).sum();
    let top_quarter: f64 = (1..=32).map(|r| (r as f64).powf(-0.8)).sum::<f64>() / norm;
    for row in &cfg.domains[0].shares {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!((stats::top_n_share(row, 32) - top_quarter).abs() < 1e-9);
    }
    // the per-layer relabelling differs between layers
    assert_ne!(cfg.domains[0].shares[0], cfg.domains[0].shares[1]);
    let t = generate(&cfg).unwrap();
    for r in stats::reuse_per_layer(&t).unwrap() {
        assert!((r - 0.4).abs() < 0.05, "reuse {r}");
    }
    let shares = stats::pick_shares(&t, 0..400).unwrap();
    for (l, measured) in shares.iter().enumerate() {
        let tv = stats::total_variation(measured, &cfg.domains[0].shares[l]);
        assert!(tv < 0.08, "layer {l}: total variation {tv}");
    }
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            SynthConfig::zipf(shape, bad, 10, 1, 0, 0.3),
            Err(TraceError::InvalidScenario(_))
        ));
    }
}

#[test]
fn bad_scenarios_are_typed_errors() {
    let mut c = small(10, 5, 1);
    c.steps = 0;
    assert!(matches!(Synth::new(c), Err(TraceError::InvalidScenario(_))));
    let mut c = small(10, 5, 1);
    c.phases[1].domain = 9;
    assert!(Synth::new(c).is_err());
    let mut c = small(10, 5, 1);
    c.reuse = 1.5;
    assert!(Synth::new(c).is_err());
    let mut c = small(10, 5, 1);
    c.domains[0].shares[2] = vec![0.0; 64];
    c.domains[0].shares[2][0] = 1.0;
    assert!(matches!(Synth::new(c), Err(TraceError::InvalidScenario(_))));
    let mut c = small(10, 5, 1);
    c.shape.top_k = 65;
    assert!(matches!(Synth::new(c), Err(TraceError::TopKTooWide { .. })));
    assert!(SynthConfig::olmoe_shift("github", "poetry", 10, 5, 4, 1).is_err());
    // A shift at step 0 says what to give instead (it used to say "phase start steps must
    // increase", naming neither the argument nor the fix).
    let e = SynthConfig::olmoe_shift("github", "book", 10, 0, 4, 1).unwrap_err();
    assert!(matches!(e, TraceError::InvalidScenario(_)), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("shift at step 0")
            && m.contains("from_domain / --from")
            && m.contains("--shift-at"),
        "{m}"
    );
}

#[test]
fn huge_scenarios_are_refused_before_allocating() {
    // u64::MAX steps used to overflow `Vec::with_capacity`; 10^9 steps or 2^32 - 1 tokens
    // aborted on allocation.
    for (steps, tokens) in [
        (u64::MAX, 16),
        (MAX_STEPS + 1, 16),
        (10, u32::MAX),
        (10, 65_537),
    ] {
        let c = small(steps, 5, 1);
        let c = SynthConfig {
            tokens_per_step: tokens,
            ..c
        };
        let e = generate(&c).unwrap_err();
        assert!(
            matches!(e, TraceError::TooLarge(_)),
            "{steps}/{tokens}: {e}"
        );
    }
    let c = small(1_000_000_000, 5, 1);
    c.validate().unwrap();
    let e = c.validate_in_memory().unwrap_err();
    assert!(e.to_string().contains("write_binary"), "{e}");
    assert!(matches!(generate(&c), Err(TraceError::TooLarge(_))));
    // Profiles are bounded too.
    let e = DomainProfile::from_anchors("x", &[(0, vec![1.0; 100_000])], 1000).unwrap_err();
    assert!(matches!(e, TraceError::TooLarge(_)), "{e}");
}

#[test]
fn routing_counts_profile_matches_in_code_one() {
    let Some(shared) = crate::experts::trace::test_util::shared_dir("routing-counts profile test")
    else {
        return;
    };
    let text = std::fs::read_to_string(shared.join("data/moe/olmoe/routing-counts.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let from_json = DomainProfile::from_routing_counts(&json, "olmoe", "github", 64, 16).unwrap();
    let in_code = DomainProfile::olmoe("github", 16).unwrap();
    for (a, b) in from_json.shares.iter().zip(&in_code.shares) {
        assert!(stats::total_variation(a, b) < 1e-5);
    }
    // Mixtral counts (8 experts, top-2) also make a valid scenario.
    let m = DomainProfile::from_routing_counts(&json, "mistral", "github", 8, 32).unwrap();
    assert_eq!(m.shares.len(), 32);
}
