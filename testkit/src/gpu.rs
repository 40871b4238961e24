//! The GPU-or-SKIP helper every GPU test, bench and example uses.

use std::sync::Arc;

use cuda_kernels::Gpu;

/// The default GPU, or `None` after printing `SKIP: no CUDA device` to stdout where no libcuda,
/// libnvrtc or device exists. CI counts a test that printed `SKIP` as skipped, not passed (see
/// `.ci/test`).
///
/// # Panics
/// Where a device exists but cannot be opened (a real failure must not pass as a skip).
pub fn gpu_or_skip() -> Option<Arc<Gpu>> {
    match Gpu::try_default() {
        Ok(Some(gpu)) => Some(gpu),
        Ok(None) => {
            println!("SKIP: no CUDA device");
            None
        }
        Err(e) => panic!("a CUDA device exists but could not be opened: {e}"),
    }
}

/// Flags for timing events (`CU_EVENT_DEFAULT`; cudarc's `new_event(None)` disables timing):
/// `gpu.ctx().new_event(TIMING_EVENT)`.
pub const TIMING_EVENT: Option<cuda_kernels::cudarc_driver::sys::CUevent_flags> =
    Some(cuda_kernels::cudarc_driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
