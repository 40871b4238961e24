"""MoE expert residency: keep each layer's busiest experts in HBM, the rest in host memory.

An engine loop (see bindings/python/README.md for the whole example)::

    g = Geometry(layers=4, experts_per_layer=16, hot_per_layer=4, expert_bytes=16 << 20)
    boot = ResidencyMap.first_k("my-moe", g)          # or fit_seed_map(...) / from_json(...)
    counters = PickCounters(g)
    ctl = Controller(boot, {"drain_every": 8, "half_life_steps": 32})
    executor = MemoryExecutor(boot, 4096, seed=7)      # stands in for the GPU expert bank
    for step in range(steps):
        for layer in range(4):
            counters.record_layer(layer, topk_ids)     # int32/int64 [tokens, k], any strides
        report = ctl.step(counters, executor)          # dict; report["drain"] when it drained
"""

from tierkit._native import (
    Controller,
    ExpertGeometry as Geometry,
    MemoryExecutor,
    NullExecutor,
    PickCounters,
    ResidencyMap,
    fit_seed_map,
    seed_coverage,
)

__all__ = [
    "Controller",
    "Geometry",
    "MemoryExecutor",
    "NullExecutor",
    "PickCounters",
    "ResidencyMap",
    "fit_seed_map",
    "seed_coverage",
]
