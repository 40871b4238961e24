"""tierkit's GPU API for PyTorch: custom ops on CUDA tensors and the GPU tier objects.

Importable where PyTorch is installed and tierkit was built with its CUDA entry points
(``maturin build --release --features cuda``); otherwise importing raises ``ImportError``.

Ops (namespace ``tierkit``, registered with ``torch.library.custom_op`` and fake
implementations, so ``torch.compile`` and CUDA graphs see them; each launches on the current
stream and never allocates, synchronises or creates a stream):

- ``torch.ops.tierkit.count_topk(topk_ids, counts, rejected, control, layer)``: one layer's
  router top-k ids (``int32``/``int64 [tokens, k]``, a row stride is fine, column stride 1) into
  ``counts`` (``int32 [layers, experts]``, read as uint32), out-of-range ids into ``rejected``
  (``int32 [1]``), under ``control`` (``int32 [4]``: ``[enabled, valid_tokens, 0, 0]``, ``-1`` =
  all tokens), read on the device when the kernel runs: a captured graph sees the values written
  before each replay (vLLM EPLB's device flag and unpadded-token count).
- ``torch.ops.tierkit.expert_slot_ids(table, out, hbm, slot_bytes, slots_per_layer)``: the
  slot-id form of an expert table (``int64 [layers, experts]`` addresses → ``int32`` slot or -1),
  for engines that index a stacked slot tensor (``ExpertBank.slot_ids``).
- ``torch.ops.tierkit.kv_resolve(pool, topk, query_start_loc, seq_lens, session_slot, indices,
  valid_count, plan, plan_count, stats, layer, packed, query_seq_lens)``: the fused KV resolve
  into caller-owned outputs (``KvPool.resolve``).

Host objects: ``DeviceCounters`` (device tables the controller drains), ``ExpertBank`` (the GPU
expert bank, an executor for ``tierkit.experts.Controller``), ``KvPool`` (the GPU elastic KV
pool). Their host methods that synchronise or change tier state raise ``RuntimeError`` while the
current stream is capturing a CUDA graph. Bad input raises ``TypeError`` (dtype, not a tensor) or
``ValueError`` (shape, device, stride, alignment); a closed object ``tierkit.ClosedError``.

Memory views (``ExpertBank.table / .host / .slots``, ``KvPool.arena``) are CUDA tensors over
tierkit's memory through ``__cuda_array_interface__`` (the host store is mapped pinned memory:
its device address is readable in place by kernels, UVA). They are valid until ``close()``.
``is_tierkit_pinned(t)`` says whether a tensor lies in tierkit's pinned memory (``is_pinned()``
does not see mapped or registered host memory). Nothing here starts a thread; every live object
is closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import weakref
from typing import Optional

import numpy as np

from tierkit import _native

if not getattr(_native, "has_cuda_ops", lambda: False)():
    raise ImportError(
        "tierkit.torch: this tierkit was built without CUDA ops (build the wheel with "
        "`maturin build --release --features cuda`); the CPU API (tierkit.experts, tierkit.kv) "
        "takes CPU torch tensors"
    )

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tierkit.torch needs PyTorch (pip install torch); the CPU API (tierkit.experts, "
        "tierkit.kv) works without it"
    ) from e


def _preload_nvrtc() -> Optional[str]:
    """Makes libnvrtc loadable where it comes from pip (``nvidia-cuda-nvrtc``, torch's CUDA
    wheels: ``site-packages/nvidia/{cu13,cuda_nvrtc}/lib``) rather than the system: loads it
    globally so that the Rust core's ``dlopen("libnvrtc.so.13")`` finds it by its soname.
    Returns the path loaded, or None (the system's is used, or none exists: the first kernel
    launch then raises RuntimeError naming NVRTC)."""
    import ctypes
    import glob
    import os
    import sys

    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return None  # the loader finds one already
        except OSError:
            pass
    for base in sys.path:
        for sub in ("cu13", "cuda_nvrtc", "cu12"):
            for lib in sorted(glob.glob(os.path.join(base, "nvidia", sub, "lib", "libnvrtc.so*"))):
                try:
                    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                    return lib
                except OSError:
                    continue
    return None


NVRTC_PRELOADED = _preload_nvrtc()

from tierkit import experts as _experts  # noqa: E402
from tierkit import kv as _kv  # noqa: E402

__all__ = [
    "DeviceCounters",
    "ExpertBank",
    "KvPool",
    "is_tierkit_pinned",
    "pinned_ranges",
    "warmup",
]

Tensor = torch.Tensor

# ---------------------------------------------------------------------------------------------
# checks


def _tensor(t, name: str) -> Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    return t


def _cuda(t, name: str, dtypes, ndim: Optional[int] = None, device=None) -> Tensor:
    t = _tensor(t, name)
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}, expected {want}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.data_ptr() % t.element_size() != 0:
        raise ValueError(f"{name} is not aligned for its dtype")
    return t


def _contiguous(t: Tensor, name: str, min_numel: int = 0) -> Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if t.numel() < min_numel:
        raise ValueError(f"{name} has {t.numel()} elements, the call needs {min_numel}")
    return t


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _no_capture(what: str) -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{what} synchronises or changes tier state on the host and cannot run while the "
            "current stream is capturing a CUDA graph; call it between replays"
        )


def _device(device) -> torch.device:
    d = torch.device("cuda") if device is None else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {d}")
    if d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def warmup(device=None) -> None:
    """Loads tierkit's kernels on ``device`` (NVRTC compile at first use): call before capturing
    a CUDA graph so no module loads inside the capture."""
    _native.warmup(_device(device).index)


# ---------------------------------------------------------------------------------------------
# memory views and pinned ranges

_PINNED: dict = {}  # id -> (ptr, bytes)
_PINNED_LOCK = threading.Lock()


class _DeviceArray:
    """A ``__cuda_array_interface__`` over tierkit memory; holds its owner (the native object,
    so a view keeps the memory alive, and no reference cycle runs through the wrapper) alive."""

    def __init__(self, owner, ptr: int, shape, typestr: str):
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": tuple(int(s) for s in shape),
            "typestr": typestr,
            "data": (int(ptr), False),
            "version": 3,
            "strides": None,
            # the producer has no pending work on any stream: no synchronisation needed
            "stream": None,
        }


def _view(owner, ptr: int, shape, typestr: str, device: torch.device) -> Tensor:
    with torch.cuda.device(device):
        return torch.as_tensor(_DeviceArray(owner, ptr, shape, typestr), device=device)


def pinned_ranges():
    """The pinned (mapped) host ranges tierkit owns now, as ``[(device_ptr, bytes)]``."""
    with _PINNED_LOCK:
        return sorted(_PINNED.values())


def is_tierkit_pinned(t: Tensor) -> bool:
    """Whether ``t``'s data lies inside pinned host memory tierkit owns (``Tensor.is_pinned()``
    misses mapped and ``cudaHostRegister`` memory)."""
    t = _tensor(t, "t")
    lo = t.data_ptr()
    if t.numel() == 0:
        return False
    if any(st < 0 for st in t.stride()):
        return False
    # the bytes the view spans (strided views included)
    hi = lo + (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
    with _PINNED_LOCK:
        return any(p <= lo and hi <= p + n for p, n in _PINNED.values())


_LIVE = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for obj in list(_LIVE):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class _Closable:
    _closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise _native.ClosedError(f"{type(self).__name__} is closed")


# ---------------------------------------------------------------------------------------------
# ops

_IDS = (torch.int32, torch.int64)
_I32 = (torch.int32,)


@torch.library.custom_op("tierkit::count_topk", mutates_args=("counts", "rejected"))
def count_topk(
    topk_ids: Tensor, counts: Tensor, rejected: Tensor, control: Tensor, layer: int
) -> None:
    """Counts one layer's top-k ids into ``counts[layer]`` (see the module docs)."""
    ids = _cuda(topk_ids, "topk_ids", _IDS, 2)
    dev = ids.device
    _contiguous(_cuda(counts, "counts", _I32, 2, dev), "counts")
    _contiguous(_cuda(rejected, "rejected", _I32, None, dev), "rejected", 1)
    _contiguous(_cuda(control, "control", _I32, 1, dev), "control", 4)
    tokens, k = ids.shape
    if tokens == 0:
        return
    if k == 0:
        raise ValueError("topk_ids has no columns (k = 0)")
    if ids.stride(1) != 1 and k > 1:
        raise ValueError("topk_ids must have column stride 1 (rows may be strided)")
    row_stride = ids.stride(0) if tokens > 1 else k
    if row_stride < k:
        raise ValueError(f"topk_ids row stride {row_stride} is below k = {k}")
    layers, experts = counts.shape
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} out of range (counts has {layers} layers)")
    _native.count_topk(
        dev.index,
        _stream(dev),
        ids.data_ptr(),
        str(ids.dtype).replace("torch.", ""),
        tokens,
        k,
        row_stride,
        layer,
        counts.data_ptr(),
        layers,
        experts,
        rejected.data_ptr(),
        control.data_ptr(),
    )


@count_topk.register_fake
def _count_topk_fake(topk_ids, counts, rejected, control, layer):
    return None


@torch.library.custom_op("tierkit::expert_slot_ids", mutates_args=("out",))
def expert_slot_ids(
    table: Tensor, out: Tensor, hbm: int, slot_bytes: int, slots_per_layer: int
) -> None:
    """``out[l, e]`` = the HBM slot ``table[l, e]`` points at, or -1 (a host read)."""
    t = _contiguous(_cuda(table, "table", (torch.int64,), 2), "table")
    o = _contiguous(_cuda(out, "out", _I32, 2, t.device), "out")
    if tuple(o.shape) != tuple(t.shape):
        raise ValueError(f"out has shape {tuple(o.shape)}, the table {tuple(t.shape)}")
    layers, experts = t.shape
    _native.expert_slot_ids(
        t.device.index,
        _stream(t.device),
        t.data_ptr(),
        o.data_ptr(),
        layers * experts,
        experts,
        hbm,
        slot_bytes,
        slots_per_layer,
    )


@expert_slot_ids.register_fake
def _expert_slot_ids_fake(table, out, hbm, slot_bytes, slots_per_layer):
    return None


_POOLS: "weakref.WeakValueDictionary[int, KvPool]" = weakref.WeakValueDictionary()
_POOL_IDS = itertools.count(1)


@torch.library.custom_op(
    "tierkit::kv_resolve",
    mutates_args=("indices", "valid_count", "plan", "plan_count", "stats"),
)
def kv_resolve(
    pool: int,
    topk: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    session_slot: Tensor,
    indices: Tensor,
    valid_count: Tensor,
    plan: Tensor,
    plan_count: Tensor,
    stats: Tensor,
    layer: int,
    packed: bool,
    query_seq_lens: Optional[Tensor],
) -> None:
    """The fused KV resolve of pool ``pool`` (``KvPool.resolve`` documents the arguments)."""
    p = _POOLS.get(pool)
    if p is None:
        raise _native.ClosedError(f"KvPool {pool} is closed or unknown")
    p._check_open()
    dev = p.device
    tk = _contiguous(_cuda(topk, "topk", _I32, 2, dev), "topk")
    rows, k = tk.shape
    qsl = _contiguous(_cuda(query_start_loc, "query_start_loc", _I32, 1, dev), "query_start_loc")
    sessions = qsl.numel() - 1
    if sessions < 1 or sessions > p.max_sessions:
        raise ValueError(
            f"query_start_loc has {qsl.numel()} entries: 2 ..= max_sessions + 1 "
            f"({p.max_sessions + 1})"
        )
    for name, t in (("seq_lens", seq_lens), ("session_slot", session_slot)):
        _contiguous(_cuda(t, name, _I32, 1, dev), name)
        if t.numel() != sessions:
            raise ValueError(f"{name} has {t.numel()} entries, query_start_loc names {sessions}")
    if rows == 0 or k == 0:
        raise ValueError(f"topk has shape {tuple(tk.shape)}: rows and k must be positive")
    _contiguous(_cuda(indices, "indices", _I32, None, dev), "indices", rows * k)
    _contiguous(_cuda(valid_count, "valid_count", _I32, None, dev), "valid_count", rows)
    q = 0
    if query_seq_lens is not None:
        _contiguous(_cuda(query_seq_lens, "query_seq_lens", _I32, 1, dev), "query_seq_lens")
        if query_seq_lens.numel() != rows:
            raise ValueError(f"query_seq_lens has {query_seq_lens.numel()} entries, topk {rows} rows")
        q = query_seq_lens.data_ptr()
    if not 0 <= layer < p.layers:
        raise ValueError(f"layer {layer} out of range ({p.layers} layers)")
    p._native.resolve(
        _stream(dev),
        tk.data_ptr(),
        qsl.data_ptr(),
        seq_lens.data_ptr(),
        session_slot.data_ptr(),
        sessions,
        rows,
        k,
        layer,
        indices.data_ptr(),
        valid_count.data_ptr(),
        plan.data_ptr(),
        plan_count.data_ptr(),
        stats.data_ptr(),
        bool(packed),
        q,
        indices.numel(),
        valid_count.numel(),
    )


@kv_resolve.register_fake
def _kv_resolve_fake(*args):
    return None


# "plan" is declared mutated so that torch.compile never drops the call (it writes the arena,
# tierkit's memory, which is no argument); the op leaves the plan as it is.
@torch.library.custom_op("tierkit::kv_replay", mutates_args=("plan",))
def kv_replay(
    pool: int, plan: Tensor, plan_count: Tensor, sessions: int, layer0: int, layers: int
) -> None:
    """Copies the last resolve's misses into arena planes ``layer0 .. layer0 + layers``
    (``KvPool.replay``). The arena is tierkit's memory, not an argument: the op is ordered by
    the stream."""
    p = _POOLS.get(pool)
    if p is None:
        raise _native.ClosedError(f"KvPool {pool} is closed or unknown")
    p._check_open()
    if plan is not p.plan or plan_count is not p.plan_count:
        raise ValueError("plan / plan_count must be the pool's own (KvPool.plan, .plan_count)")
    if not (0 <= layer0 and layers >= 1 and layer0 + layers <= p.layers):
        raise ValueError(f"layers {layer0}..{layer0 + layers} outside 0..{p.layers}")
    p._native.replay(
        _stream(p.device), plan.data_ptr(), plan_count.data_ptr(), sessions, layer0, layers
    )


@kv_replay.register_fake
def _kv_replay_fake(pool, plan, plan_count, sessions, layer0, layers):
    return None


# ---------------------------------------------------------------------------------------------
# host objects


class DeviceCounters(_Closable):
    """Expert pick counters on the device: ``counts`` (``int32 [layers, experts]``, uint32
    cumulative), ``rejected`` (``int32 [1]``) and the control block ``control`` (``int32 [4]``).

    ``record(layer, topk_ids)`` counts on the current stream (graph-capturable). The controls
    are device memory read when each count runs: ``set_enabled`` / ``set_valid_tokens`` enqueue a
    write on the current stream (outside a capture, before ``graph.replay()``, the replay sees the
    new value; inside a capture the value is baked in), and ``valid_tokens_from(t)`` copies an
    ``int32`` device scalar (e.g. the batch's unpadded token count) into the block, capturable.
    ``drain_into(pick_counters)`` adds the counts since the last drain to a
    ``tierkit.experts.PickCounters`` (synchronous; refused during a capture), which the
    controller then drains in ``Controller.step``.
    """

    def __init__(self, geometry, device=None):
        dev = _device(device)
        self.device = dev
        self.layers = int(geometry.layers)
        self.experts = int(geometry.experts_per_layer)
        self.counts = torch.zeros((self.layers, self.experts), dtype=torch.int32, device=dev)
        self.rejected = torch.zeros(1, dtype=torch.int32, device=dev)
        self.control = torch.tensor([1, -1, 0, 0], dtype=torch.int32, device=dev)
        self._last = np.zeros((self.layers, self.experts), dtype=np.uint32)
        _LIVE.add(self)

    def record(self, layer: int, topk_ids: Tensor) -> None:
        """Counts one layer's ``[tokens, k]`` top-k ids (int32/int64 CUDA)."""
        self._check_open()
        _tensor(topk_ids, "topk_ids")  # TypeError here, not the dispatcher's RuntimeError
        torch.ops.tierkit.count_topk(topk_ids, self.counts, self.rejected, self.control, layer)

    def set_enabled(self, enabled: bool) -> None:
        """Writes the enable flag on the current stream."""
        self._check_open()
        self.control[0].fill_(1 if enabled else 0)

    def set_valid_tokens(self, valid_tokens: Optional[int]) -> None:
        """Writes the valid-token count on the current stream (``None``: every row)."""
        self._check_open()
        if valid_tokens is not None and not 0 <= int(valid_tokens) < 2**31:
            raise ValueError(f"valid_tokens {valid_tokens} out of range")
        self.control[1].fill_(-1 if valid_tokens is None else int(valid_tokens))

    def valid_tokens_from(self, t: Tensor) -> None:
        """Copies a one-element int32 device tensor into the valid-token word (capturable)."""
        self._check_open()
        _cuda(t, "valid_tokens", _I32, None, self.device)
        if t.numel() != 1:
            raise ValueError("valid_tokens must have one element")
        self.control[1:2].copy_(t.reshape(1))

    def drain(self) -> np.ndarray:
        """The counts since the last drain, ``uint32 [layers, experts]`` (synchronous)."""
        self._check_open()
        _no_capture("DeviceCounters.drain")
        snap = self.counts.cpu().numpy().view(np.uint32).copy()
        delta = snap - self._last  # uint32 arithmetic wraps like the device counters
        self._last = snap
        return delta

    def drain_into(self, pick_counters) -> np.ndarray:
        """Adds ``drain()`` to a ``tierkit.experts.PickCounters``; returns the delta."""
        delta = self.drain()
        pick_counters.add_counts(delta)
        return delta

    def rejected_total(self) -> int:
        """Rejected picks so far (synchronous)."""
        self._check_open()
        _no_capture("DeviceCounters.rejected_total")
        return int(self.rejected.cpu().numpy().view(np.uint32)[0])

    def close(self) -> None:
        self._closed = True


class ExpertBank(_Closable):
    """The GPU expert bank for ``map``'s geometry: every expert in mapped pinned host memory
    (``host``, ``uint8 [layers, experts, expert_bytes]``, a CUDA tensor over the host copy, read
    in place by kernels), the hot ones in HBM slots (``slots``, ``uint8 [layers, hot + 1,
    expert_bytes]``), and the table of addresses ``table`` (``int64 [layers, experts]``, fixed
    address, rewritten by flips on the step stream: the pointer form). Write the experts into
    ``host`` then call ``reload(map)``; pass the bank as the executor of
    ``tierkit.experts.Controller.step`` (or call ``step``).

    ``stream`` (default: the current stream) is the step stream flips are ordered on; keep
    reading the table on it.
    """

    def __init__(self, map, device=None, stream=None, threads: int = 4):
        dev = _device(device)
        self.device = dev
        self._stream = stream if stream is not None else torch.cuda.current_stream(dev)
        self._native = _native.GpuExpertBank(map, dev.index, self._stream.cuda_stream, threads)
        lay = self._native.layout()
        self.layout = lay
        L, E, S, B = lay["layers"], lay["experts"], lay["slots_per_layer"], lay["expert_bytes"]
        self.table = _view(self._native, lay["table_ptr"], (L, E), "<i8", dev)
        self.host = _view(self._native, lay["host_ptr"], (L, E, B), "|u1", dev)
        self.slots = _view(self._native, lay["hbm_ptr"], (L, S, B), "|u1", dev)
        with _PINNED_LOCK:
            _PINNED[id(self)] = (lay["host_ptr"], L * E * B)
        _LIVE.add(self)

    def slot_ids(self, out: Optional[Tensor] = None) -> Tensor:
        """The slot-id form of the table into ``out`` (``int32 [layers, experts]``, allocated
        once when None: pass a persistent tensor inside a graph)."""
        self._check_open()
        if out is None:
            out = torch.empty(tuple(self.table.shape), dtype=torch.int32, device=self.device)
        lay = self.layout
        torch.ops.tierkit.expert_slot_ids(
            self.table, out, lay["hbm_ptr"], lay["expert_bytes"], lay["slots_per_layer"]
        )
        return out

    def reload(self, map) -> None:
        """Loads ``map`` synchronously (after writing ``host``, or to switch maps)."""
        _no_capture("ExpertBank.reload")
        # writes into `host` (torch copies, possibly still in flight) land before the load reads
        torch.cuda.synchronize(self.device)
        self._native.reload(map)

    def set_commit_mode(self, mode: str) -> None:
        self._native.set_commit_mode(mode)

    def is_hot(self, layer: int, expert: int) -> bool:
        return self._native.is_hot(layer, expert)

    def slots_of(self, layer: int) -> dict:
        """``{expert: slot}`` of the hot experts of ``layer``."""
        return self._native.slots_of(layer)

    def step(self, controller, counters) -> dict:
        """``controller.step(counters, self)``, refused during a capture."""
        _no_capture("ExpertBank.step")
        return controller.step(counters, self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with _PINNED_LOCK:
                _PINNED.pop(id(self), None)
            self._native.close()


class KvPool(_Closable):
    """The GPU elastic KV pool: the arena (``arena``, ``uint8 [layers, arena_rows, row_bytes]``
    CUDA tensor at a fixed address, or ``planes``, one ``[arena_rows, row_bytes]`` tensor per
    layer), the host store in mapped pinned memory, and the device tables.

    Host calls (``admit``, ``append``, ``finish``, ``reclaim``, ``between_steps``, ``slot_of``,
    ``errors``) publish their table changes asynchronously on the step stream (``stream``,
    default the current one) and are refused during a capture. ``resolve`` launches the fused
    resolve on the current stream into caller-owned outputs (capturable).
    """

    def __init__(
        self,
        geometry,
        max_sessions: int,
        max_history: int,
        device=None,
        stream=None,
        elastic: bool = True,
        settle_readers: bool = False,
    ):
        dev = _device(device)
        self.device = dev
        self._stream = stream if stream is not None else torch.cuda.current_stream(dev)
        self._native = _native.GpuKvPool(
            geometry,
            dev.index,
            self._stream.cuda_stream,
            max_sessions,
            max_history,
            elastic,
            settle_readers,
        )
        lay = self._native.layout()
        self.layout = lay
        self.layers = lay["layers"]
        self.max_sessions = lay["max_sessions"]
        rows, rb = lay["arena_rows"], lay["row_bytes"]
        self.planes = [_view(self._native, p, (rows, rb), "|u1", dev) for p in lay["plane_ptrs"]]
        ptrs = lay["plane_ptrs"]
        contiguous = all(ptrs[i] == ptrs[0] + i * rows * rb for i in range(len(ptrs)))
        self.arena = _view(self._native, ptrs[0], (len(ptrs), rows, rb), "|u1", dev) if contiguous else None
        ms, hot = self.max_sessions, lay["hot_rows"]
        # the resolve's plan / stats outputs (KvCopy = 4 x u32), reused by every call
        self.plan = torch.zeros((ms, max(hot, 1), 4), dtype=torch.int32, device=dev)
        self.plan_count = torch.zeros(ms, dtype=torch.int32, device=dev)
        self.stats = torch.zeros((ms, lay["kv_stats"]), dtype=torch.int32, device=dev)
        self._id = next(_POOL_IDS)
        _POOLS[self._id] = self
        _LIVE.add(self)

    def _host(self, what: str):
        self._check_open()
        _no_capture(f"KvPool.{what}")
        return self._native

    def admit(self, session: int, history) -> dict:
        """Admits a session with its committed history (bytes / uint8 array, whole tokens)."""
        return self._host("admit").admit(session, history)

    def append(self, session: int, tokens) -> int:
        return self._host("append").append(session, tokens)

    def finish(self, session: int) -> None:
        self._host("finish").finish(session)

    def reclaim(self, n: int) -> int:
        return self._host("reclaim").reclaim(n)

    def between_steps(self, chunk: int = 8) -> dict:
        return self._host("between_steps").between_steps(chunk)

    def slot_of(self, session: int) -> int:
        return self._host("slot_of").slot_of(session)

    def errors(self, clear: bool = False) -> dict:
        return self._host("errors").errors(clear)

    def resolve(
        self,
        topk: Tensor,
        query_start_loc: Tensor,
        seq_lens: Tensor,
        session_slot: Tensor,
        indices: Tensor,
        valid_count: Tensor,
        layer: int = 0,
        packed: bool = False,
        query_seq_lens: Optional[Tensor] = None,
    ) -> None:
        """Resolves one step's top-k positions to arena rows on the current stream.

        All int32 CUDA tensors on the pool's device, contiguous: ``topk [rows, k]`` (``-1``
        padding), ``query_start_loc [sessions + 1]``, ``seq_lens [sessions]``, ``session_slot
        [sessions]`` (``slot_of``); outputs ``indices`` (at least ``rows × k``: arena rows,
        ``-1`` padding; longer buffers padded) and ``valid_count`` (at least ``rows``).
        ``packed`` packs valid entries to the front (FlashMLA's ``topk_length``). Misses are
        gathered into plane ``layer``. Per-step sizes live in the device tensors, so a captured
        graph replays with new values; the shapes are fixed by the capture.
        """
        self._check_open()
        named = {"topk": topk, "query_start_loc": query_start_loc, "seq_lens": seq_lens,
                 "session_slot": session_slot, "indices": indices, "valid_count": valid_count}
        for name, t in named.items():  # TypeError here, not the dispatcher's RuntimeError
            _tensor(t, name)
        if query_seq_lens is not None:
            _tensor(query_seq_lens, "query_seq_lens")
        torch.ops.tierkit.kv_resolve(
            self._id,
            topk,
            query_start_loc,
            seq_lens,
            session_slot,
            indices,
            valid_count,
            self.plan,
            self.plan_count,
            self.stats,
            layer,
            packed,
            query_seq_lens,
        )

    def replay(self, sessions: int, layer0: int, layers: int) -> None:
        """Copies the last resolve's misses (its ``sessions`` entries) into planes ``layer0 ..
        layer0 + layers`` on the current stream (capturable): the other layers of a group."""
        self._check_open()
        torch.ops.tierkit.kv_replay(self._id, self.plan, self.plan_count, sessions, layer0, layers)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _POOLS.pop(self._id, None)
            self._native.close()


# keep the names of the CPU API at hand for engines importing only this module
Geometry = _experts.Geometry
KvGeometry = _kv.Geometry
