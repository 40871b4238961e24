//! The crate's error type: every failure is a typed value, CUDA failures carry the CUDA error name.

use cudarc::driver::DriverError;

/// Errors of `cuda-kernels`. Nothing in this crate panics on caller input; state is left as it
/// was before the failing call, except where a call documents otherwise
/// (`PickCounterGpu::count_forked` after a CUDA error past its fork, `join_forked` dropping a
/// fork whose capture has ended).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA device (no libcuda / libnvrtc, or zero devices).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed; `name` is the CUDA error name, e.g. `CUDA_ERROR_INVALID_VALUE`.
    #[error("CUDA call {call} failed: {name}")]
    Driver {
        /// The driver call (or our operation) that failed.
        call: &'static str,
        /// The CUDA error name (`CUresult` variant), e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
    },
    /// NVRTC failed to compile one of the crate's `.cu` modules.
    #[error("NVRTC compile of module {module} failed: {log}")]
    Compile {
        /// Module name (the `.cu` file).
        module: &'static str,
        /// The compiler log or error.
        log: String,
    },
    /// A buffer or table has the wrong shape (element counts).
    #[error("shape mismatch for {what}: expected {expected}, got {got}")]
    Shape {
        /// Which argument.
        what: &'static str,
        /// Expected element count or extent.
        expected: u64,
        /// Given element count or extent.
        got: u64,
    },
    /// A raw view declares a dtype the operation does not accept.
    #[error("dtype mismatch for {what}: expected {expected}, got {got}")]
    Dtype {
        /// Which argument.
        what: &'static str,
        /// Accepted dtype(s).
        expected: &'static str,
        /// Given dtype.
        got: &'static str,
    },
    /// An index argument is out of range.
    #[error("{what} out of range: {value} (limit {limit})")]
    OutOfRange {
        /// Which index (layer, expert, slot, ...).
        what: &'static str,
        /// The given value.
        value: u64,
        /// The exclusive upper bound.
        limit: u64,
    },
    /// An index appears twice where each must be distinct (e.g. one table-update batch).
    #[error("{what} {value} given twice")]
    Duplicate {
        /// Which index.
        what: &'static str,
        /// The repeated value.
        value: u64,
    },
    /// The residency state a caller keeps does not allow the request (used by the KV tier's
    /// GPU back-end).
    #[error("invalid residency request for layer {layer}: {reason}")]
    Residency {
        /// Layer of the request.
        layer: u32,
        /// What was wrong.
        reason: &'static str,
    },
    /// An asynchronous operation is still in flight (e.g. a drain whose copy has not completed).
    #[error("operation still in flight: {0}")]
    InFlight(&'static str),
    /// Caller-owned memory handed to tierkit is unusable: misaligned, too small, on another
    /// device, or not device-accessible (pinned and mapped, or device memory).
    #[error("caller memory {what}: {reason}")]
    ForeignMemory {
        /// Which buffer.
        what: &'static str,
        /// What was wrong (with the numbers).
        reason: String,
    },
    /// A fork and its join do not belong to the same CUDA graph capture (or both to none).
    #[error("stream capture mismatch: {0}")]
    Capture(&'static str),
}

/// Result alias of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

impl CudaError {
    /// Wraps a cudarc driver error with the call that produced it.
    pub fn driver(call: &'static str, e: DriverError) -> Self {
        // `CUresult` derives Debug, which prints the variant name (CUDA_ERROR_...): no FFI needed.
        CudaError::Driver {
            call,
            name: format!("{:?}", e.0),
        }
    }

    /// The CUDA error name if this is a driver error.
    pub fn cuda_name(&self) -> Option<&str> {
        match self {
            CudaError::Driver { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Whether this driver error only says that a stream capture forbids the call now
    /// (`CUDA_ERROR_STREAM_CAPTURE_*`, `CUDA_ERROR_CAPTURED_EVENT`), e.g. a query made while
    /// another thread captures in global mode: the context is healthy, retry after the capture.
    pub fn is_capture_conflict(&self) -> bool {
        self.cuda_name().is_some_and(|n| {
            n.starts_with("CUDA_ERROR_STREAM_CAPTURE") || n == "CUDA_ERROR_CAPTURED_EVENT"
        })
    }
}

/// `map_err` helper: `.map_err(drv("cuMemAlloc"))`.
pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::driver(call, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;

    #[test]
    fn driver_error_carries_cuda_name() {
        let e = CudaError::driver(
            "cuMemAlloc",
            DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        );
        assert_eq!(e.cuda_name(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(e.to_string().contains("cuMemAlloc"));
        assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(!e.is_capture_conflict());
        for r in [
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            CUresult::CUDA_ERROR_CAPTURED_EVENT,
        ] {
            assert!(CudaError::driver("cuEventQuery", DriverError(r)).is_capture_conflict());
        }
        assert!(!CudaError::driver(
            "cuEventQuery",
            DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
        )
        .is_capture_conflict());
    }
}
