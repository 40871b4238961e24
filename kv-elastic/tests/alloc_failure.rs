//! Host memory the caller's input sizes, under an address-space limit (as a container's memory
//! limit): an admission or append the host cannot hold is `KvError::OutOfMemory` and changes
//! nothing — never an abort of the process.

use kv_elastic::{Admission, ElasticPool, Geometry, KvError, PoolConfig};
use tierkit_testkit::under_memory_limit;

/// Headroom above what the child maps when the limit is set.
const HEADROOM: usize = 48 << 20;
/// A history the caller holds (lazily zeroed: never touched) that the host cannot copy.
const BIG: usize = 256 << 20;

/// 64-byte tokens (1 layer), 16-row pages, 64 pages: fixed rows take 2 pages.
fn pool() -> ElasticPool {
    let g = Geometry {
        row_bytes: 64,
        layers: 1,
        page_rows: 16,
        arena_pages: 64,
        hot_rows: 16,
        tail_rows: 16,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    };
    ElasticPool::new(g, PoolConfig { elastic: true }).unwrap()
}

fn assert_oom<T: std::fmt::Debug>(r: Result<T, KvError>, what: &str) {
    match r {
        Err(KvError::OutOfMemory { what: w, bytes }) => {
            assert!(w.contains(what), "{w}");
            assert!(bytes > HEADROOM as u64, "{bytes}");
        }
        other => panic!("expected OutOfMemory ({what}), got {other:?}"),
    }
}

#[test]
fn an_admission_the_host_cannot_copy_is_out_of_memory_and_changes_nothing() {
    under_memory_limit(
        "an_admission_the_host_cannot_copy_is_out_of_memory_and_changes_nothing",
        HEADROOM,
        || {
            let mut p = pool();
            // Session 1 borrows every free page: a new admission would have to reclaim.
            p.admit(1, &vec![1u8; 64 * 64 * 16]).unwrap();
            assert_eq!(p.pages().free, 0);
            (p, vec![0u8; BIG])
        },
        |(mut p, big)| {
            let (pages, counters) = (p.pages(), *p.counters());
            assert_oom(p.admit(2, &big), "history");
            // Nothing moved: no page reclaimed from session 1, no session 2.
            assert_eq!(p.pages(), pages);
            assert_eq!(*p.counters(), counters);
            assert!(p.committed_len(2).is_err());
            p.check_invariants().unwrap();
            // The pool goes on: the same id admits with a history that fits, and appends.
            assert!(matches!(
                p.admit(2, &[2u8; 64 * 40]).unwrap(),
                Admission::Admitted { .. }
            ));
            assert_oom(p.append(2, &big), "history");
            assert_eq!(p.committed_len(2).unwrap(), 40);
            assert_eq!(p.append(2, &[3u8; 64]).unwrap(), 41);
            p.check_invariants().unwrap();
        },
    );
}

#[test]
fn a_history_too_long_for_the_hot_cache_table_is_out_of_memory() {
    // 1-byte tokens: 96 Mi positions need a 384 MiB position table in the hot cache.
    under_memory_limit(
        "a_history_too_long_for_the_hot_cache_table_is_out_of_memory",
        HEADROOM,
        || {
            let g = Geometry {
                row_bytes: 1,
                layers: 1,
                page_rows: 1 << 20,
                arena_pages: 4,
                hot_rows: 16,
                tail_rows: 16,
                scratch_rows: 0,
                layer_groups: Default::default(),
                row_format: None,
            };
            let p = ElasticPool::new(g, PoolConfig { elastic: false }).unwrap();
            (p, vec![0u8; 96 << 20])
        },
        |(mut p, big)| {
            assert_oom(p.admit(1, &big), "hot-cache");
            p.admit(1, &[1u8; 100]).unwrap();
            assert_oom(p.append(1, &big), "hot-cache");
            assert_eq!(p.committed_len(1).unwrap(), 100);
            p.check_invariants().unwrap();
        },
    );
}
