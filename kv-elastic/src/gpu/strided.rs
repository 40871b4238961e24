//! Page fills as strided copies: a run of consecutive positions of one session slot, filled into
//! consecutive arena rows, is one `cuMemcpy2DAsync` per layer from the token-major pinned store
//! (`[slot][position][layer][row_bytes]`: a layer's rows are `token_bytes` apart) into the
//! layer's plane (rows `row_bytes` apart). A whole history lent to fresh pages is one run, so an
//! admission's or an import's fill is `layers` copy-engine descriptors, built in O(1) on the host
//! (with one layer the copy is contiguous: the H2D rate).

use cuda_kernels::cudarc_driver::sys;
use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{CudaError, Result};

use super::data::FillRun;
use super::GpuArena;

/// Queues `run` on `stream` (one strided copy per layer); returns the copies queued.
///
/// # Errors
/// `OutOfRange` for a run outside the store or the arena; the driver's error.
///
/// # Safety
/// The run's arena rows are the fill's to write (pages just lent: no reader, no other queued
/// writer), and `dev` stays alive until `stream` passes the copies.
pub(crate) unsafe fn copy_run_async(
    dev: &GpuArena,
    stream: &CudaStream,
    run: &FillRun,
) -> Result<u32> {
    let d = *dev.dims();
    let out = |what, value: u64, limit: u64| CudaError::OutOfRange { what, value, limit };
    if run.slot >= d.max_slots {
        return Err(out("fill run slot", run.slot as u64, d.max_slots as u64));
    }
    let (pos_end, row_end) = (
        run.position as u64 + run.rows as u64,
        run.dst_row as u64 + run.rows as u64,
    );
    if pos_end > d.max_history as u64 {
        return Err(out("fill run positions", pos_end, d.max_history as u64 + 1));
    }
    if row_end > d.arena_rows as u64 {
        return Err(out("fill run arena rows", row_end, d.arena_rows as u64 + 1));
    }
    if d.fmt != cuda_kernels::KV_FMT_CONTIGUOUS {
        // Rows of a paged split page are not `row_bytes` apart (the caller uses the gather).
        return Err(out(
            "strided fill of a paged split arena (format)",
            d.fmt as u64,
            1,
        ));
    }
    if run.rows == 0 {
        return Ok(0);
    }
    let (tb, rb) = (d.token_bytes(), d.row_bytes as usize);
    let (host, _) = dev.host_base();
    let first = (run.slot as usize * d.max_history as usize + run.position as usize) * tb;
    dev.gpu()
        .ctx()
        .bind_to_thread()
        .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
    for l in 0..d.layers {
        // SAFETY: inside the pinned store (slot, positions and layer checked against the dims
        // above).
        let src = unsafe { host.add(first + l as usize * rb) };
        let p = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: src as *const std::ffi::c_void,
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: tb,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dev.plane_ptr(l)? + run.dst_row as u64 * rb as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: rb,
            WidthInBytes: rb,
            Height: run.rows as usize,
        };
        // SAFETY: `p` describes `rows` rows inside the pinned store (mapped pinned memory, valid
        // while `dev` lives) and inside plane `l` of the arena (checked above); the driver reads
        // `p` during the call; the destination rows are the fill's (caller's contract).
        unsafe { sys::cuMemcpy2DAsync_v2(&p, stream.cu_stream()) }
            .result()
            .map_err(|e| CudaError::driver("cuMemcpy2DAsync", e))?;
    }
    Ok(d.layers)
}
