//! The raw driver calls of the KV launchers (`cudarc::driver::sys`), in one place.

use cudarc::driver::{sys, CudaStream};

use crate::error::{drv, Result};

/// One `cuMemcpyBatchAsync` of `dsts.len()` copies (`dsts[i] ← srcs[i]`, `sizes[i]` bytes) on
/// `stream`, sources read in stream order, host sources and device destinations;
/// `prefer_overlap` sets `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`.
///
/// # Safety
/// The three slices have the same length; every source range is readable host memory (pinned) and
/// every destination range writable device memory until the stream passes the copy; the stream's
/// context is current on this thread.
pub(super) unsafe fn memcpy_batch_async(
    dsts: &mut [u64],
    srcs: &mut [u64],
    sizes: &mut [usize],
    stream: &CudaStream,
    prefer_overlap: bool,
) -> Result<()> {
    debug_assert!(dsts.len() == srcs.len() && srcs.len() == sizes.len());
    // SAFETY: zero-initialised C struct; every field we rely on is set below.
    let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.srcLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST;
    attr.dstLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    attr.flags = if prefer_overlap {
        sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32
    } else {
        sys::CUmemcpyFlags::CU_MEMCPY_FLAG_DEFAULT as u32
    };
    let mut idx = [0usize];
    // SAFETY: the arrays hold `dsts.len()` entries each and are read during the call (the driver
    // copies the descriptors); the ranges they name are valid per the caller's contract.
    unsafe {
        sys::cuMemcpyBatchAsync_v2(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            &mut attr,
            idx.as_mut_ptr(),
            1,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(drv("cuMemcpyBatchAsync"))
}
