//! Tables the geometry or the caller's input sizes, under an address-space limit (as a
//! container's memory limit): `ExpertError::OutOfMemory`, never an abort of the process.

use expert_residency::{
    Controller, ControllerConfig, CounterDump, ExpertError, Geometry, MemoryExecutor, PickCounters,
    ResidencyMap, MAX_CELLS, MAX_EXPERTS_PER_LAYER,
};
use tierkit_testkit::under_memory_limit;

/// Headroom above what the child maps when the limit is set.
const HEADROOM: usize = 24 << 20;

fn assert_oom<T>(r: Result<T, ExpertError>, what: &str) {
    match r {
        Err(ExpertError::OutOfMemory { what: w, bytes }) => {
            assert!(w.contains(what), "{w}");
            assert!(bytes > 0);
        }
        Err(e) => panic!("expected OutOfMemory ({what}), got {e:?}"),
        Ok(_) => panic!("expected OutOfMemory ({what}), got Ok"),
    }
}

/// The largest bank: 16 layers × 2^20 experts (`MAX_CELLS` cells).
fn largest() -> Geometry {
    let g = Geometry::new(16, MAX_EXPERTS_PER_LAYER, 4, 1).unwrap();
    assert_eq!(g.cells() as u64, MAX_CELLS);
    g
}

#[test]
fn geometry_sized_tables_are_out_of_memory() {
    under_memory_limit(
        "geometry_sized_tables_are_out_of_memory",
        HEADROOM,
        || (),
        |()| {
            let g = largest();
            // 64 MiB of counters, 64 MiB of map tables.
            assert_oom(PickCounters::new(&g), "pick counters");
            assert_oom(ResidencyMap::first_k("m", g), "residency map");
            let hot = vec![vec![0, 1, 2, 3]; 16];
            assert_oom(ResidencyMap::from_hot_sets("m", g, hot), "residency map");
            // A small geometry still works under the same limit.
            let small = Geometry::new(2, 8, 2, 1).unwrap();
            PickCounters::new(&small).unwrap();
            ResidencyMap::first_k("m", small).unwrap();
        },
    );
}

#[test]
fn a_controller_for_a_large_map_is_out_of_memory() {
    under_memory_limit(
        "a_controller_for_a_large_map_is_out_of_memory",
        HEADROOM,
        // 1 Mi cells: the map (4 MiB) exists; the controller's tables need ~40 MiB more.
        || ResidencyMap::first_k("m", Geometry::new(4, 1 << 18, 4, 1).unwrap()).unwrap(),
        |map| {
            match Controller::new(map, ControllerConfig::default()) {
                Err(ExpertError::OutOfMemory { .. }) => {}
                Err(e) => panic!("expected OutOfMemory, got {e:?}"),
                Ok(_) => panic!("expected OutOfMemory, got a controller"),
            };
        },
    );
}

#[test]
fn executor_and_dumps_past_the_limit_are_out_of_memory() {
    under_memory_limit(
        "executor_and_dumps_past_the_limit_are_out_of_memory",
        HEADROOM,
        || {
            let small = ResidencyMap::first_k("m", Geometry::new(4, 64, 4, 1).unwrap()).unwrap();
            // A u32 snapshot of 8 Mi cells (lazily zeroed) whose f64 dump needs 64 MiB.
            (
                small,
                vec![0u32; 8 << 20],
                PickCounters::new(&Geometry::new(8, 1 << 20, 4, 1).unwrap()).unwrap(),
            )
        },
        |(small, snapshot, counters)| {
            // 4 × (64 + 5) experts × 2 MiB = 552 MiB, below MemoryExecutor::MAX_BYTES.
            assert_oom(
                MemoryExecutor::new(&small, 2 << 20, 1),
                "executor host bytes",
            );
            MemoryExecutor::new(&small, 64, 1).unwrap();
            let g = Geometry::new(8, 1 << 20, 4, 1).unwrap();
            assert_oom(
                CounterDump::from_snapshot("d", &g, &snapshot),
                "counter dump",
            );
            // 32 MiB copy of the counters.
            assert_oom(counters.try_snapshot(), "snapshot");
        },
    );
}
