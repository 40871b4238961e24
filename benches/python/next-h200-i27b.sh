#!/usr/bin/env bash
# Issue 27 on the H200, second script: the added step time per applied swap (--swap-cost), Mixtral
# at 4 layers on its real trace, the 512-expert top-10 shape, and the verdict with the step-time
# model (moe_stepmodel.py). One device call, ~210 s expected, at most 300 s (the limits below).
#
# Run on the H200 from the repository root, carrying `.gpu-py` (the wheel of
# `scripts/py-gpu-check build .gpu-py`) and `.bench-data/mixtral-decode` (the Mixtral logs; README
# "MoE decode end to end"). Everything it writes goes under "$OUT" (logs under "$OUT/logs").
# Estimates from the committed rows (docs/h200/moe-decode-*.jsonl: start-up ~8 s, weights ~2.5 s
# a Mixtral layer, 3.2 GB/s for the others; a cell of 3 runs is (5 + 20) steps x 3 at its step
# time, tierkit auto adds its three candidates, ~2 s each plus 11 steps):
#   a. --swap-cost at OLMoE and Qwen3-30B-A3B widths, 2 layers, batch 1, 50%, one swap forced a
#      step: 3 pairs of runs (without / with) of 20 timed steps after 5, ~7 s a shape measured on
#      the H200 (2026-12-05, a first version of this mode) + start-up and weights    ~30 s, limit 50
#   b. Mixtral-8x7B, 4 of its 32 layers, the real trace, batch {1, 8} x budget {0.5, 0.75}, every
#      alternative and tierkit's default (auto); **10 timed steps after 3** (slow cells: a batch-8
#      step is ~60-110 ms with ~14-16 cold 352 MB experts), median of 3 runs: weights ~10 s,
#      batch 1 ~12 s a budget, batch 8 ~30 s a budget                              ~100 s, limit 140
#   c. the 512-expert top-10 shape (e512: 2048 x 512 experts, one shared expert), 2 of its 24
#      layers (the time), batch {1, 8} x budget {0.25, 0.5}, the bench's defaults (20 timed steps
#      after 5, median of 3): weights ~3 s, ~12 s a cell (cpu-cold's ~60 ms steps the longest) ~65 s,
#      limit 100
#   d. moe_verdict.py over b and c, the model's swap cost taken from a (else its default 26.2 µs)
#                                                                                      ~1 s, limit 10
set -u
cd "$(dirname "$0")/../.."
. benches/python/device_steps.sh
CELLS="$OUT/i27b-cells.jsonl"
SWAP="$OUT/i27b-swap-cost.jsonl"

# a. the added step time per applied swap (done-when: <= 10 µs beyond the copy's link time)
step swap-cost 50 python3 $B --swap-cost --shapes olmoe,qwen3 --layers 2 --batches 1 \
    --budgets 0.5 --swap-rate 1 --json-out "$SWAP"

# b. Mixtral at 4 layers, the real trace (10 timed steps: slow cells)
step mixtral-4 140 python3 $B --shapes mixtral --layers 4 --trace "$MIXTRAL" --batches 1,8 \
    --budgets 0.5,0.75 --steps 10 --warmup 3 --json-out "$CELLS"

# c. the 512-expert top-10 shape at 2 layers
step e512-2 100 python3 $B --shapes e512 --layers 2 --batches 1,8 --budgets 0.25,0.5 \
    --json-out "$CELLS"

# d. the verdict, the model's swap cost from a (the largest of its shapes' medians, >= 0)
FIX=$(python3 - "$SWAP" <<'PY' 2>/dev/null
import json, sys
xs = [json.loads(l)["swap_cost"]["added_us_per_swap"] for l in open(sys.argv[1])
      if '"swap_cost"' in l]
xs = [x for x in xs if x is not None]
print(round(max(max(xs), 0.0), 2) if xs else "")
PY
)
echo "swap cost for the model: ${FIX:-default (26.2 µs)}"
step verdict 10 python3 benches/python/moe_verdict.py "$CELLS" ${FIX:+--swap-fixed-us "$FIX"}
cat "$OUT/logs/verdict.log"
grep -h '"swap_cost"' "$SWAP" 2>/dev/null | cut -c1-600
exit $rc
