"""The lab from Python: the expert replay scoreboard on a synthetic scenario, and routing traces'
top-k ids as numpy arrays.

``scoreboard(steps=3000, shift_at=1000)`` replays the scenario through every policy (static,
seed, cost-aware, ratio, ratio-best, recency, lru, static-by-picks, best-static,
offline-optimum; also adaptive, adaptive-shift-response when named) and returns ``{"scenario",
"rows", "table"}``: the same rows and table as ``tierkit experts replay``, every steady-state ratio
against ``best static`` (top-H experts per layer by steps touched, in hindsight) and every
whole-trace stall against the ``offline optimum`` (``stall_vs_optimum``).

``trace_ids(paths)`` reads any trace ``tierkit experts replay --trace`` reads (Mixtral decode
JSONL, engine routing logs, ``.tkt``, ...) and ``synth_ids(steps=..., tokens_per_step=...)``
generates one (the OLMoE scenario, or Zipf popularity at any ``shape``); both return a dict with
the shape, ``shifts`` and ``ids`` (``int32 [steps, layers, tokens, top_k]``, ``-1`` padding), what
a GPU benchmark replays as router output (``benches/python/moe_decode.py``).

``link_stall_us(read_bytes, copies, copy_bytes, link="h200-pcie")`` is the lab's link model of
one step: the stall that in-place reads and swap copies add (the replay's stall column).

Only in a wheel built with the ``lab`` feature (``maturin build --release --features lab``, or
``MATURIN_PEP517_ARGS="--features lab" pip install ./bindings/python``); in the base wheel, which
carries the tiers only, importing this module raises ``ImportError``.
"""

from tierkit import _native

if not _native.has_lab():
    raise ImportError(
        "tierkit.sim needs the lab: this tierkit wheel was built without the `lab` feature "
        "(rebuild with `maturin build --features lab`, or "
        "`MATURIN_PEP517_ARGS=\"--features lab\" pip install ./bindings/python`)"
    )

from tierkit._native import link_stall_us, scoreboard, synth_ids, trace_ids

__all__ = ["link_stall_us", "scoreboard", "synth_ids", "trace_ids"]
