"""Shared set-up of the tierkit.torch GPU tests (test_torch_gpu.py, test_torch_gpu_kv.py): the
skips (each test skipped on its own, with the first missing piece as the reason: torch, CUDA ops,
a device, the test hooks) and the helpers both use. Not a test module."""

import numpy as np
import pytest

import tierkit
from tierkit import experts, kv

try:
    import torch
except ImportError as e:  # each test below is skipped with this reason (counted once per test)
    torch, NO_TORCH = None, f"tierkit.torch tests need PyTorch ({e})"
else:
    NO_TORCH = None

if torch is None:
    # Stand-ins for the module-level uses of torch (parametrize values): never run.
    class _NoTorch:
        def __getattr__(self, name):
            return name

    torch, tt, NOT_HERE = _NoTorch(), None, NO_TORCH
elif not tierkit._native.has_cuda_ops():
    tt, NOT_HERE = None, "tierkit built without CUDA ops (maturin --features cuda)"
else:
    import tierkit.torch as tt

    NOT_HERE = None if torch.cuda.is_available() else "no CUDA device"

if NOT_HERE is not None and tt is None:
    pytestmark = pytest.mark.skip(reason=NOT_HERE)

needs_gpu = pytest.mark.skipif(NOT_HERE is not None, reason=str(NOT_HERE))
needs_test_hooks = pytest.mark.skipif(
    not tierkit._native.has_test_hooks(),
    reason="needs KvPool(settle_readers=True): tierkit built without --features test-hooks",
)

LAYERS, EXPERTS, HOT, TOP_K = 3, 16, 4, 2


def cpu_counts(ids: np.ndarray, layer: int, counts: np.ndarray, valid_tokens=None, enabled=True):
    """The Rust API's count of one layer (tierkit.experts.PickCounters on the valid ids) plus
    the rejected picks, under the controls."""
    if not enabled:
        return 0
    rows = ids if valid_tokens is None else ids[:valid_tokens]
    ok = (rows >= 0) & (rows < EXPERTS)
    pc = experts.PickCounters(experts.Geometry(LAYERS, EXPERTS, HOT))
    for e in rows[ok].ravel():
        pc.record(layer, int(e))
    counts += pc.snapshot().astype(np.int64)
    return int((~ok).sum())


ROW, KV_LAYERS, K = 64, 2, 16


def token(s, t):
    return np.repeat((s * 31 + t * 7 + np.arange(KV_LAYERS)) % 256, ROW).astype(np.uint8)


def kv_geometry(layer_groups="one"):
    # the tests below resolve layer 0's picks for every layer: one layer group
    return kv.Geometry.for_hbm_budget(96 << 10, ROW, KV_LAYERS, 16, 32, 16, layer_groups=layer_groups)


def small_kv_pool():
    """A two-session pool with session 1 admitted (40 tokens) and one step's resolve arguments
    for it: ``topk [1, K]`` (zeros), ``query_start_loc``, ``seq_lens``, ``session_slot``,
    ``indices [K]``, ``valid_count [1]``."""
    pool = tt.KvPool(kv_geometry(), max_sessions=2, max_history=256)
    pool.admit(1, np.concatenate([token(1, t) for t in range(40)]))
    i32 = dict(dtype=torch.int32, device="cuda")
    topk, qsl = torch.zeros((1, K), **i32), torch.tensor([0, 1], **i32)
    seq, slot = torch.tensor([40], **i32), torch.tensor([pool.slot_of(1)], **i32)
    return pool, (topk, qsl, seq, slot, torch.zeros(K, **i32), torch.zeros(1, **i32))
