//! The device side every placement shares: the stand-ins' buffers (weights, the pinned buffer the
//! other layers' bytes come from and go to), the per-step input and output buffers, and timing.

use std::sync::Arc;

use cuda_kernels::cudarc_driver::{CudaEvent, CudaStream};
use cuda_kernels::{copy_dtoh_async, copy_htod_async, DeviceBuffer, Gpu, KvCopy, PinnedBuffer};
use tierkit_testkit::{KvStandins, STREAM_READ_BLOCKS, TIMING_EVENT};

use crate::scenario::Scenario;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Bytes of the pinned buffer the other layers' bytes are read from / written to (far larger
/// than the GPU's L2, so random rows cross PCIe).
const SHADOW_HOST_BYTES: usize = 2 << 30;
/// Bytes of the device buffer the other layers' admission bytes land in (reused, round robin).
const SHADOW_DEV_BYTES: usize = 256 << 20;

/// A driver error as a boxed error naming the call.
pub fn cu(
    call: &'static str,
) -> impl Fn(cuda_kernels::cudarc_driver::DriverError) -> Box<dyn std::error::Error> {
    move |e| Box::new(cuda_kernels::CudaError::driver(call, e))
}

/// Per-step inputs staged in pinned memory and uploaded before the timed region, and the
/// resolve's outputs. Sized for `max_batch` requests.
pub struct StepIo {
    pub max_batch: usize,
    pub k: usize,
    /// `int32 [batch, k]` picks (host staging).
    pub topk_h: PinnedBuffer<i32>,
    pub topk: DeviceBuffer<i32>,
    /// `qsl [B+1] | seq_lens [B] | slots [B] | new rows [B]` (host staging), `B = max_batch`.
    pub small_h: PinnedBuffer<i32>,
    pub small: DeviceBuffer<i32>,
    /// Block table `int32 [batch][max_blocks]` (resident placement).
    pub bt_h: PinnedBuffer<i32>,
    pub bt: DeviceBuffer<i32>,
    pub max_blocks: usize,
    pub idx: DeviceBuffer<i32>,
    pub valid: DeviceBuffer<i32>,
    pub plan: DeviceBuffer<KvCopy>,
    pub count: DeviceBuffer<u32>,
    pub stats: DeviceBuffer<u32>,
}

impl StepIo {
    /// Offsets (elements) of the sections of `small`.
    pub fn qsl_at(&self) -> usize {
        0
    }
    pub fn seq_at(&self) -> usize {
        self.max_batch + 1
    }
    pub fn slots_at(&self) -> usize {
        2 * self.max_batch + 1
    }
    pub fn rows_at(&self) -> usize {
        3 * self.max_batch + 1
    }
    /// Device address of element `i` of `small`.
    pub fn small_ptr(&self, i: usize) -> u64 {
        self.small.device_ptr() + 4 * i as u64
    }

    /// Uploads the first `batch` requests' inputs on `stream` (with the block table when
    /// `block_table`). The staging must not be rewritten before the stream passes the copies.
    pub fn upload(&self, stream: &CudaStream, batch: usize, block_table: bool) -> Res<()> {
        // SAFETY: pinned sources and device destinations of at least these sizes, alive for the
        // bench; the caller synchronizes the stream before touching the staging again.
        unsafe {
            copy_htod_async(
                self.topk.device_ptr(),
                self.topk_h.host_ptr() as *const u8,
                batch * self.k * 4,
                stream,
            )?;
            copy_htod_async(
                self.small.device_ptr(),
                self.small_h.host_ptr() as *const u8,
                self.small_h.num_bytes(),
                stream,
            )?;
            if block_table {
                copy_htod_async(
                    self.bt.device_ptr(),
                    self.bt_h.host_ptr() as *const u8,
                    batch * self.max_blocks * 4,
                    stream,
                )?;
            }
        }
        Ok(())
    }
}

/// Shared device state (see the module doc).
pub struct Device {
    pub gpu: Arc<Gpu>,
    pub standins: KvStandins,
    /// The resident placement's copy stream (the pools have their own).
    pub copy: Arc<CudaStream>,
    weights: DeviceBuffer<u8>,
    sink: DeviceBuffer<u32>,
    shadow: PinnedBuffer<u8>,
    shadow_dev: DeviceBuffer<u8>,
    shadow_at: usize,
    pub q: DeviceBuffer<f32>,
    pub att: DeviceBuffer<f32>,
    pub io: StepIo,
    /// Step events: start, after weights, after resolve, after attention, end.
    pub ev: [CudaEvent; 5],
}

impl Device {
    pub fn new(gpu: &Arc<Gpu>, sc: &Scenario, max_history: u32) -> Res<Self> {
        let ctx = gpu.ctx();
        let b = sc.max_batch as usize;
        let k = sc.top_k as usize;
        let max_blocks = max_history.div_ceil(sc.page_rows) as usize;
        let q: Vec<f32> = (0..sc.row_bytes)
            .map(|i| ((i * 37) % 101) as f32 / 101.0)
            .collect();
        let ev = |_| ctx.new_event(TIMING_EVENT).map_err(cu("cuEventCreate"));
        Ok(Device {
            gpu: gpu.clone(),
            standins: KvStandins::new(gpu)?,
            copy: gpu.new_stream()?,
            weights: DeviceBuffer::zeroed(ctx, sc.weights_bytes.max(16) as usize)?,
            sink: DeviceBuffer::zeroed(ctx, STREAM_READ_BLOCKS.max(sc.max_batch) as usize)?,
            shadow: PinnedBuffer::zeroed(ctx, SHADOW_HOST_BYTES)?,
            shadow_dev: DeviceBuffer::zeroed(ctx, SHADOW_DEV_BYTES)?,
            shadow_at: 0,
            q: DeviceBuffer::from_host(ctx, &q)?,
            att: DeviceBuffer::zeroed(ctx, b)?,
            io: StepIo {
                max_batch: b,
                k,
                topk_h: PinnedBuffer::zeroed(ctx, b * k)?,
                topk: DeviceBuffer::zeroed(ctx, b * k)?,
                small_h: PinnedBuffer::zeroed(ctx, 4 * b + 1)?,
                small: DeviceBuffer::zeroed(ctx, 4 * b + 1)?,
                bt_h: PinnedBuffer::zeroed(ctx, b * max_blocks)?,
                bt: DeviceBuffer::zeroed(ctx, b * max_blocks)?,
                max_blocks,
                idx: DeviceBuffer::zeroed(ctx, b * k)?,
                valid: DeviceBuffer::zeroed(ctx, b)?,
                plan: DeviceBuffer::zeroed(ctx, b * sc.hot_rows as usize)?,
                count: DeviceBuffer::zeroed(ctx, b)?,
                stats: DeviceBuffer::zeroed(ctx, b * cuda_kernels::KV_STATS)?,
            },
            ev: [ev(0)?, ev(1)?, ev(2)?, ev(3)?, ev(4)?],
        })
    }

    /// The weights read (the step's base cost) on `stream`.
    pub fn read_weights(&self, stream: &CudaStream) -> Res<()> {
        // SAFETY: the weights buffer holds `weights.len()` bytes (a multiple of 16, checked by
        // Scenario::validate) and the sink STREAM_READ_BLOCKS u32.
        unsafe {
            self.standins.stream_read_async(
                stream,
                self.weights.device_ptr(),
                self.weights.len() as u64 / 16 * 16,
                self.sink.device_ptr(),
            )?
        };
        Ok(())
    }

    /// The other layers' miss traffic of the resolve plan in `io` (`batch` segments of
    /// `stride` entries): `reps` rows per plan entry read from the pinned shadow over PCIe.
    pub fn shadow_misses(
        &self,
        stream: &CudaStream,
        batch: u32,
        stride: u32,
        row_bytes: u32,
        reps: u32,
        salt: u32,
    ) -> Res<()> {
        // SAFETY: the plan and count buffers hold max_batch segments of `stride` (= hot_rows)
        // entries, written by the resolve on this stream; the shadow is mapped pinned memory of
        // SHADOW_HOST_BYTES; the sink holds >= max_batch u32.
        unsafe {
            self.standins.shadow_fetch_async(
                stream,
                self.io.plan.device_ptr(),
                self.io.count.device_ptr(),
                batch,
                stride,
                self.shadow.device_ptr(),
                (SHADOW_HOST_BYTES / row_bytes as usize) as u64,
                row_bytes,
                reps,
                salt,
                self.sink.device_ptr(),
            )?
        };
        Ok(())
    }

    /// Splits `bytes` into chunks of at most the device buffer, each at the next offset of the
    /// pinned shadow (round robin): `(host offset, bytes)`.
    fn shadow_chunks(&mut self, mut bytes: u64) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        while bytes > 0 {
            let n = (bytes as usize).min(SHADOW_DEV_BYTES);
            if self.shadow_at + n > SHADOW_HOST_BYTES {
                self.shadow_at = 0;
            }
            out.push((self.shadow_at, n));
            self.shadow_at += n;
            bytes -= n as u64;
        }
        out
    }

    /// Copies `bytes` host → device from the pinned shadow on `stream` (the other layers' share
    /// of an admission or page fill), in chunks of at most the device buffer.
    /// A new event with timing.
    pub fn timing_event(&self) -> Res<CudaEvent> {
        self.gpu
            .ctx()
            .new_event(TIMING_EVENT)
            .map_err(cu("cuEventCreate"))
    }

    pub fn shadow_h2d(&mut self, stream: &CudaStream, bytes: u64) -> Res<()> {
        for (at, n) in self.shadow_chunks(bytes) {
            // SAFETY: source and destination ranges lie inside the pinned shadow and the device
            // buffer; both live as long as `self`; nothing reads the device buffer.
            unsafe {
                copy_htod_async(
                    self.shadow_dev.device_ptr(),
                    self.shadow.host_ptr().add(at),
                    n,
                    stream,
                )?
            };
        }
        Ok(())
    }

    /// Copies `bytes` device → host into the pinned shadow on `stream` (the other layers' share
    /// of a write-back).
    pub fn shadow_d2h(&mut self, stream: &CudaStream, bytes: u64) -> Res<()> {
        for (at, n) in self.shadow_chunks(bytes) {
            // SAFETY: as `shadow_h2d`; the host never reads the shadow's bytes.
            unsafe {
                copy_dtoh_async(
                    self.shadow.host_ptr().add(at) as *mut u8,
                    self.shadow_dev.device_ptr(),
                    n,
                    stream,
                )?
            };
        }
        Ok(())
    }

    /// Attention stand-in over `model_layers` layers reading the physical planes in turn
    /// (`plane(l)` gives plane `l`'s device address), for the `batch` query rows in `io`.
    pub fn attend(
        &self,
        stream: &CudaStream,
        sc: &Scenario,
        batch: u32,
        plane: impl Fn(u32) -> Res<u64>,
    ) -> Res<()> {
        for l in 0..sc.model_layers {
            let p = plane(l % sc.group_layers)?;
            // SAFETY: indices / valid counts of `io` hold arena rows inside the plane or -1 for
            // `batch` rows of k; q holds row_bytes f32, att max_batch f32.
            unsafe {
                self.standins.attend_async(
                    stream,
                    p,
                    sc.row_bytes,
                    self.io.idx.device_ptr(),
                    self.io.valid.device_ptr(),
                    batch,
                    sc.top_k,
                    self.q.device_ptr(),
                    self.att.device_ptr(),
                )?
            };
        }
        Ok(())
    }
}

/// Copy-stream windows (admission or growth) timed by two events each, read once the second one
/// passed: with deferred mapping the step stream does not wait for the copies, so the host does
/// not either (the copy time is reported, not counted as stall).
#[derive(Default)]
pub struct CopyWindows(std::collections::VecDeque<(CudaEvent, CudaEvent, bool)>);

impl CopyWindows {
    /// Ends a window of admissions (`admission`) or growth started by `w[0]` on `copy`: records
    /// `w[1]` there. With `step.1` the step stream `step.0` waits for it and the window's µs are
    /// returned (the host waits for them: a stall); else the window is kept for
    /// [`CopyWindows::collect`] and 0 is returned.
    pub fn end(
        &mut self,
        w: [CudaEvent; 2],
        copy: &CudaStream,
        step: (&CudaStream, bool),
        admission: bool,
    ) -> Res<f64> {
        w[1].record(copy).map_err(cu("cuEventRecord"))?;
        if step.1 {
            step.0.wait(&w[1]).map_err(cu("cuStreamWaitEvent"))?;
            return elapsed_us(&w[0], &w[1]);
        }
        let [a, b] = w;
        self.0.push_back((a, b, admission));
        Ok(0.0)
    }

    /// Adds the times of the windows that passed (in copy-stream order; all of them, waiting,
    /// with `wait`) to `adm_ms` / `growth_ms`.
    pub fn collect(&mut self, wait: bool, adm_ms: &mut f64, growth_ms: &mut f64) -> Res<()> {
        while let Some((a, b, admission)) = self.0.front() {
            if !wait && !b.try_is_complete().map_err(cu("cuEventQuery"))? {
                break;
            }
            let ms = elapsed_us(a, b)? / 1e3;
            *if *admission {
                &mut *adm_ms
            } else {
                &mut *growth_ms
            } += ms;
            self.0.pop_front();
        }
        Ok(())
    }
}

/// Elapsed µs between two recorded events (waits for `b`).
pub fn elapsed_us(a: &CudaEvent, b: &CudaEvent) -> Res<f64> {
    b.synchronize().map_err(cu("cuEventSynchronize"))?;
    Ok(a.elapsed_ms(b).map_err(cu("cuEventElapsedTime"))? as f64 * 1e3)
}
