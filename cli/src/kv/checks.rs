//! Checks of `tierkit kv simulate`'s flags before anything runs: every error names the flag(s)
//! to change and the allowed range (the simulation's own errors name its config fields).

use kv_elastic::MAX_HOT_ROWS;
use tierkit_sim::kv::footprint::{self, Part};
use tierkit_sim::kv::selection::MAX_TOP_K;
use tierkit_sim::kv::serving::{SimConfig, MAX_STEP_TERM_US, MIN_ADMISSION_GBPS};
use tierkit_sim::kv::trace::ArrivalTrace;

use super::SimulateArgs;

/// Most `--budget-gib` (a billion GiB; the simulated arena's row limit is usually lower, see
/// [`geometry`]).
pub const MAX_BUDGET_GIB: f64 = 1e9;

/// Default of `--max-memory-gib`: the host memory, GiB, a simulation may be estimated to
/// allocate ([`footprint::estimate`]) before it is refused. The documented scenarios take well
/// under 1 GiB.
pub const DEFAULT_MAX_MEMORY_GIB: f64 = 4.0;

const GIB: f64 = (1u64 << 30) as f64;

/// Most `kv simulate --steps` (decode steps per placement and load): 10^6, 500× the default.
/// The run's time grows with it (every step serves the whole batch), and the simulation does not
/// stop before its last step.
pub const MAX_SIM_STEPS: u64 = 1_000_000;

/// Most `kv simulate --loads` values: 64 (each load is a full run of the three placements).
pub const MAX_LOADS: usize = 64;

/// Most `kv calibrate --steps`: 10^5, 333× the default (each step draws top-k picks for each of
/// the three hot-cache sizes).
pub const MAX_CALIBRATE_STEPS: u32 = 100_000;

/// Most picks `kv calibrate` draws, `--steps × --top-k`: 2^28 (100,000 steps at the default
/// top-k of 2,048 fit). Each flag has its own bound, but their product did not: `--steps 100000
/// --top-k 1048576` asked for 10^11 picks, days of work.
pub const MAX_CALIBRATE_PICKS: u64 = 1 << 28;

/// `kv calibrate`'s `--steps × --top-k` against [`MAX_CALIBRATE_PICKS`].
pub fn calibrate_picks(steps: u32, top_k: u32) -> Result<(), String> {
    let picks = steps as u64 * top_k as u64;
    if picks <= MAX_CALIBRATE_PICKS {
        Ok(())
    } else {
        Err(format!(
            "--steps {steps} × --top-k {top_k} = {picks} picks: at most {MAX_CALIBRATE_PICKS} \
             (the run's time grows with their product); lower --steps or --top-k"
        ))
    }
}

/// Most picks `kv simulate` may draw, `--steps × --max-batch × --top-k × loads × placements`:
/// 2^38, 64× the documented four-load run of five placements (1,000 steps × 256 × 2,048 × 4 × 5
/// ≈ 2^32.3, ~35 min on one core). Each flag has its own bound; their product did not, so
/// in-range flags could ask for years of work.
pub const MAX_SIM_PICKS: u128 = 1 << 38;

/// `kv simulate`'s work, the product of its flags, against [`MAX_SIM_PICKS`].
pub fn sim_picks(
    steps: u64,
    max_batch: u32,
    top_k: u32,
    loads: usize,
    placements: usize,
) -> Result<(), String> {
    // Saturating: five factors of up to 64 bits overflow even u128.
    let picks = [
        max_batch as u128,
        top_k as u128,
        loads as u128,
        placements as u128,
    ]
    .into_iter()
    .fold(steps as u128, u128::saturating_mul);
    if picks <= MAX_SIM_PICKS {
        Ok(())
    } else {
        Err(format!(
            "--steps {steps} × --max-batch {max_batch} × --top-k {top_k} × {loads} loads × \
             {placements} placements = {picks} picks: at most {MAX_SIM_PICKS} (the run's time \
             grows with their product); lower one of them"
        ))
    }
}

/// `--steps` of `kv simulate`: in `1..=MAX_SIM_STEPS` (0 steps used to print a table of zeros).
pub fn sim_steps(steps: u64) -> Result<(), String> {
    if (1..=MAX_SIM_STEPS).contains(&steps) {
        Ok(())
    } else {
        Err(format!(
            "--steps {steps}: must be in [1, {MAX_SIM_STEPS}] decode steps (the run's time grows \
             with it)"
        ))
    }
}

/// The count of `kv simulate --loads`: at most [`MAX_LOADS`].
pub fn loads(n: usize) -> Result<(), String> {
    if n <= MAX_LOADS {
        Ok(())
    } else {
        Err(format!(
            "--loads: {n} values, at most {MAX_LOADS} (each load is a full run of the three \
             placements)"
        ))
    }
}

/// `v` as given on a command line: plain decimals for ordinary magnitudes, scientific otherwise
/// (`1e308`, not 309 digits).
pub fn show(v: f64) -> String {
    if v == 0.0 || !v.is_finite() || (1e-4..1e6).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// Checks a float flag: finite, at least `lo` (or above it when `lo_open`), at most `hi`; the
/// error names the flag and the range in `unit`.
pub fn in_range(
    flag: &str,
    v: f64,
    lo: f64,
    lo_open: bool,
    hi: f64,
    unit: &str,
) -> Result<(), String> {
    let above_lo = if lo_open { v > lo } else { v >= lo };
    if v.is_finite() && above_lo && v <= hi {
        return Ok(());
    }
    let lo_b = if lo_open { '(' } else { '[' };
    let hi_s = if hi == f64::MAX {
        "∞)".to_string()
    } else {
        format!("{}]", show(hi))
    };
    Err(format!(
        "{flag} {}: must be in {lo_b}{}, {hi_s} {unit}",
        show(v),
        show(lo)
    ))
}

/// The float flags: budget, step-time terms, admission rate, memory bound.
pub fn float_flags(a: &SimulateArgs) -> Result<(), String> {
    in_range(
        "--budget-gib",
        a.budget_gib,
        0.0,
        true,
        MAX_BUDGET_GIB,
        "GiB",
    )?;
    let t = MAX_STEP_TERM_US;
    in_range("--step-base-us", a.step_base_us, 0.0, true, t, "µs")?;
    in_range(
        "--step-per-request-us",
        a.step_per_request_us,
        0.0,
        false,
        t,
        "µs",
    )?;
    in_range(
        "--step-per-miss-us",
        a.step_per_miss_us,
        0.0,
        false,
        t,
        "µs",
    )?;
    if let Some(g) = a.admission_gbps.filter(|&g| g != 0.0) {
        in_range(
            "--admission-gbps",
            g,
            MIN_ADMISSION_GBPS,
            false,
            f64::MAX,
            "GB/s (or 0: free)",
        )?;
    }
    in_range(
        "--max-memory-gib",
        a.max_memory_gib,
        0.0,
        true,
        f64::MAX,
        "GiB",
    )
}

/// `--top-k` in `1..=MAX_TOP_K` (`kv simulate` and `kv calibrate`).
pub fn top_k(k: u32) -> Result<(), String> {
    if (1..=MAX_TOP_K).contains(&k) {
        Ok(())
    } else {
        Err(format!("--top-k {k}: must be in [1, {MAX_TOP_K}] picks"))
    }
}

/// The geometry flags against `cfg` (built from them): the checks of `Geometry::validate` and
/// `SimConfig::validate`, phrased in flags.
pub fn geometry(a: &SimulateArgs, cfg: &SimConfig) -> Result<(), String> {
    for (flag, v) in [
        ("--kv-bytes-per-token", a.kv_bytes_per_token),
        ("--page-rows", a.page_rows as u64),
        ("--tail-rows", a.tail_rows as u64),
        ("--hot-rows", cfg.hot_rows as u64),
        ("--max-batch", a.max_batch as u64),
        (
            "--elastic-max-batch",
            a.elastic_max_batch.unwrap_or(1) as u64,
        ),
        ("--chunk-pages", a.chunk_pages as u64),
    ] {
        if v == 0 {
            return Err(format!("{flag} 0: must be >= 1"));
        }
    }
    if cfg.hot_rows > MAX_HOT_ROWS {
        return Err(format!(
            "--hot-rows {}: must be in [--top-k, {MAX_HOT_ROWS}] rows",
            cfg.hot_rows
        ));
    }
    if a.top_k > cfg.hot_rows {
        return Err(format!(
            "--top-k {} is above --hot-rows {} (a step's misses must fit in the hot cache)",
            a.top_k, cfg.hot_rows
        ));
    }
    if cfg.hot_rows.checked_add(a.tail_rows).is_none() {
        return Err(format!(
            "--tail-rows {}: --hot-rows + --tail-rows must fit in u32 (--tail-rows at most {})",
            a.tail_rows,
            u32::MAX - cfg.hot_rows
        ));
    }
    let k = a.kv_bytes_per_token;
    let g = cfg.geometry();
    let rows = cfg.budget_rows();
    if g.arena_rows() > i32::MAX as u64 {
        // The largest budget whose pages stay below 2^31 rows.
        let max_gib = (i32::MAX as f64 * k as f64 / GIB * 1e3).floor() / 1e3;
        return Err(format!(
            "--budget-gib {} holds {rows} token rows of --kv-bytes-per-token {k} B; the simulated \
             arena takes at most 2^31 - 1 rows: --budget-gib at most {max_gib} at this \
             --kv-bytes-per-token, or raise --kv-bytes-per-token",
            show(a.budget_gib)
        ));
    }
    if g.fixed_pages() > g.arena_pages {
        let fixed = format!(
            "one session's --hot-rows {} + --tail-rows {} ({} pages of --page-rows {})",
            cfg.hot_rows,
            a.tail_rows,
            g.fixed_pages(),
            a.page_rows
        );
        let fixed_rows = g.fixed_pages() as u64 * a.page_rows as u64;
        if fixed_rows > i32::MAX as u64 {
            return Err(format!(
                "{fixed} take {fixed_rows} rows, above the simulated arena's 2^31 - 1: lower \
                 --page-rows, --hot-rows or --tail-rows"
            ));
        }
        let need_gib = fixed_rows as f64 * k as f64 / GIB;
        let remedy = if need_gib <= MAX_BUDGET_GIB {
            format!("--budget-gib at least {:.3}", (need_gib * 1e3).ceil() / 1e3)
        } else {
            format!(
                "--kv-bytes-per-token at most {}",
                cfg.hbm_budget_bytes / fixed_rows
            )
        };
        return Err(format!(
            "--budget-gib {} holds {} pages ({rows} token rows of --kv-bytes-per-token {k} B), \
             fewer than {fixed}: {remedy}, or lower --hot-rows / --tail-rows",
            show(a.budget_gib),
            g.arena_pages,
        ));
    }
    Ok(())
}

/// Refuses a run whose estimated host memory ([`footprint::estimate`]) is above
/// `--max-memory-gib`, naming the flags that bring it down.
pub fn memory(a: &SimulateArgs, cfg: &SimConfig, trace: &ArrivalTrace) -> Result<(), String> {
    let e = footprint::estimate(cfg, trace);
    let total = e.total() as f64 / GIB;
    if total <= a.max_memory_gib {
        return Ok(());
    }
    let head = format!(
        "kv simulate would allocate about {total:.1} GiB of host memory, above --max-memory-gib {}",
        a.max_memory_gib
    );
    let tail = "(or raise --max-memory-gib if the host has the memory)";
    Err(match e.largest_part() {
        Part::Pages => format!(
            "{head}: {} pages of --page-rows {} rows (--budget-gib {} ÷ --kv-bytes-per-token {} B \
             = {} token rows) take ~{:.1} GiB of page tables and arena; raise --page-rows or \
             --kv-bytes-per-token, or lower --budget-gib {tail}",
            e.arena_pages,
            a.page_rows,
            show(a.budget_gib),
            a.kv_bytes_per_token,
            cfg.budget_rows(),
            (e.page_bytes.saturating_add(e.arena_bytes)) as f64 / GIB
        ),
        Part::Sessions => {
            let limit = if e.sessions == a.max_batch as u64 {
                format!("--max-batch {}", a.max_batch)
            } else if e.sessions == trace.requests.len() as u64 {
                "every request of the trace".to_string()
            } else {
                format!("as many as --budget-gib {} holds", show(a.budget_gib))
            };
            format!(
                "{head}: {} sessions at once ({limit}) of --hot-rows {} rows plus their histories \
                 take ~{:.1} GiB; lower --hot-rows or --max-batch, or use fewer / shorter requests \
                 {tail}",
                e.sessions,
                cfg.hot_rows,
                e.session_bytes as f64 / GIB
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_name_the_flag_and_the_bounds() {
        let e = in_range("--step-base-us", 1e308, 0.0, true, 1e9, "µs").unwrap_err();
        assert_eq!(e, "--step-base-us 1e308: must be in (0, 1e9] µs");
        let e = in_range("--admission-gbps", 1e-9, 1e-3, false, f64::MAX, "GB/s").unwrap_err();
        assert_eq!(e, "--admission-gbps 1e-9: must be in [0.001, ∞) GB/s");
        assert!(in_range("--x", f64::NAN, 0.0, false, 1.0, "").is_err());
        assert!(in_range("--x", 0.0, 0.0, false, 1.0, "").is_ok());
        assert!(in_range("--x", 0.0, 0.0, true, 1.0, "").is_err());
        assert_eq!(show(0.5), "0.5");
        assert_eq!(show(-1e308), "-1e308");
    }

    #[test]
    fn the_simulated_picks_are_bounded_as_a_product() {
        // The documented four-load run of five placements fits with room to spare.
        sim_picks(1000, 256, 2048, 4, 5).unwrap();
        // Each flag within its own bound, the product years of work: refused, naming them all.
        let e = sim_picks(MAX_SIM_STEPS, 4096, 1 << 20, MAX_LOADS, 5).unwrap_err();
        for flag in ["--steps", "--max-batch", "--top-k", "loads", "placements"] {
            assert!(e.contains(flag), "{e}");
        }
        assert!(sim_picks(u64::MAX, u32::MAX, u32::MAX, usize::MAX, usize::MAX).is_err());
    }
}
