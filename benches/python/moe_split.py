"""tierkit's ``split`` mode for ``moe_decode.py`` (issue 27, item 4): the cold work of a step split
between the link and the CPU, priced from measured rates.

The placement is ``in-place``'s (``TierkitInPlace``: the bank's hot set + spare, the default
controller's swaps between steps). Every cold expert a step needs (its table entry points at the
host copy) is cut along its FFN width: the GPU computes columns ``[a, F)`` reading them in place
over the link (the same Triton kernels, ``SPLIT`` on: gate+up tiles below ``a`` skipped, the down
projection's reduction starting at ``a``), and the CPU computes columns ``[0, a)`` from the same
pinned host copy (torch bf16, every core) **at the same time**; its per-token sums come back and are
added, as ``cpu-cold`` adds its experts. A SwiGLU FFN is a sum over its FFN columns, so the two
parts add up to the expert's output (within bf16 tolerance: the CPU sums its part in another order,
as ``cpu-cold``). Unlike KTransformers' whole-expert mask this splits *every* cold expert, so a
batch-1 layer with one cold expert still uses both channels.

**The price** (one cut per cell, ``a`` a multiple of ``SPLIT_ALIGN``): the link moves ``(1 − φ)``
of a cold expert's bytes at ``link × 0.970`` and the CPU ``φ`` of them at ``cpu × 0.838`` (the
channels measured together, ``moe_channels.py``: each keeps that share of its solo rate), both
ending together at ``φ = c / (l + c)``, ``l``, ``c`` the two together-rates. ``link`` is
``--link-gbps`` (47: the lab's h200-pcie in-place rate); ``cpu`` is ``--split-cpu-gbps`` or, by
default, **measured** when the mode is built: the CPU's slice FFN at half an expert's width and
the cell's batch, timed on this host (median of 5). ``--split-cpu-share`` forces ``φ``.

**The step** (as ``cpu-cold``'s, ``moe_engine.CpuSplit``): per layer graph A1 (dense part, router,
tierkit's counting, the layer's table snapshot and its cut per expert ``kfrom = a`` where the table
points at the host copy, else 0 — computed on the GPU from the table, so the host and the kernel
agree even if a swap just landed — the MoE input, routing weights and ``kfrom`` copied to pinned
host memory), graph A2 (the hot experts and the GPU's columns of the cold ones), the host waits for
A1's copies and computes the CPU's columns while A2 runs, graph B (the CPU's sums in, added).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from moe_engine import CpuSplit
from moe_kernels import SPLIT_ALIGN
from moe_tierkit import TierkitInPlace
from moe_weights import BF16, expert_views

LINK_TOGETHER = 0.970  # in-place reads keep this share of their solo rate beside the CPU
CPU_TOGETHER = 0.838  # the CPU keeps this share of its solo rate beside the link


def cpu_slice(xs: torch.Tensor, blob: torch.Tensor, hidden: int, ffn: int, a: int) -> torch.Tensor:
    """FFN columns ``[0, a)`` of one expert (``blob``: its bytes in host memory) for the tokens
    ``xs bf16 [n, H]``: ``down[:, :a] · (silu(x gate[:a]ᵀ) ⊙ x up[:a]ᵀ)``, ``float32 [n, H]``."""
    w13, w2 = expert_views(blob, hidden, ffn)
    g = F.linear(xs, w13[:a])
    u = F.linear(xs, w13[ffn:ffn + a])
    return F.linear(F.silu(g) * u, w2[:, :a]).float()


def measure_cpu_gbps(model, batch: int, reps: int = 5) -> float:
    """GB/s of weights the CPU moves through ``cpu_slice`` at half an expert's width and ``batch``
    tokens (layer 0's first experts of the host copy; median of ``reps``)."""
    s = model.shape
    a = max(SPLIT_ALIGN, (s.ffn // 2) // SPLIT_ALIGN * SPLIT_ALIGN) if s.ffn > SPLIT_ALIGN else s.ffn
    xs = torch.randn((batch, s.hidden), dtype=torch.float32).to(BF16)
    times = []
    for r in range(reps + 1):
        e = r % s.experts
        t0 = time.perf_counter()
        cpu_slice(xs, model.host[0, e], s.hidden, s.ffn, a)
        if r:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return 3 * s.hidden * a * 2 / statistics.median(times) / 1e9


def cut_columns(ffn: int, share: float) -> int:
    """The CPU's columns ``a``: ``share × ffn`` rounded to a multiple of ``SPLIT_ALIGN`` (``ffn``
    when it is not a multiple: whole experts only)."""
    if ffn % SPLIT_ALIGN:
        return ffn if share >= 0.5 else 0
    return int(round(share * ffn / SPLIT_ALIGN)) * SPLIT_ALIGN


class LinkCpuSplit(CpuSplit):
    """The step of ``split``: ``CpuSplit``'s graphs with tierkit's counting and the layer's cut in
    A1, the kernels' ``SPLIT`` in A2, the CPU's columns between."""

    def __init__(self, step, graphs: bool):
        super().__init__(step, graphs)
        s = step.model.shape
        pin = step.model.device.type == "cuda"
        self.kfrom_host = torch.zeros((s.layers, s.experts), dtype=torch.int64, pin_memory=pin)

    def a1(self, layer):
        super().a1(layer)
        st = self.step
        ids_l = st.ids[layer]
        st.alt.count(layer, ids_l)
        st.alt.plan(layer)
        self.kfrom_host[layer].copy_(st.alt.kfrom[layer], non_blocking=True)

    def a2(self, layer):
        st = self.step
        alt = st.alt
        st.moe(st.model, self.xn, self.w, st.ids[layer], alt.snap[layer], st.bufs,
               kfrom=alt.kfrom[layer])

    def cpu(self, layer):
        """The CPU's columns ``[0, kfrom[e])`` of each needed cold expert of ``layer``."""
        m, s = self.step.model, self.step.model.shape
        ids = self.ids_np[layer]
        lo = self.kfrom_host[layer].numpy()
        self.y_host.zero_()
        for e in np.unique(ids):
            a = int(lo[e])
            if a <= 0:
                continue
            rows, js = np.nonzero(ids == e)
            r = torch.from_numpy(rows)
            o = cpu_slice(self.xn_host[r], m.host[layer, e], s.hidden, s.ffn, a)
            self.y_host.index_add_(0, r, o * self.w_host[r, torch.from_numpy(js)][:, None])


class TierkitSplit(TierkitInPlace):
    """tierkit's ``split`` mode (the module docstring)."""

    mode = "split"
    cpu_split = True
    split_class = LinkCpuSplit

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        m, s = ctx.model, ctx.model.shape
        a = ctx.args
        self.link_gbps = a.link_gbps
        if a.split_cpu_gbps:
            self.cpu_gbps, self.cpu_rate_from = a.split_cpu_gbps, "--split-cpu-gbps"
        else:
            key = ("cpu_gbps", ctx.batch)
            if key not in ctx.cache:
                ctx.cache[key] = measure_cpu_gbps(m, ctx.batch)
            self.cpu_gbps, self.cpu_rate_from = ctx.cache[key], "measured"
        lt, ct = self.link_gbps * LINK_TOGETHER, self.cpu_gbps * CPU_TOGETHER
        share = ct / (lt + ct) if a.split_cpu_share is None else a.split_cpu_share
        self.cut = cut_columns(s.ffn, share)
        dev = m.device
        self.kfrom = torch.zeros((s.layers, s.experts), dtype=torch.int64, device=dev)
        self.snap = torch.zeros((s.layers, s.experts), dtype=torch.int64, device=dev)

    def plan(self, layer):
        """Inside A1: the layer's table as the kernels will read it, and the cut of each expert
        that table reads in place (0: all on the GPU)."""
        m = self.ctx.model
        t = self.tables[layer]
        self.snap[layer].copy_(t)
        host = (t >= m.host_lo) & (t < m.host_hi)
        self.kfrom[layer].copy_(torch.where(host, self.cut, 0))

    def used_tables(self):
        return self.snap

    def cpu_share(self) -> float:
        return self.cut / self.ctx.model.shape.ffn

    def stats(self):
        st = super().stats()
        st.update({"split_cpu_columns": self.cut, "split_cpu_share": round(self.cpu_share(), 4),
                   "split_cpu_gbps": round(self.cpu_gbps, 3), "split_cpu_rate": self.cpu_rate_from,
                   "split_link_gbps": self.link_gbps})
        return st
