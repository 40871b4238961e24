//! `tierkit.sim`: the replay scoreboard on a synthetic scenario (`tierkit-sim`'s one expert
//! scoreboard, the table `tierkit experts replay` prints), and routing traces' top-k ids as numpy
//! arrays (any trace the replay CLI reads, or the lab's generators) for benchmarks that replay
//! them on a GPU.

use std::path::PathBuf;

use expert_residency::{ControllerConfig, Geometry};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tierkit_sim::experts::scoreboard::{self as board, Policy};
use tierkit_sim::experts::trace::synth::{generate, SynthConfig};
use tierkit_sim::experts::trace::{
    read_traces, ReadOptions, Trace, TraceError, TraceFormat, TraceShape,
};
use tierkit_sim::experts::{LinkModel, ReplayOptions};

use crate::ints::{int_args, opt_arg, opt_float_arg};
use crate::{expert_err, guard, json_arg, raise, to_py};
use tierkit_bindings::Code;

/// Replays an OLMoE-shaped synthetic scenario (16 layers × 64 experts, top-8; traffic shifting
/// from `from_domain` to `to_domain` at `shift_at`) through `policies` (default: all of
/// [`Policy::ALL`], less the offline optimum where it would take more than seconds; names as `tierkit experts replay --policy` spells them: `static`, `seed`,
/// `cost-aware`, `ratio`, `ratio-best`, `recency`, `lru`, `static-by-picks`, `best-static`,
/// `offline-optimum`, and `adaptive`, `adaptive-shift-response`) and returns
/// `{"scenario": name, "rows": [score rows as dicts], "table": the rendered table}`. The
/// defaults are a short run (3,000 steps); `steps=9000, shift_at=3000` is the CLI's default
/// scenario. Releases the GIL while it replays (its worker threads are joined before it
/// returns).
#[pyfunction]
#[pyo3(
    signature = (*, steps = None, shift_at = None, tokens_per_step = None, seed = None, hot = None, from_domain = None, to_domain = None, policies = None, config = None, expert_bytes = None),
    text_signature = "(*, steps=3000, shift_at=1000, tokens_per_step=32, seed=42, hot=16, from_domain='github', to_domain='book', policies=None, config=None, expert_bytes=6291456)"
)]
#[allow(clippy::too_many_arguments)]
fn scoreboard<'py>(
    py: Python<'py>,
    steps: Option<&Bound<'py, PyAny>>,
    shift_at: Option<&Bound<'py, PyAny>>,
    tokens_per_step: Option<&Bound<'py, PyAny>>,
    seed: Option<&Bound<'py, PyAny>>,
    hot: Option<&Bound<'py, PyAny>>,
    from_domain: Option<&Bound<'py, PyAny>>,
    to_domain: Option<&Bound<'py, PyAny>>,
    policies: Option<&Bound<'py, PyAny>>,
    config: Option<&Bound<'py, PyAny>>,
    expert_bytes: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let from_domain: String = opt_arg(from_domain, "from_domain", "github".into())?;
    let to_domain: String = opt_arg(to_domain, "to_domain", "book".into())?;
    int_args!(
        steps: u64 = 3000,
        shift_at: u64 = 1000,
        tokens_per_step: u32 = 32,
        seed: u64 = 42,
        hot: u32 = 16,
        expert_bytes: u64 = 6 << 20
    );
    let cfg_json = json_arg(config, "config")?;
    let policies = policies.filter(|p| !p.is_none());
    // The default list drops the offline optimum where it would take more than seconds, as
    // `tierkit experts replay --optimum auto` does; a list that names it always runs it.
    let auto_optimum = policies.is_none();
    let mut policies: Vec<Policy> = match policies {
        None => Policy::ALL.to_vec(),
        Some(names) => policy_list(names)?,
    };
    let (from, to) = (from_domain, to_domain);
    let (name, rows, table) = py.detach(move || {
        guard(|| {
            let bad = |m: String| raise(Code::InvalidArgument, m);
            let cfg: ControllerConfig =
                tierkit_bindings::controller_config(cfg_json.as_deref()).map_err(expert_err)?;
            let synth =
                SynthConfig::olmoe_shift(&from, &to, steps, shift_at, tokens_per_step, seed)
                    .map_err(|e| bad(e.to_string()))?;
            let trace = generate(&synth).map_err(|e| bad(e.to_string()))?;
            let s = trace.shape;
            let g = Geometry::new(s.layers, s.experts_per_layer, hot, expert_bytes)
                .map_err(expert_err)?;
            let (seed_map, _) = board::default_seed_map(&trace, &g).map_err(expert_err)?;
            if auto_optimum
                && board::optimum_skip_reason(&trace, &g, &LinkModel::default()).is_some()
            {
                policies.retain(|&p| p != Policy::Optimum);
            }
            let specs = board::policy_specs(&policies, &trace, &seed_map);
            let runs =
                board::run_policies(&trace, &g, &cfg, &ReplayOptions::default(), &specs, &|_| {})
                    .map_err(|m| raise(Code::InvalidArgument, m))?;
            let rows = board::summarize(&runs);
            let table = board::render(&rows);
            Ok((trace.name.clone(), rows, table))
        })
    })?;
    let d = PyDict::new(py);
    d.set_item("scenario", name)?;
    d.set_item("rows", to_py(py, &rows)?)?;
    d.set_item("table", table)?;
    Ok(d.into_any())
}

/// `policies` as given: a list (or other iterable, not a string) of distinct policy names, at
/// least one. `TypeError` for a string or a non-string name, `ValueError` for an unknown, repeated
/// or empty list (an empty list used to return an empty table).
fn policy_list(names: &Bound<'_, PyAny>) -> PyResult<Vec<Policy>> {
    let known = "static, seed, cost-aware, ratio, ratio-best, recency, lru, static-by-picks, best-static, offline-optimum, adaptive, adaptive-shift-response";
    let not_list = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "policies must be a list of policy names ({known}), not {}",
            names
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    };
    if names.is_instance_of::<pyo3::types::PyString>() || names.is_instance_of::<PyDict>() {
        return Err(not_list());
    }
    let mut out: Vec<Policy> = Vec::new();
    for (i, n) in names.try_iter().map_err(|_| not_list())?.enumerate() {
        let n = n?;
        let name: String = n.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "policies[{i}] must be a policy name (str), not {}",
                n.get_type()
                    .name()
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let p: Policy =
            serde_json::from_value(serde_json::Value::String(name.clone())).map_err(|_| {
                raise(
                    Code::InvalidArgument,
                    format!("policies[{i}]: unknown policy {name:?} ({known})"),
                )
            })?;
        if out.contains(&p) {
            return Err(raise(
                Code::InvalidArgument,
                format!("policies[{i}]: {name:?} is given twice"),
            ));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(raise(
            Code::InvalidArgument,
            format!("policies is empty: name at least one ({known}), or pass None for all"),
        ));
    }
    Ok(out)
}

/// A trace error as a Python exception: `OSError` for a file that cannot be read, `MemoryError`
/// for a trace too large to hold, `ValueError` for the rest (bad input).
fn trace_err(e: TraceError) -> PyErr {
    match e {
        TraceError::Io { .. } => pyo3::exceptions::PyOSError::new_err(e.to_string()),
        other => raise(Code::InvalidArgument, other.to_string()),
    }
}

/// The dict of a trace: its shape and name, `shifts`, `tokens` (the most routed tokens of a
/// step, over all steps and layers), `tokens_per_step` (`int32 [steps]`, the most tokens of any
/// layer of each step) and `ids` (`int32 [steps, layers, tokens, top_k]`: each layer's picks
/// regrouped `top_k` per token in the trace's order, `-1` where a step or layer has fewer).
fn trace_dict<'py>(py: Python<'py>, t: &Trace) -> PyResult<Bound<'py, PyAny>> {
    let (nl, k) = (t.shape.layers as usize, t.shape.top_k as usize);
    let tokens_of = |n: usize| n.div_ceil(k);
    let per_step: Vec<i32> = t
        .steps
        .iter()
        .map(|s| {
            s.layers
                .iter()
                .map(|l| tokens_of(l.len()))
                .max()
                .unwrap_or(0) as i32
        })
        .collect();
    let tokens = per_step.iter().copied().max().unwrap_or(0) as usize;
    let cells = [t.steps.len(), nl, tokens, k]
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| raise(Code::OutOfMemory, format!("trace {} is too large", t.name)))?;
    let mut ids: Vec<i32> = Vec::new();
    ids.try_reserve_exact(cells).map_err(|e| {
        raise(
            Code::OutOfMemory,
            format!("ids of trace {} ({cells} cells): {e}", t.name),
        )
    })?;
    ids.resize(cells, -1);
    for (s, step) in t.steps.iter().enumerate() {
        for (l, picks) in step.layers.iter().enumerate() {
            let at = (s * nl + l) * tokens * k;
            for (dst, &e) in ids[at..at + picks.len()].iter_mut().zip(picks) {
                *dst = e as i32;
            }
        }
    }
    let d = PyDict::new(py);
    d.set_item("name", &t.name)?;
    d.set_item("layers", t.shape.layers)?;
    d.set_item("experts_per_layer", t.shape.experts_per_layer)?;
    d.set_item("top_k", t.shape.top_k)?;
    d.set_item("steps", t.steps.len())?;
    d.set_item("tokens", tokens)?;
    d.set_item("shifts", t.shifts.clone())?;
    d.set_item("tokens_per_step", PyArray1::from_vec(py, per_step))?;
    let shape = [t.steps.len(), nl, tokens, k];
    d.set_item("ids", PyArray1::from_vec(py, ids).reshape(shape)?)?;
    Ok(d.into_any())
}

/// Reads routing traces as `trace_ids(paths, *, format="auto", layers=None, experts=None,
/// top_k=None, skip_steps=0)`: `paths` is a path or a list of paths (files or directories, as
/// `tierkit experts replay --trace`: several are joined, each join a shift; per-layer routing
/// logs merge into one trace), `format` one of `auto`, `binary`, `json`, `mixtral-jsonl`,
/// `logger-jsonl`, `routes-jsonl`. Returns the trace's dict: `name`, `layers`,
/// `experts_per_layer`, `top_k`, `steps`, `tokens` (most routed tokens in a step), `shifts`,
/// `tokens_per_step` (`int32 [steps]`) and `ids` (`int32 [steps, layers, tokens, top_k]`, each
/// layer's picks `top_k` per token in the trace's order, `-1` padding). Errors: `OSError` for a
/// file that cannot be read, `ValueError` for bad input (the reader's typed error in words),
/// `MemoryError` for a trace too large to hold.
#[pyfunction]
#[pyo3(
    signature = (paths, *, format = None, layers = None, experts = None, top_k = None, skip_steps = None),
    text_signature = "(paths, *, format='auto', layers=None, experts=None, top_k=None, skip_steps=0)"
)]
fn trace_ids<'py>(
    py: Python<'py>,
    paths: &Bound<'py, PyAny>,
    format: Option<&Bound<'py, PyAny>>,
    layers: Option<&Bound<'py, PyAny>>,
    experts: Option<&Bound<'py, PyAny>>,
    top_k: Option<&Bound<'py, PyAny>>,
    skip_steps: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    int_args!(layers: Option<u32>, experts: Option<u32>, top_k: Option<u32>, skip_steps: u64 = 0);
    let format: String = opt_arg(format, "format", "auto".into())?;
    let format = format.as_str();
    let paths: Vec<PathBuf> = match paths.extract::<PathBuf>() {
        Ok(p) => vec![p],
        Err(_) => paths.extract()?,
    };
    let format: TraceFormat = serde_json::from_value(serde_json::Value::String(format.into()))
        .map_err(|_| {
            raise(
                Code::InvalidArgument,
                format!("unknown trace format {format:?} (auto, binary, json, mixtral-jsonl, logger-jsonl, routes-jsonl)"),
            )
        })?;
    let opts = ReadOptions {
        format,
        layers,
        experts_per_layer: experts,
        top_k,
        skip_steps,
        ..ReadOptions::default()
    };
    let t = py.detach(|| guard(|| read_traces(&paths, &opts).map_err(trace_err)))?;
    trace_dict(py, &t)
}

/// Generates a synthetic trace with the lab's generator and returns its dict (as `trace_ids`).
/// `shape=None`: the OLMoE-1B-7B scenario (16 × 64, top-8, popularity fitted from the OLMoE
/// routing counts of `from_domain`, shifting to `to_domain` at `shift_at`, default never).
/// `shape=(layers, experts, top_k)`: one domain of Zipf popularity with exponent `zipf` (default
/// 0.5, the 512-expert scenario's weak skew; 0 is uniform), expert ranks relabelled per layer.
/// Both: `tokens_per_step` independent token streams (token `i` of a step continues token `i` of
/// the step before), previous-step reuse `reuse` (default 0.37, real Mixtral decode's), seeded
/// by `seed` (the same arguments give the same ids). Bad input is a `ValueError`, and so is an
/// argument of the other scenario (`zipf` without `shape`; `from_domain`, `to_domain` or
/// `shift_at` with one).
#[pyfunction]
#[pyo3(
    signature = (*, steps, tokens_per_step, shape = None, zipf = None, reuse = None, seed = None, from_domain = None, to_domain = None, shift_at = None),
    text_signature = "(*, steps, tokens_per_step, shape=None, zipf=0.5, reuse=0.37, seed=42, from_domain='github', to_domain='book', shift_at=None)"
)]
#[allow(clippy::too_many_arguments)]
fn synth_ids<'py>(
    py: Python<'py>,
    steps: &Bound<'py, PyAny>,
    tokens_per_step: &Bound<'py, PyAny>,
    shape: Option<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    zipf: Option<&Bound<'py, PyAny>>,
    reuse: Option<&Bound<'py, PyAny>>,
    seed: Option<&Bound<'py, PyAny>>,
    from_domain: Option<&Bound<'py, PyAny>>,
    to_domain: Option<&Bound<'py, PyAny>>,
    shift_at: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (zipf, reuse) = (opt_float_arg(zipf, "zipf")?, opt_float_arg(reuse, "reuse")?);
    let from_domain: Option<String> = opt_arg(from_domain, "from_domain", None)?;
    let to_domain: Option<String> = opt_arg(to_domain, "to_domain", None)?;
    // Each scenario's own arguments: one given to the other scenario used to be ignored.
    let olmoe_args = [
        ("from_domain", from_domain.is_some()),
        ("to_domain", to_domain.is_some()),
        ("shift_at", shift_at.is_some_and(|s| !s.is_none())),
    ];
    match (&shape, olmoe_args.iter().find(|a| a.1)) {
        (Some(_), Some((name, _))) => {
            return Err(raise(
                Code::InvalidArgument,
                format!("{name} applies to the OLMoE scenario (shape=None), not to shape=(...)"),
            ))
        }
        (None, _) if zipf.is_some() => {
            return Err(raise(
                Code::InvalidArgument,
                "zipf applies to shape=(layers, experts, top_k) scenarios; the OLMoE scenario \
                 (shape=None) takes its popularity from the routing counts"
                    .into(),
            ))
        }
        _ => {}
    }
    let (from_domain, to_domain) = (
        from_domain.as_deref().unwrap_or("github"),
        to_domain.as_deref().unwrap_or("book"),
    );
    int_args!(steps: u64, tokens_per_step: u32, seed: u64 = 42, shift_at: u64 = u64::MAX);
    let shape = match shape {
        None => None,
        Some((layers, experts, top_k)) => {
            let (layers, experts, top_k) = (&layers, &experts, &top_k);
            int_args!(layers: u32, experts: u32, top_k: u32);
            Some(TraceShape {
                layers,
                experts_per_layer: experts,
                top_k,
            })
        }
    };
    let reuse = reuse.unwrap_or(tierkit_sim::experts::trace::synth::MIXTRAL_DECODE_REUSE);
    let (from, to) = (from_domain.to_string(), to_domain.to_string());
    let t = py.detach(move || {
        guard(|| {
            let cfg = match shape {
                Some(shape) => SynthConfig::zipf(
                    shape,
                    zipf.unwrap_or(board::WIDE_ZIPF),
                    steps,
                    tokens_per_step,
                    seed,
                    reuse,
                ),
                None => {
                    SynthConfig::olmoe_shift(&from, &to, steps, shift_at, tokens_per_step, seed)
                        .and_then(|mut c| {
                            c.reuse = reuse;
                            c.validate().map(|()| c)
                        })
                }
            }
            .map_err(trace_err)?;
            cfg.validate_in_memory().map_err(trace_err)?;
            generate(&cfg).map_err(trace_err)
        })
    })?;
    trace_dict(py, &t)
}

/// The lab's link model of one step (`tierkit_sim::experts::LinkModel::stall_us`): the stall in
/// µs that `read_bytes` read in place and `copies` swap copies of `copy_bytes` bytes together add
/// to a step on the link `link` (`h200-pcie`: 47 GB/s in place, 55 GB/s copies sharing the link,
/// 26.2 µs per copy; `gb300-c2c`). Returns `{"stall_us", "read_us", "copy_us", "link": the
/// model's fields}`. An unknown preset is a `ValueError`.
#[pyfunction]
#[pyo3(
    signature = (read_bytes, copies, copy_bytes, link = None),
    text_signature = "(read_bytes, copies, copy_bytes, link='h200-pcie')"
)]
fn link_stall_us<'py>(
    py: Python<'py>,
    read_bytes: &Bound<'py, PyAny>,
    copies: &Bound<'py, PyAny>,
    copy_bytes: &Bound<'py, PyAny>,
    link: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    int_args!(read_bytes: u64, copies: u64, copy_bytes: u64);
    let link: String = opt_arg(link, "link", "h200-pcie".into())?;
    let link = link.as_str();
    let model = guard(|| LinkModel::preset(link).map_err(expert_err))?;
    let d = PyDict::new(py);
    d.set_item("stall_us", model.stall_us(read_bytes, copies, copy_bytes))?;
    d.set_item("read_us", model.cost.read_us(read_bytes))?;
    d.set_item("copy_us", model.cost.copy_link_us(copy_bytes))?;
    d.set_item("link", to_py(py, &model)?)?;
    Ok(d.into_any())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(link_stall_us, m)?)?;
    m.add_function(wrap_pyfunction!(scoreboard, m)?)?;
    m.add_function(wrap_pyfunction!(trace_ids, m)?)?;
    m.add_function(wrap_pyfunction!(synth_ids, m)?)?;
    Ok(())
}
