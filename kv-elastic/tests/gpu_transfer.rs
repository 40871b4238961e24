//! The GPU pool's transfers in place (needs a CUDA device; prints SKIP otherwise): an import
//! written into reserved rows of the pinned store is committed (bookkeeping on the host, fills as
//! strided copies or the gather kernel) and resolves byte-exactly in every layer; the store
//! adopted from engine memory is registered once and torn down hooks first, then unregistered,
//! then freed; exports stay pinned past finish until done.

#![cfg(feature = "cuda")]

use std::sync::{Arc, Mutex};

use cuda_kernels::CopyBackend;
use kv_elastic::gpu::{EngineHostMemory, GpuElasticPool, GpuPoolConfig, MapAfterFill};
use kv_elastic::{
    Geometry, HostRegion, KvError, LayerGroups, PoolConfig, Reserve, ResolveInput, ResolveOutput,
    Resolver, RowSpan, StoreLayout,
};
use tierkit_testkit::{gpu_or_skip, pattern_tokens};

const ROW: u32 = 64;
const LAYERS: u32 = 3;
const PAGE: u32 = 16;
const TB: usize = (ROW * LAYERS) as usize;
const MAX_HISTORY: u32 = 512;

fn geometry() -> Geometry {
    let mut g = Geometry {
        row_bytes: ROW,
        layers: LAYERS,
        page_rows: PAGE,
        arena_pages: 0,
        hot_rows: 64,
        tail_rows: 16,
        scratch_rows: 0,
        layer_groups: LayerGroups::per_layer(),
        row_format: None,
    };
    g.arena_pages = 4 * g.fixed_pages() + 2 * MAX_HISTORY / PAGE;
    g
}

fn gcfg(max_sessions: u32) -> GpuPoolConfig {
    GpuPoolConfig {
        max_sessions,
        max_history: MAX_HISTORY,
        backend: CopyBackend::Gather,
    }
}

fn reserved(r: Reserve) -> RowSpan {
    match r {
        Reserve::Reserved(s) => s,
        Reserve::Waiting { pending } => panic!("waiting for {pending} pages"),
    }
}

fn write_span(span: &RowSpan, bytes: &[u8]) {
    assert_eq!(bytes.len() as u64, span.len);
    // SAFETY: the span is reserved for this writer, inside the pool's live pinned store.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), span.addr as *mut u8, bytes.len()) };
}

/// Resolves every position of `s` at every layer and checks the arena rows (downloaded) hold
/// `history`'s bytes.
fn assert_reads(pool: &mut GpuElasticPool, s: u64, history: &[u8]) {
    let n = (history.len() / TB) as i32;
    for layer in 0..LAYERS {
        for chunk in (0..n).collect::<Vec<_>>().chunks(32) {
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
            assert_eq!(valid[0] as usize, chunk.len());
            let plane = pool.device().download_plane(layer).unwrap();
            let rb = ROW as usize;
            for (&p, &row) in chunk.iter().zip(&idx) {
                let want = &history[p as usize * TB + layer as usize * rb..][..rb];
                let got = &plane[row as usize * rb..][..rb];
                assert_eq!(got, want, "session {s}, position {p}, layer {layer}");
            }
            done.ticket.complete();
        }
    }
}

fn import(pool: &mut GpuElasticPool, s: u64, history: &[u8]) {
    let n = (history.len() / TB) as u32;
    let lo = reserved(pool.reserve(s, 0..n / 2).unwrap());
    let hi = reserved(pool.reserve(s, n / 2..n).unwrap());
    write_span(&lo, &history[..lo.len as usize]);
    write_span(&hi, &history[lo.len as usize..]);
    pool.commit(s).unwrap();
}

#[test]
fn an_import_commits_and_resolves_exactly_with_every_fill_back_end() {
    let Some(gpu) = gpu_or_skip() else { return };
    for (backend, mapping) in [
        (CopyBackend::Dma, MapAfterFill::Ordered),
        (CopyBackend::Dma, MapAfterFill::Deferred),
        (CopyBackend::Gather, MapAfterFill::Ordered),
    ] {
        let mut pool =
            GpuElasticPool::new(&gpu, geometry(), PoolConfig::default(), gcfg(4)).unwrap();
        pool.set_fill_backend(backend);
        pool.set_map_after_fill(mapping);
        let a = pattern_tokens(ROW, LAYERS, 1, 0, 100);
        pool.admit(1, &a).unwrap();
        let h = pattern_tokens(ROW, LAYERS, 2, 0, 400);
        let before = pool.flush_counters();
        import(&mut pool, 2, &h);
        gpu.synchronize().unwrap();
        pool.publish().unwrap(); // deferred: map the pages whose fill passed
        let c = pool.flush_counters();
        if backend == CopyBackend::Dma {
            assert!(c.rows_filled_dma > before.rows_filled_dma, "strided fills");
            assert!(
                c.fill_descriptors - before.fill_descriptors <= 2 * LAYERS as u64,
                "one copy per run and layer: {} descriptors",
                c.fill_descriptors - before.fill_descriptors
            );
        }
        assert_eq!(c.host_syncs, before.host_syncs, "commit waits for nothing");
        assert_reads(&mut pool, 2, &h);
        assert_reads(&mut pool, 1, &a);
        // The committed session is an ordinary one.
        pool.append(2, &pattern_tokens(ROW, LAYERS, 2, 400, 3))
            .unwrap();
        pool.finish(2).unwrap();
        assert_eq!(pool.device().errors().unwrap(), Default::default());
    }
}

#[test]
fn bad_input_and_abort_change_nothing_on_the_gpu_pool() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut pool = GpuElasticPool::new(&gpu, geometry(), PoolConfig::default(), gcfg(2)).unwrap();
    pool.admit(1, &pattern_tokens(ROW, LAYERS, 1, 0, 40))
        .unwrap();
    let pages = pool.cpu().pages();
    reserved(pool.reserve(3, 0..64).unwrap());
    assert_eq!(
        pool.reserve(3, 32..80).err(),
        Some(KvError::OverlappingReserve {
            session: 3,
            start: 32,
            end: 80
        })
    );
    assert_eq!(pool.commit(4).err(), Some(KvError::NoImport(4)));
    assert!(pool.reserve(5, 0..4).is_err(), "two slots: both taken");
    pool.abort(3).unwrap();
    assert_eq!(pool.cpu().pages(), pages);
    // The slot is free again.
    let h = pattern_tokens(ROW, LAYERS, 5, 0, 64);
    import(&mut pool, 5, &h);
    assert_reads(&mut pool, 5, &h);
}

#[test]
fn exports_stay_pinned_past_finish_on_the_gpu_pool() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut pool = GpuElasticPool::new(&gpu, geometry(), PoolConfig::default(), gcfg(1)).unwrap();
    let a = pattern_tokens(ROW, LAYERS, 1, 0, 50);
    pool.admit(1, &a).unwrap();
    let span = pool.export(1).unwrap();
    pool.finish(1).unwrap();
    gpu.synchronize().unwrap();
    assert!(
        pool.admit(2, &a).is_err(),
        "the only slot is still exported"
    );
    // SAFETY: the export pins the rows.
    let read = unsafe { std::slice::from_raw_parts(span.addr as *const u8, span.len as usize) };
    assert_eq!(read, &a[..]);
    pool.export_done(1).unwrap();
    let b = pattern_tokens(ROW, LAYERS, 2, 0, 50);
    pool.admit(2, &b).unwrap();
    assert_reads(&mut pool, 2, &b);
}

#[test]
fn an_adopted_store_is_registered_once_and_torn_down_in_order() {
    let Some(gpu) = gpu_or_skip() else { return };
    let layout = StoreLayout {
        max_slots: 2,
        max_history: MAX_HISTORY,
        layers: LAYERS,
        row_bytes: ROW,
    };
    let len = layout.store_bytes() as usize;
    let log = Arc::new(Mutex::new(Vec::<&str>::new()));
    struct Engine(
        Arc<Mutex<Vec<&'static str>>>,
        #[allow(dead_code)] HostRegion,
    );
    impl Drop for Engine {
        fn drop(&mut self) {
            self.0.lock().unwrap().push("free");
        }
    }
    let mem = HostRegion::allocate(len, TB, false).unwrap();
    let ptr = mem.desc().addr as *mut u8;
    // SAFETY: `ptr .. + len` is mapped until the `Engine` owner drops (it owns the mapping).
    let host = unsafe { EngineHostMemory::new(ptr, len, Box::new(Engine(log.clone(), mem))) };
    let mut pool = GpuElasticPool::with_host_store(
        &gpu,
        geometry(),
        PoolConfig::default(),
        gcfg(2),
        None,
        host,
    )
    .unwrap();
    let m = pool.host_memory();
    assert_eq!(
        (m.allocated_bytes, m.pinned_bytes),
        (0, len as u64),
        "registered once"
    );
    assert_eq!(pool.region().unwrap().0.addr as usize, ptr as usize);
    let h = pattern_tokens(ROW, LAYERS, 3, 0, 80);
    import(&mut pool, 3, &h);
    assert_reads(&mut pool, 3, &h);
    let l = log.clone();
    pool.on_teardown(Box::new(move |_| l.lock().unwrap().push("deregister")))
        .unwrap();
    gpu.synchronize().unwrap();
    drop(pool);
    assert_eq!(*log.lock().unwrap(), ["deregister", "free"]);
    // Memory already pinned by the engine is used as it is (not registered again).
    let pinned = cuda_kernels::PinnedBuffer::<u8>::zeroed(gpu.ctx(), len).unwrap();
    let ptr = pinned.host_ptr() as *mut u8;
    // SAFETY: the buffer is owned by the box below, dropped after the pool's use.
    let host = unsafe { EngineHostMemory::new(ptr, len, Box::new(pinned)) };
    let pool = GpuElasticPool::with_host_store(
        &gpu,
        geometry(),
        PoolConfig::default(),
        gcfg(2),
        None,
        host,
    )
    .unwrap();
    assert_eq!(
        pool.host_memory().pinned_bytes,
        0,
        "the engine's pinning, not ours"
    );
    drop(pool);
}
