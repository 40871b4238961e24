//! Every raw CUDA driver call of the crate (`cudarc`'s `sys` and `result` layers), each behind
//! one small wrapper with its contract. Other modules call these wrappers, never `sys::`
//! directly.
//!
//! Wrappers whose soundness depends on caller-supplied pointers are `unsafe fn` with a
//! `# Safety` section; the rest are safe. Every failure maps to [`CudaError::Driver`] carrying
//! the driver call's name.

use cudarc::driver::{result, sys, CudaStream};

use crate::error::{drv, CudaError, Result};

/// Whether libcuda and libnvrtc can be loaded (dlopen only; no CUDA state is created).
pub(crate) fn libraries_present() -> bool {
    // SAFETY: both calls only try to dlopen the libraries and report success; no CUDA state.
    unsafe { sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() }
}

/// `cuMemAlloc` of `bytes` bytes (at least 1) in the current context; the memory is
/// uninitialised.
///
/// # Safety
/// A context must be bound to the calling thread; the caller initialises the memory before any
/// read and frees it exactly once with [`free`].
pub(crate) unsafe fn malloc(bytes: usize) -> Result<u64> {
    // SAFETY: a plain allocation in the bound context (caller's contract).
    unsafe { result::malloc_sync(bytes.max(1)) }.map_err(drv("cuMemAlloc"))
}

/// `cuMemFree`; errors are ignored (used from `Drop`).
///
/// # Safety
/// `ptr` came from [`malloc`] in the bound context and is never used again.
pub(crate) unsafe fn free(ptr: u64) {
    // SAFETY: caller's contract; `cuMemFree` waits for outstanding work on the allocation.
    let _ = unsafe { result::free_sync(ptr) };
}

/// `cuMemsetD8` of `bytes` bytes at `ptr` to zero (legacy stream: may still be in flight on
/// return; synchronise the context before relying on it).
///
/// # Safety
/// `ptr .. ptr + bytes` lies inside a live device allocation of the bound context.
pub(crate) unsafe fn memset_zero_sync(ptr: u64, bytes: usize) -> Result<()> {
    // SAFETY: caller's contract.
    unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(drv("cuMemsetD8"))
}

/// `cuMemsetD8Async` of `bytes` bytes at `ptr` to zero on `stream`.
///
/// # Safety
/// `ptr .. ptr + bytes` lies inside a live device allocation of `stream`'s context and stays
/// allocated until the memset completes.
pub(crate) unsafe fn memset_zero_async(ptr: u64, bytes: usize, stream: &CudaStream) -> Result<()> {
    // SAFETY: caller's contract.
    unsafe { result::memset_d8_async(ptr, 0, bytes, stream.cu_stream()) }
        .map_err(drv("cuMemsetD8Async"))
}

/// Synchronous `cuMemcpyHtoD` of `src` to device address `dst` (a pageable copy may return
/// before its DMA lands: synchronise the context before relying on it).
///
/// # Safety
/// `dst .. dst + size_of_val(src)` lies inside a live device allocation of the bound context.
pub(crate) unsafe fn memcpy_htod_sync<T: bytemuck::Pod>(
    dst: u64,
    src: &[T],
    call: &'static str,
) -> Result<()> {
    // SAFETY: caller's contract; `src` is a valid host slice for the duration of the call.
    unsafe { result::memcpy_htod_sync(dst, src) }.map_err(drv(call))
}

/// Synchronous `cuMemcpyDtoH` from device address `src` into `dst`.
///
/// # Safety
/// `src .. src + size_of_val(dst)` lies inside a live device allocation of the bound context,
/// and no stream writes it during the copy.
pub(crate) unsafe fn memcpy_dtoh_sync<T: bytemuck::Pod>(
    dst: &mut [T],
    src: u64,
    call: &'static str,
) -> Result<()> {
    // SAFETY: caller's contract; `dst` is a valid, exclusively borrowed host slice, and any bit
    // pattern is a valid `T: Pod`.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(drv(call))
}

/// `cuMemHostAlloc` of `bytes` bytes (at least 1) of pinned host memory, mapped into the device
/// address space and portable across contexts (not write-combined), and its device address
/// (`cuMemHostGetDevicePointer`). On a failure of the second call the allocation is freed.
///
/// # Safety
/// A context must be bound to the calling thread; the caller initialises the memory before any
/// read and frees it exactly once with [`free_host`].
pub(crate) unsafe fn malloc_host_mapped(bytes: usize) -> Result<(*mut u8, u64)> {
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: plain allocation in the bound context (caller's contract).
    let host = unsafe { result::malloc_host(bytes.max(1), flags) }.map_err(drv("cuMemHostAlloc"))?
        as *mut u8;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `host` was allocated with DEVICEMAP just above; `dev` is a valid out pointer.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut _, 0) };
    if let Err(e) = r.result() {
        // SAFETY: free the allocation we just made; it was never shared.
        let _ = unsafe { result::free_host(host as *mut _) };
        return Err(CudaError::driver("cuMemHostGetDevicePointer", e));
    }
    Ok((host, dev))
}

/// `cuMemFreeHost`; errors are ignored (used from `Drop`).
///
/// # Safety
/// `host` came from [`malloc_host_mapped`] and is never used again.
pub(crate) unsafe fn free_host(host: *mut u8) {
    // SAFETY: caller's contract; `cuMemFreeHost` synchronises with outstanding device work on it.
    let _ = unsafe { result::free_host(host as *mut _) };
}

/// `cuMemHostRegister` of `host .. host + bytes` (at least 1 byte) as pinned, mapped into the
/// device address space and portable across contexts (`DEVICEMAP | PORTABLE`).
///
/// # Safety
/// A context must be bound to the calling thread; `host .. host + bytes` is a live host
/// allocation that stays allocated until [`host_unregister`] is called on `host`, exactly once.
pub(crate) unsafe fn host_register_mapped(host: *mut u8, bytes: usize) -> Result<()> {
    let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
    // SAFETY: caller's contract (a live host range, a bound context).
    unsafe { sys::cuMemHostRegister_v2(host as *mut _, bytes.max(1), flags) }
        .result()
        .map_err(drv("cuMemHostRegister"))
}

/// `cuMemHostUnregister`; errors are ignored (used from `Drop`).
///
/// # Safety
/// `host` was registered by [`host_register_mapped`] and no device work reads it any more.
pub(crate) unsafe fn host_unregister(host: *mut u8) {
    // SAFETY: caller's contract.
    let _ = unsafe { sys::cuMemHostUnregister(host as *mut _) };
}

/// The device address of the mapped pinned host address `host` (`cuMemHostGetDevicePointer`);
/// fails (`CUDA_ERROR_INVALID_VALUE`) when `host` is not inside page-locked, device-mapped memory.
///
/// # Safety
/// A context must be bound to the calling thread (the call only queries the driver).
pub(crate) unsafe fn host_device_ptr(host: *const u8) -> Result<u64> {
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `dev` is a valid out-pointer; the driver only looks `host` up in its tables.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut _, 0) }
        .result()
        .map_err(drv("cuMemHostGetDevicePointer"))?;
    Ok(dev)
}

/// What the driver knows of device address `ptr`: `(memory is device memory, device ordinal,
/// allocation start, allocation size in bytes)` (`cuPointerGetAttribute`).
pub(crate) fn device_range_of(ptr: u64) -> Result<(bool, i32, u64, usize)> {
    fn attr<T: Default>(ptr: u64, a: sys::CUpointer_attribute) -> Result<T> {
        let mut v = T::default();
        // SAFETY: `v` is a valid out-pointer of the attribute's type (the caller below pairs
        // each attribute with its documented type); the driver only looks `ptr` up.
        unsafe { sys::cuPointerGetAttribute(&mut v as *mut T as *mut _, a, ptr) }
            .result()
            .map_err(drv("cuPointerGetAttribute"))?;
        Ok(v)
    }
    use sys::CUpointer_attribute as A;
    let kind: u32 = attr(ptr, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?;
    let ordinal: i32 = attr(ptr, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?;
    let start: sys::CUdeviceptr = attr(ptr, A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)?;
    let size: usize = attr(ptr, A::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?;
    let device = kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    Ok((device, ordinal, start, size))
}

/// `cuMemcpyHtoDAsync` of `bytes` bytes from host `src` to device `dst` on `stream`.
///
/// # Safety
/// `src` must stay valid and unmodified, and `dst .. dst + bytes` must stay allocated and unread
/// by other streams, until the copy completes.
pub(crate) unsafe fn memcpy_htod_async(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: caller's contract.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const _, bytes, stream.cu_stream()) }
        .result()
        .map_err(drv("cuMemcpyHtoDAsync"))
}

/// `cuMemcpyDtoHAsync` of `bytes` bytes from device `src` to host `dst` on `stream`.
///
/// # Safety
/// `dst` must stay valid and unread by the host, and `src` allocated, until the copy completes.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: u64,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: caller's contract.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut _, src, bytes, stream.cu_stream()) }
        .result()
        .map_err(drv("cuMemcpyDtoHAsync"))
}

/// Where a stream stands with CUDA graph capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Not capturing.
    None,
    /// Part of the active capture with this id (ids are unique for the process's lifetime).
    Active(u64),
    /// Part of a capture invalidated by an error: it can never produce a graph.
    Invalidated,
}

/// The capture state of `stream` (`cuStreamGetCaptureInfo`).
pub(crate) fn capture_state(stream: &CudaStream) -> Result<Capture> {
    stream
        .context()
        .bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    // SAFETY: `stream` is a live stream of the bound context; the two out-pointers are valid
    // locals, and the optional outputs (graph, dependencies, edge data, count) are null, which
    // the driver accepts (only the status is required).
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(drv("cuStreamGetCaptureInfo"))?;
    // the id is defined only while the capture is active
    Ok(match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Capture::None,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Capture::Active(id),
        _ => Capture::Invalidated,
    })
}

/// One `cuMemcpyBatchAsync` of `dsts.len()` copies (`dsts[i] ← srcs[i]`, `sizes[i]` bytes) on
/// `stream`, sources read in stream order, host sources and device destinations;
/// `prefer_overlap` sets `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`.
///
/// # Safety
/// The three slices have the same length; every source range is readable host memory (pinned) and
/// every destination range writable device memory until the stream passes the copy; the stream's
/// context is current on this thread.
pub(crate) unsafe fn memcpy_batch_async(
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

/// The calling thread's current CUDA context when it was saved, made current again on drop: entry
/// points called by an engine (a torch op, a C call) bind tierkit's context while they run and
/// must hand the thread back as they found it (PyTorch or the engine may have another device's
/// context current). Holds nothing when libcuda cannot be loaded (nothing can bind then).
#[must_use = "the context is restored when the guard drops"]
pub struct ContextGuard(Option<sys::CUcontext>);

impl ContextGuard {
    /// Saves the calling thread's current context (`cuCtxGetCurrent`; null when none).
    ///
    /// # Errors
    /// [`CudaError::Driver`] if the driver cannot report the current context.
    pub fn save() -> Result<ContextGuard> {
        // SAFETY: only dlopens libcuda and reports success.
        if !unsafe { sys::is_culib_present() } {
            return Ok(ContextGuard(None));
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; the call reads thread state only (it fails with
        // CUDA_ERROR_NOT_INITIALIZED before cuInit, and reports null when no context is bound).
        match unsafe { sys::cuCtxGetCurrent(&mut ctx) }.result() {
            Ok(()) => Ok(ContextGuard(Some(ctx))),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_INITIALIZED => {
                Ok(ContextGuard(Some(std::ptr::null_mut())))
            }
            Err(e) => Err(drv("cuCtxGetCurrent")(e)),
        }
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            // SAFETY: `ctx` was the thread's current context (or null: unbind) when saved; a
            // context the caller destroyed meanwhile makes the call fail, which is ignored (the
            // thread then keeps tierkit's context, as before this guard existed).
            let _ = unsafe { sys::cuCtxSetCurrent(ctx) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{cuda_available, Gpu};

    fn current() -> sys::CUcontext {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; reads thread state only.
        unsafe { sys::cuCtxGetCurrent(&mut ctx) }.result().unwrap();
        ctx
    }

    #[test]
    fn context_guard_hands_the_thread_back_as_it_found_it() {
        // without libcuda the guard holds nothing and dropping it touches nothing
        let g = ContextGuard::save().expect("save never fails without a driver");
        drop(g);
        if !cuda_available() {
            println!("SKIP context_guard_hands_the_thread_back_as_it_found_it: no CUDA device");
            return;
        }
        let gpu = Gpu::new(0).unwrap();
        std::thread::spawn(move || {
            // a fresh thread has no current context; an entry point binds ours, then restores
            assert!(current().is_null());
            {
                let _g = ContextGuard::save().unwrap();
                gpu.ctx().bind_to_thread().unwrap();
                assert!(!current().is_null());
            }
            assert!(current().is_null(), "the guard unbinds what it bound");
            gpu.ctx().bind_to_thread().unwrap();
            let ours = current();
            {
                let _g = ContextGuard::save().unwrap();
                // SAFETY: unbinding (null) is always allowed
                unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) }
                    .result()
                    .unwrap();
            }
            assert_eq!(current(), ours, "the guard rebinds the saved context");
        })
        .join()
        .unwrap();
    }
}
