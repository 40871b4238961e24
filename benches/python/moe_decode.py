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
  staging rows pooled across every layer; misses tierkit admits by its read-or-copy price are
  copied into them inside the graph and read from HBM in the same step; ``moe_tierkit.py``),
  ``pooled`` (copy-on-miss with one hot expert per layer and every other slot but the spare in
  the pool),
  ``split`` (each cold expert's FFN columns cut between the link and the CPU, the cut priced
  from measured rates; ``moe_split.py``) and ``auto`` (the default: per cell, each of those
  four built and timed on the GPU over the end of the profile window, booted from the steps
  before that window only, the fastest then runs the cell; ``Bench.tierkit_auto``).

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
    python benches/python/moe_decode.py --swap-cost --shapes olmoe --layers 2 --batches 1 \\
        --budgets 0.5        # added step time per applied swap (moe_swapcost.py)

Each row's ``predicted_step_us`` is the step-time model of ``moe_stepmodel.py`` (issue 27, item 6).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import torch

import moe_split
import moe_stepmodel
import moe_swapcost
import moe_tierkit
from moe_alternatives import AllHbm, Alternative, CpuCold, Ctx, LayerUva, SharedBank
from moe_engine import Engine
from moe_kernels import INTERPRETED, triton
from moe_shapes import SHAPES, Shape, compose_batch, correlation, load_trace
from moe_weights import BF16, Model


# The tierkit engine modes (moe_tierkit.py, moe_split.py); auto (the default) is Bench.tierkit_auto:
# per cell, each candidate timed on the GPU over the profile window's last steps, the fastest runs.
TierkitInPlace = moe_tierkit.TierkitInPlace
TIERKIT_MODES = {"in-place": TierkitInPlace, "copy-on-miss": moe_tierkit.TierkitCopyOnMiss,
                 "pooled": moe_tierkit.TierkitPooled, "split": moe_split.TierkitSplit,
                 "auto": None}

ALTERNATIVES = {"all-hbm": AllHbm, "layer-uva": LayerUva, "shared-bank": SharedBank,
                "cpu-cold": CpuCold, "tierkit": None}


def make_alt(name: str, ctx: Ctx, budget: float, mode: str | None = None) -> Alternative:
    """Alternative ``name`` at ``budget``; tierkit in ``mode`` (not ``auto``: ``Bench.engine``)."""
    if name == "tierkit":
        return TIERKIT_MODES[mode or ctx.tierkit_mode](ctx, budget)
    return ALTERNATIVES[name](ctx, budget)


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
        self.ids_np = ids
        self.profile = self.profile_of(P)
        self.ids_dev = torch.from_numpy(ids).to(dev)
        g = torch.Generator(device=dev)
        g.manual_seed(args.seed + batch)
        self.x_dev = torch.randn((total, batch, shape.hidden), generator=g, device=dev).to(BF16)
        self.run_range = list(range(P, total))
        self.warm = W
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self.use_triton = (dev.type == "cuda" or INTERPRETED) and triton is not None and not args.no_triton
        self.graphs = dev.type == "cuda" and not args.no_graphs
        self.ctx = Ctx(model, self.profile, batch, self.stream, args.tierkit_mode, args)
        self.ctx.profile_ids = ids[:P]
        self.ceiling = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # inputs made on the default stream, read on self.stream

    def profile_of(self, steps: int) -> np.ndarray:
        """``int64 [L, E]``: picks per expert over steps ``[0, steps)`` of the composed routing."""
        L = self.shape.layers
        prof = self.ids_np[:steps].reshape(steps, L, -1)
        return np.stack([np.bincount(prof[:, l].ravel(), minlength=self.shape.experts)
                         for l in range(L)]).astype(np.int64)

    def build(self, name, budget, mode=None, use_triton=None, graphs=None):
        """``(alternative, engine)``, kernels compiled and graphs captured, state fresh."""
        alt = make_alt(name, self.ctx, budget, mode)
        ut = self.use_triton if use_triton is None else use_triton
        eng = Engine(self.ctx, alt, ut, self.graphs if graphs is None else graphs)
        try:
            eng.prepare(self.ids_dev, self.x_dev, self.ids_np)
        except BaseException:
            eng.close()
            alt.close()
            raise
        return alt, eng

    def engine(self, name, budget, mode=None, **kw):
        """``build``, with tierkit's ``auto`` resolved by ``tierkit_auto``."""
        if name == "tierkit" and (mode or self.ctx.tierkit_mode) == "auto":
            return self.tierkit_auto(budget, **kw)
        return self.build(name, budget, mode, **kw)

    def tierkit_auto(self, budget, **kw):
        """tierkit's default: **one measured decision per cell**. Each candidate mode
        (``--auto-candidates``) is built as it would run (graphs captured), runs
        ``--auto-warmup`` steps, then ``--auto-steps`` steps timed on the GPU, all from the end of
        the profile window (steps that are never timed in the cell); the fastest median step wins
        and is rebuilt from fresh state for the cell's warm-up and timed runs. **The candidates
        are booted from the steps before that window only** (their seed map, admission rates and
        ranking fitted on ``[0, window start)``): booted from the whole profile, a static map
        would be timed on steps it was fitted on, which flatters the modes that lean on the boot
        map where routing reuses the last steps' experts (on the H100 at Qwen3 batch 1, 25%:
        in-place's window step was 0.67 of its timed step). The row's ``auto`` holds each
        candidate's measured median step (µs)."""
        a = self.args
        P, n, w = a.profile_steps, a.auto_steps, a.auto_warmup
        window = list(range(max(P - n - w, 0), P))
        w = min(w, max(len(window) - 1, 0))
        slots = int(budget * self.shape.experts)
        measured = {}
        full = (self.ctx.profile, self.ctx.profile_ids)
        if window[0] > 0:  # else (a profile no longer than the window): the whole profile
            self.ctx.profile = self.profile_of(window[0])
            self.ctx.profile_ids = self.ids_np[: window[0]]
        try:
            for mode in parse_list(a.auto_candidates, str):
                pooled = mode == "pooled"
                if mode in ("copy-on-miss", "pooled") and (
                        moe_tierkit.stage_split(slots, pooled)[1] == 0
                        or (pooled and moe_tierkit.stage_split(slots, True)
                            == moe_tierkit.stage_split(slots))):
                    continue  # no staging row at this budget, or pooled is copy-on-miss here
                alt, eng = self.build("tierkit", budget, mode, **kw)
                try:
                    eng.run_steps(window[:w], self.ids_dev, self.x_dev, self.ids_np)
                    t = eng.run_steps(window[w:], self.ids_dev, self.x_dev, self.ids_np)
                    measured[mode] = round(statistics.median(t), 1)
                finally:
                    eng.close()
                    alt.close()
        finally:
            self.ctx.profile, self.ctx.profile_ids = full
        if not measured:  # no candidate applies at this budget: in-place's placement
            measured["in-place"] = None
        best = min(measured, key=lambda m: measured[m] or 0.0)
        alt, eng = self.build("tierkit", budget, best, **kw)
        alt.auto = {"chosen": best, "candidates_step_us": measured, "warmup_steps": w,
                    "timed_steps": len(window) - w, "window": [window[0], P],
                    "boot_steps": window[0] or P}
        return alt, eng

    def outputs(self, name, budget, steps, mode=None, use_triton=None, graphs=None):
        """The step outputs of ``steps`` run steps (``float32 [B, H]`` each) from fresh state."""
        alt, eng = self.engine(name, budget, mode, use_triton=use_triton, graphs=graphs)
        try:
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
                             "copies": (st.get("copies", 0) - copies0) / len(t), "stats": st,
                             "share": alt.cpu_share()})
        finally:
            graphed = eng.graph is not None or (eng.split is not None and eng.split.g is not None)
            eng.close()
            hbm = alt.hbm_expert_bytes()
            alt.close()
        med = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]
        t = med["times"]
        share = med["share"]  # split mode: the CPU's share of the cold experts' columns
        row = {"shape": s.name, "layers": L, "experts": s.experts, "top_k": s.top_k,
               "hidden": s.hidden, "ffn": s.ffn, "batch": self.batch, "budget": budget,
               "alternative": name, "hbm_expert_bytes": hbm,
               "hbm_expert_share": round(hbm / (L * s.experts * nb), 4),
               "tokens_per_s": round(med["tok_s"], 1),
               "runs_tokens_per_s": [round(r["tok_s"], 1) for r in runs],
               "step_p50_us": round(statistics.median(t), 1), "step_p99_us": round(pct(t, 0.99), 1),
               "steps_timed": len(t),
               "link_read_bytes_per_step": int(med["host_reads"] * nb * (1 - share)),
               "link_copy_bytes_per_step": int((med["copies"] + med["swaps"] / len(t)) * nb),
               "cpu_expert_bytes_per_step": int((med["cpu_experts"] + med["host_reads"] * share)
                                                * nb),
               "swaps_applied": med["swaps"]}
        row.update({k: v for k, v in med["stats"].items() if k not in ("copies", "swaps_applied")})
        row["cuda_graph"] = graphed
        if name == "cpu-cold":  # the CPU's rate on whole experts, outside the timed steps
            row["cpu_expert_gbps"], row["cpu_rate_tokens"] = self.cpu_rate()
        if eng.capture_error:
            row["capture_error"] = eng.capture_error
        if name == "all-hbm":
            self.ceiling = row
        if self.ceiling is not None:
            row["ratio_to_all_hbm"] = round(row["tokens_per_s"] / self.ceiling["tokens_per_s"], 3)
            p = moe_stepmodel.predict(row, self.ceiling, self.routing.get("touched_per_layer"),
                                      a.swap_fixed_us)
            row["predicted_step_us"] = p["predicted_us"]
            row["predicted_terms"] = p["terms"]
        return row

    def cpu_rate(self) -> tuple[float, int]:
        """``(GB/s, tokens)``: the CPU computing whole experts as cpu-cold does, at the batch's
        mean tokens per touched expert (``moe_split.measure_expert_gbps``; once per bench), for
        the step-time model (``moe_stepmodel``)."""
        if "cpu_expert" not in self.ctx.cache:
            s = self.shape
            touched = self.routing.get("touched_per_layer") or s.top_k
            tokens = max(1, int(round(self.batch * s.top_k / max(touched, 1))))
            gbps = moe_split.measure_expert_gbps(self.model, tokens)
            self.ctx.cache["cpu_expert"] = (round(gbps, 3), tokens)
        return self.ctx.cache["cpu_expert"]


# ----------------------------------------------------------------------------------- check


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(bench: Bench, alts, budgets, steps, tol) -> list[dict]:
    """Every alternative's step outputs against all-HBM's: bit-identical for the GPU ones (the
    same kernel reading equal bytes), within ``tol`` relative L2 where the CPU computes part of
    the step (cpu-cold, tierkit's split); all-HBM's kernel against the float32 torch reference
    within ``tol``. tierkit runs in each mode of ``--tierkit-mode`` (a comma list here)."""
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
            modes = parse_list(bench.args.tierkit_mode, str) if name == "tierkit" else [None]
            for mode in modes:
                outs, st = bench.outputs(name, budget, steps, mode)
                same = all(torch.equal(a, b) for a, b in zip(outs, ref))
                err = max(rel_err(a, b) for a, b in zip(outs, ref))
                exact = name != "cpu-cold" and st.get("mode") != "split"
                ok = same if exact else err <= tol
                rows.append({"check": name, "budget": budget, "shape": bench.shape.name,
                             "batch": bench.batch, "steps": steps, "bit_identical": same,
                             "max_rel_err": err, "ok": ok, "requested_mode": mode,
                             "required": "bit-identical" if exact else f"<= {tol}", **st})
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
    ap.add_argument("--tierkit-mode", default="auto", help="auto (measured per cell among "
                    "--auto-candidates), " + ", ".join(m for m in TIERKIT_MODES if m != "auto") +
                    "; with --check a comma list (each mode checked)")
    ap.add_argument("--auto-candidates", default="in-place,copy-on-miss,pooled,split",
                    help="the modes auto times on the GPU")
    ap.add_argument("--auto-steps", type=int, default=8, help="steps auto times per candidate "
                    "(the end of the profile window)")
    ap.add_argument("--auto-warmup", type=int, default=3, help="untimed steps per candidate first")
    ap.add_argument("--com-admit", default="priced", choices=["priced", "all"],
                    help="copy-on-miss admission: tierkit's read-or-copy price, or every miss")
    ap.add_argument("--com-swaps", default="off", choices=["off", "on"],
                    help="copy-on-miss: the controller's swaps (off: its boot map stays hot)")
    ap.add_argument("--link-gbps", type=float, default=47.0, help="in-place read rate of split's "
                    "price (the lab's h200-pcie)")
    ap.add_argument("--split-cpu-gbps", type=float, help="CPU rate of split's price (default: "
                    "measured per cell on this host)")
    ap.add_argument("--split-cpu-share", type=float, help="force split's CPU share of each cold "
                    "expert (0..1) instead of pricing it")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    ap.add_argument("--profile-steps", type=int, default=32, help="steps counted for the ranked "
                    "placements (cpu-cold's mask, tierkit's seed map), never run")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell (median)")
    ap.add_argument("--quick", action="store_true", help="the reduced matrix (QUICK)")
    ap.add_argument("--check", action="store_true", help="exactness on --check-steps steps")
    ap.add_argument("--check-steps", type=int, default=6)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--swap-fixed-us", type=float, help="the step-time model's added time per "
                    "applied swap beyond its link time (default: moe_stepmodel's 26.2, the "
                    "micro-bench's; a --swap-cost measurement replaces it)")
    ap.add_argument("--swap-cost", action="store_true", help="measure the added step time per "
                    "applied swap (moe_swapcost.py) in each (shape, batch, budget) instead of "
                    "the cells; one JSON line each")
    ap.add_argument("--swap-rate", type=int, default=1, help="--swap-cost: swaps forced a step")
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
    modes = parse_list(a.tierkit_mode, str)
    for m in modes + parse_list(a.auto_candidates, str):
        if m not in TIERKIT_MODES:
            raise SystemExit(f"unknown tierkit mode {m!r} ({', '.join(TIERKIT_MODES)})")
    if len(modes) != 1 and not a.check:
        raise SystemExit("--tierkit-mode names one mode (a comma list only with --check)")
    if "auto" in parse_list(a.auto_candidates, str):
        raise SystemExit("--auto-candidates: auto is not a candidate of itself")
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
                if a.swap_cost:
                    for budget in budgets:
                        t1 = time.perf_counter()
                        obj = moe_swapcost.measure(bench, budget, a.swap_rate)
                        obj["swap_cost"]["wall_s"] = round(time.perf_counter() - t1, 1)
                        emit(obj)
                    continue
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
