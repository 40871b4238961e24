//! [`GpuExecutor`]: the [`SwapExecutor`] over an [`ExpertBankGpu`] (see the module docs of
//! [`crate::gpu`] for the protocol).

use std::sync::Arc;

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{CudaError, Gpu};

use super::bank::{CommitMode, ExpertBankGpu};
use crate::error::{ExpertError, Result};
use crate::executor::{check_layer_idle, PlannedSwap, SwapCompletion, SwapExecutor, SwapOutcome};
use crate::rowmap::ResidencyMap;

/// The GPU executor. See the module docs.
///
/// **Reader assumption.** Every kernel that reads expert weights through the table
/// ([`GpuExecutor::table_ptr`]) runs on the step stream given to [`GpuExecutor::new`], or is
/// ordered before the step stream's later work (an event the step stream waits on). The spare
/// slot's reader fence is an event recorded on the step stream after each flip, so reads on an
/// unordered second stream (two batches overlapped on two streams) are not covered: join such
/// streams into the step stream before each step boundary.
#[derive(Debug)]
pub struct GpuExecutor {
    bank: ExpertBankGpu,
    stream: Arc<CudaStream>,
    pending: Vec<PlannedSwap>,
    mode: CommitMode,
}

impl GpuExecutor {
    /// Builds the bank for `map`'s geometry, fills every host expert with
    /// `fill(layer, expert, bytes)` (on up to `threads` threads), and loads `map`'s hot sets into
    /// HBM. Step kernels run on `stream` (the engine's step stream; flips are ordered on it).
    ///
    /// The executor's mirror of the map starts as `map` (the controller's boot map): from then
    /// on both apply the same committed swaps in the same order, so their generations agree and
    /// [`SwapExecutor::begin`] refuses a swap planned at another generation.
    ///
    /// Errors: [`ExpertError::Cuda`] (with the CUDA error name) for device failures (e.g. not enough
    /// HBM or pinnable host memory); [`ExpertError::InvalidGeometry`] if `expert_bytes` is not a
    /// multiple of 16.
    pub fn new<F>(
        gpu: &Arc<Gpu>,
        stream: Arc<CudaStream>,
        map: &ResidencyMap,
        threads: usize,
        fill: F,
    ) -> Result<Self>
    where
        F: Fn(u32, u32, &mut [u8]) + Sync,
    {
        let mut bank = ExpertBankGpu::new(gpu, *map.geometry())?;
        bank.fill_host(threads, fill)?;
        Self::with_bank(bank, stream, map)
    }

    /// An executor over a bank already built and filled (e.g. [`ExpertBankGpu::with_memory`]
    /// over the engine's own pinned weights, read in place): loads `map`'s hot sets into HBM.
    /// Step kernels run on `stream`, as for [`GpuExecutor::new`].
    ///
    /// Errors: [`ExpertBankGpu::load_map`]'s ([`ExpertError::GeometryMismatch`] for a map of
    /// another geometry, [`ExpertError::Cuda`] for device failures).
    pub fn with_bank(
        mut bank: ExpertBankGpu,
        stream: Arc<CudaStream>,
        map: &ResidencyMap,
    ) -> Result<Self> {
        bank.load_map(map)?;
        Ok(GpuExecutor {
            bank,
            stream,
            pending: Vec::new(),
            mode: CommitMode::Deferred,
        })
    }

    /// Sets how copies still running at a boundary are treated (default [`CommitMode::Deferred`]).
    pub fn set_commit_mode(&mut self, mode: CommitMode) {
        self.mode = mode;
    }

    /// Device address of the indirection table (u64 `[layers][experts]`), fixed for the
    /// executor's life.
    pub fn table_ptr(&self) -> u64 {
        self.bank.table_ptr()
    }

    /// The bank (read access: residency, slots, entries, its [`ExpertBankGpu::store`]).
    pub fn bank(&self) -> &ExpertBankGpu {
        &self.bank
    }

    /// The step stream flips are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Loads `map` synchronously (restore, or switching to a seed map): the mirror becomes `map`,
    /// so load the controller's map too. Fails while swaps are in flight (call `flush` + the
    /// controller's step first).
    ///
    /// Errors: [`ExpertError::Executor`] while swaps are in flight; the errors of
    /// [`ExpertBankGpu::load_map`].
    pub fn load_map(&mut self, map: &ResidencyMap) -> Result<()> {
        if !self.pending.is_empty() {
            return Err(ExpertError::Executor(
                "swaps in flight; flush and commit first, or cancel them (cancel_in_flight)".into(),
            ));
        }
        self.bank.load_map(map)
    }

    /// Drops every swap in flight without flipping it: waits for their copies (the copy stream),
    /// then gives each spare slot back holding bytes nobody reads; the table still maps every
    /// expert where it was. Returns how many were dropped. For switching maps mid-run
    /// ([`GpuExecutor::load_map`] next): the controller that planned those swaps still counts them
    /// in flight, so replace it (a new controller on the loaded map) rather than stepping it again.
    ///
    /// Errors: [`ExpertError::Cuda`] when the copy stream cannot be synchronized (nothing dropped).
    pub fn cancel_in_flight(&mut self) -> Result<usize> {
        self.flush()?;
        let n = self.pending.len();
        for swap in std::mem::take(&mut self.pending) {
            self.bank.cancel_swap(swap.layer);
        }
        Ok(n)
    }
}

impl SwapExecutor for GpuExecutor {
    fn geometry(&self) -> Option<crate::geometry::Geometry> {
        Some(*self.bank.geometry())
    }

    fn can_begin(&self, layer: u32) -> bool {
        // The spare's reader fence is waited on by the copy stream (on the GPU), so a layer can
        // begin as soon as its previous swap has left the executor.
        !self.bank.in_flight(layer) && !self.pending.iter().any(|s| s.layer == layer)
    }

    fn begin(&mut self, swap: &PlannedSwap) -> Result<()> {
        check_layer_idle(&self.pending, swap.layer)?;
        // The bank checks `swap.generation` against its mirror of the map (stale: refused).
        self.bank.begin_swap(swap)?;
        self.pending.push(*swap);
        Ok(())
    }

    fn commit_ready(
        &mut self,
        accept: &mut dyn FnMut(&PlannedSwap) -> bool,
    ) -> Result<Vec<SwapCompletion>> {
        let mut out = Vec::new();
        let mut flip: Vec<u32> = Vec::new();
        let mut keep = Vec::with_capacity(self.pending.len());
        for swap in std::mem::take(&mut self.pending) {
            let ready = match self.mode {
                CommitMode::Wait => Ok(true),
                CommitMode::Deferred => self.bank.copy_done(swap.layer),
            };
            match ready {
                Ok(false) => keep.push(swap),
                Ok(true) => {
                    if accept(&swap) {
                        flip.push(swap.layer);
                        out.push(SwapCompletion {
                            swap,
                            outcome: SwapOutcome::Committed,
                        });
                    } else {
                        self.bank.cancel_swap(swap.layer);
                        out.push(SwapCompletion {
                            swap,
                            outcome: SwapOutcome::Discarded,
                        });
                    }
                }
                Err(_) => {
                    self.bank.cancel_swap(swap.layer);
                    out.push(SwapCompletion {
                        swap,
                        outcome: SwapOutcome::Failed,
                    });
                }
            }
        }
        self.pending = keep;
        if let Err(e) = self.bank.commit_layers(&self.stream, &flip) {
            // Nothing was flipped: report those swaps failed and drop their copies.
            for c in out
                .iter_mut()
                .filter(|c| c.outcome == SwapOutcome::Committed)
            {
                self.bank.cancel_swap(c.swap.layer);
                c.outcome = SwapOutcome::Failed;
            }
            if out.is_empty() {
                return Err(e);
            }
        }
        Ok(out)
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn flush(&mut self) -> Result<()> {
        self.bank
            .copy_stream()
            .synchronize()
            .map_err(|e| ExpertError::Cuda(CudaError::driver("cuStreamSynchronize", e)))
    }
}
