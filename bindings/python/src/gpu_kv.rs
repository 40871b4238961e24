//! The GPU KV pool of `tierkit._native` (cargo feature `cuda`), used by `tierkit.torch`:
//! [`PyGpuKvPool`], `kv_elastic::GpuElasticPool` (host calls: admit, append, finish, reclaim,
//! between steps) and its device resolve into caller-owned outputs. The device handling it shares
//! with the expert entry points (caller memory, the primary context, the step stream) is
//! `gpu.rs`'s.

use std::sync::atomic::{AtomicU32, Ordering};

use cuda_kernels::{
    CudaError, Gpu, KvResolveArgs, KvResolveOptions, KV_LAYOUT_IN_PLACE, KV_LAYOUT_PACKED, KV_STATS,
};
use kv_elastic::gpu::{CopyBackend, GpuElasticPool, GpuPoolConfig};
use kv_elastic::PoolConfig;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::with_bytes;
use crate::gpu::{borrow_device, cuda_err, gpu_guard, memory_arg, GpuSlot};
use crate::ints::int_args;
use crate::kv::{admission, maintenance, PyKvGeometry};
use crate::kv_err;

/// The GPU KV pool (`kv_elastic::GpuElasticPool`) with the caller's stream as its step stream.
/// Host calls publish asynchronously on that stream; `resolve` / `replay` launch on the caller's
/// stream into caller-owned outputs, and that stream must be the step stream or one a graph
/// captured on it is replayed on (nothing else orders the launch after the host calls' publishes
/// and before the next ones).
#[pyclass(name = "GpuKvPool", module = "tierkit.torch", frozen, weakref)]
pub(crate) struct PyGpuKvPool(GpuSlot<GpuElasticPool>, LastResolve);

/// The session count of the last resolve launched through this pool (0 = none yet): a replay of
/// more sessions would copy plan rows that resolve did not write (stale ones), so it is refused.
#[derive(Default)]
struct LastResolve(AtomicU32);

impl LastResolve {
    fn set(&self, sessions: u32) {
        self.0.store(sessions, Ordering::Release);
    }
    /// `Ok` when a replay of `sessions` reads only rows the last resolve wrote.
    fn check_replay(&self, sessions: u32) -> PyResult<()> {
        let last = self.0.load(Ordering::Acquire);
        if sessions == 0 || sessions > last {
            return Err(PyValueError::new_err(format!(
                "replay: sessions {sessions} outside 1..={last} (the last resolve's sessions; \
                 0 = no resolve yet)"
            )));
        }
        Ok(())
    }
}

impl PyGpuKvPool {
    fn with<R>(&self, f: impl FnOnce(&mut GpuElasticPool) -> PyResult<R>) -> PyResult<R> {
        self.0.with(f)
    }
}

#[pymethods]
impl PyGpuKvPool {
    /// A pool for `geometry` on device `device_index`, step stream `stream` (kept alive by the
    /// caller), `max_sessions` live sessions of at most `max_history` positions each.
    ///
    /// Engine-owned arena: `arena = (tensor, data_ptr, bytes)`, the caller's device range (at
    /// least `layers × arena_rows × row_bytes` bytes; zeroed here), kept alive as long as the
    /// pool. A range the driver refuses, or too short, is a `ValueError`.
    #[new]
    #[pyo3(signature = (geometry, device_index, stream, max_sessions, max_history, elastic = true, settle_readers = false, arena = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        geometry: &PyKvGeometry,
        device_index: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyAny>,
        max_sessions: &Bound<'_, PyAny>,
        max_history: &Bound<'_, PyAny>,
        elastic: bool,
        settle_readers: bool,
        arena: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        int_args!(
            device_index: usize,
            stream: u64,
            max_sessions: u32,
            max_history: u32
        );
        let arena = memory_arg(arena, "arena", false)?;
        // `settle_readers` is kv-elastic's test hook (tests comparing the GPU pool with the CPU
        // one page for page): only in a wheel built with `--features test-hooks`.
        #[cfg(not(feature = "test-hooks"))]
        if settle_readers {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "settle_readers=True is a test hook: build tierkit with --features test-hooks",
            ));
        }
        gpu_guard(|| {
            // SAFETY: the caller's live stream of this device, kept alive as long as the pool.
            let gpu = unsafe { Gpu::with_step_stream(device_index, stream) }.map_err(cuda_err)?;
            let mut keep = Vec::new();
            let arena = borrow_device(&gpu, &mut keep, arena)?;
            #[cfg_attr(not(feature = "test-hooks"), allow(unused_mut))]
            let mut p = GpuElasticPool::with_arena(
                &gpu,
                geometry.0,
                PoolConfig { elastic },
                GpuPoolConfig {
                    max_sessions,
                    max_history,
                    backend: CopyBackend::Gather,
                },
                arena,
            )
            .map_err(|e| match e {
                kv_elastic::KvError::Cuda(c @ CudaError::ForeignMemory { .. }) => cuda_err(c),
                e => kv_err(e),
            })?;
            #[cfg(feature = "test-hooks")]
            p.set_settle_readers(settle_readers);
            Ok(PyGpuKvPool(
                GpuSlot::new("GpuKvPool", p, gpu, device_index).keeping(keep),
                LastResolve::default(),
            ))
        })
    }
    /// `{layers, layer_groups, arena_rows, row_bytes, plane_shape, hot_rows, max_sessions,
    /// max_history, kv_stats, plane_ptrs, host_ptr, host_bytes, hot_table_bytes}`: `layer_groups`
    /// the group sizes in layer order (a resolve at a layer fills its whole group; the hot-cache
    /// tables, `hot_table_bytes` of HBM, are one set per group); the arena is `layers` planes of
    /// `uint8 plane_shape` at fixed addresses: `[arena_rows, row_bytes]` for contiguous rows,
    /// `[arena_pages, page_bytes]` for DeepSeek-V4's paged split row (a page's values, then its
    /// scales, padded); the host store is mapped pinned memory at `host_ptr` (one
    /// address for host and device: unified addressing) of `host_bytes` bytes.
    fn layout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (dims, planes, host, groups, hot_bytes) = self.with(|p| {
            let dev = p.device();
            let dims = *dev.dims();
            let planes = (0..dims.layers)
                .map(|l| dev.plane_ptr(l).map_err(cuda_err))
                .collect::<PyResult<Vec<u64>>>()?;
            let h = dev.host_store();
            let groups = dev.layer_groups().sizes(dims.layers);
            Ok((
                dims,
                planes,
                (h.as_ptr() as u64, h.len()),
                groups,
                dev.hot_table_bytes(),
            ))
        })?;
        let d = PyDict::new(py);
        d.set_item("layers", dims.layers)?;
        d.set_item("layer_groups", groups)?;
        d.set_item("hot_table_bytes", hot_bytes)?;
        d.set_item("arena_rows", dims.arena_rows)?;
        d.set_item("row_bytes", dims.row_bytes)?;
        let plane_shape = if dims.fmt == cuda_kernels::KV_FMT_CONTIGUOUS {
            (dims.arena_rows as u64, dims.row_bytes as u64)
        } else {
            (
                (dims.arena_rows / dims.page_rows) as u64,
                dims.fmt_page_bytes,
            )
        };
        d.set_item("plane_shape", plane_shape)?;
        d.set_item("hot_rows", dims.hot_rows)?;
        d.set_item("max_sessions", dims.max_slots)?;
        d.set_item("max_history", dims.max_history)?;
        d.set_item("kv_stats", KV_STATS)?;
        d.set_item("plane_ptrs", planes)?;
        d.set_item("host_ptr", host.0)?;
        d.set_item("host_bytes", host.1)?;
        Ok(d)
    }
    /// Admits a session with its committed history (whole tokens): as `ElasticPool.admit`.
    fn admit<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
        history: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        int_args!(session: u64);
        let a = with_bytes(history, "history", |h| {
            self.0.host(py, "GpuKvPool.admit", |p| {
                p.admit(session, h).map_err(kv_err)
            })
        })?;
        admission(py, a)
    }
    /// Appends committed tokens (whole tokens); returns the new length.
    fn append(
        &self,
        py: Python<'_>,
        session: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<u32> {
        int_args!(session: u64);
        with_bytes(tokens, "tokens", |t| {
            self.0.host(py, "GpuKvPool.append", |p| {
                p.append(session, t).map_err(kv_err)
            })
        })
    }
    /// Finishes a session.
    fn finish(&self, py: Python<'_>, session: &Bound<'_, PyAny>) -> PyResult<()> {
        int_args!(session: u64);
        self.0.host(py, "GpuKvPool.finish", |p| {
            p.finish(session).map_err(kv_err)
        })
    }
    /// Takes back up to `n` lent pages; returns how many.
    fn reclaim(&self, py: Python<'_>, n: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(n: u32);
        self.0
            .host(py, "GpuKvPool.reclaim", |p| p.reclaim(n).map_err(kv_err))
    }
    /// Between steps (hand-backs, collection, growth); returns the counts.
    #[pyo3(signature = (chunk = None), text_signature = "($self, chunk=8)")]
    fn between_steps<'py>(
        &self,
        py: Python<'py>,
        chunk: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        int_args!(chunk: u32 = 8);
        let m = self.0.host(py, "GpuKvPool.between_steps", |p| {
            p.between_steps(chunk).map_err(kv_err)
        })?;
        maintenance(py, m)
    }
    /// The device session slot of a live session (the `session_slot` input of `resolve`).
    fn slot_of(&self, py: Python<'_>, session: &Bound<'_, PyAny>) -> PyResult<u32> {
        int_args!(session: u64);
        self.0.host(py, "GpuKvPool.slot_of", |p| {
            p.slot_of(session).map_err(kv_err)
        })
    }
    /// The device error words (synchronous): `{bad_session, bad_position, overflow, bad_qsl,
    /// stale_plan}`; `clear=True` zeroes them after reading.
    #[pyo3(signature = (clear = false))]
    fn errors<'py>(&self, py: Python<'py>, clear: bool) -> PyResult<Bound<'py, PyDict>> {
        let e = self.0.host(py, "GpuKvPool.errors", |p| {
            let e = p.device().errors().map_err(cuda_err)?;
            if clear {
                p.device_mut().clear_errors().map_err(cuda_err)?;
            }
            Ok(e)
        })?;
        let d = PyDict::new(py);
        d.set_item("bad_session", e.bad_session)?;
        d.set_item("bad_position", e.bad_position)?;
        d.set_item("overflow", e.overflow)?;
        d.set_item("bad_qsl", e.bad_qsl)?;
        d.set_item("stale_plan", e.stale_plan)?;
        Ok(d)
    }
    /// Launches the fused resolve on `stream` (device pointers, int32 unless noted; shapes
    /// checked by tierkit.torch): `topk [rows, k]`, `query_start_loc [sessions + 1]`, `seq_lens
    /// [sessions]`, `session_slot [sessions]`; outputs `indices [indices_len]`, `valid_count
    /// [valid_len]` (0 = exact), `plan` (16-byte copies `[sessions][hot_rows]`), `plan_count
    /// [plan_count_len]` (0 = sessions; entries past `sessions` written 0, so a replay of more
    /// sessions copies nothing stale, in a graph too), `stats [sessions][kv_stats]`; the picks
    /// resolve against the hot cache of `layer`'s layer group and the misses are gathered into
    /// every plane of that group. `block_positions > 1`: `topk` holds block ids of that many
    /// positions each and `indices` has `k × block_positions` columns (`KvResolveOptions`).
    #[pyo3(signature = (stream, topk, query_start_loc, seq_lens, session_slot, sessions, rows, k, layer, indices, valid_count, plan, plan_count, stats, packed, query_seq_lens, indices_len, valid_len, plan_count_len, block_positions = None))]
    #[allow(clippy::too_many_arguments)]
    fn resolve(
        &self,
        stream: &Bound<'_, PyAny>,
        topk: &Bound<'_, PyAny>,
        query_start_loc: &Bound<'_, PyAny>,
        seq_lens: &Bound<'_, PyAny>,
        session_slot: &Bound<'_, PyAny>,
        sessions: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        layer: &Bound<'_, PyAny>,
        indices: &Bound<'_, PyAny>,
        valid_count: &Bound<'_, PyAny>,
        plan: &Bound<'_, PyAny>,
        plan_count: &Bound<'_, PyAny>,
        stats: &Bound<'_, PyAny>,
        packed: bool,
        query_seq_lens: &Bound<'_, PyAny>,
        indices_len: &Bound<'_, PyAny>,
        valid_len: &Bound<'_, PyAny>,
        plan_count_len: &Bound<'_, PyAny>,
        block_positions: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        int_args!(block_positions: u32 = 0);
        int_args!(
            stream: u64,
            topk: u64,
            query_start_loc: u64,
            seq_lens: u64,
            session_slot: u64,
            sessions: u32,
            rows: u32,
            k: u32,
            layer: u32,
            indices: u64,
            valid_count: u64,
            plan: u64,
            plan_count: u64,
            stats: u64,
            query_seq_lens: u64,
            indices_len: u64,
            valid_len: u64,
            plan_count_len: u64
        );
        let gpu = self.0.gpu.clone();
        self.with(|p| {
            let max = p.device().dims().max_slots;
            if sessions == 0 || sessions > max || rows == 0 || k == 0 {
                return Err(PyValueError::new_err(format!(
                    "resolve: sessions {sessions} (1..={max}), rows {rows}, k {k} must be positive"
                )));
            }
            let a = KvResolveArgs {
                topk,
                query_start_loc,
                seq_lens,
                session_slot,
                sessions,
                rows,
                k,
                layer,
                indices,
                valid_count,
                plan,
                plan_count,
                stats,
            };
            let o = KvResolveOptions {
                layout: if packed {
                    KV_LAYOUT_PACKED
                } else {
                    KV_LAYOUT_IN_PLACE
                },
                query_seq_lens,
                indices_len,
                valid_len,
                plan_count_len,
                block_positions,
                ..KvResolveOptions::default()
            };
            // SAFETY: the caller's live stream of this device.
            let s = unsafe { gpu.borrow_stream(stream) }.map_err(cuda_err)?;
            // SAFETY: every pointer is a live CUDA tensor of the documented shape (checked by
            // tierkit.torch), kept allocated by torch until the stream passes the launch; the
            // pool's tables are touched only by kernels on the step stream and this stream,
            // which the engine orders (one step stream, or a capture forked from it).
            unsafe {
                p.device()
                    .resolve_async_with(&s, &a, &o, CopyBackend::Gather)
            }
            .map_err(cuda_err)?;
            self.1.set(sessions);
            Ok(())
        })
    }
    /// Copies the last resolve's plan (`plan [sessions][hot_rows]`, `plan_count [sessions]`, the
    /// resolve's outputs) from the host store again into arena planes `layer0 .. layer0 + layers`
    /// of one layer group on `stream` (never needed: the resolve filled the group); entries whose
    /// rows that group's hot cache no longer maps to their positions (another group's plan, or a
    /// stale one) are skipped and counted as `stale_plan`. A range across groups: `ValueError`.
    #[allow(clippy::too_many_arguments)]
    fn replay(
        &self,
        stream: &Bound<'_, PyAny>,
        plan: &Bound<'_, PyAny>,
        plan_count: &Bound<'_, PyAny>,
        sessions: &Bound<'_, PyAny>,
        layer0: &Bound<'_, PyAny>,
        layers: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        int_args!(
            stream: u64,
            plan: u64,
            plan_count: u64,
            sessions: u32,
            layer0: u32,
            layers: u32
        );
        let gpu = self.0.gpu.clone();
        self.with(|p| {
            let dims = *p.device().dims();
            self.1.check_replay(sessions)?;
            // SAFETY: the caller's live stream of this device.
            let s = unsafe { gpu.borrow_stream(stream) }.map_err(cuda_err)?;
            // SAFETY: `plan` / `plan_count` are the pool's own output tensors of a resolve
            // (`[max_sessions][hot_rows]` copies, `[max_sessions]` counts) queued before on this
            // stream, so their rows still hold their positions; torch keeps them allocated.
            unsafe {
                p.device().replay_async(
                    &s,
                    plan,
                    plan_count,
                    sessions,
                    dims.hot_rows,
                    layer0,
                    layers,
                )
            }
            .map_err(cuda_err)
        })
    }
    /// Closes the pool after the device is idle: methods raise `ClosedError` after; the arena and
    /// host store are freed when the pool object and every view (planes, arena) are gone.
    /// Destroy captured graphs that use the pool before. Refused during a capture.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.0.close(py)
    }
    #[getter]
    fn closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Registers the GPU KV pool.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGpuKvPool>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::LastResolve;

    #[test]
    fn replay_is_bounded_by_the_last_resolve() {
        let last = LastResolve::default();
        assert!(last.check_replay(1).is_err(), "no resolve yet");
        last.set(3);
        assert!(last.check_replay(0).is_err());
        assert!(last.check_replay(1).is_ok());
        assert!(last.check_replay(3).is_ok());
        assert!(
            last.check_replay(4).is_err(),
            "stale plan rows beyond the last resolve"
        );
        last.set(2);
        assert!(last.check_replay(3).is_err());
    }
}
