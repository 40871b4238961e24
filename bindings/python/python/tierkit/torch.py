"""GPU ops for torch (custom ops on CUDA tensors and streams): a later step.

This build of tierkit has the CPU API only, so importing ``tierkit.torch`` raises
``ImportError``. CPU torch tensors already work everywhere in ``tierkit.experts`` and
``tierkit.kv`` (through DLPack).
"""

raise ImportError(
    "tierkit.torch: this tierkit was built without CUDA ops (the torch GPU ops are a later step); "
    "the CPU API (tierkit.experts, tierkit.kv) takes CPU torch tensors"
)
