//! GPU tests of the expert bank and the GPU executor (feature `test-hooks`, with `cuda`): the swap
//! protocol on a real device, readers concurrent with swaps, typed faults, and the controller
//! driving the executor. Every test prints `SKIP: no CUDA device` and returns where no device
//! exists.
#![cfg(feature = "test-hooks")]

use std::sync::Arc;

use cuda_kernels::{DeviceBuffer, Gpu, PickCounterGpu, TopkShape};
use expert_residency::gpu::{CommitMode, ExpertBankGpu, GpuExecutor};
use expert_residency::{
    Controller, ControllerConfig, ExpertError, Geometry, PlannedSwap, ResidencyMap, SwapExecutor,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tierkit_testkit::{gpu_or_skip, write_expert_pattern, ExpertReaders};

/// Under compute-sanitizer (`TIERKIT_SANITIZE=1`) the long loops shrink ~30x: the sanitizer
/// instruments every load, and the point there is memory safety, not volume.
fn scaled(n: usize) -> usize {
    if std::env::var_os("TIERKIT_SANITIZE").is_some() {
        (n / 30).max(20)
    } else {
        n
    }
}

fn geo(layers: u32, experts: u32, hot_per_layer: u32, expert_bytes: u64) -> Geometry {
    Geometry::new(layers, experts, hot_per_layer, expert_bytes).unwrap()
}

/// A bank of `geo` whose experts hold the self-checking pattern (tag = flat index, seed 42),
/// with the first-K map loaded.
fn pattern_bank(gpu: &Arc<Gpu>, geo: Geometry) -> ExpertBankGpu {
    let mut bank = ExpertBankGpu::new(gpu, geo).unwrap();
    let experts = geo.experts_per_layer;
    bank.fill_host(8, |l, e, b| write_expert_pattern(b, l * experts + e, 42))
        .unwrap();
    bank.load_map(&ResidencyMap::first_k("gpu-bank", geo).unwrap())
        .unwrap();
    bank
}

/// Mismatching table entries plus mismatching HBM slots of `bank` (0 = consistent), after
/// synchronising the device.
fn consistent(bank: &ExpertBankGpu) -> u64 {
    bank.mismatches().unwrap()
}

/// The bank's indirection table as the reader kernels take it: its device address and the
/// bytes each entry points at.
fn table(bank: &ExpertBankGpu) -> (u64, u64) {
    (bank.table_ptr(), bank.geometry().expert_bytes)
}

/// Begins `(layer, incoming -> outgoing)` planned against the bank's map now.
fn begin(bank: &mut ExpertBankGpu, layer: u32, incoming: u32, outgoing: u32) {
    let swap = bank.plan_swap(layer, incoming, outgoing).unwrap();
    bank.begin_swap(&swap).unwrap();
}

fn random_swap(bank: &ExpertBankGpu, rng: &mut ChaCha8Rng, layer: u32) -> (u32, u32) {
    let geo = bank.geometry();
    let hot = bank.hot_experts(layer);
    let cold: Vec<u32> = (0..geo.experts_per_layer)
        .filter(|&e| !bank.is_hot(layer, e))
        .collect();
    (
        cold[rng.random_range(0..cold.len())],
        hot[rng.random_range(0..hot.len())],
    )
}

#[test]
fn ten_thousand_random_swaps_then_restore_keep_every_slot_exact() {
    let Some(gpu) = gpu_or_skip() else { return };
    let geo = geo(8, 16, 6, 64 << 10);
    let mut bank = pattern_bank(&gpu, geo);
    let readers = ExpertReaders::new(&gpu).unwrap();
    let s = gpu.stream().clone();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let cells = geo.layers * geo.experts_per_layer;
    let pick_sets: Vec<DeviceBuffer<u32>> = (0..8)
        .map(|_| {
            let p: Vec<u32> = (0..64).map(|_| rng.random_range(0..cells)).collect();
            DeviceBuffer::from_host(gpu.ctx(), &p).unwrap()
        })
        .collect();
    let errors = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 2).unwrap();
    let (mut committed, mut step, mut deferred_seen) = (0usize, 0usize, 0usize);
    let target = scaled(10_000);
    while committed < target {
        readers
            .launch_checksum_reader(
                table(&bank),
                &s,
                &pick_sets[step % pick_sets.len()],
                &errors,
            )
            .unwrap();
        step += 1;
        for _ in 0..3 {
            let l = rng.random_range(0..geo.layers);
            if !bank.in_flight(l) {
                let (inc, out) = random_swap(&bank, &mut rng, l);
                begin(&mut bank, l, inc, out);
            }
        }
        let inflight_before = (0..geo.layers).filter(|&l| bank.in_flight(l)).count();
        let mode = if step % 5 == 0 {
            CommitMode::Wait
        } else {
            CommitMode::Deferred
        };
        let done = bank.commit_ready(&s, mode).unwrap();
        if done.len() < inflight_before {
            deferred_seen += 1;
        }
        committed += done.len();
        if step % 64 == 0 {
            s.synchronize().unwrap();
        }
    }
    // restore the boot map through swaps
    for l in 0..geo.layers {
        loop {
            let hot = bank.hot_experts(l);
            let Some(&out) = hot.iter().find(|&&e| e >= geo.hot_per_layer) else {
                break;
            };
            let inc = (0..geo.hot_per_layer)
                .find(|&e| !bank.is_hot(l, e))
                .unwrap();
            begin(&mut bank, l, inc, out);
            readers
                .launch_checksum_reader(table(&bank), &s, &pick_sets[0], &errors)
                .unwrap();
            assert_eq!(bank.commit_ready(&s, CommitMode::Wait).unwrap().len(), 1);
        }
        let mut hot = bank.hot_experts(l);
        hot.sort();
        assert_eq!(hot, (0..geo.hot_per_layer).collect::<Vec<_>>());
    }
    s.synchronize().unwrap();
    assert_eq!(
        consistent(&bank),
        0,
        "an HBM slot or table entry differs from the host copy"
    );
    let e = errors.download().unwrap();
    assert_eq!(
        e[0], 0,
        "reader saw a torn or stale expert (last bad flat index {})",
        e[1]
    );
    println!("{committed} swaps over {step} steps ({deferred_seen} boundaries deferred a copy); all slots exact");
}

#[test]
fn readers_concurrent_with_swaps_never_see_torn_or_stale_experts() {
    let Some(gpu) = gpu_or_skip() else { return };
    // 1 MiB experts: copies take ~20 us, so they overlap the readers of later steps.
    let geo = geo(4, 8, 4, 1 << 20);
    let mut bank = pattern_bank(&gpu, geo);
    let readers = ExpertReaders::new(&gpu).unwrap();
    let s = gpu.stream().clone();
    let all: Vec<u32> = (0..geo.layers * geo.experts_per_layer).collect();
    let picks = DeviceBuffer::from_host(gpu.ctx(), &all).unwrap();
    let errors = DeviceBuffer::<u32>::zeroed(gpu.ctx(), 2).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut committed = 0;
    let steps = scaled(1500);
    for step in 0..steps {
        readers
            .launch_checksum_reader(table(&bank), &s, &picks, &errors)
            .unwrap();
        let l = rng.random_range(0..geo.layers);
        if !bank.in_flight(l) {
            let (inc, out) = random_swap(&bank, &mut rng, l);
            begin(&mut bank, l, inc, out);
        }
        committed += bank.commit_ready(&s, CommitMode::Deferred).unwrap().len();
        if step % 16 == 0 {
            s.synchronize().unwrap();
        }
    }
    s.synchronize().unwrap();
    let e = errors.download().unwrap();
    assert_eq!(e[0], 0, "torn or stale read of flat expert {}", e[1]);
    assert!(committed > steps / 15, "only {committed} swaps committed");
    assert_eq!(consistent(&bank), 0);
    println!("{committed} swaps under {steps} concurrent reader steps, no torn or stale read");
}

#[test]
fn swap_faults_are_typed_errors_and_change_nothing() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut bank = pattern_bank(&gpu, geo(2, 8, 3, 4096));
    let s = gpu.stream().clone();
    let g = bank.generation(0);
    let raw = |incoming, outgoing, slot, generation| PlannedSwap {
        layer: 0,
        incoming,
        outgoing,
        slot,
        generation,
    };
    let plan_5_1 = bank.plan_swap(0, 5, 1).unwrap();
    assert_eq!((plan_5_1.slot, plan_5_1.generation), (1, g));
    assert!(matches!(
        bank.begin_swap(&PlannedSwap {
            generation: g + 1,
            ..plan_5_1
        }),
        Err(ExpertError::StaleSwap { .. })
    ));
    assert!(
        matches!(
            bank.begin_swap(&raw(1, 2, 2, g)),
            Err(ExpertError::InvalidSwap(_))
        ),
        "incoming already hot"
    );
    assert!(
        matches!(
            bank.begin_swap(&raw(5, 6, 0, g)),
            Err(ExpertError::InvalidSwap(_))
        ),
        "outgoing cold"
    );
    assert!(matches!(
        bank.begin_swap(&PlannedSwap {
            layer: 2,
            ..plan_5_1
        }),
        Err(ExpertError::LayerOutOfRange { .. })
    ));
    assert!(matches!(
        bank.begin_swap(&raw(8, 1, 1, g)),
        Err(ExpertError::ExpertOutOfRange { .. })
    ));
    assert!(!bank.in_flight(0));
    bank.begin_swap(&plan_5_1).unwrap();
    let plan_6_2 = bank.plan_swap(0, 6, 2).unwrap();
    assert!(
        matches!(bank.begin_swap(&plan_6_2), Err(ExpertError::Executor(_))),
        "spare busy"
    );
    // a stale plan after the commit: planned at g, the bank's map is at g + 1
    let done = bank.commit_ready(&s, CommitMode::Wait).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].generation, g + 1);
    assert!(matches!(
        bank.begin_swap(&plan_6_2),
        Err(ExpertError::StaleSwap { .. })
    ));
    assert!(!bank.in_flight(0));
    assert!(bank.is_hot(0, 5) && !bank.is_hot(0, 1));
    assert_eq!(
        bank.entry(0, 1).unwrap(),
        bank.store().host_device_ptr(0, 1)
    );
    assert_eq!(consistent(&bank), 0);
    assert!(
        bank.host_expert_mut(0, 0).is_err(),
        "weights are read-only once served"
    );
    // Out-of-range queries answer null / empty instead of panicking on a u32 overflow or an
    // index out of bounds.
    let store = bank.store();
    assert_eq!(store.slot_ptr(2, 0), 0);
    assert_eq!(store.slot_ptr(0, 4), 0);
    assert_eq!(store.slot_ptr(u32::MAX, u32::MAX), 0);
    assert_ne!(store.slot_ptr(1, 3), 0, "the spare slot is a slot");
    assert_eq!(store.host_device_ptr(0, 8), 0);
    assert_eq!(store.host_device_ptr(u32::MAX, 0), 0);
    assert!(bank.hot_experts(2).is_empty() && bank.hot_experts(u32::MAX).is_empty());
    assert_eq!(bank.hot_experts(1), vec![0, 1, 2]);
    assert_eq!((bank.spare_slot(0), bank.spare_slot(2)), (Some(1), None));
    // A geometry whose products overflow is a typed error before any allocation: the tier's
    // own bounds, then the store's (2^24 cells of 2^39 bytes fit a u64, not isize::MAX).
    let huge = Geometry {
        layers: 65536,
        experts_per_layer: 65536,
        hot_per_layer: 65535,
        expert_bytes: 1 << 48,
    };
    assert!(matches!(
        ExpertBankGpu::new(&gpu, huge),
        Err(ExpertError::InvalidGeometry(_))
    ));
    let too_big = geo(4096, 4096, 1, 1 << 39);
    assert!(matches!(
        ExpertBankGpu::new(&gpu, too_big),
        Err(ExpertError::Cuda(
            cuda_kernels::CudaError::OutOfRange { .. }
        ))
    ));
}

/// One generation for map, executor and bank: the executor refuses a swap planned against a
/// generation its mirror of the controller's map has left, before any copy starts.
#[test]
fn the_gpu_executor_refuses_a_stale_swap() {
    let Some(gpu) = gpu_or_skip() else { return };
    let g = geo(2, 8, 3, 4096);
    let map = ResidencyMap::first_k("stale", g).unwrap();
    let mut exec = GpuExecutor::new(&gpu, gpu.stream().clone(), &map, 2, |l, e, b| {
        write_expert_pattern(b, l * 8 + e, 1)
    })
    .unwrap();
    let first = exec.bank().plan_swap(0, 5, 1).unwrap();
    let second = exec.bank().plan_swap(0, 6, 2).unwrap(); // also planned at generation 0
    exec.begin(&first).unwrap();
    exec.flush().unwrap();
    let done = exec.commit_ready(&mut |_| true).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(exec.bank().generation(0), 1);
    assert!(exec.can_begin(0));
    assert!(matches!(
        exec.begin(&second),
        Err(ExpertError::StaleSwap {
            layer: 0,
            expected: 0,
            actual: 1
        })
    ));
    assert_eq!(exec.in_flight(), 0);
    assert!(!exec.bank().in_flight(0));
    // re-planned at the current generation, it goes through
    exec.begin(&exec.bank().plan_swap(0, 6, 2).unwrap())
        .unwrap();
    exec.flush().unwrap();
    assert_eq!(exec.commit_ready(&mut |_| true).unwrap().len(), 1);
    assert_eq!(consistent(exec.bank()), 0);
}

#[test]
fn flip_is_deferred_until_the_copy_completes() {
    let Some(gpu) = gpu_or_skip() else { return };
    // 64 MiB experts: the copy takes > 1 ms, so an immediate deferred commit must not flip.
    let mut bank = pattern_bank(&gpu, geo(1, 4, 2, 64 << 20));
    let s = gpu.stream().clone();
    let before = bank.entry(0, 3).unwrap();
    begin(&mut bank, 0, 3, 0);
    let early = bank.commit_ready(&s, CommitMode::Deferred).unwrap();
    if early.is_empty() {
        assert_eq!(
            bank.entry(0, 3).unwrap(),
            before,
            "flipped before the copy completed"
        );
        assert!(bank.in_flight(0));
    } else {
        println!("note: the 64 MiB copy had already completed at the first boundary");
    }
    bank.copy_stream().synchronize().unwrap();
    assert!(bank.copy_complete(0).unwrap() || !early.is_empty());
    let late = bank.commit_ready(&s, CommitMode::Deferred).unwrap();
    assert_eq!(early.len() + late.len(), 1);
    assert!(bank.is_hot(0, 3));
    assert_eq!(consistent(&bank), 0);
}

#[test]
fn controller_drives_the_gpu_executor_and_maps_agree() {
    let Some(gpu) = gpu_or_skip() else { return };
    let g = Geometry::new(4, 16, 4, 64 << 10).unwrap();
    let map = ResidencyMap::first_k("gpu-test", g).unwrap();
    let stream = gpu.stream().clone();
    let mut exec = GpuExecutor::new(&gpu, stream.clone(), &map, 4, |l, e, b| {
        write_expert_pattern(b, l * 16 + e, 3)
    })
    .unwrap();
    let cfg = ControllerConfig {
        drain_every: 4,
        ..ControllerConfig::published_recipe()
    };
    let mut ctl = Controller::new(map, cfg).unwrap();
    let mut counter = PickCounterGpu::new(&gpu, 4, 16).unwrap();
    // every token picks one of experts 12..16 (cold at boot) and expert 0 (hot at boot):
    // 1, 2, 3 go idle, so three of 12..16 must come in per layer.
    let (tokens, k) = (32u32, 2u32);
    let mut ids = Vec::new();
    for _l in 0..4 {
        for t in 0..tokens {
            ids.push(12 + (t % 4) as i32);
            ids.push(0);
        }
    }
    let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
    let mut draining = false;
    let mut applied = 0;
    for _ in 0..400 {
        counter
            .count(&stream, &d, TopkShape::step(4, tokens, k), 0)
            .unwrap();
        if ctl.drain_due() && !draining {
            counter.drain_async(&stream).unwrap();
            draining = true;
        }
        let snap = if draining {
            counter.poll_drain().unwrap().map(|s| s.counts.to_vec())
        } else {
            None
        };
        if snap.is_some() {
            draining = false;
        }
        applied += ctl.step_with(snap.as_deref(), &mut exec).unwrap().applied;
    }
    exec.flush().unwrap();
    applied += ctl.step_with(None, &mut exec).unwrap().applied;
    assert!(applied >= 12, "applied {applied}");
    for l in 0..4 {
        let mut a = ctl.map().hot_sets()[l as usize].clone();
        let mut b = exec.bank().hot_experts(l);
        a.sort();
        b.sort();
        assert_eq!(a, b, "layer {l}: controller map and GPU bank disagree");
        assert!(
            a.contains(&0) && a.iter().filter(|&&e| e >= 12).count() == 3,
            "layer {l}: {a:?}"
        );
    }
    assert_eq!(consistent(exec.bank()), 0);
}
