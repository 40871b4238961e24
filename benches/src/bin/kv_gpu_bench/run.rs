//! `kv_gpu_bench`'s driver: the modes (`--mode`), each a measurement built from the harness of
//! `kv_gpu_bench.rs` (`bench`), the peer comparison (`peer`) and the admission timing (`admit`).

use cuda_kernels::DeviceBuffer;
use cuda_kernels::{CopyBackend, KvCopy, KV_STATS};
use tierkit_testkit::KvStandins;

use crate::bench::*;

/// Runs the measurements `--mode` names (default `all`), printing their table.
pub fn run() -> Res<()> {
    let mode = std::env::args()
        .skip_while(|a| a != "--mode")
        .nth(1)
        .unwrap_or_else(|| "all".into());
    const MODES: &str = "all, peer, peer-resident, admit, admit-import";
    if !MODES.split(", ").any(|m| m == mode) {
        // Refused with or without a device (the match below keeps its own arm for safety).
        return Err(format!("unknown --mode {mode} ({MODES})").into());
    }
    // The peer's source first: a missing one is refused with or without a device, and the
    // record of the one read (release, wheel, SHA-256s) heads the output.
    let peer = if mode.starts_with("peer") {
        let p = crate::peer::PeerArgs::from_args()?;
        println!("{}", p.describe());
        Some(p)
    } else {
        None
    };
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return Ok(());
    };
    if std::env::args().any(|a| a == "--lineinfo") {
        gpu.set_line_info(true); // source lines for compute-sanitizer / Nsight Compute
    }
    let reps: usize = std::env::args()
        .skip_while(|a| a != "--reps")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    match (mode.as_str(), &peer) {
        ("all", _) => {}
        ("peer", Some(p)) => return crate::peer::run(&gpu, reps, p),
        ("peer-resident", Some(p)) => return crate::peer::run_resident(&gpu, reps, p),
        ("admit", _) => return crate::admit::run(&gpu, reps, false),
        ("admit-import", _) => return crate::admit::run(&gpu, reps, true),
        (other, _) => return Err(format!("unknown --mode {other} ({MODES})").into()),
    }
    let warm = 3;
    let standins = KvStandins::new(&gpu)?;
    let s = gpu.stream().clone();
    let ev = Ev::new(&gpu)?;
    println!(
        "device: {} ({}), batch {REQS}, top-k {K}, rows {ROW} B, layers {LAYERS}, {reps} timed reps (median)",
        gpu.name()?,
        gpu.arch()
    );
    let mut t = Table(vec![vec![
        "measurement".into(),
        "median".into(),
        "figure".into(),
        "vs ceiling / target".into(),
    ]]);

    // ---------- 1. direct path + 3. low-load decode step (whole history resident) ----------
    let full = setup(&gpu, 2048, 4096, true, LAYERS)?;
    let tail_start = full.history - 64;
    let sets = resident_sets(tail_start, 42);
    let picks = upload_steps(&gpu, &sets)?;
    let out = Out::new(&gpu, 2048)?;
    let dev = full.pool.device();
    gpu.synchronize()?;
    let mut tv = Vec::new();
    let mut tb = Vec::new();
    for i in 0..warm + 5 * reps {
        let a = out.args(&full, at(&picks, i % 4), 0);
        ev.start(&s)?;
        // SAFETY: buffers of `out`/`full`/`picks` are live and shaped for REQS x K.
        unsafe { dev.resolve_async(&s, &a, CopyBackend::Gather)? };
        let us = ev.stop_us(&s)?;
        ev.start(&s)?;
        // SAFETY: as above; block table [REQS][max_blocks].
        unsafe {
            standins.resident_indices_async(
                &s,
                at(&picks, i % 4),
                full.qsl.device_ptr(),
                full.seq.device_ptr(),
                full.block_table.device_ptr(),
                full.max_blocks,
                64,
                REQS as u32,
                K as u32,
                out.idx.device_ptr(),
                out.valid.device_ptr(),
            )?
        };
        let ub = ev.stop_us(&s)?;
        if i >= warm {
            tv.push(us);
            tb.push(ub);
        }
    }
    assert_eq!(out.misses()?, 0, "direct path must not fetch");
    let st = out.stats.download()?;
    let direct: u32 = st.chunks(KV_STATS).map(|c| c[6]).sum();
    let direct_us = median(&mut tv);
    t.row(
        "resolve, direct path (64 x 2048, all resident)",
        format!("{direct_us:.1} us"),
        format!("{direct} / {REQS} requests direct"),
        format!(
            "target <= 20 us: {}",
            if direct_us <= 20.0 { "met" } else { "MISSED" }
        ),
    );
    // The same resolve captured once in a CUDA graph and replayed (fixed buffers).
    {
        use cuda_kernels::cudarc_driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let a = out.args(&full, at(&picks, 0), 0);
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cu("cuStreamBeginCapture"))?;
        // SAFETY: as above; the buffers outlive the graph.
        unsafe { dev.resolve_async(&s, &a, CopyBackend::Gather)? };
        let graph = s
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(cu("cuStreamEndCapture"))?
            .ok_or("empty graph")?;
        let mut tg = Vec::new();
        for i in 0..warm + 5 * reps {
            ev.start(&s)?;
            graph.launch().map_err(cu("cuGraphLaunch"))?;
            let us = ev.stop_us(&s)?;
            if i >= warm {
                tg.push(us);
            }
        }
        t.row(
            "resolve, direct path, CUDA graph replay",
            format!("{:.1} us", median(&mut tg)),
            String::new(),
            "target <= 20 us".into(),
        );
    }
    t.row(
        "block-table conversion (fully resident engine)",
        format!("{:.1} us", median(&mut tb)),
        String::new(),
        "baseline".into(),
    );

    // Decode step: resident vs elastic at low load.
    let q: Vec<f32> = (0..ROW).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
    let qd = DeviceBuffer::from_host(gpu.ctx(), &q)?;
    let att = DeviceBuffer::<f32>::zeroed(gpu.ctx(), REQS)?;
    let attend_all = |dev: &kv_elastic::gpu::GpuArena, o: &Out| -> Res<()> {
        for l in 0..LAYERS {
            // SAFETY: indices/valid of `o` hold rows inside the arena or -1; q/att sized.
            unsafe {
                standins.attend_async(
                    &s,
                    dev.plane_ptr(l)?,
                    dev.dims().row_bytes,
                    o.idx.device_ptr(),
                    o.valid.device_ptr(),
                    REQS as u32,
                    K as u32,
                    qd.device_ptr(),
                    att.device_ptr(),
                )?
            };
        }
        Ok(())
    };
    let (mut tr, mut te) = (Vec::new(), Vec::new());
    for i in 0..warm + 3 * reps {
        let a = out.args(&full, at(&picks, i % 4), 0);
        ev.start(&s)?;
        // SAFETY: as above.
        unsafe {
            standins.resident_indices_async(
                &s,
                at(&picks, i % 4),
                full.qsl.device_ptr(),
                full.seq.device_ptr(),
                full.block_table.device_ptr(),
                full.max_blocks,
                64,
                REQS as u32,
                K as u32,
                out.idx.device_ptr(),
                out.valid.device_ptr(),
            )?
        };
        attend_all(dev, &out)?;
        let ur = ev.stop_us(&s)?;
        ev.start(&s)?;
        // SAFETY: as above.
        unsafe { dev.resolve_async(&s, &a, CopyBackend::Gather)? };
        attend_all(dev, &out)?;
        let ue = ev.stop_us(&s)?;
        if i >= warm {
            tr.push(ur);
            te.push(ue);
        }
    }
    let resident_step = median(&mut tr);
    let low_step = median(&mut te);
    t.row(
        "decode step, fully resident (convert + 4 x attend)",
        format!("{resident_step:.1} us"),
        String::new(),
        "baseline".into(),
    );
    t.row(
        "decode step, elastic low load (resolve + 4 x attend)",
        format!("{low_step:.1} us"),
        format!(
            "{:+.2}% vs resident",
            (low_step / resident_step - 1.0) * 100.0
        ),
        format!(
            "target within 2%: {}",
            if low_step <= resident_step * 1.02 {
                "met"
            } else {
                "MISSED"
            }
        ),
    );
    drop(out);
    drop(picks);
    drop(full);

    // ---------- 2. miss fetch, 3. high-load step, 4. prefetch (fixed hot cache) ----------
    let hot = setup(&gpu, 8192, 16384, false, LAYERS)?;
    let dev = hot.pool.device();
    let out = Out::new(&gpu, 8192)?;
    let mut churn = Churn::new(hot.history - 64, 7);
    // Plain gather of 32,768 random rows (the ceiling's shape): 64 segments x 512 rows.
    {
        let mut copies = Vec::with_capacity(32768);
        let mut rng = 9u64;
        for r in 0..REQS as u32 {
            for i in 0..512u32 {
                copies.push(KvCopy {
                    slot: r,
                    position: (mix(&mut rng) % (hot.history as u64 - 64)) as u32,
                    // rows of a scratch region: the plan buffer's own hot rows are not touched
                    dst_row: r * 512 + i,
                    pad: 0,
                });
            }
        }
        let pb = DeviceBuffer::from_host(gpu.ctx(), &copies)?;
        let cb = DeviceBuffer::from_host(gpu.ctx(), &vec![512u32; REQS])?;
        gpu.synchronize()?;
        let mut tt = Vec::new();
        for i in 0..warm + reps {
            ev.start(&s)?;
            // SAFETY: 64 segments of 512 entries; destination rows inside the arena (layer 3's
            // plane, rows 0..32768: hot rows not yet filled and tail rows no pick reads). The
            // kernel's unchecked copy (the arena's replay copies only rows a hot cache maps).
            unsafe {
                dev.kernels().replay_async(
                    &s,
                    dev.dims(),
                    &dev.tables(0)?,
                    pb.device_ptr(),
                    cb.device_ptr(),
                    64,
                    512,
                    3,
                    1,
                )?
            };
            let us = ev.stop_us(&s)?;
            if i >= warm {
                tt.push(us);
            }
        }
        let us = median(&mut tt);
        let gbs = 32768.0 * ROW as f64 / (us * 1e3);
        t.row(
            "plain gather, 32,768 random rows (replay kernel)",
            format!("{us:.1} us"),
            format!("{gbs:.1} GB/s"),
            format!("{:.0}% of 46.4 GB/s", gbs / GATHER_CEIL * 100.0),
        );
    }
    // Warm the hot cache with the initial set (all misses once).
    let init = upload_steps(&gpu, &[churn.step(0.0)])?;
    gpu.synchronize()?;
    // SAFETY: live buffers shaped for REQS x K.
    unsafe { dev.resolve_async(&s, &out.args(&hot, at(&init, 0), 0), CopyBackend::Gather)? };
    s.synchronize().map_err(cu("cuStreamSynchronize"))?;

    let mut zero_us = 0.0;
    for (rate, label) in [(0.0, "0%"), (0.10, "10%"), (0.30, "30%")] {
        let steps: Vec<Vec<i32>> = (0..warm + reps).map(|_| churn.step(rate)).collect();
        let p = upload_steps(&gpu, &steps)?;
        gpu.synchronize()?;
        let (mut tt, mut bytes) = (Vec::new(), Vec::new());
        for i in 0..warm + reps {
            ev.start(&s)?;
            // SAFETY: as above.
            unsafe { dev.resolve_async(&s, &out.args(&hot, at(&p, i), 0), CopyBackend::Gather)? };
            let us = ev.stop_us(&s)?;
            let m = out.misses()?;
            if i >= warm {
                tt.push(us);
                bytes.push(m as f64 * ROW as f64);
            }
        }
        let us = median(&mut tt);
        let b = median(&mut bytes);
        if rate == 0.0 {
            zero_us = us;
            t.row(
                "resolve, 0% misses (hot-cache hits, bookkeeping only)",
                format!("{us:.1} us"),
                String::new(),
                String::new(),
            );
            continue;
        }
        let gbs = b / (us * 1e3);
        let net = b / ((us - zero_us).max(1e-3) * 1e3);
        t.row(
            &format!("resolve + gather fetch, {label} misses"),
            format!("{us:.1} us"),
            format!(
                "{:.0} rows/step, {gbs:.1} GB/s (net of 0%: {net:.1})",
                b / ROW as f64
            ),
            format!(
                "{:.0}% of 46.4 GB/s gather ceiling (target >= 85%: {})",
                gbs / GATHER_CEIL * 100.0,
                if gbs >= 0.85 * GATHER_CEIL {
                    "met"
                } else {
                    "MISSED"
                }
            ),
        );
        // DMA back-end on fresh steps of the same rate: place on the device (fetch = 0), then one
        // cuMemcpyBatchAsync of the plan.
        let steps: Vec<Vec<i32>> = (0..warm + reps).map(|_| churn.step(rate)).collect();
        let p = upload_steps(&gpu, &steps)?;
        gpu.synchronize()?;
        let (mut tr, mut td, mut td2, mut bd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..warm + reps {
            ev.start(&s)?;
            // SAFETY: as above.
            unsafe { dev.resolve_async(&s, &out.args(&hot, at(&p, i), 0), CopyBackend::Dma)? };
            let ur = ev.stop_us(&s)?;
            let counts = out.count.download()?;
            let plan = out.plan.download()?;
            let mut copies = Vec::new();
            for (r, &c) in counts.iter().enumerate() {
                copies.extend_from_slice(&plan[r * 8192..r * 8192 + c as usize]);
            }
            // Alternate the copy hint (overlap-with-compute preferred / driver default).
            ev.start(&s)?;
            dev.dma_copy_async_with(&s, &copies, 0, 1, i % 2 == 0)?;
            let ud = ev.stop_us(&s)?;
            if i >= warm {
                tr.push(ur);
                if i % 2 == 0 {
                    td.push(ud);
                } else {
                    td2.push(ud);
                }
                bd.push(copies.len() as f64 * ROW as f64);
            }
        }
        let (ur, ud, b) = (median(&mut tr), median(&mut td), median(&mut bd));
        let ud2 = median(&mut td2);
        t.row(
            &format!("DMA back-end, {label} misses, driver-default hint"),
            format!("{ud2:.1} us"),
            format!("{:.1} GB/s copy only", b / (ud2 * 1e3)),
            format!(
                "{:.0}% of 55.6 GB/s H2D",
                b / (ud2 * 1e3) / H2D_CEIL * 100.0
            ),
        );
        let gbs = b / (ud * 1e3);
        t.row(
            &format!("DMA back-end, {label} misses: place + batch copy (overlap hint)"),
            format!("{ur:.1} + {ud:.1} us"),
            format!(
                "{gbs:.1} GB/s copy only ({:.0} descriptors)",
                b / ROW as f64
            ),
            format!(
                "{:.0}% of 55.6 GB/s H2D, {:.0}% of 46.4 GB/s gather",
                gbs / H2D_CEIL * 100.0,
                gbs / GATHER_CEIL * 100.0
            ),
        );
    }

    // High-load decode step: one resolve fills the group's 4 layers + attention over them.
    for (rate, label) in [(0.10, "10%"), (0.30, "30%")] {
        let steps: Vec<Vec<i32>> = (0..warm + reps).map(|_| churn.step(rate)).collect();
        let p = upload_steps(&gpu, &steps)?;
        gpu.synchronize()?;
        let mut tt = Vec::new();
        for i in 0..warm + reps {
            ev.start(&s)?;
            // SAFETY: as above; the plan is the resolve's own output (fresh).
            unsafe {
                dev.resolve_async(&s, &out.args(&hot, at(&p, i), 0), CopyBackend::Gather)?;
            }
            attend_all(dev, &out)?;
            let us = ev.stop_us(&s)?;
            if i >= warm {
                tt.push(us);
            }
        }
        let us = median(&mut tt);
        t.row(
            &format!("decode step, elastic {label} misses (resolve fills 4 layers)"),
            format!("{us:.1} us"),
            format!("+{:.1} us vs resident", us - resident_step),
            format!(
                "{:.1}% of the resident step",
                (us / resident_step - 1.0) * 100.0
            ),
        );
    }

    // Prefetch: pool of 4,096 candidates (current set + 2,048 fresh) announced at layer 0;
    // layers 1..3 pick 2,048 of the pool (half from the fresh part).
    let side = gpu.new_stream()?;
    let pool_n = 4096usize;
    let ctx = gpu.ctx();
    let cand_count = DeviceBuffer::from_host(ctx, &vec![pool_n as u32; REQS])?;
    let pf_plan = DeviceBuffer::<KvCopy>::zeroed(ctx, REQS * 8192)?;
    let pf_count = DeviceBuffer::<u32>::zeroed(ctx, REQS)?;
    let later: Vec<Out> = (0..LAYERS - 1)
        .map(|_| Out::new(&gpu, 8192))
        .collect::<Res<_>>()?;
    for prefetch in [false, true] {
        let (mut tt, mut demand, mut pf_rows) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..warm + reps {
            let p0 = churn.step(0.3);
            let fresh = churn.fresh_pool(pool_n - K);
            let mut cand = Vec::with_capacity(REQS * pool_n);
            let mut lp: Vec<Vec<i32>> = (0..3).map(|_| Vec::with_capacity(REQS * K)).collect();
            for r in 0..REQS {
                let c0 = &p0[r * K..(r + 1) * K];
                let f = &fresh[r * (pool_n - K)..(r + 1) * (pool_n - K)];
                cand.extend_from_slice(c0);
                cand.extend_from_slice(f);
                for (l, v) in lp.iter_mut().enumerate() {
                    let o = (l * 331 + i * 17) % K;
                    v.extend((0..K / 2).map(|j| c0[(o + j) % K]));
                    v.extend((0..K / 2).map(|j| f[(o + j) % (pool_n - K)]));
                }
            }
            let p0d = DeviceBuffer::from_host(ctx, &p0)?;
            let cd = DeviceBuffer::from_host(ctx, &cand)?;
            let lpd: Vec<DeviceBuffer<i32>> = lp
                .iter()
                .map(|v| DeviceBuffer::from_host(ctx, v))
                .collect::<Result<_, _>>()?;
            gpu.synchronize()?;
            ev.start(&s)?;
            // SAFETY: live buffers of the documented shapes; the side stream's prefetch is
            // ordered after layer 0's resolve and before layers 1..3 by events.
            unsafe {
                dev.resolve_async(
                    &s,
                    &out.args(&hot, p0d.device_ptr(), 0),
                    CopyBackend::Gather,
                )?;
                if prefetch {
                    let e0 = s.record_event(None).map_err(cu("cuEventRecord"))?;
                    side.wait(&e0).map_err(cu("cuStreamWaitEvent"))?;
                    dev.prefetch_async(
                        &side,
                        hot.slots.device_ptr(),
                        cd.device_ptr(),
                        cand_count.device_ptr(),
                        REQS as u32,
                        pool_n as u32,
                        0,
                        pf_plan.device_ptr(),
                        pf_count.device_ptr(),
                    )?;
                }
                standins.attend_async(
                    &s,
                    dev.plane_ptr(0)?,
                    dev.dims().row_bytes,
                    out.idx.device_ptr(),
                    out.valid.device_ptr(),
                    REQS as u32,
                    K as u32,
                    qd.device_ptr(),
                    att.device_ptr(),
                )?;
                if prefetch {
                    let e1 = side.record_event(None).map_err(cu("cuEventRecord"))?;
                    s.wait(&e1).map_err(cu("cuStreamWaitEvent"))?;
                }
                for l in 1..LAYERS {
                    let o = &later[l as usize - 1];
                    dev.resolve_async(
                        &s,
                        &o.args(&hot, lpd[l as usize - 1].device_ptr(), l),
                        CopyBackend::Gather,
                    )?;
                    standins.attend_async(
                        &s,
                        dev.plane_ptr(l)?,
                        dev.dims().row_bytes,
                        o.idx.device_ptr(),
                        o.valid.device_ptr(),
                        REQS as u32,
                        K as u32,
                        qd.device_ptr(),
                        att.device_ptr(),
                    )?;
                }
            }
            let us = ev.stop_us(&s)?;
            let mut d = 0;
            for o in &later {
                d += o.misses()?;
            }
            let pr: u64 = pf_count.download()?.iter().map(|&c| c as u64).sum();
            if i >= warm {
                tt.push(us);
                demand.push(d);
                pf_rows.push(pr);
            }
        }
        let us = median(&mut tt);
        let total: u64 = demand.iter().sum();
        t.row(
            &format!(
                "group step, 4 layers, {}",
                if prefetch {
                    "pool prefetched on side stream"
                } else {
                    "no prefetch"
                }
            ),
            format!("{us:.1} us"),
            format!(
                "demand misses in layers 1-3: {total} over {reps} steps{}",
                if prefetch {
                    format!(
                        ", prefetched {:.0} rows/step",
                        pf_rows.iter().sum::<u64>() as f64 / reps as f64
                    )
                } else {
                    String::new()
                }
            ),
            if prefetch {
                format!("target 0: {}", if total == 0 { "met" } else { "MISSED" })
            } else {
                String::new()
            },
        );
    }
    let e = hot.pool.device().errors()?;
    println!();
    t.print();
    println!();
    println!("device error counters: {e:?}");
    Ok(())
}
