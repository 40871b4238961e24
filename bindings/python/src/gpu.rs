//! The GPU entry points of `tierkit._native` (cargo feature `cuda`), used by `tierkit.torch`.
//!
//! Everything here takes raw device pointers (a torch tensor's `data_ptr()`), shapes and strides
//! checked by `tierkit.torch` and again here, and a raw `CUstream` (`torch.cuda.current_stream()
//! .cuda_stream`, an int) to launch on. The launches never allocate, synchronise or create
//! streams, so they run inside a CUDA graph capture. They use the device's primary context (the
//! one PyTorch uses; cudarc's `CudaContext::new` retains it), bound to the calling thread before
//! each call.
//!
//! - [`count_topk`]: one layer's strided `topk_ids` into a caller's counts table under the
//!   caller's control block (`cuda_kernels::CountLauncher`).
//! - [`expert_slot_ids`]: the slot-id form of an expert table (`cuda_kernels::SlotIdLauncher`).
//! - [`PyGpuExpertBank`]: `expert_residency::GpuExecutor` (host store in mapped pinned memory, HBM
//!   slots, the device table; the host store and slots may be the caller's tensors), a swap
//!   executor for `tierkit.experts.Controller`.
//! - `PyGpuKvPool` (`gpu_kv.rs`): `kv_elastic::GpuElasticPool` (host calls: admit, append, finish, reclaim,
//!   between steps) and its device resolve into caller-owned outputs.
//!
//! The tier objects are opened with the caller's stream as their step stream
//! (`Gpu::with_step_stream`): flips and publishes are ordered with the engine's kernels on it.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use cuda_kernels::{
    ContextGuard, CountTarget, CudaError, DeviceBuffer, Gpu, IdsDtype, PinnedBuffer, SlotLayout,
    StridedIds,
};
use expert_residency::gpu::{CommitMode, ExpertBankGpu, GpuExecutor};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tierkit_bindings::DeviceOps;

use crate::experts::{PyController, PyPickCounters, PyResidencyMap};
use crate::ints::{int_arg, int_args};
use crate::{expert_err, guard, to_py, Slot};

/// Caller memory: the tensor's storage that owns it, its address, its bytes and (the host
/// store's) whether tierkit registers it.
type CallerMemory = (Py<PyAny>, u64, usize, bool);

/// A caller memory argument, `(owner, data_ptr, bytes)` or with `register` the host store's
/// `(owner, data_ptr, bytes, register)` (`None` when absent): a `TypeError` naming `name` unless
/// it is such a tuple, its ints read by [`int_arg`] as `name[1]` and `name[2]`.
pub(crate) fn memory_arg(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    with_register: bool,
) -> PyResult<Option<CallerMemory>> {
    let Some(o) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let n = if with_register { 4 } else { 3 };
    let t = o
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == n)
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{name} must be a tuple (owner, data_ptr, bytes{})",
                if with_register { ", register" } else { "" }
            ))
        })?;
    let ptr: u64 = int_arg(&t.get_item(1)?, &format!("{name}[1] (data_ptr)"))?;
    let bytes: usize = int_arg(&t.get_item(2)?, &format!("{name}[2] (bytes)"))?;
    let register = with_register && t.get_item(3)?.extract::<bool>()?;
    Ok(Some((t.get_item(0)?.unbind(), ptr, bytes, register)))
}

/// A caller's CUDA memory `(owner, data_ptr, bytes)` (`owner`: the tensor's storage) as device
/// memory of an object being built: `owner` is kept in `keep`, which the object holds for as
/// long as it uses the memory (the bank's slots: only the bank uses them; the pool's arena: the
/// pool owns its contents from then on). The range is checked by tierkit.torch and again by the driver (`DeviceBuffer::borrowed`).
pub(crate) fn borrow_device(
    gpu: &Gpu,
    keep: &mut Vec<Py<PyAny>>,
    mem: Option<CallerMemory>,
) -> PyResult<Option<DeviceBuffer<u8>>> {
    let Some((t, ptr, bytes, _)) = mem else {
        return Ok(None);
    };
    keep.push(t);
    // SAFETY: `ptr .. ptr + bytes` is the storage of the caller's contiguous CUDA tensor, now in
    // `keep`, which outlives every use of the returned buffer (see above).
    let buf = unsafe { DeviceBuffer::borrowed(gpu.ctx(), ptr, bytes) }.map_err(cuda_err)?;
    Ok(Some(buf))
}

/// A `cuda-kernels` error as a Python exception: bad shapes, dtypes, alignment and ranges are
/// `ValueError`, the rest (driver, compile, no device) `RuntimeError`.
pub(crate) fn cuda_err(e: CudaError) -> PyErr {
    match e {
        CudaError::Shape { .. }
        | CudaError::Dtype { .. }
        | CudaError::OutOfRange { .. }
        | CudaError::ForeignMemory { .. } => PyValueError::new_err(e.to_string()),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// [`expert_err`], except that caller memory the store refuses is a `ValueError`.
fn foreign_expert_err(e: expert_residency::ExpertError) -> PyErr {
    match e {
        expert_residency::ExpertError::Cuda(c @ CudaError::ForeignMemory { .. }) => cuda_err(c),
        e => expert_err(e),
    }
}

fn device(ordinal: usize) -> PyResult<Arc<DeviceOps>> {
    DeviceOps::get(ordinal).map_err(cuda_err)
}

fn ids_dtype(name: &str) -> PyResult<IdsDtype> {
    match name {
        "int32" => Ok(IdsDtype::I32),
        "int64" => Ok(IdsDtype::I64),
        other => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "topk_ids has dtype {other}, expected int32 or int64"
        ))),
    }
}

/// Whether this build has the GPU entry points (always true where this function exists with
/// `cuda`; the CPU build's `has_cuda_ops` returns false).
#[pyfunction]
fn has_cuda_ops() -> bool {
    true
}

/// [`guard`] for a GPU entry point: the calling thread's current CUDA context (PyTorch's, maybe of
/// another device) is saved first and made current again when the call returns, whatever it
/// bound meanwhile.
pub(crate) fn gpu_guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    guard(|| {
        let _restore = ContextGuard::save().map_err(cuda_err)?;
        f()
    })
}

/// Loads the kernels of device `device` (NVRTC compile at first use): call once before a CUDA
/// graph capture so no module loads inside it.
#[pyfunction]
fn warmup(device_index: &Bound<'_, PyAny>) -> PyResult<()> {
    int_args!(device_index: usize);
    gpu_guard(|| device(device_index).map(|_| ()))
}

/// Counts one layer's `topk_ids` (`[tokens, k]`, `dtype` "int32"/"int64", `row_stride`
/// elements between rows) at device address `ids` into layer `layer` of the caller's `uint32
/// [layers, experts]` table `counts`, out-of-range ids into `rejected` (one uint32), under the
/// control block `control` (`uint32 [4]`, read when the kernel runs: word 0 = enabled, 0 counts
/// nothing; word 1 = valid token rows, rows at or above it skipped, `u32::MAX` counts all; words
/// 2-3 reserved; address 0 = no block, count all), launched on `stream`.
#[pyfunction]
#[pyo3(signature = (device_index, stream, ids, dtype, tokens, k, row_stride, layer, counts, layers, experts, rejected, control))]
#[allow(clippy::too_many_arguments)]
fn count_topk(
    device_index: &Bound<'_, PyAny>,
    stream: &Bound<'_, PyAny>,
    ids: &Bound<'_, PyAny>,
    dtype: &str,
    tokens: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    row_stride: &Bound<'_, PyAny>,
    layer: &Bound<'_, PyAny>,
    counts: &Bound<'_, PyAny>,
    layers: &Bound<'_, PyAny>,
    experts: &Bound<'_, PyAny>,
    rejected: &Bound<'_, PyAny>,
    control: &Bound<'_, PyAny>,
) -> PyResult<()> {
    int_args!(
        device_index: usize,
        stream: u64,
        ids: u64,
        tokens: u32,
        k: u32,
        row_stride: u64,
        layer: u32,
        counts: u64,
        layers: u32,
        experts: u32,
        rejected: u64,
        control: u64
    );
    let dtype = ids_dtype(dtype)?;
    gpu_guard(|| {
        let d = device(device_index)?;
        let view = StridedIds {
            ptr: ids,
            dtype,
            tokens,
            k,
            row_stride,
        };
        let target = CountTarget {
            table: counts,
            rejected,
            control,
            layers,
            experts,
        };
        cuda_kernels::check_strided(&view, layer, &target).map_err(cuda_err)?;
        // SAFETY: `stream` is the caller's live stream of this device (torch's current stream).
        let s = unsafe { d.stream(stream) }.map_err(cuda_err)?;
        // SAFETY: the pointers come from live CUDA tensors of the shapes checked by
        // tierkit.torch (and by check_strided above); torch keeps them allocated until the
        // stream passes the launch (caching allocator, stream-ordered reuse).
        unsafe { d.count.launch(&s, &view, layer, &target) }.map_err(cuda_err)
    })
}

/// Writes the slot-id form of an expert table: `out[c]` (int32, `cells` of them) = the HBM slot
/// `table[c]` points at in layer `c / experts` (`slots_per_layer` slots of `slot_bytes` from
/// `hbm`), or -1 for a host read; launched on `stream`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn expert_slot_ids(
    device_index: &Bound<'_, PyAny>,
    stream: &Bound<'_, PyAny>,
    table: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    cells: &Bound<'_, PyAny>,
    experts: &Bound<'_, PyAny>,
    hbm: &Bound<'_, PyAny>,
    slot_bytes: &Bound<'_, PyAny>,
    slots_per_layer: &Bound<'_, PyAny>,
) -> PyResult<()> {
    int_args!(
        device_index: usize,
        stream: u64,
        table: u64,
        out: u64,
        cells: u32,
        experts: u32,
        hbm: u64,
        slot_bytes: u64,
        slots_per_layer: u32
    );
    gpu_guard(|| {
        let d = device(device_index)?;
        // SAFETY: the caller's live stream of this device.
        let s = unsafe { d.stream(stream) }.map_err(cuda_err)?;
        let layout = SlotLayout {
            hbm,
            slot_bytes,
            slots_per_layer,
        };
        // SAFETY: `table` (u64 [cells]) and `out` (int32 [cells]) are live device tensors
        // checked by tierkit.torch, kept allocated by torch until the stream passes the launch.
        unsafe { d.slots.launch(&s, table, out, cells, experts, layout) }.map_err(cuda_err)
    })
}

/// A tier object on a device: its [`Slot`] and the [`Gpu`] whose context is bound before each use.
///
/// `close()` marks the object closed (every method then raises `ClosedError`) but frees its
/// memory only when this Rust object is dropped, i.e. when the Python object and every view of
/// its memory (which hold it) are gone: a live view never points at freed memory. Captured CUDA
/// graphs hold no reference: destroy them before `close()`.
pub(crate) struct GpuSlot<T> {
    slot: Slot<T>,
    pub(crate) gpu: Arc<Gpu>,
    ordinal: usize,
    /// The value after `close()`, freed on drop.
    retired: Mutex<Option<T>>,
    /// The caller's tensors whose memory the value uses (engine-owned host store, slots or
    /// arena): released only after the value is dropped (fields drop after `Drop::drop`).
    keep: Vec<Py<PyAny>>,
}

impl<T> Drop for GpuSlot<T> {
    /// Frees the object (open or retired) with its context bound, after the device is idle
    /// (kernels queued before may still read its memory); errors cannot be reported here.
    fn drop(&mut self) {
        let _restore = ContextGuard::save();
        if self.gpu.ctx().bind_to_thread().is_ok() {
            let _ = self.gpu.synchronize();
        }
        // both taken here, so they drop while the context is bound (not after, as fields)
        let open = self.slot.take().ok().flatten();
        let retired = self.retired.get_mut().map(Option::take);
        let _ = catch_unwind(AssertUnwindSafe(move || drop((open, retired))));
    }
}

/// torch's current stream of device `ordinal` (`torch.cuda.current_stream(ordinal).cuda_stream`),
/// or 0 when torch is not imported (then nothing captures through it).
fn torch_current_stream(py: Python<'_>, ordinal: usize) -> PyResult<u64> {
    let modules = py.import("sys")?.getattr("modules")?;
    let Ok(torch) = modules.get_item("torch") else {
        return Ok(0);
    };
    torch
        .getattr("cuda")?
        .call_method1("current_stream", (ordinal,))?
        .getattr("cuda_stream")?
        .extract()
}

impl<T> GpuSlot<T> {
    pub(crate) fn new(name: &'static str, value: T, gpu: Arc<Gpu>, ordinal: usize) -> Self {
        GpuSlot {
            slot: Slot::new(name, value),
            gpu,
            ordinal,
            retired: Mutex::new(None),
            keep: Vec::new(),
        }
    }
    /// Keeps `tensors` alive until the value is dropped (their memory backs it).
    pub(crate) fn keeping(mut self, tensors: Vec<Py<PyAny>>) -> Self {
        self.keep = tensors;
        self
    }
    /// Refuses a host call (`what`) while the object's step stream or torch's current stream of
    /// its device is capturing a CUDA graph: checked here, so it holds whichever way the call
    /// comes (a `tierkit.torch` method, `Controller.step`, the native object).
    pub(crate) fn refuse_capture(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        let _restore = ContextGuard::save().map_err(cuda_err)?;
        let current = torch_current_stream(py, self.ordinal)?;
        // SAFETY: torch's current stream of this device is a live stream of its primary context
        // (the context this Gpu holds), alive for the duration of the call.
        if unsafe { self.gpu.capturing(current) }.map_err(cuda_err)? {
            return Err(PyRuntimeError::new_err(format!(
                "{what} synchronises or changes tier state on the host and cannot run while the \
                 step stream or the current stream is capturing a CUDA graph; call it between \
                 replays"
            )));
        }
        Ok(())
    }
    /// [`GpuSlot::with`] for a host call: refused during a capture ([`GpuSlot::refuse_capture`]).
    pub(crate) fn host<R>(
        &self,
        py: Python<'_>,
        what: &str,
        f: impl FnOnce(&mut T) -> PyResult<R>,
    ) -> PyResult<R> {
        self.refuse_capture(py, what)?;
        self.with(f)
    }
    /// Runs `f` on the object with the device's context bound to this thread (the thread's
    /// previous context is current again when it returns).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> PyResult<R>) -> PyResult<R> {
        let _restore = ContextGuard::save().map_err(cuda_err)?;
        self.gpu
            .ctx()
            .bind_to_thread()
            .map_err(|e| cuda_err(CudaError::driver("cuCtxSetCurrent", e)))?;
        self.slot.with(f)
    }
    /// Waits for the device (kernels queued may still use the object), then marks it closed;
    /// its memory is freed when the last owner (the Python object, a view) is gone (see the
    /// type's docs). A failed synchronize is raised and the object stays open.
    pub(crate) fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.slot.is_closed() {
            return self.slot.close();
        }
        self.refuse_capture(py, "close")?;
        let _restore = ContextGuard::save().map_err(cuda_err)?;
        self.gpu
            .ctx()
            .bind_to_thread()
            .map_err(|e| cuda_err(CudaError::driver("cuCtxSetCurrent", e)))?;
        self.gpu.synchronize().map_err(cuda_err)?;
        if let Some(v) = self.slot.take()? {
            let mut retired = self
                .retired
                .lock()
                .map_err(|_| PyRuntimeError::new_err("retired lock poisoned"))?;
            *retired = Some(v);
        }
        Ok(())
    }
    pub(crate) fn is_closed(&self) -> bool {
        self.slot.is_closed()
    }
}

/// The GPU expert bank (`expert_residency::GpuExecutor`): every expert in mapped pinned host
/// memory (readable in place by kernels: its device address is `host_ptr`), the hot ones in
/// `hot_per_layer + 1` HBM slots per layer, and the device table `u64 [layers, experts]` of
/// addresses at `table_ptr`. Flips are ordered on `stream` (the engine's step stream, kept alive
/// by the caller as long as the bank). Usable as the executor of `Controller.step`.
#[pyclass(name = "GpuExpertBank", module = "tierkit.torch", frozen, weakref)]
pub(crate) struct PyGpuExpertBank(GpuSlot<GpuExecutor>);

impl PyGpuExpertBank {
    /// Runs `f` on the executor with the context bound.
    fn with<R>(&self, f: impl FnOnce(&mut GpuExecutor) -> PyResult<R>) -> PyResult<R> {
        self.0.with(f)
    }
}

#[pymethods]
impl PyGpuExpertBank {
    /// `Controller.step(counters, bank)` with this bank as the executor (called by
    /// `Controller.step`, not public API): refused during a capture
    /// ([`GpuSlot::refuse_capture`]); returns the step report as a dict.
    fn _controller_step<'py>(
        &self,
        py: Python<'py>,
        controller: &PyController,
        counters: &PyPickCounters,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.0
            .refuse_capture(py, "Controller.step with a GPU bank")?;
        let report = controller.step_on(counters, |ctl, c| {
            self.0.with(|e| ctl.step(c, e).map_err(expert_err))
        })?;
        to_py(py, &report)
    }

    /// Allocates the bank for `map`'s geometry on device `device_index` (host experts zeroed;
    /// write them through the host view, then `reload(map)`), step stream `stream`.
    ///
    /// Engine-owned memory: `host = (owner, data_ptr, bytes, register)` serves the experts from
    /// the caller's host range in place (its bytes are the weights; the boot map is loaded from
    /// them at once), pinned and mapped by tierkit when `register` (unregistered on drop), else
    /// checked to be; `slots = (owner, data_ptr, bytes)` puts the HBM slots in the caller's
    /// device range. `owner` (tierkit.torch passes the tensor's untyped storage) is kept alive as
    /// long as the bank. A range the driver refuses (not pinned, misaligned, too short, another
    /// device) is a `ValueError`; overlap with another tierkit object is checked by tierkit.torch.
    #[new]
    #[pyo3(
        signature = (map, device_index, stream, threads = None, host = None, slots = None),
        text_signature = "(map, device_index, stream, threads=4, host=None, slots=None)"
    )]
    fn new(
        map: &PyResidencyMap,
        device_index: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyAny>,
        threads: Option<&Bound<'_, PyAny>>,
        host: Option<&Bound<'_, PyAny>>,
        slots: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        int_args!(device_index: usize, stream: u64, threads: usize = 4);
        let host = memory_arg(host, "host", true)?;
        let slots = memory_arg(slots, "slots", false)?;
        gpu_guard(|| {
            // SAFETY: `stream` is the caller's live stream of this device, kept alive as long as
            // the bank (tierkit.torch holds the torch.cuda.Stream object).
            let gpu = unsafe { Gpu::with_step_stream(device_index, stream) }.map_err(cuda_err)?;
            let mut keep = Vec::new();
            let ex = if host.is_none() && slots.is_none() {
                GpuExecutor::new(
                    &gpu,
                    gpu.stream().clone(),
                    &map.0,
                    threads.max(1),
                    |_, _, b| b.fill(0),
                )
                .map_err(expert_err)?
            } else {
                let host = match host {
                    Some((t, ptr, bytes, register)) => {
                        keep.push(t);
                        // SAFETY: `ptr .. ptr + bytes` is the storage of the caller's contiguous
                        // CPU tensor `t` (checked by tierkit.torch), kept alive in `keep` for as
                        // long as the bank; the bank is its only writer (the caller's contract,
                        // documented on `tierkit.torch.ExpertBank`).
                        Some(
                            unsafe {
                                PinnedBuffer::borrowed(gpu.ctx(), ptr as *mut u8, bytes, register)
                            }
                            .map_err(cuda_err)?,
                        )
                    }
                    None => None,
                };
                let slots = borrow_device(&gpu, &mut keep, slots)?;
                let bank = ExpertBankGpu::with_memory(&gpu, *map.0.geometry(), host, slots)
                    .map_err(foreign_expert_err)?;
                GpuExecutor::with_bank(bank, gpu.stream().clone(), &map.0).map_err(expert_err)?
            };
            Ok(PyGpuExpertBank(
                GpuSlot::new("GpuExpertBank", ex, gpu, device_index).keeping(keep),
            ))
        })
    }
    /// `{layers, experts, hot_per_layer, slots_per_layer, expert_bytes, table_ptr, host_ptr,
    /// hbm_ptr}`: the addresses are fixed for the bank's life (graph-safe).
    fn layout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (g, table, host, hbm) = self.with(|e| {
            let st = e.bank().store();
            Ok((
                st.geometry(),
                e.table_ptr(),
                st.host_device_ptr(0, 0),
                st.slot_ptr(0, 0),
            ))
        })?;
        let d = PyDict::new(py);
        d.set_item("layers", g.layers)?;
        d.set_item("experts", g.experts_per_layer)?;
        d.set_item("hot_per_layer", g.hot_per_layer)?;
        d.set_item("slots_per_layer", g.slots_per_layer())?;
        d.set_item("expert_bytes", g.expert_bytes)?;
        d.set_item("table_ptr", table)?;
        d.set_item("host_ptr", host)?;
        d.set_item("hbm_ptr", hbm)?;
        Ok(d)
    }
    /// Loads `map` synchronously (copies its hot experts from the host store into HBM and
    /// rewrites the table): after writing host experts, or to switch maps. Refused while swaps
    /// are in flight, unless `cancel_in_flight` (they are then dropped unflipped first: make a
    /// new controller for the loaded map).
    #[pyo3(signature = (map, cancel_in_flight = false))]
    fn reload(&self, py: Python<'_>, map: &PyResidencyMap, cancel_in_flight: bool) -> PyResult<()> {
        self.0.host(py, "GpuExpertBank.reload", |e| {
            if cancel_in_flight {
                e.cancel_in_flight().map_err(expert_err)?;
            }
            e.load_map(&map.0).map_err(expert_err)
        })
    }
    /// "deferred" (default: copies still running at a boundary stay in flight) or "wait".
    fn set_commit_mode(&self, mode: &str) -> PyResult<()> {
        let m = match mode {
            "deferred" => CommitMode::Deferred,
            "wait" => CommitMode::Wait,
            other => {
                return Err(PyValueError::new_err(format!(
                    "commit mode {other:?}: expected \"deferred\" or \"wait\""
                )))
            }
        };
        self.with(|e| {
            e.set_commit_mode(m);
            Ok(())
        })
    }
    /// Whether `(layer, expert)` is in an HBM slot now.
    fn is_hot(&self, layer: &Bound<'_, PyAny>, expert: &Bound<'_, PyAny>) -> PyResult<bool> {
        int_args!(layer: u32, expert: u32);
        self.with(|e| Ok(e.bank().is_hot(layer, expert)))
    }
    /// The HBM slot of each hot expert of `layer` as `{expert: slot}`.
    fn slots_of(&self, layer: &Bound<'_, PyAny>) -> PyResult<HashMap<u32, u32>> {
        int_args!(layer: u32);
        self.with(|e| {
            let b = e.bank();
            let slots = b.store().geometry().slots_per_layer();
            Ok((0..slots)
                .filter_map(|s| b.expert_in_slot(layer, s).map(|x| (x, s)))
                .collect())
        })
    }
    /// Closes the bank after the device is idle: methods raise `ClosedError` after; its HBM and
    /// pinned memory are freed when the bank object and every view of them are gone. Destroy
    /// captured graphs that use the bank before. Refused during a capture.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.0.close(py)
    }
    #[getter]
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Registers the GPU entry points.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(has_cuda_ops, m)?)?;
    m.add_function(wrap_pyfunction!(warmup, m)?)?;
    m.add_function(wrap_pyfunction!(count_topk, m)?)?;
    m.add_function(wrap_pyfunction!(expert_slot_ids, m)?)?;
    m.add_class::<PyGpuExpertBank>()?;
    Ok(())
}
