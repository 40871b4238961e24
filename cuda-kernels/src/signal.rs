//! [`EventSignal`]: a `tier-core` [`CompletionSignal`] backed by a CUDA event, so GPU readers can
//! hold back reclamation in an [`tier_core::EpochFence`] (`enter_signal`) exactly like CPU readers.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};
use tier_core::CompletionSignal;

use crate::device::Gpu;
use crate::error::{drv, Result};

/// A CUDA event recorded on a stream after the GPU work that reads some pages; complete once
/// that work has finished. Cheap to clone (shared event).
#[derive(Debug, Clone)]
pub struct EventSignal {
    event: Arc<CudaEvent>,
}

impl EventSignal {
    /// Records a new event on `stream` (after everything queued there so far).
    ///
    /// # Errors
    /// [`crate::CudaError::Driver`] if the event cannot be created or recorded.
    pub fn record(gpu: &Gpu, stream: &CudaStream) -> Result<Self> {
        let event = gpu.ctx().new_event(None).map_err(drv("cuEventCreate"))?;
        event.record(stream).map_err(drv("cuEventRecord"))?;
        Ok(EventSignal {
            event: Arc::new(event),
        })
    }

    /// Whether the recorded work has completed (non-blocking), or the CUDA error of the query.
    pub fn try_complete(&self) -> Result<bool> {
        self.event.try_is_complete().map_err(drv("cuEventQuery"))
    }

    /// The underlying event (e.g. for `cuStreamWaitEvent` on another stream).
    pub fn event(&self) -> &CudaEvent {
        &self.event
    }
}

impl CompletionSignal for EventSignal {
    /// `false` while the work runs, and also if the query fails (a broken context): memory a
    /// reader may still touch is never handed back on an error.
    fn is_complete(&self) -> bool {
        self.try_complete().unwrap_or(false)
    }
}
