//! Transfers in place on the CPU pool's region store: zero-copy imports (`reserve` / `commit` /
//! `abort`, the timeout), exports pinned until completion, typed errors that change nothing,
//! teardown order and the store's host memory. A "writer" here writes the reserved rows through
//! their address, as a transfer agent's DMA does; `bindings/python/tests/test_transfer.py`
//! moves them with NIXL and Mooncake.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use kv_elastic::{
    Admission, ElasticPool, Geometry, HostRegion, KvError, LayerGroups, PageCounts, PoolConfig,
    PoolCounters, RegionDesc, Reserve, ResolveInput, ResolveOutput, Resolver, RowSpan, StoreConfig,
    StoreLayout,
};
use tierkit_testkit::pattern_tokens;

const RB: u32 = 16;
const LAYERS: u32 = 2;
const TB: usize = (RB * LAYERS) as usize;

/// Fixed rows: 8 hot + 4 tail = 12 rows = 3 pages of 4 rows.
fn geometry(arena_pages: u32) -> Geometry {
    Geometry {
        row_bytes: RB,
        layers: LAYERS,
        page_rows: 4,
        arena_pages,
        hot_rows: 8,
        tail_rows: 4,
        scratch_rows: 0,
        layer_groups: LayerGroups::per_layer(),
        row_format: None,
    }
}

fn pool(arena_pages: u32, max_sessions: u32, max_history: u32) -> ElasticPool {
    ElasticPool::with_store(
        geometry(arena_pages),
        PoolConfig::default(),
        StoreConfig {
            max_sessions,
            max_history,
            lock: false,
        },
    )
    .unwrap()
}

/// Writes `bytes` at a reserved span's address, as a transfer agent would.
fn write_span(span: &RowSpan, at: usize, bytes: &[u8]) {
    assert!(at + bytes.len() <= span.len as usize);
    // SAFETY: the span is reserved for this writer (inside the pool's live region).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (span.addr as *mut u8).add(at), bytes.len())
    };
}

/// Reads a span's bytes (an export's, while it is pinned).
fn read_span(span: &RowSpan) -> Vec<u8> {
    // SAFETY: the span's rows are pinned by an open export (or reserved for this reader).
    unsafe { std::slice::from_raw_parts(span.addr as *const u8, span.len as usize) }.to_vec()
}

fn reserved(r: Reserve) -> RowSpan {
    match r {
        Reserve::Reserved(s) => s,
        Reserve::Waiting { pending } => panic!("waiting for {pending} pages"),
    }
}

/// Resolves every position of `s` (chunks of 8, each layer) and checks the bytes at the returned
/// rows equal `history`'s: what attention reads equals the source.
fn assert_reads(pool: &mut ElasticPool, s: u64, history: &[u8]) {
    let n = (history.len() / TB) as i32;
    for layer in 0..LAYERS {
        for chunk in (0..n).collect::<Vec<_>>().chunks(8) {
            let mut idx = vec![0; chunk.len()];
            let mut valid = [0];
            let input = ResolveInput {
                sessions: &[s],
                query_start_loc: &[0, 1],
                seq_lens: &[n],
                topk: chunk,
                k: chunk.len(),
                layer,
            };
            let done = pool
                .resolve(
                    &input,
                    &mut ResolveOutput {
                        indices: &mut idx,
                        valid_count: &mut valid,
                    },
                )
                .unwrap();
            assert_eq!(valid[0] as usize, chunk.len(), "every pick served");
            for (&p, &row) in chunk.iter().zip(&idx) {
                let off = p as usize * TB + layer as usize * RB as usize;
                assert_eq!(
                    pool.arena_row(layer, row).as_deref().unwrap(),
                    &history[off..off + RB as usize],
                    "session {s}, position {p}, layer {layer}"
                );
            }
            done.ticket.complete();
        }
    }
}

/// What "the pool as before" compares.
#[derive(Debug, PartialEq)]
struct Snapshot {
    pages: PageCounts,
    counters: PoolCounters,
    sessions: Vec<u64>,
    free_slots: usize,
    imports: usize,
}

fn snapshot(pool: &ElasticPool) -> Snapshot {
    pool.check_invariants().unwrap();
    Snapshot {
        pages: pool.pages(),
        counters: *pool.counters(),
        sessions: pool.sessions().collect(),
        free_slots: pool.host().backing().as_region().unwrap().free_slots(),
        imports: pool.imports().len(),
    }
}

#[test]
fn regions_describe_the_store_and_its_row_offsets() {
    let p = pool(16, 3, 40);
    let (desc, layout): (RegionDesc, StoreLayout) = p.region().unwrap();
    assert_eq!(desc.kind.name(), "DRAM");
    assert_eq!(desc.item_len, TB as u64);
    assert_eq!(desc.len, 3 * 40 * TB as u64);
    assert_eq!(desc.addr as usize % kv_elastic::page_size(), 0);
    assert_eq!(
        layout.offset(2, 5, 1),
        (2 * 40 * TB + 5 * TB + RB as usize) as u64
    );
    // The default CPU pool keeps a Vec per session: no region, transfers refused.
    let mut plain = ElasticPool::new(geometry(16), PoolConfig::default()).unwrap();
    assert!(plain.region().is_none());
    assert!(matches!(
        plain.reserve(1, 0..4),
        Err(KvError::Unsupported(_))
    ));
}

#[test]
fn an_import_is_admitted_by_commit_and_reads_the_written_bytes() {
    let mut p = pool(16, 4, 64);
    let a = pattern_tokens(RB, LAYERS, 1, 0, 20);
    p.admit(1, &a).unwrap();
    // Session 7: 30 tokens pushed in two chunks (rows 16..30 first), as a prefill node would.
    let h = pattern_tokens(RB, LAYERS, 7, 0, 30);
    let hi = reserved(p.reserve(7, 16..30).unwrap());
    assert_eq!((hi.start, hi.end, hi.len), (16, 30, 14 * TB as u64));
    let lo = reserved(p.reserve(7, 0..16).unwrap());
    assert_eq!(lo.addr + 16 * TB as u64, hi.addr, "one slot, token-major");
    write_span(&hi, 0, &h[16 * TB..]);
    write_span(&lo, 0, &h[..16 * TB]);
    let before = p.counters().page_fill_tokens;
    assert!(matches!(
        p.commit(7).unwrap(),
        Admission::Admitted { borrowed_pages } if borrowed_pages > 0
    ));
    assert!(
        p.counters().page_fill_tokens > before,
        "pages filled from the store"
    );
    assert_eq!(p.committed_len(7), Ok(30));
    assert_eq!(p.host().token(7, 29).unwrap(), &h[29 * TB..]);
    p.check_invariants().unwrap();
    assert_reads(&mut p, 7, &h);
    assert_reads(&mut p, 1, &a);
    // A committed session is an ordinary one: append, finish.
    p.append(7, &pattern_tokens(RB, LAYERS, 7, 30, 2)).unwrap();
    p.finish(7).unwrap();
    assert_eq!(p.transfer_counters().committed, 1);
}

#[test]
fn bad_transfer_input_is_typed_and_changes_nothing() {
    let mut p = pool(16, 2, 32);
    p.admit(1, &pattern_tokens(RB, LAYERS, 1, 0, 8)).unwrap();
    reserved(p.reserve(5, 0..8).unwrap());
    let before = snapshot(&p);
    let imports = p.imports();
    let checks: Vec<(KvError, Result<(), KvError>)> = vec![
        (KvError::NoImport(9), p.commit(9).map(|_| ())),
        (KvError::NoImport(9), p.abort(9)),
        (
            KvError::OverlappingReserve {
                session: 5,
                start: 4,
                end: 12,
            },
            p.reserve(5, 4..12).map(|_| ()),
        ),
        (
            KvError::RowsBeyondRegion {
                session: 5,
                start: 8,
                end: 33,
                limit: 32,
            },
            p.reserve(5, 8..33).map(|_| ()),
        ),
        (
            KvError::RowsBeyondRegion {
                session: 6,
                start: 3,
                end: 3,
                limit: 32,
            },
            p.reserve(6, 3..3).map(|_| ()),
        ),
        (KvError::SessionExists(1), p.reserve(1, 0..4).map(|_| ())),
        // Two slots: session 1 and the import hold them.
        (
            KvError::StoreCapacity {
                what: "session slots in use (max_sessions; a finished session's slot stays \
                       taken until its exports end: export_done)",
                value: 3,
                limit: 3,
            },
            p.reserve(6, 0..4).map(|_| ()),
        ),
        // The importing session is invisible.
        (KvError::SessionImporting(5), p.finish(5)),
        (
            KvError::SessionImporting(5),
            p.append(5, &[0; TB]).map(|_| ()),
        ),
        (
            KvError::SessionImporting(5),
            p.admit(5, &[0; TB]).map(|_| ()),
        ),
        (KvError::SessionImporting(5), p.export(5).map(|_| ())),
        (KvError::NoExport(1), p.export_done(1)),
    ];
    for (want, got) in checks {
        assert_eq!(got, Err(want));
        assert_eq!(snapshot(&p), before);
        assert_eq!(p.imports(), imports);
    }
    let mut idx = [0; 1];
    let mut valid = [0];
    let r = p.resolve(
        &ResolveInput {
            sessions: &[5],
            query_start_loc: &[0, 1],
            seq_lens: &[1],
            topk: &[0],
            k: 1,
            layer: 0,
        },
        &mut ResolveOutput {
            indices: &mut idx,
            valid_count: &mut valid,
        },
    );
    assert_eq!(r.err(), Some(KvError::SessionImporting(5)));
    // A gap: rows 0..8 and 12..16 reserved, 8..12 not.
    reserved(p.reserve(5, 12..16).unwrap());
    let before = snapshot(&p);
    assert_eq!(
        p.commit(5).err(),
        Some(KvError::ImportIncomplete {
            session: 5,
            missing: 8
        })
    );
    assert_eq!(snapshot(&p), before);
    // After an abort, the writer's late commit has no import to publish.
    p.abort(5).unwrap();
    assert_eq!(p.commit(5).err(), Some(KvError::NoImport(5)));
}

#[test]
fn an_aborted_import_leaves_the_pool_as_before() {
    let mut p = pool(16, 3, 32);
    p.admit(1, &pattern_tokens(RB, LAYERS, 1, 0, 24)).unwrap();
    let before = snapshot(&p);
    let span = reserved(p.reserve(2, 0..20).unwrap());
    assert_eq!(
        p.pages().fixed,
        before.pages.fixed + 3,
        "fixed pages reserved"
    );
    write_span(&span, 0, &pattern_tokens(RB, LAYERS, 2, 0, 10)); // half written, then fails
    p.abort(2).unwrap();
    let after = snapshot(&p);
    assert_eq!(after, before);
    // The id was never live: it may be imported again.
    let span = reserved(p.reserve(2, 0..4).unwrap());
    let h = pattern_tokens(RB, LAYERS, 2, 0, 4);
    write_span(&span, 0, &h);
    p.commit(2).unwrap();
    assert_reads(&mut p, 2, &h);
}

#[test]
fn a_timed_out_import_gives_its_pages_back_and_holds_its_rows_until_abort() {
    let mut p = pool(16, 2, 32);
    assert_eq!(p.import_timeout(), kv_elastic::DEFAULT_IMPORT_TIMEOUT_STEPS);
    assert!(matches!(
        p.set_import_timeout(0),
        Err(KvError::InvalidConfig(_))
    ));
    p.set_import_timeout(3).unwrap();
    p.admit(1, &pattern_tokens(RB, LAYERS, 1, 0, 8)).unwrap();
    p.between_steps(8).unwrap();
    let before = snapshot(&p);
    reserved(p.reserve(2, 0..8).unwrap());
    for step in 1..3 {
        assert_eq!(p.between_steps(8).unwrap().imports_expired, 0, "{step}");
    }
    reserved(p.reserve(2, 8..12).unwrap()); // activity restarts the count
    for _ in 1..3 {
        assert_eq!(p.between_steps(8).unwrap().imports_expired, 0);
    }
    assert_eq!(p.between_steps(8).unwrap().imports_expired, 1);
    assert!(p.imports()[0].expired);
    // Pages and sessions as before; the rows stay held for the writer that may still write.
    let now = snapshot(&p);
    assert_eq!(
        (now.pages, now.sessions.clone()),
        (before.pages, before.sessions.clone())
    );
    assert_eq!(now.free_slots, before.free_slots - 1);
    // A writer outliving its session: refused, nothing changes.
    assert_eq!(p.commit(2).err(), Some(KvError::ImportExpired(2)));
    assert_eq!(p.reserve(2, 12..16).err(), Some(KvError::ImportExpired(2)));
    assert_eq!(snapshot(&p), now);
    // Deterministic: more steps expire nothing more.
    assert_eq!(p.between_steps(8).unwrap().imports_expired, 0);
    p.abort(2).unwrap();
    let after = snapshot(&p);
    assert_eq!(
        (after.pages, after.free_slots),
        (before.pages, before.free_slots)
    );
    assert_eq!(p.transfer_counters().expired, 1);
}

/// A transfer agent writes an import's rows on another thread while the engine keeps
/// reclaiming, admitting and stepping: nothing touches the reserved rows or the import's pages
/// (an admission that needs them waits for the import: `NoRoom` until it commits and finishes),
/// and the committed session reads exactly what was written.
#[test]
fn a_reclaim_racing_an_in_flight_import_waits_for_it() {
    // 8 pages: session 1 (3 fixed + borrowed history) and the import (3 fixed); the 2 left
    // cannot hold a third session's 3 fixed pages.
    let mut p = pool(8, 4, 64);
    let a = pattern_tokens(RB, LAYERS, 1, 0, 40);
    p.admit(1, &a).unwrap();
    assert_eq!(p.pages().free, 0, "history pages fill the rest");
    let h = pattern_tokens(RB, LAYERS, 2, 0, 48);
    let span = reserved(p.reserve(2, 0..48).unwrap()); // reclaims 3 of session 1's pages
    let import_pages = p.pages().fixed - 3;
    assert_eq!(import_pages, 3);
    let (go, chunks) = mpsc::channel::<usize>();
    let (done_tx, done) = mpsc::channel::<()>();
    let src = h.clone();
    let writer = std::thread::spawn(move || {
        // One 4-token chunk per message, as an RDMA write in pieces.
        for i in chunks {
            let at = i * 4 * TB;
            write_span(&span, at, &src[at..at + 4 * TB]);
            done_tx.send(()).unwrap();
        }
    });
    for i in 0..12 {
        go.send(i).unwrap();
        // While the chunk lands: reclaim everything reclaimable, step, try to admit.
        let reclaimed = p.reclaim(u32::MAX).unwrap();
        assert_eq!(
            p.borrowed_pages(1).unwrap(),
            0,
            "step {i}: {reclaimed} reclaimed"
        );
        assert_eq!(p.pages().fixed, 3 + import_pages, "the import's pages stay");
        p.between_steps(4).unwrap();
        assert_eq!(
            p.admit(3, &pattern_tokens(RB, LAYERS, 3, 0, 8)),
            Err(KvError::NoRoom {
                needed: 3,
                available: 2
            }),
            "an admission needing the import's pages waits"
        );
        assert!(p.committed_len(3).is_err());
        p.check_invariants().unwrap();
        done.recv().unwrap();
    }
    drop(go);
    writer.join().unwrap();
    p.commit(2).unwrap();
    assert_reads(&mut p, 2, &h);
    assert_reads(&mut p, 1, &a);
    // Once the import's session finishes, the waiting admission goes through.
    p.finish(2).unwrap();
    for _ in 0..4 {
        p.between_steps(16).unwrap();
    }
    assert!(matches!(
        p.admit(3, &pattern_tokens(RB, LAYERS, 3, 0, 8)),
        Ok(Admission::Admitted { .. })
    ));
}

#[test]
fn export_rows_stay_pinned_until_the_transfer_completes() {
    // One slot: a finished session's exported slot is the only one.
    let mut p = pool(16, 1, 32);
    let a = pattern_tokens(RB, LAYERS, 1, 0, 12);
    p.admit(1, &a).unwrap();
    let span = p.export(1).unwrap();
    assert_eq!((span.start, span.end, span.len), (0, 12, 12 * TB as u64));
    assert_eq!(read_span(&span), a);
    // Appends go past the exported rows.
    p.append(1, &pattern_tokens(RB, LAYERS, 1, 12, 2)).unwrap();
    p.finish(1).unwrap();
    assert_eq!(p.exports_of(1), 1);
    // The slot is pinned: a new session cannot take it, nor can an import.
    let b = pattern_tokens(RB, LAYERS, 2, 0, 12);
    // The message counts the slot the export keeps and says how it frees (it used to read
    // "live sessions (max_sessions) = 1, must stay below 2": no live session, 1 < 2).
    let e = p.admit(2, &b).unwrap_err();
    assert!(
        matches!(
            e,
            KvError::StoreCapacity {
                value: 2,
                limit: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("until its exports end: export_done"),
        "{e}"
    );
    assert!(matches!(
        p.reserve(3, 0..4),
        Err(KvError::StoreCapacity { .. })
    ));
    assert_eq!(read_span(&span), a, "the transfer still reads the source");
    p.export_done(1).unwrap();
    assert_eq!(p.export_done(1), Err(KvError::NoExport(1)));
    p.admit(2, &b).unwrap();
    assert_reads(&mut p, 2, &b);
    let c = p.transfer_counters();
    assert_eq!((c.exports, c.exports_done), (1, 1));
}

/// A store whose `max_sessions × max_history × token_bytes` overflows 64 bits (the hostile-input
/// pass: `u32::MAX` for both used to overflow in `StoreLayout::store_bytes`, a panic in debug
/// builds and a wrapped, too small size in release ones) is a typed error, and so is a layout too
/// large for the caller's region.
#[test]
fn store_sizes_that_overflow_are_typed_errors() {
    for (s, h) in [
        (u32::MAX, u32::MAX),
        (u32::MAX, 1 << 30),
        (1 << 31, 1 << 31),
    ] {
        let e = ElasticPool::with_store(
            geometry(16),
            PoolConfig::default(),
            StoreConfig {
                max_sessions: s,
                max_history: h,
                lock: false,
            },
        )
        .err()
        .unwrap();
        assert!(
            matches!(e, KvError::InvalidConfig(_) | KvError::OutOfMemory { .. }),
            "{s} × {h}: {e}"
        );
    }
    let huge = StoreLayout {
        max_slots: u32::MAX,
        max_history: u32::MAX,
        layers: LAYERS,
        row_bytes: RB,
    };
    assert_eq!(huge.checked_store_bytes(), None);
    assert_eq!(huge.store_bytes(), u64::MAX);
    let region = HostRegion::allocate(4096, TB, false).unwrap();
    let e = ElasticPool::with_region(geometry(16), PoolConfig::default(), huge, region)
        .err()
        .unwrap();
    assert!(matches!(e, KvError::InvalidConfig(_)), "{e}");
}

#[test]
fn teardown_deregisters_before_the_adopted_memory_is_freed() {
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    /// The engine's memory and its log (the mapping is unmapped when this drops).
    struct EngineMemory(Arc<Mutex<Vec<String>>>, #[allow(dead_code)] HostRegion);
    impl Drop for EngineMemory {
        fn drop(&mut self) {
            self.0.lock().unwrap().push("free".into());
        }
    }
    let layout = StoreLayout {
        max_slots: 2,
        max_history: 16,
        layers: LAYERS,
        row_bytes: RB,
    };
    let len = layout.store_bytes() as usize;
    // The engine's memory (an anonymous mapping here; an shm segment in an engine).
    let engine = HostRegion::allocate(len, TB, false).unwrap();
    let ptr = engine.desc().addr as *mut u8;
    let owner = EngineMemory(log.clone(), engine);
    // SAFETY: `ptr .. ptr + len` stays mapped until `owner` is dropped, and only the store
    // writes it.
    let region = unsafe { HostRegion::adopt(ptr, len, TB, Box::new(owner), false) }.unwrap();
    let mut p =
        ElasticPool::with_region(geometry(16), PoolConfig::default(), layout, region).unwrap();
    assert_eq!(p.host_memory().allocated_bytes, 0, "adopted, not allocated");
    let h = pattern_tokens(RB, LAYERS, 4, 0, 8);
    p.admit(4, &h).unwrap();
    for agent in ["nixl", "mooncake"] {
        let l = log.clone();
        let first = h[0];
        p.on_teardown(Box::new(move |d: &RegionDesc| {
            // SAFETY: hooks run before the memory is freed.
            let b = unsafe { *(d.addr as *const u8) };
            assert_eq!(b, first, "{agent}: the memory is still the store's");
            l.lock().unwrap().push(format!("deregister {agent}"));
        }))
        .unwrap();
    }
    drop(p);
    assert_eq!(
        *log.lock().unwrap(),
        ["deregister mooncake", "deregister nixl", "free"]
    );
}

/// `VmLck` (locked memory of the process) from `/proc/self/status`, in bytes.
fn vm_lck() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmLck:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn host_memory_of_a_locked_store_is_within_2_percent_of_its_size() {
    let Some(lck0) = vm_lck() else {
        println!("SKIP: no VmLck in /proc/self/status on this platform");
        return;
    };
    let store = StoreConfig {
        max_sessions: 8,
        max_history: 1000,
        lock: true,
    };
    let p = match ElasticPool::with_store(geometry(16), PoolConfig::default(), store) {
        Ok(p) => p,
        Err(e @ KvError::OutOfMemory { .. }) => {
            println!("SKIP: cannot lock the store here ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let m = p.host_memory();
    assert_eq!(m.store_bytes, 8 * 1000 * TB as u64);
    assert!(m.footprint() as f64 <= 1.02 * m.store_bytes as f64, "{m:?}");
    assert_eq!(m.pinned_bytes, m.allocated_bytes, "locked once, whole");
    let lck = vm_lck().unwrap() - lck0;
    println!(
        "store {} B, tierkit's accounting {} B, VmLck grew {lck} B",
        m.store_bytes,
        m.footprint()
    );
    assert_eq!(lck, m.pinned_bytes, "the kernel's count agrees");
    // Bounded teardown: a chunk at a time, the rest at drop.
    let mut p = p;
    let chunk = m.pinned_bytes as usize / 3;
    let left = p.release_store_step(chunk).unwrap();
    assert!(left > 0 && left < m.pinned_bytes as usize);
    assert_eq!(vm_lck().unwrap() - lck0, left as u64);
    drop(p);
    assert_eq!(vm_lck().unwrap(), lck0, "unlocked at teardown");
}

/// A writer reserving row by row (the hostile-input pass: 100,000 one-row reserves through the C
/// ABI ran past a 20 s limit, each reserve scanning every earlier range): the rows merge into one
/// range, each reserve costs a binary search, and the commit publishes them all.
#[test]
fn row_by_row_reserves_merge_and_stay_cheap() {
    const N: u32 = 100_000;
    let mut p = pool(64, 1, N);
    let start = std::time::Instant::now();
    for i in 0..N {
        assert!(matches!(p.reserve(1, i..i + 1), Ok(Reserve::Reserved(_))));
    }
    assert_eq!(p.imports()[0].ranges, vec![0..N]);
    assert!(matches!(
        p.reserve(1, N / 2..N / 2 + 1),
        Err(KvError::OverlappingReserve { .. })
    ));
    assert!(matches!(p.commit(1), Ok(Admission::Admitted { .. })));
    assert_eq!(p.committed_len(1).unwrap(), N);
    // Seconds to spare in a debug build (the scan took minutes).
    assert!(start.elapsed() < std::time::Duration::from_secs(20));
    p.check_invariants().unwrap();
}
