"""The elastic sparse-attention KV pool and its exact CPU resolver.

One decode step (see bindings/python/README.md for the whole loop)::

    g = Geometry.for_hbm_budget(128 << 10, row_bytes=64, layers=2, page_rows=16,
                                hot_rows=32, tail_rows=16, layer_groups="one")
    pool = ElasticPool(g)
    pool.admit(session, history_bytes)                 # whole tokens of g.token_bytes
    with pool.resolve(sessions, query_start_loc, seq_lens, topk) as r:   # topk: int32 [rows, k]
        ...attention reads the arena at r.indices...   # every layer of the group, until the block ends

``layer_groups`` says which layers share the indexer's picks: ``"per_layer"`` (the default: each
layer resolves its own picks against its own hot cache, as DeepSeek-V3.2's per-layer indexers),
``"one"``, an int n (groups of n layers) or a list of group sizes. A resolve at any layer of a group
fetches its misses into every layer of the group.
    pool.append(session, new_token_bytes)
    pool.between_steps(8)
"""

from tierkit._native import ElasticPool, KvGeometry as Geometry, Resolved, ResolvePlan
from tierkit._native import KV_MAX_BLOCK_POSITIONS as MAX_BLOCK_POSITIONS

#: The most positions per block id ``resolve(..., block_positions=B)`` takes (2**16; block-sparse
#: indexers use 64 to 4096): a larger ``B`` is a ``ValueError`` before any output is sized from it.
MAX_BLOCK_POSITIONS: int

__all__ = ["ElasticPool", "Geometry", "MAX_BLOCK_POSITIONS", "Resolved", "ResolvePlan"]
