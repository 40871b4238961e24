//! [`ReadTicket`]: a resolve's reader registration in the pool's reader fence.
//!
//! Orderings. A resolve registers a completion signal in the fence (`EpochFence::enter_signal`)
//! before it returns, so every page it mapped into the returned indices stays allocated until that
//! signal completes: a later reclaim or hand-back only moves the page to *pending*, and
//! `collect` frees it once every signal registered before the reclaim is complete.
//!
//! - CPU back-end ([`crate::ElasticPool`]): the signal is a `tier_core::FlagSignal`; ending the
//!   ticket (drop or [`ReadTicket::complete`]) sets it (release store; `collect` reads it with an
//!   acquire load). End it once the host code that reads the indices is done.
//! - GPU back-end (`gpu::GpuElasticPool`, feature `cuda`): the signal is a CUDA event
//!   (`cuda_kernels::EventSignal`). Ending the ticket records the event on the step stream, after
//!   every kernel queued there so far: end it right after queueing the kernels that read the
//!   indices (attention of every layer of the group). The fence clears when the GPU passes the
//!   event, not when the host ends the ticket. If the event cannot be recorded, the ticket waits
//!   for the device instead (stream synchronize); if that fails too, the pages stay pending for
//!   good (memory a reader may still touch is never reused).

use std::fmt;

use tier_core::{EpochFence, FlagSignal};

/// How one back-end ends a ticket (see the module docs).
pub(crate) trait TicketEnd: Send + fmt::Debug {
    /// Ends the read: from now on the registered signal may complete.
    fn end(self: Box<Self>);
}

#[derive(Debug)]
struct HostEnd(FlagSignal);

impl TicketEnd for HostEnd {
    fn end(self: Box<Self>) {
        self.0.complete();
    }
}

/// A reader in flight: the indices of one resolve stay valid (their pages are not reused) until
/// this ticket ends (dropped or [`ReadTicket::complete`]) and, on the GPU back-end, the step stream
/// passes the point where it ended. See the module docs of `ticket` for the orderings.
#[must_use = "dropping the ticket ends the read; keep it until the kernels that read the indices are queued (GPU) or done (CPU)"]
#[derive(Debug)]
pub struct ReadTicket(Option<Box<dyn TicketEnd>>);

impl ReadTicket {
    /// Registers a host reader in `fence` (CPU back-end).
    pub(crate) fn host(fence: &EpochFence) -> Self {
        let signal = FlagSignal::new();
        fence.enter_signal(Box::new(signal.clone()));
        ReadTicket(Some(Box::new(HostEnd(signal))))
    }

    /// A ticket ended by `end` (the caller registered the matching signal in the fence).
    #[cfg(feature = "cuda")]
    pub(crate) fn with_end(end: Box<dyn TicketEnd>) -> Self {
        ReadTicket(Some(end))
    }

    /// Ends the read (same as dropping the ticket).
    pub fn complete(self) {}
}

impl Drop for ReadTicket {
    fn drop(&mut self) {
        if let Some(end) = self.0.take() {
            end.end();
        }
    }
}
