"""``moe_decode.py --swap-cost``: what one applied swap adds to a step of this bench (issue 27's
done-when: "added step time per applied swap ≤ 10 µs beyond the link time of the copy's bytes",
26 µs in the micro-bench).

**How tierkit applies a swap here** (``moe_tierkit.TierkitInPlace``): the whole GPU step is one
CUDA graph; between graph launches ``between_steps`` drains the device counters
(``DeviceCounters.drain_into``, one small D2H read) and calls ``ExpertBank.step``: the controller
commits the swaps whose copies completed (one flip kernel on the step stream, after a GPU-side
wait on each copy's event, then a reader-fence event per swap) and begins new ones (the copy
stream waits on the spare slot's fence, one ``cuMemcpyAsync`` host → spare slot, an event). The
graph reads ``bank.table`` directly, so a flip costs no table upload and no recapture, and nothing
in the swap path syncs the host with the GPU. The copy runs on the bank's copy stream **during**
the next step, sharing the link with that step's in-place reads.

**The measurement**: the same cell (shape, layers, batch, budget) runs tierkit in place with a
controller the bench can force: the published recipe's ratio policy at ratio 1000, a drain every
step, a fixed half-life, no adaptive cadence, at most ``--swap-rate`` swaps begun a step and one
per layer. The bench adds a floor of counts to every expert each step: ``LOW`` to the experts the
cell's timed window never routes (per layer), ``HIGH = 100 × LOW`` to the others, so the
routing's own picks never reach the ratio (no swap on its own) and the least busy hot expert is
a never-routed one; with ``force`` on, each step ``--swap-rate`` layers (round robin) get an
overwhelming count for one cold never-routed expert, which the ratio policy swaps in over a
never-routed hot one. So the swaps go through the library's own decision, executor and bank at a
known rate **without changing what the step reads** (both experts of each swap are unread in the
window; where a layer has none, the least picked ones, and the change is corrected below). The
known rate. Runs alternate without / with forcing (``--runs`` of each, fresh state, ``--warmup``
untimed steps then ``--steps`` timed), and per run pair::

    added per swap = (mean step with − mean step without − Δreads × nb / LINK) / swaps a step
                     − nb / H2D

``Δreads`` = the change in experts read in place a step (counted in the graph), priced at the
model's in-place rate (``moe_stepmodel.LINK_GBPS``), so a swap that changes what the step reads in
place is not charged to the swap path; ``nb / H2D`` = the copy's link time at 55.6 GB/s. Printed
as one JSON line (``"swap_cost"``): the median of the run pairs, each pair's figures, and the
uncorrected difference.
"""

from __future__ import annotations

import statistics

import numpy as np

import moe_stepmodel
from moe_tierkit import TierkitInPlace

LOW = 1000  # counts a never-routed expert gets each step
HIGH = 100 * LOW  # counts every other expert gets: no cold one ever reaches 1000 × LOW by picks
FORCE = 2_000_000_000  # one forced count: the EMA (a decayed sum) passes 1000 × any floor
RATIO = 1000.0


def forced_config(rate: int) -> dict:
    """The controller config of the measurement (the module docstring)."""
    return {"policy": {"kind": "ratio", "ratio": RATIO}, "drain_every": 1,
            "half_life_steps": 4.0, "adaptive": None, "max_swaps_per_layer": 1,
            "max_swaps_per_step": rate, "swap_budget_bytes_per_step": None}


class TierkitForcedSwaps(TierkitInPlace):
    """tierkit in place, its controller forced to swap ``rate`` experts a step while ``force``
    (the module docstring); with ``force`` off the same controller and floor, no swap."""

    mode = "in-place"

    def __init__(self, ctx, budget, rate: int = 1):
        self.rate, self.force = max(int(rate), 1), False
        self.turn = 0
        self.never = None  # bool [L, E]: never routed in the timed window (set by ``measure``)
        super().__init__(ctx, budget)

    def reset(self):
        from tierkit import experts

        super().reset()  # the bank reloaded from the seed map, a fresh default controller ...
        self.ctl = experts.Controller(self.seed_map, forced_config(self.rate))  # ... replaced
        self.turn = 0

    def inject(self):
        """The floors for every expert, and this step's forced experts (``rate`` layers)."""
        s = self.ctx.model.shape
        never = self.never if self.never is not None else np.zeros((s.layers, s.experts), bool)
        add = np.where(never, LOW, HIGH).astype(np.int64)
        if self.force:
            hot = self.ctl.map.hot_sets()
            for i in range(min(self.rate, s.layers)):
                layer = (self.turn + i) % s.layers
                cold = sorted(set(range(s.experts)) - set(hot[layer]))
                if cold:  # a never-routed cold expert, else the least picked in the profile
                    prof = self.ctx.profile[layer]
                    pick = min(cold, key=lambda e: (not never[layer, e], prof[e], e))
                    add[layer, pick] += FORCE
            self.turn = (self.turn + self.rate) % s.layers
        self.pc.add_counts(add)

    def between_steps(self):
        if self.gpu:
            self.counters.drain_into(self.pc)
            self.inject()
            self.bank.step(self.ctl, self.pc)
        else:
            self.inject()
            self.ctl.step(self.pc, self.null)
            self._tables_from(self.ctl.map)


def measure(bench, budget: float, rate: int) -> dict:
    """The ``swap_cost`` JSON object of one cell (the module docstring)."""
    from moe_engine import Engine

    a, s = bench.args, bench.shape
    nb = s.expert_bytes
    alt = TierkitForcedSwaps(bench.ctx, budget, rate)
    window = bench.ids_np[bench.run_range[0]:]  # [steps, L, B, k]: every step a run executes
    routed = np.zeros((s.layers, s.experts), dtype=bool)
    for layer in range(s.layers):
        routed[layer, np.unique(window[:, layer])] = True
    alt.never = ~routed
    eng = Engine(bench.ctx, alt, bench.use_triton, bench.graphs)
    pairs = []
    graphed = False
    try:
        eng.prepare(bench.ids_dev, bench.x_dev, bench.ids_np)
        graphed = eng.graph is not None
        for r in range(a.runs):
            got = {}
            for force in (False, True):
                alt.force = force
                eng.reset()
                eng.run_steps(bench.run_range[: bench.warm], bench.ids_dev, bench.x_dev,
                              bench.ids_np)
                applied0 = alt.ctl.stats.get("applied", 0)
                eng.zero_acct()
                t = eng.run_steps(bench.run_range[bench.warm:], bench.ids_dev, bench.x_dev,
                                  bench.ids_np)
                n = len(t)
                got[force] = {"mean_us": sum(t) / n, "p50_us": statistics.median(t),
                              "swaps_per_step": (alt.ctl.stats.get("applied", 0) - applied0) / n,
                              "reads_per_step": eng.step.acct.tolist()[0] / n}
            off, on = got[False], got[True]
            d = on["mean_us"] - off["mean_us"]
            sw = on["swaps_per_step"]
            dreads = on["reads_per_step"] - off["reads_per_step"]
            link = moe_stepmodel.us(nb, moe_stepmodel.H2D_GBPS)
            corr = moe_stepmodel.us(dreads * nb, moe_stepmodel.LINK_GBPS)
            pairs.append({
                "without": {k: round(v, 2) for k, v in off.items()},
                "with": {k: round(v, 2) for k, v in on.items()},
                "added_us_per_swap": round((d - corr) / sw - link, 2) if sw else None,
                "added_us_per_swap_uncorrected": round(d / sw - link, 2) if sw else None})
    finally:
        eng.close()
        alt.close()
    ok = [p for p in pairs if p["added_us_per_swap"] is not None]
    med = statistics.median(p["added_us_per_swap"] for p in ok) if ok else None
    return {"swap_cost": {
        "shape": s.name, "layers": s.layers, "batch": bench.batch, "budget": budget,
        "expert_bytes": nb, "swap_rate_requested": rate,
        "never_routed_per_layer": round(float(alt.never.sum(1).mean()), 2),
        "copy_link_us": round(moe_stepmodel.us(nb, moe_stepmodel.H2D_GBPS), 2),
        "added_us_per_swap": None if med is None else round(med, 2),
        "target_us": 10.0, "met": None if med is None else med <= 10.0,
        "runs": pairs, "steps_timed": len(bench.run_range) - bench.warm,
        "cuda_graph": graphed, "capture_error": eng.capture_error,
        "device": str(bench.model.device)}}
