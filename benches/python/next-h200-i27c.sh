#!/usr/bin/env bash
# Issue 27, third script: auto with the pooled candidate and the fair trial boot (its candidates
# booted from the steps before their window), on the cells it missed, then the cells not run yet.
# One device call, ~330 s expected, at most ~450 s (the limits below).
#
# Run on the GPU machine from the repository root, carrying `.gpu-py` (the wheel of
# `scripts/py-gpu-check build .gpu-py`) and `.bench-data/mixtral-decode` (the Mixtral logs).
# Everything it writes goes under "$OUT" (logs under "$OUT/logs").
#   a. --check of every tierkit mode (pooled included), Qwen3 widths, 2 layers      ~40 s, limit 75
#   b. the two Qwen3 cells auto missed on the H100 (8 layers; batch 1 at 25%, batch 8 at 75%),
#      every alternative and tierkit's default; then pooled alone on both (diagnostic: its full
#      run beside auto's choice, not a scored row)                                  ~70 s, limit 150
#   c. Mixtral-8x7B, 4 of 32 layers, the real trace, batch {1, 8} x budget {0.5, 0.75}, 10 timed
#      steps after 3 (slow cells)                                                 ~100 s, limit 150
#   d. the 512-expert top-10 shape, 2 of its 24 layers, batch {1, 8} x {0.25, 0.5}  ~65 s, limit 100
#   e. moe_verdict.py over b-d (scored rows only)                                     ~1 s, limit 10
set -u
cd "$(dirname "$0")/../.."
. benches/python/device_steps.sh
CELLS="$OUT/i27c-cells.jsonl"

step check 75 python3 $B --check --shapes qwen3 --layers 2 --batches 8 --budgets 0.25 \
    --alternatives tierkit --tierkit-mode in-place,copy-on-miss,pooled,split,auto --check-steps 6 \
    --json-out "$OUT/i27c-check.jsonl"

step qwen3-b1-25 75 python3 $B --shapes qwen3 --layers 8 --batches 1 --budgets 0.25 \
    --json-out "$CELLS"
step qwen3-b8-75 75 python3 $B --shapes qwen3 --layers 8 --batches 8 --budgets 0.75 \
    --json-out "$CELLS"
for cell in "1 0.25" "8 0.75"; do
    set -- $cell
    step "qwen3-pooled-b$1" 40 python3 $B --shapes qwen3 --layers 8 --batches "$1" --budgets "$2" \
        --alternatives tierkit --tierkit-mode pooled --json-out "$OUT/i27c-pooled.jsonl"
done

step mixtral-4 150 python3 $B --shapes mixtral --layers 4 --trace "$MIXTRAL" --batches 1,8 \
    --budgets 0.5,0.75 --steps 10 --warmup 3 --json-out "$CELLS"

step e512-2 100 python3 $B --shapes e512 --layers 2 --batches 1,8 --budgets 0.25,0.5 \
    --json-out "$CELLS"

step verdict 10 python3 benches/python/moe_verdict.py "$CELLS"
cat "$OUT/logs/verdict.log"
python3 - "$CELLS" "$OUT/i27c-pooled.jsonl" <<'PY' || true
import json, sys
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        r = json.loads(line)
        if r.get("alternative") == "tierkit":
            print(path.rsplit("/", 1)[-1], r["shape"], r["layers"], r["batch"], r["budget"],
                  "mode", r.get("mode"), "auto", json.dumps(r.get("auto")), "tok/s",
                  r["tokens_per_s"], "p50", r["step_p50_us"])
PY
exit $rc
