//! The swap queue: queueing a policy's choices, beginning queued swaps on the executor, committing
//! what it confirms, and the accounting (every planned swap ends in exactly one of applied /
//! rejected / failed / cancelled).

use super::{Controller, StepReport};
use crate::error::Result;
use crate::executor::{PlannedSwap, SwapExecutor, SwapOutcome};

impl Controller {
    /// Turns the policy's choices for `layer` (in `self.choices`) into queued swaps: at most
    /// `cap`, stopping at the first invalid one (incoming not cold, outgoing not hot, or an expert
    /// repeated), stamped with consecutive generations from the layer's. Returns how many.
    pub(super) fn queue_choices(&mut self, layer: u32, cap: u32) -> u32 {
        let l = layer as usize;
        let row = &self.map.layers()[l];
        let mut n = 0u32;
        for (i, c) in self.choices.iter().enumerate().take(cap as usize) {
            // `slot_of` is `None` for a cold expert and for an out-of-range id: check the range.
            let (Some(slot), None) = (row.slot_of(c.outgoing), row.slot_of(c.incoming)) else {
                break;
            };
            let repeated = self.choices[..i]
                .iter()
                .any(|p| p.incoming == c.incoming || p.outgoing == c.outgoing);
            if repeated || c.incoming >= row.experts() {
                break;
            }
            self.queue.push(PlannedSwap {
                layer,
                incoming: c.incoming,
                outgoing: c.outgoing,
                slot,
                generation: row.generation().saturating_add(i as u64),
            });
            n += 1;
        }
        self.busy[l] += n;
        self.stats.planned += n as u64;
        n
    }

    /// Asks the executor to commit the swaps whose bytes are in place (accepting only current
    /// ones, none while frozen) and applies the committed ones to the rowmap.
    pub(super) fn commit(
        &mut self,
        executor: &mut dyn SwapExecutor,
        rep: &mut StepReport,
    ) -> Result<()> {
        if executor.in_flight() == 0 {
            return Ok(());
        }
        let map = &self.map;
        let frozen = self.frozen;
        let done = executor.commit_ready(&mut |s| !frozen && map.check_swap(s).is_ok())?;
        for c in done {
            let l = c.swap.layer as usize;
            if l >= self.in_flight.len() || !self.in_flight[l] {
                // Not ours (an executor bug); never applied.
                self.stats.rejected += 1;
                rep.rejected += 1;
                continue;
            }
            self.in_flight[l] = false;
            self.busy[l] -= 1;
            match c.outcome {
                SwapOutcome::Committed => match self.map.apply(&c.swap) {
                    Ok(()) => {
                        self.stats.applied += 1;
                        rep.applied += 1;
                    }
                    Err(_) => {
                        self.stats.rejected += 1;
                        rep.rejected += 1;
                    }
                },
                SwapOutcome::Discarded if frozen => self.stats.cancelled += 1,
                SwapOutcome::Discarded => {
                    self.stats.rejected += 1;
                    rep.rejected += 1;
                }
                SwapOutcome::Failed => {
                    self.stats.failed += 1;
                    rep.failed += 1;
                }
            }
        }
        Ok(())
    }

    /// Begins queued swaps in queue order: at most `max_swaps_per_step` (lowered by the byte
    /// budget, [`crate::ControllerConfig::swaps_per_step`]), one in flight per layer,
    /// only where the executor `can_begin`. A stale or refused swap kills the rest of its layer's
    /// chain (planned with consecutive generations).
    pub(super) fn begin(&mut self, executor: &mut dyn SwapExecutor, rep: &mut StepReport) {
        if self.frozen || self.queue.is_empty() {
            return;
        }
        let cap = self.cfg.swaps_per_step(self.map.geometry().expert_bytes);
        let mut keep = Vec::with_capacity(self.queue.len());
        // Layers whose queued chain died this step (a stale or failed swap invalidates the rest of
        // that layer's chain, which was planned with consecutive generations).
        let mut dead: Vec<u32> = Vec::new();
        for s in std::mem::take(&mut self.queue) {
            let l = s.layer as usize;
            if dead.contains(&s.layer) {
                self.busy[l] -= 1;
                self.stats.rejected += 1;
                rep.rejected += 1;
                continue;
            }
            if rep.begun >= cap || self.in_flight[l] || !executor.can_begin(s.layer) {
                keep.push(s);
                continue;
            }
            if self.map.check_swap(&s).is_err() {
                self.busy[l] -= 1;
                self.stats.rejected += 1;
                rep.rejected += 1;
                dead.push(s.layer);
                continue;
            }
            match executor.begin(&s) {
                Ok(()) => {
                    self.in_flight[l] = true;
                    rep.begun += 1;
                }
                Err(_) => {
                    self.busy[l] -= 1;
                    self.stats.failed += 1;
                    rep.failed += 1;
                    dead.push(s.layer);
                }
            }
        }
        self.queue = keep;
    }

    /// Drops every queued swap (counted as cancelled); returns how many.
    pub fn cancel_queued(&mut self) -> u32 {
        let n = self.queue.len() as u32;
        for s in self.queue.drain(..) {
            self.busy[s.layer as usize] -= 1;
        }
        self.stats.cancelled += n as u64;
        n
    }
}
