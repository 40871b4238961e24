//! The count forked onto the counter's branch stream ([`PickCounterGpu::count_forked`] /
//! [`PickCounterGpu::join_forked`]).

use cudarc::driver::CudaStream;

use super::gpu::order_after;
use super::{PickCounterGpu, TopkIdsView};
use crate::error::{drv, CudaError, Result};
use crate::raw::{capture_state, Capture};

impl PickCounterGpu {
    /// Counts `ids` as [`PickCounterGpu::count_raw`] does, but on the counter's own branch
    /// stream, forked from `stream` at this point of its work: the count runs concurrently with
    /// whatever `stream` runs next, until [`PickCounterGpu::join_forked`] makes `stream` wait for
    /// it. Fork and join are event record/wait pairs, so both can be captured in a CUDA graph
    /// with the step (capture `stream`; the branch joins the capture through the fork event).
    ///
    /// Use: when the router of each MoE layer writes its `topk_ids` into its own slice of one
    /// `[layers, tokens, k]` step buffer, fork the count of layers `0 ..= layers - 2` right
    /// before the last MoE layer's router, let that router count its own picks with the fused
    /// header (`tierkit_count_pick_striped`), and join at the end of the step. Measured on the
    /// H200 (stand-in routers, 40 layers × 256 tokens × top-6 of 64, CUDA graph, five
    /// machines): 0.18–0.45 µs added per 40-layer step, against 4.5–5.3 µs for the fused call in
    /// every router and 2.4–2.5 µs for the same count launched on `stream` after the last router
    /// (`benches/README.md`, "Forked count"). Engines without this API do the same with two
    /// events and a second stream (record on the step stream, the branch waits, launch
    /// `tierkit_count_i32` / `_i64` of `count.cu` on the branch, record on the branch, the step
    /// stream waits).
    ///
    /// Rules:
    /// - The branch only reads `ids`: nothing may write or free them before the join (with
    ///   PyTorch, keep the tensor alive and unused until then: the caching allocator does not
    ///   know the branch stream).
    /// - Fork and join in the same capture, or both outside any capture: `join_forked` checks
    ///   it ([`CudaError::Capture`]). A capture that ends without the join fails (CUDA reports
    ///   an unjoined branch); the next `join_forked` then drops that fork, which never ran.
    /// - A captured graph holds the table's and the ids' addresses: the counter and the ids
    ///   must outlive every graph that captured them. `stream` must belong to the counter's
    ///   context ([`crate::Gpu::ctx`]).
    /// - [`PickCounterGpu::drain_async`] joins first, so a drain never copies a table the
    ///   branch is still adding to.
    ///
    /// # Errors
    /// As [`PickCounterGpu::count_raw`] (shape, dtype, range: checked before the fork, so a
    /// rejected call records nothing); [`CudaError::InFlight`] if the previous forked count has
    /// not been joined; [`CudaError::Capture`] if `stream`'s capture is invalidated (nothing
    /// recorded); CUDA errors. After a CUDA error past the fork (unlike the crate's other calls)
    /// the fork may stay pending ([`PickCounterGpu::fork_pending`]): inside a capture, discard
    /// the capture, then `join_forked` drops the fork (returning [`CudaError::Capture`]);
    /// outside one, `join_forked` waits for it. If the join event itself could not be recorded
    /// outside a capture, the branch is synchronised before the error is returned, and nothing
    /// stays pending.
    pub fn count_forked(
        &mut self,
        stream: &CudaStream,
        ids: &TopkIdsView,
        layer0: u32,
    ) -> Result<()> {
        if self.fork_pending {
            return Err(CudaError::InFlight(
                "forked count not joined (call join_forked)",
            ));
        }
        self.check_ids(ids, layer0)?;
        let capture = capture_state(stream)?;
        if capture == Capture::Invalidated {
            return Err(CudaError::Capture(
                "count_forked on a stream whose capture is invalidated",
            ));
        }
        order_after(&self.fork_mark, stream, &self.branch)?;
        // forked from here on: the join must follow whatever happens next
        self.fork_pending = true;
        self.fork_capture = capture;
        let launched = self.launch_count(&self.branch, ids, layer0);
        let recorded = self
            .join_mark
            .record(&self.branch)
            .map_err(drv("cuEventRecord"));
        if recorded.is_err() && capture == Capture::None {
            // the join event does not cover this launch: settle the branch here instead, so
            // no later join or drain can run ahead of it
            self.branch
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))?;
            self.fork_pending = false;
        }
        launched.and(recorded)
    }

    /// Makes `stream` wait for the pending [`PickCounterGpu::count_forked`] (a no-op when none
    /// is pending). Call it on the stream that forked (or one in the same capture), before
    /// anything overwrites the counted ids and before a captured graph ends.
    ///
    /// # Errors
    /// [`CudaError::Capture`] if the fork was made inside a capture that has ended or been
    /// invalidated since (the fork is dropped: it never ran, and the capture cannot produce a
    /// graph; unlike the crate's other errors this one changes state), or if `stream` is not in
    /// the capture the fork was made in (the fork stays pending: join it from a stream in that
    /// capture, or from any stream outside a capture for a fork made outside one); CUDA errors.
    pub fn join_forked(&mut self, stream: &CudaStream) -> Result<()> {
        if !self.fork_pending {
            return Ok(());
        }
        if let Capture::Active(_) = self.fork_capture {
            if capture_state(&self.branch)? != self.fork_capture {
                // ended (or invalidated): the captured fork can never run
                self.fork_pending = false;
                self.fork_capture = Capture::None;
                return Err(CudaError::Capture(
                    "the forked count's capture ended or was invalidated before join_forked: \
                     the fork was dropped",
                ));
            }
        }
        if capture_state(stream)? != self.fork_capture {
            return Err(CudaError::Capture(
                "join_forked on a stream outside the capture the fork was made in (or inside one \
                 for a fork made outside any capture)",
            ));
        }
        stream
            .wait(&self.join_mark)
            .map_err(drv("cuStreamWaitEvent"))?;
        self.fork_pending = false;
        self.fork_capture = Capture::None;
        Ok(())
    }

    /// Whether a [`PickCounterGpu::count_forked`] has not been joined yet.
    pub fn fork_pending(&self) -> bool {
        self.fork_pending
    }
}
