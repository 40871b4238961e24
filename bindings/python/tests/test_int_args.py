"""Every public integer argument, given a negative, a too-large or a huge int: a ValueError whose
message names the argument (never OverflowError or SystemError). One row per argument in
CALLS: add a row with each new function or constructor that takes an integer."""

import numpy as np
import pytest

import tierkit
from tierkit import experts, kv

if tierkit.has_lab:
    from tierkit import sim

NEGATIVE, TOO_LARGE, HUGE = -1, 2**64, 2**200
UNSIGNED = (NEGATIVE, TOO_LARGE, HUGE)
# A signed argument (e.g. an arena row, where -1 means "none"): only values beyond int64.
SIGNED = (TOO_LARGE, HUGE, -HUGE)

G = experts.Geometry(2, 8, 2)
MAP = experts.ResidencyMap.first_k("m", G)
IDS = np.array([[0, 1]], dtype=np.int32)
TOKEN = bytes(64)  # one token of POOL's geometry (2 layers × 32 bytes)
TOPK = np.array([[0, 5, 19, -1]], dtype=np.int32)


def counters():
    return experts.PickCounters(G)


def executor():
    return experts.MemoryExecutor(MAP, 64)


def pool():
    p = kv.ElasticPool(kv.Geometry.for_hbm_budget(16 * 4 * 32 * 2, 32, 2, 4, 8, 4, 4))
    p.admit(7, bytes(20 * 64))
    return p


def store_pool():
    return kv.ElasticPool(kv_geometry(), max_sessions=2, max_history=32)


def resolved(p):
    return p.resolve([7], [0, 1], [20], TOPK)


def kv_geometry(**kw):
    args = dict(row_bytes=32, layers=2, page_rows=4, arena_pages=16, hot_rows=8, tail_rows=4,
                scratch_rows=0)
    args.update(kw)
    return kv.Geometry(*args.values())


def budget(**kw):
    args = dict(budget_bytes=4096, row_bytes=32, layers=2, page_rows=4, hot_rows=8, tail_rows=4,
                scratch_rows=0)
    args.update(kw)
    return kv.Geometry.for_hbm_budget(*args.values())


# (the argument's name as the message must show it, the call with the bad value v, the values)
CALLS = [
    # tierkit.experts
    ("layers", lambda v: experts.Geometry(v, 8, 2), UNSIGNED),
    ("experts_per_layer", lambda v: experts.Geometry(2, v, 2), UNSIGNED),
    ("hot_per_layer", lambda v: experts.Geometry(2, 8, v), UNSIGNED),
    ("expert_bytes", lambda v: experts.Geometry(2, 8, 2, expert_bytes=v), UNSIGNED),
    ("hot_sets[1][0]", lambda v: experts.ResidencyMap.from_hot_sets("m", G, [[0, 1], [v, 1]]),
     UNSIGNED),
    ("layer", lambda v: MAP.is_hot(v, 0), UNSIGNED),
    ("expert", lambda v: MAP.is_hot(0, v), UNSIGNED),
    ("layer", lambda v: MAP.hot_experts(v), UNSIGNED),
    ("layer", lambda v: MAP.generation(v), UNSIGNED),
    ("layer", lambda v: counters().record_layer(v, IDS), UNSIGNED),
    ("layer", lambda v: counters().record(v, 0), UNSIGNED),
    ("expert", lambda v: counters().record(0, v), UNSIGNED),
    ("bytes_per_expert", lambda v: experts.MemoryExecutor(MAP, v), UNSIGNED),
    ("seed", lambda v: experts.MemoryExecutor(MAP, 64, seed=v), UNSIGNED),
    ("layer", lambda v: executor().read(v, 0), UNSIGNED),
    ("expert", lambda v: executor().read(0, v), UNSIGNED),
    # tierkit.kv: geometry
    *[(name, (lambda n: lambda v: kv_geometry(**{n: v}))(name), UNSIGNED)
      for name in ("row_bytes", "layers", "page_rows", "arena_pages", "hot_rows", "tail_rows",
                   "scratch_rows")],
    *[(name, (lambda n: lambda v: budget(**{n: v}))(name), UNSIGNED)
      for name in ("budget_bytes", "row_bytes", "layers", "page_rows", "hot_rows", "tail_rows",
                   "scratch_rows")],
    # tierkit.kv: the pool
    ("session", lambda v: pool().admit(v, TOKEN), UNSIGNED),
    ("session", lambda v: pool().append(v, TOKEN), UNSIGNED),
    ("session", lambda v: pool().write_scratch(v, TOKEN), UNSIGNED),
    ("session", lambda v: pool().accept(v, 0), UNSIGNED),
    ("n", lambda v: pool().accept(7, v), UNSIGNED),
    ("session", lambda v: pool().finish(v), UNSIGNED),
    ("n", lambda v: pool().reclaim(v), UNSIGNED),
    ("chunk", lambda v: pool().between_steps(v), UNSIGNED),
    ("layer", lambda v: pool().resolve([7], [0, 1], [20], TOPK, layer=v), UNSIGNED),
    ("k", lambda v: pool().resolve([7], [0, 1], [20], TOPK, k=v), UNSIGNED),
    ("sessions[0]", lambda v: pool().resolve([v], [0, 1], [20], TOPK), UNSIGNED),
    ("query_start_loc[1]", lambda v: pool().resolve([7], [0, v], [20], TOPK), SIGNED),
    ("seq_lens[0]", lambda v: pool().resolve([7], [0, 1], [v], TOPK), SIGNED),
    ("query_seq_lens[0]",
     lambda v: pool().resolve([7], [0, 1], [20], TOPK, query_seq_lens=[v]), SIGNED),
    ("layer", lambda v: (lambda p: p.replay(resolved(p), v))(pool()), UNSIGNED),
    ("session", lambda v: pool().prefetch(v, [0], 0), UNSIGNED),
    ("layer", lambda v: pool().prefetch(7, [0], v), UNSIGNED),
    ("candidates[0]", lambda v: pool().prefetch(7, [v], 0), SIGNED),
    ("layer", lambda v: kv_geometry().group_of(v), UNSIGNED),
    ("layer", lambda v: pool().arena_row(v, 0), UNSIGNED),
    ("row", lambda v: pool().arena_row(0, v), SIGNED),
    ("session", lambda v: pool().committed_len(v), UNSIGNED),
    # tierkit.kv: the region-backed store and transfers
    ("max_sessions", lambda v: kv.ElasticPool(kv_geometry(), max_sessions=v, max_history=8),
     UNSIGNED),
    ("max_history", lambda v: kv.ElasticPool(kv_geometry(), max_sessions=2, max_history=v),
     UNSIGNED),
    ("session", lambda v: store_pool().reserve(v, 0, 4), UNSIGNED),
    ("start", lambda v: store_pool().reserve(8, v, 4), UNSIGNED),
    ("end", lambda v: store_pool().reserve(8, 0, v), UNSIGNED),
    ("session", lambda v: store_pool().commit(v), UNSIGNED),
    ("session", lambda v: store_pool().abort(v), UNSIGNED),
    ("session", lambda v: store_pool().export(v), UNSIGNED),
    ("session", lambda v: store_pool().export_done(v), UNSIGNED),
    ("steps", lambda v: store_pool().set_import_timeout(v), UNSIGNED),
]

# tierkit.sim (a wheel built with --features lab; skipped one by one in the base wheel).
LAB_CALLS = [
    *[(name, (lambda n: lambda v: sim.scoreboard(**{n: v}))(name), UNSIGNED)
      for name in ("steps", "shift_at", "tokens_per_step", "seed", "hot", "expert_bytes")],
    *[(name, (lambda n: lambda v: sim.trace_ids("/nonexistent", **{n: v}))(name), UNSIGNED)
      for name in ("layers", "experts", "top_k", "skip_steps")],
    *[(name, (lambda n: lambda v: sim.synth_ids(**{"steps": 2, "tokens_per_step": 1, n: v}))(name),
       UNSIGNED) for name in ("steps", "tokens_per_step", "seed", "shift_at")],
    *[(name, (lambda i: lambda v: sim.synth_ids(
        steps=2, tokens_per_step=1, shape=tuple(v if j == i else 2 for j in range(3))))(i),
       UNSIGNED) for i, name in enumerate(("layers", "experts", "top_k"))],
    *[(name, (lambda i: lambda v: sim.link_stall_us(*[v if j == i else 0 for j in range(3)]))(i),
       UNSIGNED) for i, name in enumerate(("read_bytes", "copies", "copy_bytes"))],
]

# The native GPU entry points (a `--features cuda` build): the ints are read before any device
# is touched, so these run without one.
GPU_CALLS = []
if tierkit._native.has_cuda_ops():
    n = tierkit._native
    COUNT = dict(device_index=0, stream=0, ids=0, dtype="int32", tokens=1, k=1, row_stride=1,
                 layer=0, counts=0, layers=1, experts=1, rejected=0, control=0)
    SLOTS = dict(device_index=0, stream=0, table=0, out=0, cells=1, experts=1, hbm=0,
                 slot_bytes=1, slots_per_layer=1)
    GPU_CALLS = [
        ("device_index", lambda v: n.warmup(v), UNSIGNED),
        *[(name, (lambda a: lambda v: n.count_topk(**{**COUNT, a: v}))(name), UNSIGNED)
          for name in COUNT if name != "dtype"],
        *[(name, (lambda a: lambda v: n.expert_slot_ids(**{**SLOTS, a: v}))(name), UNSIGNED)
          for name in SLOTS],
        ("device_index", lambda v: n.GpuExpertBank(MAP, v, 0), UNSIGNED),
        ("stream", lambda v: n.GpuExpertBank(MAP, 0, v), UNSIGNED),
        ("threads", lambda v: n.GpuExpertBank(MAP, 0, 0, threads=v), UNSIGNED),
        ("host[1] (data_ptr)", lambda v: n.GpuExpertBank(MAP, 0, 0, host=(None, v, 1, False)),
         UNSIGNED),
        ("slots[2] (bytes)", lambda v: n.GpuExpertBank(MAP, 0, 0, slots=(None, 0, v)), UNSIGNED),
        *[(name, (lambda i, a: lambda v: n.GpuKvPool(
            budget(), *[v if j == i else 1 for j in range(4)]))(i, name), UNSIGNED)
          for i, name in enumerate(("device_index", "stream", "max_sessions", "max_history"))],
        ("arena[1] (data_ptr)", lambda v: n.GpuKvPool(budget(), 0, 0, 1, 1, arena=(None, v, 1)),
         UNSIGNED),
    ]


def label(v):
    return str(v) if abs(v) < 2**32 else f"{'-' if v < 0 else ''}2^{abs(v).bit_length() - 1}"


def cases(table):
    return [pytest.param(name, call, v, id=f"{i}-{name}={label(v)}")
            for i, (name, call, values) in enumerate(table) for v in values]


@pytest.mark.parametrize("name, call, value", cases(CALLS))
def test_bad_int_is_a_value_error_naming_the_argument(name, call, value):
    with pytest.raises(ValueError) as e:
        call(value)
    assert name in str(e.value), str(e.value)


@pytest.mark.lab
@pytest.mark.parametrize("name, call, value", cases(LAB_CALLS))
def test_bad_int_of_a_lab_function_is_a_value_error_naming_it(name, call, value):
    with pytest.raises(ValueError) as e:
        call(value)
    assert name in str(e.value), str(e.value)


@pytest.mark.skipif(not GPU_CALLS, reason="tierkit built without CUDA ops (maturin --features cuda)")
@pytest.mark.parametrize("name, call, value", cases(GPU_CALLS))
def test_bad_int_of_a_gpu_entry_point_is_a_value_error_naming_it(name, call, value):
    with pytest.raises(ValueError) as e:
        call(value)
    assert name in str(e.value), str(e.value)


def test_the_range_is_named_and_non_ints_are_type_errors():
    with pytest.raises(ValueError, match=r"layers = -1 .*0\.\.=4294967295 \(uint32\)"):
        experts.Geometry(-1, 8, 2)
    with pytest.raises(ValueError, match=r"budget_bytes = .*digits"):
        kv.Geometry.for_hbm_budget(10**60, 32, 2, 4, 8, 4)
    with pytest.raises(TypeError, match="layers must be an int, not float"):
        experts.Geometry(2.0, 8, 2)
    with pytest.raises(TypeError, match="hot_sets\\[0\\] must be a sequence of ints"):
        experts.ResidencyMap.from_hot_sets("m", G, ["ab", [0, 1]])
    # Ints from numpy are ints; bools are not (a `True` where a count or id goes is a slip).
    assert experts.Geometry(np.int64(2), np.uint32(8), 1).hot_per_layer == 1
    for call in (lambda: experts.Geometry(2, 8, True), lambda: kv_geometry(layers=True),
                 lambda: pool().resolve([True], [0, 1], [20], TOPK),
                 lambda: MAP.is_hot(False, 0), lambda: counters().record(0, np.True_)):
        with pytest.raises(TypeError, match="must be an int, not"):
            call()
    assert pool().committed_len(np.uint64(7)) == 20
