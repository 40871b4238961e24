//! Unit tests of `config.rs` (beside the code, in their own file for length).

use super::*;
use crate::policy::RecencyConfig;

#[test]
fn partial_json_takes_defaults_and_validation_names_fields() {
    let c: ControllerConfig =
        serde_json::from_str(r#"{"drain_every": 32, "shift_response": {"jump_ratio": 2.0}}"#)
            .unwrap();
    assert_eq!(c.drain_every, 32);
    assert_eq!(c.half_life_steps, 500.0);
    let sr = c.shift_response.clone().unwrap();
    assert_eq!((sr.jump_ratio, sr.boost_drains), (2.0, 12));
    c.validate().unwrap();
    for bad in [
        ControllerConfig {
            drain_every: 0,
            ..ControllerConfig::default()
        },
        ControllerConfig {
            half_life_steps: f64::NAN,
            ..ControllerConfig::default()
        },
        ControllerConfig {
            max_swaps_per_step: 0,
            ..ControllerConfig::default()
        },
        ControllerConfig {
            shift_response: Some(ShiftResponse {
                jump_ratio: 1.0,
                ..ShiftResponse::default()
            }),
            ..ControllerConfig::default()
        },
    ] {
        assert!(matches!(bad.validate(), Err(ExpertError::InvalidConfig(_))));
    }
}

#[test]
fn link_prices_and_their_arithmetic() {
    let h = LinkCost::h200_pcie();
    h.validate().unwrap();
    // 55 GB/s: 55,000 bytes of copy per µs of link time, + 26.2 µs per copy.
    assert!((h.copy_link_us(55_000) - 1.0).abs() < 1e-12);
    assert!((h.copy_us(55_000) - 27.2).abs() < 1e-9);
    assert!((h.read_us(47_000) - 1.0).abs() < 1e-12);
    // A Mixtral expert's copy costs 0.86 in-place reads on PCIe.
    assert!((h.copy_in_reads(352_321_536) - 0.86).abs() < 0.01);
    let g = LinkCost::gb300_c2c();
    g.validate().unwrap();
    assert_eq!(g.copy_us(261_100), g.copy_link_us(261_100));
    let bad = LinkCost {
        copy_fixed_us: -1.0,
        ..h
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("link.copy_fixed_us"), "{e}");
}

#[test]
fn window_is_bounded_and_unknown_fields_are_rejected() {
    let c: ControllerConfig = serde_json::from_str(r#"{"window_drains": 100000000}"#).unwrap();
    let e = c.validate().unwrap_err();
    assert!(e.to_string().contains("window_drains"), "{e}");
    let at_bound = ControllerConfig {
        window_drains: MAX_WINDOW_DRAINS,
        ..ControllerConfig::default()
    };
    at_bound.validate().unwrap();
    let e = serde_json::from_str::<ControllerConfig>(r#"{"drain_evry": 32}"#).unwrap_err();
    assert!(e.to_string().contains("drain_evry"), "{e}");
    let e = serde_json::from_str::<ControllerConfig>(
        r#"{"shift_response": {"jump_ratio": 2.0, "jump": 1}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("jump"), "{e}");
    // Missing fields still default.
    let c: ControllerConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, ControllerConfig::default());
}

#[test]
fn arrays_never_bind_fields_by_position() {
    // serde's derive used to read `[1, 2]` as drain_every 1, half_life_steps 2.
    for bad in [
        "[1, 2]",
        "[]",
        r#"{"cost": [2.0, 1.0]}"#,
        r#"{"link": [1.0, 2.0]}"#,
        r#"{"adaptive": [1, 2, 3, 4]}"#,
        r#"{"shift_response": [2.0]}"#,
        r#"{"policy": {"kind": "cost", "link": [1.0, 2.0]}}"#,
    ] {
        let e = serde_json::from_str::<ControllerConfig>(bad).unwrap_err();
        assert!(
            e.to_string().contains("invalid type: sequence")
                && e.to_string().contains("as an object of named fields"),
            "{bad}: {e}"
        );
    }
    let e = serde_json::from_str::<crate::ControlMessage>("[true, false]").unwrap_err();
    assert!(e.to_string().contains("a control message"), "{e}");
    let e = serde_json::from_str::<crate::Geometry>("[2, 8, 2, 16]").unwrap_err();
    assert!(e.to_string().contains("a geometry"), "{e}");
    // objects (and a nested null) still read as before, and the round trip holds
    let c: ControllerConfig =
        serde_json::from_str(r#"{"cost": {"z": 2.0}, "adaptive": null}"#).unwrap();
    let PolicyConfig::Cost(cost) = &c.policy else {
        panic!("{:?}", c.policy)
    };
    assert_eq!((cost.z, cost.payback, c.adaptive), (2.0, 1.5, None));
    let back: ControllerConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn counting_controls_in_json_and_old_configs_still_load() {
    // a config written before boot_frozen / on_counter_reset existed
    let old = r#"{"drain_every": 16, "half_life_steps": 64.0, "ratio": 1.5,
        "max_swaps_per_layer": 4, "max_swaps_per_step": 16, "window_drains": 8,
        "shift_response": null}"#;
    let c: ControllerConfig = serde_json::from_str(old).unwrap();
    assert!(!c.boot_frozen);
    assert_eq!(c.on_counter_reset, OnCounterReset::Rebaseline);
    let c: ControllerConfig =
        serde_json::from_str(r#"{"boot_frozen": true, "on_counter_reset": "error"}"#).unwrap();
    assert!(c.boot_frozen);
    assert_eq!(c.on_counter_reset, OnCounterReset::Error);
    c.validate().unwrap();
    // round trip
    let back: ControllerConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    let e =
        serde_json::from_str::<ControllerConfig>(r#"{"on_counter_reset": "ignore"}"#).unwrap_err();
    assert!(e.to_string().contains("ignore"), "{e}");
}

/// Configs in the flat shape (the policy a name, its knobs at the top level), as written
/// before the per-policy configs (every config `tierkit --config`, Python's `Controller(boot,
/// cfg)` and C's `tierkit_controller_new` took), still read as the same policy and knobs.
#[test]
fn the_flat_shape_is_still_read() {
    let read = |j: &str| serde_json::from_str::<ControllerConfig>(j).unwrap();
    // The bindings' and examples' config: the published recipe at a fast cadence.
    let c =
        read(r#"{"policy": "ratio", "adaptive": null, "drain_every": 8, "half_life_steps": 32}"#);
    assert_eq!(c.policy, PolicyConfig::Ratio(RatioConfig { ratio: 1.5 }));
    assert_eq!(
        (c.drain_every, c.half_life_steps, c.adaptive),
        (8, 32.0, None)
    );
    let c = read(r#"{"policy": "ratio", "ratio": 1.25}"#);
    assert_eq!(c.policy, PolicyConfig::Ratio(RatioConfig { ratio: 1.25 }));
    // The cost policy's margins and link prices at the top level (policy absent: cost).
    let c = read(r#"{"cost": {"payback": 2.0}, "link": {"read_gbps": 340.0}}"#);
    let want = CostConfig {
        payback: 2.0,
        z: 1.0,
        link: LinkCost {
            read_gbps: 340.0,
            ..LinkCost::h200_pcie()
        },
    };
    assert_eq!(c.policy, PolicyConfig::Cost(want.clone()));
    assert_eq!(read(r#"{"policy": "recency"}"#).policy.name(), "recency");
    // A whole config as the old shape serialised it: every policy's knobs, the others'
    // ignored (they were unused).
    let old = r#"{"drain_every": 64, "half_life_steps": 500.0, "ratio": 1.5,
        "max_swaps_per_layer": 2, "max_swaps_per_step": 8, "window_drains": 8,
        "shift_response": null, "boot_frozen": false, "on_counter_reset": "rebaseline",
        "policy": "cost", "cost": {"payback": 1.5, "z": 1.0},
        "link": {"read_gbps": 47.0, "copy_gbps": 55.0, "copy_fixed_us": 26.2},
        "adaptive": {"touches_per_half_life": 12.0, "drains_per_half_life": 48.0,
            "min_half_life_steps": 2.0, "max_half_life_steps": 4096.0},
        "swap_budget_bytes_per_step": 1073741824}"#;
    assert_eq!(read(old), ControllerConfig::default());
    let old_recipe = old
        .replace(r#""policy": "cost""#, r#""policy": "ratio""#)
        .replace(
            r#""adaptive": {"touches_per_half_life": 12.0, "drains_per_half_life": 48.0,
            "min_half_life_steps": 2.0, "max_half_life_steps": 4096.0}"#,
            r#""adaptive": null"#,
        )
        .replace("1073741824", "null");
    assert_eq!(read(&old_recipe), ControllerConfig::published_recipe());
    // A name that is no policy, a flat knob of the wrong type: errors naming them.
    let e = serde_json::from_str::<ControllerConfig>(r#"{"policy": "lfu"}"#).unwrap_err();
    assert!(e.to_string().contains("lfu"), "{e}");
    let e = serde_json::from_str::<ControllerConfig>(r#"{"ratio": "x"}"#).unwrap_err();
    assert!(e.to_string().contains("invalid type"), "{e}");
}

/// The new shape: `policy` an object tagged by `kind` holding that policy's knobs, written
/// and read back; top-level knobs beside it are an error naming the new shape.
#[test]
fn the_policy_object_round_trips_and_mixing_shapes_is_refused() {
    for c in [
        ControllerConfig::default(),
        ControllerConfig::published_recipe(),
        ControllerConfig {
            policy: PolicyConfig::Recency(RecencyConfig {}),
            ..ControllerConfig::default()
        },
    ] {
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["policy"]["kind"], c.policy.name(), "{json}");
        assert!(
            json.get("ratio").is_none() && json.get("link").is_none(),
            "{json}"
        );
        let back: ControllerConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
    }
    let c: ControllerConfig =
        serde_json::from_str(r#"{"policy": {"kind": "ratio", "ratio": 1.25}}"#).unwrap();
    assert_eq!(c.policy, PolicyConfig::Ratio(RatioConfig { ratio: 1.25 }));
    let c: ControllerConfig =
        serde_json::from_str(r#"{"policy": {"kind": "cost", "z": 2.0}}"#).unwrap();
    assert_eq!(
        c.policy,
        PolicyConfig::Cost(CostConfig {
            z: 2.0,
            ..CostConfig::default()
        })
    );
    for (bad, names) in [
        (r#"{"policy": {"kind": "ratio"}, "ratio": 1.25}"#, "`ratio`"),
        (r#"{"policy": {"kind": "cost"}, "link": {}}"#, "`link`"),
        (
            r#"{"policy": {"kind": "cost"}, "cost": {"z": 2.0}}"#,
            "`cost`",
        ),
    ] {
        let e = serde_json::from_str::<ControllerConfig>(bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(names) && e.contains(r#"{"policy": {"kind": "#),
            "{bad}: {e}"
        );
    }
    // A policy's unknown knob, a missing or unknown kind: errors naming them.
    for (bad, names) in [
        (
            r#"{"policy": {"kind": "ratio", "payback": 2.0}}"#,
            "payback",
        ),
        (r#"{"policy": {"ratio": 1.5}}"#, "kind"),
        (r#"{"policy": {"kind": "lfu"}}"#, "lfu"),
    ] {
        let e = serde_json::from_str::<ControllerConfig>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains(names), "{bad}: {e}");
    }
    // Each part is checked by validate: a shared knob, a policy's knob.
    let bad_ratio = ControllerConfig {
        policy: PolicyConfig::Ratio(RatioConfig { ratio: 0.5 }),
        ..ControllerConfig::default()
    };
    assert!(bad_ratio
        .validate()
        .unwrap_err()
        .to_string()
        .contains("ratio"));
}
