//! The serving simulation's unit tests (beside the code, in their own file for length).

use super::*;
use crate::kv::selection::SelectionParams;
use crate::kv::trace::TraceRequest;

fn small() -> SimConfig {
    SimConfig {
        hbm_budget_bytes: 64 * 16 * 100,
        kv_bytes_per_token: 100,
        hot_rows: 32,
        tail_rows: 8,
        page_rows: 8,
        max_batch: 64,
        chunk_pages: 16,
        max_steps: 400,
        selection: SelectionParams::calibrated(16),
        ..SimConfig::default()
    }
}

fn trace(n: usize, gap_ms: u64, input: u32) -> ArrivalTrace {
    ArrivalTrace {
        name: "t".into(),
        requests: (0..n)
            .map(|i| TraceRequest {
                arrival_ms: i as u64 * gap_ms,
                input_length: input,
                output_length: 20,
            })
            .collect(),
    }
}

#[test]
fn bad_configs_are_typed_errors_before_anything_runs() {
    let t = trace(3, 10, 50);
    let inval = |c: SimConfig| {
        for p in Placement::ALL {
            let r = simulate_placement(&t, &c, p);
            assert!(
                matches!(r, Err(KvError::InvalidConfig(_))),
                "{p:?} {c:?}: {r:?}"
            );
        }
    };
    // Item 1: max_batch 0 used to spin forever.
    inval(SimConfig {
        max_batch: 0,
        ..small()
    });
    inval(SimConfig {
        chunk_pages: 0,
        ..small()
    });
    // Item 13: NaN / negative / zero floats.
    for load in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
        inval(SimConfig { load, ..small() });
    }
    // Finite but so large that a step (or the clock) would overflow to inf.
    for step_base_us in [f64::NAN, 0.0, -5.0, 1e308, MAX_STEP_TERM_US * 2.0] {
        inval(SimConfig {
            time: TimeModel {
                step_base_us,
                step_per_request_us: 1.0,
                step_per_miss_us: 0.0,
            },
            ..small()
        });
    }
    inval(SimConfig {
        time: TimeModel {
            step_base_us: 1.0,
            step_per_request_us: f64::NAN,
            step_per_miss_us: 0.0,
        },
        ..small()
    });
    for (step_per_request_us, step_per_miss_us) in [(1.0, -1.0), (1e308, 0.0), (0.0, 1e10)] {
        inval(SimConfig {
            time: TimeModel {
                step_base_us: 1.0,
                step_per_request_us,
                step_per_miss_us,
            },
            ..small()
        });
    }
    for admission_gbps in [1e-300, MIN_ADMISSION_GBPS / 2.0] {
        inval(SimConfig {
            admission_gbps,
            ..small()
        });
    }
    inval(SimConfig {
        hbm_budget_bytes: 0,
        ..small()
    });
    inval(SimConfig {
        kv_bytes_per_token: 0,
        ..small()
    });
    // `--top-k` huge: rejected before a selection vector is built.
    inval(SimConfig {
        selection: SelectionParams::calibrated(2_147_483_680),
        ..small()
    });
    inval(SimConfig {
        selection: SelectionParams::calibrated(64),
        ..small()
    });
    // Item 2: page_rows 0 used to divide by zero in the fully resident placement.
    for p in Placement::ALL {
        let r = simulate_placement(
            &t,
            &SimConfig {
                page_rows: 0,
                ..small()
            },
            p,
        );
        assert!(
            matches!(r, Err(KvError::InvalidGeometry(_))),
            "{p:?}: {r:?}"
        );
    }
    // Item 3: hot + tail wrapping to 0 fixed rows; and a 16 GB hot cache.
    for (hot_rows, tail_rows) in [(64, 4_294_967_232), (u32::MAX, 1)] {
        let c = SimConfig {
            hot_rows,
            tail_rows,
            ..small()
        };
        for p in Placement::ALL {
            let r = simulate_placement(&t, &c, p);
            assert!(
                matches!(
                    r,
                    Err(KvError::InvalidGeometry(_)) | Err(KvError::ArenaTooSmall { .. })
                ),
                "{p:?}: {r:?}"
            );
        }
    }
    // A request longer than the documented bound (public trace fields bypass the reader).
    let mut long = t.clone();
    long.requests[1].input_length = u32::MAX;
    let r = simulate_placement(&long, &small(), Placement::Elastic);
    assert!(matches!(r, Err(KvError::Trace(_))), "{r:?}");
    let r = simulate(&trace(0, 1, 10), &small());
    assert!(matches!(r, Err(KvError::Trace(m)) if m.contains("empty trace")));
}

/// A library caller is held to `max_memory_bytes` as the CLI is: refused before anything is
/// allocated, the dominant part named; the limit is the estimate's (one byte more runs); JSON
/// without the field reads the default.
#[test]
fn runs_above_the_memory_limit_are_refused_before_allocating() {
    let t = trace(20, 10, 30);
    let need = crate::kv::footprint::estimate(&small(), &t).total();
    assert!(need > 0);
    let tight = SimConfig {
        max_memory_bytes: need - 1,
        ..small()
    };
    for p in Placement::ALL {
        let r = simulate_placement(&t, &tight, p);
        assert!(
            matches!(&r, Err(KvError::InvalidConfig(m))
                if m.contains("max_memory_bytes") && m.contains("20 sessions at once")),
            "{p:?}: {r:?}"
        );
    }
    let fits = SimConfig {
        max_memory_bytes: need,
        ..small()
    };
    assert!(simulate_placement(&t, &fits, Placement::Elastic).is_ok());
    let mut json = serde_json::to_value(small()).unwrap();
    json.as_object_mut().unwrap().remove("max_memory_bytes");
    let back: SimConfig = serde_json::from_value(json).unwrap();
    assert_eq!(back.max_memory_bytes, DEFAULT_MAX_MEMORY_BYTES);
}

#[test]
fn time_model_fit_recovers_a_line_and_rejects_bad_samples() {
    let steps: Vec<(u32, f64)> = (1..=50).map(|b| (b, 5000.0 + 40.0 * b as f64)).collect();
    let m = TimeModel::fit(&steps).unwrap();
    assert!((m.step_base_us - 5000.0).abs() < 1e-6, "{m:?}");
    assert!((m.step_per_request_us - 40.0).abs() < 1e-9, "{m:?}");
    // A falling line is clamped to a flat one at the mean.
    let m = TimeModel::fit(&[(1, 10.0), (3, 6.0)]).unwrap();
    assert_eq!((m.step_base_us, m.step_per_request_us), (8.0, 0.0));
    for bad in [
        vec![],
        vec![(4, 10.0)],
        vec![(4, 1.0), (4, 2.0)],
        vec![(1, f64::NAN), (2, 1.0)],
    ] {
        assert!(
            matches!(TimeModel::fit(&bad), Err(KvError::InvalidConfig(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn low_load_elastic_fetches_nothing() {
    // One short request at a time: every history fits in borrowed pages.
    let rep = simulate(&trace(5, 10_000, 200), &small()).unwrap();
    let e = &rep.placements[2];
    assert_eq!(e.placement, Placement::Elastic);
    assert_eq!(e.completed, 5);
    assert_eq!(e.misses_per_step, 0.0);
    assert!(
        rep.placements[1].misses_per_step > 0.0,
        "the fixed hot cache misses on 200-token histories"
    );
}

#[test]
fn fit_with_misses_recovers_the_three_terms_and_refuses_collinear_steps() {
    let truth = |b: u32, m: u64| 11_000.0 + 60.0 * b as f64 + 0.95 * m as f64;
    let steps: Vec<(u32, u64, f64)> = (1..40u32)
        .flat_map(|b| {
            [0u64, 500, 3_000].map(|m| (b, m + 37 * b as u64, truth(b, m + 37 * b as u64)))
        })
        .collect();
    let m = TimeModel::fit_with_misses(&steps).unwrap();
    assert!((m.step_base_us - 11_000.0).abs() < 1e-6, "{m:?}");
    assert!((m.step_per_request_us - 60.0).abs() < 1e-9, "{m:?}");
    assert!((m.step_per_miss_us - 0.95).abs() < 1e-12, "{m:?}");
    // misses a multiple of the batch: the two slopes cannot be told apart
    let coll: Vec<(u32, u64, f64)> = (1..10u32)
        .map(|b| (b, 10 * b as u64, 100.0 + b as f64))
        .collect();
    assert!(matches!(
        TimeModel::fit_with_misses(&coll),
        Err(KvError::InvalidConfig(_))
    ));
    // no misses at all: the two-term fit, per-miss 0
    let none: Vec<(u32, u64, f64)> = (1..10u32).map(|b| (b, 0, 100.0 + 2.0 * b as f64)).collect();
    let m = TimeModel::fit_with_misses(&none).unwrap();
    assert_eq!(m.step_per_miss_us, 0.0);
    assert!((m.step_per_request_us - 2.0).abs() < 1e-9);
    assert!(matches!(
        TimeModel::fit_with_misses(&[(1, 1, f64::NAN), (2, 3, 1.0)]),
        Err(KvError::InvalidConfig(_))
    ));
}

#[test]
fn misses_feed_back_into_step_time_when_priced() {
    let trace = trace(40, 1, 400);
    let free = simulate(
        &trace,
        &SimConfig {
            load: 4.0,
            ..small()
        },
    )
    .unwrap();
    let priced = simulate(
        &trace,
        &SimConfig {
            load: 4.0,
            time: TimeModel {
                step_per_miss_us: 50.0,
                ..small().time
            },
            ..small()
        },
    )
    .unwrap();
    let fixed = |r: &SimReport| r.placements[1].clone();
    assert!(
        fixed(&free).misses_per_step > 0.0,
        "the fixed hot cache misses here"
    );
    assert!(
        fixed(&priced).sim_seconds > fixed(&free).sim_seconds,
        "priced misses lengthen the fixed hot cache's steps"
    );
    assert_eq!(
        priced.placements[0].sim_seconds, free.placements[0].sim_seconds,
        "resident never misses"
    );
    assert!(
        fixed(&priced).tokens_per_s > 0.0
            && fixed(&priced).tokens_per_s < fixed(&free).tokens_per_s
    );
}

#[test]
fn per_placement_times_and_resident_admission_copies_are_applied() {
    let trace = trace(40, 1, 400);
    let base = SimConfig {
        load: 4.0,
        ..small()
    };
    let shared = simulate(&trace, &base).unwrap();
    // The resident placement twice as dear per step, the pools as before.
    let slow = TimeModel {
        step_base_us: 2.0 * base.time.step_base_us,
        ..base.time
    };
    let per = simulate(
        &trace,
        &SimConfig {
            placement_time: Some(PlacementTimes {
                resident: slow,
                fixed: base.time,
                elastic: base.time,
                vllm: None,
                sglang: None,
            }),
            ..base
        },
    )
    .unwrap();
    assert!(per.placements[0].sim_seconds > shared.placements[0].sim_seconds);
    assert_eq!(per.placements[1], shared.placements[1]);
    assert_eq!(per.placements[2], shared.placements[2]);
    assert_eq!(base.time_for(Placement::Elastic), base.time);
    // Admission copies stall the resident placement only: 400 tokens × 100 B at 0.001 GB/s
    // is 40 ms per admission.
    let copies = simulate(
        &trace,
        &SimConfig {
            admission_gbps: 0.001,
            ..base
        },
    )
    .unwrap();
    let stalled = copies.placements[0].sim_seconds - shared.placements[0].sim_seconds;
    let admitted = copies.placements[0].admitted as f64;
    assert!(
        (stalled - admitted * 0.04).abs() < 1e-6 * admitted.max(1.0),
        "{stalled} s for {admitted} admissions"
    );
    assert!(copies.placements[0].tokens_per_s < shared.placements[0].tokens_per_s);
    assert_eq!(copies.placements[1], shared.placements[1]);
    assert_eq!(copies.placements[2], shared.placements[2]);
    // Bad per-placement terms and rates are typed errors naming the placement.
    let bad = SimConfig {
        placement_time: Some(PlacementTimes {
            resident: base.time,
            fixed: TimeModel {
                step_base_us: 0.0,
                ..base.time
            },
            elastic: base.time,
            vllm: None,
            sglang: None,
        }),
        ..base
    };
    match bad.validate() {
        Err(KvError::InvalidConfig(m)) => assert!(m.contains("fixed hot cache"), "{m}"),
        r => panic!("{r:?}"),
    }
    for g in [f64::NAN, -1.0, f64::INFINITY] {
        assert!(matches!(
            SimConfig {
                admission_gbps: g,
                ..base
            }
            .validate(),
            Err(KvError::InvalidConfig(_))
        ));
    }
    // An elastic-only cap leaves the other placements alone and bounds elastic's batch.
    let capped = simulate(
        &trace,
        &SimConfig {
            elastic_max_batch: Some(3),
            ..base
        },
    )
    .unwrap();
    assert_eq!(capped.placements[0], shared.placements[0]);
    assert_eq!(capped.placements[1], shared.placements[1]);
    assert!(capped.placements[2].peak_sessions <= 3);
    assert!(shared.placements[2].peak_sessions > 3);
    assert!(matches!(
        SimConfig {
            elastic_max_batch: Some(0),
            ..base
        }
        .validate(),
        Err(KvError::InvalidConfig(_))
    ));
    assert!(matches!(
        SimConfig {
            elastic_max_batch: Some(base.max_batch + 1),
            ..base
        }
        .validate(),
        Err(KvError::InvalidConfig(m)) if m.contains("is above max_batch")
    ));
}

#[test]
fn high_load_elastic_admits_more_than_fully_resident_and_misses_less_than_fixed() {
    let rep = simulate(&trace(60, 1, 400), &small()).unwrap();
    let [full, fixed, el] = [&rep.placements[0], &rep.placements[1], &rep.placements[2]];
    assert!(
        el.peak_sessions as f64 >= 1.75 * full.peak_sessions as f64,
        "{el:?} vs {full:?}"
    );
    assert_eq!(el.peak_sessions, fixed.peak_sessions);
    assert!(
        el.misses_per_step <= fixed.misses_per_step,
        "{el:?} vs {fixed:?}"
    );
    assert_eq!(full.misses_per_step, 0.0);
}
