"""tierkit as the engine of ``moe_decode.py``: its modes (issue 27, item 4).

- ``in-place`` (``TierkitInPlace``): a ``tierkit.torch.ExpertBank`` of ``hot = floor(budget ×
  experts) − 1`` experts per layer plus its spare slot, booted from ``fit_seed_map`` on the
  profile window, swaps decided between steps by the default ``Controller``; cold experts read in
  place over the link by the same kernel.
- ``copy-on-miss`` (``TierkitCopyOnMiss``): each layer's ``slots`` split into the bank's hot set +
  spare (``hot = slots − 1 − stage``) and ``stage = (slots − 1) div 2`` staging rows, the staging
  rows of all layers **pooled in one bank** (``layers × stage`` rows, as the shared bank of vLLM
  PR #56177 pools its rows: a layer with many misses uses rows another layer does not need).
  Inside the captured step, before each layer's GEMMs, the device-side LRU planner
  (``moe_kernels.lru_plan``: the least recently used row not used by this layer in this step)
  copies the layer's admitted missed cold experts from the host copy into pooled rows with the
  fixed-grid copy kernel, and the layer's table points at them: computed from HBM in the same
  step, hit on later steps. **Admission is tierkit's**, the read-or-copy price of the lab's link
  model (``tierkit.sim.link_stall_us``, the scoreboard's ``read-or-copy`` mode): a miss of
  expert ``e`` is copied iff ``copy_us ≤ read_us × (1 + p_e)``, ``p_e`` the chance the expert is
  picked again next step: the larger of ``1 − exp(−ema_e)`` from the controller's pick EMA
  (``Controller.ema()``; the profile's picks per step before its first drain) and the layer's
  step-to-step reuse measured on the profile window (``layer_reuse``: a miss was picked this
  step, and where routing reuses the last step's experts that is its chance of a pick next step,
  far above its share of all picks: 0.6 against ~0.02 on the 512-expert trace, where the pick
  share alone read 6.3 MB misses in place that the shared bank copied and hit); a miss not
  admitted is read in place and
  evicts nothing (``--com-admit all``: every miss copied, to measure what admission buys).
  **The bank's hot set stays the boot map** (``Controller.freeze()``: counting and the EMA go on,
  swaps stop): the controller prices a swap against reading the expert in place every time it is
  needed, but here a needed cold expert costs one copy and then hits the pool, so its swaps would
  mostly copy twice what the pool already holds (on the 2026-12-04 cells in-place's swaps were
  3.6 experts a step at Qwen3 batch 1, 25%, against the pool's ~29 copies). ``--com-swaps on``
  lets it swap.
  **Wide batches**: a layer whose cold working set exceeds twice its share of the
  pool (``2 × stage``) reads its misses in place that step (the PR's bank + host-view path), and
  admitted misses beyond the rows free in this step are read in place too.
- ``pooled`` (``TierkitPooled``): ``copy-on-miss`` with one hot expert per layer and every other
  slot but the spare in the pool (``stage = slots − 2``): the shared bank's all-pool layout, with
  tierkit's admission.
- ``split`` (``moe_split.TierkitSplit``): the in-place placement, each cold expert's FFN columns
  split between the link and the CPU.
- ``auto`` (the default): measured per cell (``moe_decode.Bench.tierkit_auto``).

What the library lacks (so the bench does it with torch ops around the public API): ``ExpertBank``
has no capturable on-miss copy into bank-owned rows (its copies are the controller's swaps, issued
between steps by ``bank.step``), so the staging rows are a torch tensor beside the bank and the
layer's table is composed from ``bank.table`` and the staging remap; the ``Controller`` has no
per-miss admission decision, so admission is priced here from its ``ema()`` and the lab's link
model. Bit-exactness holds: a staged row holds the expert's bytes exactly, and the same kernel
reads through the table.
"""

from __future__ import annotations

import numpy as np
import torch

from moe_alternatives import Alternative
from moe_kernels import copy_planned, lru_plan


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


def stage_split(slots: int, pooled: bool = False) -> tuple[int, int]:
    """``(hot, stage)`` of a layer's ``slots`` HBM slots: one is the bank's spare; of the rest,
    half (rounded down) are staging rows, the others hot (at least one hot). ``pooled``: every
    row but one hot expert is a staging row (``stage = slots − 2``)."""
    stage = max(slots - 2 if pooled else (slots - 1) // 2, 0)
    hot = max(slots - 1 - stage, 1)
    return hot, stage


def admit_mask(rate: np.ndarray, read_us: float, copy_us: float,
               reuse: np.ndarray | None = None) -> np.ndarray:
    """``bool [L, E]``: the read-or-copy rule per expert: copy iff ``copy_us ≤ read_us × (1 +
    p)``, ``p`` the chance that a missed expert is picked again next step: at least ``1 −
    exp(−rate)`` (``rate``: picks per step, ``float [L, E]``), and at least the layer's measured
    step-to-step reuse (``reuse``: ``float [L]``, see ``layer_reuse``; a miss *was* picked this
    step, so where routing reuses the last step's experts its chance of a pick next step is the
    reuse, not the expert's share of all picks)."""
    p = 1.0 - np.exp(-np.maximum(rate, 0.0))
    if reuse is not None:
        p = np.maximum(p, np.asarray(reuse, dtype=np.float64)[:, None])
    return copy_us <= read_us * (1.0 + p)


def layer_reuse(ids: np.ndarray, experts: int) -> np.ndarray:
    """``float [L]``: per layer, the share of the experts a step picked that the next step picks
    too (``Σ_t |S_t ∩ S_t+1| / Σ_t |S_t|`` over ``ids``, ``int [steps, L, ...]``: any batch and
    top-k axes after the layer). 0 for fewer than two steps."""
    steps, L = ids.shape[0], ids.shape[1]
    out = np.zeros(L)
    if steps < 2:
        return out
    flat = ids.reshape(steps, L, -1)
    for layer in range(L):
        hit = np.zeros((steps, experts), dtype=bool)
        hit[np.arange(steps)[:, None], flat[:, layer]] = True
        picked = hit[:-1].sum()
        out[layer] = (hit[:-1] & hit[1:]).sum() / picked if picked else 0.0
    return out


def link_prices(expert_bytes: int) -> tuple[float, float]:
    """``(read_us, copy_us)`` of one expert on the lab's link model (h200-pcie: in place at 47
    GB/s; a copy at 55 GB/s plus 26.2 µs)."""
    from tierkit import sim

    return (sim.link_stall_us(expert_bytes, 0, 0)["stall_us"],
            sim.link_stall_us(0, 1, expert_bytes)["stall_us"])


class TierkitCopyOnMiss(TierkitInPlace):
    """tierkit's bank (hot set + spare) and one pool of staging rows shared by every layer,
    copy-on-miss with tierkit's admission (the module docstring)."""

    mode = "copy-on-miss"
    pooled = False

    def hot_slots(self):
        return stage_split(self.slots_per_layer, self.pooled)[0]

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        m, s = ctx.model, ctx.model.shape
        L, E, dev = s.layers, s.experts, m.device
        self.stage = stage_split(self.slots_per_layer, self.pooled)[1]
        self.rows = R = L * self.stage
        self.buf = torch.empty((max(R, 1), s.expert_bytes), dtype=torch.uint8, device=dev)
        m.register(self.buf)
        self.remap = torch.empty(L * E + 1, dtype=torch.int64, device=dev)  # + sentinel
        self.owner = torch.empty(R + 1, dtype=torch.int64, device=dev)
        self.last = torch.empty(R + 1, dtype=torch.int64, device=dev)
        self.admit = torch.zeros((L, E), dtype=torch.bool, device=dev)
        self.stamp = torch.zeros(1, dtype=torch.int64, device=dev)
        self.copies = torch.zeros(1, dtype=torch.int64, device=dev)
        self.own = torch.zeros((L, E), dtype=torch.int64, device=dev)
        self.ar = torch.arange(E, dtype=torch.int64, device=dev)
        self.read_us, self.copy_us = link_prices(s.expert_bytes)
        self.admit_all = getattr(ctx.args, "com_admit", "priced") == "all"
        self.profile_rate = ctx.profile / max(len(ctx.profile_ids), 1)
        self.reuse = layer_reuse(np.asarray(ctx.profile_ids), E)
        self._stage_reset()

    def _stage_reset(self):
        self.remap.fill_(-1)
        self.owner.fill_(-1)
        self.last.fill_(0)
        self.stamp.zero_()
        self.copies.zero_()
        self.admitted = admit_mask(self.profile_rate, self.read_us, self.copy_us, self.reuse)
        if self.admit_all:  # --com-admit all: every miss copied, as the shared bank does
            self.admitted[:] = True
        self.admit.copy_(torch.from_numpy(self.admitted))

    def reset(self):
        super().reset()
        if getattr(self.ctx.args, "com_swaps", "off") == "off":
            self.ctl.freeze()  # the pool serves recency: the boot map stays (see the docstring)
        if hasattr(self, "remap"):
            self._stage_reset()

    def _tables_from(self, rmap):
        super()._tables_from(rmap)
        self.base = self.tables

    def between_steps(self):
        super().between_steps()
        ema = np.asarray(self.ctl.ema())
        if ema.any() and not self.admit_all:
            adm = admit_mask(ema, self.read_us, self.copy_us, self.reuse)
            if not np.array_equal(adm, self.admitted):
                self.admitted = adm
                self.admit.copy_(torch.from_numpy(adm))

    def table(self, layer, ids_l, step):
        m, s = self.ctx.model, self.ctx.model.shape
        base = (self.bank.table if self.gpu else self.base)[layer]
        if self.rows == 0:
            self.own[layer].copy_(base)
            return self.own[layer]
        L, E, R, nb = s.layers, s.experts, self.rows, s.expert_bytes
        M = min(E, ids_l.numel(), R)
        need = torch.zeros(E, dtype=torch.bool, device=m.device)
        need.scatter_(0, ids_l.reshape(-1), True)
        host = (base >= m.host_lo) & (base < m.host_hi)
        cold = need & host
        rows_l = self.remap[layer * E:(layer + 1) * E]
        now = self.stamp + (layer + 1)
        miss = cold & (rows_l < 0) & self.admit[layer]
        gid, victim, ok = lru_plan(self.remap, rows_l, self.owner, self.last, now,
                                   cold & (rows_l >= 0), miss, M, layer * E, L * E, self.ar,
                                   cold.sum() <= 2 * self.stage)
        self.copies += copy_planned(step, m, m.host_lo + gid * nb,
                                    self.buf.data_ptr() + victim * nb, ok, M)
        staged = (rows_l >= 0) & host
        self.own[layer].copy_(torch.where(staged, self.buf.data_ptr() + rows_l * nb, base))
        return self.own[layer]

    def used_tables(self):
        return self.own

    def end_step(self, step):
        self.stamp += self.ctx.model.shape.layers

    def hbm_expert_bytes(self):
        s = self.ctx.model.shape
        return self.geometry.hbm_bytes + self.rows * s.expert_bytes

    def stats(self):
        st = super().stats()
        st.update({"stage_per_layer": self.stage, "stage_rows": self.rows,
                   "admitted_share": round(float(self.admitted.mean()), 3),
                   "reuse": [round(float(x), 3) for x in self.reuse],
                   "copies": int(self.copies.item())})
        return st

    def close(self):
        self.ctx.model.unregister(self.buf)
        super().close()
        self.buf = None


class TierkitPooled(TierkitCopyOnMiss):
    """``copy-on-miss`` with the pool as large as the bank allows: one hot expert and the spare
    per layer, every other slot a staging row of the one pool (``stage_split(slots, pooled=True)``).
    For routing with strong reuse and weak skew, where recency across layers is worth more than a
    static hot set; tierkit's admission and accounting as in ``copy-on-miss``."""

    mode = "pooled"
    pooled = True
