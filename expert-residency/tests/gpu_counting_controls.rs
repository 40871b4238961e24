//! GPU test of the counting controls end to end (`cuda` feature): a device counter whose
//! control block excludes warm-up passes and padding rows, drained into a boot-frozen
//! controller started by the recipe's control message, then re-created under the controller
//! (re-baselined, no phantom picks). Prints `SKIP: no CUDA device` and returns where no device
//! exists.
#![cfg(feature = "cuda")]

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{DeviceBuffer, PickCounterGpu, TopkShape};
use expert_residency::{
    ControlMessage, Controller, ControllerConfig, DrainTelemetry, Geometry, NullExecutor,
    ResidencyMap,
};
use tierkit_testkit::gpu_or_skip;

const LAYERS: u32 = 2;
const EXPERTS: u32 = 8;
const TOKENS: u32 = 64;
const K: u32 = 2;

/// One step boundary: drains the device table into the controller when a drain is due.
fn boundary(
    ctl: &mut Controller,
    counter: &mut PickCounterGpu,
    s: &CudaStream,
    ex: &mut NullExecutor,
) -> Option<DrainTelemetry> {
    if ctl.drain_due() {
        counter.drain_async(s).unwrap();
        let snap = counter.wait_drain().unwrap();
        ctl.step_with(Some(snap.counts), ex).unwrap().drain
    } else {
        ctl.step_with(None, ex).unwrap().drain
    }
}

#[test]
fn device_controls_and_counter_reset_drive_the_controller() {
    let Some(gpu) = gpu_or_skip() else { return };
    let s = gpu.stream().clone();
    let g = Geometry::new(LAYERS, EXPERTS, 2, 1 << 10).unwrap();
    let cfg = ControllerConfig {
        drain_every: 4,
        boot_frozen: true,
        ..ControllerConfig::published_recipe()
    };
    let mut ctl = Controller::new(ResidencyMap::first_k("t", g).unwrap(), cfg).unwrap();
    let mut ex = NullExecutor::new();
    let shape = TopkShape::step(LAYERS, TOKENS, K);
    // real rows (t < 40) pick experts 6 and 7 (cold at boot); padding rows pick expert 5
    let real = 40u32;
    let ids: Vec<i32> = (0..LAYERS)
        .flat_map(|_| (0..TOKENS).flat_map(|t| if t < real { [6, 7] } else { [5, 5] }))
        .collect();
    let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
    let mut counter = PickCounterGpu::new(&gpu, LAYERS, EXPERTS).unwrap();
    // warm-up: counting disabled on the device, the controller frozen
    counter.set_enabled_async(&s, false).unwrap();
    for _ in 0..8 {
        counter.count(&s, &d, shape, 0).unwrap();
        if let Some(t) = boundary(&mut ctl, &mut counter, &s, &mut ex) {
            assert_eq!(t.picks, 0, "a disabled counter counted");
            assert!(t.frozen);
        }
    }
    // serving: enabled, padded batches of `real` valid rows; the recipe's message
    counter.set_enabled_async(&s, true).unwrap();
    counter.set_valid_tokens_async(&s, real).unwrap();
    counter.drain_async(&s).unwrap();
    let msg = ControlMessage::from_json(r#"{"freeze": false, "baseline": true}"#).unwrap();
    ctl.apply_control(&msg, Some(counter.wait_drain().unwrap().counts))
        .unwrap();
    assert!(!ctl.is_frozen());
    let mut drains = 0;
    for _ in 0..24 {
        counter.count(&s, &d, shape, 0).unwrap();
        if let Some(t) = boundary(&mut ctl, &mut counter, &s, &mut ex) {
            drains += 1;
            assert_eq!(t.picks, (4 * LAYERS * real * K) as u64, "padding counted");
        }
    }
    assert!(drains >= 5);
    for l in 0..LAYERS {
        assert!(ctl.map().is_hot(l, 6) && ctl.map().is_hot(l, 7));
        assert_eq!(ctl.ema_values()[(l * EXPERTS + 5) as usize], 0.0);
    }
    // the engine re-creates its counter: one re-baselined drain, then exact counts again
    let mut counter = PickCounterGpu::new(&gpu, LAYERS, EXPERTS).unwrap();
    let mut seen = Vec::new();
    for _ in 0..12 {
        counter.count(&s, &d, shape, 0).unwrap(); // defaults: every row counted
        if let Some(t) = boundary(&mut ctl, &mut counter, &s, &mut ex) {
            seen.push((t.counter_reset, t.picks));
        }
    }
    assert_eq!(ctl.counter_resets(), 1);
    let full = (4 * LAYERS * TOKENS * K) as u64;
    assert_eq!(seen[0], (true, 0), "{seen:?}");
    assert!(seen[1..].iter().all(|&(r, p)| !r && p == full), "{seen:?}");
}
