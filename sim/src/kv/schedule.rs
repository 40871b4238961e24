//! The decode scheduler shared by the CPU serving simulation's placements and the GPU serving
//! benchmark (`benches/src/bin/kv_serving_bench.rs`): arrivals released on a clock, first come
//! first served admission with head-of-line waiting, one token per running request per decode step,
//! and the accounting every serving report gives (decode tokens/s, peak and median batch,
//! time-to-first-token queueing percentiles).
//!
//! The clock is the caller's: it passes each step's duration (modelled µs in the simulation,
//! measured GPU µs in the benchmark) and any stall outside a step (an admission copy the next step
//! waits for). Idle gaps (nothing running) jump the clock to the next arrival and are not busy
//! time: decode tokens/s is tokens per busy second, as an engine's decode throughput is quoted.
//!
//! TTFT here is the *queueing* part only (admission time − arrival time; prefill runs elsewhere, as
//! in disaggregated serving). Requests still queued when the run ends enter the percentiles with
//! their wait so far (a lower bound), so a saturated run's p90 is not hidden by who got in.
//!
//! Per request ([`Scheduler::timings`], [`RequestTiming`]): arrival, admission, the end of its
//! first decode step (its first decode token: TTFT = that − arrival, queueing and the first step)
//! and the end of its last (TPOT = (last − first) ÷ (output − 1), every step and stall it
//! waited through). The summary's TPOT percentiles are over the requests finished in the run;
//! comparisons across placements take the requests every placement finished
//! ([`common_finished`]).

use std::collections::VecDeque;

use crate::kv::trace::{ArrivalTrace, TraceRequest};
use kv_elastic::{KvError, Result};

/// A request being decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Active {
    /// Session id (trace index + 1; 0 is never used).
    pub id: u64,
    /// Prompt tokens (history at admission).
    pub input: u32,
    /// Tokens to generate (at least 1).
    pub output: u32,
    /// Tokens generated so far.
    pub generated: u32,
}

impl Active {
    /// Committed history now (`input + generated`), tokens.
    pub fn history(&self) -> u32 {
        self.input + self.generated
    }

    /// Tokens this request holds when it finishes (`input + output`).
    pub fn total(&self) -> u64 {
        self.input as u64 + self.output as u64
    }

    /// Whether the next step produces this request's last token.
    pub fn last_step(&self) -> bool {
        self.generated + 1 >= self.output
    }
}

/// One request's clock readings (µs on the scheduler's clock; `None` until they happen).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RequestTiming {
    /// Session id (trace index + 1 + the scheduler's id base).
    pub id: u64,
    /// Arrival (scaled trace time), µs.
    pub arrival_us: f64,
    /// Admission, µs.
    pub admitted_us: Option<f64>,
    /// End of its first decode step (its first decode token), µs.
    pub first_token_us: Option<f64>,
    /// End of its last decode step, µs.
    pub finished_us: Option<f64>,
    /// Tokens it decodes (at least 1).
    pub output: u32,
}

impl RequestTiming {
    /// Time to the first decode token (queueing + its first step), µs; None before it.
    pub fn ttft_us(&self) -> Option<f64> {
        self.first_token_us.map(|t| t - self.arrival_us)
    }

    /// Mean time per output token after the first, µs; None until finished or for one token.
    pub fn tpot_us(&self) -> Option<f64> {
        match (self.first_token_us, self.finished_us) {
            (Some(a), Some(b)) if self.output >= 2 => Some((b - a) / (self.output - 1) as f64),
            _ => None,
        }
    }
}

/// Ids finished in every one of `runs` (each a placement's [`RequestTiming`]s), ascending: the
/// requests a TTFT or TPOT comparison across placements is taken over.
pub fn common_finished(runs: &[&[RequestTiming]]) -> Vec<u64> {
    let mut out: Option<Vec<u64>> = None;
    for r in runs {
        let mut ids: Vec<u64> = r
            .iter()
            .filter(|t| t.finished_us.is_some())
            .map(|t| t.id)
            .collect();
        ids.sort_unstable();
        out = Some(match out {
            None => ids,
            Some(prev) => prev
                .into_iter()
                .filter(|x| ids.binary_search(x).is_ok())
                .collect(),
        });
    }
    out.unwrap_or_default()
}

/// The `q` quantiles (nearest rank) of `f` over the timings of `ids` in `run`, ms; 0 when none.
pub fn quantiles_ms(
    run: &[RequestTiming],
    ids: &[u64],
    f: impl Fn(&RequestTiming) -> Option<f64>,
    qs: &[f64],
) -> Vec<f64> {
    let mut v: Vec<f64> = run
        .iter()
        .filter(|t| ids.binary_search(&t.id).is_ok())
        .filter_map(&f)
        .collect();
    v.sort_by(f64::total_cmp);
    qs.iter().map(|&q| percentile(&v, q) / 1e3).collect()
}

/// What a placement answers for the request at the head of the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admitted now: it runs from the next step.
    Admitted,
    /// No room now: it (and everyone behind it) waits.
    NoRoom,
    /// It can never fit (larger than the whole budget): dropped and counted.
    Reject,
}

/// Where the run stands before a step (see [`Scheduler::before_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Requests are running: run a step.
    Step,
    /// Nothing ran; the clock jumped to the next arrival: admit again.
    Waited,
    /// Every request arrived, ran and finished (or was rejected).
    Done,
}

/// The run's figures (see the module doc for what is counted).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScheduleSummary {
    /// Decode steps run.
    pub steps: u64,
    /// Clock at the end (busy + idle), seconds.
    pub elapsed_s: f64,
    /// Busy time: steps and stalls, seconds.
    pub busy_s: f64,
    /// Tokens decoded (one per running request per step).
    pub decode_tokens: u64,
    /// `decode_tokens / busy_s`.
    pub tokens_per_s: f64,
    /// Largest decode batch.
    pub peak_batch: u32,
    /// Median decode batch over steps.
    pub median_batch: u32,
    /// Mean decode batch over steps.
    pub mean_batch: f64,
    /// Median queueing time to admission, ms (still-queued requests counted with their wait so far).
    pub ttft_queue_p50_ms: f64,
    /// 90th percentile of the same, ms.
    pub ttft_queue_p90_ms: f64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests finished.
    pub completed: u64,
    /// Requests that could never fit.
    pub rejected: u64,
    /// Requests waiting at the end.
    pub queued_at_end: u64,
    /// Requests that had arrived by the end (admitted, rejected or queued).
    pub arrived: u64,
    /// Median time per output token of the requests finished in the run, ms (0 when none).
    #[serde(default)]
    pub tpot_p50_ms: f64,
    /// 99th percentile of the same, ms.
    #[serde(default)]
    pub tpot_p99_ms: f64,
}

/// Arrival replay and decode-step accounting (see the module doc).
#[derive(Clone, Debug)]
pub struct Scheduler {
    reqs: Vec<TraceRequest>,
    id_base: u64,
    next: usize,
    queue: VecDeque<usize>,
    running: Vec<Active>,
    max_batch: u32,
    now_us: f64,
    busy_us: f64,
    batches: Vec<u32>,
    waits_us: Vec<f64>,
    /// Per trace request (index): admission, first token and finish times.
    times: Vec<RequestTiming>,
    tokens: u64,
    admitted: u64,
    completed: u64,
    rejected: u64,
}

impl Scheduler {
    /// A scheduler over `trace` with arrivals `load` times faster than recorded (> 1 = more load)
    /// and at most `max_batch` requests decoding at once. Errors (`KvError::InvalidConfig`):
    /// `load` not finite and > 0, `max_batch` 0; `KvError::Trace` for an empty trace.
    pub fn new(trace: &ArrivalTrace, load: f64, max_batch: u32) -> Result<Self> {
        if !(load.is_finite() && load > 0.0) {
            return Err(KvError::InvalidConfig(format!(
                "load {load} must be finite and > 0"
            )));
        }
        if max_batch == 0 {
            return Err(KvError::InvalidConfig("max_batch must be >= 1".into()));
        }
        if trace.requests.is_empty() {
            return Err(KvError::Trace(format!(
                "{}: no requests (empty trace)",
                trace.name
            )));
        }
        let mut t = trace.clone();
        t.speed_up(load);
        let times = t
            .requests
            .iter()
            .enumerate()
            .map(|(i, q)| RequestTiming {
                id: i as u64 + 1,
                arrival_us: q.arrival_ms as f64 * 1000.0,
                admitted_us: None,
                first_token_us: None,
                finished_us: None,
                output: q.output_length.max(1),
            })
            .collect();
        Ok(Self {
            reqs: t.requests,
            id_base: 0,
            next: 0,
            queue: VecDeque::new(),
            running: Vec::new(),
            max_batch,
            now_us: 0.0,
            busy_us: 0.0,
            batches: Vec::new(),
            waits_us: Vec::new(),
            times,
            tokens: 0,
            admitted: 0,
            completed: 0,
            rejected: 0,
        })
    }

    /// Session ids start at `base + 1` instead of 1 (an id is `base + trace index + 1`). A pool
    /// never takes a finished session's id again (`SessionExists`), so runs that share one pool
    /// give each run its own base.
    pub fn with_id_base(mut self, base: u64) -> Self {
        self.id_base = base;
        for (i, t) in self.times.iter_mut().enumerate() {
            t.id = base + i as u64 + 1;
        }
        self
    }

    /// Every trace request's clock readings so far (trace order; those not yet arrived too).
    pub fn timings(&self) -> &[RequestTiming] {
        &self.times
    }

    /// The timings of the requests that arrived by now (trace order).
    pub fn arrived_timings(&self) -> Vec<RequestTiming> {
        self.times[..self.next].to_vec()
    }

    /// The clock, µs since the (scaled) trace start.
    pub fn now_us(&self) -> f64 {
        self.now_us
    }

    /// The requests decoding now, in batch order (the order of the step's query rows).
    pub fn running(&self) -> &[Active] {
        &self.running
    }

    /// Requests arrived and waiting for admission.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    fn release_arrivals(&mut self) {
        while self.next < self.reqs.len()
            && self.reqs[self.next].arrival_ms as f64 * 1000.0 <= self.now_us
        {
            self.queue.push_back(self.next);
            self.next += 1;
        }
    }

    /// Releases the arrivals due by now and admits from the head of the queue while `decide`
    /// says [`Decision::Admitted`] and the batch has room (first come first served: a head that
    /// gets `NoRoom` blocks the rest). `decide` sees the request as it will run (`generated` 0,
    /// `output >= 1`). Returns the requests admitted now; `decide`'s first error ends the call
    /// (what was admitted before stays admitted).
    pub fn admit<E>(
        &mut self,
        mut decide: impl FnMut(&Active) -> std::result::Result<Decision, E>,
    ) -> std::result::Result<Vec<Active>, E> {
        self.release_arrivals();
        let mut admitted = Vec::new();
        while let Some(&i) = self.queue.front() {
            if self.running.len() as u32 >= self.max_batch {
                break;
            }
            let q = self.reqs[i];
            let a = Active {
                id: self.id_base + i as u64 + 1,
                input: q.input_length,
                output: q.output_length.max(1),
                generated: 0,
            };
            match decide(&a)? {
                Decision::NoRoom => break,
                Decision::Reject => {
                    self.rejected += 1;
                    self.queue.pop_front();
                }
                Decision::Admitted => {
                    self.queue.pop_front();
                    self.admitted += 1;
                    self.waits_us
                        .push((self.now_us - q.arrival_ms as f64 * 1000.0).max(0.0));
                    self.times[i].admitted_us = Some(self.now_us);
                    self.running.push(a);
                    admitted.push(a);
                }
            }
        }
        Ok(admitted)
    }

    /// Call after [`Scheduler::admit`]: [`Phase::Step`] when requests run; otherwise the clock
    /// jumps to the next arrival ([`Phase::Waited`]) or the run is over ([`Phase::Done`]).
    /// Error (`KvError::InvalidConfig`): nothing runs but the queue's head was not admitted —
    /// nothing will ever free room for it (the placement's answer was wrong).
    pub fn before_step(&mut self) -> Result<Phase> {
        if !self.running.is_empty() {
            return Ok(Phase::Step);
        }
        if let Some(&i) = self.queue.front() {
            return Err(KvError::InvalidConfig(format!(
                "request {i} cannot be admitted into an idle placement"
            )));
        }
        if self.next >= self.reqs.len() {
            return Ok(Phase::Done);
        }
        self.now_us = self
            .now_us
            .max(self.reqs[self.next].arrival_ms as f64 * 1000.0);
        Ok(Phase::Waited)
    }

    /// Ends a decode step that took `step_us` µs: every running request gained one token; those
    /// that produced their last token leave the batch and are returned (in batch order). The
    /// remaining requests keep their relative order. `step_us` must be finite and >= 0 (else
    /// `KvError::InvalidConfig`, nothing changes).
    pub fn end_step(&mut self, step_us: f64) -> Result<Vec<Active>> {
        check_us(step_us)?;
        self.batches.push(self.running.len() as u32);
        self.tokens += self.running.len() as u64;
        self.now_us += step_us;
        self.busy_us += step_us;
        let mut finished = Vec::new();
        let (now, base, times) = (self.now_us, self.id_base, &mut self.times);
        self.running.retain_mut(|a| {
            a.generated += 1;
            let t = &mut times[(a.id - base - 1) as usize];
            if a.generated == 1 {
                t.first_token_us = Some(now);
            }
            if a.generated >= a.output {
                t.finished_us = Some(now);
                finished.push(*a);
                false
            } else {
                true
            }
        });
        self.completed += finished.len() as u64;
        Ok(finished)
    }

    /// Adds a stall outside a step (e.g. an admission copy the next step waits for), µs; busy
    /// time. `us` finite and >= 0 (else `KvError::InvalidConfig`).
    pub fn stall(&mut self, us: f64) -> Result<()> {
        check_us(us)?;
        self.now_us += us;
        self.busy_us += us;
        Ok(())
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.batches.len() as u64
    }

    /// The figures so far.
    pub fn summary(&self) -> ScheduleSummary {
        let steps = self.batches.len() as u64;
        let mut b = self.batches.clone();
        b.sort_unstable();
        let mut waits = self.waits_us.clone();
        waits.extend(
            self.queue
                .iter()
                .map(|&i| (self.now_us - self.reqs[i].arrival_ms as f64 * 1000.0).max(0.0)),
        );
        waits.sort_by(f64::total_cmp);
        let mut tpot: Vec<f64> = self.times.iter().filter_map(|t| t.tpot_us()).collect();
        tpot.sort_by(f64::total_cmp);
        let busy_s = self.busy_us / 1e6;
        ScheduleSummary {
            steps,
            elapsed_s: self.now_us / 1e6,
            busy_s,
            decode_tokens: self.tokens,
            tokens_per_s: if busy_s > 0.0 {
                self.tokens as f64 / busy_s
            } else {
                0.0
            },
            peak_batch: b.last().copied().unwrap_or(0),
            median_batch: b.get(b.len() / 2).copied().unwrap_or(0),
            mean_batch: self.tokens as f64 / steps.max(1) as f64,
            ttft_queue_p50_ms: percentile(&waits, 0.5) / 1e3,
            ttft_queue_p90_ms: percentile(&waits, 0.9) / 1e3,
            admitted: self.admitted,
            completed: self.completed,
            rejected: self.rejected,
            queued_at_end: self.queue.len() as u64,
            arrived: self.next as u64,
            tpot_p50_ms: percentile(&tpot, 0.5) / 1e3,
            tpot_p99_ms: percentile(&tpot, 0.99) / 1e3,
        }
    }
}

fn check_us(us: f64) -> Result<()> {
    if us.is_finite() && us >= 0.0 {
        Ok(())
    } else {
        Err(KvError::InvalidConfig(format!(
            "a duration of {us} µs must be finite and >= 0"
        )))
    }
}

/// The `q` quantile of sorted `v` by the nearest-rank method (`0` for an empty slice).
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(reqs: &[(u64, u32, u32)]) -> ArrivalTrace {
        ArrivalTrace {
            name: "t".into(),
            requests: reqs
                .iter()
                .map(|&(arrival_ms, input_length, output_length)| TraceRequest {
                    arrival_ms,
                    input_length,
                    output_length,
                })
                .collect(),
        }
    }

    /// Runs a scheduler with a room limit of `room` history tokens (sum of `total()`), fixed
    /// step time; returns the summary and the admission order.
    fn run(t: &ArrivalTrace, load: f64, room: u64, step_us: f64) -> (ScheduleSummary, Vec<u64>) {
        let mut s = Scheduler::new(t, load, 8).unwrap();
        let mut used = 0u64;
        let mut order = Vec::new();
        loop {
            let got = s
                .admit(|a| -> Result<Decision> {
                    Ok(if a.total() > room {
                        Decision::Reject
                    } else if used + a.total() <= room {
                        used += a.total();
                        Decision::Admitted
                    } else {
                        Decision::NoRoom
                    })
                })
                .unwrap();
            order.extend(got.iter().map(|a| a.id));
            match s.before_step().unwrap() {
                Phase::Done => break,
                Phase::Waited => continue,
                Phase::Step => {}
            }
            for f in s.end_step(step_us).unwrap() {
                used -= f.total();
            }
        }
        (s.summary(), order)
    }

    #[test]
    fn accounting_of_a_hand_checked_run() {
        // Two requests at 0 ms: 10 + 2 and 10 + 3 tokens; a third at 100 ms: 5 + 1.
        let t = trace(&[(0, 10, 2), (0, 10, 3), (100, 5, 1)]);
        let (s, order) = run(&t, 1.0, 1000, 1000.0);
        assert_eq!(order, [1, 2, 3]);
        // Steps: [1,2] [1,2] [2] (t = 3 ms), idle until 100 ms, [3].
        assert_eq!(s.steps, 4);
        assert_eq!(s.decode_tokens, 2 + 3 + 1);
        assert_eq!(s.peak_batch, 2);
        assert_eq!(s.median_batch, 2); // sorted [1,1,2,2]
        assert!((s.busy_s - 0.004).abs() < 1e-12);
        assert!((s.elapsed_s - 0.101).abs() < 1e-12);
        assert!((s.tokens_per_s - 6.0 / 0.004).abs() < 1e-6);
        assert_eq!((s.admitted, s.completed, s.rejected), (3, 3, 0));
        assert_eq!(s.ttft_queue_p90_ms, 0.0);
    }

    #[test]
    fn per_request_ttft_and_tpot_and_the_common_finished_set() {
        // Two requests at 0 ms: 10 + 2 and 10 + 3 tokens; steps of 1 ms.
        let t = trace(&[(0, 10, 2), (0, 10, 3), (100, 5, 1)]);
        let mut s = Scheduler::new(&t, 1.0, 8).unwrap();
        s.admit(|_| -> Result<Decision> { Ok(Decision::Admitted) })
            .unwrap();
        s.stall(500.0).unwrap(); // an admission copy before the first step
        for _ in 0..3 {
            s.end_step(1000.0).unwrap();
        }
        let tm = s.timings();
        // First tokens at 1.5 ms (the stall and one step), finished at 2.5 and 3.5 ms.
        assert_eq!(tm[0].ttft_us(), Some(1500.0));
        assert_eq!(tm[0].tpot_us(), Some(1000.0));
        assert_eq!(tm[1].finished_us, Some(3500.0));
        assert_eq!(tm[1].tpot_us(), Some(1000.0));
        assert_eq!((tm[2].admitted_us, tm[2].ttft_us()), (None, None));
        let sum = s.summary();
        assert_eq!((sum.tpot_p50_ms, sum.tpot_p99_ms), (1.0, 1.0));
        assert_eq!(s.arrived_timings().len(), 2);
        // Common set: request 1 finished in both runs, request 2 only in the first.
        let mut other = tm.to_vec();
        other[1].finished_us = None;
        let ids = common_finished(&[tm, &other]);
        assert_eq!(ids, [1]);
        let q = quantiles_ms(tm, &ids, RequestTiming::ttft_us, &[0.5, 0.9]);
        assert_eq!(q, [1.5, 1.5]);
        // Ids follow the id base.
        let s = Scheduler::new(&t, 1.0, 8).unwrap().with_id_base(1 << 32);
        assert_eq!(s.timings()[0].id, (1 << 32) + 1);
    }

    #[test]
    fn head_of_line_waits_and_queueing_is_measured() {
        // Room 20 tokens: the second request (15) waits for the first (12) to finish; the third
        // (5) arrives behind it and waits too (first come first served).
        let t = trace(&[(0, 10, 2), (0, 12, 3), (0, 3, 2)]);
        let (s, order) = run(&t, 1.0, 20, 1000.0);
        assert_eq!(order, [1, 2, 3]);
        // Request 2 admitted after 2 steps (2 ms), request 3 with it (15 + 5 = 20).
        assert_eq!(s.ttft_queue_p50_ms, 2.0);
        assert_eq!(s.ttft_queue_p90_ms, 2.0);
        assert_eq!(s.peak_batch, 2);
        assert_eq!(s.completed, 3);
        // A request larger than the room is rejected, not waited for.
        let (s, order) = run(&trace(&[(0, 30, 1), (0, 5, 1)]), 1.0, 20, 10.0);
        assert_eq!((s.rejected, order), (1, vec![2]));
    }

    #[test]
    fn load_scales_arrivals_and_stalls_count_as_busy_time() {
        let t = trace(&[(0, 1, 1), (1000, 1, 1)]);
        let (s1, _) = run(&t, 1.0, 100, 10.0);
        let (s4, _) = run(&t, 4.0, 100, 10.0);
        assert!((s1.elapsed_s - 1.00001).abs() < 1e-9, "{s1:?}");
        assert!((s4.elapsed_s - 0.25001).abs() < 1e-9, "{s4:?}");
        let mut s = Scheduler::new(&t, 1.0, 4).unwrap();
        s.admit(|_| -> Result<Decision> { Ok(Decision::Admitted) })
            .unwrap();
        s.stall(500.0).unwrap();
        assert_eq!(s.end_step(500.0).unwrap().len(), 1);
        assert!((s.summary().busy_s - 0.001).abs() < 1e-12);
        assert!(s.stall(f64::NAN).is_err());
        assert!(s.end_step(-1.0).is_err());
        assert_eq!(s.steps(), 1);
    }

    #[test]
    fn still_queued_requests_enter_the_percentiles_and_bad_input_is_typed() {
        let t = trace(&[(0, 10, 5), (0, 10, 5), (0, 10, 5)]);
        let mut s = Scheduler::new(&t, 1.0, 1).unwrap();
        s.admit(|_| -> Result<Decision> { Ok(Decision::Admitted) })
            .unwrap();
        assert_eq!(s.running().len(), 1, "max_batch 1");
        s.end_step(4000.0).unwrap();
        let sum = s.summary();
        assert_eq!(sum.queued_at_end, 2);
        assert_eq!(sum.ttft_queue_p90_ms, 4.0);
        assert_eq!(sum.ttft_queue_p50_ms, 4.0);
        // An idle placement that refuses the head: an error, not a spin.
        let mut s = Scheduler::new(&t, 1.0, 4).unwrap();
        s.admit(|_| -> Result<Decision> { Ok(Decision::NoRoom) })
            .unwrap();
        assert!(matches!(s.before_step(), Err(KvError::InvalidConfig(_))));
        for load in [0.0, -1.0, f64::NAN] {
            assert!(Scheduler::new(&t, load, 4).is_err());
        }
        assert!(Scheduler::new(&t, 1.0, 0).is_err());
        assert!(Scheduler::new(&trace(&[]), 1.0, 4).is_err());
        assert_eq!(percentile(&[], 0.9), 0.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.9), 4.0);
    }
}
