//! Controller tests: caps, hysteresis, freeze, failure accounting, baseline reset, and the
//! controller-invariants proptest.

use super::*;
use crate::executor::{NullExecutor, SwapCompletion, SwapOutcome};
use crate::geometry::Geometry;
use crate::picks::StepPicks;
use crate::policy::SwapChoice;

fn geo() -> Geometry {
    Geometry::new(2, 8, 2, 1 << 10).unwrap()
}

fn cfg() -> ControllerConfig {
    ControllerConfig {
        drain_every: 4,
        ..ControllerConfig::published_recipe()
    }
}

/// The toy geometry, a first-K controller with [`cfg`], its counters and a null executor.
fn toy() -> (Geometry, Controller, PickCounters, NullExecutor) {
    let g = geo();
    let ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
    (g, ctl, PickCounters::new(&g).unwrap(), NullExecutor::new())
}

/// Counts `reps` picks of each of `experts` in every layer.
fn busy(c: &PickCounters, experts: &[u32], reps: usize) {
    let step = StepPicks {
        layers: vec![experts.repeat(reps); 2],
    };
    c.record_step(&step).unwrap();
}

/// Refuses the first `fail_begins` begins, then fails the next `fail_commits` commits.
struct Flaky {
    inner: NullExecutor,
    fail_begins: u32,
    fail_commits: u32,
}

impl SwapExecutor for Flaky {
    fn begin(&mut self, s: &PlannedSwap) -> Result<()> {
        if self.fail_begins > 0 {
            self.fail_begins -= 1;
            return Err(ExpertError::Executor("refused".into()));
        }
        self.inner.begin(s)
    }
    fn commit_ready(
        &mut self,
        accept: &mut dyn FnMut(&PlannedSwap) -> bool,
    ) -> Result<Vec<SwapCompletion>> {
        let mut v = self.inner.commit_ready(accept)?;
        for c in &mut v {
            if self.fail_commits > 0 && c.outcome == SwapOutcome::Committed {
                self.fail_commits -= 1;
                c.outcome = SwapOutcome::Failed;
            }
        }
        Ok(v)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[test]
fn follows_traffic_within_caps() {
    let g = geo();
    let mut ctl = Controller::new(
        ResidencyMap::first_k("t", g).unwrap(),
        ControllerConfig {
            max_swaps_per_step: 1,
            max_swaps_per_layer: 1,
            ..cfg()
        },
    )
    .unwrap();
    let c = PickCounters::new(&g).unwrap();
    let mut ex = NullExecutor::new();
    let mut drains = 0;
    for _ in 0..40 {
        busy(&c, &[5, 6], 3);
        let r = ctl.step(&c, &mut ex).unwrap();
        assert!(r.begun <= 1 && r.applied <= 1);
        if let Some(d) = r.drain {
            drains += 1;
            assert!(d.planned <= 2, "one per layer per drain");
        }
    }
    assert_eq!(drains, 10);
    for l in 0..2 {
        assert!(ctl.map().is_hot(l, 5) && ctl.map().is_hot(l, 6));
    }
    assert_eq!(ctl.stats().applied, 4);
    assert_eq!(ctl.stats().rejected, 0);
}

#[test]
fn ratio_hysteresis_holds_back_close_calls() {
    let (_, mut ctl, c, mut ex) = toy();
    for _ in 0..40 {
        // Cold expert 7 is 1.4× the hot ones: below the 1.5 ratio.
        let step = StepPicks {
            layers: vec![vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 7, 7, 7, 7, 7, 7, 7]; 2],
        };
        c.record_step(&step).unwrap();
        ctl.step(&c, &mut ex).unwrap();
    }
    assert_eq!(ctl.stats().planned, 0);
}

#[test]
fn freeze_counts_but_never_swaps() {
    let g = geo();
    let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
    let boot = ctl.map().clone();
    let c = PickCounters::new(&g).unwrap();
    let mut ex = NullExecutor::new();
    ctl.freeze();
    for _ in 0..16 {
        busy(&c, &[7], 4);
        let r = ctl.step(&c, &mut ex).unwrap();
        if let Some(d) = r.drain {
            assert!(d.frozen);
            assert_eq!(d.planned, 0);
            assert!(d.cold_share > 0.99);
        }
    }
    assert_eq!(ctl.map(), &boot);
    assert!(ctl.ema_values()[7] > 0.0);
    ctl.unfreeze();
    for _ in 0..8 {
        busy(&c, &[7], 4);
        ctl.step(&c, &mut ex).unwrap();
    }
    assert!(ctl.map().is_hot(0, 7));
}

#[test]
fn failed_and_stale_swaps_are_counted_never_applied() {
    let g = geo();
    let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
    let target = ResidencyMap::from_hot_sets("t", g, vec![vec![6, 7], vec![0, 1]]).unwrap();
    assert_eq!(ctl.request_map(&target).unwrap(), 2);
    // Layer 0's chain: swap 1 refused at begin, so swap 2 (planned at generation 1) is stale.
    let mut ex = Flaky {
        inner: NullExecutor::new(),
        fail_begins: 1,
        fail_commits: 0,
    };
    let c = PickCounters::new(&g).unwrap();
    let r = ctl.step(&c, &mut ex).unwrap();
    assert_eq!((r.failed, r.rejected, r.begun), (1, 1, 0));
    assert_eq!(ctl.map().layer(0).unwrap().generation(), 0);
    // Copy failure at commit: nothing applied, the chain's next swap is stale at begin.
    ctl.request_map(&target).unwrap();
    ex.fail_commits = 1;
    ctl.step(&c, &mut ex).unwrap();
    let r = ctl.step(&c, &mut ex).unwrap();
    assert_eq!((r.failed, r.rejected, r.applied), (1, 1, 0));
    assert_eq!(ctl.map().layer(0).unwrap().generation(), 0);
    let s = ctl.stats();
    assert_eq!((s.planned, s.applied, s.failed, s.rejected), (4, 0, 2, 2));
    // A clean run reaches the target.
    ctl.request_map(&target).unwrap();
    for _ in 0..4 {
        ctl.step(&c, &mut ex).unwrap();
    }
    assert!(ctl.map().same_hot_sets(&target));
}

#[test]
fn baseline_reset_forgets_and_errors_change_nothing() {
    let (g, mut ctl, c, mut ex) = toy();
    {
        let _warmup = c.pause();
        busy(&c, &[7], 100);
    }
    busy(&c, &[6], 100);
    ctl.reset_baseline(&c.snapshot()).unwrap();
    for _ in 0..4 {
        ctl.step(&c, &mut ex).unwrap();
    }
    assert!(ctl.ema_values().iter().all(|&v| v == 0.0));
    let wrong = PickCounters::new(&Geometry::new(3, 8, 2, 1).unwrap()).unwrap();
    let before = ctl.steps();
    assert!(matches!(
        ctl.step(&wrong, &mut ex),
        Err(ExpertError::GeometryMismatch { .. })
    ));
    assert!(ctl.reset_baseline(&[0; 3]).is_err());
    assert!(ctl.drain_now(&[0; 3]).is_err());
    assert_eq!(ctl.steps(), before);
    assert!(Controller::new(
        ResidencyMap::first_k("t", g).unwrap(),
        ControllerConfig {
            policy: crate::PolicyConfig::Ratio(crate::RatioConfig { ratio: 0.5 }),
            ..cfg()
        }
    )
    .is_err());
}

#[test]
fn wrapped_counters_drain_correctly() {
    let g = geo();
    let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg()).unwrap();
    let mut ex = NullExecutor::new();
    let mut snap = vec![u32::MAX - 2; g.cells()];
    ctl.reset_baseline(&snap).unwrap();
    snap[7] = 5; // wrapped: 8 picks of expert 7 in layer 0
    for _ in 0..3 {
        ctl.step_with(None, &mut ex).unwrap();
    }
    let r = ctl.step_with(Some(&snap), &mut ex).unwrap();
    let d = r.drain.expect("due");
    assert_eq!(d.picks, 8);
    assert_eq!(ctl.ema_values()[7], 8.0);
}

#[test]
fn huge_forget_steps_saturate() {
    let g = geo();
    let sr = crate::ShiftResponse {
        forget_steps: u64::MAX,
        jump_ratio: 1.01,
        jump_min: 0.0,
        // every drain is a test (a toy drain holds 32 picks)
        min_picks: 1,
        ..crate::ShiftResponse::default()
    };
    let mut ctl = Controller::new(
        ResidencyMap::first_k("t", g).unwrap(),
        ControllerConfig {
            shift_response: Some(sr),
            ..cfg()
        },
    )
    .unwrap();
    let c = PickCounters::new(&g).unwrap();
    let mut ex = NullExecutor::new();
    // Hot traffic first (cold share 0), then cold traffic: a jump, with u64::MAX forget steps.
    for i in 0..16 {
        busy(&c, if i < 8 { &[0, 1] } else { &[6, 7] }, 2);
        ctl.step(&c, &mut ex).unwrap();
    }
    assert!(ctl.shift_detections() >= 1);
    assert!(ctl.ema_values().iter().all(|v| v.is_finite()));
}

/// A policy that always asks for the same choices, whatever the heat.
#[derive(Debug)]
struct Fixed(Vec<SwapChoice>);

impl SwapPolicy for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }
    fn plan(&mut self, layer: &crate::LayerHeat<'_>, out: &mut Vec<SwapChoice>) {
        assert_eq!(layer.heat.len(), layer.row.table().len());
        out.extend_from_slice(&self.0);
    }
}

#[test]
fn custom_policy_is_capped_stamped_and_cannot_corrupt_the_map() {
    let g = geo();
    let c = |incoming, outgoing| SwapChoice { incoming, outgoing };
    let plan = |choices: Vec<SwapChoice>, max_swaps_per_layer| {
        let cfg = ControllerConfig {
            max_swaps_per_layer,
            ..cfg()
        };
        let map = ResidencyMap::first_k("t", g).unwrap();
        let mut ctl = Controller::with_policy(map, cfg, Box::new(Fixed(choices))).unwrap();
        assert_eq!(ctl.policy().name(), "fixed");
        ctl.drain_now(&vec![0; g.cells()]).unwrap();
        ctl.queued().to_vec()
    };
    // Two valid choices: consecutive generations, the outgoing experts' slots.
    let q = plan(vec![c(5, 1), c(6, 0)], 2);
    assert_eq!(q.len(), 4, "both layers plan");
    assert_eq!((q[0].slot, q[0].generation), (1, 0));
    assert_eq!((q[1].slot, q[1].generation), (0, 1));
    // The cap cuts the list.
    assert_eq!(plan(vec![c(5, 1), c(6, 0)], 1).len(), 2);
    // The list stops at the first invalid choice: incoming hot, outgoing cold, out of range,
    // repeated incoming or outgoing.
    for bad in [c(0, 1), c(5, 6), c(99, 1), c(5, 0), c(7, 1)] {
        let q = plan(vec![c(5, 1), bad, c(6, 0)], 8);
        assert_eq!(q.len(), 2, "{bad:?}");
        assert!(q.iter().all(|s| (s.incoming, s.outgoing) == (5, 1)));
    }
    assert!(plan(vec![c(1, 0)], 8).is_empty());
    // Applied through an executor, the plan reaches the map.
    let map = ResidencyMap::first_k("t", g).unwrap();
    let fixed = Box::new(Fixed(vec![c(5, 1), c(6, 0)]));
    let mut ctl = Controller::with_policy(map, cfg(), fixed).unwrap();
    let counters = PickCounters::new(&g).unwrap();
    let mut ex = NullExecutor::new();
    for _ in 0..12 {
        ctl.step(&counters, &mut ex).unwrap();
    }
    assert_eq!(ctl.map().hot_sets(), vec![vec![6, 5]; 2]);
    assert_eq!(ctl.map().layer(0).unwrap().generation(), 2);
    assert_eq!(ctl.stats().rejected, 0);
}

mod machine {
    use super::*;
    use crate::memory::MemoryExecutor;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// A step whose picks favour experts `hot_bias..hot_bias+2` (per layer), then `step`.
        Step {
            bias: u32,
            tokens: u8,
        },
        Freeze,
        Unfreeze,
        Reset,
        Request(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            12 => (0..8u32, 1..6u8).prop_map(|(bias, tokens)| Op::Step { bias, tokens }),
            1 => Just(Op::Freeze),
            2 => Just(Op::Unfreeze),
            1 => Just(Op::Reset),
            1 => (0..8u32).prop_map(Op::Request),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Whatever the sequence: every planned swap is accounted for exactly once (applied,
        /// rejected, failed, cancelled, queued or in flight), at most `max_swaps_per_step`
        /// begin per step, at most one swap is in flight per layer, and the executor's bytes
        /// and table agree with the controller's rowmap after every step.
        #[test]
        fn controller_invariants(ops in prop::collection::vec(op(), 1..120)) {
            let g = Geometry::new(3, 8, 2, 1).unwrap();
            let cfg = ControllerConfig {
                drain_every: 3,
                half_life_steps: 10.0,
                max_swaps_per_step: 2,
                max_swaps_per_layer: 2,
                shift_response: Some(crate::ShiftResponse::default()),
                ..ControllerConfig::published_recipe()
            };
            let mut ctl = Controller::new(ResidencyMap::first_k("m", g).unwrap(), cfg).unwrap();
            let mut ex = MemoryExecutor::new(ctl.map(), 8, 1).unwrap();
            let c = PickCounters::new(&g).unwrap();
            for op in ops {
                match op {
                    Op::Step { bias, tokens } => {
                        let picks: Vec<u32> = (0..tokens as u32)
                            .flat_map(|t| [(bias + t % 2) % 8, (bias + 1 + t) % 8])
                            .collect();
                        c.record_step(&StepPicks { layers: vec![picks; 3] }).unwrap();
                        let r = ctl.step(&c, &mut ex).unwrap();
                        prop_assert!(r.begun <= 2);
                        prop_assert!(ex.in_flight() <= 3);
                        ex.verify(ctl.map()).unwrap();
                    }
                    Op::Freeze => ctl.freeze(),
                    Op::Unfreeze => ctl.unfreeze(),
                    Op::Reset => ctl.reset_baseline(&c.snapshot()).unwrap(),
                    Op::Request(k) => {
                        let hot = (0..3).map(|l| vec![(k + l) % 8, (k + l + 3) % 8]).collect();
                        let target = ResidencyMap::from_hot_sets("m", g, hot).unwrap();
                        // Refused while swaps are in flight; nothing changes then.
                        let before = ctl.stats();
                        if ctl.request_map(&target).is_err() {
                            prop_assert!(ctl.in_flight_count() > 0);
                            prop_assert_eq!(ctl.stats(), before);
                        }
                    }
                }
                let s = ctl.stats();
                prop_assert_eq!(
                    s.planned,
                    s.applied + s.rejected + s.failed + s.cancelled
                        + ctl.queued().len() as u64 + ctl.in_flight_count() as u64
                );
                prop_assert_eq!(ctl.in_flight_count() as usize, ex.in_flight());
            }
        }
    }
}

#[test]
fn an_executor_of_another_geometry_is_a_typed_error_not_failed_swaps() {
    // Used to return Ok at every step while every swap failed in the executor.
    let (g, mut ctl, counters, _) = toy();
    for other in [
        Geometry::new(2, 8, 3, g.expert_bytes).unwrap(), // another hot count
        Geometry::new(3, 8, 2, g.expert_bytes).unwrap(), // more layers
        Geometry::new(2, 16, 2, g.expert_bytes).unwrap(), // more experts
        Geometry::new(2, 8, 2, 2 * g.expert_bytes).unwrap(), // other expert bytes
    ] {
        let map = ResidencyMap::first_k("other", other).unwrap();
        let mut exec = crate::MemoryExecutor::new(&map, 16, 1).unwrap();
        busy(&counters, &[6, 7], 4);
        let e = ctl.step(&counters, &mut exec).unwrap_err();
        assert!(
            matches!(&e, ExpertError::GeometryMismatch { expected, found }
                if expected.contains("controller") && found.contains("executor")),
            "{e}"
        );
        let e = ctl.step_with(Some(&[0; 16]), &mut exec).unwrap_err();
        assert!(matches!(e, ExpertError::GeometryMismatch { .. }), "{e}");
        assert_eq!(ctl.steps(), 0, "nothing changed");
    }
    // The executor of the controller's own geometry (and a bankless one) drive it as before.
    let mut exec = crate::MemoryExecutor::new(ctl.map(), 16, 1).unwrap();
    for _ in 0..12 {
        busy(&counters, &[6, 7], 4);
        ctl.step(&counters, &mut exec).unwrap();
    }
    exec.flush().unwrap();
    ctl.step(&counters, &mut exec).unwrap();
    assert!(ctl.stats().applied > 0 && ctl.stats().failed == 0);
    ctl.step(&counters, &mut NullExecutor::new()).unwrap();
}

#[test]
fn drain_telemetry_reports_the_link_unit_beside_the_pick_unit() {
    // 2 layers × 8 experts, experts 0 and 1 hot, 1 KiB experts; frozen so the map stays.
    let g = geo();
    let cost = ControllerConfig {
        drain_every: 4,
        ..ControllerConfig::default()
    };
    let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cost).unwrap();
    let (c, mut ex) = (PickCounters::new(&g).unwrap(), NullExecutor::new());
    ctl.freeze();
    // Batch 1: one token picks hot 0 and cold 5 each step. Per pick and per touch: half cold;
    // the link reads one cold expert per layer and step.
    let mut last = None;
    for _ in 0..8 {
        c.record_step(&StepPicks {
            layers: vec![vec![0, 5]; 2],
        })
        .unwrap();
        last = ctl.step(&c, &mut ex).unwrap().drain.or(last);
    }
    let d = last.clone().expect("drained");
    let get = |x: Option<f64>| x.expect("the default policy estimates touches");
    assert!((d.cold_share - 0.5).abs() < 1e-12);
    assert!((get(d.cold_share_touched) - 0.5).abs() < 1e-12, "{d:?}");
    assert!((get(d.touched) - 2.0 * 2.0 * d.elapsed_steps as f64).abs() < 1e-9);
    assert!(
        (get(d.host_bytes_per_step) - 2.0 * 1024.0).abs() < 1e-6,
        "{d:?}"
    );
    // Batch 4: every token picks hot expert 0, two cold experts share the rest. Per pick half
    // is cold; per touch the link serves 2 of the ~3 experts a step touches.
    for _ in 0..8 {
        c.record_step(&StepPicks {
            layers: vec![vec![0, 2, 0, 2, 0, 3, 0, 3]; 2],
        })
        .unwrap();
        last = ctl.step(&c, &mut ex).unwrap().drain.or(last);
    }
    let d = last.unwrap();
    assert!((d.cold_share - 0.5).abs() < 1e-12);
    assert!(
        (0.6..0.7).contains(&get(d.cold_share_touched)) && get(d.cold_share_touched_window) > 0.5,
        "{d:?}"
    );
    // ~1.9 cold experts touched per layer and step (the estimate from counts: 2 at most).
    let per_step = get(d.host_bytes_per_step) / (2.0 * 1024.0);
    assert!((1.8..=2.0).contains(&per_step), "{per_step}");
    let line: DrainTelemetry = serde_json::from_str(&d.to_json_line()).unwrap();
    assert_eq!(line, d);
    // The ratio recipe learns from picks alone: no touch estimate, said as `None`.
    let (_, mut ratio, c, mut ex) = toy();
    let mut d = None;
    for _ in 0..4 {
        busy(&c, &[0, 5], 1);
        d = ratio.step(&c, &mut ex).unwrap().drain.or(d);
    }
    let d = d.unwrap();
    assert_eq!((d.touched, d.host_bytes_per_step), (None, None));
}

#[test]
fn a_prefill_burst_counts_one_touched_step_per_expert_not_its_picks() {
    // 2 layers × 8 experts, drains every 4 steps (fixed cadence), frozen so the map stays.
    let g = geo();
    let cfg = ControllerConfig {
        drain_every: 4,
        adaptive: None,
        ..ControllerConfig::default()
    };
    let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg).unwrap();
    let (c, mut ex) = (PickCounters::new(&g).unwrap(), NullExecutor::new());
    ctl.freeze();
    let decode = StepPicks {
        layers: vec![vec![0, 5]; 2],
    };
    let mut drain = |ctl: &mut Controller, steps: &[&StepPicks]| {
        let mut last = None;
        for s in steps {
            c.record_step(s).unwrap();
            last = ctl.step(&c, &mut ex).unwrap().drain.or(last);
        }
        last.expect("drained")
    };
    // Three intervals of batch-1 decode: 2 picks per step per layer.
    for _ in 0..3 {
        let d = drain(&mut ctl, &[&decode; 4]);
        assert_eq!(d.touched, Some(16.0), "batch 1: touches = picks");
    }
    let cell = |ctl: &Controller, e: usize| ctl.touch_values()[e];
    assert_eq!(cell(&ctl, 6), 0.0);
    // An interval holding a 40-token prefill that picks experts 6 and 7 (80 picks per layer in
    // one step): the estimate would spread them over the interval (λ = 10 picks per step: 4
    // touched steps each); the link paid for one step, and one is what is counted.
    let prefill = StepPicks {
        layers: vec![[6, 7].repeat(40); 2],
    };
    let d = drain(&mut ctl, &[&decode, &prefill, &decode, &decode]);
    assert_eq!(
        d.touched,
        Some(8.0),
        "experts 0, 5, 6, 7 touched, once each, per layer: {d:?}"
    );
    assert_eq!(cell(&ctl, 6), 1.0);
    assert_eq!(cell(&ctl, 7), 1.0);
    // Decode after it is decode again (the burst did not become the picks-per-step norm).
    let d = drain(&mut ctl, &[&decode; 4]);
    assert_eq!(d.touched, Some(16.0), "{d:?}");
}
