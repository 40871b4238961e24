//! [`ExpertBankGpu`]: an [`ExpertStore`] (pinned host experts, HBM slots + a spare per layer,
//! the device indirection table) driven through the swap protocol of the module docs, with its
//! residency bookkeeping in a CPU-only [`Placement`].

use std::sync::Arc;

use cuda_kernels::cudarc_driver::CudaStream;
use cuda_kernels::{CudaError, DeviceBuffer, EventSignal, Gpu, PinnedBuffer, TableUpdater};

use super::placement::Placement;
use super::store::ExpertStore;
use crate::error::{ExpertError, Result};
use crate::executor::PlannedSwap;
use crate::geometry::Geometry;
use crate::rowmap::ResidencyMap;

/// How [`ExpertBankGpu::commit_ready`] treats a swap whose copy has not completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// Leave it in flight (commit at a later boundary). The step stream never waits.
    Deferred,
    /// Make the step stream wait (on the GPU) for the copy, then flip.
    Wait,
}

/// A swap flipped by [`ExpertBankGpu::commit_ready`] / `ExpertBankGpu::commit_layers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommittedSwap {
    /// Layer.
    pub layer: u32,
    /// Expert now hot.
    pub incoming: u32,
    /// Expert now cold.
    pub outgoing: u32,
    /// The layer's generation after the commit (the mirror map's, = the controller's once it
    /// applies the same swap).
    pub generation: u64,
}

/// All experts in pinned host memory, hot experts in HBM slots plus one spare slot per layer,
/// and the device indirection table engines read expert weights through. See the module docs
/// for the swap protocol.
#[derive(Debug)]
pub struct ExpertBankGpu {
    store: ExpertStore,
    geometry: Geometry,
    /// `None` until the first [`ExpertBankGpu::load_map`].
    placement: Option<Placement>,
    updater: TableUpdater,
    /// Per layer: recorded on the copy stream after the layer's swap copy.
    copy_done: Vec<EventSignal>,
    /// Per layer: the spare slot's reader fence, recorded on the step stream after the flip
    /// that made it the spare (unrecorded, i.e. complete, at boot).
    spare_fence: Vec<EventSignal>,
    copy_stream: Arc<CudaStream>,
}

fn not_loaded() -> ExpertError {
    ExpertError::Executor("no residency map loaded in the GPU bank".into())
}

impl ExpertBankGpu {
    /// Allocates the bank for `geometry` (host experts zero-filled; fill them with
    /// [`ExpertBankGpu::host_expert_mut`] or [`ExpertBankGpu::fill_host`], then call
    /// [`ExpertBankGpu::load_map`]). Until a map is loaded every table entry points at the
    /// expert's host copy.
    ///
    /// # Errors
    /// The errors of `ExpertStore::check_geometry` (the tier's geometry rules, an
    /// `expert_bytes` multiple of 16, the store's byte limits; all before any allocation);
    /// [`ExpertError::Cuda`] for device failures (e.g. `CUDA_ERROR_OUT_OF_MEMORY` when HBM or
    /// pinnable host memory is short).
    pub fn new(gpu: &Arc<Gpu>, geometry: Geometry) -> Result<Self> {
        Self::with_memory(gpu, geometry, None, None)
    }

    /// As [`ExpertBankGpu::new`], over caller-owned memory where given: `host` is the experts'
    /// host store (`[layers][experts_per_layer][expert_bytes]` u8, kept as it is: the caller's
    /// weights are read in place and copied into slots from there) and `slots` the HBM slots
    /// ([`Geometry::hbm_bytes`]: the hot slots and a spare per layer). Build them with
    /// [`PinnedBuffer::borrowed`] /
    /// [`DeviceBuffer::borrowed`]; see [`ExpertStore::with_memory`].
    ///
    /// # Errors
    /// As [`ExpertBankGpu::new`]; [`ExpertError::Cuda`] with `CudaError::ForeignMemory` for a
    /// buffer that is too short or of another device.
    pub fn with_memory(
        gpu: &Arc<Gpu>,
        geometry: Geometry,
        host: Option<PinnedBuffer<u8>>,
        slots: Option<DeviceBuffer<u8>>,
    ) -> Result<Self> {
        let store = ExpertStore::with_memory(gpu, geometry, host, slots)?;
        let mut copy_done = Vec::with_capacity(geometry.layers as usize);
        let mut spare_fence = Vec::with_capacity(geometry.layers as usize);
        for _ in 0..geometry.layers {
            copy_done.push(EventSignal::unrecorded(gpu)?);
            spare_fence.push(EventSignal::unrecorded(gpu)?);
        }
        Ok(ExpertBankGpu {
            updater: TableUpdater::new(gpu)?,
            copy_stream: gpu.new_stream()?,
            store,
            geometry,
            placement: None,
            copy_done,
            spare_fence,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The GPU memory (read access: slot and host addresses, the table, downloads).
    pub fn store(&self) -> &ExpertStore {
        &self.store
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.store.gpu()
    }

    /// Device address of the indirection table: u64 `[layers][experts]`, fixed for the bank's
    /// life.
    pub fn table_ptr(&self) -> u64 {
        self.store.table_ptr()
    }

    /// The copy stream swaps copy on.
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy_stream
    }

    /// The host copy of an expert (`expert_bytes` bytes).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] (`OutOfRange`) for a bad layer or expert.
    pub fn host_expert(&self, layer: u32, expert: u32) -> Result<&[u8]> {
        self.store.host_expert(layer, expert)
    }

    /// Mutable host copy of an expert: only before [`ExpertBankGpu::load_map`] (weights are
    /// read-only once the bank serves them, since swap copies read them asynchronously).
    ///
    /// # Errors
    /// [`ExpertError::Executor`] once a map is loaded; [`ExpertError::Cuda`] (`OutOfRange`) for a bad layer
    /// or expert.
    pub fn host_expert_mut(&mut self, layer: u32, expert: u32) -> Result<&mut [u8]> {
        self.check_writable()?;
        self.store.host_expert_mut(layer, expert)
    }

    /// Fills every host expert with `f(layer, expert, bytes)`, on up to `threads` threads; only
    /// before [`ExpertBankGpu::load_map`].
    ///
    /// # Errors
    /// [`ExpertError::Executor`] once a map is loaded.
    pub fn fill_host<F>(&mut self, threads: usize, f: F) -> Result<()>
    where
        F: Fn(u32, u32, &mut [u8]) + Sync,
    {
        self.check_writable()?;
        self.store.fill_host(threads, f);
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        if self.placement.is_some() {
            return Err(ExpertError::Executor(
                "host experts are read-only once a map is loaded".into(),
            ));
        }
        Ok(())
    }

    /// Loads a residency map synchronously (boot, or restore): each layer's hot experts are
    /// copied into physical slots `0..hot_per_layer` in `map`'s slot order, the last slot
    /// ([`Geometry::spare_slot`]) becomes the spare, and the table is rewritten. The bank's generations become `map`'s.
    ///
    /// # Errors
    /// [`ExpertError::GeometryMismatch`] if `map` has another geometry, [`ExpertError::Executor`] while a
    /// swap is in flight (nothing changes); [`ExpertError::Cuda`] for device failures.
    pub fn load_map(&mut self, map: &ResidencyMap) -> Result<()> {
        self.geometry.check_same(map.geometry())?;
        if let Some(p) = &self.placement {
            if let Some(l) = (0..self.geometry.layers).find(|&l| p.in_flight(l).is_some()) {
                return Err(ExpertError::Executor(format!(
                    "layer {l}: a swap is in flight"
                )));
            }
        }
        let placement = Placement::new(map)?;
        let mut table =
            tier_core::alloc::try_filled(self.geometry.cells(), 0u64, "GPU bank table")?;
        self.store.gpu().synchronize()?;
        for l in 0..self.geometry.layers {
            for e in 0..self.geometry.experts_per_layer {
                let cell = self.store.cell_of(l, e) as usize;
                table[cell] = match placement.slot_of(l, e) {
                    Some(s) => {
                        // the device is idle (synchronised above): no kernel reads the slot
                        self.store.copy_slot_sync(l, e, s)?;
                        self.store.slot_ptr(l, s)
                    }
                    None => self.store.host_device_ptr(l, e),
                };
            }
        }
        // `upload` synchronizes the context, so the slot copies above have landed too.
        self.store.upload_table(&table)?;
        self.placement = Some(placement);
        Ok(())
    }

    /// The mirror of the controller's map (as of the last flip), `None` before a map is loaded.
    pub fn map(&self) -> Option<&ResidencyMap> {
        self.placement.as_ref().map(|p| p.map())
    }

    /// Whether `(layer, expert)` is hot (in an HBM slot) as of the last commit (false for
    /// out-of-range ids or before a map is loaded).
    pub fn is_hot(&self, layer: u32, expert: u32) -> bool {
        self.map().is_some_and(|m| m.is_hot(layer, expert))
    }

    /// The layer's hot experts in physical slot order (the spare slot is skipped); empty if
    /// `layer >= layers` or before a map is loaded.
    pub fn hot_experts(&self, layer: u32) -> Vec<u32> {
        self.placement
            .as_ref()
            .map_or_else(Vec::new, |p| p.hot_experts(layer))
    }

    /// The expert in physical HBM slot `slot` of `layer` (`None` for the spare, out of range,
    /// or before a map is loaded).
    pub fn expert_in_slot(&self, layer: u32, slot: u32) -> Option<u32> {
        self.placement.as_ref()?.expert_in_slot(layer, slot)
    }

    /// The layer's spare HBM slot (physical; `None` out of range or before a map is loaded). A
    /// test hook (feature `test-hooks`: the bank's GPU tests check the physical placement).
    #[cfg(feature = "test-hooks")]
    pub fn spare_slot(&self, layer: u32) -> Option<u32> {
        self.placement.as_ref()?.spare(layer)
    }

    /// The layer's generation: the mirror map's (0 before a map is loaded or out of range).
    pub fn generation(&self, layer: u32) -> u64 {
        self.placement.as_ref().map_or(0, |p| p.generation(layer))
    }

    /// The table entry `(layer, expert)` as the step stream will see it after the queued flips:
    /// its HBM slot's address if hot, else its host copy's mapped address.
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] (`OutOfRange`) for a bad layer or expert.
    pub fn entry(&self, layer: u32, expert: u32) -> Result<u64> {
        self.store.check(layer, expert)?;
        Ok(
            match self
                .placement
                .as_ref()
                .and_then(|p| p.slot_of(layer, expert))
            {
                Some(s) => self.store.slot_ptr(layer, s),
                None => self.store.host_device_ptr(layer, expert),
            },
        )
    }

    /// Checks the device against the bank's own placement, after synchronising the device: the
    /// table must hold [`ExpertBankGpu::entry`] for every cell and every occupied slot exactly
    /// its expert's host bytes ([`ExpertStore::mismatches`]). Returns the number of mismatching
    /// entries plus slots (0 = consistent). A diagnostic (the reference example's and the GPU
    /// tests' final check): it downloads the table and every occupied slot.
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] for a failed download.
    pub fn mismatches(&self) -> Result<u64> {
        self.store.mismatches(
            // In range (the store's own loop): `entry` cannot fail there.
            |l, e| self.entry(l, e).unwrap_or(0),
            |l, s| self.expert_in_slot(l, s),
        )
    }

    /// Whether a swap copy is in flight on the layer's spare slot.
    pub fn in_flight(&self, layer: u32) -> bool {
        self.placement
            .as_ref()
            .is_some_and(|p| p.in_flight(layer).is_some())
    }

    /// A swap of `(layer, incoming → outgoing)` planned against the bank's mirror now: `slot` is
    /// the mirror's logical slot of `outgoing`, `generation` the layer's current one (for tests,
    /// benches and hosts that pick swaps by hand; the controller plans its own).
    ///
    /// # Errors
    /// [`ExpertError::Executor`] before a map is loaded; [`ExpertError::LayerOutOfRange`];
    /// [`ExpertError::InvalidSwap`] if `outgoing` is not hot.
    pub fn plan_swap(&self, layer: u32, incoming: u32, outgoing: u32) -> Result<PlannedSwap> {
        let row = self.map().ok_or_else(not_loaded)?.layer(layer)?;
        let slot = row.slot_of(outgoing).ok_or_else(|| {
            ExpertError::InvalidSwap(format!("expert {outgoing} is not hot in layer {layer}"))
        })?;
        Ok(PlannedSwap {
            layer,
            incoming,
            outgoing,
            slot,
            generation: row.generation(),
        })
    }

    /// Starts `swap`: copies `swap.incoming` (cold) into the layer's spare HBM slot on the copy
    /// stream, after the spare's reader fence (a GPU-side wait: the host never blocks);
    /// `swap.outgoing` (hot) leaves at the commit.
    ///
    /// # Errors
    /// [`ExpertError::StaleSwap`] if `swap.generation` is not the layer's generation in the bank's
    /// mirror of the map (the swap was planned against a map that has moved on);
    /// [`ExpertError::InvalidSwap`] if `incoming` is hot or `outgoing` is not in logical slot `slot`;
    /// [`ExpertError::LayerOutOfRange`] / [`ExpertError::ExpertOutOfRange`]; [`ExpertError::Executor`] if no map is
    /// loaded or a copy is already in flight on the layer; [`ExpertError::Cuda`]. Nothing changes on
    /// error.
    pub fn begin_swap(&mut self, swap: &PlannedSwap) -> Result<()> {
        let p = self.placement.as_ref().ok_or_else(not_loaded)?;
        let dest = p.check_begin(swap)?;
        let l = swap.layer as usize;
        self.spare_fence[l].wait_on(&self.copy_stream)?;
        // SAFETY: the host experts are never written once a map is loaded (`host_expert_mut`
        // and `fill_host` refuse), and `Drop` synchronises the copy stream before the store is
        // freed. The destination is the layer's spare slot, which no table entry points to and
        // whose last readers are ordered before this copy by the spare fence waited on above.
        unsafe {
            self.store
                .copy_slot_async(swap.layer, swap.incoming, dest, &self.copy_stream)?
        };
        self.copy_done[l].rerecord(&self.copy_stream)?;
        self.placement
            .as_mut()
            .ok_or_else(not_loaded)?
            .begin(swap)?;
        Ok(())
    }

    /// Whether the layer's in-flight copy has completed (`false` if none is in flight).
    ///
    /// # Errors
    /// [`ExpertError::Cuda`] if the event query fails.
    ///
    /// A test hook (feature `test-hooks`: the bank's GPU tests poll a copy); the executor's
    /// deferred commit uses the crate's half.
    #[cfg(feature = "test-hooks")]
    pub fn copy_complete(&self, layer: u32) -> Result<bool> {
        self.copy_done(layer)
    }

    /// `ExpertBankGpu::copy_complete`'s body.
    pub(crate) fn copy_done(&self, layer: u32) -> Result<bool> {
        if !self.in_flight(layer) {
            return Ok(false);
        }
        Ok(self.copy_done[layer as usize].try_complete()?)
    }

    /// Drops the layer's in-flight swap without flipping (the spare keeps bytes nobody reads).
    pub(crate) fn cancel_swap(&mut self, layer: u32) -> bool {
        self.placement
            .as_mut()
            .and_then(|p| p.cancel(layer))
            .is_some()
    }

    /// Step boundary: commits in-flight swaps (all of them in [`CommitMode::Wait`], only those
    /// whose copy completed in [`CommitMode::Deferred`]) as `ExpertBankGpu::commit_layers`
    /// does, on `stream` (the step stream). Returns the committed swaps; the others stay in
    /// flight.
    ///
    /// # Errors
    /// As `ExpertBankGpu::commit_layers`; [`ExpertError::Cuda`] if a copy-done query fails.
    pub fn commit_ready(
        &mut self,
        stream: &CudaStream,
        mode: CommitMode,
    ) -> Result<Vec<CommittedSwap>> {
        let mut ready: Vec<u32> = Vec::new();
        for l in 0..self.geometry.layers {
            if !self.in_flight(l) {
                continue;
            }
            let done = match mode {
                CommitMode::Wait => true,
                CommitMode::Deferred => self.copy_done[l as usize].try_complete()?,
            };
            if done {
                ready.push(l);
            }
        }
        self.commit_layers(stream, &ready)
    }

    /// Step boundary, explicit form: commits the in-flight swaps of exactly `layers`, whatever
    /// their copy state. On `stream` (the step stream): a GPU-side wait for each copy (so a flip
    /// never exposes a half-copied slot), one table-update launch per 32 swaps (incoming → its
    /// new slot, outgoing → its pinned host address, still readable in place), then each
    /// layer's new spare fence. The mirror map applies each swap (generation + 1). Used by
    /// executors that ask the controller about each swap before flipping it.
    ///
    /// # Errors
    /// [`ExpertError::Executor`] if a listed layer has no swap in flight or is listed twice, the
    /// errors of [`ResidencyMap::check_swap`] if a swap no longer applies to the mirror (all
    /// checked first: nothing changes); [`ExpertError::Cuda`] if a wait or the launch fails (the
    /// mirror does not change; a fence record failing after the launch is reported after the
    /// mirror changed).
    pub(crate) fn commit_layers(
        &mut self,
        stream: &CudaStream,
        layers: &[u32],
    ) -> Result<Vec<CommittedSwap>> {
        if layers.is_empty() {
            return Ok(Vec::new());
        }
        let flips = self
            .placement
            .as_ref()
            .ok_or_else(not_loaded)?
            .check_flips(layers)?;
        // Order the flips after the copies on the GPU too (free for completed copies; in Wait mode
        // this is where the step stream waits). Memory written by the copy stream is visible to
        // the step stream's later kernels through this event dependency.
        for (swap, _) in &flips {
            self.copy_done[swap.layer as usize].wait_on(stream)?;
        }
        let mut pairs: Vec<(u32, u64)> = Vec::with_capacity(flips.len() * 2);
        for &(s, new_slot) in &flips {
            pairs.push((
                self.store.cell_of(s.layer, s.incoming),
                self.store.slot_ptr(s.layer, new_slot),
            ));
            pairs.push((
                self.store.cell_of(s.layer, s.outgoing),
                self.store.host_device_ptr(s.layer, s.outgoing),
            ));
        }
        self.updater.launch(stream, self.store.table(), &pairs)?;
        let placement = self.placement.as_mut().ok_or_else(not_loaded)?;
        let mut out = Vec::with_capacity(flips.len());
        for (swap, _) in flips {
            placement.flip(swap.layer)?;
            out.push(CommittedSwap {
                layer: swap.layer,
                incoming: swap.incoming,
                outgoing: swap.outgoing,
                generation: placement.generation(swap.layer),
            });
        }
        let mut synced = false;
        for c in &out {
            // Reader fence: everything queued on the step stream so far (the steps that could
            // read the old slot through the old table entry) completes before this event.
            if self.spare_fence[c.layer as usize].rerecord(stream).is_err() && !synced {
                // The flips are enqueued and the placement has moved on, so the swaps are
                // committed either way. Without a new event the layer's fence would be an older
                // one that orders none of the steps still able to read the old slot: make them
                // finish now instead, so every older event is a correct fence again.
                stream
                    .synchronize()
                    .map_err(|e| ExpertError::Cuda(CudaError::driver("cuStreamSynchronize", e)))?;
                synced = true;
            }
        }
        Ok(out)
    }
}

impl Drop for ExpertBankGpu {
    fn drop(&mut self) {
        // Copies may still read the pinned host buffer: wait for them before the buffers go.
        let _ = self.copy_stream.synchronize();
    }
}
