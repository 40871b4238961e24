"""The step-time model of the MoE decode bench (issue 27, item 6): the lab's link model extended
with compute and the CPU channel, so a cell's predicted step sits next to the GPU's.

No torch, no GPU: ``predict(row, ceiling, touched)`` reads one JSON row of ``moe_decode.py`` (its
bytes per step, swaps, mode), the all-HBM row of the same (shape, layers, batch) and, when known,
the batch's mean touched experts per layer (its routing line), and returns the predicted step (µs,
a **mean** step: every byte count in a row is a per-step mean) with its terms.

**Why here and not in the lab's ``sim`` crate**: the compute side of the model is this bench's
reference engine, not the library: the all-HBM step of these kernels, how its grouped GEMM
overlaps hot and cold experts (one launch), the planner nodes the shared bank puts in the graph,
cpu-cold's per-layer graphs. The link prices are the lab's (``LinkCost::h200_pcie``'s fixed cost
per copy), refined by this machine's measured rates below.

The step, per alternative (``nb`` = bytes of one expert, ``L`` layers)::

    T = T_allhbm                       # the all-HBM p50 of the same (shape, layers, batch)
        − credit / HBM                 # expert bytes whose HBM reads now overlap cold work
        + R / LINK                     # bytes read in place over PCIe (serial in the layer)
        + K / LINK                     # in-graph copy-kernel bytes (SM loads of mapped memory)
        + S × (nb / H2D + SWAP_FIXED)  # swaps: DMA copies on the bank's stream, sharing the link
        + L × nodes × NODE             # extra graph nodes per layer (planners, counting)
        + CPU                          # cold experts on the CPU, serial with the layer's GPU part

- ``credit``: the grouped GEMM is **one launch** over the layer's active experts (grid = column
  tiles × active experts, ``moe_kernels.py``), so hot experts' programs run beside the cold ones
  and the layer's expert HBM time hides under its in-place reads: credit = ``touched × L × nb``
  for ``in-place`` tierkit and cpu-cold (whose graph A2 of hot experts runs beside the CPU), the
  offloaded layers' bytes (= R) for ``layer-uva``, nothing for the shared bank and copy-on-miss
  (their GEMM reads the copied rows from HBM after the copy). Without ``touched``: the cold bytes.
- ``split`` (tierkit's link + CPU mode): the two channels run at once, so the cold part is
  ``max(R / (LINK × 0.970), P / (cpu × 0.838))`` (``moe_split``'s together shares).
- ``CPU`` = ``P / cpu`` with ``cpu`` the row's ``cpu_expert_gbps`` (measured by the bench on the
  host, outside the timed steps) or ``CPU_GBPS``.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- constants
# Each from a measurement independent of the scored cells (never fitted to them).

# Whole-expert GEMM reads in place over PCIe: moe_channels.py on the H200, 2026-12-03 (Mixtral
# experts, batch 1), `inplace` alone 50.6 GB/s; the limits file (shared/limits/h200-pcie.md):
# zero-copy kernel read of 1 GiB 51.4 GB/s, 4 KiB rows 51.3 GB/s (the lab's 47 is the gather of
# 656 B rows, not these reads).
LINK_GBPS = 50.6
# Host -> HBM DMA copy, pinned, 1 GiB (limits file); moe_channels' copy alone 54.9.
H2D_GBPS = 55.6
# What one applied swap adds beyond its bytes' link time: the micro-bench's 26 µs (the lab's
# LinkCost::h200_pcie copy_fixed_us = 26.2), until this bench's --swap-cost measures its own.
SWAP_FIXED_US = 26.2
# HBM: the limits file's D2D copy, 4.27 TB/s counting read + write (an upper bound of what the
# Triton kernel reaches, so the credit above is a lower bound).
HBM_GBPS = 4270.0
# One small kernel node of a captured graph, µs: the all-HBM batch-1 rows (the ceiling, not scored)
# less their bytes at HBM_GBPS, over ALLHBM_NODES per layer: OLMoE 16 layers (2,861 µs) 3.1,
# OLMoE 8 layers (1,412 µs) 3.1, Qwen3 8 layers (1,449 µs) 3.3; the limits file's standalone
# launch-bound kernel 3.6 µs per launch (outside a graph) bounds it from above.
NODE_US = 3.2
# Kernel nodes of one all-HBM layer, counted from moe_engine.Step (two RMSNorms of 7 elementwise
# kernels each, QKV, O, residual add, router GEMM + float + gather + softmax, the alignment's ~19
# (a stable sort and 16 scatter / fill / scan kernels), index_select, zero, two Triton kernels,
# the top-k sum, cast and residual add): ~47.
ALLHBM_NODES = 47
# Extra nodes per layer, counted the same way: the shared bank's planner (need mask, hit / miss
# masks, lru_plan's two stable argsorts, gathers, four remap / owner / stamp scatters, the copy
# kernel with its address arithmetic, the table composed and copied: ~50); tierkit's copy-on-miss
# (and pooled) the same planner plus the host / staged masks and its table composed from the
# bank's (~58);
# tierkit's in-place counting (DeviceCounters.record: 1); cpu-cold's and split's per-layer
# copies between graphs A1, A2, B (x, xn, w kept, two D2H, one H2D, the add: ~8).
EXTRA_NODES = {"shared-bank": 50, "copy-on-miss": 58, "pooled": 58, "in-place": 1, "split": 9, "cpu-cold": 8}
# The CPU computing experts (torch bf16 on every core): moe_channels.py's `cpu` alone, Mixtral
# experts at batch 1 (the only measurement of the H200 host through this code path before the
# bench measured its own per cell: the row's cpu_expert_gbps).
CPU_GBPS = 50.7
# The channels together (moe_channels.py, inplace+cpu): the link keeps 0.970, the CPU 0.838.
LINK_TOGETHER, CPU_TOGETHER = 0.970, 0.838

CONSTANTS = {"link_gbps": LINK_GBPS, "h2d_gbps": H2D_GBPS, "swap_fixed_us": SWAP_FIXED_US,
             "hbm_gbps": HBM_GBPS, "node_us": NODE_US, "cpu_gbps": CPU_GBPS,
             "extra_nodes": EXTRA_NODES}


def us(nbytes: float, gbps: float) -> float:
    """µs to move ``nbytes`` at ``gbps`` (10⁹ bytes/s)."""
    return nbytes / (gbps * 1e3)


def engine_of(row: dict) -> str:
    """The engine a row ran: the alternative, or tierkit's mode (``in-place`` when unstated)."""
    if row["alternative"] == "tierkit":
        return row.get("mode") or "in-place"
    return row["alternative"]


def mean_step_us(row: dict) -> float:
    """The median run's mean step (µs) from its tokens/s (``batch`` tokens a step)."""
    return row["batch"] * 1e6 / row["tokens_per_s"]


def predict(row: dict, ceiling: dict, touched: float | None = None, swap_fixed_us=None) -> dict:
    """The modelled mean step of ``row`` (µs) and its terms (the module docstring).
    ``ceiling``: the all-HBM row of the same (shape, layers, batch); ``touched``: mean distinct
    experts per layer of the batch (the routing line), None when unknown; ``swap_fixed_us``
    overrides ``SWAP_FIXED_US`` (a --swap-cost measurement)."""
    eng = engine_of(row)
    nb = 6 * row["hidden"] * row["ffn"]
    L = row["layers"]
    steps = max(row.get("steps_timed") or 1, 1)
    R = row["link_read_bytes_per_step"]
    P = row["cpu_expert_bytes_per_step"]
    swaps = row.get("swaps_applied", 0) / steps  # per step (the row's is over its timed steps)
    K = max(row["link_copy_bytes_per_step"] - swaps * nb, 0)  # in-graph copy-kernel bytes
    fixed = SWAP_FIXED_US if swap_fixed_us is None else swap_fixed_us
    t = {"allhbm": ceiling["step_p50_us"]}
    if eng == "all-hbm":
        return {"predicted_us": t["allhbm"], "terms": t, "engine": eng}
    touched_bytes = touched * L * nb if touched else None
    if eng == "layer-uva":
        credit = R
    elif eng in ("in-place", "cpu-cold", "split"):
        credit = touched_bytes if touched_bytes is not None else R + P
        credit = max(credit, R + P)
    else:  # shared-bank, copy-on-miss, pooled: the GEMM reads the copied rows from HBM
        credit = R
    t["hbm_credit"] = -us(credit, HBM_GBPS)
    cpu_rate = row.get("cpu_expert_gbps") or (row.get("split_cpu_gbps") if eng == "split"
                                              else None) or CPU_GBPS
    if eng == "split":
        t["cold"] = max(us(R, LINK_GBPS * LINK_TOGETHER), us(P, cpu_rate * CPU_TOGETHER))
    else:
        t["link_read"] = us(R, LINK_GBPS)
        t["cpu"] = us(P, cpu_rate)
    t["copy_kernel"] = us(K, LINK_GBPS)
    t["swaps"] = swaps * (us(nb, H2D_GBPS) + fixed)
    t["nodes"] = L * EXTRA_NODES.get(eng, 0) * NODE_US
    t = {k: round(v, 1) for k, v in t.items() if v or k == "allhbm"}
    return {"predicted_us": round(sum(t.values()), 1), "terms": t, "engine": eng,
            "cpu_gbps": cpu_rate if P else None}
