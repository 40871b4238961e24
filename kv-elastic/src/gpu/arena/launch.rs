//! [`GpuArena`]'s launches: the resolve and replay kernels on its tables and the copy-engine
//! copies of miss plans (the device state and its host calls are `arena.rs`'s).

use super::*;

impl GpuArena {
    /// [`KvKernels::resolve_async`] on these tables: the picks resolve against the hot cache of
    /// `a.layer`'s layer group, and the misses are copied into every layer of the group.
    ///
    /// # Errors
    /// As [`GpuArena::resolve_async_with`].
    ///
    /// # Safety
    /// Every pointer of `a` addresses a live device buffer of the documented shape; no other
    /// stream touches the tables or the hot rows while the kernel runs.
    pub unsafe fn resolve_async(
        &self,
        stream: &CudaStream,
        a: &KvResolveArgs,
        backend: CopyBackend,
    ) -> Result<()> {
        // SAFETY: forwarded; the default options name no extra buffer.
        unsafe { self.resolve_async_with(stream, a, &KvResolveOptions::default(), backend) }
    }

    /// [`KvKernels::resolve_async_with`] on these tables: output layout (packed, FlashMLA
    /// `topk_length`-compatible, or in place), per-query causal bounds and padded oversized output
    /// buffers ([`KvResolveOptions`]). The picks resolve against the hot cache of `a.layer`'s
    /// layer group, and the misses are copied into every layer of the group (`o.fill_layers` is
    /// set to the group's; with [`CopyBackend::Dma`] the caller copies the plan into them).
    ///
    /// # Errors
    /// `OutOfRange` for `a.layer`; as [`KvKernels::resolve_async_with`].
    ///
    /// # Safety
    /// As [`GpuArena::resolve_async`]; `o.query_seq_lens` is 0 or a live `int32 [rows]`, and the
    /// output buffers hold `o.indices_len` / `o.valid_len` entries when those are non-zero.
    pub unsafe fn resolve_async_with(
        &self,
        stream: &CudaStream,
        a: &KvResolveArgs,
        o: &KvResolveOptions,
        backend: CopyBackend,
    ) -> Result<()> {
        let (group, layers) = self.group_at(a.layer)?;
        let a = KvResolveArgs {
            layer: layers.start,
            ..*a
        };
        let o = KvResolveOptions {
            fill_layers: layers.len() as u32,
            ..*o
        };
        let t = self.tables(group)?;
        // SAFETY: our tables are live and shaped by `dims` (the group's hot tables inside their
        // allocations); the rest is the caller's contract.
        unsafe {
            self.kernels
                .resolve_async_with(stream, &self.dims, &t, &a, &o, backend)
        }
    }

    /// Replays plan segments into layers `l0 .. l0 + nl` of one layer group
    /// ([`KvKernels::replay_fresh_async`] on the group's tables): each entry is copied only where
    /// its destination row still holds its position in that group's hot cache; entries of a
    /// stale plan, or of another group's plan (whose rows hold other positions here), are skipped
    /// and counted in [`KvErrors::stale_plan`]. Resolves and prefetches already fill every layer
    /// of their group, so this is never needed for exactness.
    ///
    /// # Errors
    /// `OutOfRange` for a layer range past the last layer or across two layer groups; the
    /// driver's launch error.
    ///
    /// # Safety
    /// `plan` holds `segments × stride` [`KvCopy`] and `count` `segments` u32 on the device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn replay_async(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        let (group, layers) = self.group_at(l0)?;
        if nl == 0 || l0 as u64 + nl as u64 > layers.end as u64 {
            return Err(CudaError::OutOfRange {
                what: "replay layer range end (within the layer group of its first layer)",
                value: l0 as u64 + nl as u64,
                limit: layers.end as u64 + 1,
            });
        }
        let t = self.tables(group)?;
        // SAFETY: our tables are live and shaped by `dims`; the kernel checks each entry against
        // the group's tables before copying; the rest is the caller's contract.
        unsafe {
            self.kernels.replay_fresh_async(
                stream, &self.dims, &t, plan, count, segments, stride, l0, nl,
            )
        }
    }

    /// Copies `(slot, position) → dst_row` entries from the pinned store into layers `l0 .. l0 +
    /// nl` without checking the hot tables ([`KvKernels::replay_async`]): page fills, and plans
    /// the caller has just checked fresh.
    ///
    /// # Safety
    /// As [`KvKernels::replay_async`]: the rows are the copies' to write.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn fill_rows_async(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        let t = self.tables(0)?;
        // SAFETY: our tables are live and shaped by `dims`; the rest is the caller's contract.
        unsafe {
            self.kernels.replay_async(
                stream, &self.dims, &t, plan, count, segments, stride, l0, nl,
            )
        }
    }

    /// [`KvKernels::check_plan_async`] on the tables of `layer`'s layer group.
    ///
    /// # Errors
    /// `OutOfRange` for `layer`; the driver's launch error.
    ///
    /// # Safety
    /// `plan` holds `segments × stride` [`KvCopy`] and `count` `segments` u32 on the device.
    pub unsafe fn check_plan_async(
        &self,
        stream: &CudaStream,
        plan: u64,
        count: u64,
        segments: u32,
        stride: u32,
        layer: u32,
    ) -> Result<()> {
        let (group, _) = self.group_at(layer)?;
        let t = self.tables(group)?;
        // SAFETY: our tables are live and shaped by `dims`; the rest is the caller's contract.
        unsafe {
            self.kernels
                .check_plan_async(stream, &self.dims, &t, plan, count, segments, stride)
        }
    }

    /// [`KvKernels::prefetch_async`] on the hot cache of `layer`'s layer group: the candidates
    /// are copied into every layer of the group.
    ///
    /// # Errors
    /// `OutOfRange` for `layer`; the driver's launch error.
    ///
    /// # Safety
    /// Device buffers of the documented shapes; no resolve of the same slots in flight.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn prefetch_async(
        &self,
        stream: &CudaStream,
        slots: u64,
        cand: u64,
        cand_count: u64,
        requests: u32,
        stride: u32,
        layer: u32,
        plan: u64,
        plan_count: u64,
    ) -> Result<()> {
        let (group, layers) = self.group_at(layer)?;
        let (l0, nl) = (layers.start, layers.len() as u32);
        let t = self.tables(group)?;
        // SAFETY: our tables are live and shaped by `dims`; the rest is the caller's contract.
        unsafe {
            self.kernels.prefetch_async(
                stream, &self.dims, &t, slots, cand, cand_count, requests, stride, l0, nl, plan,
                plan_count,
            )
        }
    }

    /// [`KvKernels::write_back_async`] on these tables.
    ///
    /// # Safety
    /// `items` holds `n` [`KvCopy`] on the device; the host must not read the rows until the
    /// stream passes this launch.
    pub unsafe fn write_back_async(
        &self,
        stream: &CudaStream,
        items: u64,
        n: u32,
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        let (d, t) = (&self.dims, &self.tables(0)?);
        // SAFETY: our tables are live and shaped by `dims`; the rest is the caller's contract.
        unsafe {
            self.kernels
                .write_back_async(stream, d, t, items, n, l0, nl)
        }
    }

    /// Page fills by the copy engines ([`KvKernels::dma_runs_async`]): `copies` coalesced into
    /// runs of consecutive positions on consecutive rows, one descriptor each. `Ok(None)` (nothing
    /// copied) where the host store interleaves layers (more than one layer): use the gather.
    ///
    /// # Errors
    /// `OutOfRange` for entries outside the tables; the driver's error.
    pub fn dma_runs_async(&self, stream: &CudaStream, copies: &[KvCopy]) -> Result<Option<usize>> {
        let (d, t) = (&self.dims, &self.tables(0)?);
        let host = self.host.host_ptr();
        // SAFETY: the arena and the pinned store are owned by `self`, which the caller keeps alive
        // until the stream passes the copy (as with every launcher of this type).
        unsafe { self.kernels.dma_runs_async(stream, d, t, host, copies) }
    }

    /// The DMA back-end on these tables ([`KvKernels::dma_copy_async`] with the overlap hint):
    /// copies `copies` (host list) from the pinned host store into layers `l0 .. l0 + nl`.
    ///
    /// # Errors
    /// `OutOfRange` for entries outside the tables; the driver's error (e.g.
    /// `CUDA_ERROR_NOT_SUPPORTED` on drivers before 12.8).
    pub fn dma_copy_async(
        &self,
        stream: &CudaStream,
        copies: &[KvCopy],
        l0: u32,
        nl: u32,
    ) -> Result<()> {
        self.dma_copy_async_with(stream, copies, l0, nl, true)
    }

    /// [`GpuArena::dma_copy_async`] with the copy hint chosen: `prefer_overlap = true` sets
    /// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`, `false` leaves the driver's default.
    pub fn dma_copy_async_with(
        &self,
        stream: &CudaStream,
        copies: &[KvCopy],
        l0: u32,
        nl: u32,
        prefer_overlap: bool,
    ) -> Result<()> {
        let (d, t) = (&self.dims, &self.tables(0)?);
        let host = self.host.host_ptr();
        // SAFETY: the arena and the pinned store are owned by `self`, which the caller keeps alive
        // until the stream passes the copy (as with every launcher of this type).
        unsafe {
            self.kernels
                .dma_copy_async(stream, d, t, host, copies, l0, nl, prefer_overlap)
        }
    }
}
