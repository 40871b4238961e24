"""The end-to-end MoE decode bench's targets (issue 27), recomputed from its JSON lines.

``moe_decode.py --json-out FILE`` appends one JSON object per cell and alternative. This script
reads one or more such files (no torch, no GPU) and prints, per (shape, layers, batch, budget):

- tierkit's tokens/s ÷ the best alternative's (``all-hbm`` excluded: it is the ceiling, not an
  alternative at equal HBM); within 2% counts as a tie, as the issue states;
- tierkit ÷ the shared bank with copy-on-miss (vLLM PR #56177's design);
- the step-time model's predicted step ÷ the measured p50 (the issue's "within 10%" target),
  recomputed from the rows by ``moe_stepmodel.predict`` (not the rows' stored
  ``predicted_step_us``, which older builds computed with the link-only model);

then the geometric mean of tierkit ÷ shared-bank over the cells with budget ≤ 50% and batch ≥ 8
(target ≥ 1.1) and a count of cells won, tied and missed; then, for tierkit **and every
alternative**, the model's predicted step ÷ the measured p50 and ÷ the measured mean step (the
model predicts a mean: its bytes are per-step means) per cell, a tally of cells within 10% per
alternative and the cells outside it with the model's terms. Where a file holds the same cell
twice (a re-run), the later line wins.

    python3 benches/python/moe_verdict.py cells.jsonl [more.jsonl ...] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_stepmodel  # noqa: E402

TIE = 0.02  # within 2% of the best alternative counts as a tie (issue 27)
GEO_TARGET = 1.10  # tierkit ÷ shared-bank, geometric mean over budget ≤ 50%, batch ≥ 8
PRED_TOL = 0.10  # predicted step within 10% of the measured one (issue 27)


def read_rows(paths: list[str]) -> dict[tuple, dict[str, dict]]:
    """Cells keyed by (shape, layers, batch, budget) → {alternative: row}; later lines win."""
    cells: dict[tuple, dict[str, dict]] = {}
    for path in paths:
        touched = {}  # (shape, batch) -> the last routing line's touched experts per layer
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not a JSON line ({e})") from None
                if isinstance(r, dict) and isinstance(r.get("routing"), dict):
                    touched[(r.get("shape"), r.get("batch"))] = r["routing"].get(
                        "touched_per_layer")
                if not isinstance(r, dict) or "alternative" not in r or "tokens_per_s" not in r:
                    continue  # env, shape and routing lines
                r["_touched"] = touched.get((r["shape"], r["batch"]))
                key = (r["shape"], r["layers"], r["batch"])
                cells.setdefault(key + (r["budget"],), {})[r["alternative"]] = r
                if r["alternative"] == "all-hbm":
                    cells.setdefault(key + ("all-hbm",), {})["all-hbm"] = r
    return cells


def verdicts(cells: dict[tuple, dict[str, dict]]) -> list[dict]:
    out = []
    for key in sorted(k for k in cells if k[3] != "all-hbm"):
        shape, layers, batch, budget = key
        alts = cells[key]
        tk = alts.get("tierkit")
        others = {n: r for n, r in alts.items() if n not in ("tierkit", "all-hbm")}
        if tk is None or not others:
            continue
        best_name, best = max(others.items(), key=lambda kv: kv[1]["tokens_per_s"])
        ratio = tk["tokens_per_s"] / best["tokens_per_s"]
        sb = others.get("shared-bank")
        pred = model_of(tk, alts.get("all-hbm") or cells.get(key[:3] + ("all-hbm",), {}).get(
            "all-hbm"))
        out.append({
            "shape": shape, "layers": layers, "batch": batch, "budget": budget,
            "tierkit_tok_s": tk["tokens_per_s"], "best": best_name,
            "best_tok_s": best["tokens_per_s"], "vs_best": ratio,
            "verdict": "win" if ratio > 1 + TIE else ("tie" if ratio >= 1 - TIE else "miss"),
            "vs_shared_bank": tk["tokens_per_s"] / sb["tokens_per_s"] if sb else None,
            "pred_vs_p50": pred["predicted_us"] / tk["step_p50_us"] if pred else None,
        })
    return out


def model_of(row: dict, ceiling: dict | None, swap_fixed_us=None) -> dict | None:
    """``moe_stepmodel.predict`` of ``row`` (None without its all-HBM row)."""
    if ceiling is None:
        return None
    return moe_stepmodel.predict(row, ceiling, row.get("_touched"), swap_fixed_us)


def model_rows(cells: dict[tuple, dict[str, dict]], swap_fixed_us=None) -> list[dict]:
    """Predicted ÷ measured step for every alternative of every cell that has tierkit (the
    scored cells) and its all-HBM row."""
    out = []
    for key in sorted(k for k in cells if k[3] != "all-hbm"):
        alts = cells[key]
        ceiling = cells.get(key[:3] + ("all-hbm",), {}).get("all-hbm")
        if "tierkit" not in alts or ceiling is None:
            continue
        for name, r in sorted(alts.items()):
            if name == "all-hbm":
                continue
            p = model_of(r, ceiling, swap_fixed_us)
            out.append({"shape": key[0], "layers": key[1], "batch": key[2], "budget": key[3],
                        "alternative": name, "engine": p["engine"], "p50_us": r["step_p50_us"],
                        "mean_us": round(moe_stepmodel.mean_step_us(r), 1),
                        "predicted_us": p["predicted_us"], "terms": p["terms"],
                        "vs_p50": p["predicted_us"] / r["step_p50_us"],
                        "vs_mean": p["predicted_us"] / moe_stepmodel.mean_step_us(r)})
    return out


def render_model(rows: list[dict]) -> str:
    head = ("shape", "L", "batch", "budget", "alternative", "engine", "p50 µs", "mean µs",
            "predicted µs", "÷ p50", "÷ mean")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(v) for v in (
            r["shape"], r["layers"], r["batch"], r["budget"], r["alternative"], r["engine"],
            r["p50_us"], r["mean_us"], r["predicted_us"], f"{r['vs_p50']:.3f}",
            f"{r['vs_mean']:.3f}")) + " |")
    return "\n".join(lines)


def model_tally(rows: list[dict]) -> dict[str, dict]:
    """Per alternative: cells, and how many are within ``PRED_TOL`` of the p50 and of the mean."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["alternative"], {"cells": 0, "p50": 0, "mean": 0})
        t["cells"] += 1
        t["p50"] += abs(r["vs_p50"] - 1) <= PRED_TOL
        t["mean"] += abs(r["vs_mean"] - 1) <= PRED_TOL
    return out


def geomean_vs_shared_bank(rows: list[dict]) -> tuple[float | None, int]:
    xs = [r["vs_shared_bank"] for r in rows
          if r["vs_shared_bank"] and r["budget"] <= 0.5 and r["batch"] >= 8]
    if not xs:
        return None, 0
    return math.exp(sum(math.log(x) for x in xs) / len(xs)), len(xs)


def render(rows: list[dict]) -> str:
    head = ("shape", "L", "batch", "budget", "tierkit tok/s", "best alternative", "its tok/s",
            "tierkit ÷ best", "verdict", "÷ shared-bank", "predicted ÷ p50")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        sb = f"{r['vs_shared_bank']:.2f}" if r["vs_shared_bank"] else ""
        pr = f"{r['pred_vs_p50']:.2f}" if r["pred_vs_p50"] else ""
        lines.append("| " + " | ".join(str(v) for v in (
            r["shape"], r["layers"], r["batch"], r["budget"], r["tierkit_tok_s"], r["best"],
            r["best_tok_s"], f"{r['vs_best']:.3f}", r["verdict"], sb, pr)) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="JSON lines written by moe_decode.py --json-out")
    ap.add_argument("--swap-fixed-us", type=float, help="the model's added time per applied swap "
                    "beyond its link time (default: the micro-bench's 26.2; a --swap-cost "
                    "measurement of moe_decode.py replaces it)")
    a = ap.parse_args(argv)
    cells = read_rows(a.files)
    rows = verdicts(cells)
    if not rows:
        print("no cell with tierkit and an alternative in these files", file=sys.stderr)
        return 1
    print(render(rows))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("win", "tie", "miss")}
    print(f"\ncells: {len(rows)}; tierkit >= the best alternative (2% tie): "
          f"{counts['win']} won, {counts['tie']} tied, {counts['miss']} missed")
    g, n = geomean_vs_shared_bank(rows)
    if g is None:
        print("no cell with budget <= 50% and batch >= 8: no geometric mean vs shared-bank")
    else:
        met = "met" if g >= GEO_TARGET else "MISSED"
        print(f"tierkit / shared-bank, geometric mean over {n} cells with budget <= 50% and "
              f"batch >= 8: {g:.2f} (target >= {GEO_TARGET}: {met})")
    mrows = model_rows(cells, a.swap_fixed_us)
    print("\nthe step-time model (moe_stepmodel.py) against the measured step, every alternative:")
    print(render_model(mrows))
    print()
    for name, t in model_tally(mrows).items():
        print(f"{name}: predicted step within 10% of the measured p50 in {t['p50']} of "
              f"{t['cells']} cells (of the mean step: {t['mean']} of {t['cells']})")
    off = [r for r in mrows if abs(r["vs_p50"] - 1) > PRED_TOL]
    if off:
        print("outside 10% of the p50 (the model's terms, µs):")
        for r in off:
            print(f"  {r['shape']} L{r['layers']} batch {r['batch']} budget {r['budget']} "
                  f"{r['alternative']}: ÷ p50 {r['vs_p50']:.3f}, ÷ mean {r['vs_mean']:.3f}, "
                  f"{json.dumps(r['terms'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
