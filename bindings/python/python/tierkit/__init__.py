"""tierkit: memory tiering for LLM inference engines (CPU API).

Submodules:

- ``tierkit.experts``: MoE expert residency (``Geometry``, ``ResidencyMap``, ``PickCounters``,
  ``Controller``, ``MemoryExecutor``, ``NullExecutor``, ``fit_seed_map``, ``seed_coverage``).
- ``tierkit.kv``: the elastic sparse-attention KV pool and its exact CPU resolver
  (``Geometry.for_hbm_budget``, ``ElasticPool``, ``Resolved``, ``ResolvePlan``).
- ``tierkit.sim``: the lab (the expert replay scoreboard, trace readers, the link model), only in
  a wheel built with the ``lab`` feature (``tierkit.has_lab`` says whether this one was); the
  base wheel carries the tiers only, and importing ``tierkit.sim`` there raises ``ImportError``.
- ``tierkit.torch``: the GPU ops (torch custom ops) are a later step; importing it raises
  ``ImportError`` in this build.

Arrays are numpy arrays, CPU tensors through DLPack (torch) or buffer-protocol objects, with
dtype (``TypeError``), shape, alignment and contiguity (``ValueError``) checked. Errors of bad
input are ``ValueError`` (an integer argument out of its range names the argument); host memory
a call cannot allocate is ``MemoryError``; refusals of state or room are ``RuntimeError``; an object used after
``close()`` raises ``ClosedError``; a panic inside the Rust core raises ``InternalError`` (both
``RuntimeError`` subclasses) and never takes the interpreter down. Nothing here starts a thread
that outlives the call that started it.
"""

from tierkit._native import ClosedError, InternalError, __version__
from tierkit._native import has_lab as _has_lab
from tierkit import experts, kv

#: Whether this wheel has the lab (``tierkit.sim``): built with ``--features lab``.
has_lab: bool = _has_lab()

__all__ = ["ClosedError", "InternalError", "__version__", "experts", "has_lab", "kv"]

if has_lab:
    from tierkit import sim  # noqa: E402

    __all__.append("sim")
