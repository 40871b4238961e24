//! The expert tier's C API: geometry, residency maps, pick counters, the controller, executors,
//! seed maps.

use std::ffi::c_char;
use std::sync::Mutex;

use expert_residency::RouterIds;
use expert_residency::{
    fit_seed_map, ControlMessage, Controller, CounterDump, Geometry, MemoryExecutor, NullExecutor,
    PickCounters, ResidencyMap,
};
use tierkit_bindings::{strided_len, Code, Executor as Exec};

use crate::ffi::{
    c_str, c_string, call, fail, free_handle, live, lock, new_handle, out, out_opt, view, view_mut,
    writable, writable_opt, Kind, Object, TierkitCode, TierkitError, R,
};

/// A MoE model's expert bank and the size of its hot (HBM) set, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitExpertGeometry {
    /// MoE layers.
    pub layers: u32,
    /// Experts per layer.
    pub experts_per_layer: u32,
    /// Experts kept in HBM per layer (1..=experts_per_layer).
    pub hot_per_layer: u32,
    /// Bytes of one expert's weights.
    pub expert_bytes: u64,
}

impl TierkitExpertGeometry {
    fn checked(&self) -> R<Geometry> {
        Ok(Geometry::new(
            self.layers,
            self.experts_per_layer,
            self.hot_per_layer,
            self.expert_bytes,
        )?)
    }
}

impl From<Geometry> for TierkitExpertGeometry {
    fn from(g: Geometry) -> Self {
        TierkitExpertGeometry {
            layers: g.layers,
            experts_per_layer: g.experts_per_layer,
            hot_per_layer: g.hot_per_layer,
            expert_bytes: g.expert_bytes,
        }
    }
}

/// What one `tierkit_controller_step` did. The drain fields are meaningful when `drained`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TierkitStepReport {
    /// Step count after this call.
    pub step: u64,
    /// Swaps committed and applied to the map at this boundary.
    pub applied: u32,
    /// Swaps rejected (stale generation) at this boundary.
    pub rejected: u32,
    /// Swaps that failed in the executor at this boundary.
    pub failed: u32,
    /// Swaps begun at this boundary.
    pub begun: u32,
    /// Whether this step drained the counters.
    pub drained: bool,
    /// Drain index (from 1).
    pub drain: u64,
    /// Cold share of the drained interval's picks (0 = all from HBM).
    pub cold_share: f64,
    /// Cold share over the telemetry window.
    pub cold_share_window: f64,
    /// Swaps planned by this drain.
    pub planned: u32,
    /// Swaps applied so far (running total).
    pub applied_total: u64,
    /// Whether this drain detected a traffic shift (shift response on).
    pub shift_detected: bool,
    /// Whether this drain found the counter table gone backwards and re-baselined.
    pub counter_reset: bool,
}

/// A residency map (which experts are hot per layer). Immutable; free with
/// `tierkit_residency_map_free`.
#[derive(Debug)]
pub struct TierkitResidencyMap(ResidencyMap);

/// The router's pick counters (one relaxed atomic add per pick; may be recorded from several
/// threads at once). Free with `tierkit_pick_counters_free`.
#[derive(Debug)]
pub struct TierkitPickCounters(PickCounters);

/// The residency controller. Free with `tierkit_controller_free`.
#[derive(Debug)]
pub struct TierkitController(Mutex<Controller>);

/// A swap executor: the in-memory one (checksummed byte moves, stands in for the GPU bank) or
/// the null one (moves nothing). Free with `tierkit_executor_free`.
#[derive(Debug)]
pub struct TierkitExecutor(Mutex<Exec>);

fn memory(e: &Exec) -> R<&MemoryExecutor> {
    e.memory().ok_or_else(|| {
        fail(
            Code::InvalidArgument,
            "a null executor holds no bytes (use tierkit_executor_new_memory)",
        )
    })
}

impl Object for TierkitResidencyMap {
    const KIND: Kind = Kind::Map;
    const NAME: &'static str = "tierkit_residency_map";
}
impl Object for TierkitPickCounters {
    const KIND: Kind = Kind::Counters;
    const NAME: &'static str = "tierkit_pick_counters";
}
impl Object for TierkitController {
    const KIND: Kind = Kind::Controller;
    const NAME: &'static str = "tierkit_controller";
}
impl Object for TierkitExecutor {
    const KIND: Kind = Kind::Executor;
    const NAME: &'static str = "tierkit_executor";
}

/// # Safety
/// `g` is NULL or points to a readable `tierkit_expert_geometry`.
unsafe fn geometry_arg(g: *const TierkitExpertGeometry) -> R<Geometry> {
    // SAFETY: forwarded contract.
    let g = unsafe { view(g, 1, "geometry") }?;
    g[0].checked()
}

/// Checks a geometry: `TIERKIT_OK`, or why it is invalid.
///
/// # Safety
/// `geometry` is NULL or points to a readable `tierkit_expert_geometry`; `err` is NULL or valid
/// for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_expert_geometry_validate(
    geometry: *const TierkitExpertGeometry,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe { call(err, || geometry_arg(geometry).map(drop)) }
}

/// A map with experts `0..hot_per_layer` hot in every layer (the uniform boot map).
///
/// # Safety
/// `model` is a NUL-terminated string; `geometry` points to a readable geometry; `out` is valid
/// for one pointer write; `err` is NULL or valid for one pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_first_k(
    model: *const c_char,
    geometry: *const TierkitExpertGeometry,
    out_map: *mut *mut TierkitResidencyMap,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_map, "out_map")?;
            let map = ResidencyMap::first_k(c_str(model, "model")?, geometry_arg(geometry)?)?;
            out(out_map, new_handle(TierkitResidencyMap(map)), "out_map")
        })
    }
}

/// A map from its JSON (`tierkit_residency_map_to_json`, `tierkit experts fit-seed`), checked
/// against `geometry`.
///
/// # Safety
/// As `tierkit_residency_map_first_k`, with `json` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_from_json(
    json: *const c_char,
    geometry: *const TierkitExpertGeometry,
    out_map: *mut *mut TierkitResidencyMap,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_map, "out_map")?;
            let map = ResidencyMap::from_json(c_str(json, "json")?, &geometry_arg(geometry)?)?;
            out(out_map, new_handle(TierkitResidencyMap(map)), "out_map")
        })
    }
}

/// A boot map fitted from per-`(layer, expert)` pick counts (`double [layers * experts]`,
/// row-major): the `hot_per_layer` busiest experts of each layer.
///
/// # Safety
/// `model` is a NUL-terminated string; `geometry` a readable geometry; `counts` points to `len`
/// doubles (or is anything when `len` is 0); `out_map` valid for a pointer write; `err` NULL or
/// valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_fit_seed_map(
    model: *const c_char,
    geometry: *const TierkitExpertGeometry,
    counts: *const f64,
    len: usize,
    out_map: *mut *mut TierkitResidencyMap,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_map, "out_map")?;
            let g = geometry_arg(geometry)?;
            let counts = tier_core::alloc::try_copied(view(counts, len, "counts")?, "counts")?;
            let dump = CounterDump::new("c-api", g.layers, g.experts_per_layer, counts)?;
            let map = fit_seed_map(c_str(model, "model")?, &g, &dump)?;
            out(out_map, new_handle(TierkitResidencyMap(map)), "out_map")
        })
    }
}

/// The map as JSON, a new string for `tierkit_string_free`.
///
/// # Safety
/// `map` is NULL or a map handle (freed ones are detected); `out_json` valid for a pointer
/// write; `err` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_to_json(
    map: *const TierkitResidencyMap,
    out_json: *mut *mut c_char,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_json, "out_json")?;
            let json = live().get(map, "map")?.0.to_json();
            let s = c_string(json);
            out(out_json, s, "out_json").inspect_err(|_| tierkit_string_free_inner(s))
        })
    }
}

fn tierkit_string_free_inner(s: *mut c_char) {
    // SAFETY: `s` was just made by `c_string` and handed to nobody.
    unsafe { crate::ffi::tierkit_string_free(s) }
}

/// Whether `expert` of `layer` is hot in the map.
///
/// # Safety
/// `map` is NULL or a map handle; `out_hot` valid for a write; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_is_hot(
    map: *const TierkitResidencyMap,
    layer: u32,
    expert: u32,
    out_hot: *mut bool,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let live = live();
            let hot = live.get(map, "map")?.0.is_hot_checked(layer, expert)?;
            out(out_hot, hot, "out_hot")
        })
    }
}

/// Writes the hot experts of `layer` in slot order into `experts` (`capacity` entries) and their
/// count into `*out_len`. A `capacity` below the count is `TIERKIT_ERR_INVALID_ARGUMENT`, with
/// the count still written.
///
/// # Safety
/// `map` is NULL or a map handle; `experts` points to `capacity` writable `uint32_t`;
/// `out_len` NULL or valid for a write; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_hot_experts(
    map: *const TierkitResidencyMap,
    layer: u32,
    experts: *mut u32,
    capacity: usize,
    out_len: *mut usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let live = live();
            let hot = live.get(map, "map")?.0.layer(layer)?.hot_experts();
            out_opt(out_len, hot.len(), "out_len")?;
            if capacity < hot.len() {
                return Err(fail(
                    Code::InvalidArgument,
                    format!("capacity {capacity} is below the {} hot experts", hot.len()),
                ));
            }
            view_mut(experts, capacity, "experts")?[..hot.len()].copy_from_slice(hot);
            Ok(())
        })
    }
}

/// The map's geometry.
///
/// # Safety
/// `map` is NULL or a map handle; `out_geometry` valid for a write; `err` NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_geometry(
    map: *const TierkitResidencyMap,
    out_geometry: *mut TierkitExpertGeometry,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let g = *live().get(map, "map")?.0.geometry();
            out(out_geometry, g.into(), "out_geometry")
        })
    }
}

/// Frees a map. NULL, a freed map or another handle type is ignored.
///
/// # Safety
/// `map` is NULL or a pointer tierkit returned.
#[no_mangle]
pub unsafe extern "C" fn tierkit_residency_map_free(map: *mut TierkitResidencyMap) {
    free_handle(map);
}

/// New pick counters (all zero) for `geometry`.
///
/// # Safety
/// `geometry` a readable geometry; `out_counters` valid for a pointer write; `err` NULL or valid
/// for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_pick_counters_new(
    geometry: *const TierkitExpertGeometry,
    out_counters: *mut *mut TierkitPickCounters,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_counters, "out_counters")?;
            let c = PickCounters::new(&geometry_arg(geometry)?)?;
            out(
                out_counters,
                new_handle(TierkitPickCounters(c)),
                "out_counters",
            )
        })
    }
}

/// # Safety
/// `ids` points to `strided_len(tokens, k, row_stride)` readable elements when `tokens * k > 0`.
unsafe fn record<T: Copy + Into<i64>>(
    counters: *const TierkitPickCounters,
    layer: u32,
    ids: *const T,
    tokens: usize,
    k: usize,
    row_stride: usize,
) -> R<()> {
    let live = live();
    let c = &live.get(counters, "counters")?.0;
    if tokens > 0 && k > 0 && row_stride < k {
        return Err(fail(
            Code::Layout,
            format!("row_stride {row_stride} is below k {k}"),
        ));
    }
    let len = if k == 0 {
        Some(0)
    } else {
        strided_len(tokens, k, row_stride)
    }
    .ok_or_else(|| {
        fail(
            Code::InvalidArgument,
            format!("{tokens} rows of stride {row_stride} overflow"),
        )
    })?;
    // SAFETY: forwarded contract.
    let ids = unsafe { view(ids, len, "ids") }?;
    // Counted in place: no gathered copy per call.
    Ok(c.record_layer_strided(layer, RouterIds::new(ids, tokens, k, row_stride)?)?)
}

/// Counts one layer's routing: `ids` is the router's `int32 [tokens, k]` top-k expert ids, row
/// `t` starting at element `t * row_stride` (`row_stride >= k`, in elements: llama.cpp's
/// `ffn_moe_topk` view has `row_stride = nb[1] / sizeof(int32_t)`). Every id is checked first:
/// on error nothing is counted. Thread-safe (relaxed atomic adds).
///
/// # Safety
/// `counters` is NULL or a counters handle; `ids` points to `(tokens - 1) * row_stride + k`
/// readable `int32_t` (anything when `tokens` or `k` is 0); `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_pick_counters_record_layer(
    counters: *const TierkitPickCounters,
    layer: u32,
    ids: *const i32,
    tokens: usize,
    k: usize,
    row_stride: usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe { call(err, || record(counters, layer, ids, tokens, k, row_stride)) }
}

/// `tierkit_pick_counters_record_layer` for `int64_t` ids (torch's `topk` indices).
///
/// # Safety
/// As `tierkit_pick_counters_record_layer`, with `int64_t` elements.
#[no_mangle]
pub unsafe extern "C" fn tierkit_pick_counters_record_layer_i64(
    counters: *const TierkitPickCounters,
    layer: u32,
    ids: *const i64,
    tokens: usize,
    k: usize,
    row_stride: usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe { call(err, || record(counters, layer, ids, tokens, k, row_stride)) }
}

/// Copies the counters (`uint32 [layers * experts]`, row-major, wrapping) into `snapshot`
/// (`len` must be `layers * experts`).
///
/// # Safety
/// `counters` is NULL or a counters handle; `snapshot` points to `len` writable `uint32_t`;
/// `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_pick_counters_snapshot(
    counters: *const TierkitPickCounters,
    snapshot: *mut u32,
    len: usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let live = live();
            let c = &live.get(counters, "counters")?.0;
            Ok(c.snapshot_into(view_mut(snapshot, len, "snapshot")?)?)
        })
    }
}

/// Frees counters. NULL, freed counters or another handle type are ignored.
///
/// # Safety
/// `counters` is NULL or a pointer tierkit returned.
#[no_mangle]
pub unsafe extern "C" fn tierkit_pick_counters_free(counters: *mut TierkitPickCounters) {
    free_handle(counters);
}

/// A controller booting from a copy of `map`. `config_json` is NULL (defaults) or a
/// `ControllerConfig` JSON object (missing fields take their defaults, unknown fields are
/// refused), e.g. `{"drain_every": 8, "half_life_steps": 32}`; the policy and its knobs are
/// `"policy": {"kind": "ratio", "ratio": 1.5}` (the flat shape of older configs, `"policy":
/// "ratio", "ratio": 1.5`, is read too). An empty or blank string is
/// `TIERKIT_ERR_INVALID_ARGUMENT` (pass NULL for the defaults).
///
/// # Safety
/// `map` is NULL or a map handle; `config_json` NULL or a NUL-terminated string; `out_controller`
/// valid for a pointer write; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_controller_new(
    map: *const TierkitResidencyMap,
    config_json: *const c_char,
    out_controller: *mut *mut TierkitController,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_controller, "out_controller")?;
            let json = match config_json.is_null() {
                true => None,
                false => Some(c_str(config_json, "config_json")?),
            };
            // Read here, checked once by Controller::new.
            let cfg = tierkit_bindings::read_controller_config(json)?;
            let boot = live().get(map, "map")?.0.clone();
            let ctl = Controller::new(boot, cfg)?;
            out(
                out_controller,
                new_handle(TierkitController(Mutex::new(ctl))),
                "out_controller",
            )
        })
    }
}

/// One step boundary: commits the executor's ready swaps, drains the counters when due, begins
/// queued swaps. Call it once per engine step, after the step's picks were recorded. `report`
/// may be NULL.
///
/// # Safety
/// `controller`, `counters`, `executor` are NULL or handles of their types; `report` NULL or
/// valid for a write; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_controller_step(
    controller: *const TierkitController,
    counters: *const TierkitPickCounters,
    executor: *const TierkitExecutor,
    report: *mut TierkitStepReport,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable_opt(report, "report")?;
            let live = live();
            let ctl = live.get(controller, "controller")?;
            let counters = &live.get(counters, "counters")?.0;
            let exec = live.get(executor, "executor")?;
            let mut ctl = lock(&ctl.0, "controller")?;
            let mut exec = lock(&exec.0, "executor")?;
            let r = ctl.step(counters, exec.as_dyn())?;
            let d = r.drain.as_ref();
            let rep = TierkitStepReport {
                step: r.step,
                applied: r.applied,
                rejected: r.rejected,
                failed: r.failed,
                begun: r.begun,
                drained: d.is_some(),
                drain: d.map_or(0, |d| d.drain),
                cold_share: d.map_or(0.0, |d| d.cold_share),
                cold_share_window: d.map_or(0.0, |d| d.cold_share_window),
                planned: d.map_or(0, |d| d.planned),
                applied_total: ctl.stats().applied,
                shift_detected: d.is_some_and(|d| d.shift_detected),
                counter_reset: d.is_some_and(|d| d.counter_reset),
            };
            out_opt(report, rep, "report")
        })
    }
}

/// A copy of the controller's current map (a new handle).
///
/// # Safety
/// `controller` is NULL or a controller handle; `out_map` valid for a pointer write; `err` NULL
/// or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_controller_map(
    controller: *const TierkitController,
    out_map: *mut *mut TierkitResidencyMap,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_map, "out_map")?;
            let map = {
                let live = live();
                let ctl = lock(&live.get(controller, "controller")?.0, "controller")?;
                ctl.map().clone()
            }; // the registry lock is released before a new handle registers
            out(out_map, new_handle(TierkitResidencyMap(map)), "out_map")
        })
    }
}

/// Whether `expert` of `layer` is hot in the controller's current map.
///
/// # Safety
/// `controller` is NULL or a controller handle; `out_hot` valid for a write; `err` NULL or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_controller_is_hot(
    controller: *const TierkitController,
    layer: u32,
    expert: u32,
    out_hot: *mut bool,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let live = live();
            let ctl = lock(&live.get(controller, "controller")?.0, "controller")?;
            let hot = ctl.map().is_hot_checked(layer, expert)?;
            out(out_hot, hot, "out_hot")
        })
    }
}

/// Applies a control message, e.g. `{"freeze": false, "baseline": true}` (the baseline reset
/// reads `counters`, which may be NULL when the message asks for none).
///
/// # Safety
/// `controller` is NULL or a controller handle; `json` a NUL-terminated string; `counters` NULL
/// or a counters handle; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_controller_apply_control(
    controller: *const TierkitController,
    json: *const c_char,
    counters: *const TierkitPickCounters,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let msg = ControlMessage::from_json(c_str(json, "json")?)?;
            let live = live();
            let snapshot = match counters.is_null() {
                true => None,
                false => Some(live.get(counters, "counters")?.0.try_snapshot()?),
            };
            let mut ctl = lock(&live.get(controller, "controller")?.0, "controller")?;
            Ok(ctl.apply_control(&msg, snapshot.as_deref())?)
        })
    }
}

/// Frees a controller. NULL, a freed controller or another handle type is ignored.
///
/// # Safety
/// `controller` is NULL or a pointer tierkit returned.
#[no_mangle]
pub unsafe extern "C" fn tierkit_controller_free(controller: *mut TierkitController) {
    free_handle(controller);
}

/// The in-memory executor: `bytes_per_expert` pseudo-random bytes per expert (from `seed`) in a
/// host copy, `map`'s hot experts copied into HBM stand-in slots plus one spare per layer; every
/// move is verified by checksum. Stands in for the GPU bank (same swap protocol). At most 1 GiB.
///
/// # Safety
/// `map` is NULL or a map handle; `out_executor` valid for a pointer write; `err` NULL or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_executor_new_memory(
    map: *const TierkitResidencyMap,
    bytes_per_expert: usize,
    seed: u64,
    out_executor: *mut *mut TierkitExecutor,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_executor, "out_executor")?;
            let exec = {
                let live = live();
                MemoryExecutor::new(&live.get(map, "map")?.0, bytes_per_expert, seed)?
            };
            let h = new_handle(TierkitExecutor(Mutex::new(Exec::Memory(exec))));
            out(out_executor, h, "out_executor")
        })
    }
}

/// The null executor: moves nothing, confirms every swap at the next step (policy-only runs).
///
/// # Safety
/// `out_executor` valid for a pointer write; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_executor_new_null(
    out_executor: *mut *mut TierkitExecutor,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            writable(out_executor, "out_executor")?;
            let h = new_handle(TierkitExecutor(Mutex::new(Exec::Null(NullExecutor::new()))));
            out(out_executor, h, "out_executor")
        })
    }
}

/// The bytes an engine reads for `expert` of `layer` now (its HBM slot if hot, else its host
/// copy), in-memory executor only. `*data` stays valid until the next
/// `tierkit_controller_step` with this executor or its free.
///
/// # Safety
/// `executor` is NULL or an executor handle; `data` and `len` valid for writes; `err` NULL or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_executor_read(
    executor: *const TierkitExecutor,
    layer: u32,
    expert: u32,
    data: *mut *const u8,
    len: *mut usize,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let live = live();
            let exec = lock(&live.get(executor, "executor")?.0, "executor")?;
            let bytes = memory(&exec)?.read(layer, expert)?;
            out(len, bytes.len(), "len")?;
            out(data, bytes.as_ptr(), "data")
        })
    }
}

/// Checks that every hot slot of the in-memory executor holds exactly its expert's host bytes
/// under `map` (e.g. `tierkit_controller_map`'s copy).
///
/// # Safety
/// `executor` and `map` are NULL or handles of their types; `verified_moves` NULL or valid for a
/// write; `err` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tierkit_executor_verify(
    executor: *const TierkitExecutor,
    map: *const TierkitResidencyMap,
    verified_moves: *mut u64,
    err: *mut *mut TierkitError,
) -> TierkitCode {
    // SAFETY: forwarded contracts.
    unsafe {
        call(err, || {
            let live = live();
            let exec = lock(&live.get(executor, "executor")?.0, "executor")?;
            let m = memory(&exec)?;
            m.verify(&live.get(map, "map")?.0)?;
            out_opt(verified_moves, m.verified_moves(), "verified_moves")
        })
    }
}

/// Frees an executor. NULL, a freed executor or another handle type is ignored.
///
/// # Safety
/// `executor` is NULL or a pointer tierkit returned.
#[no_mangle]
pub unsafe extern "C" fn tierkit_executor_free(executor: *mut TierkitExecutor) {
    free_handle(executor);
}
