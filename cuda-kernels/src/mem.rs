//! GPU memory primitives: device buffers (HBM) and mapped pinned host buffers.
//!
//! Both hand out raw device pointers as `u64` (plain, FFI-friendly; engines pass them to their
//! own kernels). Neither tracks stream use: the caller orders accesses with streams and events,
//! as engines do.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{drv, CudaError, Result};
use crate::raw;

fn bytes_of<T>(len: usize, what: &'static str) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(CudaError::OutOfRange {
            what,
            value: len as u64,
            limit: (isize::MAX as usize / std::mem::size_of::<T>().max(1)) as u64,
        })
}

/// `len` elements of `T` in device memory (HBM), one `cuMemAlloc`.
#[derive(Debug)]
pub struct DeviceBuffer<T: Pod> {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    _t: PhantomData<T>,
}

// SAFETY: the buffer is a device allocation addressed by an integer; it owns no host data and the
// CUDA driver allows using a context from any thread (we bind before every call).
unsafe impl<T: Pod> Send for DeviceBuffer<T> {}
// SAFETY: shared access only reads `ptr`/`len`; device-side access is ordered by the caller.
unsafe impl<T: Pod> Sync for DeviceBuffer<T> {}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements, zero-filled (synchronously).
    ///
    /// # Errors
    /// [`CudaError::Driver`] (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len, "device buffer length")?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the context is bound just above; memory is zero-filled below before any read,
        // so every `T: Pod` element is valid, and `Drop` frees it once.
        let ptr = unsafe { raw::malloc(bytes) }?;
        let buf = DeviceBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
            _t: PhantomData,
        };
        // SAFETY: `ptr` is our fresh allocation of at least `bytes` bytes.
        unsafe { raw::memset_zero_sync(ptr, bytes) }?;
        // The "sync" memset runs on the legacy stream and may still be in flight on return; our
        // streams are non-blocking (no implicit ordering with it), so wait for it here.
        ctx.synchronize().map_err(drv("cuCtxSynchronize"))?;
        Ok(buf)
    }

    /// Allocates and uploads `data` (synchronous copy).
    pub fn from_host(ctx: &Arc<CudaContext>, data: &[T]) -> Result<Self> {
        let mut b = Self::zeroed(ctx, data.len())?;
        b.upload(data)?;
        Ok(b)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Raw device pointer (`CUdeviceptr`) of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Device pointer of element `i` (`i <= len`).
    pub fn device_ptr_at(&self, i: usize) -> Result<u64> {
        if i > self.len {
            return Err(CudaError::OutOfRange {
                what: "device buffer index",
                value: i as u64,
                limit: self.len as u64 + 1,
            });
        }
        Ok(self.ptr + (i * std::mem::size_of::<T>()) as u64)
    }

    /// Synchronous upload of `data` (same length) into the buffer: returns once the bytes are
    /// in place (it synchronizes the context, since a pageable `cuMemcpyHtoD` may return before
    /// its DMA lands and is not ordered with non-blocking streams).
    pub fn upload(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(CudaError::Shape {
                what: "upload source",
                expected: self.len as u64,
                got: data.len() as u64,
            });
        }
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: lengths match, `self.ptr` is a live allocation of `len` elements of `T`.
        unsafe { raw::memcpy_htod_sync(self.ptr, data, "cuMemcpyHtoD") }?;
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }

    /// Synchronous download of the whole buffer: first waits for all work on the device (the
    /// legacy-stream copy is not ordered with non-blocking streams), then copies.
    pub fn download(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))?;
        // SAFETY: `out` has exactly `len` elements; `self.ptr` holds `len` elements of `T`.
        unsafe { raw::memcpy_dtoh_sync(&mut out, self.ptr, "cuMemcpyDtoH") }?;
        Ok(out)
    }

    /// Asynchronous zero-fill on `stream`.
    pub fn zero_async(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: `self.ptr` is a live allocation of `num_bytes()` bytes; zero is a valid `T: Pod`.
        unsafe { raw::memset_zero_async(self.ptr, self.num_bytes(), stream) }
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: we own this allocation; `cuMemFree` waits for outstanding work on it
            // (implicit synchronisation of the free), and the pointer is never used again.
            unsafe { raw::free(self.ptr) };
        }
    }
}

/// `len` elements of `T` in pinned (page-locked) host memory, mapped into the device address
/// space (`CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`, not write-combined, so the CPU
/// reads it at normal speed). Kernels can read it in place through [`PinnedBuffer::device_ptr`]
/// (zero-copy over PCIe), and async copies from it run at the full H2D rate.
#[derive(Debug)]
pub struct PinnedBuffer<T: Pod> {
    host: *mut T,
    dev: u64,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is owned by this value; the raw pointer is only dereferenced through
// `&self`/`&mut self` methods, so Rust's aliasing rules apply as for a `Vec<T>`.
unsafe impl<T: Pod> Send for PinnedBuffer<T> {}
// SAFETY: as above; shared references only give shared slices.
unsafe impl<T: Pod> Sync for PinnedBuffer<T> {}

impl<T: Pod> PinnedBuffer<T> {
    /// Allocates `len` zero-filled elements of mapped pinned host memory.
    ///
    /// # Errors
    /// [`CudaError::Driver`] (e.g. `CUDA_ERROR_OUT_OF_MEMORY` when the host cannot pin that much).
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len, "pinned buffer length")?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the context is bound just above; the memory is zeroed below before any
        // reference is handed out, and `Drop` frees it once.
        let (host, dev) = unsafe { raw::malloc_host_mapped(bytes) }?;
        let host = host as *mut T;
        // SAFETY: `host` points at `bytes` writable bytes we own.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes) };
        Ok(PinnedBuffer {
            host,
            dev,
            len,
            ctx: ctx.clone(),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Device-side address of element 0 (mapped pinned memory: kernels read it over PCIe).
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }

    /// Host address of element 0.
    pub fn host_ptr(&self) -> *const T {
        self.host
    }

    /// Host view. Reading while a device copy into this buffer is in flight returns whatever
    /// bytes have landed (any bit pattern is a valid `T: Pod`): wait for the copy's event first.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `host` points at `len` initialised (zeroed at allocation) elements we own.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// Mutable host view. Do not write while a device copy from this buffer is in flight.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as `as_slice`, and `&mut self` guarantees exclusive host access.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }

    /// The context the buffer was pinned in.
    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: we own this allocation; `cuMemFreeHost` synchronises with outstanding
            // device work on it, and the pointer is never used again.
            unsafe { raw::free_host(self.host as *mut u8) };
        }
    }
}

/// Asynchronous host → device copy of `bytes` bytes on `stream` (`cuMemcpyHtoDAsync`).
///
/// # Safety
/// `src` must stay valid and unmodified, and `dst .. dst + bytes` must stay allocated and unread
/// by other streams, until the copy completes (order with an event).
pub unsafe fn copy_htod_async(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: forwarded to the caller's contract above.
    unsafe { raw::memcpy_htod_async(dst, src, bytes, stream) }
}

/// Asynchronous device → host copy of `bytes` bytes on `stream` (`cuMemcpyDtoHAsync`).
///
/// # Safety
/// `dst` must stay valid and unread by the host, and `src` allocated, until the copy completes.
pub unsafe fn copy_dtoh_async(
    dst: *mut u8,
    src: u64,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: forwarded to the caller's contract above.
    unsafe { raw::memcpy_dtoh_async(dst, src, bytes, stream) }
}
