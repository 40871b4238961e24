//! The serving loop: one placement at one load, step by step (see the binary's module doc).

use std::collections::HashMap;
use std::time::Instant;

use cuda_kernels::{copy_dtoh_async, CopyBackend, KvResolveArgs};
use tierkit_sim::kv::schedule::{Active, Decision, Phase, Scheduler};
use tierkit_sim::kv::selection::{SelectionGen, SelectionParams};
use tierkit_sim::kv::trace::ArrivalTrace;

use crate::device::{cu, elapsed_us, CopyWindows, Device, Res};
use crate::scenario::{DeviceErrors, Report, RunReport, Scenario, StepRecord, BUILD_COMMIT};
use crate::store::{Pattern, Store};
use crate::Args;

/// Resolved picks sampled per checked step.
const CHECK_SAMPLES: u32 = 32;

/// Runs every placement at every load.
pub fn run_all(args: &Args, trace: &ArrivalTrace) -> Res<Option<Report>> {
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return Ok(None);
    };
    let sc = args.scenario;
    let max_input = trace
        .requests
        .iter()
        .map(|q| q.input_length)
        .max()
        .unwrap_or(1);
    let max_history = trace
        .requests
        .iter()
        .map(|q| q.input_length as u64 + q.output_length.max(1) as u64)
        .max()
        .unwrap_or(1)
        .next_multiple_of(sc.page_rows as u64)
        .min(tierkit_sim::kv::trace::MAX_REQUEST_TOKENS as u64) as u32;
    println!(
        "device: {} ({}); build {BUILD_COMMIT}; trace {} ({} requests, longest {max_history} tokens); budget {:.1} GiB = {} pages of {} tokens x {} layers x {} B; weights read {:.1} GiB/step; layers held {} of {}",
        gpu.name()?,
        gpu.arch(),
        trace.name,
        trace.requests.len(),
        sc.hbm_budget_bytes as f64 / (1u64 << 30) as f64,
        sc.budget_pages(),
        sc.page_rows,
        sc.model_layers,
        sc.row_bytes,
        sc.weights_bytes as f64 / (1u64 << 30) as f64,
        sc.group_layers,
        sc.model_layers
    );
    let t0 = Instant::now();
    let mut dev = Device::new(&gpu, &sc, max_history)?;
    let pat = Pattern::new(&sc, max_input);
    eprintln!(
        "device buffers and pattern: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let mut runs = Vec::new();
    for placement in &args.placements {
        let t0 = Instant::now();
        let pl = crate::placement_of(placement).ok_or("unknown placement")?;
        let name = pl.name();
        let mut store = match pl.residency() {
            None => Store::resident(&dev, &sc, &pat)?,
            Some(kind) => Store::pool(
                &dev,
                &sc,
                (kind, args.elastic_gate),
                max_history,
                args.ordered_maps,
            )?,
        };
        eprintln!("{name}: store ready in {:.1} s", t0.elapsed().as_secs_f64());
        for (run_no, &load) in args.loads.iter().enumerate() {
            // Each run of a pool takes fresh session ids (a pool never reuses a finished one).
            let id_base = (run_no as u64) << 32;
            let mut r = run_one(
                args,
                &mut dev,
                &mut store,
                &pat,
                trace,
                (load, id_base),
                name,
                max_history,
            )?;
            if let Store::Pool(p, _) = &store {
                let e = p.device().errors()?;
                r.device_errors = Some(DeviceErrors {
                    bad_session: e.bad_session,
                    bad_position: e.bad_position,
                    overflow: e.overflow,
                    bad_qsl: e.bad_qsl,
                    stale_plan: e.stale_plan,
                });
            }
            let s = &r.summary;
            println!(
                "{name:>16} load {load:>6}: {:>7.0} tok/s, batch peak {:>3} median {:>3}, TTFT p90 {:>9.1} ms, step {:>7.2} ms, miss {:>7.1} MB/step, {} steps, {} rows checked, {:.1} s",
                s.tokens_per_s,
                s.peak_batch,
                s.median_batch,
                s.ttft_queue_p90_ms,
                r.step_us_median / 1e3,
                r.miss_bytes_per_step / 1e6,
                s.steps,
                r.rows_checked,
                r.wall_s
            );
            runs.push(r);
        }
        if let Store::Pool(p, _) = &store {
            let e = p.device().errors()?;
            println!("{name}: device error counters {e:?}");
        }
        drop(store);
        gpu.synchronize()?;
    }
    Ok(Some(Report {
        commit: BUILD_COMMIT.to_string(),
        device: gpu.name()?,
        trace: args.trace.display().to_string(),
        requests: trace.requests.len(),
        scenario: sc,
        max_steps: args.max_steps,
        runs,
    }))
}

/// Bytes the stand-ins move per token for the layers not held physically.
fn shadow_token_bytes(sc: &Scenario) -> u64 {
    sc.shadow_layers() as u64 * sc.row_bytes as u64
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    args: &Args,
    dev: &mut Device,
    store: &mut Store,
    pat: &Pattern,
    trace: &ArrivalTrace,
    (load, id_base): (f64, u64),
    name: &str,
    max_history: u32,
) -> Res<RunReport> {
    let sc = args.scenario;
    let wall = Instant::now();
    // The elastic placement may run under its own cap (`--elastic-max-batch`, at most the
    // scenario's max batch, which sizes the device buffers).
    let cap = match args.elastic_max_batch {
        Some(c) if name == "elastic" => c.clamp(1, sc.max_batch),
        _ => sc.max_batch,
    };
    let mut sched = Scheduler::new(trace, load, cap)?.with_id_base(id_base);
    let params = SelectionParams::calibrated(sc.top_k);
    let mut gens: HashMap<u64, SelectionGen> = HashMap::new();
    let s = dev.gpu.stream().clone();
    let copy = store.copy_stream(dev);
    let shadow = shadow_token_bytes(&sc);
    let k = sc.top_k as usize;
    let mut steps: Vec<StepRecord> = Vec::new();
    let (mut adm_ms, mut adm_bytes, mut growth_ms) = (0.0f64, 0u64, 0.0f64);
    let mut kv_pages: Vec<u32> = Vec::new();
    let (mut dev_gib, mut peak_seen) = (0.0f64, 0usize);
    let (mut checked, mut mismatched) = (0u64, 0u64);
    let mut one = Vec::with_capacity(k);
    let mut stopped = false;
    let mut growth_before = 0.0f64;
    // Deferred mapping: the step stream does not wait for admission / growth copies; their
    // times are read once they passed.
    let defer = store.defers_copies();
    let mut windows = CopyWindows::default();
    let (mut mirror_bytes, mut backup_wait_us, mut waited_tokens) = (0u64, 0.0f64, 0u64);
    // SGLang's demotions wait for the request's pending backup first (a host wait on the step
    // stream, where the write-back runs): measured and added to the clock as a stall.
    let mut backup_wait =
        |store: &Store, s: &cuda_kernels::cudarc_driver::CudaStream| -> Res<f64> {
            let Some(t) = store.residency().map(|r| r.counters().backup_wait_tokens) else {
                return Ok(0.0);
            };
            if t == waited_tokens {
                return Ok(0.0);
            }
            waited_tokens = t;
            let t0 = Instant::now();
            s.synchronize().map_err(cu("cuStreamSynchronize"))?;
            Ok(t0.elapsed().as_secs_f64() * 1e6)
        };
    let mut ids: Vec<u64> = Vec::new();
    loop {
        if sched.steps() >= args.max_steps {
            break;
        }
        if wall.elapsed().as_secs_f64() > args.max_run_s {
            stopped = true;
            break;
        }
        // Admissions: history copied on the copy stream; the step waits for it (unless deferred:
        // the resident placement always waits, it must hold the history before the first step).
        windows.collect(false, &mut adm_ms, &mut growth_ms)?;
        let w = [dev.timing_event()?, dev.timing_event()?];
        w[0].record(&copy).map_err(cu("cuEventRecord"))?;
        let (mut tokens, mut mirrored) = (0u64, 0u64);
        if let Some(r) = store.residency_mut() {
            r.begin_round();
        }
        let admitted = {
            let d: &Device = dev;
            sched.admit(|a| -> Res<Decision> {
                let r = store.admit(d, &sc, a, pat, max_history)?;
                tokens += r.tokens_copied;
                mirrored += r.tokens_mirrored;
                Ok(r.decision)
            })?
        };
        if tokens > 0 {
            dev.shadow_h2d(&copy, tokens * shadow)?;
        }
        if mirrored > 0 {
            // vLLM's mirror of the prefix / SGLang's backup: every model layer's bytes (the held
            // layers' are already in the pinned store, so all of them go through the stand-in).
            dev.shadow_d2h(&copy, mirrored * sc.token_bytes_model())?;
            mirror_bytes += mirrored * sc.token_bytes_model();
        }
        let adm_us = if admitted.is_empty() {
            0.0
        } else {
            windows.end(w, &copy, (&s, !defer), true)?
        };
        adm_ms += adm_us / 1e3;
        adm_bytes += tokens * sc.token_bytes_model();
        for a in &admitted {
            let gen = SelectionGen::new(
                params,
                sc.seed ^ a.id.wrapping_mul(0x9E37_79B9),
                a.total() as u32,
            )?;
            gens.insert(a.id, gen);
        }
        let w_us = backup_wait(store, &s)?;
        backup_wait_us += w_us;
        sched.stall(w_us)?;
        match sched.before_step()? {
            Phase::Done => break,
            Phase::Waited => continue,
            Phase::Step => {}
        }
        ids.clear();
        ids.extend(sched.running().iter().map(|a| a.id));
        store.before_step(&ids);
        kv_pages.push(store.pages_in_use());
        let running: Vec<Active> = sched.running().to_vec();
        let b = running.len();
        // Inputs (uploaded before the timed region: an engine's indexer makes them on the device).
        let mut history_tokens = 0u64;
        {
            let io = &mut dev.io;
            let (seq_at, qsl_at) = (io.seq_at(), io.qsl_at());
            let topk = io.topk_h.as_mut_slice();
            for (r, a) in running.iter().enumerate() {
                gens.get_mut(&a.id)
                    .expect("every running request has a generator")
                    .step(a.history(), &mut one);
                topk[r * k..(r + 1) * k].copy_from_slice(&one);
            }
            let small = io.small_h.as_mut_slice();
            small[qsl_at] = 0;
            for (r, a) in running.iter().enumerate() {
                small[qsl_at + r + 1] = r as i32 + 1;
                small[seq_at + r] = a.history() as i32;
                history_tokens += a.history() as u64;
            }
        }
        store.step_inputs(dev, &running)?;
        let resident = matches!(store, Store::Resident(_));
        dev.io.upload(&s, b, resident)?;
        if b > peak_seen {
            peak_seen = b;
            s.synchronize().map_err(cu("cuStreamSynchronize"))?;
            let (free, total) =
                cuda_kernels::cudarc_driver::result::mem_get_info().map_err(cu("cuMemGetInfo"))?;
            dev_gib = (total - free) as f64 / (1u64 << 30) as f64;
        }
        // The timed step.
        let step_no = sched.steps() as u32;
        let ev = &dev.ev;
        ev[0].record(&s).map_err(cu("cuEventRecord"))?;
        dev.read_weights(&s)?;
        ev[1].record(&s).map_err(cu("cuEventRecord"))?;
        let io = &dev.io;
        match &*store {
            Store::Pool(p, _) => {
                let a = KvResolveArgs {
                    topk: io.topk.device_ptr(),
                    query_start_loc: io.small_ptr(io.qsl_at()),
                    seq_lens: io.small_ptr(io.seq_at()),
                    session_slot: io.small_ptr(io.slots_at()),
                    sessions: b as u32,
                    rows: b as u32,
                    k: sc.top_k,
                    layer: 0,
                    indices: io.idx.device_ptr(),
                    valid_count: io.valid.device_ptr(),
                    plan: io.plan.device_ptr(),
                    plan_count: io.count.device_ptr(),
                    stats: io.stats.device_ptr(),
                };
                // SAFETY: every buffer of `a` is live and sized for max_batch requests of k picks
                // (plan: hot_rows per request); nothing else touches the pool's tables now (the
                // copy stream's fills were waited for above, or, deferred, write only rows of
                // pages not mapped yet).
                // (The pool's layers are one layer group: the resolve fetched the misses into
                // every physical plane.)
                unsafe { p.device().resolve_async(&s, &a, CopyBackend::Gather)? };
                dev.shadow_misses(
                    &s,
                    b as u32,
                    sc.hot_rows,
                    sc.row_bytes,
                    sc.shadow_layers(),
                    step_no,
                )?;
            }
            Store::Resident(_) => {
                // SAFETY: picks, lengths and block table staged for b requests; outputs sized.
                unsafe {
                    dev.standins.resident_indices_async(
                        &s,
                        io.topk.device_ptr(),
                        io.small_ptr(io.qsl_at()),
                        io.small_ptr(io.seq_at()),
                        io.bt.device_ptr(),
                        io.max_blocks as u32,
                        sc.page_rows,
                        b as u32,
                        sc.top_k,
                        io.idx.device_ptr(),
                        io.valid.device_ptr(),
                    )?
                };
            }
        }
        ev[2].record(&s).map_err(cu("cuEventRecord"))?;
        dev.attend(&s, &sc, b as u32, |l| store.plane_ptr(l))?;
        ev[3].record(&s).map_err(cu("cuEventRecord"))?;
        // SAFETY: the new rows (one per continuing request, -1 otherwise) lie in the requests'
        // tails (pools) or pages (resident), inside every physical plane.
        unsafe {
            dev.standins.write_rows_async(
                &s,
                store.plane_ptr(0)?,
                store.plane_bytes(),
                sc.row_bytes,
                sc.group_layers,
                io.small_ptr(io.rows_at()),
                b as u32,
                step_no,
            )?
        };
        let continuing: Vec<(u64, u32)> = running
            .iter()
            .filter(|a| !a.last_step())
            .map(|a| (a.id, 1))
            .collect();
        if let Store::Pool(p, _) = store {
            p.append_written_batch(&continuing)?;
            dev.shadow_d2h(&s, continuing.len() as u64 * shadow)?;
        }
        let ev = &dev.ev;
        ev[4].record(&s).map_err(cu("cuEventRecord"))?;
        let step_us = elapsed_us(&ev[0], &ev[4])?;
        let sec = [
            elapsed_us(&ev[0], &ev[1])?,
            elapsed_us(&ev[1], &ev[2])?,
            elapsed_us(&ev[2], &ev[3])?,
            elapsed_us(&ev[3], &ev[4])?,
        ];
        let misses: u64 = if resident {
            0
        } else {
            dev.io.count.download()?[..b]
                .iter()
                .map(|&c| c as u64)
                .sum()
        };
        if let Store::Pool(p, _) = &*store {
            let last = sched.steps() + 1 >= args.max_steps;
            if last || sched.steps().is_multiple_of(args.check_every) {
                let (c, m) = check_rows(dev, p, &sc, &running, step_no)?;
                checked += c;
                mismatched += m;
            }
        }
        for f in sched.end_step(step_us)? {
            store.finish(f.id)?;
            gens.remove(&f.id);
        }
        if let Some(r) = store.residency_mut() {
            r.observe_step(b as u32, misses, step_us);
        }
        // Between steps: hand-back and growth (their fills are waited for by the next step,
        // unless deferred).
        let w = [dev.timing_event()?, dev.timing_event()?];
        w[0].record(&copy).map_err(cu("cuEventRecord"))?;
        ids.clear();
        ids.extend(sched.running().iter().map(|a| a.id));
        let grown = store.maintain(&sc, &ids)?;
        if grown > 0 {
            dev.shadow_h2d(&copy, grown * shadow)?;
        }
        let g_us = if grown == 0 {
            0.0
        } else {
            windows.end(w, &copy, (&s, !defer), false)?
        };
        growth_ms += g_us / 1e3;
        let w_us = backup_wait(store, &s)?;
        backup_wait_us += w_us;
        sched.stall(adm_us + g_us + w_us)?;
        steps.push(StepRecord {
            batch: b as u32,
            history_tokens,
            misses: misses as u32,
            step_us: step_us as f32,
            weights_us: sec[0] as f32,
            resolve_us: sec[1] as f32,
            attend_us: sec[2] as f32,
            write_us: sec[3] as f32,
            copy_stall_us: (adm_us + growth_before) as f32,
        });
        growth_before = g_us;
    }
    // The growth after the last step stalled the clock too (`sched.stall` above) but has no next
    // step to be booked on: it is reported on its own (`trailing_copy_stall_us`) and counted in the
    // mean stall, but not added to a step, so ratios over the first n steps of runs of different
    // lengths compare the same kind of steps.
    let trailing_us = growth_before;
    // Drain: every session still running ends; pools hand their pages back for the next run.
    let left: Vec<u64> = sched.running().iter().map(|a| a.id).collect();
    for id in left {
        store.finish(id)?;
    }
    for _ in 0..100_000 {
        if store.pages_in_use() == 0 {
            break;
        }
        dev.gpu.synchronize()?;
        store.maintain(&sc, &[])?;
    }
    dev.gpu.synchronize()?;
    windows.collect(true, &mut adm_ms, &mut growth_ms)?;
    if store.pages_in_use() != 0 {
        return Err(format!(
            "{name}: {} pages still in use after the drain",
            store.pages_in_use()
        )
        .into());
    }
    let summary = sched.summary();
    let page_gib = sc.page_bytes_model() as f64 / (1u64 << 30) as f64;
    let n = steps.len().max(1) as f64;
    Ok(RunReport {
        placement: name.into(),
        max_batch: cap,
        load,
        step_us_median: median(steps.iter().map(|x| x.step_us as f64)),
        section_us_median: [
            median(steps.iter().map(|x| x.weights_us as f64)),
            median(steps.iter().map(|x| x.resolve_us as f64)),
            median(steps.iter().map(|x| x.attend_us as f64)),
            median(steps.iter().map(|x| x.write_us as f64)),
        ],
        resolve_us_mean: mean(steps.iter().map(|x| x.resolve_us as f64)),
        misses_per_step: steps.iter().map(|x| x.misses as f64).sum::<f64>() / n,
        miss_bytes_per_step: steps.iter().map(|x| x.misses as f64).sum::<f64>() / n
            * sc.token_bytes_model() as f64,
        copy_stall_us_per_step: (steps.iter().map(|x| x.copy_stall_us as f64).sum::<f64>()
            + trailing_us)
            / n,
        trailing_copy_stall_us: trailing_us,
        admission_copy_ms: adm_ms,
        admission_bytes: adm_bytes,
        growth_copy_ms: growth_ms,
        kv_gib_peak: kv_pages.iter().copied().max().unwrap_or(0) as f64 * page_gib,
        kv_gib_median: median(kv_pages.iter().map(|&p| p as f64)) * page_gib,
        device_gib_used: dev_gib,
        rows_checked: checked,
        rows_mismatched: mismatched,
        device_errors: None,
        mirror_bytes,
        writeback_bytes: steps
            .iter()
            .map(|x| x.batch as u64)
            .sum::<u64>()
            .saturating_sub(summary.completed)
            * if matches!(store, Store::Pool(..)) {
                sc.token_bytes_model()
            } else {
                0
            },
        backup_wait_us,
        residency: store.residency().map(|r| *r.counters()),
        requests: sched.arrived_timings(),
        stopped_by_wall_clock: stopped,
        wall_s: wall.elapsed().as_secs_f64(),
        summary,
        steps,
    })
}

/// Compares sampled resolved rows of the step just run (every physical plane) with the pinned
/// host store. Skips `-1` picks and the rows this step's new tokens overwrote (the tail ring's
/// slot shared by the oldest tail position). Returns (rows checked, rows that differ).
fn check_rows(
    dev: &Device,
    p: &kv_elastic::gpu::GpuElasticPool,
    sc: &Scenario,
    running: &[Active],
    step_no: u32,
) -> Res<(u64, u64)> {
    let s = dev.gpu.stream();
    let k = sc.top_k as usize;
    let idx = dev.io.idx.download()?;
    let topk = dev.io.topk_h.as_slice();
    let new_rows = &dev.io.small_h.as_slice()[dev.io.rows_at()..];
    let rb = sc.row_bytes as usize;
    let mut row = vec![0u8; rb];
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ step_no as u64;
    let (mut checked, mut bad) = (0u64, 0u64);
    for _ in 0..CHECK_SAMPLES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let r = (x % running.len() as u64) as usize;
        let j = ((x >> 20) % k as u64) as usize;
        let (pos, at) = (topk[r * k + j], idx[r * k + j]);
        if pos < 0 || at < 0 || at == new_rows[r] {
            continue;
        }
        let a = running[r];
        for l in 0..sc.group_layers {
            let src = p.device().plane_ptr(l)? + at as u64 * rb as u64;
            // SAFETY: `row` holds rb bytes and lives until the synchronize below; the source row
            // lies inside plane l.
            unsafe { copy_dtoh_async(row.as_mut_ptr(), src, rb, s)? };
            s.synchronize().map_err(cu("cuStreamSynchronize"))?;
            let host = p.cpu().host().row(a.id, pos as u32, l)?;
            checked += 1;
            if host != row.as_slice() {
                bad += 1;
                eprintln!(
                    "MISMATCH: step {step_no}, session {}, position {pos}, layer {l}, arena row {at}",
                    a.id
                );
            }
        }
    }
    Ok((checked, bad))
}

/// Median of `v` (sorted copy; 0 for empty).
fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Mean of `v` (0 for empty).
fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut n) = (0.0, 0usize);
    for x in v {
        s += x;
        n += 1;
    }
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}
