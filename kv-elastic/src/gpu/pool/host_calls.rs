//! [`GpuElasticPool`]'s host calls: admission, appends, drafts, finish, reclaim, revoke, lend
//! and between steps, each the CPU pool's call followed by its publish (the pool's state and
//! construction are `mod.rs`'s, the publish itself `publish.rs`).

use super::*;

impl GpuElasticPool {
    /// [`ElasticPool::admit`], then publishes (asynchronous). Extra errors (nothing changes):
    /// `Cuda(OutOfRange)` when no slot is free or the history exceeds `max_history`.
    pub fn admit(&mut self, session: SessionId, history: &[u8]) -> Result<Admission> {
        self.check_poison()?;
        self.check_admission(history)?;
        self.settle_readers()?;
        let a = self.cpu.admit(session, history);
        self.publish()?;
        a
    }

    /// [`ElasticPool::admit_with`], then publishes (asynchronous). Extra errors as
    /// [`GpuElasticPool::admit`].
    pub fn admit_with(
        &mut self,
        session: SessionId,
        history: &[u8],
        options: AdmitOptions,
    ) -> Result<Admission> {
        self.check_poison()?;
        self.check_admission(history)?;
        self.settle_readers()?;
        let a = self.cpu.admit_with(session, history, options);
        self.publish()?;
        a
    }

    /// Admits several sessions with one publish at the end. Stops at the first error or `Waiting`
    /// admission; what was admitted before stays admitted and published. Returns the outcome of
    /// each attempted admission.
    pub fn admit_batch(&mut self, sessions: &[(SessionId, &[u8])]) -> Result<Vec<Admission>> {
        self.check_poison()?;
        self.settle_readers()?;
        self.each_then_publish(sessions, |p, (session, history)| {
            p.check_admission(history)?;
            let a = p.cpu.admit(session, history)?;
            Ok((a, matches!(a, Admission::Waiting { .. })))
        })
    }

    /// Runs `op` on each item until the first error or until `op` says stop, then publishes
    /// once; returns the outcomes, or the first error (what ran before it stays published).
    pub(super) fn each_then_publish<I: Copy, T>(
        &mut self,
        items: &[I],
        mut op: impl FnMut(&mut Self, I) -> Result<(T, bool)>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(items.len());
        let mut first_err = None;
        for &item in items {
            match op(self, item) {
                Ok((t, stop)) => {
                    out.push(t);
                    if stop {
                        break;
                    }
                }
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        self.publish()?;
        first_err.map_or(Ok(out), Err)
    }

    /// Capacity check: `n` more committed tokens of `session` fit in `max_history`.
    pub(super) fn check_history_room(&self, session: SessionId, n: u32) -> Result<()> {
        let now = self.cpu.committed_len(session)?;
        if now as u64 + n as u64 > self.gcfg.max_history as u64 {
            return Err(self.capacity("history length (max_history)", now as u64 + n as u64));
        }
        Ok(())
    }

    /// [`ElasticPool::append`] (the CPU path: the tokens' bytes come from the host), then
    /// publishes: the bytes go into the pinned store, the tail rows are copied on the step stream.
    /// Extra error: history beyond `max_history`.
    pub fn append(&mut self, session: SessionId, tokens: &[u8]) -> Result<u32> {
        self.check_poison()?;
        let n = self.cpu.host().check_tokens(tokens, true)?;
        self.check_history_room(session, n)?;
        let at = self.cpu.committed_len(session)?;
        self.wait_draft_reads(session, at, at + n)?;
        let r = self.cpu.append(session, tokens)?;
        self.publish()?;
        Ok(r)
    }

    /// The engine path of an append: the step's kernels wrote the new tokens' KV into the
    /// session's tail rows ([`GpuElasticPool::tail_row_of`] of positions `committed ..
    /// committed + n`, every layer, `n <= tail_rows`); commits them and publishes: a write-back
    /// kernel on the step stream, after those kernels, copies the rows into the pinned host
    /// store (no host sync). Errors: as [`ElasticPool::append_written`], history beyond
    /// `max_history`.
    pub fn append_written(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.check_poison()?;
        let r = self.append_written_one(session, n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`GpuElasticPool::append_written`] for several sessions with one publish (one write-back
    /// launch for the step). Stops at the first error (what was committed before stays
    /// committed and published). Returns the new committed lengths.
    pub fn append_written_batch(&mut self, appends: &[(SessionId, u32)]) -> Result<Vec<u32>> {
        self.check_poison()?;
        self.each_then_publish(appends, |p, (s, n)| {
            Ok((p.append_written_one(s, n)?, false))
        })
    }

    pub(super) fn append_written_one(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.check_history_room(session, n)?;
        self.cpu.append_written(session, n)
    }

    /// [`ElasticPool::write_scratch`], then publishes. Extra error: drafts beyond `max_history`.
    pub fn write_scratch(&mut self, session: SessionId, tokens: &[u8]) -> Result<()> {
        self.check_poison()?;
        let n = self.cpu.host().check_tokens(tokens, true)?;
        let now = self.cpu.committed_len(session)? + self.cpu.scratch_len(session)?;
        if now as u64 + n as u64 > self.gcfg.max_history as u64 {
            return Err(self.capacity(
                "committed + draft length (max_history)",
                now as u64 + n as u64,
            ));
        }
        self.wait_draft_reads(session, now, now + n)?;
        self.cpu.write_scratch(session, tokens)?;
        self.publish()?;
        if n > 0 {
            // This publish's step copies read the drafts' pinned bytes until its event.
            let slot = self.slot_of(session)?;
            let ev = self.last_publish.clone().expect("drafts were published");
            self.draft_reads.record(slot, now, now + n, ev);
        }
        Ok(())
    }

    /// Before the host rewrites pinned positions `lo..hi` of `session` (drafts, appends): waits
    /// for the last publish whose step copies read draft bytes there, if it has not run yet (a
    /// host wait, only on this path: `write_scratch` / `append` after `accept(k < drafts)`).
    pub(super) fn wait_draft_reads(&mut self, session: SessionId, lo: u32, hi: u32) -> Result<()> {
        let slot = self.slot_of(session)?;
        if let Some(ev) = self.draft_reads.take_conflict(slot, lo, hi) {
            self.counters.host_syncs += 1;
            ev.event()
                .synchronize()
                .map_err(|e| cuda(CudaError::driver("cuEventSynchronize", e)))?;
        }
        Ok(())
    }

    /// [`ElasticPool::accept`], then publishes: the accepted drafts are written back from their
    /// scratch rows on the step stream and copied into the tail rows after.
    pub fn accept(&mut self, session: SessionId, n: u32) -> Result<u32> {
        self.check_poison()?;
        let r = self.cpu.accept(session, n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::finish`], then publishes (the slot is marked not live; it is reused once
    /// the step stream passed this point).
    pub fn finish(&mut self, session: SessionId) -> Result<()> {
        self.check_poison()?;
        let slot = self.slot_of(session)?;
        self.cpu.finish(session)?;
        self.draft_reads.forget(slot);
        self.publish()
    }

    /// [`ElasticPool::reclaim`], then publishes: the owners' page-table entries are patched on
    /// the step stream (no row moves).
    pub fn reclaim(&mut self, n: u32) -> Result<u32> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.reclaim(n)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::revoke`], then publishes: the owner's page-table entries are patched on
    /// the step stream (no row moves), as [`GpuElasticPool::reclaim`]'s.
    pub fn revoke(&mut self, session: SessionId, logical: &[u32]) -> Result<u32> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.revoke(session, logical)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::lend`], then publishes: the pages are filled on the copy stream and mapped
    /// after their fill, as [`GpuElasticPool::between_steps`]'s growth.
    pub fn lend(&mut self, session: SessionId, max: u32) -> Result<u32> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.lend(session, max)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::between_steps_with`], then publishes (as [`GpuElasticPool::between_steps`]).
    pub fn between_steps_with(
        &mut self,
        chunk: u32,
        options: StepOptions,
    ) -> Result<StepMaintenance> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.between_steps_with(chunk, options)?;
        self.publish()?;
        Ok(r)
    }

    /// [`ElasticPool::between_steps`], then publishes (hand-backs patch nothing on the device:
    /// the finished sessions' slots are not live; grown pages are filled on the copy stream and
    /// mapped after their fill).
    pub fn between_steps(&mut self, chunk: u32) -> Result<StepMaintenance> {
        self.check_poison()?;
        self.settle_readers()?;
        let r = self.cpu.between_steps(chunk)?;
        self.publish()?;
        Ok(r)
    }

    /// With [`GpuElasticPool::set_settle_readers`]: waits for the device, so every ticket ended
    /// before this call is complete when the control plane collects pages. Otherwise nothing.
    pub(super) fn settle_readers(&mut self) -> Result<()> {
        if self.settle {
            self.counters.host_syncs += 1;
            self.device().gpu().synchronize().map_err(cuda)?;
        }
        Ok(())
    }

    /// Registers a GPU reader in the pool's fence (see [`ReadTicket`]'s orderings).
    pub(super) fn register_reader(&self) -> ReadTicket {
        let reader = DeviceReader::default();
        self.cpu.fence().enter_signal(Box::new(reader.clone()));
        ReadTicket::with_end(Box::new(DeviceEnd {
            gpu: self.cpu.data.dev.gpu().clone(),
            reader,
        }))
    }
}
