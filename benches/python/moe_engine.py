"""The decode step and its engines (``moe_decode.py``; issue 27): the torch code of one step (the
dense part, the router, the alternative's table, the MoE kernel), cpu-cold's split into per-layer
graphs with the CPU between them, and the engine that captures and runs either."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from moe_alternatives import Alternative, Ctx
from moe_kernels import Buffers, moe_reference, moe_triton
from moe_weights import BF16, Model, expert_views, rms, swiglu


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
        split = alt.split_class or CpuSplit  # tierkit's split mode brings its own
        self.split = split(self.step, graphs) if alt.cpu_split else None
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
        self.alt.zero_acct()

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
