//! The GPU entry points (`*_cuda`): launches on the caller's stream (`void *stream`, a
//! `cudaStream_t` / `CUstream`; NULL = the legacy default stream) into caller-owned device memory,
//! in the device's primary context (the CUDA runtime's). They never allocate, synchronise or
//! create streams, so they may be captured in a CUDA graph. Always in the header; a build without
//! the cargo feature `cuda` returns `TIERKIT_ERR_UNSUPPORTED` from each.

use std::ffi::c_void;

use crate::ffi::{call, TierkitCode, TierkitError};

/// `topk_ids` element type tag: `int32_t`.
pub const TIERKIT_IDS_INT32: u32 = 0;
/// `topk_ids` element type tag: `int64_t` (PyTorch's `topk` index type).
pub const TIERKIT_IDS_INT64: u32 = 1;

/// Counts one layer's router output on the GPU: `ids` is `[tokens, k]` device memory of type
/// `ids_dtype` (`TIERKIT_IDS_INT32` / `TIERKIT_IDS_INT64`) with `row_stride` elements between
/// rows (`>= k`; llama.cpp's strided `ffn_moe_topk` view), column stride 1. Each valid id `e`
/// adds 1 to `counts[layer * experts + e]` (`uint32_t [layers][experts]`, device), an id
/// outside `0 .. experts` adds 1 to `*rejected` (device). `control` (device `uint32_t [4]`:
/// enabled, valid tokens, 0, 0; NULL = count all) is read when the kernel runs: nothing is counted
/// while `control[0] == 0`, and token rows `>= control[1]` (padding) are skipped, so a captured
/// graph sees the values written before each replay. Enqueued on `stream` on device `device`.
///
/// Errors: `TIERKIT_ERR_UNSUPPORTED` (built without CUDA); `TIERKIT_ERR_NULL_ARGUMENT` (ids,
/// counts or rejected NULL); `TIERKIT_ERR_TYPE_MISMATCH` (unknown `ids_dtype`);
/// `TIERKIT_ERR_INVALID_ARGUMENT` (zero extents, `row_stride < k`, `tokens * k` above
/// `UINT32_MAX`, `layer >= layers`, `device` at or above the device count);
/// `TIERKIT_ERR_LAYOUT` (a pointer misaligned for its type); `TIERKIT_ERR_STATE` (libcuda or
/// libnvrtc missing, or no CUDA device at all); `TIERKIT_ERR_INTERNAL` (a CUDA error, named in
/// the message).
///
/// # Safety
/// `stream` is NULL or a live stream of device `device`'s primary context; the device pointers
/// address allocations of the documented sizes that stay allocated until the stream passes the
/// launch; `err` is NULL or valid for one pointer write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tierkit_count_topk_cuda(
    device: u32,
    stream: *mut c_void,
    ids: *const c_void,
    ids_dtype: u32,
    tokens: u32,
    k: u32,
    row_stride: u64,
    layer: u32,
    counts: *mut u32,
    layers: u32,
    experts: u32,
    rejected: *mut u32,
    control: *const u32,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    let args = imp::CountArgs {
        device,
        stream: stream as u64,
        ids: ids as u64,
        ids_dtype,
        tokens,
        k,
        row_stride,
        layer,
        counts: counts as u64,
        layers,
        experts,
        rejected: rejected as u64,
        control: control as u64,
    };
    // SAFETY: `err` per this function's contract; the pointers are forwarded to a launch whose
    // safety is this function's contract.
    unsafe { call(err, || imp::count_topk(&args)) }
}

/// The slot-id form of an expert table (for engines that index a stacked slot tensor instead of
/// following pointers): `out[c]` (`int32_t [cells]`, device) = the HBM slot `table[c]` (`uint64_t
/// [cells]` device addresses, row-major `[layers][experts]`) points at in layer `c / experts`
/// (`slots_per_layer` slots of `slot_bytes` from `hbm`, layer after layer), or -1 where it points
/// elsewhere (the expert's host copy, read in place). Enqueued on `stream` on device `device`.
///
/// Errors: `TIERKIT_ERR_UNSUPPORTED` (built without CUDA); `TIERKIT_ERR_NULL_ARGUMENT`;
/// `TIERKIT_ERR_INVALID_ARGUMENT` (zero `cells`, `experts` or `slot_bytes`);
/// `TIERKIT_ERR_LAYOUT` (misaligned pointers); `TIERKIT_ERR_STATE` / `TIERKIT_ERR_INTERNAL` as
/// `tierkit_count_topk_cuda`.
///
/// # Safety
/// As `tierkit_count_topk_cuda`: `table` and `out` hold `cells` elements of device memory.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tierkit_expert_slot_ids_cuda(
    device: u32,
    stream: *mut c_void,
    table: *const u64,
    out: *mut i32,
    cells: u32,
    experts: u32,
    hbm: u64,
    slot_bytes: u64,
    slots_per_layer: u32,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    let args = imp::SlotArgs {
        device,
        stream: stream as u64,
        table: table as u64,
        out: out as u64,
        cells,
        experts,
        hbm,
        slot_bytes,
        slots_per_layer,
    };
    // SAFETY: as tierkit_count_topk_cuda.
    unsafe { call(err, || imp::slot_ids(&args)) }
}

/// Whether this library was built with the GPU entry points (`true`) or they return
/// `TIERKIT_ERR_UNSUPPORTED` (`false`).
#[no_mangle]
pub extern "C" fn tierkit_has_cuda() -> bool {
    cfg!(feature = "cuda")
}

/// The arguments of the entry points, as plain integers (addresses), for the two builds (only
/// the CUDA build reads them).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod args {
    pub(crate) struct CountArgs {
        pub(crate) device: u32,
        pub(crate) stream: u64,
        pub(crate) ids: u64,
        pub(crate) ids_dtype: u32,
        pub(crate) tokens: u32,
        pub(crate) k: u32,
        pub(crate) row_stride: u64,
        pub(crate) layer: u32,
        pub(crate) counts: u64,
        pub(crate) layers: u32,
        pub(crate) experts: u32,
        pub(crate) rejected: u64,
        pub(crate) control: u64,
    }

    pub(crate) struct SlotArgs {
        pub(crate) device: u32,
        pub(crate) stream: u64,
        pub(crate) table: u64,
        pub(crate) out: u64,
        pub(crate) cells: u32,
        pub(crate) experts: u32,
        pub(crate) hbm: u64,
        pub(crate) slot_bytes: u64,
        pub(crate) slots_per_layer: u32,
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    pub(crate) use super::args::{CountArgs, SlotArgs};
    use crate::ffi::{fail, R};
    use tierkit_bindings::Code;

    fn unsupported() -> R<()> {
        Err(fail(
            Code::Unsupported,
            "tierkit was built without CUDA (the cargo feature `cuda` of tierkit-c)",
        ))
    }

    pub(crate) fn count_topk(_: &CountArgs) -> R<()> {
        unsupported()
    }

    pub(crate) fn slot_ids(_: &SlotArgs) -> R<()> {
        unsupported()
    }
}

#[cfg(feature = "cuda")]
mod imp {
    pub(crate) use super::args::{CountArgs, SlotArgs};
    use super::{TIERKIT_IDS_INT32, TIERKIT_IDS_INT64};
    use crate::ffi::{fail, Fail, R};
    use cuda_kernels::{
        check_strided, ContextGuard, CountTarget, CudaError, IdsDtype, SlotLayout, StridedIds,
    };
    use tierkit_bindings::{Code, DeviceOps};

    fn classify(e: CudaError) -> Fail {
        let code = match &e {
            CudaError::Shape { .. } | CudaError::OutOfRange { .. } => Code::InvalidArgument,
            CudaError::Dtype { .. } => Code::Layout,
            CudaError::NoDevice(_) => Code::State,
            _ => Code::Internal,
        };
        fail(code, e.to_string())
    }

    fn nonnull(p: u64, what: &str) -> R<()> {
        if p == 0 {
            return Err(fail(Code::NullArgument, format!("{what} is NULL")));
        }
        Ok(())
    }

    pub(crate) fn count_topk(a: &CountArgs) -> R<()> {
        nonnull(a.ids, "ids")?;
        nonnull(a.counts, "counts")?;
        nonnull(a.rejected, "rejected")?;
        let dtype = match a.ids_dtype {
            TIERKIT_IDS_INT32 => IdsDtype::I32,
            TIERKIT_IDS_INT64 => IdsDtype::I64,
            other => {
                return Err(fail(
                    Code::TypeMismatch,
                    format!("ids_dtype {other}: expected TIERKIT_IDS_INT32 or TIERKIT_IDS_INT64"),
                ))
            }
        };
        let view = StridedIds {
            ptr: a.ids,
            dtype,
            tokens: a.tokens,
            k: a.k,
            row_stride: a.row_stride,
        };
        let target = CountTarget {
            table: a.counts,
            rejected: a.rejected,
            control: a.control,
            layers: a.layers,
            experts: a.experts,
        };
        check_strided(&view, a.layer, &target).map_err(classify)?;
        // the caller's current context is current again when this returns
        let _restore = ContextGuard::save().map_err(classify)?;
        let ops = DeviceOps::get(a.device as usize).map_err(classify)?;
        // SAFETY: the caller's live stream of this device (entry point contract).
        let s = unsafe { ops.stream(a.stream) }.map_err(classify)?;
        // SAFETY: the caller's device memory of the documented sizes (entry point contract).
        unsafe { ops.count.launch(&s, &view, a.layer, &target) }.map_err(classify)
    }

    pub(crate) fn slot_ids(a: &SlotArgs) -> R<()> {
        nonnull(a.table, "table")?;
        nonnull(a.out, "out")?;
        let _restore = ContextGuard::save().map_err(classify)?;
        let ops = DeviceOps::get(a.device as usize).map_err(classify)?;
        // SAFETY: the caller's live stream of this device (entry point contract).
        let s = unsafe { ops.stream(a.stream) }.map_err(classify)?;
        let layout = SlotLayout {
            hbm: a.hbm,
            slot_bytes: a.slot_bytes,
            slots_per_layer: a.slots_per_layer,
        };
        // SAFETY: `table` / `out` hold `cells` elements of the caller's device memory.
        unsafe {
            ops.slots
                .launch(&s, a.table, a.out, a.cells, a.experts, layout)
        }
        .map_err(classify)
    }
}
