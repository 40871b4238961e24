"""The alternatives of the MoE decode bench (``moe_decode.py``; issue 27) that are not tierkit:
all-HBM, layer-granular UVA offload, the shared expert bank with copy-on-miss (vLLM PR #56177),
the CPU computing cold experts (KTransformers). Descriptions: ``moe_decode.py``'s docstring."""

from __future__ import annotations

import numpy as np
import torch

from moe_kernels import copy_planned, lru_plan
from moe_weights import Model


class Ctx:
    """What the alternatives of one (shape, batch) share: the model, the profile counts
    (``int64 [L, E]`` picks over the profile window), the step's stream."""

    def __init__(self, model: Model, profile: np.ndarray, batch: int, stream, tierkit_mode: str,
                 args=None):
        self.model, self.profile, self.batch, self.stream = model, profile, batch, stream
        self.tierkit_mode, self.args = tierkit_mode, args
        self.profile_ids = None  # int64 [profile steps, L, B, k]: the profile window's routing
        self.cache: dict = {}  # measured once per (shape, batch): the CPU's rate of split mode


class Alternative:
    """A placement of the experts and how the step reads them. ``table(layer, ids, step)``
    returns the layer's ``int64 [E]`` addresses (may enqueue device work: it runs inside the
    graph); ``between_steps`` is host work before each step; ``segments`` is None for a step that
    is one graph."""

    name = "?"
    cpu_split = False  # a step of per-layer graphs with the CPU between them
    split_class = None  # that step's class (None: moe_engine.CpuSplit)

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

    def zero_acct(self):
        """Start of a run's timed steps (host-side counters restart)."""

    def cpu_share(self) -> float:
        """Share of the bytes of an expert its table reads in place that the CPU computes instead
        (tierkit's split mode; 0: none)."""
        return 0.0

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
