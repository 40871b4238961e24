"""Trace-driven MoE decode on one GPU: tierkit against what an engine author would use instead, at
equal HBM for experts (issue 27, items 2-5; groundwork of 4 and 6).

What one decode step is here: ``layers`` × (the dense part: RMSNorm, the attention projections
as two HBM GEMMs of the model's real sizes — QKV ``[q + 2·kv (+ gate), hidden]`` and O ``[hidden,
q]``; attention itself, the KV cache and the embedding / LM head are left out — then the router
GEMM ``[experts, hidden]``, the MoE layer, the shared experts if any), bf16, batch ``B`` tokens.
The router's top-k ids are **replayed from a routing trace** (its logits only weight the picked
experts: softmax over the picked logits), so every alternative sees the same routing. Experts
are SwiGLU: one blob per expert, gate+up ``[2F, H]`` then down ``[H, F]`` (bf16,
``6·H·F`` bytes).

**The MoE kernel** (all GPU alternatives run the same one): the step's (token, expert) pairs are
sorted by expert with torch ops (capturable), then two Triton kernels — gate+up with SwiGLU, then
down times the routing weight — run one program per (active expert, column tile); each program
loads its expert's address from a per-layer **table of addresses** (``int64 [experts]``: an HBM
slot, the expert's place in the pinned host copy read in place over PCIe, or 0 = not on the GPU)
and reads the weights through it. One captured graph therefore serves every placement: tables
change between (or, for the shared bank, inside) replays, not the graph. Per-pair outputs are
summed over top-k in a fixed order (no atomics), so two runs whose tables point at equal bytes
give bit-identical outputs.

**The alternatives** (equal HBM for experts: ``budget`` × all expert bytes; each built from the
public description only, no engine code; ``docs/experts.md`` says what was kept and simplified):

- ``all-hbm``: every expert in HBM, the ceiling every ratio divides by (not an alternative at
  equal HBM).
- ``layer-uva`` (vLLM ``cpu_offload_gb``): whole layers' experts stay in pinned host memory and
  are read in place by the same kernel (UVA); the first layers are offloaded (vLLM offloads
  modules in order until the byte budget is met), ``floor(budget × layers)`` layers stay in HBM.
- ``shared-bank`` (vLLM PR #56177, ``--moe-expert-pool-rows``): one bank of ``floor(budget ×
  layers × experts)`` rows shared by every MoE layer; inside the captured graph, before each
  layer's GEMMs, a device-side LRU planner (torch ops) marks hits, picks the least recently used
  rows not used by this layer as victims, copies each missing expert from pinned host memory into
  its row with a fixed-grid copy kernel, and rewrites the remap; the grouped GEMM reads through the
  remap. When the layer's working set exceeds the bank (a wide batch), misses are read in place
  from the host view instead (the PR's bank + host-view path). Simplified: one LRU stamp per
  (layer, step); no NVFP4; no prefetch.
- ``cpu-cold`` (KTransformers): the ``floor(budget × experts)`` most-picked experts of each layer
  (ranked on the profile window) on the GPU, the rest computed by the CPU every step (torch bf16 on
  every core, from the same pinned host copy) while the GPU computes the hot ones; the CPU's
  per-token sums come back and are added. The step is split per layer into graphs with the host
  in between (KTransformers also syncs CPU and GPU per layer): graph A1 (dense part, router, the
  MoE input and routing weights copied to pinned host memory), graph A2 (hot experts), the host
  waits for A1's copy, computes the cold experts, then graph B (the CPU's sums copied in, added).
- ``tierkit`` (the library's default, one configuration for every cell): a
  ``tierkit.torch.ExpertBank`` over the same pinned host copy (engine-owned memory) with
  ``hot = floor(budget × experts) − 1`` experts per layer in HBM plus the bank's one spare slot
  per layer (so its HBM equals the others'), booted from ``fit_seed_map`` on the profile window,
  the default ``Controller`` config (cost-aware policy, adaptive cadence); picks counted on the
  GPU inside the graph (``DeviceCounters.record``), drained and decided between steps
  (``ExpertBank.step``), swaps copied on the bank's stream and flipped into its table, which the
  kernel reads directly; cold experts read in place. ``--tierkit-mode`` names the engine mode:
  ``in-place`` (the above), ``copy-on-miss`` (half of a layer's slots, less the bank's spare, as
  staging rows that misses admitted by tierkit's controller are copied into inside the graph,
  read from HBM in the same step) and ``auto``
  (the default: one of the two per cell, priced on the profile window by the link model);
  ``moe_tierkit.py`` describes them. The CPU channel would plug in as another mode.

**Host work and the graph**: the whole GPU step (every layer) is one CUDA graph for all GPU
alternatives; tierkit's drain + decide runs on the host between graph launches (at the start of
the next step, timed with it); cpu-cold's CPU compute runs between its per-layer graphs. Step
time = wall time from the step's host work to the stream's completion (a decode engine syncs
each step to sample).

**Routing and batches**: ``--trace`` reads any trace the replay CLI reads
(``tierkit.sim.trace_ids``); shapes without a real trace get one from the lab's generator
(``tierkit.sim.synth_ids``: OLMoE's calibrated popularity, or Zipf popularity at the shape, with
the stated skew and reuse), generated with as many token streams as the batch. A trace with
fewer streams than the batch (the Mixtral logs: one token per step) is reused at offsets: row
``b`` reads stream ``b mod T`` from step ``(b div T) × stride``; the JSON states how correlated
that makes the batch (``touched`` experts per layer against a batch of independent rows drawn at
random steps). Steps ``[0, profile)`` are the profile window (counted, never run); each run then
executes ``warmup`` steps and times ``steps`` steps; a run starts from fresh state.

**Exactness** (``--check``): every GPU alternative's step outputs equal all-HBM's bit for bit
(same kernel, same bytes); ``cpu-cold`` within bf16 tolerance (relative L2 error of the step
output ≤ ``--tol``, default 2e-2: bf16 keeps 8 significant bits, the CPU sums its experts in
another order), and the all-HBM Triton path matches a float32 torch reference within the same
tolerance.

**Why Python**: torch and Triton give a well-kept bf16 grouped GEMM, CUDA graph capture and the
CPU FFN path (oneDNN bf16), none of which is tierkit's core; the library is used through its
wheel exactly as an engine would (``tierkit.torch``, ``tierkit.experts``), and traces come from
the lab through ``tierkit.sim``.

Without a GPU (``--device cpu``) the same code runs as a reference on tiny shapes: the model,
the planners, the controller (with a ``NullExecutor``), the CPU expert path, all on CPU tensors,
the kernels replaced by a torch reference that reads weights through the same address tables.

    python benches/python/moe_decode.py --quick                       # reduced matrix
    python benches/python/moe_decode.py --check --shapes olmoe --layers 2
    python benches/python/moe_decode.py --shapes mixtral --trace ../shared/data/moe/mixtral-decode \\
        --layers 4 --batches 1,8 --budgets 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

import moe_tierkit

BF16 = torch.bfloat16
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


# ----------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """A MoE model's decode shapes. ``q_dim``/``kv_dim``: attention projection widths (QKV is
    ``[q + 2·kv + gate, hidden]``, O is ``[hidden, q]``); ``shared``: shared experts of width
    ``shared_ffn`` (in HBM, every token); ``trace``: default routing source (``mixtral`` = the
    Mixtral decode logs, ``olmoe`` = the OLMoE calibrated generator, ``zipf`` = Zipf popularity
    with exponent ``zipf``); ``reuse``: previous-step reuse of generated traces."""

    name: str
    layers: int
    experts: int
    top_k: int
    hidden: int
    ffn: int
    q_dim: int
    kv_dim: int
    gate_dim: int = 0
    shared: int = 0
    shared_ffn: int = 0
    trace: str = "zipf"
    zipf: float = 0.5
    reuse: float = 0.37

    @property
    def expert_bytes(self) -> int:
        return 2 * 3 * self.hidden * self.ffn

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim + self.gate_dim

    def summary(self) -> dict:
        d = asdict(self)
        d["expert_mb"] = round(self.expert_bytes / 1e6, 2)
        d["expert_gb_total"] = round(self.expert_bytes * self.layers * self.experts / 1e9, 2)
        d["dense_mb_per_layer"] = round(
            2 * self.hidden * (self.qkv_dim + self.q_dim + self.experts) / 1e6, 1)
        return d


SHAPES = {
    # Mixtral-8x7B: 32 heads × 128, 8 KV heads; routing from the real decode logs.
    "mixtral": Shape("mixtral", 32, 8, 2, 4096, 14336, 4096, 1024, trace="mixtral", zipf=0.1),
    # OLMoE-1B-7B: 16 heads × 128 (no GQA); routing from the OLMoE-calibrated generator.
    "olmoe": Shape("olmoe", 16, 64, 8, 2048, 1024, 2048, 2048, trace="olmoe"),
    # Qwen3-30B-A3B: 32 heads × 128, 4 KV heads; no public per-token trace: Zipf 0.5 (weak skew,
    # the model trains with global-batch load balancing), Mixtral's reuse 0.37.
    "qwen3": Shape("qwen3", 48, 128, 8, 2048, 768, 4096, 512, trace="zipf", zipf=0.5),
    # 512 experts top-10 at Qwen3-Next-80B-A3B's widths (hidden 2048, expert FFN 512, one shared
    # expert of 512; gated attention 16 × 256 plus its gate, 2 KV heads × 256), routing the lab's
    # wide-reuse scenario (Zipf 0.5, reuse 0.6). 24 layers, not 48: the experts (77 GB) fit HBM
    # beside a 75% bank (58 GB) on the 141 GB H200, and the pinned host copy fits its 128 GiB host.
    "e512": Shape("e512", 24, 512, 10, 2048, 512, 4096, 512, gate_dim=4096, shared=1,
                  shared_ffn=512, trace="zipf", zipf=0.5, reuse=0.6),
}


# ----------------------------------------------------------------------------------- routing


def trace_path(shape: Shape, traces) -> str | None:
    """The ``--trace`` for ``shape``: a ``SHAPE=PATH`` entry naming it, else a plain path."""
    plain = None
    for t in traces or []:
        name, sep, rest = t.partition("=")
        if sep and (name in SHAPES or name == "custom"):
            if name == shape.name:
                return rest
        else:
            plain = t
    return plain


def load_trace(shape: Shape, args, tokens: int, steps: int) -> dict:
    """The routing trace for ``shape``: ``--trace`` (any format the replay CLI reads), else the
    shape's default source; a generated one has ``tokens`` streams and ``steps`` steps."""
    from tierkit import sim

    path = trace_path(shape, args.trace)
    if path is None and shape.trace == "mixtral":
        default = os.path.join(REPO, "..", "shared", "data", "moe", "mixtral-decode")
        if os.path.isdir(default):
            path = default
        else:
            print(f"NOTE: no Mixtral trace at {default} (pass --trace): Zipf {shape.zipf} "
                  f"routing generated instead", file=sys.stderr)
    if path is not None:
        t = sim.trace_ids(path)
        t["source"] = f"trace {path}"
    elif shape.trace == "olmoe" and shape.experts == 64 and shape.top_k == 8:
        t = sim.synth_ids(steps=steps, tokens_per_step=tokens, reuse=shape.reuse, seed=args.seed)
        t["source"] = "lab generator: OLMoE github popularity (routing counts), reuse %.2f" % shape.reuse
    else:
        t = sim.synth_ids(steps=steps, tokens_per_step=tokens,
                          shape=(shape.layers, shape.experts, shape.top_k), zipf=shape.zipf,
                          reuse=shape.reuse, seed=args.seed)
        t["source"] = "lab generator: Zipf %.2f popularity, reuse %.2f" % (shape.zipf, shape.reuse)
    if t["experts_per_layer"] != shape.experts or t["top_k"] != shape.top_k:
        raise SystemExit(f"trace {t['name']} is {t['experts_per_layer']} experts top-"
                         f"{t['top_k']}, shape {shape.name} is {shape.experts} top-{shape.top_k}")
    if t["layers"] < shape.layers:
        raise SystemExit(f"trace {t['name']} has {t['layers']} layers, shape {shape.name} "
                         f"{shape.layers}: pass --layers {t['layers']} or fewer")
    return t


def compose_batch(ids: np.ndarray, batch: int, steps: int) -> tuple[np.ndarray, dict]:
    """``ids int32 [S, L, T, k]`` (a trace) → ``int64 [steps, L, batch, k]``: row ``b`` follows
    stream ``b mod T`` from step ``(b div T) × stride`` (``stride = S div ceil(batch / T)``),
    wrapping at the trace's end. A missing row (a ``-1``; the Mixtral logs lack a few (token,
    layer) rows) takes the row's previous step's ids (``0..k-1`` at its first step)."""
    S, L, T, k = ids.shape
    copies = -(-batch // T)
    stride = max(S // copies, 1)
    out = np.empty((steps, L, batch, k), dtype=np.int64)
    for b in range(batch):
        t, off = b % T, (b // T) * stride
        out[:, :, b, :] = ids[(off + np.arange(steps)) % S, :, t, :]
    for s in range(steps):
        bad = (out[s] < 0).any(axis=-1)  # [L, batch]
        if bad.any():
            out[s][bad] = out[s - 1][bad] if s > 0 else np.arange(k)
    info = {"streams": T, "trace_steps": S, "stride": stride if copies > 1 else 0,
            "rows_per_stream": copies, "wraps": steps > S - (copies - 1) * stride}
    return out, info


def touched(ids: np.ndarray, experts: int) -> float:
    """Mean distinct experts per (step, layer) of ``ids [steps, L, B, k]``."""
    n, L = ids.shape[:2]
    m = np.zeros((n, L, experts), dtype=bool)
    np.put_along_axis(m, ids.reshape(n, L, -1), True, axis=2)
    return float(m.sum(axis=2).mean())


def correlation(trace: np.ndarray, batch_ids: np.ndarray, experts: int, seed: int) -> dict:
    """How correlated the composed batch is: its mean touched experts per layer against a batch
    of the same size whose rows are independent (each row at a random step and stream)."""
    S, L, T, k = trace.shape
    n = min(len(batch_ids), 64)
    rng = np.random.default_rng(seed)
    B = batch_ids.shape[2]
    ind = trace[rng.integers(0, S, (n, B)), :, rng.integers(0, T, (n, B)), :]  # [n, B, L, k]
    ind = np.where(ind < 0, np.arange(k), ind).transpose(0, 2, 1, 3)
    return {"touched_per_layer": round(touched(batch_ids[:n], experts), 2),
            "touched_independent_rows": round(touched(ind, experts), 2)}


# ----------------------------------------------------------------------------------- weights


TORCH_PINNED_MAX = 48 << 30


def alloc_host(nbytes: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """A CPU ``uint8 [nbytes]`` tensor; with a GPU, page-locked and mapped, so kernels read it in
    place at its own address (UVA). Up to ``TORCH_PINNED_MAX`` from torch's pinned allocator
    (``is_pinned()``: tierkit's bank uses it as it is; torch may round the size up to a power of
    two), above that registered here (``cudaHostRegister``, portable | mapped; returns True)."""
    if device.type != "cuda":
        return torch.empty(nbytes, dtype=torch.uint8), False
    if nbytes <= TORCH_PINNED_MAX:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), False
    t = torch.empty(nbytes, dtype=torch.uint8)
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 3))
    return t, True


class Model:
    """Weights of one shape: every expert in the host copy (``host``, ``uint8 [L, E, bytes]``)
    and in the all-HBM copy (``hbm``; on CPU a second CPU tensor standing in for it), the dense
    weights in HBM. Addresses of both copies, and of the banks the alternatives register, resolve
    back to tensors (``resolve``) for the torch reference."""

    def __init__(self, shape: Shape, device: torch.device, seed: int):
        self.shape, self.device = shape, device
        L, E, H, Fw, nb = shape.layers, shape.experts, shape.hidden, shape.ffn, shape.expert_bytes
        self.nbytes = nb
        host, self.registered = alloc_host(L * E * nb, device)
        self.host = host.view(L, E, nb)
        self.hbm = torch.empty((L, E, nb), dtype=torch.uint8, device=device)
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        for layer in range(L):
            w = self.hbm[layer].view(BF16).view(E, -1)
            w.normal_(generator=g)
            w[:, : 2 * Fw * H].mul_(H ** -0.5)
            w[:, 2 * Fw * H:].mul_(Fw ** -0.5)
            self.host[layer].copy_(self.hbm[layer], non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

        def dense(*size, fan_in):
            return (torch.randn(size, generator=g, device=device, dtype=torch.float32)
                    * fan_in ** -0.5).to(BF16)

        self.wqkv = dense(L, shape.qkv_dim, H, fan_in=H)
        self.wo = dense(L, H, shape.q_dim, fan_in=shape.q_dim)
        self.wr = dense(L, E, H, fan_in=H)
        self.shared = None
        if shape.shared:
            S, Fs = shape.shared, shape.shared_ffn
            self.shared = [(dense(L, S, 2 * Fs, H, fan_in=H), dense(L, S, H, Fs, fan_in=Fs))]
        self.regions: list[tuple[int, int, torch.Tensor]] = []
        self.register(self.host)
        self.register(self.hbm)
        self.host_lo = self.host.data_ptr()
        self.host_hi = self.host_lo + L * E * nb

    def register(self, t: torch.Tensor) -> None:
        """Makes ``t``'s addresses resolvable by ``resolve``."""
        self.regions.append((t.data_ptr(), t.numel() * t.element_size(), t.view(-1).view(torch.uint8)))

    def unregister(self, t: torch.Tensor) -> None:
        self.regions = [r for r in self.regions if r[0] != t.data_ptr()]

    def resolve(self, addr: int) -> torch.Tensor:
        """The expert blob (``uint8 [bytes]``) at address ``addr`` of a registered tensor."""
        for base, size, flat in self.regions:
            if base <= addr and addr + self.nbytes <= base + size:
                return flat[addr - base: addr - base + self.nbytes]
        raise ValueError(f"address {addr:#x} lies in no registered tensor")

    def addr(self, where: str, layer, expert) -> int:
        t = self.host if where == "host" else self.hbm
        return t.data_ptr() + (layer * self.shape.experts + expert) * self.nbytes

    def table(self, where) -> torch.Tensor:
        """``int64 [L, E]`` addresses; ``where(layer, expert)`` says ``hbm``, ``host`` or ``None``
        (0: not on the GPU)."""
        L, E = self.shape.layers, self.shape.experts
        t = [[0] * E for _ in range(L)]
        for layer in range(L):
            for e in range(E):
                w = where(layer, e)
                if w is not None:
                    t[layer][e] = self.addr(w, layer, e)
        return torch.tensor(t, dtype=torch.int64, device=self.device)

    def unpin(self) -> None:
        """Ends this script's registration of the host copy (a tierkit bank then registers it
        for its life: tierkit refuses memory registered by someone else that ``is_pinned()`` does
        not report)."""
        if self.registered:
            torch.cuda.synchronize(self.device)
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr()))
            self.registered = False

    def repin(self) -> None:
        if not self.registered and self.device.type == "cuda" and not self.host.is_pinned():
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(
                self.host.data_ptr(), self.host.numel(), 3))
            self.registered = True

    def close(self) -> None:
        self.unpin()


def expert_views(blob: torch.Tensor, hidden: int, ffn: int):
    """(gate+up ``[2F, H]``, down ``[H, F]``) bf16 views of one expert blob."""
    w = blob.view(BF16)
    return w[: 2 * ffn * hidden].view(2 * ffn, hidden), w[2 * ffn * hidden:].view(hidden, ffn)


def rms(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(BF16)


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert's FFN in the input's dtype (torch: cuBLAS on the GPU, oneDNN on the CPU)."""
    g, u = F.linear(x, w13).chunk(2, dim=-1)
    return F.linear(F.silu(g) * u, w2)


# ----------------------------------------------------------------------------------- kernels

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU reference path needs no Triton
    triton = None

# Triton's CPU interpreter (TRITON_INTERPRET=1, the kernels' test here) computes a bf16 tl.dot
# wrongly: there the operands are widened to float32 first (same products, exact in float32).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

if triton is not None:

    @triton.jit
    def _dot(a, b, acc, WIDEN: tl.constexpr):
        if WIDEN:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        return tl.dot(a, b, acc)

    @triton.jit
    def _active(slot_e_ptr, slot_start_ptr, slot_cnt_ptr, table_ptr):
        """This program's active expert (axis 1): its weights' address (0: no expert in this
        slot, or the table says not on the GPU) and its pairs' range in sorted order."""
        a = tl.program_id(1)
        e = tl.load(slot_e_ptr + a)
        addr = tl.load(table_ptr + tl.maximum(e, 0))
        addr = tl.where(e < 0, 0, addr)
        return addr, tl.load(slot_start_ptr + a), tl.load(slot_cnt_ptr + a)

    @triton.jit
    def _moe_gate_up(x_ptr, table_ptr, act_ptr, slot_e_ptr, slot_start_ptr, slot_cnt_ptr,
                     pair_tok_ptr, H, Fw, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     WIDEN: tl.constexpr):
        """act[pair, n-tile] = silu(x W_gate^T) * (x W_up^T) for the pairs of one active expert,
        its weights at ``table[e]`` (0: skipped)."""
        pid_n = tl.program_id(0)
        addr, start, cnt = _active(slot_e_ptr, slot_start_ptr, slot_cnt_ptr, table_ptr)
        if addr == 0:
            return
        w = addr.to(tl.pointer_type(tl.bfloat16))
        rows = tl.arange(0, BM)
        rmask = rows < cnt
        tok = tl.load(pair_tok_ptr + start + rows, mask=rmask, other=0)
        cols = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
        cmask = cols < Fw
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, H, BK):
            ks = k0 + tl.arange(0, BK)
            kmask = ks < H
            xt = tl.load(x_ptr + tok[:, None] * H + ks[None, :],
                         mask=rmask[:, None] & kmask[None, :], other=0.0)
            wmask = kmask[:, None] & cmask[None, :]
            wg = tl.load(w + cols[None, :] * H + ks[:, None], mask=wmask, other=0.0)
            wu = tl.load(w + (cols[None, :] + Fw) * H + ks[:, None], mask=wmask, other=0.0)
            acc_g = _dot(xt, wg, acc_g, WIDEN)
            acc_u = _dot(xt, wu, acc_u, WIDEN)
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        dst = act_ptr + (start + rows).to(tl.int64)[:, None] * Fw + cols[None, :]
        tl.store(dst, act.to(tl.bfloat16), mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def _moe_down(act_ptr, table_ptr, out_ptr, slot_e_ptr, slot_start_ptr, slot_cnt_ptr,
                  pair_id_ptr, pair_w_ptr, H, Fw, down_off, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, WIDEN: tl.constexpr):
        """out[pair, n-tile] = (act W_down^T) × routing weight (float32), one active expert."""
        pid_n = tl.program_id(0)
        addr, start, cnt = _active(slot_e_ptr, slot_start_ptr, slot_cnt_ptr, table_ptr)
        if addr == 0:
            return
        w = addr.to(tl.pointer_type(tl.bfloat16)) + down_off
        rows = tl.arange(0, BM)
        rmask = rows < cnt
        cols = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
        cmask = cols < H
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        arow = (start + rows).to(tl.int64)
        for k0 in range(0, Fw, BK):
            ks = k0 + tl.arange(0, BK)
            kmask = ks < Fw
            at = tl.load(act_ptr + arow[:, None] * Fw + ks[None, :],
                         mask=rmask[:, None] & kmask[None, :], other=0.0)
            wt = tl.load(w + cols[None, :] * Fw + ks[:, None],
                         mask=kmask[:, None] & cmask[None, :], other=0.0)
            acc = _dot(at, wt, acc, WIDEN)
        pw = tl.load(pair_w_ptr + start + rows, mask=rmask, other=0.0)
        pid = tl.load(pair_id_ptr + start + rows, mask=rmask, other=0)
        dst = out_ptr + pid[:, None] * H + cols[None, :]
        tl.store(dst, acc * pw[:, None], mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def _copy_rows(src_ptr, dst_ptr, ok_ptr, n_words, BLOCK: tl.constexpr, PROGS: tl.constexpr):
        """Copies ``n_words`` int64 words from ``src[i]`` to ``dst[i]`` (addresses) where
        ``ok[i]``; a fixed grid ``(PROGS, rows)``, idle programs return at once."""
        c = tl.program_id(0)
        i = tl.program_id(1)
        if tl.load(ok_ptr + i) == 0:
            return
        src = tl.load(src_ptr + i).to(tl.pointer_type(tl.int64))
        dst = tl.load(dst_ptr + i).to(tl.pointer_type(tl.int64))
        for off in range(c * BLOCK, n_words, PROGS * BLOCK):
            idx = off + tl.arange(0, BLOCK)
            m = idx < n_words
            tl.store(dst + idx, tl.load(src + idx, mask=m), mask=m)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ----------------------------------------------------------------------------------- the step


def align(ids_l: torch.Tensor, experts: int):
    """The pairs of one layer (``ids_l int64 [B, k]``) grouped by expert with torch ops (no host
    sync: capturable). Returns ``slot_e [A]`` (active experts ascending, -1 padding; ``A =
    min(E, B·k)``), ``slot_start``, ``slot_cnt`` (their pair ranges in sorted order), ``pair_id``
    (sorted position → pair ``b·k + j``) and ``pair_tok`` (→ token ``b``)."""
    flat = ids_l.reshape(-1)
    P = flat.numel()
    A = min(experts, P)
    sorted_e, order = torch.sort(flat, stable=True)
    first = torch.ones(P, dtype=torch.bool, device=flat.device)
    first[1:] = sorted_e[1:] != sorted_e[:-1]
    slot = torch.cumsum(first, 0, dtype=torch.int64) - 1
    slot_e = torch.full((A,), -1, dtype=torch.int64, device=flat.device).scatter_(0, slot, sorted_e)
    pos = torch.arange(P, dtype=torch.int64, device=flat.device)
    slot_start = torch.full((A,), P, dtype=torch.int64, device=flat.device).scatter_reduce_(
        0, slot, pos, "amin")
    slot_cnt = torch.zeros(A, dtype=torch.int64, device=flat.device).scatter_add_(
        0, slot, torch.ones_like(pos))
    return slot_e, slot_start, slot_cnt, order, order // ids_l.shape[1]


class Buffers:
    """Per-engine scratch of the MoE layer (reused by every layer, sequential on one stream)."""

    def __init__(self, shape: Shape, batch: int, device):
        P = batch * shape.top_k
        self.act = torch.zeros((P, shape.ffn), dtype=BF16, device=device)
        self.out_pairs = torch.zeros((P, shape.hidden), dtype=torch.float32, device=device)


def moe_triton(model: Model, xn, w, ids_l, table_l, bufs: Buffers) -> torch.Tensor:
    """The MoE layer's pairs ``float32 [B·k, H]`` (weighted expert outputs; pairs whose expert
    has table address 0 stay zero) by the two Triton kernels."""
    s = model.shape
    slot_e, slot_start, slot_cnt, pair_id, pair_tok = align(ids_l, s.experts)
    pw = w.reshape(-1).index_select(0, pair_id)
    bufs.out_pairs.zero_()
    A = slot_e.numel()
    B = xn.shape[0]
    BM = max(16, next_pow2(B))  # one row block per expert: an expert has at most B pairs
    BN1, BN2, BK = (64, 64, 64) if BM <= 32 else (32, 32, 64)
    warps = 4 if BM <= 64 else 8
    _moe_gate_up[(triton.cdiv(s.ffn, BN1), A)](
        xn, table_l, bufs.act, slot_e, slot_start, slot_cnt, pair_tok, s.hidden, s.ffn,
        BM=BM, BN=BN1, BK=BK, WIDEN=INTERPRETED, num_warps=warps, num_stages=3)
    _moe_down[(triton.cdiv(s.hidden, BN2), A)](
        bufs.act, table_l, bufs.out_pairs, slot_e, slot_start, slot_cnt, pair_id, pw, s.hidden,
        s.ffn, 2 * s.ffn * s.hidden, BM=BM, BN=BN2, BK=BK, WIDEN=INTERPRETED, num_warps=warps,
        num_stages=3)
    return bufs.out_pairs


def moe_reference(model: Model, xn, w, ids_l, table_l, bufs: Buffers) -> torch.Tensor:
    """The same contract as ``moe_triton`` in float32 torch (any device): weights read through
    the table's addresses (``Model.resolve``), gate+up activations rounded to bf16 as the kernel
    stores them."""
    s = model.shape
    k = ids_l.shape[1]
    ids = ids_l.cpu().numpy()
    tab = table_l.cpu().tolist()
    out = bufs.out_pairs
    out.zero_()
    for e in np.unique(ids):
        if tab[e] == 0:
            continue
        rows, js = np.nonzero(ids == e)
        w13, w2 = expert_views(model.resolve(tab[e]).to(xn.device), s.hidden, s.ffn)
        r = torch.as_tensor(rows, device=xn.device)
        h = xn[r].float() @ w13.float().t()
        g, u = h[:, : s.ffn], h[:, s.ffn:]
        act = (g * torch.sigmoid(g) * u).to(BF16).float()
        pairs = torch.as_tensor(rows * k + js, device=xn.device)
        out[pairs] = (act @ w2.float().t()) * w[r, torch.as_tensor(js, device=xn.device)][:, None]
    return out


def copy_rows_torch(model: Model, src, dst, ok) -> None:
    """``_copy_rows`` on any device: blob copies between registered tensors (host-side loop)."""
    for a, b, o in zip(src.tolist(), dst.tolist(), ok.tolist()):
        if o:
            model.resolve(b).copy_(model.resolve(a))


def lru_plan(remap, rows_l, owner, last, now, hit, miss, M, base, sentinel, ar, cond=None):
    """One layer of a device-side LRU planner (torch ops, capturable; ``shared-bank`` and
    tierkit's ``copy-on-miss`` staging). ``rows_l int64 [E]``: the layer's view of ``remap``
    (its row or -1); ``owner`` / ``last`` ``int64 [R + 1]``: each row's id in ``remap`` and
    last-use stamp (index ``R`` a sentinel); ``hit`` / ``miss`` ``bool [E]``; ``now`` the stamp
    (``int64 [1]``). Hits are stamped, then up to ``M`` misses (lowest id first) take the least
    recently used rows not stamped ``now`` (and where ``cond``). Returns ``(gid, victim, ok)``:
    ids ``base + expert`` in ``remap``, rows, and which of the ``M`` pairs to copy."""
    R, E = last.numel() - 1, rows_l.numel()
    last.scatter_(0, torch.where(hit, rows_l, R), now.expand(E))
    miss_e = torch.argsort(torch.where(miss, ar, ar + E), stable=True)[:M]
    victim = torch.argsort(last[:R], stable=True)[:M]
    ok = miss.gather(0, miss_e) & (last.gather(0, victim) < now)
    if cond is not None:
        ok = ok & cond
    old = owner.gather(0, victim)
    remap.scatter_(0, torch.where(ok & (old >= 0), old, sentinel), -1)
    gid = base + miss_e
    remap.scatter_(0, torch.where(ok, gid, sentinel), victim)
    owner.scatter_(0, torch.where(ok, victim, R), gid)
    last.scatter_(0, torch.where(ok, victim, R), now.expand(M))
    return gid, victim, ok


def copy_planned(step, model: Model, src, dst, ok, M: int) -> torch.Tensor:
    """Copies the planned blobs (``src``/``dst`` ``int64 [M]`` addresses where ``ok``): the
    fixed-grid Triton kernel, or ``copy_rows_torch``. Returns the count (``int64`` device)."""
    okw = ok.to(torch.int32)
    if step.use_triton:
        nb = model.shape.expert_bytes
        _copy_rows[(64, M)](src, dst, okw, nb // 8, BLOCK=512, PROGS=64, num_warps=4)
    else:
        copy_rows_torch(model, src, dst, okw)
    return okw.sum()


class Step:
    """One decode step's torch code for an alternative: the dense part, the router, the table of
    the layer (the alternative's), the MoE kernel, the shared experts; ``triton`` picks the
    kernels (else ``moe_reference``)."""

    def __init__(self, model: Model, alt, batch: int, use_triton: bool):
        s, dev = model.shape, model.device
        self.model, self.alt, self.batch = model, alt, batch
        self.moe = moe_triton if use_triton else moe_reference
        self.use_triton = use_triton
        self.x_in = torch.zeros((batch, s.hidden), dtype=BF16, device=dev)
        self.ids = torch.zeros((s.layers, batch, s.top_k), dtype=torch.int64, device=dev)
        self.out = torch.zeros((batch, s.hidden), dtype=BF16, device=dev)
        self.bufs = Buffers(s, batch, dev)
        # host reads (experts read in place), CPU experts, per step summed
        self.acct = torch.zeros(2, dtype=torch.int64, device=dev)

    def attn_router(self, x, layer):
        m = self.model
        xn = rms(x)
        x = x + F.linear(F.linear(xn, m.wqkv[layer])[:, : m.shape.q_dim], m.wo[layer])
        xn = rms(x)
        logits = F.linear(xn, m.wr[layer]).float()
        w = torch.softmax(torch.gather(logits, 1, self.ids[layer]), dim=1)
        return x, xn, w

    def shared(self, xn, layer):
        m = self.model
        if m.shared is None:
            return None
        w13, w2 = m.shared[0]
        y = None
        for i in range(m.shape.shared):
            o = swiglu(xn, w13[layer, i], w2[layer, i])
            y = o if y is None else y + o
        return y

    def combine(self, x, xn, pairs, layer, extra=None):
        s = self.model.shape
        y = pairs.view(self.batch, s.top_k, s.hidden).sum(1)
        if extra is not None:
            y = y + extra
        x = x + y.to(BF16)
        sh = self.shared(xn, layer)
        return x if sh is None else x + sh

    def gpu_layer(self, x, layer):
        x, xn, w = self.attn_router(x, layer)
        ids_l = self.ids[layer]
        self.alt.count(layer, ids_l)
        table = self.alt.table(layer, ids_l, self)
        pairs = self.moe(self.model, xn, w, ids_l, table, self.bufs)
        return self.combine(x, xn, pairs, layer)

    def account(self):
        """Adds the step's experts read in place and computed by the CPU (distinct per layer) to
        ``acct``, from the tables the layers used (torch ops, inside the graph)."""
        m, s = self.model, self.model.shape
        need = torch.zeros((s.layers, s.experts), dtype=torch.bool, device=m.device)
        need.scatter_(1, self.ids.view(s.layers, -1), True)
        t = self.alt.used_tables()
        host = (t >= m.host_lo) & (t < m.host_hi)
        self.acct[0] += (need & host).sum()
        self.acct[1] += (need & (t == 0)).sum()

    def body(self):
        """The whole step on the GPU (every layer): what one graph captures."""
        x = self.x_in
        for layer in range(self.model.shape.layers):
            x = self.gpu_layer(x, layer)
        self.out.copy_(x)
        self.account()
        self.alt.end_step(self)


# ----------------------------------------------------------------------------------- alternatives


class Ctx:
    """What the alternatives of one (shape, batch) share: the model, the profile counts
    (``int64 [L, E]`` picks over the profile window), the step's stream."""

    def __init__(self, model: Model, profile: np.ndarray, batch: int, stream, tierkit_mode: str):
        self.model, self.profile, self.batch, self.stream = model, profile, batch, stream
        self.tierkit_mode = tierkit_mode


class Alternative:
    """A placement of the experts and how the step reads them. ``table(layer, ids, step)``
    returns the layer's ``int64 [E]`` addresses (may enqueue device work: it runs inside the
    graph); ``between_steps`` is host work before each step; ``segments`` is None for a step that
    is one graph."""

    name = "?"
    cpu_split = False

    def __init__(self, ctx: Ctx, budget: float):
        self.ctx, self.budget = ctx, budget
        s = ctx.model.shape
        self.slots_per_layer = int(budget * s.experts)
        self.tables = None

    def hbm_expert_bytes(self) -> int:
        raise NotImplementedError

    def reset(self):
        pass

    def count(self, layer, ids_l):
        pass

    def table(self, layer, ids_l, step):
        return self.tables[layer]

    def used_tables(self):
        return self.tables

    def end_step(self, step):
        pass

    def between_steps(self):
        pass

    def stats(self) -> dict:
        return {}

    def close(self):
        pass


class AllHbm(Alternative):
    name = "all-hbm"

    def __init__(self, ctx, budget=1.0):
        super().__init__(ctx, 1.0)
        self.tables = ctx.model.table(lambda l, e: "hbm")

    def hbm_expert_bytes(self):
        s = self.ctx.model.shape
        return s.layers * s.experts * s.expert_bytes


class LayerUva(Alternative):
    """vLLM ``cpu_offload_gb``: the first ``L - floor(budget × L)`` layers' experts in host memory,
    read in place; the rest in HBM."""

    name = "layer-uva"

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        s = ctx.model.shape
        self.hbm_layers = int(budget * s.layers)
        off = s.layers - self.hbm_layers
        self.tables = ctx.model.table(lambda l, e: "host" if l < off else "hbm")

    def hbm_expert_bytes(self):
        s = self.ctx.model.shape
        return self.hbm_layers * s.experts * s.expert_bytes

    def stats(self):
        return {"hbm_layers": self.hbm_layers}


def ranked_hot_sets(profile: np.ndarray, hot: int) -> list[list[int]]:
    """The ``hot`` most-picked experts of each layer of ``profile [L, E]`` (ties: lower id)."""
    return [sorted(np.argsort(-row, kind="stable")[:hot].tolist()) for row in profile]


class CpuCold(Alternative):
    """KTransformers: the ``floor(budget × E)`` most-picked experts of each layer (profile window)
    on the GPU, the rest computed by the CPU each step, overlapped with the GPU's hot experts."""

    name = "cpu-cold"
    cpu_split = True

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        s = ctx.model.shape
        self.hot = ranked_hot_sets(ctx.profile, self.slots_per_layer)
        hot_sets = [set(h) for h in self.hot]
        self.tables = ctx.model.table(lambda l, e: "hbm" if e in hot_sets[l] else None)
        self.cold_mask = np.ones((s.layers, s.experts), dtype=bool)
        for l, h in enumerate(self.hot):
            self.cold_mask[l, h] = False

    def hbm_expert_bytes(self):
        s = self.ctx.model.shape
        return s.layers * self.slots_per_layer * s.expert_bytes


class SharedBank(Alternative):
    """vLLM PR #56177: one bank of rows for every MoE layer, a device-side LRU planner and
    copy-on-miss inside the graph, the GEMM reading through the remap; misses read in place when
    the layer's working set exceeds the bank."""

    name = "shared-bank"

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        m, s = ctx.model, ctx.model.shape
        dev = m.device
        L, E = s.layers, s.experts
        self.rows = max(int(budget * L * E), 1)
        self.bank = torch.empty((self.rows, s.expert_bytes), dtype=torch.uint8, device=dev)
        m.register(self.bank)
        self.remap = torch.empty(L * E + 1, dtype=torch.int64, device=dev)  # + sentinel
        self.owner = torch.empty(self.rows + 1, dtype=torch.int64, device=dev)
        self.last = torch.empty(self.rows + 1, dtype=torch.int64, device=dev)
        self.stamp = torch.zeros(1, dtype=torch.int64, device=dev)
        self.copies = torch.zeros(1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros((L, E), dtype=torch.int64, device=dev)
        self.ar = torch.arange(E, dtype=torch.int64, device=dev)
        self.reset()

    def reset(self):
        self.remap.fill_(-1)
        self.owner.fill_(-1)
        self.last.fill_(0)
        self.stamp.zero_()
        self.copies.zero_()

    def hbm_expert_bytes(self):
        return self.rows * self.ctx.model.shape.expert_bytes

    def table(self, layer, ids_l, step):
        m, s = self.ctx.model, self.ctx.model.shape
        L, E, R, nb = s.layers, s.experts, self.rows, s.expert_bytes
        M = min(E, ids_l.numel(), R)
        need = torch.zeros(E, dtype=torch.bool, device=m.device).scatter_(0, ids_l.reshape(-1), True)
        now = self.stamp + (layer + 1)
        rows_l = self.remap[layer * E:(layer + 1) * E]
        gid, victim, ok = lru_plan(self.remap, rows_l, self.owner, self.last, now,
                                   need & (rows_l >= 0), need & (rows_l < 0), M, layer * E,
                                   L * E, self.ar, need.sum() <= R)
        self.copies += copy_planned(step, m, m.host_lo + gid * nb,
                                    self.bank.data_ptr() + victim * nb, ok, M)
        t = torch.where(rows_l >= 0, self.bank.data_ptr() + rows_l * nb,
                        m.host_lo + (layer * E + self.ar) * nb)
        self.tables[layer].copy_(t)
        return self.tables[layer]

    def end_step(self, step):
        self.stamp += self.ctx.model.shape.layers

    def stats(self):
        return {"bank_rows": self.rows, "copies": int(self.copies.item())}

    def close(self):
        self.ctx.model.unregister(self.bank)
        self.bank = None


class TierkitInPlace(Alternative):
    """tierkit's default engine today: a rowmap of hot experts in HBM (``ExpertBank``, one spare
    slot per layer counted in its HBM), cold experts read in place, picks counted in the graph,
    swaps decided between steps by ``expert_residency``'s default controller. On the CPU
    reference path: the same controller with a ``NullExecutor`` and tables rebuilt from its map."""

    name = "tierkit"
    mode = "in-place"

    def hot_slots(self):
        return max(self.slots_per_layer - 1, 1)

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        from tierkit import experts

        m, s = ctx.model, ctx.model.shape
        self.hot = self.hot_slots()
        self.geometry = experts.Geometry(s.layers, s.experts, self.hot, s.expert_bytes)
        self.seed_map = experts.fit_seed_map(f"{s.name}-profile", self.geometry, ctx.profile)
        self.gpu = m.device.type == "cuda"
        self.bank = self.counters = self.ctl = self.pc = None
        self.swaps = 0
        if self.gpu:
            import tierkit.torch as tt

            tt.warmup(m.device)
            if not m.host.is_pinned():
                m.unpin()  # the bank registers the host copy itself, for its life
            self.bank = tt.ExpertBank(self.seed_map, device=m.device, stream=ctx.stream,
                                      host=m.host.view(-1))
            if self.bank.layout["host_ptr"] != m.host_lo:
                raise RuntimeError("tierkit's bank does not read the engine's host copy in place")
            self.tables = self.bank.table
            self.counters = tt.DeviceCounters(self.geometry, device=m.device)
        self.reset()

    def reset(self):
        from tierkit import experts

        if self.gpu:
            # A fresh run: swaps the last run left in flight are dropped (a new controller below).
            self.bank.reload(self.seed_map, cancel_in_flight=True)
            self.counters.drain()  # forget counts of warm-up and capture runs
        self.ctl = experts.Controller(self.seed_map)
        self.pc = experts.PickCounters(self.geometry)
        self.null = None if self.gpu else experts.NullExecutor()
        if not self.gpu:
            self._tables_from(self.seed_map)

    def _tables_from(self, rmap):
        hot = [set(h) for h in rmap.hot_sets()]
        self.tables = self.ctx.model.table(lambda l, e: "hbm" if e in hot[l] else "host")

    def hbm_expert_bytes(self):
        return self.geometry.hbm_bytes  # hot slots and one spare per layer: the library's rule

    def count(self, layer, ids_l):
        if self.gpu:
            self.counters.record(layer, ids_l)
        else:
            self.pc.record_layer(layer, ids_l.numpy())

    def between_steps(self):
        if self.gpu:
            self.counters.drain_into(self.pc)
            self.bank.step(self.ctl, self.pc)
        else:
            self.ctl.step(self.pc, self.null)
            self._tables_from(self.ctl.map)

    def stats(self):
        st = self.ctl.stats
        out = {"hot_per_layer": self.hot, "swaps_applied": st.get("applied", 0),
               "swaps_planned": st.get("planned", 0), "mode": self.mode}
        if getattr(self, "auto", None):
            out["auto"] = self.auto
        return out

    def close(self):
        if self.gpu:
            self.tables = None
            self.bank.close()
            self.counters.close()
            self.bank = self.counters = None
            import gc

            gc.collect()  # the bank's registration of the host copy ends with its last view
            self.ctx.model.repin()


# The tierkit engine modes (moe_tierkit.py): in-place, copy-on-miss with tierkit's admission, and
# auto (the default: one of the two per cell, priced on the profile window by the link model).
# The per-expert link / CPU split would plug in here too (an Alternative named "tierkit").
TIERKIT_MODES = moe_tierkit.modes(sys.modules[__name__])

ALTERNATIVES = {"all-hbm": AllHbm, "layer-uva": LayerUva, "shared-bank": SharedBank,
                "cpu-cold": CpuCold, "tierkit": None}


def make_alt(name: str, ctx: Ctx, budget: float) -> Alternative:
    if name == "tierkit":
        return TIERKIT_MODES[ctx.tierkit_mode](ctx, budget)
    return ALTERNATIVES[name](ctx, budget)


# ----------------------------------------------------------------------------------- engines


class CpuSplit:
    """cpu-cold's step: per layer, graph A1 (dense, router, MoE input and routing weights to
    pinned host memory), graph A2 (the hot experts), the CPU's cold experts between, graph B
    (the CPU's per-token sums in, combined). ``run`` executes it."""

    def __init__(self, step: Step, graphs: bool):
        self.step, self.graphs = step, graphs
        m, s = step.model, step.model.shape
        B = step.batch
        pin = m.device.type == "cuda"
        self.xn_host = torch.zeros((B, s.hidden), dtype=BF16, pin_memory=pin)
        self.w_host = torch.zeros((B, s.top_k), dtype=torch.float32, pin_memory=pin)
        self.y_host = torch.zeros((B, s.hidden), dtype=torch.float32, pin_memory=pin)
        self.y_dev = torch.zeros((B, s.hidden), dtype=torch.float32, device=m.device)
        self.x = torch.zeros((B, s.hidden), dtype=BF16, device=m.device)
        self.xn = torch.zeros_like(self.x)
        self.w = torch.zeros((B, s.top_k), dtype=torch.float32, device=m.device)
        self.ids_np = None  # the step's ids on the host (the trace's; an engine copies them out)
        self.event = torch.cuda.Event() if m.device.type == "cuda" else None
        self.g = None

    def a1(self, layer):
        st = self.step
        x = st.x_in if layer == 0 else self.x
        x, xn, w = st.attn_router(x, layer)
        self.x.copy_(x)
        self.xn.copy_(xn)
        self.w.copy_(w)
        self.xn_host.copy_(xn, non_blocking=True)
        self.w_host.copy_(w, non_blocking=True)

    def a2(self, layer):
        st = self.step
        ids_l = st.ids[layer]
        st.moe(st.model, self.xn, self.w, ids_l, st.alt.tables[layer], st.bufs)

    def b(self, layer):
        st = self.step
        self.y_dev.copy_(self.y_host, non_blocking=True)
        x = st.combine(self.x, self.xn, st.bufs.out_pairs, layer, extra=self.y_dev)
        self.x.copy_(x)
        if layer == st.model.shape.layers - 1:
            st.out.copy_(x)
            st.account()

    def cpu(self, layer):
        """The cold experts of ``layer`` on the CPU (torch bf16, every core), per-token sums."""
        m, s = self.step.model, self.step.model.shape
        ids = self.ids_np[layer]
        cold = self.step.alt.cold_mask[layer]
        self.y_host.zero_()
        for e in np.unique(ids):
            if not cold[e]:
                continue
            rows, js = np.nonzero(ids == e)
            w13, w2 = expert_views(m.host[layer, e], s.hidden, s.ffn)
            r = torch.from_numpy(rows)
            o = swiglu(self.xn_host[r], w13, w2).float()
            self.y_host.index_add_(0, r, o * self.w_host[r, torch.from_numpy(js)][:, None])

    def capture(self, stream):
        L = self.step.model.shape.layers
        self.g = []
        for layer in range(L):
            parts = []
            for fn in (self.a1, self.a2, self.b):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    fn(layer)
                parts.append(g)
            self.g.append(parts)

    def run(self, stream=None):
        L = self.step.model.shape.layers
        for layer in range(L):
            if self.g is not None:
                a1, a2, b = self.g[layer]
                a1.replay()
                self.event.record(stream)
                a2.replay()
                self.event.synchronize()
                self.cpu(layer)
                b.replay()
            else:
                self.a1(layer)
                if self.event is not None:
                    self.event.record(stream)
                self.a2(layer)
                if self.event is not None:
                    self.event.synchronize()
                self.cpu(layer)
                self.b(layer)


class Engine:
    """Runs one alternative: eager (CPU reference, or ``graphs=False``) or captured in CUDA
    graphs, over the composed steps. ``run_steps`` returns per-step wall times (µs)."""

    def __init__(self, ctx: Ctx, alt: Alternative, use_triton: bool, graphs: bool):
        self.ctx, self.alt = ctx, alt
        self.step = Step(ctx.model, alt, ctx.batch, use_triton)
        self.split = CpuSplit(self.step, graphs) if alt.cpu_split else None
        self.graphs = graphs
        self.graph = None
        self.capture_error = None
        self.stream = ctx.stream

    def _eager(self):
        if self.split is not None:
            self.split.run(self.stream)
        else:
            self.step.body()

    def load(self, ids_dev, x_dev, ids_np, s):
        self.step.ids.copy_(ids_dev[s])
        self.step.x_in.copy_(x_dev[s])
        if self.split is not None:
            self.split.ids_np = ids_np[s]

    def prepare(self, ids_dev, x_dev, ids_np):
        """Compiles the kernels and captures the graphs (on the step stream), then resets the
        alternative's state."""
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                for s in range(2):  # Triton compiles, cuBLAS / allocator warm-up
                    self.load(ids_dev, x_dev, ids_np, s)
                    self._eager()
                self.stream.synchronize()
                if self.graphs:
                    try:
                        if self.split is not None:
                            self.split.capture(self.stream)
                        else:
                            self.graph = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(self.graph, stream=self.stream):
                                self.step.body()
                    except Exception as e:  # noqa: BLE001 - reported in the row, run eagerly
                        self.capture_error = f"{type(e).__name__}: {e}"[:300]
                        self.graph = None
                        if self.split is not None:
                            self.split.g = None
                        torch.cuda.synchronize()
                self.stream.synchronize()
        self.reset()

    def reset(self):
        """Fresh state for a run: the alternative's, the counters (on the step stream)."""
        with torch.cuda.stream(self.stream) if self.stream is not None else _Null():
            self.alt.reset()
            self.step.acct.zero_()
        if self.stream is not None:
            self.stream.synchronize()

    def zero_acct(self):
        with torch.cuda.stream(self.stream) if self.stream is not None else _Null():
            self.step.acct.zero_()

    def run_steps(self, steps, ids_dev, x_dev, ids_np, outputs=None) -> list[float]:
        times = []
        ctxm = torch.cuda.stream(self.stream) if self.stream is not None else _Null()
        with ctxm:
            for s in steps:
                t0 = time.perf_counter()
                self.alt.between_steps()
                self.load(ids_dev, x_dev, ids_np, s)
                if self.graph is not None:
                    self.graph.replay()
                elif self.split is not None:
                    self.split.run(self.stream)
                else:
                    self.step.body()
                if self.stream is not None:
                    self.stream.synchronize()
                times.append((time.perf_counter() - t0) * 1e6)
                if outputs is not None:
                    outputs.append(self.step.out.float().cpu().clone())
        return times

    def close(self):
        self.graph = None
        if self.split is not None:
            self.split.g = None


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ----------------------------------------------------------------------------------- the bench


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(round(q * (len(xs) - 1))), len(xs) - 1)]


class Bench:
    """One (shape, batch): the model, the composed routing, the inputs; runs cells."""

    def __init__(self, shape: Shape, batch: int, args, model: Model, trace: dict):
        self.shape, self.batch, self.args, self.model = shape, batch, args, model
        dev = model.device
        P, W, N = args.profile_steps, args.warmup, args.steps
        total = P + W + N
        raw = trace["ids"][:, : shape.layers]
        ids, self.routing = compose_batch(raw, batch, total)
        self.routing.update(correlation(raw, ids[P:], shape.experts, args.seed))
        self.routing["trace"] = trace["name"]
        self.routing["source"] = trace["source"]
        prof = ids[:P].reshape(P, shape.layers, -1)
        self.profile = np.stack([np.bincount(prof[:, l].ravel(), minlength=shape.experts)
                                 for l in range(shape.layers)]).astype(np.int64)
        self.ids_np = ids
        self.ids_dev = torch.from_numpy(ids).to(dev)
        g = torch.Generator(device=dev)
        g.manual_seed(args.seed + batch)
        self.x_dev = torch.randn((total, batch, shape.hidden), generator=g, device=dev).to(BF16)
        self.run_range = list(range(P, total))
        self.warm = W
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self.use_triton = (dev.type == "cuda" or INTERPRETED) and triton is not None and not args.no_triton
        self.graphs = dev.type == "cuda" and not args.no_graphs
        self.ctx = Ctx(model, self.profile, batch, self.stream, args.tierkit_mode)
        self.ctx.profile_ids = ids[:P]  # the auto mode prices both modes on the profile window
        self.ceiling = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # inputs made on the default stream, read on self.stream

    def engine(self, name, budget):
        alt = make_alt(name, self.ctx, budget)
        eng = Engine(self.ctx, alt, self.use_triton, self.graphs)
        try:
            eng.prepare(self.ids_dev, self.x_dev, self.ids_np)
        except BaseException:
            eng.close()
            alt.close()
            raise
        return alt, eng

    def outputs(self, name, budget, steps, use_triton=None, graphs=None):
        """The step outputs of ``steps`` run steps (``float32 [B, H]`` each) from fresh state."""
        alt = make_alt(name, self.ctx, budget)
        ut = self.use_triton if use_triton is None else use_triton
        gr = self.graphs if graphs is None else graphs
        eng = Engine(self.ctx, alt, ut, gr)
        try:
            eng.prepare(self.ids_dev, self.x_dev, self.ids_np)
            outs = []
            eng.run_steps(self.run_range[:steps], self.ids_dev, self.x_dev, self.ids_np, outs)
            st = alt.stats()
            if eng.capture_error:
                st["capture_error"] = eng.capture_error
            return outs, st
        finally:
            eng.close()
            alt.close()

    def cell(self, name, budget) -> dict:
        a = self.args
        alt, eng = self.engine(name, budget)
        s, L, nb = self.shape, self.shape.layers, self.shape.expert_bytes
        runs = []
        try:
            for r in range(a.runs):
                if r:
                    eng.reset()
                eng.run_steps(self.run_range[: self.warm], self.ids_dev, self.x_dev, self.ids_np)
                swaps0 = alt.stats().get("swaps_applied", 0)
                copies0 = alt.stats().get("copies", 0)
                eng.zero_acct()
                t = eng.run_steps(self.run_range[self.warm:], self.ids_dev, self.x_dev, self.ids_np)
                st = alt.stats()
                acct = eng.step.acct.tolist()
                runs.append({"times": t, "tok_s": self.batch * len(t) / (sum(t) / 1e6),
                             "host_reads": acct[0] / len(t), "cpu_experts": acct[1] / len(t),
                             "swaps": st.get("swaps_applied", 0) - swaps0,
                             "copies": (st.get("copies", 0) - copies0) / len(t), "stats": st})
        finally:
            graphed = eng.graph is not None or (eng.split is not None and eng.split.g is not None)
            eng.close()
            hbm = alt.hbm_expert_bytes()
            alt.close()
        med = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]
        t = med["times"]
        row = {"shape": s.name, "layers": L, "experts": s.experts, "top_k": s.top_k,
               "hidden": s.hidden, "ffn": s.ffn, "batch": self.batch, "budget": budget,
               "alternative": name, "hbm_expert_bytes": hbm,
               "hbm_expert_share": round(hbm / (L * s.experts * nb), 4),
               "tokens_per_s": round(med["tok_s"], 1),
               "runs_tokens_per_s": [round(r["tok_s"], 1) for r in runs],
               "step_p50_us": round(statistics.median(t), 1), "step_p99_us": round(pct(t, 0.99), 1),
               "steps_timed": len(t),
               "link_read_bytes_per_step": int(med["host_reads"] * nb),
               "link_copy_bytes_per_step": int((med["copies"] + med["swaps"] / len(t)) * nb),
               "cpu_expert_bytes_per_step": int(med["cpu_experts"] * nb),
               "swaps_applied": med["swaps"]}
        row.update({k: v for k, v in med["stats"].items() if k not in ("copies", "swaps_applied")})
        row["cuda_graph"] = graphed
        if eng.capture_error:
            row["capture_error"] = eng.capture_error
        if name == "all-hbm":
            self.ceiling = row
        if self.ceiling is not None:
            row["ratio_to_all_hbm"] = round(row["tokens_per_s"] / self.ceiling["tokens_per_s"], 3)
            row["predicted_step_us"] = predict(self.ceiling, row, a)
        return row


def predict(ceiling: dict, row: dict, a) -> float | None:
    """The lab's link model on top of the all-HBM step: all-HBM p50 + ``tierkit.sim.
    link_stall_us`` of the step's in-place bytes and copies (h200-pcie), + the CPU's bytes at
    ``--cpu-gbps`` for cpu-cold (no overlap credited). A model of the link only: compute that
    moves to the CPU and per-layer syncs are not in it."""
    from tierkit import sim

    expert = 6 * row["hidden"] * row["ffn"]
    copies = row["link_copy_bytes_per_step"] / expert  # per step, on average
    stall = sim.link_stall_us(row["link_read_bytes_per_step"], 0, 0)["stall_us"]
    stall += copies * sim.link_stall_us(0, 1, expert)["stall_us"]
    cpu = row["cpu_expert_bytes_per_step"] / (a.cpu_gbps * 1e3)
    return round(ceiling["step_p50_us"] + stall + cpu, 1)


# ----------------------------------------------------------------------------------- check


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(bench: Bench, alts, budgets, steps, tol) -> list[dict]:
    """Every alternative's step outputs against all-HBM's: bit-identical for the GPU ones (the
    same kernel reading equal bytes), within ``tol`` relative L2 for cpu-cold; all-HBM's kernel
    against the float32 torch reference within ``tol``."""
    rows = []
    ref, _ = bench.outputs("all-hbm", 1.0, steps)
    if bench.use_triton:
        torch_ref, _ = bench.outputs("all-hbm", 1.0, steps, use_triton=False, graphs=False)
        err = max(rel_err(a, b) for a, b in zip(ref, torch_ref))
        rows.append({"check": "kernel-vs-torch-reference", "max_rel_err": err, "tol": tol,
                     "ok": err <= tol})
    for budget in budgets:
        for name in alts:
            if name == "all-hbm":
                continue
            outs, st = bench.outputs(name, budget, steps)
            same = all(torch.equal(a, b) for a, b in zip(outs, ref))
            err = max(rel_err(a, b) for a, b in zip(outs, ref))
            exact = name != "cpu-cold"
            ok = same if exact else err <= tol
            rows.append({"check": name, "budget": budget, "shape": bench.shape.name,
                         "batch": bench.batch, "steps": steps, "bit_identical": same,
                         "max_rel_err": err, "required": "bit-identical" if exact else f"<= {tol}",
                         "ok": ok, **st})
    return rows


# ----------------------------------------------------------------------------------- main


def parse_list(s, typ):
    return [typ(v) for v in s.split(",") if v]


def shape_from_args(name: str, a) -> Shape:
    if name == "custom":
        need = ["layers", "experts", "top_k", "hidden", "ffn"]
        missing = [n for n in need if getattr(a, n) is None]
        if missing:
            raise SystemExit(f"--shapes custom needs --{', --'.join(m.replace('_', '-') for m in missing)}")
        s = Shape("custom", a.layers, a.experts, a.top_k, a.hidden, a.ffn,
                  q_dim=a.q_dim or a.hidden, kv_dim=a.kv_dim or a.hidden,
                  shared=a.shared_experts, shared_ffn=a.shared_ffn or a.ffn, trace="zipf")
    else:
        s = SHAPES[name]
        if a.layers is not None:
            s = replace(s, layers=a.layers)
    if a.zipf is not None:
        s = replace(s, zipf=a.zipf)
    if a.reuse is not None:
        s = replace(s, reuse=a.reuse)
    return s


QUICK = {  # shape: (layers, batches, budgets) of the reduced matrix
    "olmoe": (8, [1, 32], [0.25, 0.5]),
    "qwen3": (8, [8], [0.5]),
    "mixtral": (2, [1], [0.5]),
}


def table_text(rows: list[dict]) -> str:
    head = ("shape", "L", "batch", "budget", "alternative", "tok/s", "× all-HBM", "p50 µs",
            "p99 µs", "pred µs", "link MB/step", "copy MB/step", "CPU MB/step", "swaps")
    out = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        out.append(" | ".join(str(v) for v in (
            r["shape"], r["layers"], r["batch"], r["budget"], r["alternative"], r["tokens_per_s"],
            r.get("ratio_to_all_hbm", ""), r["step_p50_us"], r["step_p99_us"],
            r.get("predicted_step_us", ""), round(r["link_read_bytes_per_step"] / 1e6, 1),
            round(r["link_copy_bytes_per_step"] / 1e6, 1),
            round(r["cpu_expert_bytes_per_step"] / 1e6, 1), r["swaps_applied"])))
    return "\n".join("| " + line + " |" for line in out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="olmoe", help="comma list of " + ", ".join(SHAPES) + ", custom")
    ap.add_argument("--layers", type=int, help="MoE layers (named shapes: fewer layers than the "
                    "model, stated in every row; each layer keeps its real sizes)")
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--ffn", type=int, help="expert FFN width")
    ap.add_argument("--q-dim", type=int)
    ap.add_argument("--kv-dim", type=int)
    ap.add_argument("--shared-experts", type=int, default=0)
    ap.add_argument("--shared-ffn", type=int)
    ap.add_argument("--trace", action="append", help="routing trace (file or directory; any "
                    "format of `tierkit experts replay --trace`); SHAPE=PATH for one shape of "
                    "several; repeat for several shapes")
    ap.add_argument("--zipf", type=float, help="Zipf exponent of generated routing")
    ap.add_argument("--reuse", type=float, help="previous-step reuse of generated routing")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--budgets", default="0.25,0.5,0.75", help="HBM for experts, share of all")
    ap.add_argument("--alternatives", default="all-hbm,layer-uva,shared-bank,cpu-cold,tierkit")
    ap.add_argument("--tierkit-mode", default="auto", choices=sorted(TIERKIT_MODES),
                    help="auto: in-place or copy-on-miss per cell (moe_tierkit.py)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    ap.add_argument("--profile-steps", type=int, default=32, help="steps counted for the ranked "
                    "placements (cpu-cold's mask, tierkit's seed map), never run")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell (median)")
    ap.add_argument("--quick", action="store_true", help="the reduced matrix (QUICK)")
    ap.add_argument("--check", action="store_true", help="exactness on --check-steps steps")
    ap.add_argument("--check-steps", type=int, default=6)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--cpu-gbps", type=float, default=44.0, help="CPU expert rate of the "
                    "prediction (issue 27: 44 GB/s for Mixtral on the H200's host)")
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--no-triton", action="store_true", help="torch reference kernels")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json-out", help="also append the JSON lines to this file")
    a = ap.parse_args(argv)

    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    if dev.type == "cuda" and triton is None and not a.no_triton:
        raise SystemExit("the GPU path needs Triton (or --no-triton)")
    alts = parse_list(a.alternatives, str)
    for n in alts:
        if n not in ALTERNATIVES:
            raise SystemExit(f"unknown alternative {n!r} ({', '.join(ALTERNATIVES)})")
    if "all-hbm" not in alts:
        alts = ["all-hbm"] + alts
    plan = []
    if a.quick:
        for name, (layers, batches, budgets) in QUICK.items():
            plan.append((shape_from_args(name, replace_ns(a, layers=layers)), batches, budgets))
    else:
        for name in parse_list(a.shapes, str):
            plan.append((shape_from_args(name, a), parse_list(a.batches, int),
                         parse_list(a.budgets, float)))
    sink = open(a.json_out, "a") if a.json_out else None

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    env = {"torch": torch.__version__, "triton": getattr(triton, "__version__", None),
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "cpu_threads": torch.get_num_threads()}
    emit({"env": env, "args": vars(a)})
    rows, failed = [], False
    for shape, batches, budgets in plan:
        t0 = time.perf_counter()
        model = Model(shape, dev, a.seed)
        emit({"shape": shape.summary(), "weights_s": round(time.perf_counter() - t0, 1)})
        try:
            for batch in batches:
                need = a.profile_steps + a.warmup + max(a.steps, a.check_steps)
                trace = load_trace(shape, a, batch, need)
                bench = Bench(shape, batch, a, model, trace)
                emit({"shape": shape.name, "batch": batch, "routing": bench.routing})
                if a.check:
                    for r in check(bench, alts, budgets, a.check_steps, a.tol):
                        emit(r)
                        failed |= not r["ok"]
                    continue
                for budget in [1.0] + budgets:
                    for name in alts:
                        if (name == "all-hbm") != (budget == 1.0):
                            continue
                        t1 = time.perf_counter()
                        row = bench.cell(name, budget)
                        row["cell_s"] = round(time.perf_counter() - t1, 1)
                        emit(row)
                        rows.append(row)
        finally:
            model.close()
            del model
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    if rows:
        print(table_text(rows))
    if a.check:
        print("check:", "FAILED" if failed else "all ok")
    return 1 if failed else 0


def replace_ns(a, **kw):
    b = argparse.Namespace(**vars(a))
    for k, v in kw.items():
        setattr(b, k, v)
    return b


if __name__ == "__main__":
    sys.exit(main())
