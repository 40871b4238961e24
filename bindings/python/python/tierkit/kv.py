"""The elastic sparse-attention KV pool and its exact CPU resolver.

One decode step (see bindings/python/README.md for the whole loop)::

    g = Geometry.for_hbm_budget(128 << 10, row_bytes=64, layers=2, page_rows=16,
                                hot_rows=32, tail_rows=16)
    pool = ElasticPool(g)
    pool.admit(session, history_bytes)                 # whole tokens of g.token_bytes
    with pool.resolve(sessions, query_start_loc, seq_lens, topk) as r:   # topk: int32 [rows, k]
        pool.replay(r, layer=1)                        # same misses, other layers of the group
        ...attention reads the arena at r.indices...   # rows stay valid until the block ends
    pool.append(session, new_token_bytes)
    pool.between_steps(8)
"""

from tierkit._native import ElasticPool, KvGeometry as Geometry, Resolved, ResolvePlan

__all__ = ["ElasticPool", "Geometry", "Resolved", "ResolvePlan"]
