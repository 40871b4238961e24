//! `tierkit.kv.ElasticPool`: the elastic pool's session lifecycle and its exact CPU resolver.

use std::sync::Mutex;

use kv_elastic::{
    ElasticPool, OutputLayout, PoolConfig, ResolveInput, ResolveOptions, ResolveOutput, Resolver,
    StoreConfig,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::{admission, maintenance, type_name, PyKvGeometry, PyResolvePlan, PyResolved};
use crate::arrays::{ints, narrow, out_i32, with_bytes, zeros_i32};
use crate::ints::{arg, int_args, opt_arg};
use crate::{guard, kv_err, kv_transfer, to_py, Slot};

/// The elastic sparse-attention KV pool with its exact CPU resolver. `elastic=False` keeps the
/// fixed hot cache only (HiSparse); the default lends free HBM as history pages.
#[pyclass(name = "ElasticPool", module = "tierkit.kv", frozen)]
pub(crate) struct PyElasticPool(Slot<ElasticPool>);

#[pymethods]
impl PyElasticPool {
    /// With `max_sessions` and `max_history`, the host store is one registrable region of
    /// `max_sessions × max_history × token_bytes` bytes (page-aligned; locked in RAM with
    /// `lock=True`) that transfer agents (NIXL, Mooncake) register once: see `regions`,
    /// `reserve` / `commit` / `abort` and `export` / `export_done`.
    #[new]
    #[pyo3(
        signature = (geometry, elastic = None, *, max_sessions = None, max_history = None, lock = None),
        text_signature = "(geometry, elastic=True, *, max_sessions=None, max_history=None, lock=False)"
    )]
    fn new(
        geometry: &Bound<'_, PyAny>,
        elastic: Option<&Bound<'_, PyAny>>,
        max_sessions: Option<&Bound<'_, PyAny>>,
        max_history: Option<&Bound<'_, PyAny>>,
        lock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let geometry: PyRef<'_, PyKvGeometry> = arg(geometry, "geometry")?;
        let (elastic, lock) = (
            opt_arg(elastic, "elastic", true)?,
            opt_arg(lock, "lock", false)?,
        );
        int_args!(max_sessions: Option<u32>, max_history: Option<u32>);
        let config = PoolConfig { elastic };
        guard(|| {
            let p = match (max_sessions, max_history) {
                (None, None) => ElasticPool::new(geometry.0, config),
                (Some(max_sessions), Some(max_history)) => ElasticPool::with_store(
                    geometry.0,
                    config,
                    StoreConfig {
                        max_sessions,
                        max_history,
                        lock,
                    },
                ),
                _ => {
                    return Err(PyValueError::new_err(
                        "max_sessions and max_history go together (a region-backed host store)",
                    ))
                }
            }
            .map_err(kv_err)?;
            Ok(PyElasticPool(Slot::new("ElasticPool", p)))
        })
    }
    /// The host store's regions, as tuples `(addr, len, item_len, kind, numa_node)` (`kind`
    /// `"DRAM"`, `numa_node` -1 when unknown): register each with a transfer agent once
    /// (NIXL: `agent.register_memory([(addr, len, 0, "")], "DRAM")`; Mooncake:
    /// `engine.register_memory(addr, len)`). Empty for the default store (a buffer per session).
    fn regions(&self) -> PyResult<Vec<kv_transfer::RegionTuple>> {
        self.0.with(|p| Ok(kv_transfer::regions(p)))
    }
    /// The row → offset rule of the region: `{"max_slots", "max_history", "layers",
    /// "row_bytes"}`; byte offset of (slot, position, layer) = `((slot × max_history + position)
    /// × layers + layer) × row_bytes`. None for the default store.
    fn store_layout<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let l = self.0.with(|p| Ok(p.region().map(|(_, l)| l)))?;
        l.map(|l| to_py(py, &l)).transpose()
    }
    /// The host store as a writable numpy `uint8 [max_slots, max_history, layers, row_bytes]`
    /// view of its memory (DLPack through numpy's `__dlpack__`), or None for the default store.
    /// The view keeps the memory mapped after `close`; agents' registrations end at `close`.
    fn store_view<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.0.with(|p| kv_transfer::store_view(py, p))
    }
    /// Host memory of the store by tierkit's accounting: `{"store_bytes", "allocated_bytes",
    /// "pinned_bytes"}` (the store costs `max(allocated, pinned)`).
    fn host_memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let m = self.0.with(|p| Ok(p.host_memory()))?;
        to_py(py, &m)
    }
    /// Runs `callback(addr, len)` at `close` (or when the pool is collected), before the
    /// store's memory is unlocked and freed: a transfer agent's deregistration. Newest first.
    /// `TypeError` when `callback` is not callable (it would only fail at `close`).
    fn on_teardown(&self, callback: &Bound<'_, PyAny>) -> PyResult<()> {
        if !callback.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "callback must be callable as callback(addr, len), not {}",
                type_name(callback)
            )));
        }
        let callback = callback.clone().unbind();
        self.0
            .with(|p| p.on_teardown(kv_transfer::hook(callback)).map_err(kv_err))
    }
    /// Reserves rows `start .. end` of a new or importing session for a transfer agent to
    /// write in place. Returns the byte run `{"reserved": True, "session", "start", "end",
    /// "slot", "offset", "addr", "len"}` (one contiguous run: the store is token-major), or
    /// `{"reserved": False, "pending": n}` while the session's fixed pages wait for readers.
    /// The session is invisible until `commit`; an import not committed within
    /// `import_timeout` calls of `between_steps` expires. `ValueError` for overlapping or
    /// out-of-region rows, a live id, a full store.
    fn reserve<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
        start: &Bound<'py, PyAny>,
        end: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        int_args!(session: u64, start: u32, end: u32);
        let r = self
            .0
            .with(|p| p.reserve(session, start..end).map_err(kv_err))?;
        kv_transfer::reserve(py, r)
    }
    /// Publishes an import once its writes completed: the reserved rows (covering `0 .. n`)
    /// become the session's history, admitted without a host copy. Returns the admission dict.
    /// `ValueError` without a reservation or with a gap; `RuntimeError` after a timeout.
    fn commit<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        int_args!(session: u64);
        let a = self.0.with(|p| p.commit(session).map_err(kv_err))?;
        admission(py, a)
    }
    /// Drops an import whose writer is gone: the pool is as before the reservation.
    fn abort(&self, session: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(session: u64);
        self.0.with(|p| p.abort(session).map_err(kv_err))
    }
    /// Imports in flight: a list of `{"session", "ranges", "idle_steps", "expired"}`.
    fn imports<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let i = self.0.with(|p| Ok(p.imports()))?;
        to_py(py, &i)
    }
    /// `between_steps` calls after its last `reserve` before an import expires (default 1000).
    #[getter]
    fn import_timeout(&self) -> PyResult<u32> {
        self.0.with(|p| Ok(p.import_timeout()))
    }
    /// Sets the import timeout (at least 1 call).
    fn set_import_timeout(&self, steps: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(steps: u32);
        self.0.with(|p| p.set_import_timeout(steps).map_err(kv_err))
    }
    /// Pins a live session's committed rows for a transfer agent to read; returns their byte
    /// run (as `reserve`). They stay in place, even after `finish`, until `export_done`.
    fn export<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        int_args!(session: u64);
        let s = self.0.with(|p| p.export(session).map_err(kv_err))?;
        kv_transfer::span(py, &s)
    }
    /// The transfer reading an export of `session` completed.
    fn export_done(&self, session: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(session: u64);
        self.0.with(|p| p.export_done(session).map_err(kv_err))
    }
    /// Running totals of imports and exports (imports, committed, aborted, expired, exports,
    /// exports_done).
    fn transfer_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.0.with(|p| Ok(p.transfer_counters()))?;
        to_py(py, &c)
    }
    #[getter]
    fn geometry(&self) -> PyResult<PyKvGeometry> {
        self.0.with(|p| Ok(PyKvGeometry(*p.geometry())))
    }
    /// Admits a session with its committed history (`bytes`, `bytearray` or a uint8 array /
    /// tensor; whole tokens of `geometry.token_bytes`). Returns `{"admitted": True,
    /// "borrowed_pages": n}` or, while pages wait behind open reads, `{"admitted": False,
    /// "pending": n}` (complete the reads, call `between_steps`, admit again).
    fn admit<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
        history: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        int_args!(session: u64);
        let a = with_bytes(history, "history", |h| {
            self.0.with(|p| p.admit(session, h).map_err(kv_err))
        })?;
        admission(py, a)
    }
    /// Appends committed tokens (whole tokens) to a session; returns its new length in tokens.
    fn append(&self, session: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(session: u64);
        with_bytes(tokens, "tokens", |t| {
            self.0.with(|p| p.append(session, t).map_err(kv_err))
        })
    }
    /// Writes draft tokens into the session's scratch (speculative decoding).
    fn write_scratch(&self, session: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(session: u64);
        with_bytes(tokens, "tokens", |t| {
            self.0.with(|p| p.write_scratch(session, t).map_err(kv_err))
        })
    }
    /// Accepts the first `n` draft tokens as committed; returns the new length.
    fn accept(&self, session: &Bound<'_, PyAny>, n: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(session: u64, n: u32);
        self.0.with(|p| p.accept(session, n).map_err(kv_err))
    }
    /// Finishes a session; its pages go back in bounded chunks at `between_steps`.
    fn finish(&self, session: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(session: u64);
        self.0.with(|p| p.finish(session).map_err(kv_err))
    }
    /// Takes back up to `n` lent (elastic) pages from the sessions holding them, for new
    /// admissions; returns how many. Their positions are served from the host store again.
    fn reclaim(&self, n: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(n: u32);
        self.0.with(|p| p.reclaim(n).map_err(kv_err))
    }
    /// Between steps: hands back up to `chunk` pages of finished sessions, frees pages whose
    /// readers completed, lends free pages to sessions missing history. Returns the counts.
    #[pyo3(signature = (chunk = None), text_signature = "($self, chunk=8)")]
    fn between_steps<'py>(
        &self,
        py: Python<'py>,
        chunk: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        int_args!(chunk: u32 = 8);
        let m = self.0.with(|p| p.between_steps(chunk).map_err(kv_err))?;
        maintenance(py, m)
    }
    /// Resolves one step's top-k positions to arena rows.
    ///
    /// `sessions` (`[reqs]`), `query_start_loc` (`[reqs + 1]`) and `seq_lens` (`[reqs]`) are
    /// int arrays or lists, as vLLM describes a batch; `topk` is the indexer's `[rows, k]`
    /// positions (int32/int64, any strides, `-1` padding), or block ids with `block_positions=B`
    /// (`B > 1`, at most `kv.MAX_BLOCK_POSITIONS`: id `b` stands for positions `b × B .. b × B + B`,
    /// block-major, as MiniMax-M3's block top-k; a block's positions at or beyond the row's bound come out `-1`). Outputs
    /// (`[rows, k × B]`, `B = 1` for positions) go to `indices` / `valid_count` when given
    /// (int32, C-contiguous, writeable, at least `rows × k × B` / `rows` elements; the rest is
    /// written `-1` / 0), else to new arrays. `packed=True` packs each
    /// row's valid entries to the front (FlashMLA's `topk_length`); `query_seq_lens` (`[rows]`)
    /// bounds each query row (speculative rows). The picks resolve against the hot cache of
    /// `layer`'s layer group (`Geometry.layer_groups`) and the misses are fetched into every
    /// layer of that group.
    #[pyo3(
        signature = (sessions, query_start_loc, seq_lens, topk, layer = None, *, k = None, indices = None, valid_count = None, packed = None, query_seq_lens = None, block_positions = None),
        text_signature = "($self, sessions, query_start_loc, seq_lens, topk, layer=0, *, k=None, indices=None, valid_count=None, packed=False, query_seq_lens=None, block_positions=0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn resolve<'py>(
        &self,
        py: Python<'py>,
        sessions: &Bound<'py, PyAny>,
        query_start_loc: &Bound<'py, PyAny>,
        seq_lens: &Bound<'py, PyAny>,
        topk: &Bound<'py, PyAny>,
        layer: Option<&Bound<'py, PyAny>>,
        k: Option<&Bound<'py, PyAny>>,
        indices: Option<&Bound<'py, PyAny>>,
        valid_count: Option<&Bound<'py, PyAny>>,
        packed: Option<&Bound<'py, PyAny>>,
        query_seq_lens: Option<&Bound<'py, PyAny>>,
        block_positions: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyResolved> {
        let packed: bool = opt_arg(packed, "packed", false)?;
        int_args!(layer: u32 = 0, k: Option<usize>, block_positions: u32 = 0);
        let sessions: Vec<u64> = narrow(&ints(sessions, "sessions", 1, "[reqs]")?.0, "sessions")?;
        let qsl: Vec<i32> = narrow(
            &ints(query_start_loc, "query_start_loc", 1, "[reqs + 1]")?.0,
            "query_start_loc",
        )?;
        let seq: Vec<i32> = narrow(&ints(seq_lens, "seq_lens", 1, "[reqs]")?.0, "seq_lens")?;
        let (flat, shape) = ints(topk, "topk", 2, "[rows, k]")?;
        let (rows, kk) = (shape[0], shape[1]);
        if let Some(k) = k.filter(|&k| k != kk) {
            return Err(PyValueError::new_err(format!(
                "k = {k} but topk has {kk} columns"
            )));
        }
        let topk: Vec<i32> = narrow(&flat, "topk")?;
        // Refused before the outputs are sized from it (`rows × k × B` new int32s).
        if block_positions > kv_elastic::MAX_BLOCK_POSITIONS {
            return Err(kv_err(kv_elastic::KvError::BlockPositionsOutOfRange {
                block_positions,
                max: kv_elastic::MAX_BLOCK_POSITIONS,
            }));
        }
        // Output columns: k positions, or k block ids of `block_positions` positions each.
        let width = kk
            .checked_mul(block_positions.max(1) as usize)
            .filter(|&w| w <= i32::MAX as usize)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "k × block_positions = {kk} × {block_positions} exceeds 2^31 - 1 columns"
                ))
            })?;
        let qsls: Option<Vec<i32>> = match query_seq_lens {
            Some(q) if !q.is_none() => Some(narrow(
                &ints(q, "query_seq_lens", 1, "[rows]")?.0,
                "query_seq_lens",
            )?),
            _ => None,
        };
        // Outputs: the caller's (checked) or new ones.
        let idx_arr: Bound<'py, PyAny> = match indices {
            Some(a) if !a.is_none() => a.clone(),
            _ => zeros_i32(py, &[rows, width])?,
        };
        let val_arr: Bound<'py, PyAny> = match valid_count {
            Some(a) if !a.is_none() => a.clone(),
            _ => zeros_i32(py, &[rows])?,
        };
        if idx_arr.is(&val_arr) {
            return Err(PyValueError::new_err(
                "indices and valid_count must be different arrays",
            ));
        }
        let (plan, stats, ticket) = {
            let mut idx = out_i32(&idx_arr, "indices", rows * width)?;
            let mut val = out_i32(&val_arr, "valid_count", rows)?;
            let idx_s = idx
                .as_slice_mut()
                .map_err(|e| PyValueError::new_err(format!("indices: {e}")))?;
            let val_s = val
                .as_slice_mut()
                .map_err(|e| PyValueError::new_err(format!("valid_count: {e}")))?;
            self.0.with(|p| {
                let input = ResolveInput {
                    sessions: &sessions,
                    query_start_loc: &qsl,
                    seq_lens: &seq,
                    topk: &topk,
                    k: kk,
                    layer,
                };
                let opts = ResolveOptions {
                    layout: if packed {
                        OutputLayout::Packed
                    } else {
                        OutputLayout::InPlace
                    },
                    query_seq_lens: qsls.as_deref(),
                    block_positions,
                };
                let done = p
                    .resolve_with(
                        &input,
                        &opts,
                        &mut ResolveOutput {
                            indices: idx_s,
                            valid_count: val_s,
                        },
                    )
                    .map_err(kv_err)?;
                Ok((done.plan, done.stats, done.ticket))
            })?
        };
        Ok(PyResolved {
            indices: idx_arr.unbind(),
            valid_count: val_arr.unbind(),
            stats: to_py(py, &stats)?.unbind(),
            plan: Py::new(py, PyResolvePlan(plan))?,
            ticket: Mutex::new(Some(ticket)),
        })
    }
    /// Copies a plan's (or a `Resolved`'s plan's) rows again into one layer of its layer group
    /// (never needed: the resolve filled every layer of the group); `ValueError` for a layer of
    /// another group, whose planes hold other positions at those rows.
    fn replay(&self, plan: &Bound<'_, PyAny>, layer: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(layer: u32);
        let plan: Py<PyResolvePlan> = if let Ok(r) = plan.cast::<PyResolved>() {
            r.get().plan.clone_ref(plan.py())
        } else if let Ok(p) = plan.cast::<PyResolvePlan>() {
            p.clone().unbind()
        } else {
            return Err(PyTypeError::new_err(
                "plan must be a ResolvePlan or a Resolved",
            ));
        };
        let plan = plan.get();
        self.0.with(|p| p.replay(&plan.0, layer).map_err(kv_err))
    }
    /// Prefetches candidate positions of a session into the hot cache of `layer`'s layer group
    /// (up to 16,384), fetching them into every layer of the group; returns the plan of copies.
    fn prefetch(
        &self,
        session: &Bound<'_, PyAny>,
        candidates: &Bound<'_, PyAny>,
        layer: &Bound<'_, PyAny>,
    ) -> PyResult<PyResolvePlan> {
        int_args!(session: u64, layer: u32);
        let c: Vec<i32> = narrow(&ints(candidates, "candidates", 1, "[n]")?.0, "candidates")?;
        self.0.with(|p| {
            p.prefetch(session, &c, layer)
                .map(PyResolvePlan)
                .map_err(kv_err)
        })
    }
    /// The bytes of arena row `row` in `layer` (what attention reads at a resolved index).
    /// `ValueError` for a layer or row outside the arena, `-1` (a padding index) included, as
    /// `tierkit_kv_pool_arena_row` in C.
    fn arena_row<'py>(
        &self,
        py: Python<'py>,
        layer: &Bound<'py, PyAny>,
        row: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        int_args!(layer: u32, row: i32);
        self.0.with(|p| {
            let g = *p.geometry();
            let src = p.arena_row(layer, row).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "no arena row {row} in layer {layer}: layer in 0..{}, row in 0..{} \
                     (-1 is a padding index, not a row)",
                    g.layers,
                    g.arena_rows()
                ))
            })?;
            PyBytes::new_with(py, src.len(), |b| {
                b.copy_from_slice(&src);
                Ok(())
            })
        })
    }
    /// Committed tokens of a session.
    fn committed_len(&self, session: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(session: u64);
        self.0.with(|p| p.committed_len(session).map_err(kv_err))
    }
    /// Sessions admitted and not finished.
    #[getter]
    fn active_sessions(&self) -> PyResult<usize> {
        self.0.with(|p| Ok(p.active_sessions()))
    }
    /// Page counts: free, fixed, history, pending, queued, capacity.
    fn pages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.0.with(|p| Ok(p.pages()))?;
        to_py(py, &c)
    }
    /// Running totals (admitted, finished, pages lent / reclaimed / handed back, tokens moved).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.0.with(|p| Ok(*p.counters()))?;
        to_py(py, &c)
    }
    /// Checks pages, loans and tables agree; `RuntimeError` naming the first violation.
    fn check_invariants(&self) -> PyResult<()> {
        self.0.with(|p| {
            p.check_invariants()
                .map_err(|m| crate::raise(tierkit_bindings::Code::Internal, m))
        })
    }
    /// Releases the pool; later calls raise `ClosedError`.
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
