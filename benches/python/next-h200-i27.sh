#!/usr/bin/env bash
# Issue 27's three missed cells on the H200, with tierkit's rebuilt modes: one device call, ~2 min
# expected, at most 310 s (the sum of the limits below).
#
# Run on the H200 from the repository root, carrying `.gpu-py` (the wheel of
# `scripts/py-gpu-check build .gpu-py`) and `.bench-data/mixtral-decode` (the Mixtral logs; README
# "MoE decode end to end"). Everything it writes goes under "$OUT" (logs under "$OUT/logs").
# Steps, each bounded by `timeout` (estimates from the 2026-12-04 rows in docs/h200/*.jsonl:
# weights 5-7 s per shape, 0.2-3 s per alternative's cell of 3 runs, plus tierkit auto's three
# candidates built, captured and timed over 8 profile-window steps, ~2 s each):
#   a. --check of every tierkit mode (in-place, copy-on-miss, split, auto) at Qwen3-30B-A3B's
#      widths, 2 layers, batch 8, 25%: bit-identical to all-HBM (split: within 2e-2)   ~30 s
#      (limit 75 s: the Triton compiles of a bare machine are in it)
#   b. the three missed cells, every alternative and tierkit's default (auto), 20 timed steps
#      after 5 of warm-up, median of 3 runs (the bench's defaults)      ~30 s each, limit 75 s
#   c. moe_verdict.py over the cells                                                     ~1 s
set -u
cd "$(dirname "$0")/../.."
. benches/python/device_steps.sh
CELLS="$OUT/i27-cells.jsonl"

# a. exactness of every tierkit mode
step check 75 python3 $B --check --shapes qwen3 --layers 2 --batches 8 --budgets 0.25 \
    --alternatives tierkit --tierkit-mode in-place,copy-on-miss,split,auto --check-steps 6 \
    --json-out "$OUT/i27-check.jsonl"

# b. the three missed cells (tierkit = auto, the default)
step qwen3-b1-25 75 python3 $B --shapes qwen3 --layers 8 --batches 1 --budgets 0.25 \
    --json-out "$CELLS"
step qwen3-b8-75 75 python3 $B --shapes qwen3 --layers 8 --batches 8 --budgets 0.75 \
    --json-out "$CELLS"
step mixtral-b1-50 75 python3 $B --shapes mixtral --layers 2 --trace "$MIXTRAL" --batches 1 \
    --budgets 0.5 --json-out "$CELLS"

# c. the verdict (tierkit against the best alternative per cell; the mode auto chose per cell)
step verdict 10 python3 benches/python/moe_verdict.py "$CELLS"
cat "$OUT/logs/verdict.log"
python3 - "$CELLS" <<'PY' || true
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("alternative") == "tierkit":
        print(r["shape"], r["batch"], r["budget"], "mode", r.get("mode"), "auto",
              json.dumps(r.get("auto")), "tok/s", r["tokens_per_s"])
PY
exit $rc
