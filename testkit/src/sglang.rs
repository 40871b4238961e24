//! The peer of `kv_gpu_bench --mode peer`: SGLang HiSparse's swap-in kernel
//! (`load_cache_to_device_buffer_kernel`, Apache-2.0, ported in `kernels/sglang_hisparse.cu` with
//! its provenance) with the state SGLang's HiSparse coordinator keeps per request, set up so it
//! reads the same host rows as tierkit's pool.
//!
//! State per request `r` (request pool index `r`), as SGLang's coordinator allocates it:
//! `device_buffer_tokens int32 [reqs][hot + 1]` (token held by each buffer slot, `-1` empty; slot
//! `hot` is the newest token's page, `page_size = 1`), `device_buffer_locs int32 [reqs][hot + 1]`
//! (device row of each slot: `r × (hot + 1) + slot`), `lru_slots int16 [reqs][hot]` (LRU order,
//! initially `0 .. hot`), `host_cache_locs int64 [reqs][host_stride]` (host row of each token),
//! `top_k_device_locs int32 [reqs][k]` (the output). The device buffer is `u8 [reqs × (hot + 1)]
//! [item_bytes]` in HBM; the host cache is read in place through its device address.

use std::sync::Arc;

use cuda_kernels::cudarc_driver::sys::CUfunction_attribute_enum;
use cuda_kernels::cudarc_driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cuda_kernels::{CudaError, DeviceBuffer, Gpu, KernelSource};

/// The ported kernel (`kernels/sglang_hisparse.cu`).
pub const SGLANG_HISPARSE: KernelSource = KernelSource {
    name: "sglang_hisparse",
    code: include_str!("../kernels/sglang_hisparse.cu"),
};

/// Threads per block, as SGLang's HiSparse coordinator launches the kernel.
pub const SGLANG_BLOCK: u32 = 960;

/// The top-k the port is instantiated for.
pub const SGLANG_TOP_K: u32 = 2048;

/// Dynamic shared memory of one block (`SmemLayout<NUM_TOP_K, HOT_BUFFER_SIZE>::BYTES`).
pub fn sglang_smem_bytes(k: u32, hot: u32) -> u32 {
    let chunks = hot.div_ceil(32);
    let i32s = k + 2 * (chunks + 1) + 2 * k + 2;
    let i16s = hot + 2 * k;
    4 * i32s + 2 * i16s
}

/// Geometry of one [`SglangHisparse`] instance.
#[derive(Debug, Clone, Copy)]
pub struct SglangShape {
    /// Requests (grid blocks), each its own request pool index `0 .. reqs`.
    pub reqs: u32,
    /// Hot buffer slots per request (2048, 4096 or 8192: the instantiated sizes).
    pub hot: u32,
    /// `seq_lens[r]` of every request (the newest token `seq_len - 1` is served from slot `hot`).
    pub seq_len: u32,
    /// Bytes per row (`item_size_bytes`).
    pub item_bytes: u32,
}

/// SGLang's swap-in kernel with its per-request state, loaded on one GPU.
#[derive(Debug)]
pub struct SglangHisparse {
    full: CudaFunction,
    nocopy: CudaFunction,
    shape: SglangShape,
    host_stride: u32,
    host_ptr: u64,
    tokens: DeviceBuffer<i32>,
    locs: DeviceBuffer<i32>,
    host_locs: DeviceBuffer<i64>,
    lru: DeviceBuffer<i16>,
    rpi: DeviceBuffer<i32>,
    seq: DeviceBuffer<i32>,
    nreal: DeviceBuffer<i32>,
    out: DeviceBuffer<i32>,
    buffer: DeviceBuffer<u8>,
}

impl SglangHisparse {
    /// Builds the state: `host_locs` is `int64 [reqs][host_stride]` (host row of token `p` of
    /// request `r` at `r × host_stride + p`, in units of `item_bytes` from `host_ptr`, the device
    /// address of the host cache); empty buffers, LRU order `0 .. hot`.
    ///
    /// # Errors
    /// `Shape` for a hot size without an instantiation, a top-k other than 2048 is not offered,
    /// `host_locs` of the wrong length; NVRTC / driver errors.
    pub fn new(
        gpu: &Arc<Gpu>,
        shape: SglangShape,
        host_ptr: u64,
        host_locs: &[i64],
        host_stride: u32,
    ) -> Result<Self, CudaError> {
        if ![2048, 4096, 8192].contains(&shape.hot) {
            return Err(CudaError::Shape {
                what: "SGLang hot buffer size (2048, 4096 or 8192)",
                expected: 4096,
                got: shape.hot as u64,
            });
        }
        let want = shape.reqs as u64 * host_stride as u64;
        if host_locs.len() as u64 != want {
            return Err(CudaError::Shape {
                what: "host_cache_locs entries",
                expected: want,
                got: host_locs.len() as u64,
            });
        }
        let name = format!("sglang_hisparse_k{SGLANG_TOP_K}_h{}", shape.hot);
        let full = gpu.function(&SGLANG_HISPARSE, &name)?;
        let nocopy = gpu.function(&SGLANG_HISPARSE, &format!("{name}_nocopy"))?;
        let smem = sglang_smem_bytes(SGLANG_TOP_K, shape.hot) as i32;
        for f in [&full, &nocopy] {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem,
            )
            .map_err(|e| CudaError::driver("cuFuncSetAttribute", e))?;
        }
        let ctx = gpu.ctx();
        let stride = shape.hot as usize + 1;
        let n = shape.reqs as usize;
        let locs: Vec<i32> = (0..(n * stride) as i32).collect();
        let mut s = SglangHisparse {
            full,
            nocopy,
            shape,
            host_stride,
            host_ptr,
            tokens: DeviceBuffer::zeroed(ctx, n * stride)?,
            locs: DeviceBuffer::from_host(ctx, &locs)?,
            host_locs: DeviceBuffer::from_host(ctx, host_locs)?,
            lru: DeviceBuffer::zeroed(ctx, n * shape.hot as usize)?,
            rpi: DeviceBuffer::from_host(ctx, &(0..shape.reqs as i32).collect::<Vec<_>>())?,
            seq: DeviceBuffer::from_host(ctx, &vec![shape.seq_len as i32; n])?,
            nreal: DeviceBuffer::from_host(ctx, &[shape.reqs as i32])?,
            out: DeviceBuffer::zeroed(ctx, n * SGLANG_TOP_K as usize)?,
            buffer: DeviceBuffer::zeroed(ctx, n * stride * shape.item_bytes as usize)?,
        };
        s.reset()?;
        Ok(s)
    }

    /// Empties every hot buffer (tokens `-1`) and restores the LRU order `0 .. hot` (synchronous).
    ///
    /// # Errors
    /// Driver errors of the uploads.
    pub fn reset(&mut self) -> Result<(), CudaError> {
        let stride = self.shape.hot as usize + 1;
        let n = self.shape.reqs as usize;
        self.tokens.upload(&vec![-1; n * stride])?;
        let lru: Vec<i16> = (0..n).flat_map(|_| 0..self.shape.hot as i16).collect();
        self.lru.upload(&lru)
    }

    /// `top_k_device_locs int32 [reqs][k]` (device rows of the picks).
    pub fn out(&self) -> &DeviceBuffer<i32> {
        &self.out
    }

    /// The device buffer (`u8 [reqs × (hot + 1)][item_bytes]`).
    pub fn buffer(&self) -> &DeviceBuffer<u8> {
        &self.buffer
    }

    /// One swap-in over all requests: `topk` is `int32 [reqs][2048]` on the device. `copy = false`
    /// launches the bookkeeping-only instance (identical except the final miss copies).
    ///
    /// # Errors
    /// The driver's launch error.
    ///
    /// # Safety
    /// `topk` addresses `reqs × 2048` int32 on the device, each `0 <= p < host_stride`; the host
    /// cache at `host_ptr` holds every row `host_locs` names and stays allocated until the stream
    /// passes the launch.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        topk: u64,
        copy: bool,
    ) -> Result<(), CudaError> {
        let f = if copy { &self.full } else { &self.nocopy };
        let stride = self.shape.hot as i64 + 1;
        let args_i64 = [
            stride,                  // buffer_stride_0
            self.host_stride as i64, // host_stride
            self.shape.hot as i64,   // lru_slot_stride_0
            SGLANG_TOP_K as i64,     // top_k_tokens_stride
            SGLANG_TOP_K as i64,     // top_k_device_locs_stride
            1i64,                    // page_size
            self.shape.item_bytes as i64,
        ];
        let ptrs = [
            topk,
            self.tokens.device_ptr(),
            self.host_locs.device_ptr(),
            self.locs.device_ptr(),
            self.host_ptr,
            self.buffer.device_ptr(),
            self.out.device_ptr(),
            self.rpi.device_ptr(),
            self.seq.device_ptr(),
            self.lru.device_ptr(),
            self.nreal.device_ptr(),
        ];
        let mut b = stream.launch_builder(f);
        for p in &ptrs {
            b.arg(p);
        }
        for v in &args_i64 {
            b.arg(v);
        }
        let cfg = LaunchConfig {
            grid_dim: (self.shape.reqs, 1, 1),
            block_dim: (SGLANG_BLOCK, 1, 1),
            shared_mem_bytes: sglang_smem_bytes(SGLANG_TOP_K, self.shape.hot),
        };
        // SAFETY: the argument list matches the entry point (11 pointers, 7 int64); the state
        // buffers are owned by `self`, `topk` and the host cache per the caller's contract.
        unsafe { b.launch(cfg) }
            .map_err(|e| CudaError::driver("cuLaunchKernel(sglang_hisparse)", e))?;
        Ok(())
    }
}
