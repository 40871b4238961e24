//! `tierkit.experts`: geometry, residency maps, pick counters, the controller, executors, seed
//! maps.

use expert_residency::{
    fit_seed_map, seed_coverage, ControlMessage, Controller, CounterDump, Geometry, MemoryExecutor,
    NullExecutor, PickCounters, ResidencyMap,
};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arrays::{counts, int_lists, ints};
use crate::ints::{arg, int_args, opt_arg};
use crate::{core_err, expert_err, guard, json_arg, to_py, Slot};
use tierkit_bindings::Executor as Exec;

/// A MoE model's expert bank and its hot set: `layers` × `experts_per_layer` experts of
/// `expert_bytes` bytes, `hot_per_layer` of them in HBM per layer.
#[pyclass(name = "ExpertGeometry", module = "tierkit.experts", frozen, eq)]
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct PyGeometry(pub(crate) Geometry);

#[pymethods]
impl PyGeometry {
    #[new]
    #[pyo3(
        signature = (layers, experts_per_layer, hot_per_layer, expert_bytes = None),
        text_signature = "(layers, experts_per_layer, hot_per_layer, expert_bytes=1)"
    )]
    fn new(
        layers: &Bound<'_, PyAny>,
        experts_per_layer: &Bound<'_, PyAny>,
        hot_per_layer: &Bound<'_, PyAny>,
        expert_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        int_args!(layers: u32, experts_per_layer: u32, hot_per_layer: u32, expert_bytes: u64 = 1);
        guard(|| {
            Geometry::new(layers, experts_per_layer, hot_per_layer, expert_bytes)
                .map(PyGeometry)
                .map_err(expert_err)
        })
    }
    #[getter]
    fn layers(&self) -> u32 {
        self.0.layers
    }
    #[getter]
    fn experts_per_layer(&self) -> u32 {
        self.0.experts_per_layer
    }
    #[getter]
    fn hot_per_layer(&self) -> u32 {
        self.0.hot_per_layer
    }
    #[getter]
    fn expert_bytes(&self) -> u64 {
        self.0.expert_bytes
    }
    /// HBM slots per layer an executor lays out: the hot experts' and one spare (the rule is the
    /// library's `Geometry::slots_per_layer`).
    #[getter]
    fn slots_per_layer(&self) -> u32 {
        self.0.slots_per_layer()
    }
    /// Bytes of the HBM slots, `layers × slots_per_layer × expert_bytes` (`Geometry::hbm_bytes`;
    /// `OverflowError` past 2^64).
    #[getter]
    fn hbm_bytes(&self) -> PyResult<u64> {
        self.0
            .hbm_bytes()
            .ok_or_else(|| PyOverflowError::new_err("HBM slot bytes overflow a u64"))
    }
    fn __repr__(&self) -> String {
        let g = self.0;
        format!(
            "Geometry(layers={}, experts_per_layer={}, hot_per_layer={}, expert_bytes={})",
            g.layers, g.experts_per_layer, g.hot_per_layer, g.expert_bytes
        )
    }
}

/// Which experts are hot in each layer (slot order). Immutable: a controller works on its own
/// copy (`Controller.map` gives a new one).
#[pyclass(name = "ResidencyMap", module = "tierkit.experts", frozen)]
pub(crate) struct PyResidencyMap(pub(crate) ResidencyMap);

#[pymethods]
impl PyResidencyMap {
    /// Experts `0..hot_per_layer` hot in every layer (the uniform boot map).
    #[staticmethod]
    fn first_k(model: &Bound<'_, PyAny>, geometry: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (model, geometry): (String, PyRef<'_, PyGeometry>) =
            (arg(model, "model")?, arg(geometry, "geometry")?);
        let model = model.as_str();
        guard(|| {
            ResidencyMap::first_k(model, geometry.0)
                .map(PyResidencyMap)
                .map_err(expert_err)
        })
    }
    /// A map from explicit hot sets, one list of expert ids per layer (slot order).
    #[staticmethod]
    fn from_hot_sets(
        model: &Bound<'_, PyAny>,
        geometry: &Bound<'_, PyAny>,
        hot_sets: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let (model, geometry): (String, PyRef<'_, PyGeometry>) =
            (arg(model, "model")?, arg(geometry, "geometry")?);
        let model = model.as_str();
        let hot_sets = int_lists::<u32>(hot_sets, "hot_sets")?;
        guard(|| {
            ResidencyMap::from_hot_sets(model, geometry.0, hot_sets)
                .map(PyResidencyMap)
                .map_err(expert_err)
        })
    }
    /// A map from its versioned JSON, checked against `geometry`.
    #[staticmethod]
    fn from_json(json: &Bound<'_, PyAny>, geometry: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (json, geometry): (String, PyRef<'_, PyGeometry>) =
            (arg(json, "json")?, arg(geometry, "geometry")?);
        let json = json.as_str();
        guard(|| {
            ResidencyMap::from_json(json, &geometry.0)
                .map(PyResidencyMap)
                .map_err(expert_err)
        })
    }
    /// The map's versioned JSON.
    fn to_json(&self) -> PyResult<String> {
        guard(|| Ok(self.0.to_json()))
    }
    #[getter]
    fn geometry(&self) -> PyGeometry {
        PyGeometry(*self.0.geometry())
    }
    #[getter]
    fn model(&self) -> String {
        self.0.model().to_string()
    }
    /// Whether `expert` of `layer` is hot (`ValueError` for an id out of range).
    fn is_hot(&self, layer: &Bound<'_, PyAny>, expert: &Bound<'_, PyAny>) -> PyResult<bool> {
        int_args!(layer: u32, expert: u32);
        guard(|| self.0.is_hot_checked(layer, expert).map_err(expert_err))
    }
    /// The hot experts of `layer`, slot order.
    fn hot_experts(&self, layer: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        int_args!(layer: u32);
        guard(|| {
            Ok(self
                .0
                .layer(layer)
                .map_err(expert_err)?
                .hot_experts()
                .to_vec())
        })
    }
    /// Every layer's hot experts.
    fn hot_sets(&self) -> Vec<Vec<u32>> {
        self.0.hot_sets()
    }
    /// The layer's generation (swaps applied since the map was made).
    fn generation(&self, layer: &Bound<'_, PyAny>) -> PyResult<u64> {
        int_args!(layer: u32);
        guard(|| Ok(self.0.layer(layer).map_err(expert_err)?.generation()))
    }
    fn __repr__(&self) -> String {
        format!(
            "ResidencyMap(model={:?}, {})",
            self.0.model(),
            PyGeometry(*self.0.geometry()).__repr__()
        )
    }
}

/// The router's pick counters: `uint32 [layers, experts]`, one relaxed atomic add per pick.
#[pyclass(name = "PickCounters", module = "tierkit.experts", frozen)]
pub(crate) struct PyPickCounters(Slot<PickCounters>);

#[pymethods]
impl PyPickCounters {
    #[new]
    fn new(geometry: &Bound<'_, PyAny>) -> PyResult<Self> {
        let geometry: PyRef<'_, PyGeometry> = arg(geometry, "geometry")?;
        guard(|| {
            let c = PickCounters::new(&geometry.0).map_err(expert_err)?;
            Ok(PyPickCounters(Slot::new("PickCounters", c)))
        })
    }
    /// Counts one layer's routing: `ids` is the router's top-k expert ids, `[tokens, k]`, int32
    /// or int64 (uint32/uint64 too), any strides (a view into a wider array is fine), a numpy
    /// array or a CPU tensor. All ids are checked first: on error nothing is counted.
    fn record_layer(&self, layer: &Bound<'_, PyAny>, ids: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(layer: u32);
        let (v, shape) = guard(|| ints(ids, "ids", 2, "[tokens, k]"))?;
        self.0.with(|c| {
            let ids = expert_residency::RouterIds::new(&v, shape[0], shape[1], shape[1])
                .map_err(expert_err)?;
            c.record_layer_strided(layer, ids).map_err(expert_err)
        })
    }
    /// Adds a table of counts, `[layers, experts]` non-negative ints (e.g. the delta of device
    /// counters since their last drain: `tierkit.torch.DeviceCounters.drain_into`). All values are
    /// checked first (shape, range below 2^32): on error nothing is added. Cells wrap like the
    /// counters themselves.
    fn add_counts(&self, counts: &Bound<'_, PyAny>) -> PyResult<()> {
        let (v, shape) = guard(|| ints(counts, "counts", 2, "[layers, experts]"))?;
        let add: Vec<u32> = crate::arrays::narrow(&v, "counts")?;
        self.0.with(|c| {
            if shape != [c.layers() as usize, c.experts_per_layer() as usize] {
                return Err(PyValueError::new_err(format!(
                    "counts has shape {shape:?}, the counters are [{}, {}]",
                    c.layers(),
                    c.experts_per_layer()
                )));
            }
            for (cell, &a) in c.cells().iter().zip(&add) {
                if a != 0 {
                    cell.fetch_add(a, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Ok(())
        })
    }
    /// Counts one pick.
    fn record(&self, layer: &Bound<'_, PyAny>, expert: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(layer: u32, expert: u32);
        self.0.with(|c| c.record(layer, expert).map_err(expert_err))
    }
    /// A copy of the counters, `uint32 [layers, experts]`.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (snap, layers, experts) = self.0.with(|c| {
            Ok((
                c.try_snapshot().map_err(expert_err)?,
                c.layers() as usize,
                c.experts_per_layer() as usize,
            ))
        })?;
        PyArray1::from_vec(py, snap)
            .reshape([layers, experts])
            .map(|a| a.into_any())
    }
    /// Releases the counters; later calls raise `ClosedError`.
    fn close(&self) -> PyResult<()> {
        self.0.close()
    }
    #[getter]
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.close()
    }
}

/// The in-memory executor: `bytes_per_expert` pseudo-random bytes per expert (from `seed`) in a
/// host copy, the map's hot experts copied into HBM stand-in slots plus a spare per layer, every
/// move checksummed. Stands in for the GPU bank (same swap protocol). At most 1 GiB.
#[pyclass(name = "MemoryExecutor", module = "tierkit.experts", frozen)]
pub(crate) struct PyMemoryExecutor(Slot<Exec>);

#[pymethods]
impl PyMemoryExecutor {
    #[new]
    #[pyo3(
        signature = (map, bytes_per_expert, seed = None),
        text_signature = "(map, bytes_per_expert, seed=0)"
    )]
    fn new(
        map: &Bound<'_, PyAny>,
        bytes_per_expert: &Bound<'_, PyAny>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let map: PyRef<'_, PyResidencyMap> = arg(map, "map")?;
        int_args!(bytes_per_expert: usize, seed: u64 = 0);
        guard(|| {
            let m = MemoryExecutor::new(&map.0, bytes_per_expert, seed).map_err(expert_err)?;
            Ok(PyMemoryExecutor(Slot::new(
                "MemoryExecutor",
                Exec::Memory(m),
            )))
        })
    }
    /// The bytes an engine reads for `expert` of `layer` now (HBM slot if hot, else host copy).
    fn read<'py>(
        &self,
        py: Python<'py>,
        layer: &Bound<'py, PyAny>,
        expert: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        int_args!(layer: u32, expert: u32);
        self.0.with(|e| match e {
            // Copied straight into a new bytes object (Python allocates it: MemoryError).
            Exec::Memory(m) => {
                let src = m.read(layer, expert).map_err(expert_err)?;
                PyBytes::new_with(py, src.len(), |b| {
                    b.copy_from_slice(src);
                    Ok(())
                })
            }
            Exec::Null(_) => unreachable!("a MemoryExecutor holds the memory executor"),
        })
    }
    /// Checks every hot slot against its host bytes under `map` (e.g. `Controller.map`).
    fn verify(&self, map: &PyResidencyMap) -> PyResult<()> {
        self.0.with(|e| match e {
            Exec::Memory(m) => m.verify(&map.0).map_err(expert_err),
            Exec::Null(_) => Ok(()),
        })
    }
    /// Moves verified so far.
    #[getter]
    fn verified_moves(&self) -> PyResult<u64> {
        self.0.with(|e| match e {
            Exec::Memory(m) => Ok(m.verified_moves()),
            Exec::Null(_) => Ok(0),
        })
    }
    /// A digest of every expert's bytes as an engine would read them now (unchanged by swaps).
    fn read_digest(&self) -> PyResult<u64> {
        self.0.with(|e| match e {
            Exec::Memory(m) => Ok(m.read_digest()),
            Exec::Null(_) => Ok(0),
        })
    }
    fn close(&self) -> PyResult<()> {
        self.0.close()
    }
    #[getter]
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.close()
    }
}

/// The null executor: moves nothing, confirms every swap at the next step (policy-only runs).
#[pyclass(name = "NullExecutor", module = "tierkit.experts", frozen)]
pub(crate) struct PyNullExecutor(Slot<Exec>);

#[pymethods]
impl PyNullExecutor {
    #[new]
    fn new() -> Self {
        PyNullExecutor(Slot::new("NullExecutor", Exec::Null(NullExecutor::new())))
    }
    fn close(&self) -> PyResult<()> {
        self.0.close()
    }
    #[getter]
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.close()
    }
}

/// The residency controller: call `step(counters, executor)` once per engine step, after the
/// step's picks were recorded. `config` is a dict or JSON string of `ControllerConfig` fields
/// (missing fields take their defaults; unknown fields are a `ValueError`): the shared knobs and
/// `policy`, `{"kind": "ratio", "ratio": 1.5}` (or the flat shape of older configs,
/// `{"policy": "ratio", "ratio": 1.5}`).
#[pyclass(name = "Controller", module = "tierkit.experts", frozen)]
pub(crate) struct PyController(Slot<Controller>);

impl PyController {
    /// Runs `f` on the controller and the counters, both locked (`Controller.step` with any
    /// executor; the GPU bank's `_controller_step` calls it).
    pub(crate) fn step_on<R>(
        &self,
        counters: &PyPickCounters,
        f: impl FnOnce(&mut Controller, &PickCounters) -> PyResult<R>,
    ) -> PyResult<R> {
        self.0.with(|ctl| counters.0.with(|c| f(ctl, c)))
    }
}

#[pymethods]
impl PyController {
    #[new]
    #[pyo3(signature = (map, config = None))]
    fn new(map: &Bound<'_, PyAny>, config: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let map: PyRef<'_, PyResidencyMap> = arg(map, "map")?;
        let json = json_arg(config, "config")?;
        guard(|| {
            // Read here, checked once by Controller::new.
            let cfg =
                tierkit_bindings::read_controller_config(json.as_deref()).map_err(expert_err)?;
            let c = Controller::new(map.0.clone(), cfg).map_err(expert_err)?;
            Ok(PyController(Slot::new("Controller", c)))
        })
    }
    /// One step boundary: commits the executor's ready swaps, drains the counters when due,
    /// begins queued swaps. Returns the step report as a dict (`drain` is the drain record or
    /// None).
    fn step<'py>(
        slf: &Bound<'py, Self>,
        counters: &Bound<'py, PyAny>,
        executor: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let counters = counters
            .cast::<PyPickCounters>()
            .map_err(|e| PyTypeError::new_err(format!("counters: {}", PyErr::from(e).value(py))))?;
        // An executor of another module (the GPU bank of `gpu.rs`, directly or as the
        // `tierkit.torch.ExpertBank` wrapping it) steps the controller itself through
        // `_controller_step(controller, counters)`, which calls `PyController::step_on`: this
        // module names no executor type it does not define.
        let native = match executor.getattr("_native") {
            Ok(n) => n,
            Err(_) => executor.clone(),
        };
        if let Ok(own_step) = native.getattr("_controller_step") {
            return own_step.call1((slf, counters));
        }
        let (this, counters) = (slf.get(), counters.get());
        let exec: &Slot<Exec> = if let Ok(m) = executor.cast::<PyMemoryExecutor>() {
            &m.get().0
        } else if let Ok(n) = executor.cast::<PyNullExecutor>() {
            &n.get().0
        } else {
            return Err(PyTypeError::new_err(
                "executor must be a MemoryExecutor, a NullExecutor or a GPU ExpertBank",
            ));
        };
        let report = this.step_on(counters, |ctl, c| {
            exec.with(|e| ctl.step(c, e.as_dyn()).map_err(expert_err))
        })?;
        to_py(py, &report)
    }
    /// A copy of the current map.
    #[getter]
    fn map(&self) -> PyResult<PyResidencyMap> {
        self.0.with(|c| Ok(PyResidencyMap(c.map().clone())))
    }
    /// Running swap counts (planned, applied, rejected, failed, cancelled).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.0.with(|c| Ok(c.stats()))?;
        to_py(py, &s)
    }
    /// The configuration in force, as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.0.with(|c| Ok(c.config().clone()))?;
        to_py(py, &s)
    }
    /// Steps completed.
    #[getter]
    fn steps(&self) -> PyResult<u64> {
        self.0.with(|c| Ok(c.steps()))
    }
    /// The EMA of picks per `(layer, expert)`, `float64 [layers, experts]`.
    fn ema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (v, l, e) = self.0.with(|c| {
            let g = *c.map().geometry();
            Ok((
                tier_core::alloc::try_copied(c.ema_values(), "EMA copy").map_err(core_err)?,
                g.layers as usize,
                g.experts_per_layer as usize,
            ))
        })?;
        PyArray1::from_vec(py, v)
            .reshape([l, e])
            .map(|a| a.into_any())
    }
    /// Stops swapping (counting and draining go on).
    fn freeze(&self) -> PyResult<()> {
        self.0.with(|c| {
            c.freeze();
            Ok(())
        })
    }
    fn unfreeze(&self) -> PyResult<()> {
        self.0.with(|c| {
            c.unfreeze();
            Ok(())
        })
    }
    #[getter]
    fn frozen(&self) -> PyResult<bool> {
        self.0.with(|c| Ok(c.is_frozen()))
    }
    /// Applies a control message (dict or JSON), e.g. `{"freeze": False, "baseline": True}`; the
    /// baseline reset reads `counters`.
    #[pyo3(signature = (message, counters = None))]
    fn apply_control(
        &self,
        message: &Bound<'_, PyAny>,
        counters: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let counters: Option<PyRef<'_, PyPickCounters>> = opt_arg(counters, "counters", None)?;
        let json = json_arg(Some(message), "message")?.unwrap_or_default();
        let snapshot = match counters {
            Some(c) => Some(c.0.with(|c| c.try_snapshot().map_err(expert_err))?),
            None => None,
        };
        self.0.with(|c| {
            let msg = ControlMessage::from_json(&json).map_err(expert_err)?;
            c.apply_control(&msg, snapshot.as_deref())
                .map_err(expert_err)
        })
    }
    fn close(&self) -> PyResult<()> {
        self.0.close()
    }
    #[getter]
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.close()
    }
}

/// Fits a boot map: the `hot_per_layer` busiest experts of each layer of `counts`
/// (`[layers, experts]`, any int or float dtype, e.g. `PickCounters.snapshot()`).
#[pyfunction(name = "fit_seed_map")]
fn py_fit_seed_map(
    model: &Bound<'_, PyAny>,
    geometry: &Bound<'_, PyAny>,
    counts_arg: &Bound<'_, PyAny>,
) -> PyResult<PyResidencyMap> {
    let (model, geometry): (String, PyRef<'_, PyGeometry>) =
        (arg(model, "model")?, arg(geometry, "geometry")?);
    let model = model.as_str();
    let (v, shape) = counts(counts_arg, "counts")?;
    guard(|| {
        let dump =
            CounterDump::new("python", shape[0] as u32, shape[1] as u32, v).map_err(expert_err)?;
        fit_seed_map(model, &geometry.0, &dump)
            .map(PyResidencyMap)
            .map_err(expert_err)
    })
}

/// The share of `counts`' picks `map` serves from HBM: `{"per_layer": [...], "overall": x,
/// "cold_share": 1 - x}` (held-out check of a seed map).
#[pyfunction(name = "seed_coverage")]
fn py_seed_coverage<'py>(
    py: Python<'py>,
    map: &Bound<'py, PyAny>,
    counts_arg: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let map: PyRef<'_, PyResidencyMap> = arg(map, "map")?;
    let (v, shape) = counts(counts_arg, "counts")?;
    let cov = guard(|| {
        let dump =
            CounterDump::new("python", shape[0] as u32, shape[1] as u32, v).map_err(expert_err)?;
        seed_coverage(&map.0, &dump).map_err(expert_err)
    })?;
    let d = to_py(py, &cov)?;
    d.cast::<PyDict>()?
        .set_item("cold_share", cov.cold_share())?;
    Ok(d)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGeometry>()?;
    m.add_class::<PyResidencyMap>()?;
    m.add_class::<PyPickCounters>()?;
    m.add_class::<PyController>()?;
    m.add_class::<PyMemoryExecutor>()?;
    m.add_class::<PyNullExecutor>()?;
    m.add_function(wrap_pyfunction!(py_fit_seed_map, m)?)?;
    m.add_function(wrap_pyfunction!(py_seed_coverage, m)?)?;
    Ok(())
}
