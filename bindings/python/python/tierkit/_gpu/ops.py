"""The custom ops (namespace ``tierkit``) with their fake implementations, and the registry of
KV pools the ``kv_resolve`` / ``kv_replay`` ops address by id."""

from __future__ import annotations

import itertools
import weakref
from typing import List, Optional

import torch

from tierkit import _native
from tierkit._gpu.checks import _contiguous, _cuda, _stream

Tensor = torch.Tensor

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


def _plan_outputs(p, plan: Tensor, plan_count: Tensor, sessions: int) -> None:
    """Checks a resolve's / replay's plan outputs: int32, contiguous, on the pool's device, ``plan``
    at least ``max_sessions x max(hot_rows, 1) x 4`` elements (the kernel's 16-byte copies at a
    ``hot_rows`` row stride), ``plan_count`` at least ``sessions``."""
    dev = p.device
    need = p.max_sessions * max(p.layout["hot_rows"], 1) * 4
    _contiguous(_cuda(plan, "plan", _I32, None, dev), "plan", need)
    if plan.data_ptr() % 16 != 0:
        raise ValueError("plan is not 16-byte aligned (its entries are 4 x int32 copies)")
    _contiguous(_cuda(plan_count, "plan_count", _I32, None, dev), "plan_count", sessions)


def _arena_planes(p, planes: List[Tensor]) -> None:
    """Checks the ``planes`` argument of the KV ops: one ``uint8 plane_shape`` CUDA
    tensor per layer on the pool's device (``KvPool.planes``). The kernels write the arena at the
    pool's own addresses; the argument tells torch.compile that the op mutates the arena, so no
    read of ``pool.planes[l]`` is moved ahead of it."""
    if len(planes) != p.layers:
        raise ValueError(f"planes has {len(planes)} tensors, the pool {p.layers} layers")
    shape = tuple(p.layout["plane_shape"])
    for i, t in enumerate(planes):
        _cuda(t, f"planes[{i}]", (torch.uint8,), 2, p.device)
        if tuple(t.shape) != shape:
            raise ValueError(f"planes[{i}] has shape {tuple(t.shape)}, the arena plane {shape}")


def _group_layers(p, layer: int) -> range:
    """The layers of ``layer``'s layer group (``KvPool.layout["layer_groups"]``): a resolve at
    ``layer`` fills all of them."""
    start = 0
    for n in p.layout["layer_groups"]:
        if layer < start + n:
            return range(start, start + n)
        start += n
    raise ValueError(f"layer {layer} out of range ({p.layers} layers)")


def _sync_planes(p, planes: List[Tensor], layers: range) -> None:
    """Where torch.compile handed the op copies of the planes (functionalization without
    reinplacing clones mutated arguments and copies them back after the op), fills the copies of
    the written ``layers`` from the arena, on the current stream after the launch, so the copy
    back writes the op's result, not the arena as it was before. A no-op for the planes
    themselves."""
    for layer in layers:
        t, own = planes[layer], p.planes[layer]
        if t.data_ptr() != own.data_ptr():
            t.copy_(own)


# KvPool objects by id (custom ops take tensors and scalars, so the pool is named by an id)
_POOLS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_POOL_IDS = itertools.count(1)


@torch.library.custom_op(
    "tierkit::kv_resolve",
    mutates_args=("indices", "valid_count", "plan", "plan_count", "stats", "planes"),
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
    planes: List[Tensor],
    layer: int,
    packed: bool,
    query_seq_lens: Optional[Tensor],
    block_positions: int = 0,
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
    # Block ids: each of a row's k entries stands for `block_positions` positions (columns).
    if not 0 <= block_positions < 2**32 or k * max(block_positions, 1) >= 2**31:
        raise ValueError(
            f"block_positions {block_positions}: 0 ..= 2^32 - 1, k x block_positions below 2^31"
        )
    width = k * max(block_positions, 1)
    _contiguous(_cuda(indices, "indices", _I32, None, dev), "indices", rows * width)
    _contiguous(_cuda(valid_count, "valid_count", _I32, None, dev), "valid_count", rows)
    q = 0
    if query_seq_lens is not None:
        _contiguous(_cuda(query_seq_lens, "query_seq_lens", _I32, 1, dev), "query_seq_lens")
        if query_seq_lens.numel() != rows:
            raise ValueError(f"query_seq_lens has {query_seq_lens.numel()} entries, topk {rows} rows")
        q = query_seq_lens.data_ptr()
    if not 0 <= layer < p.layers:
        raise ValueError(f"layer {layer} out of range ({p.layers} layers)")
    _plan_outputs(p, plan, plan_count, sessions)
    _arena_planes(p, planes)
    st = _contiguous(_cuda(stats, "stats", _I32, None, dev), "stats")
    if st.numel() < sessions * p.layout["kv_stats"]:
        raise ValueError(
            f"stats has {st.numel()} elements, {sessions} sessions need "
            f"{sessions * p.layout['kv_stats']} (sessions x kv_stats)"
        )
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
        plan_count.numel(),
        block_positions,
    )
    _sync_planes(p, planes, _group_layers(p, layer))


@kv_resolve.register_fake
def _kv_resolve_fake(*args):
    return None


# "planes" (the arena) is declared mutated: torch.compile keeps the call and orders reads of the
# planes after it; the op leaves the plan as it is.
@torch.library.custom_op("tierkit::kv_replay", mutates_args=("planes",))
def kv_replay(
    pool: int,
    plan: Tensor,
    plan_count: Tensor,
    planes: List[Tensor],
    sessions: int,
    layer0: int,
    layers: int,
) -> None:
    """Copies the last resolve's misses again into arena planes ``layer0 .. layer0 + layers`` of
    one layer group (``KvPool.replay``; ``planes`` = ``KvPool.planes``)."""
    p = _POOLS.get(pool)
    if p is None:
        raise _native.ClosedError(f"KvPool {pool} is closed or unknown")
    p._check_open()
    # checked by shape, not by identity or address: torch.compile's functionalization may hand
    # the op another tensor holding the resolve's plan; the kernel bound-checks every entry, so
    # no plan can copy outside the host store or the arena
    if not 1 <= sessions <= p.max_sessions:
        raise ValueError(f"sessions {sessions} outside 1..={p.max_sessions}")
    _plan_outputs(p, plan, plan_count, sessions)
    if not (0 <= layer0 and layers >= 1 and layer0 + layers <= p.layers):
        raise ValueError(f"layers {layer0}..{layer0 + layers} outside 0..{p.layers}")
    group = _group_layers(p, layer0)
    if layer0 + layers > group.stop:
        raise ValueError(
            f"layers {layer0}..{layer0 + layers} cross layer groups (layer {layer0}'s group is "
            f"{group.start}..{group.stop}): a plan replays only into its own group"
        )
    _arena_planes(p, planes)
    p._native.replay(
        _stream(p.device), plan.data_ptr(), plan_count.data_ptr(), sessions, layer0, layers
    )
    _sync_planes(p, planes, range(layer0, layer0 + layers))


@kv_replay.register_fake
def _kv_replay_fake(pool, plan, plan_count, planes, sessions, layer0, layers):
    return None

