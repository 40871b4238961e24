# Sourced by the device scripts of `benches/python/` (next-h200-*.sh), from the repository root:
# the environment a lent GPU machine needs for the MoE decode bench and the bounded `step` runner.
#
# Sets OUT (default /tmp/out; logs under $OUT/logs), installs the carried wheel `.gpu-py` into
# /tmp/site when `tierkit.sim` is not importable, MIXTRAL (the Mixtral logs, default
# `.bench-data/mixtral-decode`; a warning when absent), B (the bench script) and rc (0 until a step
# fails).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
if ! python3 -c 'import tierkit.sim' 2>/dev/null; then
    python3 -m pip install -q --no-deps --no-index --target /tmp/site .gpu-py/tierkit-*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
MIXTRAL=${MIXTRAL_TRACE:-.bench-data/mixtral-decode}
[ -d "$MIXTRAL" ] || echo "WARNING: no Mixtral logs at $MIXTRAL: its cells run on generated routing" >&2
B=benches/python/moe_decode.py
rc=0

step() {  # step NAME LIMIT_S CMD...: runs CMD under timeout, its output in $OUT/logs/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    local r=$?
    echo "== $name: exit $r in $((SECONDS - t0)) s (limit $limit s)"
    tail -n 3 "$OUT/logs/$name.log" | cut -c1-400
    [ "$r" -eq 0 ] || rc=1
}
