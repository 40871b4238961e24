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
Then **fed back every step** (``TierkitSplit.feedback``): the last step's two channels timed (CUDA
events around A2, the host's clock around the CPU's work), each channel's together-rate learned as
an EMA of its column bytes over its time, the cut re-priced from them (a device scalar the graphs
read: no recapture). The rates are kept per (shape, batch) across runs and auto's candidates.

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
from moe_weights import BF16, expert_views, swiglu

LINK_TOGETHER = 0.970  # in-place reads keep this share of their solo rate beside the CPU
CPU_TOGETHER = 0.838  # the CPU keeps this share of its solo rate beside the link


def cpu_slice(xs: torch.Tensor, blob: torch.Tensor, hidden: int, ffn: int, a: int) -> torch.Tensor:
    """FFN columns ``[0, a)`` of one expert (``blob``: its bytes in host memory) for the tokens
    ``xs bf16 [n, H]``: ``down[:, :a] · (silu(x gate[:a]ᵀ) ⊙ x up[:a]ᵀ)``, ``float32 [n,
    H]``."""
    w13, w2 = expert_views(blob, hidden, ffn)
    g = F.linear(xs, w13[:a])
    u = F.linear(xs, w13[ffn:ffn + a])
    return F.linear(F.silu(g) * u, w2[:, :a]).float()


def measure_cpu_gbps(model, batch: int, reps: int = 5) -> float:
    """GB/s of weights the CPU moves through ``cpu_slice`` at half an expert's width and ``batch``
    tokens (layer 0's first experts of the host copy; median of ``reps``)."""
    s = model.shape
    a = s.ffn
    if s.ffn > SPLIT_ALIGN:
        a = max(SPLIT_ALIGN, (s.ffn // 2) // SPLIT_ALIGN * SPLIT_ALIGN)
    xs = torch.randn((batch, s.hidden), dtype=torch.float32).to(BF16)
    times = []
    for r in range(reps + 1):
        e = r % s.experts
        t0 = time.perf_counter()
        cpu_slice(xs, model.host[0, e], s.hidden, s.ffn, a)
        if r:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return 3 * s.hidden * a * 2 / statistics.median(times) / 1e9


def measure_expert_gbps(model, tokens: int, reps: int = 5) -> float:
    """GB/s of weights the CPU moves computing **whole** experts as cpu-cold's step does
    (``swiglu`` on ``tokens`` rows of the host copy's expert, the weighted ``index_add_`` of the
    per-token sums): each repetition a different expert, spread over the layers (a step's cold
    experts are not in the CPU's caches either), median of ``reps`` after one warm-up. For the
    step-time model (``moe_stepmodel``); measured outside any timed step."""
    s = model.shape
    xs = torch.randn((tokens, s.hidden), dtype=torch.float32).to(BF16)
    rows = torch.arange(tokens)
    w = torch.ones(tokens, dtype=torch.float32)
    y = torch.zeros((tokens, s.hidden), dtype=torch.float32)
    n = s.layers * s.experts
    stride = max(1, n // (reps + 1))
    times = []
    for r in range(reps + 1):
        layer, e = divmod((r * stride + r) % n, s.experts)
        t0 = time.perf_counter()
        w13, w2 = expert_views(model.host[layer, e], s.hidden, s.ffn)
        o = swiglu(xs, w13, w2).float()
        y.index_add_(0, rows, o * w[:, None])
        if r:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return s.expert_bytes / statistics.median(times) / 1e9


def cut_columns(ffn: int, share: float) -> int:
    """The CPU's columns ``a``: ``share × ffn`` rounded to a multiple of ``SPLIT_ALIGN`` (``ffn``
    when it is not a multiple: whole experts only)."""
    if ffn % SPLIT_ALIGN:
        return ffn if share >= 0.5 else 0
    return int(round(share * ffn / SPLIT_ALIGN)) * SPLIT_ALIGN


class LinkCpuSplit(CpuSplit):
    """The step of ``split``: ``CpuSplit``'s graphs with tierkit's counting and the layer's cut in
    A1, the kernels' ``SPLIT`` in A2, the CPU's columns between; each step's two channels timed
    (CUDA events around A2, the host's clock around the CPU's work) for the cut's feedback."""

    def __init__(self, step, graphs: bool):
        super().__init__(step, graphs)
        s = step.model.shape
        pin = step.model.device.type == "cuda"
        self.kfrom_host = torch.zeros((s.layers, s.experts), dtype=torch.int64, pin_memory=pin)
        self.cold_host = torch.zeros((s.layers, s.experts), dtype=torch.bool, pin_memory=pin)
        self.ev = None  # per layer (A2 start, A2 end), timing events
        self.last = None  # the last step's (cpu columns, link columns, CPU s, GPU s or events)
        self.cols = [0, 0]  # this step's cold columns computed by the CPU and read over the link

    def a1(self, layer):
        super().a1(layer)
        st = self.step
        ids_l = st.ids[layer]
        st.alt.count(layer, ids_l)
        st.alt.plan(layer)
        self.kfrom_host[layer].copy_(st.alt.kfrom[layer], non_blocking=True)
        self.cold_host[layer].copy_(st.alt.cold[layer], non_blocking=True)

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
        cold = self.cold_host[layer].numpy()
        self.y_host.zero_()
        for e in np.unique(ids):
            if not cold[e]:
                continue
            a = int(lo[e])
            self.cols[0] += a
            self.cols[1] += s.ffn - a
            if a <= 0:
                continue
            rows, js = np.nonzero(ids == e)
            r = torch.from_numpy(rows)
            o = cpu_slice(self.xn_host[r], m.host[layer, e], s.hidden, s.ffn, a)
            self.y_host.index_add_(0, r, o * self.w_host[r, torch.from_numpy(js)][:, None])

    def run(self, stream=None):
        """``CpuSplit.run`` with the two channels timed; first the last step's times fed back to
        the cut (its events are complete: the engine synced the stream after it)."""
        self.step.alt.feedback(self.last)
        L = self.step.model.shape.layers
        gpu = self.event is not None
        if gpu and self.ev is None:
            self.ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(L)]
        self.cols = [0, 0]
        t_cpu = t_gpu = 0.0
        for layer in range(L):
            parts = self.g[layer] if self.g is not None else None
            parts[0].replay() if parts else self.a1(layer)
            if gpu:
                self.event.record(stream)
                self.ev[layer][0].record(stream)
            t0 = time.perf_counter()
            parts[1].replay() if parts else self.a2(layer)
            if gpu:
                self.ev[layer][1].record(stream)
                self.event.synchronize()
            else:  # the CPU reference: A2 ran on the host, before the CPU's part
                t_gpu += time.perf_counter() - t0
            t1 = time.perf_counter()
            self.cpu(layer)
            t_cpu += time.perf_counter() - t1
            parts[2].replay() if parts else self.b(layer)
        self.last = (self.cols[0], self.cols[1], t_cpu, self.ev if gpu else t_gpu)
        self.step.alt.count_columns(*self.cols)


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
        self.priced_cut = cut_columns(s.ffn, share)
        self.fixed = a.split_cpu_share is not None  # a forced share: no feedback
        # the channels' together-rates (bytes/s) the feedback learns; a machine's, not a run's
        # state: kept for the (shape, batch) across runs and auto's candidates
        self.rates = ctx.cache.setdefault(("split_rates", ctx.batch), {"link": lt * 1e9,
                                                                      "cpu": ct * 1e9, "n": 0})
        dev = m.device
        self.kfrom = torch.zeros((s.layers, s.experts), dtype=torch.int64, device=dev)
        self.cold = torch.zeros((s.layers, s.experts), dtype=torch.bool, device=dev)
        self.snap = torch.zeros((s.layers, s.experts), dtype=torch.int64, device=dev)
        self.cut_t = torch.zeros(1, dtype=torch.int64, device=dev)
        self.cut = -1
        self.set_cut(self.priced_cut if self.fixed or not self.rates["n"] else self._rated_cut())
        self.columns = [0, 0]

    def plan(self, layer):
        """Inside A1: the layer's table as the kernels will read it, and the cut of each expert
        that table reads in place (0: all on the GPU)."""
        m = self.ctx.model
        t = self.tables[layer]
        self.snap[layer].copy_(t)
        host = (t >= m.host_lo) & (t < m.host_hi)
        self.cold[layer].copy_(host)
        self.kfrom[layer].copy_(torch.where(host, self.cut_t, 0))

    def set_cut(self, cut: int):
        """The CPU's columns of every cold expert from the next step on (a device scalar the
        captured graphs read: no recapture)."""
        if cut != self.cut:
            self.cut = cut
            self.cut_t.fill_(cut)

    def _rated_cut(self) -> int:
        r = self.rates
        return cut_columns(self.ctx.model.shape.ffn, r["cpu"] / (r["link"] + r["cpu"]))

    def feedback(self, last):
        """The last step's measured channels into the rates, the cut re-priced: ``cpu`` =
        the CPU's column bytes ÷ its time, ``link`` = the link's column bytes ÷ A2's GPU time
        (hot experts' compute included: a lower bound), each an EMA (½)."""
        if last is None or self.fixed:
            return
        cpu_cols, link_cols, t_cpu, gpu = last
        if not isinstance(gpu, float):
            try:
                for _, end in gpu:
                    end.synchronize()  # done unless the last step was not synced (prepare's)
                gpu = sum(a.elapsed_time(b) for a, b in gpu) / 1e3
            except RuntimeError as e:  # no timing: keep the priced cut, say so in the row
                self.fixed, self.feedback_error = True, f"{type(e).__name__}: {e}"[:200]
                return
        col = 6 * self.ctx.model.shape.hidden  # bytes of one FFN column: gate, up and down
        r = self.rates
        for key, cols, t in (("cpu", cpu_cols, t_cpu), ("link", link_cols, gpu)):
            if cols > 0 and t > 0:
                r[key] = 0.5 * r[key] + 0.5 * cols * col / t
        r["n"] += 1
        self.set_cut(self._rated_cut())

    def count_columns(self, cpu_cols: int, link_cols: int):
        self.columns[0] += cpu_cols
        self.columns[1] += link_cols

    def zero_acct(self):
        self.columns = [0, 0]

    def used_tables(self):
        return self.snap

    def cpu_share(self) -> float:
        """The CPU's share of the cold columns since ``zero_acct`` (the cut when none ran)."""
        c, l = self.columns
        return c / (c + l) if c + l else self.cut / self.ctx.model.shape.ffn

    def stats(self):
        st = super().stats()
        st.update({"split_cpu_columns": self.cut, "split_priced_columns": self.priced_cut,
                   "split_cpu_share": round(self.cpu_share(), 4),
                   "split_cpu_gbps": round(self.cpu_gbps, 3), "split_cpu_rate": self.cpu_rate_from,
                   "split_link_gbps": self.link_gbps,
                   "split_learned_gbps": {k: round(self.rates[k] / 1e9, 3)
                                          for k in ("link", "cpu")},
                   "split_feedback_steps": self.rates["n"]})
        if getattr(self, "feedback_error", None):
            st["split_feedback_error"] = self.feedback_error
        return st
