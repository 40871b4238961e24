//! Deferred mapping of borrowed pages (`MapAfterFill::Deferred`): with the copy stream held by a
//! gate kernel (fills queued, not run), decode steps queued on the step stream after admissions,
//! growth, reclaims, finishes and re-lends still complete, serve every pick, and the bytes at every
//! returned row equal the host store (the fully resident reference: `pattern_row` of the position);
//! once the gate opens, a publish maps the filled pages and the same steps take page hits.
//!
//! The steps use the asynchronous device API with mapped pinned inputs and outputs and copy the
//! arena plane on the step stream, so nothing in a step synchronizes the whole device (which would
//! wait for the gated copy stream). Prints `SKIP: no CUDA device` and passes without a device.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_kernels::cudarc_driver::result::memcpy_dtoh_async;
use cuda_kernels::{CopyBackend, EventSignal, Gpu, KvCopy, KvResolveArgs, PinnedBuffer, KV_STATS};
use kv_elastic::gpu::{GpuElasticPool, GpuPoolConfig, MapAfterFill};
use kv_elastic::{Admission, Geometry, PoolConfig};
use tier_core::CompletionSignal;
use tierkit_testkit::{gpu_or_skip, pattern_row, pattern_tokens, KvStandins};

const ROW: u32 = 64;
const PAGE: u32 = 4;
const K: usize = 32;
const HOT: u32 = 64;
/// History of each session (tokens): 11 borrowed pages + the tail.
const HISTORY: u32 = 48;
/// The gate opens by itself after this long (a failing test never hangs).
const GATE_NS: u64 = 20_000_000_000;
/// How long a step queued behind the held fills may take before it counts as waiting for them.
const STEP_WAIT: Duration = Duration::from_secs(5);

fn geometry() -> Geometry {
    let mut g = Geometry {
        row_bytes: ROW,
        layers: 1,
        page_rows: PAGE,
        arena_pages: 0,
        hot_rows: HOT,
        tail_rows: 4,
        scratch_rows: 4,
        layer_groups: Default::default(),
        row_format: None,
    };
    // Six sessions' fixed pages and three sessions' histories: room for admissions while pages
    // reclaimed under held fills stay pending.
    g.arena_pages = 6 * g.fixed_pages() + 3 * HISTORY / PAGE;
    g
}

/// What a step returned for one session: its picks, the rows, and its page hits.
struct Served {
    session: u64,
    picks: Vec<i32>,
    rows: Vec<i32>,
    page_hits: u32,
}

/// A step's mapped pinned buffers, kept until the rig drops: freeing pinned memory synchronizes
/// the device, which would wait for the gated copy stream.
struct StepBufs {
    _i32: Vec<PinnedBuffer<i32>>,
    _u32: Vec<PinnedBuffer<u32>>,
    _plan: PinnedBuffer<KvCopy>,
    _plane: PinnedBuffer<u8>,
}

struct Rig {
    keep: Vec<StepBufs>,
    gpu: Arc<Gpu>,
    pool: GpuElasticPool,
    standins: KvStandins,
    flag: PinnedBuffer<u32>,
    seed: u64,
}

fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rig {
    fn new(gpu: &Arc<Gpu>, backend: CopyBackend) -> Self {
        let gcfg = GpuPoolConfig {
            max_sessions: 8,
            max_history: 128,
            backend: CopyBackend::Gather,
        };
        let mut pool =
            GpuElasticPool::new(gpu, geometry(), PoolConfig { elastic: true }, gcfg).unwrap();
        pool.set_map_after_fill(MapAfterFill::Deferred);
        pool.set_fill_backend(backend);
        Rig {
            keep: Vec::new(),
            gpu: gpu.clone(),
            pool,
            standins: KvStandins::new(gpu).unwrap(),
            flag: PinnedBuffer::zeroed(gpu.ctx(), 1).unwrap(),
            seed: 7,
        }
    }

    /// Sessions 1 and 2 admitted and mapped, then the copy stream held and session 3 admitted:
    /// its pages lent, their fills queued behind the gate, their mappings deferred.
    fn held_admission(gpu: &Arc<Gpu>, backend: CopyBackend) -> Self {
        let mut r = Rig::new(gpu, backend);
        r.admit(1);
        r.admit(2);
        r.settle();
        r.close();
        r.admit(3);
        assert!(
            r.pool.deferred_maps() > 0,
            "{backend:?}: the admission's pages wait for their fill"
        );
        r
    }

    fn admit(&mut self, s: u64) {
        let h = pattern_tokens(ROW, 1, s, 0, HISTORY);
        match self.pool.admit(s, &h).unwrap() {
            Admission::Admitted { .. } => {}
            other => panic!("session {s} not admitted: {other:?}"),
        }
    }

    /// Holds the copy stream (fills queued after this wait for [`Rig::open`]).
    fn close(&mut self) {
        self.flag.as_mut_slice()[0] = 0;
        let copy = self.pool.copy_stream().clone();
        // SAFETY: the flag is a live mapped pinned u32 owned by the rig, which outlives the gate
        // (every test opens it and synchronizes before the rig drops).
        unsafe {
            self.standins
                .spin_until_async(&copy, self.flag.device_ptr(), GATE_NS)
                .unwrap()
        };
    }

    fn open(&mut self) {
        self.flag.as_mut_slice()[0] = 1;
    }

    fn settle(&mut self) {
        self.gpu.synchronize().unwrap();
        self.pool.publish().unwrap();
        assert_eq!(
            self.pool.deferred_maps(),
            0,
            "every fill passed: all mapped"
        );
    }

    /// One decode step over `sessions` (K distinct picks each, below their history) on the step
    /// stream, then the arena plane copied on the step stream. Returns `None` if the step did not
    /// complete within [`STEP_WAIT`] (it waits for the copy stream), else what it served and the
    /// plane.
    fn step(&mut self, sessions: &[u64]) -> Option<(Vec<Served>, Vec<u8>)> {
        let ctx = self.gpu.ctx().clone();
        let n = sessions.len();
        let mut picks = Vec::with_capacity(n * K);
        for _ in sessions {
            let mut set: Vec<i32> = Vec::with_capacity(K);
            while set.len() < K {
                let p = (mix(&mut self.seed) % HISTORY as u64) as i32;
                if !set.contains(&p) {
                    set.push(p);
                }
            }
            picks.extend(set);
        }
        let pinned_i32 = |v: &[i32]| {
            let mut b = PinnedBuffer::<i32>::zeroed(&ctx, v.len().max(1)).unwrap();
            b.as_mut_slice()[..v.len()].copy_from_slice(v);
            b
        };
        let topk = pinned_i32(&picks);
        let qsl = pinned_i32(&(0..=n as i32).collect::<Vec<_>>());
        let seq = pinned_i32(&vec![HISTORY as i32; n]);
        let slots: Vec<i32> = sessions
            .iter()
            .map(|&s| self.pool.slot_of(s).unwrap() as i32)
            .collect();
        let slots = pinned_i32(&slots);
        let idx = PinnedBuffer::<i32>::zeroed(&ctx, n * K).unwrap();
        let valid = PinnedBuffer::<i32>::zeroed(&ctx, n).unwrap();
        let plan = PinnedBuffer::<KvCopy>::zeroed(&ctx, n * HOT as usize).unwrap();
        let count = PinnedBuffer::<u32>::zeroed(&ctx, n).unwrap();
        let stats = PinnedBuffer::<u32>::zeroed(&ctx, n * KV_STATS).unwrap();
        let plane_bytes = self.pool.device().dims().plane_bytes();
        let mut plane = PinnedBuffer::<u8>::zeroed(&ctx, plane_bytes).unwrap();
        let args = KvResolveArgs {
            topk: topk.device_ptr(),
            query_start_loc: qsl.device_ptr(),
            seq_lens: seq.device_ptr(),
            session_slot: slots.device_ptr(),
            sessions: n as u32,
            rows: n as u32,
            k: K as u32,
            layer: 0,
            indices: idx.device_ptr(),
            valid_count: valid.device_ptr(),
            plan: plan.device_ptr(),
            plan_count: count.device_ptr(),
            stats: stats.device_ptr(),
        };
        let step = self.gpu.stream().clone();
        let dev = self.pool.device();
        // SAFETY: every buffer above is live mapped pinned memory of the documented shape and
        // outlives the step (we wait for its event below, or synchronize the device before
        // dropping them); the tables are touched only by the step stream.
        unsafe {
            dev.resolve_async(&step, &args, CopyBackend::Gather)
                .unwrap()
        };
        let src = dev.plane_ptr(0).unwrap();
        // SAFETY: `plane` is pinned host memory of exactly one plane's bytes, alive until the
        // event below passed; the source is the arena's plane 0.
        unsafe { memcpy_dtoh_async(plane.as_mut_slice(), src, step.cu_stream()).unwrap() };
        let done = EventSignal::record(&self.gpu, &step).unwrap();
        let t0 = Instant::now();
        while !done.is_complete() {
            if t0.elapsed() > STEP_WAIT {
                // Let the queued work finish before the buffers drop.
                self.open();
                self.gpu.synchronize().unwrap();
                drop((topk, qsl, seq, slots, idx, valid, plan, count, stats, plane));
                return None;
            }
            std::thread::yield_now();
        }
        let served = sessions
            .iter()
            .enumerate()
            .map(|(i, &s)| Served {
                session: s,
                picks: picks[i * K..(i + 1) * K].to_vec(),
                rows: idx.as_slice()[i * K..(i + 1) * K].to_vec(),
                page_hits: stats.as_slice()[i * KV_STATS + 3],
            })
            .collect();
        let out = plane.as_slice().to_vec();
        self.keep.push(StepBufs {
            _i32: vec![topk, qsl, seq, slots, idx, valid],
            _u32: vec![count, stats],
            _plan: plan,
            _plane: plane,
        });
        Some((served, out))
    }
}

/// Every pick is served and the bytes at its row equal the host store's row of that position.
fn check_exact(served: &[Served], plane: &[u8]) {
    let rb = ROW as usize;
    let mut want = vec![0u8; rb];
    for s in served {
        for (&p, &r) in s.picks.iter().zip(&s.rows) {
            assert!(r >= 0, "session {} position {p} not served", s.session);
            pattern_row(s.session, p as u32, 0, &mut want);
            let at = r as usize * rb;
            assert_eq!(
                &plane[at..at + rb],
                &want[..],
                "session {} position {p}: row {r} does not hold its bytes",
                s.session
            );
        }
    }
}

fn page_hits(served: &[Served], session: u64) -> u32 {
    served
        .iter()
        .filter(|s| s.session == session)
        .map(|s| s.page_hits)
        .sum()
}

/// A step queued after an admission whose fills are held runs (it does not wait for the copy),
/// resolves the admitted session's unmapped pages as exact misses, and once the fills pass a
/// publish maps them (page hits).
#[test]
fn step_after_admission_does_not_wait_for_its_fill() {
    let Some(gpu) = gpu_or_skip() else { return };
    for backend in [CopyBackend::Dma, CopyBackend::Gather] {
        let mut r = Rig::held_admission(&gpu, backend);
        let lent = r.pool.deferred_maps();
        let (served, plane) = r
            .step(&[1, 2, 3])
            .unwrap_or_else(|| panic!("{backend:?}: the step waited for the admission's copy"));
        check_exact(&served, &plane);
        assert_eq!(page_hits(&served, 3), 0, "{backend:?}: nothing mapped yet");
        r.pool.publish().unwrap();
        assert_eq!(
            r.pool.deferred_maps(),
            lent,
            "{backend:?}: fills still held"
        );
        r.open();
        r.settle();
        assert!(r.pool.flush_counters().maps_applied >= lent as u64);
        let (served, plane) = r.step(&[1, 2, 3]).expect("ungated step");
        check_exact(&served, &plane);
        assert!(
            page_hits(&served, 3) > 0,
            "{backend:?}: mapped after the fill"
        );
    }
}

/// Reclaims, finishes, growth and new admissions while the fills of earlier ones are held: every
/// step runs and is exact; pages reclaimed before their fill passed stay pending (not re-lent) until
/// it passes; afterwards everything is mapped and exact.
#[test]
fn reclaim_finish_and_relend_while_fills_held() {
    let Some(gpu) = gpu_or_skip() else { return };
    for backend in [CopyBackend::Dma, CopyBackend::Gather] {
        let mut r = Rig::held_admission(&gpu, backend);
        // Reclaim under pressure: some of session 3's unmapped pages go (their pending mapping is
        // dropped) and stay pending while their fill is held.
        let got = r.pool.reclaim(3 * HISTORY / PAGE).unwrap();
        assert!(got > 0);
        assert!(
            r.pool.cpu().pages().pending >= got,
            "{backend:?}: pages reclaimed under a held fill stay pending"
        );
        let (served, plane) = r.step(&[1, 2, 3]).expect("step after a reclaim");
        check_exact(&served, &plane);
        // Growth lends free pages again (to sessions missing history), deferred behind the gate.
        r.pool.between_steps(64).unwrap();
        let (served, plane) = r.step(&[1, 2, 3]).expect("step after growth");
        check_exact(&served, &plane);
        // Finish session 3 before its fills ran, admit a new session into the freed room.
        r.pool.finish(3).unwrap();
        r.admit(4);
        r.pool.between_steps(64).unwrap();
        let (served, plane) = r.step(&[1, 2, 4]).expect("step after finish + admit");
        check_exact(&served, &plane);
        let c = r.pool.flush_counters();
        assert!(
            c.maps_dropped > 0,
            "{backend:?}: reclaim / finish dropped mappings: {c:?}"
        );
        r.open();
        r.settle();
        r.pool.between_steps(64).unwrap();
        r.settle();
        for _ in 0..3 {
            let (served, plane) = r.step(&[1, 2, 4]).expect("ungated step");
            check_exact(&served, &plane);
        }
    }
}
