//! Caller input at the edges (from an adversarial review): every case is a typed error, never a
//! panic, a hang or an allocation abort, and a failed call changes nothing.

use expert_residency::{
    ControllerConfig, ExpertError, Geometry, MemoryExecutor, PickCounters, ResidencyMap, MAX_CELLS,
    MAX_EXPERTS_PER_LAYER, MAX_LAYERS,
};
use tierkit_sim::experts::trace::{
    read_trace, ReadOptions, StepPicks, Trace, TraceError, TraceShape,
};
use tierkit_sim::experts::{replay_with, PolicySpec, ReplayOptions};

fn geometry() -> Geometry {
    Geometry::new(2, 8, 2, 16).unwrap()
}

fn trace() -> Trace {
    Trace {
        name: "t".into(),
        shape: TraceShape {
            layers: 2,
            experts_per_layer: 8,
            top_k: 2,
        },
        steps: (0..32u32)
            .map(|i| StepPicks {
                layers: vec![vec![i % 8, (i + 1) % 8], vec![7, i % 7]],
            })
            .collect(),
        shifts: vec![16],
    }
}

fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tierkit-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn replay_options_are_checked() {
    let (t, g, cfg) = (trace(), geometry(), ControllerConfig::default());
    let policy = PolicySpec::Adaptive(None);
    for step_time_s in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
        let opts = ReplayOptions {
            step_time_s: Some(step_time_s),
            ..ReplayOptions::default()
        };
        let e = replay_with(&t, &g, &policy, &cfg, &opts).unwrap_err();
        assert!(
            matches!(&e, ExpertError::InvalidConfig(m) if m.contains("step_time_s")),
            "{step_time_s}: {e}"
        );
    }
    // The breaker's --verify-bytes values: overflow, a product wrapping to 0, 10 TB, 1 GiB.
    for b in [
        usize::MAX,
        1 << 60,
        10_000_000_000,
        MemoryExecutor::MAX_BYTES,
        0,
    ] {
        let opts = ReplayOptions {
            verify_bytes: Some(b),
            ..ReplayOptions::default()
        };
        let e = replay_with(&t, &g, &policy, &cfg, &opts).unwrap_err();
        assert!(matches!(e, ExpertError::InvalidConfig(_)), "{b}: {e}");
    }
    let ok = ReplayOptions {
        step_time_s: Some(0.02),
        verify_bytes: Some(64),
        ..ReplayOptions::default()
    };
    let r = replay_with(&t, &g, &policy, &cfg, &ok).unwrap();
    assert_eq!(r.steps, 32);
}

#[test]
fn huge_geometries_never_reach_an_allocation() {
    for (l, e) in [(1 << 30, 1), (1, u32::MAX), (u32::MAX, u32::MAX)] {
        assert!(matches!(
            Geometry::new(l, e, 1, 1),
            Err(ExpertError::InvalidGeometry(_))
        ));
        // Built by hand, past `Geometry::new`: still refused.
        let g = Geometry {
            layers: l,
            experts_per_layer: e,
            hot_per_layer: 1,
            expert_bytes: 1,
        };
        assert!(ResidencyMap::first_k("x", g).is_err());
        assert!(PickCounters::new(&g).is_err());
    }
    // The bounds themselves are valid.
    let g = Geometry::new(MAX_LAYERS, 4096, 1, 1).unwrap();
    assert_eq!(g.cells() as u64, MAX_CELLS);
    Geometry::new(16, MAX_EXPERTS_PER_LAYER, 1, 1).unwrap();
}

#[test]
fn tiny_files_declaring_huge_shapes_are_refused() {
    // The breaker's big_layers.tkt: a 45-byte binary trace with layers = u32::MAX, 1 step.
    let mut b = b"TKTRACE\0".to_vec();
    for v in [1u32, u32::MAX, 8, 2, 2] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.push(0);
    let p = temp("big_layers.tkt", &b);
    let e = read_trace(&p, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, TraceError::Corrupt { .. }), "{e}");
    // A one-step JSON trace claiming 2^32 - 1 experts per layer.
    let mut t = trace();
    t.shape.experts_per_layer = u32::MAX;
    t.steps.truncate(1);
    let p = temp("big.json", serde_json::to_string(&t).unwrap().as_bytes());
    let e = read_trace(&p, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, TraceError::TooLarge(_)), "{e}");
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    // Logger lines whose layer or id imply a huge inferred shape.
    for (name, line) in [
        ("l.jsonl", r#"{"layer":1000000000,"topk_ids":[1]}"#),
        ("e.jsonl", r#"{"layer":0,"topk_ids":[4000000000]}"#),
    ] {
        let p = temp(name, line.as_bytes());
        let e = read_trace(&p, &ReadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::TooLarge(_)), "{name}: {e}");
    }
}

#[test]
fn a_json_trace_missing_layers_names_the_count() {
    let mut t = trace();
    t.steps[3].layers.pop();
    let p = temp("short.json", serde_json::to_string(&t).unwrap().as_bytes());
    let e = read_trace(&p, &ReadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&p.display().to_string())
            && e.contains("step 3")
            && e.contains("lists 1 layers, the trace shape has 2"),
        "{e}"
    );
}
