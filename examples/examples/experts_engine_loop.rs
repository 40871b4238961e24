//! Reference integration of `expert-residency` in a CPU engine loop: each step the router picks
//! top-k experts per token and layer, the grouped expert GEMM reads each picked expert's weights
//! once through the executor's table (hot: an HBM slot; cold: the host copy, read in place), the
//! picks are counted, and at the step boundary the controller drains the counts into its EMA and
//! swaps busier experts in. The `MemoryExecutor` stands in for the GPU bank (same protocol: a
//! spare slot per layer, copies begun at one boundary and committed at a later one) and proves
//! every move lossless. Engines read weights through the executor's table (on the GPU:
//! `GpuExecutor::table_ptr()`), which flips at commit; `Controller::map()` is the policy's view.
//!
//! Run: `cargo run --release -p tierkit-examples --example experts_engine_loop`
use expert_residency::{Controller, ControllerConfig, Geometry, MemoryExecutor, PickCounters};
use expert_residency::{ResidencyMap, Result};

const LAYERS: u32 = 4;
const EXPERTS: u32 = 16;
const HOT: u32 = 4;
const TOP_K: u64 = 2;
const TOKENS: u64 = 8;
const EXPERT_BYTES: u64 = 16 << 20; // what the policy prices a read and a copy by
const STAND_IN_BYTES: usize = 4096; // the bytes this example actually moves per expert

/// A toy router with skewed, shifting popularity: three picks in four go to 4 busy experts,
/// which move from 0..4 to 8..12 at step 200; the rest spread over all experts. Appends one
/// token's distinct top-k picks to `out`.
fn route(step: u64, token: u64, layer: u32, out: &mut Vec<u32>) {
    let h = (step * 31 + token * 17 + layer as u64 * 7).wrapping_mul(0x9E37_79B9) >> 7;
    let busy = if step < 200 { 0 } else { 8 };
    let start = out.len();
    for j in 0..TOP_K {
        let e = if !(h >> (j * 5)).is_multiple_of(4) {
            busy + (h >> (j * 3)) % 4
        } else {
            (h >> (j * 7)) % EXPERTS as u64
        };
        if !out[start..].contains(&(e as u32)) {
            out.push(e as u32);
        }
    }
}

fn main() -> Result<()> {
    let geometry = Geometry::new(LAYERS, EXPERTS, HOT, EXPERT_BYTES)?;
    let boot = ResidencyMap::first_k("toy-moe", geometry)?; // or a seed map fitted offline
    let seed = 7; // the stand-in weights' pseudo-random bytes
    let mut exec = MemoryExecutor::new(&boot, STAND_IN_BYTES, seed)?; // host + HBM slots + spare
    let counters = PickCounters::new(&geometry)?; // the router's counting table

    // The default policy is cost-aware and sizes its drain cadence and half-life from the
    // traffic it sees; `ControllerConfig::published_recipe()` is the GB300 ratio recipe.
    let cfg = ControllerConfig::default();
    let mut ctl = Controller::new(boot, cfg)?;
    let digest = exec.read_digest();
    let mut picks = Vec::new();
    for step in 0..400u64 {
        for layer in 0..LAYERS {
            picks.clear();
            for token in 0..TOKENS {
                route(step, token, layer, &mut picks);
            }
            let mut touched = picks.clone();
            touched.sort_unstable();
            touched.dedup();
            for &e in &touched {
                let _weights = exec.read(layer, e)?; // the grouped GEMM reads each expert once
            }
            counters.record_layer(layer, &picks)?; // one count per pick (the GPU kernel's layout)
        }
        let report = ctl.step(&counters, &mut exec)?; // commit ready swaps, drain, begin swaps
        if let Some(d) = report.drain.filter(|d| d.drain % 6 == 0) {
            let window = ctl.config().window_drains;
            println!(
                "step {:>3}: cold share {:.3} over the last {window} drains, {} swaps applied so far",
                d.step, d.cold_share_window, d.totals.applied
            );
        }
    }
    exec.verify(ctl.map())?; // every hot slot holds exactly its host bytes
    assert_eq!(exec.read_digest(), digest, "a move lost or misplaced bytes");
    println!(
        "{} moves verified lossless; layer 0 hot set now {:?}",
        exec.verified_moves(),
        ctl.map().layer(0)?.hot_experts()
    );
    Ok(())
}
