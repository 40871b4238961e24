//! GPU swap executor: [`GpuExecutor`] implements [`SwapExecutor`] on top of
//! [`cuda_kernels::ExpertBankGpu`] (pinned host experts, HBM hot slots + one spare per layer, a
//! device indirection table `(layer, expert) → u64 pointer` at a fixed address).
//!
//! - `begin` enqueues the incoming expert's host → spare-slot copy on the bank's copy stream
//!   (after the spare's reader fence) and returns at once; steps keep running.
//! - `commit_ready` (at a step boundary) asks the controller (`accept`) about each swap whose copy
//!   completed, in begin order, then flips the accepted ones with one tiny kernel on the step
//!   stream; refused ones are discarded (the spare keeps unreferenced bytes). Copies still running
//!   stay in flight ([`CommitMode::Deferred`]), or, in [`CommitMode::Wait`], the step stream waits
//!   for them on the GPU before the flip. A flip never exposes a half-copied slot either way.
//! - The outgoing expert's old slot becomes the layer's spare behind a reader fence (an event
//!   recorded on the step stream after the flip), so the next copy into it waits for every step
//!   that could still read it.
//!
//! Engines read expert weights through [`GpuExecutor::table_ptr`] (hot: HBM slot; cold: the
//! expert's mapped pinned host address, readable in place), so a captured CUDA graph stays valid.

use std::sync::Arc;

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{BankGeometry, CommitMode, CudaError, ExpertBankGpu, Gpu};

use crate::error::{Error, Result};
use crate::executor::{PlannedSwap, SwapCompletion, SwapExecutor, SwapOutcome};
use crate::rowmap::ResidencyMap;

/// The GPU executor. See the module docs.
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
    /// Errors: [`Error::Cuda`] (with the CUDA error name) for device failures (e.g. not enough
    /// HBM or pinnable host memory); [`Error::InvalidGeometry`] if `expert_bytes` is not a
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
        let g = map.geometry();
        if !g.expert_bytes.is_multiple_of(16) {
            return Err(Error::InvalidGeometry(format!(
                "expert_bytes {} is not a multiple of 16 (GPU executor)",
                g.expert_bytes
            )));
        }
        let geo = BankGeometry {
            layers: g.layers,
            experts: g.experts_per_layer,
            hot_per_layer: g.hot_per_layer,
            expert_bytes: g.expert_bytes,
        };
        let mut bank = ExpertBankGpu::new(gpu, geo).map_err(Error::Cuda)?;
        bank.fill_host(threads, fill).map_err(Error::Cuda)?;
        bank.load_map(&map.hot_sets()).map_err(Error::Cuda)?;
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

    /// The bank (read access: slots, entries, verification, reader kernels).
    pub fn bank(&self) -> &ExpertBankGpu {
        &self.bank
    }

    /// The step stream flips are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Loads `map` synchronously (restore, or switching to a seed map); fails while swaps are
    /// in flight (call `flush` + the controller's step first).
    pub fn load_map(&mut self, map: &ResidencyMap) -> Result<()> {
        if !self.pending.is_empty() {
            return Err(Error::Executor(
                "swaps in flight; flush and commit first".into(),
            ));
        }
        self.bank.load_map(&map.hot_sets()).map_err(Error::Cuda)
    }
}

impl SwapExecutor for GpuExecutor {
    fn can_begin(&self, layer: u32) -> bool {
        // The spare's reader fence is waited on by the copy stream (on the GPU), so a layer can
        // begin as soon as its previous swap has left the executor.
        !self.bank.in_flight(layer) && !self.pending.iter().any(|s| s.layer == layer)
    }

    fn begin(&mut self, swap: &PlannedSwap) -> Result<()> {
        if !self.can_begin(swap.layer) {
            return Err(Error::Executor(format!(
                "layer {} already has a swap in flight",
                swap.layer
            )));
        }
        let gen = self.bank.generation(swap.layer);
        self.bank
            .begin_swap(swap.layer, swap.incoming, swap.outgoing, gen)
            .map_err(Error::Cuda)?;
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
                CommitMode::Deferred => self.bank.copy_complete(swap.layer),
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
                return Err(Error::Cuda(e));
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
            .map_err(|e| Error::Cuda(CudaError::driver("cuStreamSynchronize", e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Controller, ControllerConfig, Geometry};
    use cuda_kernels::{
        gpu_or_skip, write_expert_pattern, DeviceBuffer, PickCounterGpu, TopkShape,
    };

    #[test]
    fn controller_drives_the_gpu_executor_and_maps_agree() {
        let Some(gpu) = gpu_or_skip() else { return };
        let g = Geometry::new(4, 16, 4, 64 << 10).unwrap();
        let map = ResidencyMap::first_k("gpu-test", g).unwrap();
        let stream = gpu.stream().clone();
        let mut exec = GpuExecutor::new(&gpu, stream.clone(), &map, 4, |l, e, b| {
            write_expert_pattern(b, l * 16 + e, 3)
        })
        .unwrap();
        let cfg = ControllerConfig {
            drain_every: 4,
            ..ControllerConfig::default()
        };
        let mut ctl = Controller::new(map, cfg).unwrap();
        let mut counter = PickCounterGpu::new(&gpu, 4, 16).unwrap();
        // every token picks one of experts 12..16 (cold at boot) and expert 0 (hot at boot):
        // 1, 2, 3 go idle, so three of 12..16 must come in per layer.
        let (tokens, k) = (32u32, 2u32);
        let mut ids = Vec::new();
        for _l in 0..4 {
            for t in 0..tokens {
                ids.push(12 + (t % 4) as i32);
                ids.push(0);
            }
        }
        let d = DeviceBuffer::from_host(gpu.ctx(), &ids).unwrap();
        let mut draining = false;
        let mut applied = 0;
        for _ in 0..400 {
            counter
                .count(&stream, &d, TopkShape::step(4, tokens, k), 0)
                .unwrap();
            if ctl.drain_due() && !draining {
                counter.drain_async(&stream).unwrap();
                draining = true;
            }
            let snap = if draining {
                counter.poll_drain().unwrap().map(|s| s.counts.to_vec())
            } else {
                None
            };
            if snap.is_some() {
                draining = false;
            }
            applied += ctl.step_with(snap.as_deref(), &mut exec).unwrap().applied;
        }
        exec.flush().unwrap();
        applied += ctl.step_with(None, &mut exec).unwrap().applied;
        assert!(applied >= 12, "applied {applied}");
        for l in 0..4 {
            let mut a = ctl.map().hot_sets()[l as usize].clone();
            let mut b = exec.bank().hot_experts(l);
            a.sort();
            b.sort();
            assert_eq!(a, b, "layer {l}: controller map and GPU bank disagree");
            assert!(
                a.contains(&0) && a.iter().filter(|&&e| e >= 12).count() == 3,
                "layer {l}: {a:?}"
            );
        }
        assert_eq!(exec.bank().verify_consistency().unwrap(), 0);
    }
}
