//! The GPU pool as a [`Resolver`]: host-slice inputs uploaded, the fused kernels launched on
//! the step stream, outputs downloaded (engines use the device API instead; see the parent module).

use super::*;

impl GpuElasticPool {
    pub(super) fn plan_from_device(&self, copies: &[KvCopy]) -> Vec<RowCopy> {
        copies
            .iter()
            .map(|c| RowCopy {
                session: self
                    .pinned()
                    .session_at(c.slot)
                    .expect("plan rows name live slots"),
                position: c.position,
                dst_row: c.dst_row,
            })
            .collect()
    }

    pub(super) fn device_errors_clean(&mut self, layer: u32) -> Result<()> {
        let mut e = self.cpu.data.dev.errors().map_err(cuda)?;
        // Overflow is not bad input: the step was served as far as the hot cache allowed (the
        // unserved picks are in the stats); clear the word so it does not accumulate.
        let overflowed = e.overflow > 0;
        e.overflow = 0;
        if overflowed && e.is_clean() {
            self.cpu.data.dev.clear_errors().map_err(cuda)?;
        }
        if !e.is_clean() {
            self.cpu.data.dev.clear_errors().map_err(cuda)?;
            return Err(KvError::Cuda(CudaError::Residency {
                layer,
                reason: "device kernel reported bad input that passed host validation",
            }));
        }
        Ok(())
    }

    /// Copies `copies` into layers `layers` with the configured back-end (synchronous).
    pub(super) fn copy_rows(&self, copies: &[KvCopy], layers: std::ops::Range<u32>) -> Result<()> {
        let (l0, nl) = (layers.start, layers.len() as u32);
        if copies.is_empty() {
            return Ok(());
        }
        let gpu = self.cpu.data.dev.gpu().clone();
        let stream = gpu.stream();
        match self.gcfg.backend {
            CopyBackend::Dma => self.cpu.data.dev.dma_copy_async(stream, copies, l0, nl),
            CopyBackend::Gather => {
                let ctx = gpu.ctx();
                let plan = DeviceBuffer::from_host(ctx, copies)?;
                let count = DeviceBuffer::from_host(ctx, &[copies.len() as u32])?;
                gpu.synchronize()?;
                // SAFETY: one segment of `copies.len()` entries in live device buffers that outlive
                // the launch (we synchronize below); the plan's rows were checked fresh.
                unsafe {
                    self.cpu.data.dev.fill_rows_async(
                        stream,
                        plan.device_ptr(),
                        count.device_ptr(),
                        1,
                        copies.len() as u32,
                        l0,
                        nl,
                    )
                }?;
                stream
                    .synchronize()
                    .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
            }
        }
        .map_err(cuda)?;
        stream
            .synchronize()
            .map_err(|e| cuda(CudaError::driver("cuStreamSynchronize", e)))
    }
}

impl Resolver for GpuElasticPool {
    fn resolve_with(
        &mut self,
        input: &ResolveInput<'_>,
        opts: &ResolveOptions<'_>,
        out: &mut ResolveOutput<'_>,
    ) -> Result<Resolved> {
        self.check_poison()?;
        // The same checks, errors and output fill as the CPU reference.
        let wanted = self.cpu.validate_resolve(input, opts, out)?.picks;
        let rows = input.topk.len() / input.k;
        let reqs = input.sessions.len();
        let slots: Vec<i32> = input
            .sessions
            .iter()
            .map(|&s| self.slot_of(s).map(|b| b as i32))
            .collect::<Result<_>>()?;
        let gpu = self.cpu.data.dev.gpu().clone();
        let ctx = gpu.ctx();
        let hot = self.cpu.data.dev.dims().hot_rows as usize;
        let dev_in = (|| -> cuda_kernels::Result<_> {
            Ok((
                DeviceBuffer::from_host(ctx, input.topk)?,
                DeviceBuffer::from_host(ctx, input.query_start_loc)?,
                DeviceBuffer::from_host(ctx, input.seq_lens)?,
                DeviceBuffer::from_host(ctx, &slots)?,
                DeviceBuffer::<i32>::zeroed(ctx, out.indices.len().max(1))?,
                DeviceBuffer::<i32>::zeroed(ctx, out.valid_count.len().max(1))?,
                DeviceBuffer::from_host(ctx, opts.query_seq_lens.unwrap_or(&[0]))?,
                DeviceBuffer::<KvCopy>::zeroed(ctx, reqs * hot)?,
                DeviceBuffer::<u32>::zeroed(ctx, reqs)?,
                DeviceBuffer::<u32>::zeroed(ctx, reqs * KV_STATS)?,
            ))
        })()
        .map_err(cuda)?;
        let (topk, qsl, seq, slot_buf, idx, valid, qseq, plan, plan_count, stats) = dev_in;
        gpu.synchronize().map_err(cuda)?;
        let args = KvResolveArgs {
            topk: topk.device_ptr(),
            query_start_loc: qsl.device_ptr(),
            seq_lens: seq.device_ptr(),
            session_slot: slot_buf.device_ptr(),
            sessions: reqs as u32,
            rows: rows as u32,
            k: input.k as u32,
            layer: input.layer,
            indices: idx.device_ptr(),
            valid_count: valid.device_ptr(),
            plan: plan.device_ptr(),
            plan_count: plan_count.device_ptr(),
            stats: stats.device_ptr(),
        };
        let o = KvResolveOptions {
            layout: match opts.layout {
                OutputLayout::InPlace => KV_LAYOUT_IN_PLACE,
                OutputLayout::Packed => KV_LAYOUT_PACKED,
            },
            query_seq_lens: if opts.query_seq_lens.is_some() {
                qseq.device_ptr()
            } else {
                0
            },
            indices_len: out.indices.len() as u64,
            valid_len: out.valid_count.len() as u64,
            plan_count_len: 0,
            #[cfg(feature = "test-hooks")]
            engine: self.engine,
            fill_layers: 0, // the arena fills the layer group's planes
            block_positions: opts.block_positions,
        };
        let stream = gpu.stream();
        // SAFETY: every pointer addresses a live buffer of the documented shape (allocated above,
        // output buffers of the host outputs' lengths, alive until after the synchronize below);
        // the tables are only touched by this stream.
        unsafe {
            self.cpu
                .data
                .dev
                .resolve_async_with(stream, &args, &o, self.gcfg.backend)
        }
        .map_err(cuda)?;
        stream
            .synchronize()
            .map_err(|e| cuda(CudaError::driver("cuStreamSynchronize", e)))?;
        let counts = plan_count.download().map_err(cuda)?;
        let all = plan.download().map_err(cuda)?;
        let mut copies = Vec::new();
        for (r, &c) in counts.iter().enumerate() {
            copies.extend_from_slice(&all[r * hot..r * hot + c as usize]);
        }
        let group = self.cpu.geometry().group_of(input.layer);
        if self.gcfg.backend == CopyBackend::Dma {
            self.copy_rows(&copies, self.cpu.geometry().group_layers(input.layer))?;
        }
        let n_idx = out.indices.len();
        out.indices
            .copy_from_slice(&idx.download().map_err(cuda)?[..n_idx]);
        let n_valid = out.valid_count.len();
        out.valid_count
            .copy_from_slice(&valid.download().map_err(cuda)?[..n_valid]);
        self.device_errors_clean(input.layer)?;
        let st = stats.download().map_err(cuda)?;
        let mut stats = ResolveStats::default();
        for r in KvStats::from_rows(&st) {
            stats.picks += r.picks as u64;
            stats.tail_hits += r.tail_hits as u64;
            stats.scratch_hits += r.scratch_hits as u64;
            stats.page_hits += r.page_hits as u64;
            stats.hot_hits += r.hot_hits as u64;
            stats.misses += r.misses as u64;
            stats.direct_sessions += u64::from(r.direct);
        }
        // Valid picks (validated: all in range) the kernel could not serve (no evictable hot row).
        stats.unserved = wanted.saturating_sub(stats.picks);
        self.miss_tokens += stats.misses;
        Ok(Resolved {
            plan: ResolvePlan {
                copies: self.plan_from_device(&copies),
                group,
            },
            stats,
            ticket: self.register_reader(),
        })
    }

    fn replay(&mut self, plan: &ResolvePlan, layer: u32) -> Result<()> {
        self.check_poison()?;
        self.cpu.validate_replay(plan, layer)?;
        let g = *self.cpu.geometry();
        // Staleness: each destination row must still hold its position (checked in plan order
        // against the device's position table, as the CPU reference checks its hot cache).
        let mut copies = Vec::with_capacity(plan.copies.len());
        for c in &plan.copies {
            let slot = self.slot_of(c.session)?;
            let pl = self.cpu.placement(c.session)?;
            let ok = c.position < self.gcfg.max_history
                && self
                    .cpu
                    .data
                    .dev
                    .hot_slot_of(slot, plan.group, c.position)
                    .map_err(cuda)?
                    .is_some_and(|s| g.fixed_row(pl.fixed_pages, s) == c.dst_row);
            if !ok {
                return Err(KvError::StalePlan {
                    session: c.session,
                    position: c.position,
                    row: c.dst_row,
                });
            }
            copies.push(KvCopy {
                slot,
                position: c.position,
                dst_row: c.dst_row,
                pad: 0,
            });
        }
        self.copy_rows(&copies, layer..layer + 1)
    }

    fn prefetch(
        &mut self,
        session: SessionId,
        candidates: &[i32],
        layer: u32,
    ) -> Result<ResolvePlan> {
        self.check_poison()?;
        self.cpu.validate_prefetch(session, candidates, layer)?;
        let slot = self.slot_of(session)? as i32;
        let gpu = self.cpu.data.dev.gpu().clone();
        let ctx = gpu.ctx();
        let hot = self.cpu.data.dev.dims().hot_rows as usize;
        let n = candidates.len().max(1);
        let mut cand = candidates.to_vec();
        cand.resize(n, -1);
        let bufs = (|| -> cuda_kernels::Result<_> {
            Ok((
                DeviceBuffer::from_host(ctx, &[slot])?,
                DeviceBuffer::from_host(ctx, &cand)?,
                DeviceBuffer::from_host(ctx, &[candidates.len() as u32])?,
                DeviceBuffer::<KvCopy>::zeroed(ctx, hot)?,
                DeviceBuffer::<u32>::zeroed(ctx, 1)?,
            ))
        })()
        .map_err(cuda)?;
        let (slots, cand_d, count, plan, plan_count) = bufs;
        gpu.synchronize().map_err(cuda)?;
        let stream = gpu.stream();
        // The prefetch always gathers inside its kernel (it runs on a side stream while other layers
        // compute; the back-end switch applies to resolve and replay).
        // SAFETY: live buffers of the documented shapes, alive until the synchronize below.
        unsafe {
            self.cpu.data.dev.prefetch_async(
                stream,
                slots.device_ptr(),
                cand_d.device_ptr(),
                count.device_ptr(),
                1,
                n as u32,
                layer,
                plan.device_ptr(),
                plan_count.device_ptr(),
            )
        }
        .map_err(cuda)?;
        stream
            .synchronize()
            .map_err(|e| cuda(CudaError::driver("cuStreamSynchronize", e)))?;
        let c = plan_count.download().map_err(cuda)?[0] as usize;
        let copies = plan.download().map_err(cuda)?[..c].to_vec();
        self.device_errors_clean(layer)?;
        Ok(ResolvePlan {
            copies: self.plan_from_device(&copies),
            group: self.cpu.geometry().group_of(layer),
        })
    }
}
