//! The in-memory executor proves moves lossless: 100,000 random swaps (in debug builds too: the
//! whole test takes about a second), then a restore of the boot map through the controller; every
//! byte an engine would read is checked against the host copy and the read digest equals the
//! boot digest.

use expert_residency::{
    Controller, ControllerConfig, Geometry, MemoryExecutor, PickCounters, PlannedSwap,
    ResidencyMap, SwapExecutor, SwapOutcome,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SWAPS: u64 = 100_000;

#[test]
fn random_swaps_then_restore_are_lossless() {
    let g = Geometry::new(8, 64, 16, 1 << 20).unwrap();
    let boot = ResidencyMap::first_k("lossless", g).unwrap();
    let mut map = boot.clone();
    let mut ex = MemoryExecutor::new(&boot, 64, 42).unwrap();
    let boot_digest = ex.read_digest();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut applied, mut stale) = (0u64, 0u64);
    while applied < SWAPS {
        let layer = rng.random_range(0..g.layers);
        let row = map.layer(layer).unwrap();
        let slot = rng.random_range(0..g.hot_per_layer);
        let outgoing = row.expert_in_slot(slot).unwrap();
        let incoming = loop {
            let e = rng.random_range(0..g.experts_per_layer);
            if !row.is_hot(e) {
                break e;
            }
        };
        // One in 16 swaps carries an old generation: it must be discarded, never applied.
        let is_stale = row.generation() > 0 && rng.random_range(0..16) == 0;
        let swap = PlannedSwap {
            layer,
            incoming,
            outgoing,
            slot,
            generation: row.generation() - u64::from(is_stale),
        };
        ex.begin(&swap).unwrap();
        let done = ex.commit_ready(&mut |s| map.check_swap(s).is_ok()).unwrap();
        assert_eq!(done.len(), 1);
        match done[0].outcome {
            SwapOutcome::Committed => {
                assert!(!is_stale);
                map.apply(&swap).unwrap();
                applied += 1;
            }
            SwapOutcome::Discarded => {
                assert!(is_stale);
                stale += 1;
            }
            SwapOutcome::Failed => panic!("checksum mismatch on {swap:?}"),
        }
        if applied.is_multiple_of(25_000) {
            ex.verify(&map).unwrap();
        }
    }
    assert!(stale > 1000);
    ex.verify(&map).unwrap();
    assert_eq!(ex.read_digest(), boot_digest);
    assert_eq!(ex.verified_moves(), SWAPS);
    assert!(!map.same_hot_sets(&boot));

    // Restore the boot map through the controller (per-step cap, one swap in flight per layer).
    let cfg = ControllerConfig::published_recipe();
    let mut ctl = Controller::new(map, cfg.clone()).unwrap();
    let queued = ctl.request_map(&boot).unwrap();
    assert!(queued > 0);
    let counters = PickCounters::new(&g).unwrap();
    let mut steps = 0;
    while !ctl.queued().is_empty() || ctl.in_flight_count() > 0 {
        let r = ctl.step(&counters, &mut ex).unwrap();
        assert!(r.begun <= cfg.max_swaps_per_step);
        steps += 1;
        assert!(steps < 10_000);
    }
    assert!(ctl.map().same_hot_sets(&boot));
    assert_eq!(ctl.stats().applied, u64::from(queued));
    assert_eq!(ctl.stats().rejected, 0);
    ex.verify(ctl.map()).unwrap();
    assert_eq!(ex.read_digest(), boot_digest);
    assert_eq!(ex.verified_moves(), SWAPS + u64::from(queued));
}
