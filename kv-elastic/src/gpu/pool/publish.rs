//! [`GpuElasticPool::publish`]: the change log turned into O(changed) asynchronous work (see
//! the parent module's table of streams and orderings).

use super::patches::{page_entries, WordPatches};
use super::*;

impl GpuElasticPool {
    /// Publishes what the control plane changed since the last publish: O(changed) asynchronous
    /// work on the copy and step streams (see the module docs); no host wait. The control
    /// operations call it; calling it again with nothing changed does nothing.
    ///
    /// A failure after the change log was taken poisons the pool (the device no longer follows
    /// the control plane): this call returns the failure and every later one
    /// [`KvError::Poisoned`]; drop the pool.
    pub fn publish(&mut self) -> Result<()> {
        self.check_poison()?;
        self.publish_inner()
            .inspect_err(|e| self.poisoned = Some(e.to_string()))
    }

    /// `Err(Poisoned)` once a publish failed.
    pub(super) fn check_poison(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(KvError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Makes the next publish fail after staging (a test hook, feature `test-hooks`: tests of
    /// the failure path).
    #[cfg(feature = "test-hooks")]
    pub fn inject_publish_failure(&mut self) {
        self.fail_next_publish = true;
    }

    pub(super) fn publish_inner(&mut self) -> Result<()> {
        let mut log = std::mem::take(&mut self.cpu.data.log);
        // Borrowed pages' fills: whole runs by strided copy-engine copies (`Dma`, one per run and
        // layer, no list staged), or rows for the gather kernel.
        let runs = std::mem::take(&mut log.page_runs);
        // (Strided runs are contiguous rows: a paged split arena takes the gather for them.)
        // The gather kernel's rows are staged from their runs (`Image::push_runs`); the DMA
        // back-end's fallback for a paged split arena takes them as a host list.
        let (runs, gather_runs) = if self.fill_backend == CopyBackend::Dma
            && self.cpu.data.dev.dims().fmt == cuda_kernels::KV_FMT_CONTIGUOUS
        {
            (runs, Vec::new())
        } else if self.fill_backend == CopyBackend::Gather {
            (Vec::new(), runs)
        } else {
            log.page_fills.extend(runs.iter().flat_map(|r| r.copies()));
            (Vec::new(), Vec::new())
        };
        let run_rows: u64 = runs.iter().map(|r| r.rows as u64).sum();
        let gather_rows: usize = gather_runs.iter().map(|r| r.rows as usize).sum();
        let (created, freed) = {
            let p = self.cpu.data.pinned_mut();
            (std::mem::take(&mut p.created), std::mem::take(&mut p.freed))
        };
        // Deferred mappings (see `MapAfterFill`): drop those of freed slots and of pages this
        // window unmapped (reclaim), in that order before polling, then take the ones whose fill
        // passed. A page re-lent in this window after its unmap gets a new entry below.
        let freed_set: HashSet<u32> = freed.iter().copied().collect();
        let mut dropped = self.deferred.drop_slots(&freed_set);
        for &(b, logical, page) in &log.pages {
            if page < 0 && self.deferred.drop_key((b, logical)) {
                dropped += 1;
            }
        }
        self.counters.maps_dropped += dropped as u64;
        // A failed event query (a broken context) fails the publish (and poisons the pool)
        // rather than leaving the entries unmapped for ever; a query a stream capture forbids
        // now (another thread capturing in global mode) is "not yet" (`try_complete`).
        let ready = self
            .deferred
            .try_take_ready(|fill| fill.try_complete())
            .map_err(cuda)?;
        if log.is_empty()
            && runs.is_empty()
            && gather_runs.is_empty()
            && created.is_empty()
            && freed.is_empty()
            && ready.is_empty()
        {
            return Ok(());
        }
        let defer = self.map_after_fill == MapAfterFill::Deferred;
        let d = *self.device().dims();
        let t = self.device().tables(0).map_err(cuda)?;
        let groups = self.device().group_count() as u64;
        let g = *self.cpu.geometry();
        // Table patches: ranges (slot resets) in one launch, then single words (last one wins).
        let mut ranges: Vec<KvFill> = Vec::new();
        let range = |ranges: &mut Vec<KvFill>, base: u64, word: u64, count: usize, value: u32| {
            ranges.push(KvFill {
                dst: base + 4 * word,
                count: count as u32,
                value,
            })
        };
        let (h, nh, mp, fp) = (
            d.hot_rows as u64,
            d.max_history as u64,
            d.max_pages as u64,
            d.fixed_pages as u64,
        );
        let desc_words = (std::mem::size_of::<KvSlotDesc>() / 4) as u64;
        // The direct-batch word's new value, if this publish changes it (patched with the descriptors).
        let mut direct_word: Option<u32> = None;
        let slots = d.max_slots as u64;
        for &b in &freed {
            // A freed slot stops counting for the direct-batch word (its descriptor is zeroed below).
            if let Some(v) = self.cpu.data.dev.note_desc(b, &KvSlotDesc::default()) {
                direct_word = Some(v);
            }
        }
        for &b in created.iter().chain(&freed) {
            let b = b as u64;
            range(&mut ranges, t.desc, b * desc_words, desc_words as usize, 0);
            range(&mut ranges, t.page_tab, b * mp, mp as usize, u32::MAX);
            // The slot's hot caches in every layer group (tables laid out [groups][max_slots][..]
            // from group 0's pointers; call counters keep counting).
            for g in 0..groups {
                let gb = g * slots + b;
                range(&mut ranges, t.slot_pos, gb * h, h as usize, u32::MAX);
                range(&mut ranges, t.mark, 2 * gb * h, 2 * h as usize, 0);
                range(&mut ranges, t.stamp, 2 * gb * h, 2 * h as usize, 0);
                range(&mut ranges, t.hand, gb, 1, 0);
                range(&mut ranges, t.pos_slot, gb * nh, nh as usize, u32::MAX);
            }
        }
        ranges.dedup();
        // Single words, last one wins (`WordPatches`: no hashing per page of a long history).
        let word_hint = log.pages.len() + created.len() * d.fixed_pages as usize + 64;
        let mut words = WordPatches::with_capacity(word_hint + ready.len());
        for &b in &created {
            let s = self.pinned().session_at(b).expect("created this window");
            let pl = self.cpu.placement(s)?;
            for (i, &p) in pl.fixed_pages.iter().enumerate() {
                words.put(t.fixed_pages + 4 * (b as u64 * fp + i as u64), p);
            }
        }
        // This window's borrowed-page mappings held back until their fill (deferred mode), in
        // call order: an unmap later in the window cancels an earlier mapping of the same entry.
        let pinned = self.pinned();
        let window_maps = page_entries(
            &log.pages,
            |b| pinned.session_at(b).is_some(),
            mp,
            t.page_tab,
            defer,
            &mut words,
        );
        // Mappings whose fill passed (their slot is live: freed slots' entries were dropped).
        let mut touched = log.touched.clone();
        // The window's slots with mappings deferred (the entries are sorted by slot).
        let mut window_slots: Vec<u32> = Vec::new();
        for &((b, _), _) in &window_maps {
            if window_slots.last() != Some(&b) {
                window_slots.push(b);
            }
        }
        for &(slot, logical, page) in &ready {
            words.put(t.page_tab + 4 * (slot as u64 * mp + logical as u64), page);
            if let Some(s) = self.pinned().session_at(slot) {
                if !touched.contains(&s) {
                    touched.push(s);
                }
            }
        }
        for &b in &created {
            let s = self.pinned().session_at(b).expect("created this window");
            if !touched.contains(&s) {
                touched.push(s);
            }
        }
        for s in touched {
            let Some(b) = self.pinned().slot_of(s) else {
                continue; // finished since
            };
            let pl = self.cpu.placement(s)?;
            // The direct path reads pages only; with mappings still deferred the slot takes the
            // hot-cache path (its unmapped positions are misses) until the last one is applied.
            let unmapped = self.deferred.has_slot(b) || window_slots.contains(&b);
            let desc = KvSlotDesc {
                live: 1,
                committed: pl.committed,
                scratch_len: pl.scratch_len,
                full: u32::from(pl.full && !unmapped),
                tail_start: pl.committed.saturating_sub(g.tail_rows),
                pad: [0; 3],
            };
            let w: &[u32] = bytemuck::cast_slice(std::slice::from_ref(&desc));
            for (i, &v) in w.iter().enumerate() {
                words.put(t.desc + 4 * (b as u64 * desc_words + i as u64), v);
            }
            if let Some(v) = self.cpu.data.dev.note_desc(b, &desc) {
                direct_word = Some(v);
            }
        }
        if let Some(v) = direct_word {
            words.put(t.direct, v);
        }
        let points = words.into_points();
        // One staging image for every list of this publish.
        let mut img = Image::default();
        let fill_counts = segment_counts(log.fills.len());
        let page_counts = segment_counts(log.page_fills.len() + gather_rows);
        let step_counts = segment_counts(log.step_copies.len());
        let at_fill = img.push(&log.fills);
        let at_fill_n = img.push(&fill_counts);
        // (At most one of the two is non-empty: see `gather_runs`.)
        let at_page = if gather_runs.is_empty() {
            img.push(&log.page_fills)
        } else {
            img.push_runs(&gather_runs)
        };
        let at_page_n = img.push(&page_counts);
        let at_wb = img.push(&log.write_backs);
        let at_ranges = img.push(&ranges);
        let at_points = img.push(&points);
        let at_step = img.push(&log.step_copies);
        let at_step_n = img.push(&step_counts);
        let base = self.stage(&img)?;
        let staged_bytes = img.len() as u64;
        drop(img);
        if std::mem::take(&mut self.fail_next_publish) {
            return Err(KvError::Unsupported("injected publish failure"));
        }
        let gpu = self.device().gpu().clone();
        let step = gpu.stream().clone();
        let copy = self.copy.clone();
        let ev = |s: &CudaStream| EventSignal::record(&gpu, s).map_err(cuda);
        let dev = &self.cpu.data.dev;
        // 1. Write-backs (step stream, after the kernels that wrote the rows).
        if !log.write_backs.is_empty() {
            // SAFETY: `n` KvCopy staged at `base + at_wb` (mapped pinned, readable until the
            // staging event recorded below passes); their rows and slots are live (control plane).
            unsafe {
                dev.write_back_async(
                    &step,
                    base + at_wb as u64,
                    log.write_backs.len() as u32,
                    0,
                    d.layers,
                )
            }
            .map_err(cuda)?;
            self.last_write_back = Some(ev(&step)?);
        }
        // 2. Fills. Ordered: all on the copy stream (after the last write-back; pages just
        // taken were free), the step stream waits for them. Deferred: the fixed-page fills (new
        // sessions' tails, small) on the step stream, in its order; the borrowed pages' on the
        // copy stream, which the step stream does not wait for (their mapping waits instead).
        let mut copy_done = None;
        if defer {
            self.fill_async(
                &step,
                &log.fills,
                base,
                (at_fill, at_fill_n),
                fill_counts.len(),
            )?;
            if !page_counts.is_empty() || !runs.is_empty() {
                if let Some(wb) = &self.last_write_back {
                    wb.wait_on(&copy).map_err(cuda)?;
                }
                let at = (at_page, at_page_n);
                self.fill_async(&copy, &log.page_fills, base, at, page_counts.len())?;
                self.fill_runs_async(&copy, &runs)?;
                let fill = ev(&copy)?;
                // A page lent here and reclaimed or handed back before its fill passed becomes
                // free only after it (so no later owner's fill or fixed-page write races it).
                self.cpu.fence().enter_signal(Box::new(fill.clone()));
                copy_done = Some(fill);
            }
        } else if !log.fills.is_empty() || !page_counts.is_empty() || !runs.is_empty() {
            if let Some(wb) = &self.last_write_back {
                wb.wait_on(&copy).map_err(cuda)?;
            }
            self.fill_async(
                &copy,
                &log.fills,
                base,
                (at_fill, at_fill_n),
                fill_counts.len(),
            )?;
            let at = (at_page, at_page_n);
            self.fill_async(&copy, &log.page_fills, base, at, page_counts.len())?;
            self.fill_runs_async(&copy, &runs)?;
            ev(&copy)?.wait_on(&step).map_err(cuda)?;
        }
        if !window_maps.is_empty() {
            let fill = match &copy_done {
                Some(e) => e.clone(),
                // No fill left for these pages in this window: after the copy stream's work.
                None => ev(&copy)?,
            };
            self.counters.maps_deferred += window_maps.len() as u64;
            self.deferred.push(fill, window_maps);
        }
        // A freed slot's pinned bytes may still be read by deferred page fills of its session
        // (the step stream does not wait for those; after `Ordered` it did: then a no-op).
        let freed_copy = if !freed.is_empty() {
            Some(ev(&copy)?)
        } else {
            None
        };
        let dev = &self.cpu.data.dev;
        // 3. Table patches (step stream, after the fills they map).
        // SAFETY: every entry names words of our tables (addresses built from `tables()` with
        // in-range indices above); ranges are disjoint or equal-valued, points are deduplicated;
        // staged until the staging event.
        unsafe {
            dev.fill_words_async(&step, base + at_ranges as u64, ranges.len() as u32)
                .map_err(cuda)?;
            dev.fill_words_async(&step, base + at_points as u64, points.len() as u32)
                .map_err(cuda)?;
        }
        // 4. Tail and draft rows of live sessions (step stream, after the write-backs).
        if !log.step_copies.is_empty() {
            // SAFETY: as the fills; the rows are the sessions' own tail / scratch rows, and every
            // earlier reader of them is earlier on this stream.
            unsafe { copy_segments(dev, &step, base, (at_step, at_step_n), step_counts.len()) }?;
        }
        let done = ev(&step)?;
        self.last_publish = Some(done.clone());
        if let (false, Some(wb)) = (log.write_backs.is_empty(), &self.last_write_back) {
            // The host store's byte view waits for it (no slice over bytes still being written).
            self.cpu.data.pinned_mut().set_last_write_back(wb.clone());
        }
        // The staging buffer is free again once the step stream passes `done` (which follows the
        // wait for the copy stream's fills).
        let staged = self
            .staging
            .iter_mut()
            .find(|s| s.buf.device_ptr() == base)
            .expect("staged above");
        staged.done = done.clone();
        staged.copy_done = copy_done;
        staged.busy = false;
        if !log.write_backs.is_empty()
            || !log.step_copies.is_empty()
            || (defer && !log.fills.is_empty())
        {
            // Pages the step-stream copies (and, deferred, fixed-page fills) touch stay
            // allocated until they ran.
            self.cpu.fence().enter_signal(Box::new(done.clone()));
        }
        for b in freed {
            self.quarantine.push((b, done.clone(), freed_copy.clone()));
        }
        let c = &mut self.counters;
        c.flushes += 1;
        c.rows_filled += (log.fills.len() + log.page_fills.len() + gather_rows) as u64 + run_rows;
        c.maps_applied += ready.len() as u64;
        c.rows_copied += log.step_copies.len() as u64;
        c.rows_written_back += log.write_backs.len() as u64;
        c.words_patched += points.len() as u64;
        c.ranges_reset += ranges.len() as u64;
        c.staged_bytes += staged_bytes;
        Ok(())
    }

    /// Queues the borrowed pages' fill runs on `stream`: one strided copy per run and layer
    /// (`gpu/strided.rs`).
    fn fill_runs_async(
        &mut self,
        stream: &CudaStream,
        runs: &[super::super::data::FillRun],
    ) -> Result<()> {
        let dev = &self.cpu.data.dev;
        for run in runs {
            // SAFETY: the run's rows are pages just lent (free before: every reader and fill
            // into them passed; see the module docs) and `dev` outlives the copies (the pool
            // owns it; its drop waits for nothing queued, as every launch here).
            let n =
                unsafe { super::super::strided::copy_run_async(dev, stream, run) }.map_err(cuda)?;
            self.counters.rows_filled_dma += run.rows as u64;
            self.counters.fill_descriptors += n as u64;
        }
        Ok(())
    }

    /// Queues the fills staged as `segments` replay segments at `base + at` on `stream` with the
    /// fill back-end; `fills` are their rows on the host where the DMA back-end needs them (the
    /// gather back-end's page fills are staged from their runs: `fills` is empty then).
    fn fill_async(
        &mut self,
        stream: &CudaStream,
        fills: &[KvCopy],
        base: u64,
        at: (usize, usize),
        segments: usize,
    ) -> Result<()> {
        if segments == 0 {
            return Ok(());
        }
        let dev = &self.cpu.data.dev;
        // The destination rows belong to pages no reader or other stream's queued work touches
        // (free pages, fence; fixed pages of a session created in this window, on the step
        // stream in deferred mode: free pages, so every fill into them passed; see the module
        // docs). DMA: runs of whole rows from the pinned
        // store (one layer), else the gather kernel over the staged segments.
        let dma = match self.fill_backend {
            CopyBackend::Dma => dev.dma_runs_async(stream, fills).map_err(cuda)?,
            CopyBackend::Gather => None,
        };
        match dma {
            Some(descriptors) => {
                self.counters.rows_filled_dma += fills.len() as u64;
                self.counters.fill_descriptors += descriptors as u64;
            }
            // SAFETY: segments staged at `base + at` (live until the staging buffer's events:
            // `done`, which the step stream records after waiting for the fills it orders, and
            // `copy_done` after deferred page fills); destinations as above.
            None => unsafe { copy_segments(dev, stream, base, at, segments) }?,
        }
        Ok(())
    }

    /// A staging buffer of at least `need` bytes (a power of two, 64 KiB at least), free.
    pub(super) fn new_staging(&self, need: usize) -> Result<Staging> {
        let ctx = self.device().gpu().ctx().clone();
        let buf =
            PinnedBuffer::zeroed(&ctx, need.next_power_of_two().max(64 << 10)).map_err(cuda)?;
        let done = EventSignal::unrecorded(self.device().gpu()).map_err(cuda)?;
        Ok(Staging {
            buf,
            done,
            copy_done: None,
            busy: false,
        })
    }

    /// Bytes the publish of one session's admission with its whole history borrowed stages
    /// (the Dma fill back-end): a word per page-table entry and fixed page, its descriptor, its
    /// tail rows, the slot's range resets; with room for alignment and a few more words. At most
    /// 1 MiB (a larger admission allocates its buffer when it publishes, as before).
    pub(super) fn admission_staging_bytes(&self) -> usize {
        let d = *self.device().dims();
        let words = d.max_pages as usize + d.fixed_pages as usize + 64;
        let ranges = 2 + 5 * self.device().group_count() as usize;
        ((words + ranges) * std::mem::size_of::<KvFill>()
            + 2 * d.tail_rows as usize * std::mem::size_of::<KvCopy>()
            + 1024)
            .min(1 << 20)
    }

    /// Copies `image` into a free staging buffer (mapped pinned memory); returns its device
    /// address. A buffer is free once the event after its last reader passed (no host wait; a
    /// new buffer is allocated when none is free or large enough).
    fn stage(&mut self, image: &Image<'_>) -> Result<u64> {
        let need = image.len().max(16);
        // The smallest free buffer that fits (the one sized for a whole admission stays free
        // for it while smaller publishes find smaller ones).
        let i = match self
            .staging
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                !s.busy
                    && s.buf.len() >= need
                    && s.done.is_complete()
                    && s.copy_done.as_ref().is_none_or(|c| c.is_complete())
            })
            .min_by_key(|(_, s)| s.buf.len())
        {
            Some((i, _)) => i,
            None => {
                let s = self.new_staging(need)?;
                self.staging.push(s);
                self.staging.len() - 1
            }
        };
        let s = &mut self.staging[i];
        // Busy before anything is launched from it; `publish` frees it with its `done` event.
        s.busy = true;
        image.write_into(s.buf.as_mut_slice());
        Ok(s.buf.device_ptr())
    }
}
