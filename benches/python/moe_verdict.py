"""The end-to-end MoE decode bench's targets (issue 27), recomputed from its JSON lines.

``moe_decode.py --json-out FILE`` appends one JSON object per cell and alternative. This script
reads one or more such files (no torch, no GPU) and prints, per (shape, layers, batch, budget):

- tierkit's tokens/s ÷ the best alternative's (``all-hbm`` excluded: it is the ceiling, not an
  alternative at equal HBM); within 2% counts as a tie, as the issue states;
- tierkit ÷ the shared bank with copy-on-miss (vLLM PR #56177's design);
- the link model's predicted step ÷ the measured p50 (the issue's "within 10%" target);

then the geometric mean of tierkit ÷ shared-bank over the cells with budget ≤ 50% and batch ≥ 8
(target ≥ 1.1) and a count of cells won, tied and missed. Where a file holds the same cell twice
(a re-run), the later line wins.

    python3 benches/python/moe_verdict.py cells.jsonl [more.jsonl ...] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

TIE = 0.02  # within 2% of the best alternative counts as a tie (issue 27)
GEO_TARGET = 1.10  # tierkit ÷ shared-bank, geometric mean over budget ≤ 50%, batch ≥ 8


def read_rows(paths: list[str]) -> dict[tuple, dict[str, dict]]:
    """Cells keyed by (shape, layers, batch, budget) → {alternative: row}; later lines win."""
    cells: dict[tuple, dict[str, dict]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not a JSON line ({e})") from None
                if not isinstance(r, dict) or "alternative" not in r or "tokens_per_s" not in r:
                    continue  # env, shape and routing lines
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
        pred = tk.get("predicted_step_us")
        out.append({
            "shape": shape, "layers": layers, "batch": batch, "budget": budget,
            "tierkit_tok_s": tk["tokens_per_s"], "best": best_name,
            "best_tok_s": best["tokens_per_s"], "vs_best": ratio,
            "verdict": "win" if ratio > 1 + TIE else ("tie" if ratio >= 1 - TIE else "miss"),
            "vs_shared_bank": tk["tokens_per_s"] / sb["tokens_per_s"] if sb else None,
            "pred_vs_p50": pred / tk["step_p50_us"] if pred else None,
        })
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
    a = ap.parse_args(argv)
    rows = verdicts(read_rows(a.files))
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
    off = [r for r in rows if r["pred_vs_p50"] and abs(r["pred_vs_p50"] - 1) > 0.10]
    print(f"tierkit's predicted step within 10% of the measured p50 in "
          f"{len(rows) - len(off)} of {len(rows)} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
