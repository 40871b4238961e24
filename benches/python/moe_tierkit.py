"""tierkit's engine modes for ``moe_decode.py`` beyond ``in-place`` (issue 27, item 4).

- ``copy-on-miss``: the HBM budget of a layer (``floor(budget × experts)`` slots) is split into
  tierkit's ``ExpertBank`` (``hot`` slots + its spare, the controller's hot set: swaps decided
  between steps by the default ``Controller``, as ``in-place``) and ``stage`` **staging rows** per
  layer (``stage = (slots - 1) // 2``, ``hot = slots - 1 - stage``). Inside the captured step,
  before each layer's GEMMs, a device-side planner (torch ops, capturable) copies the layer's
  missed cold experts from the host copy into staging rows (the same fixed-grid copy kernel as
  ``shared-bank``; the victim is the least recently used row not used by this layer in this step)
  and the layer's table points them there, so they are computed from HBM in the same step and hit
  on later steps. **Admission is tierkit's**: only experts ranked within ``hot + 2·stage`` of their
  layer by the controller's pick EMA (``Controller.ema()``; the profile counts before its first
  drain) are copied; a miss outside that set (a one-off) is read in place and evicts nothing.
  Hot experts always come from the bank (the bank's table wins over a staging row).
- ``auto`` (the default ``--tierkit-mode``): per cell, before the first step, replays the
  profile window's routing through both modes' placements (the profile's top experts hot, the
  staging rows as LRU with the admission above) and prices each step's bytes with the lab's link
  model (``tierkit.sim.link_stall_us``: in-place reads at the read rate, each copy at the copy
  rate with its fixed cost). Rule: copy-on-miss when its predicted link time over the window is
  below in-place's (a tie keeps in-place). The choice, both predictions and the window's reuse
  (share of a step's needed cold experts that the previous step of the same layer also needed)
  are in the row (``mode``, ``auto``).

What the library lacks (so the bench does it with torch ops around the public API): ``ExpertBank``
has no capturable on-miss copy into bank-owned rows (its copies are the controller's swaps, issued
between steps by ``bank.step``), so the staging rows are a torch tensor beside the bank and the
layer's table is composed from ``bank.table`` and the staging remap; the ``Controller`` has no
admission decision for a single miss (copy or read in place), so admission is derived from its
``ema()``; and no per-layer, per-step read-or-copy price is exposed to a capturable planner, so
``auto`` decides once per cell. Bit-exactness holds: a staged row holds the expert's bytes
exactly, and the same kernel reads through the table.
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


# The tierkit engine modes (moe_tierkit.py): in-place, copy-on-miss with tierkit's admission, and
# auto (the default: one of the two per cell, priced on the profile window by the link model).


def stage_split(slots: int) -> tuple[int, int]:
    """``(hot, stage)`` of a layer's ``slots`` HBM slots: one is the bank's spare; of the rest,
    half (rounded down) are staging rows, the others hot (at least one hot)."""
    stage = max((slots - 1) // 2, 0)
    hot = max(slots - 1 - stage, 1)
    return hot, stage


def admit_mask(scores: np.ndarray, keep: int) -> np.ndarray:
    """``bool [L, E]``: each layer's ``keep`` highest-scoring experts (ties by lower id), those
    with a score > 0 only."""
    order = np.argsort(-scores, axis=1, kind="stable")
    mask = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(mask, order[:, :keep], True, axis=1)
    return mask & (scores > 0)


class TierkitCopyOnMiss(TierkitInPlace):
    mode = "copy-on-miss"

    def hot_slots(self):
        return stage_split(self.slots_per_layer)[0]

    def __init__(self, ctx, budget):
        super().__init__(ctx, budget)
        m, s = ctx.model, ctx.model.shape
        L, E, dev = s.layers, s.experts, m.device
        self.stage = stage_split(self.slots_per_layer)[1]
        S = self.stage
        self.buf = torch.empty((L, max(S, 1), s.expert_bytes), dtype=torch.uint8, device=dev)
        m.register(self.buf)
        self.remap = torch.empty((L, E + 1), dtype=torch.int64, device=dev)  # + sentinel
        self.owner = torch.empty((L, S + 1), dtype=torch.int64, device=dev)
        self.last = torch.empty((L, S + 1), dtype=torch.int64, device=dev)
        self.admit = torch.zeros((L, E), dtype=torch.bool, device=dev)
        self.stamp = torch.zeros(1, dtype=torch.int64, device=dev)
        self.copies = torch.zeros(1, dtype=torch.int64, device=dev)
        self.own = torch.zeros((L, E), dtype=torch.int64, device=dev)
        self.ar = torch.arange(E, dtype=torch.int64, device=dev)
        self.keep = self.hot + 2 * S
        self._stage_reset()

    def _stage_reset(self):
        self.remap.fill_(-1)
        self.owner.fill_(-1)
        self.last.fill_(0)
        self.stamp.zero_()
        self.copies.zero_()
        self.admitted = admit_mask(self.ctx.profile.astype(np.float64), self.keep)
        self.admit.copy_(torch.from_numpy(self.admitted))

    def reset(self):
        super().reset()
        if hasattr(self, "remap"):
            self._stage_reset()

    def _tables_from(self, rmap):
        super()._tables_from(rmap)
        self.base = self.tables

    def between_steps(self):
        super().between_steps()
        ema = np.asarray(self.ctl.ema())
        if ema.any():
            adm = admit_mask(ema + 1e-9 * self.ctx.profile, self.keep)
            if not np.array_equal(adm, self.admitted):
                self.admitted = adm
                self.admit.copy_(torch.from_numpy(adm))

    def table(self, layer, ids_l, step):
        m, s = self.ctx.model, self.ctx.model.shape
        base = (self.bank.table if self.gpu else self.base)[layer]
        if self.stage == 0:
            self.own[layer].copy_(base)
            return self.own[layer]
        E, S, nb = s.experts, self.stage, s.expert_bytes
        M = min(E, ids_l.numel(), S)
        need = torch.zeros(E, dtype=torch.bool, device=m.device)
        need.scatter_(0, ids_l.reshape(-1), True)
        cold = need & (base >= m.host_lo) & (base < m.host_hi)
        now = self.stamp + 1
        rows_l = self.remap[layer]
        miss = cold & (rows_l[:E] < 0) & self.admit[layer]
        row0 = self.buf.data_ptr() + layer * S * nb  # the layer's first staging row
        gid, victim, ok = lru_plan(rows_l, rows_l[:E], self.owner[layer], self.last[layer],
                                      now, cold & (rows_l[:E] >= 0), miss, M, 0, E, self.ar)
        self.copies += copy_planned(step, m, m.host_lo + (layer * E + gid) * nb,
                                       row0 + victim * nb, ok, M)
        r = rows_l[:E]
        staged = (r >= 0) & (base >= m.host_lo) & (base < m.host_hi)
        t = torch.where(staged, row0 + r * nb, base)
        self.own[layer].copy_(t)
        return self.own[layer]

    def used_tables(self):
        return self.own

    def end_step(self, step):
        self.stamp += 1

    def hbm_expert_bytes(self):
        s = self.ctx.model.shape
        return self.geometry.hbm_bytes + s.layers * self.stage * s.expert_bytes

    def stats(self):
        st = super().stats()
        st.update({"stage_per_layer": self.stage, "copies": int(self.copies.item())})
        return st

    def close(self):
        self.ctx.model.unregister(self.buf)
        super().close()
        self.buf = None


def auto(ctx, budget):
    """``auto``: in-place or copy-on-miss for this cell, priced on the profile window."""
    choice = choose(ctx, budget)
    cls = TierkitCopyOnMiss if choice["mode"] == "copy-on-miss" else TierkitInPlace
    alt = cls(ctx, budget)
    alt.auto = choice
    return alt


def simulate(ids: np.ndarray, profile: np.ndarray, hot: int, stage: int, keep: int) -> dict:
    """Replays ``ids int64 [steps, L, B, k]`` through a placement: each layer's ``hot`` most
    profiled experts resident, ``stage`` LRU staging rows admitting only the ``keep`` most
    profiled (``stage = 0``: in place). Returns per-step means ``reads`` (cold experts read in
    place) and ``copies`` (staged), and ``reuse``."""
    steps, L = ids.shape[:2]
    order = np.argsort(-profile, axis=1, kind="stable")
    reads = copies = 0
    reuse_num = reuse_den = 0
    for layer in range(L):
        hotset = set(order[layer, :hot].tolist())
        admit = set(order[layer, :keep].tolist()) & set(np.nonzero(profile[layer])[0].tolist())
        rows: dict[int, int] = {}  # expert -> last step used
        prev: set[int] = set()
        for s in range(steps):
            need = set(np.unique(ids[s, layer]).tolist()) - hotset
            reuse_num += len(need & prev)
            reuse_den += len(need)
            prev = need
            for e in sorted(need):
                if e in rows:
                    rows[e] = s
                    continue
                if e in admit and stage:
                    if len(rows) < stage:
                        rows[e] = s
                        copies += 1
                        continue
                    victim = min(rows, key=lambda x: (rows[x], x))
                    if rows[victim] < s:
                        del rows[victim]
                        rows[e] = s
                        copies += 1
                        continue
                reads += 1
    return {"reads": reads / steps, "copies": copies / steps,
            "reuse": round(reuse_num / max(reuse_den, 1), 3)}


def choose(ctx, budget: float) -> dict:
    """The ``auto`` rule (see the module docstring): both modes' link time over the profile
    window by ``tierkit.sim.link_stall_us``; copy-on-miss when strictly cheaper."""
    from tierkit import sim

    s = ctx.model.shape
    nb = s.expert_bytes
    slots = int(budget * s.experts)
    ids = ctx.profile_ids
    hot_cm, stage = stage_split(slots)
    ip = simulate(ids, ctx.profile, max(slots - 1, 1), 0, 0)
    cm = simulate(ids, ctx.profile, hot_cm, stage, hot_cm + 2 * stage)
    copy_us = sim.link_stall_us(0, 1, nb)["stall_us"]

    def price(r):
        return sim.link_stall_us(int(r["reads"] * nb), 0, 0)["stall_us"] + r["copies"] * copy_us

    p_ip, p_cm = price(ip), price(cm)
    mode = "copy-on-miss" if stage > 0 and p_cm < p_ip else "in-place"
    return {"mode": mode, "pred_in_place_us": round(p_ip, 1),
            "pred_copy_on_miss_us": round(p_cm, 1),
            "reuse": ip["reuse"], "in_place_reads": ip["reads"], "com_reads": cm["reads"],
            "com_copies": cm["copies"]}


MODES = {"in-place": TierkitInPlace, "copy-on-miss": TierkitCopyOnMiss, "auto": auto}
