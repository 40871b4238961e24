//! Device detection, the [`Gpu`] handle (context + step stream + kernel registry) and the
//! crate's NVRTC modules ([`KernelSource`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::CompileOptions;

use crate::error::{drv, CudaError, Result};
use crate::raw;

/// One NVRTC module: a name and the full source (headers already prepended). The crate's own
/// modules are [`COUNT_MODULE`] and [`TABLE_MODULE`] (and the KV module); tests, benches and
/// engines compile theirs the same way through [`Gpu::function`].
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Module name, used as the cache key (unique per [`Gpu`]) and in error messages.
    pub name: &'static str,
    /// CUDA C++ source compiled by NVRTC.
    pub code: &'static str,
}

/// The fused-path header (`expert_count.cuh`): inline `__device__` functions an engine pastes
/// into (or `#include`s in) its router kernel. Recommended: `tierkit_count_pick_striped(stripes,
/// num_stripes, stripe, table, err, layer, layers, expert, experts)` from each lane holding a
/// pick at the router's end, stripe = the warp's index, with a counter made by
/// [`crate::PickCounterGpu::with_stripes`] (its drain folds the stripes). Also: the step form
/// (`tierkit_step_picks_load` / `_count`, in the last layer's router only), `tierkit_count_pick`
/// and `tierkit_count_pick_aggregated` (straight into the table). Same table and rejected word as
/// [`crate::PickCounterGpu`] (`table_ptr`, `rejected_ptr`). Costs measured on the H200: the
/// header's first lines and `benches/README.md`.
pub const EXPERT_COUNT_CUH: &str = include_str!("../kernels/expert_count.cuh");

/// Production counting kernels: `tierkit_count_i32` / `tierkit_count_i64` (what
/// [`crate::PickCounterGpu`] launches) and `tierkit_fold_stripes` (its drain's fold), with the
/// fused-path header prepended. The stand-in routers that test and time the header live in
/// `tierkit-testkit`, not here.
pub const COUNT_MODULE: KernelSource = KernelSource {
    name: "count",
    code: concat!(
        include_str!("../kernels/expert_count.cuh"),
        "\n",
        include_str!("../kernels/count.cu")
    ),
};

/// The indirection-table update kernel `tierkit_table_update` (launched by
/// [`crate::TableUpdater`]).
pub const TABLE_MODULE: KernelSource = KernelSource {
    name: "table",
    code: include_str!("../kernels/table.cu"),
};

/// Whether the CUDA driver library and NVRTC can be loaded and at least one device exists.
/// Never panics (unlike `CudaContext::new` where no libcuda exists).
pub fn cuda_available() -> bool {
    raw::libraries_present() && matches!(CudaContext::device_count(), Ok(n) if n > 0)
}

/// A CUDA context on one device with its step stream and a per-context NVRTC kernel cache.
///
/// Kernels are compiled at first use for the device's compute capability
/// (`--gpu-architecture=sm_XY`) and cached per `Gpu` (one primary context).
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cc: (i32, i32),
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// `-lineinfo` for the modules compiled from now on ([`Gpu::set_line_info`]).
    line_info: std::sync::atomic::AtomicBool,
}

impl Gpu {
    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`CudaError::NoDevice`] where no libcuda/libnvrtc or no such device exists;
    /// [`CudaError::Driver`] for failing driver calls.
    pub fn new(ordinal: usize) -> Result<Arc<Gpu>> {
        Gpu::open(ordinal, None)
    }

    /// Opens device `ordinal` (its primary context, the one PyTorch and the CUDA runtime use)
    /// with the caller's stream `cu_stream` as the step stream instead of a new one: the engine's
    /// step stream (e.g. `torch.cuda.current_stream().cuda_stream`). Every stream-ordered
    /// operation the tiers put on [`Gpu::stream`] (flips, publishes) is then ordered with the
    /// engine's kernels. The stream is borrowed: never destroyed here. `cu_stream` 0 is the legacy
    /// default stream.
    ///
    /// # Errors
    /// As [`Gpu::new`].
    ///
    /// # Safety
    /// `cu_stream` is 0 or a live stream of device `ordinal`'s primary context, and stays alive as
    /// long as the returned `Gpu` (and anything holding it) is used.
    pub unsafe fn with_step_stream(ordinal: usize, cu_stream: u64) -> Result<Arc<Gpu>> {
        Gpu::open(ordinal, Some(cu_stream))
    }

    /// A borrowed handle on a stream of this context (launch on an engine's stream per call, e.g.
    /// torch's current stream inside a graph capture). Never destroyed here; binds the context to
    /// the calling thread first.
    ///
    /// # Errors
    /// [`CudaError::Driver`] if the context cannot be made current.
    ///
    /// # Safety
    /// `cu_stream` is 0 or a live stream of this context that outlives the returned handle.
    pub unsafe fn borrow_stream(&self, cu_stream: u64) -> Result<Arc<CudaStream>> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: caller's contract (a live stream of this context, kept alive by its owner).
        Ok(unsafe { self.ctx.wrap_borrowed_stream(cu_stream as _) })
    }

    fn open(ordinal: usize, step: Option<u64>) -> Result<Arc<Gpu>> {
        if !cuda_available() {
            return Err(CudaError::NoDevice(
                "libcuda, libnvrtc or a device is missing".into(),
            ));
        }
        let n = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
        if ordinal as i64 >= n as i64 {
            return Err(CudaError::OutOfRange {
                what: "device ordinal",
                value: ordinal as u64,
                limit: n as u64,
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuCtxCreate"))?;
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let stream = match step {
            // SAFETY: `Gpu::with_step_stream`'s contract: a live stream of this (primary)
            // context that outlives the Gpu.
            Some(raw) => unsafe { ctx.wrap_borrowed_stream(raw as _) },
            None => ctx.new_stream().map_err(drv("cuStreamCreate"))?,
        };
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            cc,
            modules: Mutex::new(HashMap::new()),
            line_info: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Device 0 if a device exists, `Ok(None)` where none does.
    pub fn try_default() -> Result<Option<Arc<Gpu>>> {
        if !cuda_available() {
            return Ok(None);
        }
        Gpu::new(0).map(Some)
    }

    /// The CUDA context.
    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The step stream ("main stream"): the stream the engine's step kernels run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A new non-blocking stream (copy or drain side stream).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().map_err(drv("cuStreamCreate"))
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// The NVRTC architecture flag used for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }

    /// Device name.
    pub fn name(&self) -> Result<String> {
        self.ctx.name().map_err(drv("cuDeviceGetName"))
    }

    /// Loads (compiling on first use) module `src` and returns its function `name`.
    ///
    /// # Errors
    /// [`CudaError::Compile`] if NVRTC rejects the source, [`CudaError::Driver`] on load failure.
    pub fn function(&self, src: &KernelSource, name: &str) -> Result<CudaFunction> {
        let module = self.module(src)?;
        module
            .load_function(name)
            .map_err(drv("cuModuleGetFunction"))
    }

    /// Loads (compiling on first use) module `src`; cached per context. Compiled with the
    /// options of [`Gpu::set_line_info`] at that time (the module is cached by name: set them
    /// before the first use of a module).
    pub fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        let mut cache = self
            .modules
            .lock()
            .map_err(|_| CudaError::InFlight("kernel registry lock poisoned"))?;
        if let Some(m) = cache.get(src.name) {
            return Ok(m.clone());
        }
        let m = self.compile(src.name, src.code, &[])?;
        cache.insert(src.name, m.clone());
        Ok(m)
    }

    /// Compiles `code` (named `name` in errors and line tables) for this device with NVRTC and
    /// loads it, uncached: sources known only at run time (a peer's kernel read from its released
    /// package, in the benchmarks). `options` are added to this crate's own (`-std=c++17`, the
    /// architecture, `-lineinfo` when [`Gpu::set_line_info`] is on), e.g. `-I<dir>` or `-D<NAME>`.
    ///
    /// # Errors
    /// [`CudaError::Compile`] with NVRTC's log, [`CudaError::Driver`] on load failure.
    pub fn compile(
        &self,
        name: &'static str,
        code: &str,
        options: &[String],
    ) -> Result<Arc<CudaModule>> {
        // Real architecture first (sm_XY); if this NVRTC cannot hand back PTX for it, fall back
        // to the virtual one (compute_XY, JIT-compiled by the driver at load).
        let lineinfo = self.line_info.load(std::sync::atomic::Ordering::Relaxed);
        let compile = |arch: String| {
            let mut opts = vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()];
            if lineinfo {
                opts.push("-lineinfo".into());
            }
            opts.extend(options.iter().cloned());
            let opts = CompileOptions {
                options: opts,
                name: Some(format!("{name}.cu")),
                ..Default::default()
            };
            cudarc::nvrtc::compile_ptx_with_opts(code, opts)
        };
        let failed = |e: cudarc::nvrtc::CompileError| CudaError::Compile {
            module: name,
            log: format!("{e:?}"),
        };
        let ptx = match compile(self.arch()) {
            Ok(p) => p,
            Err(cudarc::nvrtc::CompileError::GetPtxError(_)) => {
                compile(format!("compute_{}{}", self.cc.0, self.cc.1)).map_err(failed)?
            }
            Err(e) => return Err(failed(e)),
        };
        self.ctx.load_module(ptx).map_err(drv("cuModuleLoadData"))
    }

    /// Source line tables in the modules compiled from now on (`-lineinfo`: compute-sanitizer
    /// and Nsight Compute then name `.cu` lines; the code generated is the same). Off by default;
    /// modules already loaded keep theirs.
    pub fn set_line_info(&self, on: bool) {
        self.line_info
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the step stream, or the caller's stream `other` (e.g. torch's current stream),
    /// is part of a CUDA graph capture (active or invalidated): host calls that synchronise or
    /// change tier state check this first. The legacy default stream (handle 0) cannot capture
    /// and is not queried (querying it during another stream's global capture would fail it).
    ///
    /// # Errors
    /// [`CudaError::Driver`] (`cuStreamGetCaptureInfo`).
    ///
    /// # Safety
    /// `other` is 0 or a live stream of this context.
    pub unsafe fn capturing(&self, other: u64) -> Result<bool> {
        let captures = |s: &CudaStream| -> Result<bool> {
            if s.cu_stream().is_null() {
                return Ok(false);
            }
            Ok(raw::capture_state(s)? != raw::Capture::None)
        };
        if captures(&self.stream)? {
            return Ok(true);
        }
        if other == 0 {
            return Ok(false);
        }
        // SAFETY: caller's contract (a live stream of this context).
        let s = unsafe { self.borrow_stream(other) }?;
        captures(&s)
    }

    /// Blocks until all work on the device has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(drv("cuCtxSynchronize"))
    }
}
