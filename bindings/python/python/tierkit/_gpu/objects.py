"""The host objects of the GPU API: device counters, the GPU expert bank, the GPU KV pool."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from tierkit import _native
from tierkit._gpu import ops as _ops
from tierkit._gpu.checks import _cuda, _device, _no_capture, _range, _step_stream, _tensor
from tierkit._gpu.memory import (
    _LIVE,
    _LEND_LOCK,
    _Closable,
    _overlaps_tierkit_pinned,
    _refuse_tierkit_device,
    _track_device,
    _track_pinned,
    _view,
)

Tensor = torch.Tensor

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
        _cuda(t, "valid_tokens", _ops._I32, None, self.device)
        if t.numel() != 1:
            raise ValueError("valid_tokens must have one element")
        self.control[1:2].copy_(t.reshape(1))

    def drain(self) -> np.ndarray:
        """The counts since the last drain, ``uint32 [layers, experts]`` (synchronous)."""
        self._check_open()
        _no_capture("DeviceCounters.drain", self.device)
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
        _no_capture("DeviceCounters.rejected_total", self.device)
        return int(self.rejected.cpu().numpy().view(np.uint32)[0])

    def close(self) -> None:
        self._closed = True


class ExpertBank(_Closable):
    """The GPU expert bank for ``map``'s geometry: every expert in mapped pinned host memory
    (``host``, ``uint8 [layers, experts, expert_bytes]``, a CUDA tensor over the host copy, read
    in place by kernels), the hot ones in HBM slots (``slots``, ``uint8 [layers,
    slots_per_layer, expert_bytes]``: each layer's hot experts and a spare,
    ``Geometry.slots_per_layer``), and the table of addresses ``table`` (``int64 [layers,
    experts]``, fixed address, rewritten by flips on the step stream: the pointer form). Write the
    experts into ``host`` then call ``reload(map)``; pass the bank as the executor of
    ``tierkit.experts.Controller.step`` (or call ``step``).

    ``stream`` (default: the current stream) is the step stream flips are ordered on; keep
    reading the table on it.

    Engine-owned memory (one host copy of the weights): ``host`` is a contiguous CPU tensor of any
    dtype holding the experts as ``[layers, experts, expert_bytes]`` bytes from its start (at
    least that many bytes, 16-byte aligned); the bank reads it in place and loads ``map``'s hot
    experts from it at once (no ``reload`` needed). A pinned tensor (``is_pinned()``) is used as
    it is (memory another tierkit object pinned is refused); any other is pinned and mapped by
    tierkit (``cuMemHostRegister``, listed by ``pinned_ranges()``, unregistered when the bank is
    freed).
    ``slots`` is a contiguous CUDA tensor on the bank's device of at least ``geometry.hbm_bytes``
    (``layers × slots_per_layer × expert_bytes``) bytes for the HBM slots. tierkit keeps both tensors' storages alive while it
    uses them (re-pointing a tensor with ``set_`` frees nothing it uses); do not write them while
    the bank lives (``host`` is the bank's source of truth). Bad input: TypeError for a
    non-tensor, ValueError for the wrong device, layout, alignment or size, a range the driver
    will not map, or ``slots`` overlapping device memory another open tierkit object writes
    (``device_ranges()``; a range is released by its object's ``close()``).
    """

    def __init__(self, map, device=None, stream=None, threads: int = 4, host=None, slots=None):
        dev = _device(device)
        self.device = dev
        g = map.geometry
        L, E, B = g.layers, g.experts_per_layer, g.expert_bytes
        slot_bytes = g.hbm_bytes  # the hot slots and a spare per layer (the library's rule)
        host_arg = slots_arg = None
        registered = False
        if host is not None:
            host = _range(host, "host", L * E * B, "cpu")
            if _overlaps_tierkit_pinned(host.data_ptr(), L * E * B):
                raise ValueError(
                    "host lies in memory another tierkit object pinned (its pinning ends with "
                    "that object): pass a tensor of your own"
                )
            registered = not host.is_pinned()
            # the storage, not the tensor, is kept: a tensor can be re-pointed with `set_`
            host_arg = (host.untyped_storage(), host.data_ptr(), L * E * B, registered)
        if slots is not None:
            slots = _range(slots, "slots", slot_bytes, "cuda", dev)
        self._stream = _step_stream(stream, dev)
        with _LEND_LOCK:
            if slots is not None:
                _refuse_tierkit_device(slots, slot_bytes, dev, "slots")
                slots_arg = (slots.untyped_storage(), slots.data_ptr(), slot_bytes)
            self._native = _native.GpuExpertBank(
                map, dev.index, self._stream.cuda_stream, threads, host_arg, slots_arg
            )
            lay = self._native.layout()
            S = lay["slots_per_layer"]
            self._device_tracks = [
                _track_device(self._native, dev.index, lay["hbm_ptr"], L * S * B),
                _track_device(self._native, dev.index, lay["table_ptr"], L * E * 8),
            ]
        self.layout = lay
        L, E, S, B = lay["layers"], lay["experts"], lay["slots_per_layer"], lay["expert_bytes"]
        self.table = _view(self._native, lay["table_ptr"], (L, E), "<i8", dev)
        self.host = _view(self._native, lay["host_ptr"], (L, E, B), "|u1", dev)
        self.slots = _view(self._native, lay["hbm_ptr"], (L, S, B), "|u1", dev)
        # tierkit's own pinned memory, or the caller's range it registered (a caller's pinned
        # tensor is the caller's: torch sees it). Tracked for as long as the native object lives:
        # its memory (and a registration) ends with it, not at close(), while views hold it.
        if host is None:
            _track_pinned(self._native, lay["host_ptr"], L * E * B)
        elif registered:
            _track_pinned(self._native, host.data_ptr(), L * E * B)
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

    def reload(self, map, cancel_in_flight: bool = False) -> None:
        """Loads ``map`` synchronously (after writing ``host``, or to switch maps). Swaps still
        in flight make it fail (``RuntimeError``) unless ``cancel_in_flight``: they are then
        dropped unflipped first, and the controller that planned them must be replaced by a new
        one for ``map``."""
        _no_capture("ExpertBank.reload", self.device)
        # writes into `host` (torch copies, possibly still in flight) land before the load reads
        torch.cuda.synchronize(self.device)
        self._native.reload(map, bool(cancel_in_flight))

    def set_commit_mode(self, mode: str) -> None:
        self._native.set_commit_mode(mode)

    def is_hot(self, layer: int, expert: int) -> bool:
        return self._native.is_hot(layer, expert)

    def slots_of(self, layer: int) -> dict:
        """``{expert: slot}`` of the hot experts of ``layer``."""
        return self._native.slots_of(layer)

    def step(self, controller, counters) -> dict:
        """``controller.step(counters, self)``, refused during a capture."""
        _no_capture("ExpertBank.step", self.device)
        return controller.step(counters, self)

    def close(self) -> None:
        self._close_native("ExpertBank.close")


class KvPool(_Closable):
    """The GPU elastic KV pool: the arena (``arena``, ``uint8 [layers, *plane_shape]`` CUDA tensor
    at a fixed address, or ``planes``, one ``plane_shape`` tensor per
    layer), the host store in mapped pinned memory, and the device tables.

    Host calls (``admit``, ``append``, ``finish``, ``reclaim``, ``between_steps``, ``slot_of``,
    ``errors``) publish their table changes asynchronously on the step stream (``stream``,
    default the current one) and are refused during a capture. ``resolve`` launches the fused
    resolve on the current stream into caller-owned outputs (capturable).

    Engine-owned arena: ``arena`` is a contiguous CUDA tensor on the pool's device (any dtype,
    16-byte aligned) of at least ``layers × arena_pages × page_bytes`` bytes (``layers ×
    arena_rows × row_bytes`` for contiguous rows); the pool's rows live
    there (zeroed at creation), so ``self.arena`` / ``self.planes`` are views of it. tierkit keeps
    its storage alive while it uses it; only the pool writes it. Bad input: TypeError for a
    non-tensor, ValueError for the wrong device, layout, alignment or size, or an arena
    overlapping device memory another open tierkit object writes (``device_ranges()``; a range
    is released by its object's ``close()``).
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
        arena=None,
    ):
        dev = _device(device)
        self.device = dev
        arena_arg = None
        need = geometry.layers * geometry.arena_pages * geometry.page_bytes
        if arena is not None:
            arena = _range(arena, "arena", need, "cuda", dev)
        self._stream = _step_stream(stream, dev)
        with _LEND_LOCK:
            if arena is not None:
                _refuse_tierkit_device(arena, need, dev, "arena")
                arena_arg = (arena.untyped_storage(), arena.data_ptr(), need)
            self._native = _native.GpuKvPool(
                geometry,
                dev.index,
                self._stream.cuda_stream,
                max_sessions,
                max_history,
                elastic,
                settle_readers,
                arena_arg,
            )
            lay = self._native.layout()
            rows, rb = lay["plane_shape"]
            self._device_tracks = [
                _track_device(self._native, dev.index, p, rows * rb) for p in lay["plane_ptrs"]
            ]
        self.layout = lay
        self.layers = lay["layers"]
        self.max_sessions = lay["max_sessions"]
        rows, rb = lay["plane_shape"]
        self.planes = [_view(self._native, p, (rows, rb), "|u1", dev) for p in lay["plane_ptrs"]]
        ptrs = lay["plane_ptrs"]
        contiguous = all(ptrs[i] == ptrs[0] + i * rows * rb for i in range(len(ptrs)))
        self.arena = _view(self._native, ptrs[0], (len(ptrs), rows, rb), "|u1", dev) if contiguous else None
        ms, hot = self.max_sessions, lay["hot_rows"]
        # the resolve's plan / stats outputs (KvCopy = 4 x u32), reused by every call
        _track_pinned(self._native, lay["host_ptr"], lay["host_bytes"])
        self.plan = torch.zeros((ms, max(hot, 1), 4), dtype=torch.int32, device=dev)
        self.plan_count = torch.zeros(ms, dtype=torch.int32, device=dev)
        self.stats = torch.zeros((ms, lay["kv_stats"]), dtype=torch.int32, device=dev)
        self._id = next(_ops._POOL_IDS)
        _ops._POOLS[self._id] = self
        _LIVE.add(self)

    def _host(self, what: str):
        self._check_open()
        _no_capture(f"KvPool.{what}", self.device)
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
        block_positions: int = 0,
    ) -> None:
        """Resolves one step's top-k positions to arena rows on the current stream.

        All int32 CUDA tensors on the pool's device, contiguous: ``topk [rows, k]`` (``-1``
        padding), ``query_start_loc [sessions + 1]``, ``seq_lens [sessions]``, ``session_slot
        [sessions]`` (``slot_of``); outputs ``indices`` (at least ``rows × k``: arena rows,
        ``-1`` padding; longer buffers padded) and ``valid_count`` (at least ``rows``).
        ``packed`` packs valid entries to the front (FlashMLA's ``topk_length``).
        ``block_positions = B > 1``: ``topk`` holds block ids (MiniMax-M3's block top-k), id ``b``
        standing for positions ``b × B .. b × B + B`` block-major, and ``indices`` has ``k × B``
        columns (at least ``rows × k × B`` entries; a block's positions at or beyond the row's
        bound are ``-1``). The picks
        resolve against the hot cache of ``layer``'s layer group (``layout["layer_groups"]``)
        and misses are gathered into every plane of that group. Per-step sizes live in the device tensors, so a captured
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
            self.planes,
            layer,
            packed,
            query_seq_lens,
            block_positions,
        )

    def replay(self, sessions: int, layer0: int, layers: int) -> None:
        """Copies the last resolve's misses (its ``sessions`` entries) again into planes
        ``layer0 .. layer0 + layers`` of one layer group on the current stream (capturable).
        Never needed (the resolve filled its group); entries the group's hot cache does not map
        are skipped (``errors()["stale_plan"]``); a range across groups is a ValueError."""
        self._check_open()
        torch.ops.tierkit.kv_replay(
            self._id, self.plan, self.plan_count, self.planes, sessions, layer0, layers
        )

    def close(self) -> None:
        if self._close_native("KvPool.close"):
            _ops._POOLS.pop(self._id, None)
