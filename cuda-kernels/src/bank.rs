//! GPU primitives of the expert bank: all experts in mapped pinned host memory (the source of
//! truth), `hot_per_layer + 1` HBM slots per layer in one allocation (the `+ 1` is the layer's
//! spare slot), and a device-resident indirection table `(layer, expert) → u64 pointer` at a
//! fixed address (CUDA-graph safe).
//!
//! A swap (incoming cold expert in, outgoing hot expert out) is:
//! 1. [`ExpertBankGpu::begin_swap`]: the copy stream waits for the spare slot's reader fence,
//!    then copies the incoming expert host → spare slot; steps keep running.
//! 2. [`ExpertBankGpu::commit_ready`] at a step boundary: for each layer whose copy completed
//!    (or, in [`CommitMode::Wait`], after making the step stream wait for it), one tiny kernel on
//!    the step stream flips the table entries (incoming → its new slot, outgoing → its pinned
//!    host address, so a kernel can still read it in place). A copy that has not completed is
//!    never flipped to: it stays in flight (deferred).
//! 3. The outgoing slot becomes the layer's spare; its reader fence is an event recorded on the
//!    step stream right after the flip, i.e. after the last step that could read the old slot.
//!    The next copy into it waits for that event on the GPU (the host never blocks).
//!
//! Weights are read-only, so nothing is written back. Source: the published GB300 recipe paid
//! 1.3–2.4 ms of step time per applied swap by copying on the main stream between steps; here the
//! copy is off the step stream and the step pays only the flip launch.

use std::sync::Arc;

use cudarc::driver::{
    result, CudaEvent, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use crate::device::{Gpu, BANK_MODULE};
use crate::error::{drv, CudaError, Result};
use crate::mem::{copy_htod_async, DeviceBuffer, PinnedBuffer};

/// Marker for "no slot" / "no expert".
const NONE: u32 = u32::MAX;

/// Table entries one flip launch can update (must match `TIERKIT_MAX_UPDATES` in `bank.cu`).
pub const MAX_UPDATES_PER_LAUNCH: usize = 64;

/// Kernel parameter of `tierkit_table_update` (passed by value: no host buffer outlives the call).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TableUpdate {
    n: u32,
    idx: [u32; MAX_UPDATES_PER_LAUNCH],
    val: [u64; MAX_UPDATES_PER_LAUNCH],
}
// SAFETY: `#[repr(C)]` plain integers with the same field order, types and alignment as the
// `TierkitTableUpdate` struct of `bank.cu` (u32, u32[64], then u64[64] at an 8-aligned offset).
unsafe impl DeviceRepr for TableUpdate {}

/// Geometry of a bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BankGeometry {
    /// MoE layers.
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Hot experts (HBM slots, not counting the spare) per layer.
    pub hot_per_layer: u32,
    /// Bytes of one expert (all its weights), a multiple of 16.
    pub expert_bytes: u64,
}

/// Largest byte total a bank may hold in one tier (`isize::MAX`): the pinned host experts are
/// viewed as one Rust slice, and no Rust allocation or slice may exceed it.
const MAX_TIER_BYTES: u64 = isize::MAX as u64;

impl BankGeometry {
    /// Checks the geometry without touching a device (pure arithmetic; [`ExpertBankGpu::new`]
    /// calls it first).
    ///
    /// # Errors
    /// - [`CudaError::OutOfRange`] if `layers` or `experts` is 0; if `hot_per_layer > experts`
    ///   or `hot_per_layer == u32::MAX` (the spare slot would not be countable); if
    ///   `layers × experts` (indirection-table cells) or `layers × (hot_per_layer + 1)` (HBM
    ///   slots) exceeds `u32::MAX` (cells and slots are `u32` indices, on the device too); or if
    ///   `expert_bytes` makes [`host_bytes`](Self::host_bytes) or
    ///   [`hbm_bytes`](Self::hbm_bytes) exceed `isize::MAX` bytes (`limit` is then the largest
    ///   `expert_bytes + 1` that fits);
    /// - [`CudaError::Shape`] if `expert_bytes` is not a non-zero multiple of 16.
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 || self.experts == 0 {
            return Err(CudaError::OutOfRange {
                what: "layers/experts (zero)",
                value: 0,
                limit: 1,
            });
        }
        if self.hot_per_layer > self.experts {
            return Err(CudaError::OutOfRange {
                what: "hot_per_layer",
                value: self.hot_per_layer as u64,
                limit: self.experts as u64 + 1,
            });
        }
        let Some(slots) = self.hot_per_layer.checked_add(1) else {
            return Err(CudaError::OutOfRange {
                what: "hot_per_layer (hot_per_layer + 1 slots per layer must fit u32)",
                value: self.hot_per_layer as u64,
                limit: u32::MAX as u64,
            });
        };
        let cell_limit = u32::MAX as u64 + 1;
        let Some(cells) = self.layers.checked_mul(self.experts) else {
            return Err(CudaError::OutOfRange {
                what: "layers × experts (indirection-table cells)",
                value: self.layers as u64 * self.experts as u64,
                limit: cell_limit,
            });
        };
        let Some(slots_total) = self.layers.checked_mul(slots) else {
            return Err(CudaError::OutOfRange {
                what: "layers × (hot_per_layer + 1) (HBM slots)",
                value: self.layers as u64 * slots as u64,
                limit: cell_limit,
            });
        };
        if self.expert_bytes == 0 || !self.expert_bytes.is_multiple_of(16) {
            return Err(CudaError::Shape {
                what: "expert_bytes (a non-zero multiple of 16)",
                expected: self
                    .expert_bytes
                    .div_ceil(16)
                    .max(1)
                    .checked_mul(16)
                    .unwrap_or(u64::MAX - 15),
                got: self.expert_bytes,
            });
        }
        let units = u64::from(cells.max(slots_total));
        let fits = |n: u32| {
            u64::from(n)
                .checked_mul(self.expert_bytes)
                .is_some_and(|b| b <= MAX_TIER_BYTES)
        };
        if !fits(cells) || !fits(slots_total) {
            return Err(CudaError::OutOfRange {
                what: "expert_bytes (host or HBM bytes of the bank would exceed isize::MAX)",
                value: self.expert_bytes,
                limit: MAX_TIER_BYTES / units + 1,
            });
        }
        Ok(())
    }
    /// HBM slots per layer (`hot_per_layer + 1`: the last extra one is the spare; saturates at
    /// `u32::MAX` for a geometry [`validate`](Self::validate) rejects).
    pub fn slots_per_layer(&self) -> u32 {
        self.hot_per_layer.saturating_add(1)
    }
    /// Bytes of pinned host memory the bank holds (`layers × experts × expert_bytes`; saturates
    /// at `u64::MAX` for a geometry [`validate`](Self::validate) rejects, never wraps).
    pub fn host_bytes(&self) -> u64 {
        (self.layers as u64 * self.experts as u64).saturating_mul(self.expert_bytes)
    }
    /// Bytes of HBM the slots hold (`layers × (hot_per_layer + 1) × expert_bytes`; saturates at
    /// `u64::MAX` for a geometry [`validate`](Self::validate) rejects, never wraps).
    pub fn hbm_bytes(&self) -> u64 {
        (self.layers as u64 * (self.hot_per_layer as u64 + 1)).saturating_mul(self.expert_bytes)
    }
}

/// How [`ExpertBankGpu::commit_ready`] treats a swap whose copy has not completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// Leave it in flight (commit at a later boundary). The step stream never waits.
    Deferred,
    /// Make the step stream wait (on the GPU) for the copy, then flip.
    Wait,
}

/// A swap committed by [`ExpertBankGpu::commit_ready`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommittedSwap {
    /// Layer.
    pub layer: u32,
    /// Expert now hot.
    pub incoming: u32,
    /// Expert now cold.
    pub outgoing: u32,
    /// The layer's generation after the commit.
    pub generation: u64,
}

#[derive(Debug, Clone, Copy)]
struct Inflight {
    incoming: u32,
    outgoing: u32,
}

/// Experts of all layers in pinned host memory, hot slots + one spare per layer in HBM, and the
/// device indirection table. See the module docs for the swap protocol.
#[derive(Debug)]
pub struct ExpertBankGpu {
    gpu: Arc<Gpu>,
    geo: BankGeometry,
    host: PinnedBuffer<u8>,
    hbm: DeviceBuffer<u8>,
    table: DeviceBuffer<u64>,
    table_host: Vec<u64>,
    slot_of: Vec<u32>,
    expert_in_slot: Vec<u32>,
    spare: Vec<u32>,
    generation: Vec<u64>,
    inflight: Vec<Option<Inflight>>,
    copy_done: Vec<CudaEvent>,
    spare_fence: Vec<CudaEvent>,
    copy_stream: Arc<CudaStream>,
    f_update: CudaFunction,
    f_verify: CudaFunction,
    f_touch: CudaFunction,
    loaded: bool,
}

impl ExpertBankGpu {
    /// Allocates the bank (host experts zero-filled; fill them with
    /// [`ExpertBankGpu::host_expert_mut`] or [`ExpertBankGpu::fill_host`], then call
    /// [`ExpertBankGpu::load_map`]).
    ///
    /// # Errors
    /// Geometry errors; `CUDA_ERROR_OUT_OF_MEMORY` when HBM or pinnable host memory is short.
    pub fn new(gpu: &Arc<Gpu>, geo: BankGeometry) -> Result<Self> {
        geo.validate()?;
        let ctx = gpu.ctx();
        let host = PinnedBuffer::<u8>::zeroed(ctx, geo.host_bytes() as usize)?;
        let hbm = DeviceBuffer::<u8>::zeroed(ctx, geo.hbm_bytes() as usize)?;
        let cells = (geo.layers * geo.experts) as usize;
        let table = DeviceBuffer::<u64>::zeroed(ctx, cells)?;
        let mut copy_done = Vec::with_capacity(geo.layers as usize);
        let mut spare_fence = Vec::with_capacity(geo.layers as usize);
        for _ in 0..geo.layers {
            copy_done.push(ctx.new_event(None).map_err(drv("cuEventCreate"))?);
            spare_fence.push(ctx.new_event(None).map_err(drv("cuEventCreate"))?);
        }
        Ok(ExpertBankGpu {
            f_update: gpu.function(&BANK_MODULE, "tierkit_table_update")?,
            f_verify: gpu.function(&BANK_MODULE, "tierkit_verify_experts")?,
            f_touch: gpu.function(&BANK_MODULE, "tierkit_touch_experts")?,
            copy_stream: gpu.new_stream()?,
            gpu: gpu.clone(),
            geo,
            host,
            hbm,
            table,
            table_host: vec![0; cells],
            slot_of: vec![NONE; cells],
            expert_in_slot: vec![NONE; (geo.layers * geo.slots_per_layer()) as usize],
            spare: vec![geo.hot_per_layer; geo.layers as usize],
            generation: vec![0; geo.layers as usize],
            inflight: vec![None; geo.layers as usize],
            copy_done,
            spare_fence,
            loaded: false,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> BankGeometry {
        self.geo
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Device address of the indirection table: u64 `[layers][experts]`, fixed for the bank's life.
    pub fn table_ptr(&self) -> u64 {
        self.table.device_ptr()
    }

    /// The copy stream swaps copy on.
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy_stream
    }

    fn check(&self, layer: u32, expert: u32) -> Result<()> {
        if layer >= self.geo.layers {
            return Err(CudaError::OutOfRange {
                what: "layer",
                value: layer as u64,
                limit: self.geo.layers as u64,
            });
        }
        if expert >= self.geo.experts {
            return Err(CudaError::OutOfRange {
                what: "expert",
                value: expert as u64,
                limit: self.geo.experts as u64,
            });
        }
        Ok(())
    }

    /// Flat cell `layer * experts + expert`. Callers pass checked `(layer, expert)` (see
    /// [`Self::check`]): the cell is then below `layers × experts`, which
    /// [`BankGeometry::validate`] bounds to `u32`, so the `u32` arithmetic cannot overflow.
    fn cell(&self, layer: u32, expert: u32) -> usize {
        (layer * self.geo.experts + expert) as usize
    }

    /// Byte offset of a checked `(layer, expert)` in the host buffer (below `host_bytes`, which
    /// `validate` bounds to `isize::MAX`).
    fn host_offset(&self, layer: u32, expert: u32) -> usize {
        self.cell(layer, expert) * self.geo.expert_bytes as usize
    }

    /// Device address of HBM slot `slot` of `layer` (`slot <= hot_per_layer`; the last slot is
    /// the spare), or 0 (null) if `layer >= layers` or `slot > hot_per_layer`.
    pub fn slot_ptr(&self, layer: u32, slot: u32) -> u64 {
        if layer >= self.geo.layers || slot >= self.geo.slots_per_layer() {
            return 0;
        }
        // In range: the index is below layers × slots_per_layer, which validate bounds to u32.
        let i = (layer * self.geo.slots_per_layer() + slot) as u64;
        self.hbm.device_ptr() + i * self.geo.expert_bytes
    }

    /// Mapped device address of the pinned host copy of `(layer, expert)`, or 0 (null) if
    /// `layer >= layers` or `expert >= experts`.
    pub fn host_device_ptr(&self, layer: u32, expert: u32) -> u64 {
        if self.check(layer, expert).is_err() {
            return 0;
        }
        self.host.device_ptr() + self.host_offset(layer, expert) as u64
    }

    /// The host copy of an expert.
    pub fn host_expert(&self, layer: u32, expert: u32) -> Result<&[u8]> {
        self.check(layer, expert)?;
        let o = self.host_offset(layer, expert);
        Ok(&self.host.as_slice()[o..o + self.geo.expert_bytes as usize])
    }

    /// Mutable host copy of an expert (only before [`ExpertBankGpu::load_map`]: weights are
    /// read-only once the bank serves them).
    pub fn host_expert_mut(&mut self, layer: u32, expert: u32) -> Result<&mut [u8]> {
        self.check(layer, expert)?;
        if self.loaded {
            return Err(CudaError::Residency {
                layer,
                reason: "host experts are read-only once a map is loaded",
            });
        }
        let o = self.host_offset(layer, expert);
        let n = self.geo.expert_bytes as usize;
        Ok(&mut self.host.as_mut_slice()[o..o + n])
    }

    /// Fills every host expert with `f(layer, expert, bytes)`, on up to `threads` threads.
    pub fn fill_host<F>(&mut self, threads: usize, f: F) -> Result<()>
    where
        F: Fn(u32, u32, &mut [u8]) + Sync,
    {
        if self.loaded {
            return Err(CudaError::Residency {
                layer: 0,
                reason: "host experts are read-only once a map is loaded",
            });
        }
        let n = self.geo.expert_bytes as usize;
        let experts = self.geo.experts;
        let chunks: Vec<(usize, &mut [u8])> =
            self.host.as_mut_slice().chunks_mut(n).enumerate().collect();
        let threads = threads.max(1);
        let per = chunks.len().div_ceil(threads);
        let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
        let mut it = chunks.into_iter();
        loop {
            let g: Vec<_> = it.by_ref().take(per.max(1)).collect();
            if g.is_empty() {
                break;
            }
            groups.push(g);
        }
        let f = &f;
        std::thread::scope(|s| {
            for g in groups {
                s.spawn(move || {
                    for (i, buf) in g {
                        f(i as u32 / experts, i as u32 % experts, buf);
                    }
                });
            }
        });
        Ok(())
    }

    /// Loads a residency map synchronously (boot, or restore): `hot[layer]` lists the layer's hot
    /// experts (exactly `hot_per_layer` distinct ids); they are copied into slots `0..hot` in
    /// that order, the last slot becomes the spare, and the table is rewritten. Bumps every
    /// layer's generation.
    ///
    /// # Errors
    /// [`CudaError::Residency`] while a swap is in flight; shape/range errors (nothing changes).
    pub fn load_map(&mut self, hot: &[Vec<u32>]) -> Result<()> {
        if hot.len() != self.geo.layers as usize {
            return Err(CudaError::Shape {
                what: "hot map layers",
                expected: self.geo.layers as u64,
                got: hot.len() as u64,
            });
        }
        for (l, ids) in hot.iter().enumerate() {
            let l = l as u32;
            if ids.len() != self.geo.hot_per_layer as usize {
                return Err(CudaError::Shape {
                    what: "hot experts of a layer",
                    expected: self.geo.hot_per_layer as u64,
                    got: ids.len() as u64,
                });
            }
            let mut seen = vec![false; self.geo.experts as usize];
            for &e in ids {
                self.check(l, e)?;
                if std::mem::replace(&mut seen[e as usize], true) {
                    return Err(CudaError::Residency {
                        layer: l,
                        reason: "duplicate expert in hot map",
                    });
                }
            }
            if self.inflight[l as usize].is_some() {
                return Err(CudaError::Residency {
                    layer: l,
                    reason: "a swap is in flight",
                });
            }
        }
        self.gpu.synchronize()?;
        let eb = self.geo.expert_bytes as usize;
        let mut table = vec![0u64; self.table_host.len()];
        let mut slot_of = vec![NONE; self.slot_of.len()];
        let mut in_slot = vec![NONE; self.expert_in_slot.len()];
        for l in 0..self.geo.layers {
            for e in 0..self.geo.experts {
                table[self.cell(l, e)] = self.host_device_ptr(l, e);
            }
            for (s, &e) in hot[l as usize].iter().enumerate() {
                let s = s as u32;
                let o = self.host_offset(l, e);
                let src = &self.host.as_slice()[o..o + eb];
                // SAFETY: the slot lies inside our HBM allocation (s < slots_per_layer) and holds
                // `eb` bytes; the device is idle (synchronized above), so no kernel reads it.
                unsafe { result::memcpy_htod_sync(self.slot_ptr(l, s), src) }
                    .map_err(drv("cuMemcpyHtoD(load_map)"))?;
                table[self.cell(l, e)] = self.slot_ptr(l, s);
                slot_of[self.cell(l, e)] = s;
                in_slot[(l * self.geo.slots_per_layer() + s) as usize] = e;
            }
        }
        // `upload` synchronizes the context, so the slot copies above have landed too.
        self.table.upload(&table)?;
        self.table_host = table;
        self.slot_of = slot_of;
        self.expert_in_slot = in_slot;
        for l in 0..self.geo.layers as usize {
            self.spare[l] = self.geo.hot_per_layer;
            self.generation[l] += 1;
        }
        self.loaded = true;
        Ok(())
    }

    /// Whether `(layer, expert)` is hot (in an HBM slot) as of the last commit.
    pub fn is_hot(&self, layer: u32, expert: u32) -> bool {
        layer < self.geo.layers
            && expert < self.geo.experts
            && self.slot_of[self.cell(layer, expert)] != NONE
    }

    /// The layer's hot experts, by slot (the spare slot is skipped); empty if
    /// `layer >= layers`.
    pub fn hot_experts(&self, layer: u32) -> Vec<u32> {
        if layer >= self.geo.layers {
            return Vec::new();
        }
        let s = self.geo.slots_per_layer();
        (0..s)
            .map(|i| self.expert_in_slot[(layer * s + i) as usize])
            .filter(|&e| e != NONE)
            .collect()
    }

    /// The layer's generation (bumped at each commit and each map load).
    pub fn generation(&self, layer: u32) -> u64 {
        self.generation.get(layer as usize).copied().unwrap_or(0)
    }

    /// The table entry `(layer, expert)` as the step stream will see it after the queued flips.
    pub fn entry(&self, layer: u32, expert: u32) -> Result<u64> {
        self.check(layer, expert)?;
        Ok(self.table_host[self.cell(layer, expert)])
    }

    /// Whether a swap copy is in flight on the layer's spare slot.
    pub fn in_flight(&self, layer: u32) -> bool {
        self.inflight
            .get(layer as usize)
            .is_some_and(|f| f.is_some())
    }

    /// Starts a swap: copies `incoming` (cold) of `layer` into the layer's spare HBM slot on the
    /// copy stream, after the spare's reader fence; `outgoing` (hot) leaves at the commit.
    /// `planned_generation` is the layer generation the swap was planned against.
    ///
    /// # Errors
    /// [`CudaError::StaleGeneration`] if the layer moved on; [`CudaError::Residency`] if
    /// `incoming` is hot, `outgoing` is cold, no map is loaded, or a copy is already in flight
    /// on the layer; range errors; CUDA errors. Nothing changes on error.
    pub fn begin_swap(
        &mut self,
        layer: u32,
        incoming: u32,
        outgoing: u32,
        planned_generation: u64,
    ) -> Result<()> {
        self.check(layer, incoming)?;
        self.check(layer, outgoing)?;
        let bad = |reason| Err(CudaError::Residency { layer, reason });
        if !self.loaded {
            return bad("no residency map loaded");
        }
        let cur = self.generation[layer as usize];
        if planned_generation != cur {
            return Err(CudaError::StaleGeneration {
                layer,
                planned: planned_generation,
                current: cur,
            });
        }
        if self.inflight[layer as usize].is_some() {
            return bad("a swap copy is already in flight on this layer's spare slot");
        }
        if self.is_hot(layer, incoming) {
            return bad("incoming expert is already hot");
        }
        if !self.is_hot(layer, outgoing) {
            return bad("outgoing expert is not hot");
        }
        let l = layer as usize;
        self.copy_stream
            .wait(&self.spare_fence[l])
            .map_err(drv("cuStreamWaitEvent(spare fence)"))?;
        let o = self.host_offset(layer, incoming);
        let dst = self.slot_ptr(layer, self.spare[l]);
        // SAFETY: source is `expert_bytes` bytes of our pinned allocation (never written once a
        // map is loaded, and freed only after synchronisation in Drop); the destination is the
        // layer's spare slot, which no table entry points to and whose last readers are ordered
        // before this copy by the spare fence waited on above.
        unsafe {
            copy_htod_async(
                dst,
                self.host.as_slice()[o..].as_ptr(),
                self.geo.expert_bytes as usize,
                &self.copy_stream,
            )?
        };
        self.copy_done[l]
            .record(&self.copy_stream)
            .map_err(drv("cuEventRecord(copy done)"))?;
        self.inflight[l] = Some(Inflight { incoming, outgoing });
        Ok(())
    }

    /// Whether the layer's in-flight copy has completed (`false` if none is in flight).
    pub fn copy_complete(&self, layer: u32) -> Result<bool> {
        match self.inflight.get(layer as usize) {
            Some(Some(_)) => self.copy_done[layer as usize]
                .try_is_complete()
                .map_err(drv("cuEventQuery(copy done)")),
            _ => Ok(false),
        }
    }

    /// Drops the layer's in-flight swap without flipping (the spare keeps garbage nobody reads).
    pub fn cancel_swap(&mut self, layer: u32) -> bool {
        self.inflight
            .get_mut(layer as usize)
            .and_then(|f| f.take())
            .is_some()
    }

    /// Step boundary: commits in-flight swaps (all of them in [`CommitMode::Wait`], only those
    /// whose copy completed in [`CommitMode::Deferred`]) by flipping their table entries with one
    /// tiny kernel per 32 swaps on `stream` (the step stream), then records each layer's new
    /// spare fence on `stream`. Returns the committed swaps; the others stay in flight.
    ///
    /// # Errors
    /// CUDA errors; on error no mirror state changes (a flip kernel that did launch before a
    /// later failure is reported through the error only if the launch itself failed).
    pub fn commit_ready(
        &mut self,
        stream: &CudaStream,
        mode: CommitMode,
    ) -> Result<Vec<CommittedSwap>> {
        let mut ready: Vec<u32> = Vec::new();
        for l in 0..self.geo.layers {
            if self.inflight[l as usize].is_none() {
                continue;
            }
            let done = match mode {
                CommitMode::Wait => true,
                CommitMode::Deferred => self.copy_done[l as usize]
                    .try_is_complete()
                    .map_err(drv("cuEventQuery(copy done)"))?,
            };
            if done {
                ready.push(l);
            }
        }
        self.commit_layers(stream, &ready)
    }

    /// Step boundary, explicit form: commits the in-flight swaps of exactly `layers` (each must
    /// have one in flight), whatever their copy state: the step stream first waits on the GPU for
    /// each copy, so a flip never exposes a half-copied slot. Used by executors that must ask the
    /// controller about each swap before flipping it.
    ///
    /// # Errors
    /// [`CudaError::Residency`] if a listed layer has no swap in flight or is listed twice
    /// (nothing changes); CUDA errors.
    pub fn commit_layers(
        &mut self,
        stream: &CudaStream,
        layers: &[u32],
    ) -> Result<Vec<CommittedSwap>> {
        let ready = layers;
        let mut seen = vec![false; self.geo.layers as usize];
        for &l in ready {
            if l >= self.geo.layers || self.inflight[l as usize].is_none() {
                return Err(CudaError::Residency {
                    layer: l,
                    reason: "no swap in flight to commit",
                });
            }
            if std::mem::replace(&mut seen[l as usize], true) {
                return Err(CudaError::Residency {
                    layer: l,
                    reason: "layer listed twice",
                });
            }
        }
        if ready.is_empty() {
            return Ok(Vec::new());
        }
        // Order the flips after the copies on the GPU too (free for completed copies; in Wait mode
        // this is where the step stream waits). Memory written by the copy stream is visible to
        // the step stream's later kernels through this event dependency.
        for &l in ready {
            stream
                .wait(&self.copy_done[l as usize])
                .map_err(drv("cuStreamWaitEvent(copy done)"))?;
        }
        let mut pairs: Vec<(u32, u64)> = Vec::with_capacity(ready.len() * 2);
        for &l in ready {
            let f = self.inflight[l as usize].expect("ready layers are in flight");
            pairs.push((
                self.cell(l, f.incoming) as u32,
                self.slot_ptr(l, self.spare[l as usize]),
            ));
            pairs.push((
                self.cell(l, f.outgoing) as u32,
                self.host_device_ptr(l, f.outgoing),
            ));
        }
        self.launch_updates(stream, &pairs)?;
        let mut out = Vec::with_capacity(ready.len());
        for &l in ready {
            let li = l as usize;
            let f = self.inflight[li]
                .take()
                .expect("ready layers are in flight");
            let new_slot = self.spare[li];
            let old_slot = self.slot_of[self.cell(l, f.outgoing)];
            let spl = self.geo.slots_per_layer();
            let (ci, co) = (self.cell(l, f.incoming), self.cell(l, f.outgoing));
            self.table_host[ci] = self.slot_ptr(l, new_slot);
            self.table_host[co] = self.host_device_ptr(l, f.outgoing);
            self.slot_of[ci] = new_slot;
            self.slot_of[co] = NONE;
            self.expert_in_slot[(l * spl + new_slot) as usize] = f.incoming;
            self.expert_in_slot[(l * spl + old_slot) as usize] = NONE;
            self.spare[li] = old_slot;
            self.generation[li] += 1;
            // Reader fence: everything queued on the step stream so far (the steps that could
            // read `old_slot` through the old table entry) completes before this event.
            self.spare_fence[li]
                .record(stream)
                .map_err(drv("cuEventRecord(spare fence)"))?;
            out.push(CommittedSwap {
                layer: l,
                incoming: f.incoming,
                outgoing: f.outgoing,
                generation: self.generation[li],
            });
        }
        Ok(out)
    }

    fn launch_updates(&self, stream: &CudaStream, pairs: &[(u32, u64)]) -> Result<()> {
        let table = self.table.device_ptr();
        for chunk in pairs.chunks(MAX_UPDATES_PER_LAUNCH) {
            let mut u = TableUpdate {
                n: chunk.len() as u32,
                idx: [0; MAX_UPDATES_PER_LAUNCH],
                val: [0; MAX_UPDATES_PER_LAUNCH],
            };
            for (i, &(idx, val)) in chunk.iter().enumerate() {
                u.idx[i] = idx;
                u.val[i] = val;
            }
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (MAX_UPDATES_PER_LAUNCH as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = stream.launch_builder(&self.f_update);
            b.arg(&table).arg(&u);
            // SAFETY: `tierkit_table_update(u64* table, TierkitTableUpdate u)`; every idx is a
            // cell index < layers * experts of our table allocation (built from checked ids).
            unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_table_update)"))?;
        }
        Ok(())
    }

    fn check_picks(&self, picks: &DeviceBuffer<u32>) -> Result<()> {
        if picks.is_empty() || picks.len() > u32::MAX as usize {
            return Err(CudaError::Shape {
                what: "picks (flat layer * experts + expert indices)",
                expected: 1,
                got: picks.len() as u64,
            });
        }
        Ok(())
    }

    /// Launches the checksum reader on `stream`: one block per entry of `picks` (flat indices
    /// `layer * experts + expert`, each `< layers * experts`, not checked on the device) reads
    /// that expert through the indirection table (HBM or mapped host) and verifies the pattern
    /// of [`write_expert_pattern`]; `errors` (u32 `[2]`) gets `[0] += bad`, `[1] = last bad index`.
    pub fn launch_checksum_reader(
        &self,
        stream: &CudaStream,
        picks: &DeviceBuffer<u32>,
        errors: &DeviceBuffer<u32>,
    ) -> Result<()> {
        self.check_picks(picks)?;
        if errors.len() < 2 || self.geo.expert_bytes < 8 {
            return Err(CudaError::Shape {
                what: "errors (u32 [2])",
                expected: 2,
                got: errors.len() as u64,
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (picks.len() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (table, p, n, words, e) = (
            self.table.device_ptr(),
            picks.device_ptr(),
            picks.len() as u32,
            self.geo.expert_bytes / 4,
            errors.device_ptr(),
        );
        let mut b = stream.launch_builder(&self.f_verify);
        b.arg(&table).arg(&p).arg(&n).arg(&words).arg(&e);
        // SAFETY: signature (u64*, u32*, u32, u64, u32*) of `tierkit_verify_experts`; the kernel
        // reads `picks[0..n]`, table entries (valid pointers to `expert_bytes` bytes each) and
        // writes `errors[0..2]`. The caller guarantees pick values are < layers * experts.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_verify_experts)"))?;
        Ok(())
    }

    /// Launches the bandwidth reader on `stream` (a stand-in for expert FFN weight reads):
    /// `blocks_per_expert` blocks of 256 threads read each picked expert whole through the
    /// table with 16-byte loads. `sink` (u32 `[1]`) keeps the loads alive.
    pub fn launch_touch_reader(
        &self,
        stream: &CudaStream,
        picks: &DeviceBuffer<u32>,
        blocks_per_expert: u32,
        sink: &DeviceBuffer<u32>,
    ) -> Result<()> {
        self.check_picks(picks)?;
        if sink.is_empty() {
            return Err(CudaError::Shape {
                what: "sink (u32 [1])",
                expected: 1,
                got: 0,
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks_per_expert.max(1), picks.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (table, p, bytes, sk) = (
            self.table.device_ptr(),
            picks.device_ptr(),
            self.geo.expert_bytes,
            sink.device_ptr(),
        );
        let mut b = stream.launch_builder(&self.f_touch);
        b.arg(&table).arg(&p).arg(&bytes).arg(&sk);
        // SAFETY: signature (u64*, u32*, u64, u32*) of `tierkit_touch_experts`; reads table
        // entries for picks (< layers * experts, caller's contract) and `expert_bytes` bytes
        // behind each; writes at most `sink[0]`.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_touch_experts)"))?;
        Ok(())
    }

    /// Checks, after synchronizing the device, that the device table equals the host mirror and
    /// that every occupied HBM slot holds exactly the bytes of the host copy of its expert.
    /// Returns the number of mismatching entries plus mismatching slots (0 = consistent).
    pub fn verify_consistency(&self) -> Result<u64> {
        self.gpu.synchronize()?;
        let mut bad = 0u64;
        let table = self.table.download()?;
        bad += table
            .iter()
            .zip(&self.table_host)
            .filter(|(a, b)| a != b)
            .count() as u64;
        let eb = self.geo.expert_bytes as usize;
        let mut buf = vec![0u8; eb];
        let spl = self.geo.slots_per_layer();
        for l in 0..self.geo.layers {
            for s in 0..spl {
                let e = self.expert_in_slot[(l * spl + s) as usize];
                if e == NONE {
                    continue;
                }
                // SAFETY: the slot lies inside our HBM allocation and holds `eb` bytes; the
                // device is idle (synchronized above).
                unsafe { result::memcpy_dtoh_sync(&mut buf, self.slot_ptr(l, s)) }
                    .map_err(drv("cuMemcpyDtoH(verify)"))?;
                if buf.as_slice() != self.host_expert(l, e)? {
                    bad += 1;
                }
            }
        }
        Ok(bad)
    }
}

impl Drop for ExpertBankGpu {
    fn drop(&mut self) {
        // Copies may still read the pinned host buffer: wait for them before the buffers go.
        let _ = self.copy_stream.synchronize();
    }
}

/// Checksum mix shared with the `tierkit_verify_experts` kernel.
fn mix(w: u32, i: u32) -> u32 {
    let h = (w ^ i.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B);
    h ^ (h >> 13)
}

/// Writes the self-checking test pattern into an expert's bytes (length a multiple of 4, ≥ 8):
/// word 0 = `tag` (the flat index `layer * experts + expert`), words `1..last` pseudo-random
/// from `(seed, tag)`, last word = `Σ mix(w[i], i)` over the others (what the checksum reader
/// kernel recomputes, so a torn or stale read is caught).
pub fn write_expert_pattern(bytes: &mut [u8], tag: u32, seed: u64) {
    let words: &mut [u32] = bytemuck::cast_slice_mut(bytes);
    let last = words.len() - 1;
    words[0] = tag;
    let mut x = seed ^ ((tag as u64) << 32) ^ 0xD1B5_4A32_D192_ED03;
    let mut sum = mix(tag, 0);
    for (i, w) in words.iter_mut().enumerate().take(last).skip(1) {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        *w = (z ^ (z >> 31)) as u32;
        sum = sum.wrapping_add(mix(*w, i as u32));
    }
    words[last] = sum;
}

/// CPU reference of the checksum reader: whether `bytes` hold a valid pattern with tag `tag`.
pub fn check_expert_pattern(bytes: &[u8], tag: u32) -> bool {
    let Ok(words) = bytemuck::try_cast_slice::<u8, u32>(bytes) else {
        return false;
    };
    if words.len() < 2 || words[0] != tag {
        return false;
    }
    let last = words.len() - 1;
    let sum = words[..last]
        .iter()
        .enumerate()
        .fold(0u32, |s, (i, &w)| s.wrapping_add(mix(w, i as u32)));
    sum == words[last]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_roundtrip_and_tear_detection() {
        let mut a = vec![0u32; 1024];
        let mut b = vec![0u32; 1024];
        write_expert_pattern(bytemuck::cast_slice_mut(&mut a), 7, 1);
        write_expert_pattern(bytemuck::cast_slice_mut(&mut b), 8, 1);
        assert!(check_expert_pattern(bytemuck::cast_slice(&a), 7));
        assert!(!check_expert_pattern(bytemuck::cast_slice(&a), 8));
        // torn: first half of b, second half of a, with a's tag
        let mut torn = a.clone();
        torn[1..512].copy_from_slice(&b[1..512]);
        assert!(!check_expert_pattern(bytemuck::cast_slice(&torn), 7));
    }

    #[test]
    fn geometry_validation() {
        let g = BankGeometry {
            layers: 2,
            experts: 4,
            hot_per_layer: 5,
            expert_bytes: 16,
        };
        assert!(g.validate().is_err());
        let g = BankGeometry {
            layers: 2,
            experts: 4,
            hot_per_layer: 2,
            expert_bytes: 12,
        };
        assert!(g.validate().is_err());
        let g = BankGeometry {
            layers: 2,
            experts: 4,
            hot_per_layer: 2,
            expert_bytes: 32,
        };
        assert!(g.validate().is_ok());
        assert_eq!(g.hbm_bytes(), 2 * 3 * 32);
        assert_eq!(g.host_bytes(), 2 * 4 * 32);
    }

    fn geo(layers: u32, experts: u32, hot_per_layer: u32, expert_bytes: u64) -> BankGeometry {
        BankGeometry {
            layers,
            experts,
            hot_per_layer,
            expert_bytes,
        }
    }

    fn rejected_field(g: BankGeometry) -> (&'static str, u64, u64) {
        match g.validate() {
            Err(CudaError::OutOfRange { what, value, limit }) => (what, value, limit),
            other => panic!("{g:?}: expected OutOfRange, got {other:?}"),
        }
    }

    /// Pure arithmetic, no GPU: every product the bank indexes or allocates with is checked.
    #[test]
    fn geometry_validation_rejects_overflowing_products() {
        // The breaker's case: 65536 × 65536 cells wrapped the u32 table index to 0, and both
        // byte totals wrapped to 0.
        let g = geo(65536, 65536, 65535, 1 << 48);
        let (what, value, limit) = rejected_field(g);
        assert!(what.contains("cells"), "{what}");
        assert_eq!((value, limit), (1 << 32, 1 << 32));
        assert_eq!((g.host_bytes(), g.hbm_bytes()), (u64::MAX, u64::MAX));
        // Cells fit exactly (65537 × 65535 = u32::MAX), HBM slots do not.
        let g = geo(65537, 65535, 65535, 16);
        let (what, value, _) = rejected_field(g);
        assert!(what.contains("HBM slots"), "{what}");
        assert_eq!(value, 65537 * 65536);
        assert!(geo(65537, 65535, 65534, 16).validate().is_ok());
        // hot_per_layer + 1 spare slot would wrap.
        let g = geo(1, u32::MAX, u32::MAX, 16);
        assert!(rejected_field(g).0.starts_with("hot_per_layer"));
        assert_eq!(g.slots_per_layer(), u32::MAX, "saturates, never wraps to 0");
        assert!(geo(1, u32::MAX, u32::MAX - 1, 16).validate().is_ok());
        // Byte totals: 16 cells × 2^62 bytes overflows u64; the limit is the first
        // expert_bytes that no longer fits isize::MAX.
        let (what, value, limit) = rejected_field(geo(4, 4, 2, 1 << 62));
        assert!(what.starts_with("expert_bytes"), "{what}");
        assert_eq!((value, limit), (1 << 62, 1 << 59));
        assert!(geo(4, 4, 2, (1 << 59) - 16).validate().is_ok());
        assert!(geo(4, 4, 2, 1 << 59).validate().is_err());
        // HBM is the larger tier when every expert is hot: 2 × 5 slots > 2 × 4 cells. Here the
        // host total fits (8 × (2^60 - 16) < 2^63) and only HBM does not.
        let g = geo(2, 4, 4, (1 << 60) - 16);
        assert!(g.host_bytes() <= isize::MAX as u64);
        let (_, _, limit) = rejected_field(g);
        assert_eq!(limit, isize::MAX as u64 / 10 + 1);
        let g = geo(2, 4, 4, 16 * (isize::MAX as u64 / 160));
        assert!(g.validate().is_ok());
        assert_eq!(g.hbm_bytes(), 10 * g.expert_bytes);
        // The multiple-of-16 hint no longer overflows near u64::MAX.
        assert_eq!(
            geo(1, 1, 0, u64::MAX).validate().unwrap_err(),
            CudaError::Shape {
                what: "expert_bytes (a non-zero multiple of 16)",
                expected: u64::MAX - 15,
                got: u64::MAX
            }
        );
    }
}
