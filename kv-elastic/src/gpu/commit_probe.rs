//! Timing probe of the GPU pool's host work for an import's `commit` (issue 29), without a GPU:
//! the control plane of `ElasticPool::commit` on a data plane that logs exactly as
//! [`GpuData`](super::GpuData) does (the same [`ChangeLog`] methods), at the geometry and state
//! of `kv_gpu_bench --mode admit-import` (`benches/src/bin/kv_gpu_bench/admit.rs`): 500,000
//! tokens × 896-byte rows, one layer, 64-row pages, 8 decode sessions of 4096 positions.
//!
//! `cargo test --release -p kv-elastic --features cuda commit_probe -- --ignored --nocapture`

use super::data::ChangeLog;
use crate::data::{
    sealed, DataPlane, HostBytes, HostRegion, HostStore, RegionBytes, SessionId, StoreLayout,
};
use crate::error::Result;
use crate::{Admission, ElasticPool, Geometry, PoolConfig, Reserve};

/// A data plane that records what changed as `GpuData` does and moves no byte.
#[derive(Debug)]
pub(crate) struct LogData {
    host: HostStore<RegionBytes>,
    pub(crate) log: ChangeLog,
    page_rows: u32,
}

impl LogData {
    fn slot(&self, session: SessionId) -> u32 {
        self.host.backing().slot(session).expect("live")
    }
}

impl sealed::Sealed for LogData {}

impl DataPlane for LogData {
    type Bytes = RegionBytes;

    fn host(&self) -> &HostStore<RegionBytes> {
        &self.host
    }

    fn host_mut(&mut self) -> &mut HostStore<RegionBytes> {
        &mut self.host
    }

    fn fill_page(&mut self, session: SessionId, logical: u32, page: u32) {
        let slot = self.slot(session);
        self.log
            .fill_page(session, slot, logical, page, self.page_rows);
    }

    fn fill_pages(&mut self, session: SessionId, pages: &[(u32, u32)]) {
        let slot = self.slot(session);
        self.log.fill_pages(session, slot, pages, self.page_rows);
    }

    fn unmap_page(&mut self, session: SessionId, logical: u32, page: u32) {
        let slot = self.slot(session);
        self.log
            .unmap_page(session, slot, logical, page, self.page_rows);
    }

    fn write_tail(&mut self, session: SessionId, position: u32, row: u32) {
        let slot = self.slot(session);
        self.log
            .fills
            .push(cuda_kernels::KvCopy::new(slot, position, row));
    }

    fn write_draft(&mut self, _: SessionId, _: u32, _: u32, _: &[u8]) {
        unimplemented!("not in the probe")
    }

    fn commit_rows(&mut self, _: SessionId, _: &[u32]) -> Result<u32> {
        unimplemented!("not in the probe")
    }

    fn commit_written_rows(&mut self, _: SessionId, _: &[u32]) -> Result<u32> {
        unimplemented!("not in the probe")
    }

    fn placement_changed(&mut self, session: SessionId) {
        self.log.touch(session);
    }

    fn row_holds(&self, _: SessionId, _: u32, _: u32, _: u32) -> Option<bool> {
        None
    }
}

pub(crate) const ROW: u32 = 896;
pub(crate) const TOKENS: u32 = 500_000;
const DECODE: u64 = 8;
const DECODE_HISTORY: u32 = 4096;
const PAGE: u32 = 64;

/// The bench's pool: its geometry, 11 slots of 500,000 positions, 8 decode sessions admitted.
pub(crate) fn bench_pool() -> ElasticPool<LogData> {
    let mut g = Geometry {
        row_bytes: ROW,
        layers: 1,
        page_rows: PAGE,
        arena_pages: 0,
        hot_rows: 2048,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    };
    g.arena_pages = 12 * g.fixed_pages()
        + DECODE as u32 * DECODE_HISTORY / PAGE
        + 2 * TOKENS.div_ceil(PAGE)
        + 8;
    g.validate().unwrap();
    let layout = StoreLayout {
        max_slots: DECODE as u32 + 3,
        max_history: TOKENS,
        layers: 1,
        row_bytes: ROW,
    };
    let region = HostRegion::allocate(layout.store_bytes() as usize, ROW as usize, false).unwrap();
    let data = LogData {
        host: HostStore::with_backing(ROW, 1, RegionBytes::new(region, layout).unwrap()),
        log: ChangeLog::default(),
        page_rows: PAGE,
    };
    let mut pool = ElasticPool::with_data(g, PoolConfig { elastic: true }, data).unwrap();
    for s in 1..=DECODE {
        let h = vec![s as u8; (DECODE_HISTORY * ROW) as usize];
        pool.admit(s, &h).unwrap();
    }
    pool.data.log = ChangeLog::default();
    pool
}

/// Reserves and writes an import of the whole history (untimed), as the bench's agent does.
pub(crate) fn reserve_written(pool: &mut ElasticPool<LogData>, session: SessionId) {
    let Reserve::Reserved(span) = pool.reserve(session, 0..TOKENS).unwrap() else {
        panic!("waiting")
    };
    if std::env::var_os("COMMIT_PROBE_NO_WRITE").is_some() {
        return; // profiling the bookkeeping alone (the bytes are never read by the probe)
    }
    // SAFETY: the rows are reserved for this writer inside the pool's region.
    unsafe { std::ptr::write_bytes(span.addr as *mut u8, session as u8, span.len as usize) };
}

/// Hands a finished import's pages back, as the bench does between its runs.
pub(crate) fn finish(pool: &mut ElasticPool<LogData>, session: SessionId) {
    pool.finish(session).unwrap();
    pool.between_steps(TOKENS.div_ceil(PAGE) + 64).unwrap();
    pool.data.log = ChangeLog::default();
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "timing probe: run in release with --ignored --nocapture"]
fn commit_probe() {
    let mut pool = bench_pool();
    let reps = std::env::var("COMMIT_PROBE_REPS").map_or(15, |v| v.parse().unwrap());
    let mut us = Vec::new();
    for rep in 0..reps {
        let session = 1000 + rep;
        reserve_written(&mut pool, session);
        pool.data.log = ChangeLog::default();
        let t0 = std::time::Instant::now();
        let a = pool.commit(session).unwrap();
        us.push(t0.elapsed().as_secs_f64() * 1e6);
        assert_eq!(
            a,
            Admission::Admitted {
                borrowed_pages: 7812
            }
        );
        let runs = pool.data.log.page_runs.len();
        assert!(runs <= 4, "{runs} runs");
        pool.check_invariants().unwrap();
        finish(&mut pool, session);
    }
    eprintln!(
        "commit_probe: ElasticPool::commit (CPU half) median {:.1} us over {reps} (min {:.1}, max {:.1})",
        median(&mut us.clone()),
        us.iter().copied().fold(f64::MAX, f64::min),
        us.iter().copied().fold(0.0, f64::max),
    );
}

/// The host planning of the page-table words the publish after a commit does (both mapping
/// modes; deferred: the window's maps pushed, then taken when the fill passed and patched by a
/// later publish), against a replica of the hash-map version it replaced.
#[test]
#[ignore = "timing probe: run in release with --ignored --nocapture"]
fn publish_plan_probe() {
    use super::pool::patches_probe::{hashed_plan, plan};
    let mut pool = bench_pool();
    let reps = std::env::var("COMMIT_PROBE_REPS").map_or(15, |v| v.parse().unwrap());
    let mp = TOKENS.div_ceil(PAGE) as u64;
    let (mut new_o, mut new_d, mut old_o, mut old_d) = (vec![], vec![], vec![], vec![]);
    for rep in 0..reps {
        let session = 1000 + rep;
        reserve_written(&mut pool, session);
        pool.data.log = ChangeLog::default();
        pool.commit(session).unwrap();
        let pages = std::mem::take(&mut pool.data.log.pages);
        assert_eq!(pages.len(), 7812);
        for (defer, new, old) in [
            (false, &mut new_o, &mut old_o),
            (true, &mut new_d, &mut old_d),
        ] {
            let t0 = std::time::Instant::now();
            let a = plan(&pages, mp, defer);
            new.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = std::time::Instant::now();
            let b = hashed_plan(&pages, mp, defer);
            old.push(t0.elapsed().as_secs_f64() * 1e6);
            let (mut a, mut b) = (a, b);
            a.sort();
            b.sort();
            assert_eq!(a, b, "same words patched");
        }
        finish(&mut pool, session);
    }
    for (what, v) in [
        ("Ordered, Vec (now)", new_o),
        ("Ordered, hash maps (before)", old_o),
        ("Deferred, Vec (now)", new_d),
        ("Deferred, hash maps (before)", old_d),
    ] {
        eprintln!(
            "publish_plan_probe: {what}: median {:.1} us for 7812 pages ({:.1} ns/page)",
            median(&mut v.clone()),
            median(&mut v.clone()) * 1e3 / 7812.0
        );
    }
}

/// The host copies of a `Gather` commit's row list (one `KvCopy` per token: 499,968 rows, 8 MB)
/// into a stand-in for the pinned staging buffer (a warm `Vec`): written there from the runs
/// (now), against the list expanded into a host `Vec`, copied into replay segments and into an
/// assembled image first (before).
#[test]
#[ignore = "timing probe: run in release with --ignored --nocapture"]
fn gather_staging_probe() {
    use super::pool::patches_probe::{stage_assembled, stage_direct};
    let mut pool = bench_pool();
    reserve_written(&mut pool, 1000);
    pool.data.log = ChangeLog::default();
    pool.commit(1000).unwrap();
    let runs = std::mem::take(&mut pool.data.log.page_runs);
    let rows: u32 = runs.iter().map(|r| r.rows).sum();
    let mut pinned = vec![0u8; 16 << 20];
    let (mut now, mut before) = (vec![], vec![]);
    for _ in 0..15 {
        let t0 = std::time::Instant::now();
        let a = stage_direct(&runs, &mut pinned);
        now.push(t0.elapsed().as_secs_f64() * 1e6);
        let staged = pinned[..a].to_vec();
        let t0 = std::time::Instant::now();
        let b = stage_assembled(&runs, &mut pinned);
        before.push(t0.elapsed().as_secs_f64() * 1e6);
        assert_eq!(a, b);
        // Equal bytes but for the padding between the lists (never read).
        let rows = rows as usize * 16;
        assert_eq!(staged[..rows], pinned[..rows]);
        let at = rows.next_multiple_of(16);
        assert_eq!(staged[at..a], pinned[at..a]);
    }
    eprintln!(
        "gather_staging_probe: {rows} rows staged: median {:.0} us now, {:.0} us before",
        median(&mut now),
        median(&mut before)
    );
}
