//! `tierkit.sim`: the replay scoreboard on a synthetic scenario (`tierkit-sim`'s one expert
//! scoreboard, the table `tierkit experts replay` prints).

use expert_residency::{ControllerConfig, Geometry};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tierkit_sim::experts::scoreboard::{self as board, Policy};
use tierkit_sim::experts::trace::synth::{generate, SynthConfig};
use tierkit_sim::experts::ReplayOptions;

use crate::ints::int_args;
use crate::{expert_err, guard, json_arg, raise, to_py};
use tierkit_bindings::Code;

/// Replays an OLMoE-shaped synthetic scenario (16 layers × 64 experts, top-8; traffic shifting
/// from `from_domain` to `to_domain` at `shift_at`) through `policies` (default: all of
/// `static`, `seed`, `adaptive`, `adaptive-shift-response`, `lru`, `oracle`) and returns
/// `{"scenario": name, "rows": [score rows as dicts], "table": the rendered table}`. The
/// defaults are a short run (3,000 steps); `steps=9000, shift_at=3000` is the CLI's default
/// scenario. Releases the GIL while it replays (its worker threads are joined before it
/// returns).
#[pyfunction]
#[pyo3(
    signature = (*, steps = None, shift_at = None, tokens_per_step = None, seed = None, hot = None, from_domain = "github", to_domain = "book", policies = None, config = None, expert_bytes = None),
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
    from_domain: &str,
    to_domain: &str,
    policies: Option<Vec<String>>,
    config: Option<&Bound<'py, PyAny>>,
    expert_bytes: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    int_args!(
        steps: u64 = 3000,
        shift_at: u64 = 1000,
        tokens_per_step: u32 = 32,
        seed: u64 = 42,
        hot: u32 = 16,
        expert_bytes: u64 = 6 << 20
    );
    let cfg_json = json_arg(config)?;
    let policies: Vec<Policy> = match policies {
        None => Policy::ALL.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                serde_json::from_value(serde_json::Value::String(n.clone())).map_err(|_| {
                    raise(
                        Code::InvalidArgument,
                        format!("unknown policy {n:?} (static, seed, adaptive, adaptive-shift-response, lru, oracle)"),
                    )
                })
            })
            .collect::<PyResult<_>>()?,
    };
    let (from, to) = (from_domain.to_string(), to_domain.to_string());
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scoreboard, m)?)?;
    Ok(())
}
