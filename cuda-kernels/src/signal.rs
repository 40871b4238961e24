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

    /// A signal whose event is not recorded yet: complete (and a stream waiting on it does not
    /// wait) until [`EventSignal::rerecord`] puts it after some work.
    ///
    /// # Errors
    /// [`crate::CudaError::Driver`] if the event cannot be created.
    pub fn unrecorded(gpu: &Gpu) -> Result<Self> {
        let event = gpu.ctx().new_event(None).map_err(drv("cuEventCreate"))?;
        Ok(EventSignal {
            event: Arc::new(event),
        })
    }

    /// Records the event again, on `stream` after everything queued there so far. Every clone
    /// shares the event, so every clone now reports the new recording (recorded again on the
    /// same stream, that only ever completes later: a reader fence holding a clone stays safe).
    ///
    /// # Errors
    /// [`crate::CudaError::Driver`] if the record fails (the previous recording stands).
    pub fn rerecord(&self, stream: &CudaStream) -> Result<()> {
        self.event.record(stream).map_err(drv("cuEventRecord"))
    }

    /// Makes `stream` wait (on the GPU, the host never blocks) for the recorded work; a no-op
    /// for a signal never recorded.
    ///
    /// # Errors
    /// [`crate::CudaError::Driver`] if the wait cannot be enqueued.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        stream.wait(&self.event).map_err(drv("cuStreamWaitEvent"))
    }

    /// Whether the recorded work has completed (non-blocking). `false` also when a stream capture
    /// forbids the query now ([`crate::CudaError::is_capture_conflict`]: e.g. another thread
    /// captures in global mode; the context is healthy, ask again after the capture), so every
    /// poller (the KV pool's deferred maps, the expert bank's deferred commits) reads it as "not
    /// yet".
    ///
    /// # Errors
    /// [`crate::CudaError::Driver`] for any other failed query (a broken context).
    pub fn try_complete(&self) -> Result<bool> {
        match self.event.try_is_complete().map_err(drv("cuEventQuery")) {
            Err(e) if e.is_capture_conflict() => Ok(false),
            r => r,
        }
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
