//! [`DeviceOps`] (`cuda` feature): one device's primary context with `cuda-kernels`' caller-owned
//! launchers ([`CountLauncher`], [`SlotIdLauncher`]), opened once per process and device, for the
//! bindings' per-call entry points (torch ops, C functions) that launch on the caller's stream.
//! Only the bindings use it, so it lives here rather than in the kernel crate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{CountLauncher, CudaError, Gpu, Result, SlotIdLauncher};

/// A device's primary context (PyTorch's and the CUDA runtime's) and the launchers of the
/// bindings' per-call entry points. See [`DeviceOps::get`].
#[derive(Debug)]
pub struct DeviceOps {
    gpu: Arc<Gpu>,
    /// The strided count into caller memory.
    pub count: CountLauncher,
    /// The slot-id form of a table.
    pub slots: SlotIdLauncher,
}

impl DeviceOps {
    /// The ops of device `ordinal`, opened (kernels compiled) on first use and cached for the
    /// process; the context is bound to the calling thread on every call. The `Gpu`'s step stream
    /// is the legacy default stream (borrowed): nothing is created; launches go to the stream
    /// given to [`DeviceOps::stream`].
    ///
    /// # Errors
    /// [`CudaError::NoDevice`] / `OutOfRange` for a missing device; NVRTC and driver errors.
    pub fn get(ordinal: usize) -> Result<Arc<DeviceOps>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<DeviceOps>>>> = OnceLock::new();
        let mut map = DEVICES
            .get_or_init(Default::default)
            .lock()
            .map_err(|_| CudaError::InFlight("device registry lock poisoned"))?;
        if let Some(d) = map.get(&ordinal) {
            d.gpu
                .ctx()
                .bind_to_thread()
                .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
            return Ok(d.clone());
        }
        // SAFETY: stream 0 is the legacy default stream of the primary context: always alive.
        let gpu = unsafe { Gpu::with_step_stream(ordinal, 0) }?;
        let d = Arc::new(DeviceOps {
            count: CountLauncher::new(&gpu)?,
            slots: SlotIdLauncher::new(&gpu)?,
            gpu,
        });
        map.insert(ordinal, d.clone());
        Ok(d)
    }

    /// The device's [`Gpu`].
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// A borrowed handle on the caller's stream (see [`Gpu::borrow_stream`]).
    ///
    /// # Errors
    /// As [`Gpu::borrow_stream`].
    ///
    /// # Safety
    /// As [`Gpu::borrow_stream`]: 0 or a live stream of this device's primary context.
    pub unsafe fn stream(&self, cu_stream: u64) -> Result<Arc<CudaStream>> {
        // SAFETY: forwarded contract.
        unsafe { self.gpu.borrow_stream(cu_stream) }
    }
}
