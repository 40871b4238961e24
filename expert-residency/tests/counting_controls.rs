//! The counting controls on the host side: a counter table that went backwards (re-created or
//! zeroed under the controller) is re-baselined by default or refused with a typed error, the
//! config's `boot_frozen`, and the control message `{"freeze": false, "baseline": true}`.
//! CPU only: device snapshots are plain `[layers × experts]` u32 slices here.

use expert_residency::{
    ControlMessage, Controller, ControllerConfig, ExpertError, Geometry, NullExecutor,
    OnCounterReset, PickCounters, ResidencyMap, StepPicks,
};

const LAYERS: u32 = 2;
const EXPERTS: u32 = 8;

fn geo() -> Geometry {
    Geometry::new(LAYERS, EXPERTS, 2, 1 << 10).unwrap()
}

fn controller(cfg: ControllerConfig) -> Controller {
    Controller::new(ResidencyMap::first_k("t", geo()).unwrap(), cfg).unwrap()
}

fn cfg() -> ControllerConfig {
    ControllerConfig {
        drain_every: 4,
        ..ControllerConfig::published_recipe()
    }
}

/// A device-style table: `per_step` picks of each of `experts` in every layer, `steps` steps.
fn add(table: &mut [u32], experts: &[u32], per_step: u32, steps: u32) {
    for l in 0..LAYERS {
        for &e in experts {
            let c = &mut table[(l * EXPERTS + e) as usize];
            *c = c.wrapping_add(per_step * steps);
        }
    }
}

/// Steps the controller `n` times with `table` (drained when due); returns the drains' records.
fn run(
    ctl: &mut Controller,
    table: &[u32],
    n: u32,
    ex: &mut NullExecutor,
) -> Vec<expert_residency::DrainTelemetry> {
    (0..n)
        .filter_map(|_| ctl.step_with(Some(table), ex).unwrap().drain)
        .collect()
}

#[test]
fn a_recreated_device_table_is_rebaselined_not_read_as_phantom_picks() {
    let mut ctl = controller(cfg());
    assert_eq!(ctl.config().on_counter_reset, OnCounterReset::Rebaseline);
    let mut ex = NullExecutor::new();
    let mut table = vec![0u32; (LAYERS * EXPERTS) as usize];
    // 4 steps of traffic on experts 0 and 1 (hot at boot), one drain
    add(&mut table, &[0, 1], 10, 4);
    let d = run(&mut ctl, &table, 4, &mut ex);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].picks, 2 * 2 * 40);
    let ema_before = ctl.ema_values().to_vec();
    let stats_before = ctl.stats();
    // the engine re-creates its counter table: it starts again from zero
    let mut fresh = vec![0u32; table.len()];
    add(&mut fresh, &[0], 3, 4);
    let d = run(&mut ctl, &fresh, 4, &mut ex);
    assert_eq!(d.len(), 1);
    assert!(d[0].counter_reset, "{d:?}");
    assert_eq!((d[0].picks, d[0].planned, d[0].counter_resets), (0, 0, 1));
    assert_eq!(ctl.counter_resets(), 1);
    assert_eq!(ctl.ema_values(), &ema_before[..], "the EMA is kept");
    assert_eq!(ctl.stats(), stats_before);
    // the next drain counts the new table from its re-baselined reference exactly
    add(&mut fresh, &[1], 5, 4);
    let d = run(&mut ctl, &fresh, 4, &mut ex);
    assert!(!d[0].counter_reset);
    assert_eq!((d[0].picks, d[0].counter_resets), (2 * 20, 1));
    // a JSON line written before the field existed still reads, as no reset
    let mut v: serde_json::Value = serde_json::from_str(&d[0].to_json_line()).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.remove("counter_reset");
    obj.remove("counter_resets");
    let old: expert_residency::DrainTelemetry = serde_json::from_value(v).unwrap();
    assert!(!old.counter_reset && old.counter_resets == 0);
}

#[test]
fn counts_wrapping_past_2_pow_32_are_not_a_reset() {
    let mut ctl = controller(cfg());
    let mut ex = NullExecutor::new();
    let mut table = vec![u32::MAX - 20; (LAYERS * EXPERTS) as usize];
    ctl.reset_baseline(&table).unwrap();
    add(&mut table, &[2, 3], 10, 4); // every busy cell wraps
    let d = run(&mut ctl, &table, 4, &mut ex);
    assert!(!d[0].counter_reset);
    assert_eq!(d[0].picks, 2 * 2 * 40);
    assert_eq!(ctl.counter_resets(), 0);
}

#[test]
fn counter_reset_as_a_typed_error_changes_nothing() {
    let mut ctl = controller(ControllerConfig {
        on_counter_reset: OnCounterReset::Error,
        ..cfg()
    });
    let mut ex = NullExecutor::new();
    let mut table = vec![0u32; (LAYERS * EXPERTS) as usize];
    add(&mut table, &[4], 100, 4);
    run(&mut ctl, &table, 4, &mut ex);
    // layer 1, expert 4 dropped from 400 to 7 (the first cell found backwards)
    let mut fresh = table.clone();
    fresh[4] = 400; // layer 0 unchanged
    fresh[(EXPERTS + 4) as usize] = 7;
    for _ in 0..3 {
        assert!(ctl
            .step_with(Some(&fresh), &mut ex)
            .unwrap()
            .drain
            .is_none());
    }
    let (steps, ema, map) = (ctl.steps(), ctl.ema_values().to_vec(), ctl.map().clone());
    let e = ctl.step_with(Some(&fresh), &mut ex).unwrap_err();
    assert_eq!(
        e,
        ExpertError::CounterReset {
            layer: 1,
            expert: 4,
            previous: 400,
            current: 7
        }
    );
    assert!(e.to_string().contains("went backwards"), "{e}");
    assert_eq!(ctl.steps(), steps, "the refused step did not happen");
    assert_eq!((ctl.ema_values(), ctl.map()), (&ema[..], &map));
    // drain_now refuses it too; the engine re-baselines and goes on
    assert!(matches!(
        ctl.drain_now(&fresh),
        Err(ExpertError::CounterReset { .. })
    ));
    ctl.reset_baseline(&fresh).unwrap();
    let d = run(&mut ctl, &fresh, 4, &mut ex);
    assert_eq!((d.len(), d[0].picks, d[0].counter_reset), (1, 0, false));
    assert_eq!(ctl.counter_resets(), 0);
}

#[test]
fn drain_now_and_host_counters_rebaseline_too() {
    let mut ctl = controller(cfg());
    let mut table = vec![0u32; (LAYERS * EXPERTS) as usize];
    add(&mut table, &[6], 50, 1);
    assert_eq!(ctl.drain_now(&table).unwrap().picks, 100);
    let d = ctl.drain_now(&vec![0u32; table.len()]).unwrap();
    assert!(d.counter_reset && d.picks == 0);
    // host counters re-created under the controller
    let g = geo();
    let mut ctl = controller(cfg());
    let mut ex = NullExecutor::new();
    let busy = StepPicks {
        layers: vec![vec![7, 7, 7]; 2],
    };
    let c = PickCounters::new(&g).unwrap();
    for _ in 0..4 {
        c.record_step(&busy).unwrap();
        ctl.step(&c, &mut ex).unwrap();
    }
    let c = PickCounters::new(&g).unwrap();
    let mut resets = 0;
    for _ in 0..8 {
        c.record(0, 1).unwrap();
        if let Some(d) = ctl.step(&c, &mut ex).unwrap().drain {
            resets += u32::from(d.counter_reset);
            assert!(d.picks < 100, "phantom picks: {}", d.picks);
        }
    }
    assert_eq!(resets, 1);
}

#[test]
fn boot_frozen_then_the_recipe_message_starts_swapping_from_a_clean_baseline() {
    let mut ctl = controller(ControllerConfig {
        boot_frozen: true,
        ..cfg()
    });
    assert!(ctl.is_frozen());
    let boot = ctl.map().clone();
    let mut ex = NullExecutor::new();
    let mut table = vec![0u32; (LAYERS * EXPERTS) as usize];
    // warm-up / graph capture: identical dummy rows all on expert 5, counted while frozen
    for _ in 0..8 {
        add(&mut table, &[5], 1000, 1);
        if let Some(d) = ctl.step_with(Some(&table), &mut ex).unwrap().drain {
            assert!(d.frozen && d.planned == 0);
        }
    }
    assert_eq!(ctl.map(), &boot);
    assert!(ctl.ema_values()[5] > 0.0);
    // serving starts: the published GB300 recipe's message
    let msg = ControlMessage::from_json(r#"{"freeze": false, "baseline": true}"#).unwrap();
    assert_eq!(
        msg,
        ControlMessage {
            freeze: Some(false),
            baseline: Some(true)
        }
    );
    // a baseline without a snapshot is refused before anything changes, saying what to pass
    // (it used to read "length mismatch: expected N, found 0")
    let e = ctl.apply_control(&msg, None).unwrap_err();
    assert!(matches!(e, ExpertError::BaselineWithoutCounters), "{e}");
    assert!(
        e.to_string().contains("apply_control(message, counters)"),
        "{e}"
    );
    assert!(ctl.is_frozen());
    ctl.apply_control(&msg, Some(&table)).unwrap();
    assert!(!ctl.is_frozen());
    assert!(
        ctl.ema_values().iter().all(|&v| v == 0.0),
        "warm-up forgotten"
    );
    // real traffic on expert 6: it comes in, the warm-up's expert 5 never does
    for _ in 0..24 {
        add(&mut table, &[6], 10, 1);
        ctl.step_with(Some(&table), &mut ex).unwrap();
    }
    for l in 0..LAYERS {
        assert!(ctl.map().is_hot(l, 6) && !ctl.map().is_hot(l, 5));
    }
    // freeze again by message, without a snapshot
    ctl.apply_control(
        &ControlMessage::from_json(r#"{"freeze": true}"#).unwrap(),
        None,
    )
    .unwrap();
    assert!(ctl.is_frozen());
}

#[test]
fn control_message_json() {
    let m = ControlMessage::from_json("{}").unwrap();
    assert_eq!(m, ControlMessage::default());
    let m = ControlMessage::from_json(r#"{"freeze": null, "baseline": false}"#).unwrap();
    assert_eq!((m.freeze, m.baseline), (None, Some(false)));
    let m = ControlMessage {
        freeze: Some(true),
        baseline: None,
    };
    assert_eq!(ControlMessage::from_json(&m.to_json()).unwrap(), m);
    for bad in [
        r#"{"freze": true}"#,
        r#"{"freeze": "no"}"#,
        r#"{"freeze": false"#,
    ] {
        assert!(
            matches!(ControlMessage::from_json(bad), Err(ExpertError::Format(_))),
            "{bad}"
        );
    }
    // a no-op message changes nothing; baseline false needs no snapshot
    let mut ctl = controller(cfg());
    ctl.apply_control(
        &ControlMessage::from_json(r#"{"baseline": false}"#).unwrap(),
        None,
    )
    .unwrap();
    assert!(!ctl.is_frozen());
    // a wrong-length snapshot is refused before the freeze part applies
    let msg = ControlMessage::from_json(r#"{"freeze": true, "baseline": true}"#).unwrap();
    assert!(ctl.apply_control(&msg, Some(&[0u32; 3])).is_err());
    assert!(!ctl.is_frozen());
}
