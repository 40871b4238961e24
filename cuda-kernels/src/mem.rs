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
    /// `false` for caller-owned memory ([`DeviceBuffer::borrowed`]): never freed by us.
    owned: bool,
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
            owned: true,
            _t: PhantomData,
        };
        buf.zero_sync()?;
        Ok(buf)
    }

    /// A view of `len` elements of caller-owned device memory at `ptr` (e.g. a PyTorch CUDA
    /// tensor's storage), never freed by tierkit. Checked with `cuPointerGetAttribute`: `ptr` is
    /// 16-byte aligned, device memory of `ctx`'s device, and `ptr .. ptr + len × size_of::<T>()`
    /// lies inside one allocation. The contents are left as they are.
    ///
    /// # Errors
    /// [`CudaError::ForeignMemory`] for a null, misaligned, foreign-device, non-device or too
    /// short range; [`CudaError::OutOfRange`] for a length overflowing `isize`.
    ///
    /// # Safety
    /// The memory must stay allocated, and be used by nobody else in a way that races with
    /// tierkit's use, for the life of the returned buffer **and until the device work tierkit
    /// queued on it has completed**: dropping a borrowed buffer does not synchronize, so after
    /// dropping the object that uses it (a pool, a bank), synchronize the context (or that
    /// object's streams) before freeing or reusing the memory. (The Python bindings do: a closed
    /// object's memory is released after a context synchronize.)
    pub unsafe fn borrowed(ctx: &Arc<CudaContext>, ptr: u64, len: usize) -> Result<Self> {
        let bytes = bytes_of::<T>(len, "device buffer length")?;
        let bad = |reason: String| CudaError::ForeignMemory {
            what: "device range",
            reason,
        };
        if ptr == 0 || !ptr.is_multiple_of(16) {
            return Err(bad(format!(
                "address {ptr:#x} is null or not 16-byte aligned"
            )));
        }
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let (device, ordinal, start, size) = raw::device_range_of(ptr)
            .map_err(|e| bad(format!("address {ptr:#x} unknown to the driver ({e})")))?;
        if !device || ordinal as i64 != ctx.ordinal() as i64 {
            return Err(bad(format!(
                "address {ptr:#x} is not device memory of device {} (device memory: {device}, \
                 device {ordinal})",
                ctx.ordinal()
            )));
        }
        let end = (ptr - start) as u128 + bytes as u128;
        if end > size as u128 {
            return Err(bad(format!(
                "{bytes} bytes at {ptr:#x} overrun the allocation ({size} bytes from {start:#x})"
            )));
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
            owned: false,
            _t: PhantomData,
        })
    }

    /// Whether tierkit allocated (and will free) this memory.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The context the buffer belongs to.
    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
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

    /// Synchronous zero-fill: returns once the bytes are zero (it synchronises the context: the
    /// "sync" memset runs on the legacy stream and may still be in flight on return, and our
    /// streams are non-blocking, with no implicit ordering with it).
    pub fn zero_sync(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `self.ptr` is a live range of `num_bytes()` bytes (owned, or the caller's per
        // `borrowed`'s contract); zero is a valid `T: Pod`.
        unsafe { raw::memset_zero_sync(self.ptr, self.num_bytes()) }?;
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }

    /// Asynchronous zero-fill on `stream`.
    pub fn zero_async(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: `self.ptr` is a live allocation of `num_bytes()` bytes; zero is a valid `T: Pod`.
        unsafe { raw::memset_zero_async(self.ptr, self.num_bytes(), stream) }
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.owned && self.ctx.bind_to_thread().is_ok() {
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
    backing: HostBacking,
}

/// Who owns a [`PinnedBuffer`]'s memory, and what its drop undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostBacking {
    /// Allocated by tierkit (`cuMemHostAlloc`), freed on drop.
    Owned,
    /// The caller's memory, already pinned and mapped; left alone on drop.
    Borrowed,
    /// The caller's memory, pinned by tierkit (`cuMemHostRegister`); unregistered on drop, never
    /// freed.
    Registered,
}

// SAFETY: the memory is owned by this value, or lent to it exclusively for its life
// (`PinnedBuffer::borrowed`'s contract); the raw pointer is only dereferenced through
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
            backing: HostBacking::Owned,
        })
    }

    /// A view of `len` elements of caller-owned host memory at `host`, never freed by tierkit.
    /// With `register`, tierkit pins and maps the range (`cuMemHostRegister`, `DEVICEMAP |
    /// PORTABLE`) and unregisters it on drop; without, the range must already be pinned and
    /// mapped (e.g. `cudaHostAlloc` memory, a PyTorch pinned tensor), which is checked at both
    /// ends with `cuMemHostGetDevicePointer`. The contents are left as they are.
    ///
    /// # Errors
    /// [`CudaError::ForeignMemory`] for a null or not 16-byte aligned address, or a range the
    /// driver does not map (not pinned; or, with `register`, already registered:
    /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` in the reason); [`CudaError::OutOfRange`] for
    /// a length overflowing `isize`.
    ///
    /// # Safety
    /// `host .. host + len × size_of::<T>()` must be live, writable host memory that stays
    /// allocated for the life of the returned buffer, and until the device work tierkit queued
    /// on it has completed (a borrowed, unregistered buffer's drop does not synchronize: after
    /// dropping the object that uses it, synchronize the context before freeing the memory), and
    /// is not accessed by others in a way that races with tierkit's (the buffer hands out `&mut`
    /// slices of it).
    pub unsafe fn borrowed(
        ctx: &Arc<CudaContext>,
        host: *mut T,
        len: usize,
        register: bool,
    ) -> Result<Self> {
        let bytes = bytes_of::<T>(len, "pinned buffer length")?;
        let bad = |reason: String| CudaError::ForeignMemory {
            what: "host range",
            reason,
        };
        let addr = host as usize;
        if addr == 0 || !addr.is_multiple_of(16) {
            return Err(bad(format!(
                "address {addr:#x} is null or not 16-byte aligned"
            )));
        }
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let base = host as *mut u8;
        if register {
            // SAFETY: a live host range for the buffer's life (caller's contract), context bound;
            // `Drop` unregisters it once.
            unsafe { raw::host_register_mapped(base, bytes) }
                .map_err(|e| bad(format!("cannot register {bytes} bytes at {addr:#x}: {e}")))?;
        }
        let backing = if register {
            HostBacking::Registered
        } else {
            HostBacking::Borrowed
        };
        // the first and the last byte must both be mapped, contiguously
        // SAFETY: context bound above; these calls only query the driver.
        let ends = unsafe {
            raw::host_device_ptr(base)
                .and_then(|d0| Ok((d0, raw::host_device_ptr(base.add(bytes.max(1) - 1))?)))
        };
        let checked = match ends {
            Ok((d0, d1)) if d1 == d0 + (bytes.max(1) - 1) as u64 => Ok(d0),
            Ok(_) => Err(bad(format!(
                "{bytes} bytes at {addr:#x} are not one mapped range"
            ))),
            Err(e) => Err(bad(format!(
                "{bytes} bytes at {addr:#x} are not pinned and mapped ({e})"
            ))),
        };
        match checked {
            Ok(dev) => Ok(PinnedBuffer {
                host,
                dev,
                len,
                ctx: ctx.clone(),
                backing,
            }),
            Err(e) => {
                if register {
                    // SAFETY: registered just above, never shared.
                    unsafe { raw::host_unregister(base) };
                }
                Err(e)
            }
        }
    }

    /// Who owns the memory.
    pub fn backing(&self) -> HostBacking {
        self.backing
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
        if self.backing == HostBacking::Borrowed || self.ctx.bind_to_thread().is_err() {
            return;
        }
        if self.backing == HostBacking::Registered {
            // Unregistering does not wait for device work that reads the range: wait first.
            let _ = self.ctx.synchronize();
            // SAFETY: we registered this range, the device is idle, and it is never used again.
            unsafe { raw::host_unregister(self.host as *mut u8) };
        } else {
            // SAFETY: we own this allocation; `cuMemFreeHost` synchronises with outstanding
            // device work on it, and the pointer is never used again.
            unsafe { raw::free_host(self.host as *mut u8) };
        }
    }
}

/// Synchronous host → device copy of `src` to device address `dst` (`cuMemcpyHtoD`) in `ctx`,
/// which is bound to the calling thread first. The copy may still be landing on return (a
/// pageable source is staged): synchronise the context (e.g. [`DeviceBuffer::upload`],
/// `Gpu::synchronize`) before kernels read `dst`.
///
/// # Errors
/// [`CudaError::Driver`] naming `cuCtxSetCurrent` or `cuMemcpyHtoD`.
///
/// # Safety
/// `dst .. dst + size_of_val(src)` lies inside a live device allocation of `ctx`, and no kernel
/// reads or writes it during the copy.
pub unsafe fn copy_htod_sync<T: Pod>(ctx: &Arc<CudaContext>, dst: u64, src: &[T]) -> Result<()> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: forwarded to the caller's contract above; the context is bound just above.
    unsafe { raw::memcpy_htod_sync(dst, src, "cuMemcpyHtoD") }
}

/// Synchronous device → host copy from device address `src` into `dst` (`cuMemcpyDtoH`) in
/// `ctx`, which is bound to the calling thread first. Not ordered with non-blocking streams:
/// synchronise the work that writes `src` first.
///
/// # Errors
/// [`CudaError::Driver`] naming `cuCtxSetCurrent` or `cuMemcpyDtoH`.
///
/// # Safety
/// `src .. src + size_of_val(dst)` lies inside a live device allocation of `ctx`, and no kernel
/// writes it during the copy.
pub unsafe fn copy_dtoh_sync<T: Pod>(
    ctx: &Arc<CudaContext>,
    dst: &mut [T],
    src: u64,
) -> Result<()> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: forwarded to the caller's contract above; the context is bound just above.
    unsafe { raw::memcpy_dtoh_sync(dst, src, "cuMemcpyDtoH") }
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
