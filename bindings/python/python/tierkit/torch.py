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
  valid_count, plan, plan_count, stats, planes, layer, packed, query_seq_lens,
  block_positions=0)``: the fused KV
  resolve into caller-owned outputs (``KvPool.resolve``); ``kv_replay(pool, plan, plan_count,
  planes, sessions, layer0, layers)`` copies its misses into other layers (``KvPool.replay``).
  ``planes`` (``KvPool.planes``) is declared mutated: the ops write the arena, and torch.compile
  then keeps reads of the planes after them.

Host objects: ``DeviceCounters`` (device tables the controller drains), ``ExpertBank`` (the GPU
expert bank, an executor for ``tierkit.experts.Controller``), ``KvPool`` (the GPU elastic KV
pool). Their host methods that synchronise or change tier state raise ``RuntimeError`` while the
current stream is capturing a CUDA graph. Bad input raises ``TypeError`` (dtype, not a tensor) or
``ValueError`` (shape, device, stride, alignment); a closed object ``tierkit.ClosedError``.

Memory views (``ExpertBank.table / .host / .slots``, ``KvPool.arena``) are CUDA tensors over
tierkit's memory through ``__cuda_array_interface__`` (the host store is mapped pinned memory:
its device address is readable in place by kernels, UVA). A view keeps the memory: ``close()``
marks the object closed, and the memory is freed (after a device synchronize) once the object and
every view are gone. Captured CUDA graphs hold no reference: destroy them before ``close()``.
``is_tierkit_pinned(t)`` says whether a tensor lies in tierkit's pinned memory (``is_pinned()``
does not see mapped or registered host memory). Nothing here starts a thread; every live object
is closed at interpreter exit.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from tierkit import _native

if not getattr(_native, "has_cuda_ops", lambda: False)():
    raise ImportError(
        "tierkit.torch: this tierkit was built without CUDA ops (build the wheel with "
        "`maturin build --release --features cuda`); the CPU API (tierkit.experts, tierkit.kv) "
        "takes CPU torch tensors"
    )

if importlib.util.find_spec("torch") is None:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tierkit.torch needs PyTorch (pip install torch); the CPU API (tierkit.experts, "
        "tierkit.kv) works without it"
    )


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
from tierkit._gpu.checks import warmup  # noqa: E402
from tierkit._gpu.memory import device_ranges, is_tierkit_pinned, pinned_ranges  # noqa: E402
from tierkit._gpu.objects import DeviceCounters, ExpertBank, KvPool  # noqa: E402
from tierkit._gpu.ops import count_topk, expert_slot_ids, kv_replay, kv_resolve  # noqa: E402

__all__ = [
    "DeviceCounters",
    "ExpertBank",
    "KvPool",
    "count_topk",
    "device_ranges",
    "expert_slot_ids",
    "is_tierkit_pinned",
    "kv_replay",
    "kv_resolve",
    "pinned_ranges",
    "warmup",
]

# keep the names of the CPU API at hand for engines importing only this module
Geometry = _experts.Geometry
KvGeometry = _kv.Geometry
