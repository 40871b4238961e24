"""The KV tier from Python: the engine loop of examples/kv_engine_loop.rs, outputs, DLPack."""

import numpy as np
import pytest

from tierkit import kv

ROW, LAYERS, K = 64, 2, 16


def token(s, t):
    """Token t of session s: every layer's row filled with a byte derived from (s, t, layer)."""
    return np.repeat((s * 31 + t * 7 + np.arange(LAYERS)) % 256, ROW).astype(np.uint8)


def test_engine_loop_resolves_exactly():
    # Both layers read the indexer's picks: one layer group (each resolve fills both layers).
    g = kv.Geometry.for_hbm_budget(128 << 10, ROW, LAYERS, 16, 32, 16, layer_groups="one")
    assert g.token_bytes == LAYERS * ROW and g.layer_groups == [LAYERS]
    pool = kv.ElasticPool(g)
    length = {}
    for s in range(1, 5):
        n = 400 + 100 * s
        hist = np.concatenate([token(s, t) for t in range(n)])
        assert pool.admit(s, hist)["admitted"]
        length[s] = n
    picks = misses = 0
    for step in range(64):
        sessions = np.array(sorted(length), dtype=np.uint64)
        seq = np.array([length[s] for s in sessions], dtype=np.int32)
        qsl = np.arange(len(sessions) + 1, dtype=np.int32)
        j = np.arange(K)
        topk = np.maximum(seq[:, None] - 1 - 3 * j * j, 0).astype(np.int32)
        topk[:, K - 1] = -1
        with pool.resolve(sessions, qsl, seq, topk, layer=0) as r:
            assert r.plan.group == 0
            for i, s in enumerate(sessions):
                for c in range(K):
                    if topk[i, c] < 0:
                        assert r.indices[i, c] == -1
                        continue
                    want = token(int(s), int(topk[i, c])).tobytes()
                    for layer in range(LAYERS):
                        assert pool.arena_row(layer, int(r.indices[i, c])) == want[layer * ROW:(layer + 1) * ROW]
            picks += r.stats["picks"]
            misses += r.stats["misses"]
        assert r.completed
        for s in list(length):
            assert pool.append(s, token(s, length[s]).tobytes()) == length[s] + 1
            length[s] += 1
        if step == 31:
            pool.finish(1)
            del length[1]
        pool.between_steps(8)
    assert picks > 0 and 0 < misses < picks
    pool.check_invariants()
    pool.close()


def small_pool():
    g = kv.Geometry.for_hbm_budget(16 * 4 * 16 * 2, 16, 2, 4, 8, 4)
    pool = kv.ElasticPool(g)
    history = bytes(b for t in range(20) for b in [t] * 32)
    assert pool.admit(7, history) == {"admitted": True, "borrowed_pages": pool.pages()["history"]}
    return pool


def test_caller_outputs_packed_layout_padding_and_tuple_unpacking():
    pool = small_pool()
    idx = np.full((2, 4), 99, dtype=np.int32)  # longer than rows * k: padding written -1
    valid = np.full(3, 99, dtype=np.int32)
    r = pool.resolve([7], [0, 1], [20], np.array([[0, -1, 19, 5]], dtype=np.int32),
                     indices=idx, valid_count=valid, packed=True)
    assert r.indices is idx and r.valid_count is valid
    assert valid.tolist() == [3, 0, 0] and idx[0, 3] == -1 and (idx[1] == -1).all()
    assert pool.arena_row(0, int(idx[0, 2])) == bytes([5] * 16)
    indices, valid_count, stats = r
    assert stats["picks"] == 3 and len(r.plan) == stats["misses"]
    r.complete()


def test_block_ids_stand_for_their_positions():
    pool = small_pool()
    # Blocks of 4 positions under a bound of 18: block 1 = positions 4..8, block 4 = 16..20
    # straddles the bound (18, 19 come out -1), block 5 lies wholly past it (all -1, not an error).
    topk = np.array([[1, 4, -1, 5]], dtype=np.int32)
    r = pool.resolve([7], [0, 1], [18], topk, block_positions=4)
    assert r.indices.shape == (1, 16)
    want = [4, 5, 6, 7, 16, 17] + [-1] * 10
    for c, p in enumerate(want):
        if p < 0:
            assert r.indices[0, c] == -1
        else:
            assert pool.arena_row(0, int(r.indices[0, c])) == bytes([p] * 16)
    assert r.valid_count.tolist() == [6] and r.stats["picks"] == 6
    r.complete()
    # Packed: the same rows at the front; an id < -1 is refused.
    p = pool.resolve([7], [0, 1], [18], topk, block_positions=4, packed=True)
    assert p.indices[0, :6].tolist() == [i for i in r.indices[0].tolist() if i >= 0]
    assert (p.indices[0, 6:] == -1).all()
    p.complete()
    with pytest.raises(ValueError, match="out of range"):
        pool.resolve([7], [0, 1], [18], np.array([[-2]], np.int32), block_positions=4)


def test_block_positions_past_its_bound_is_refused_before_outputs_are_sized():
    # B = 2**20 with one block id used to allocate a [1, 2**20] output (k × B was the only
    # check: 2**31 columns); a [64, 32767] top-k with B = 65537 asked for 512 GiB.
    pool = small_pool()
    assert kv.MAX_BLOCK_POSITIONS == 2**16
    for b in (kv.MAX_BLOCK_POSITIONS + 1, 2**20, 2**32 - 1):
        with pytest.raises(ValueError, match=r"block_positions = \d+ is out of range: expected 0\.\.=65536"):
            pool.resolve([7], [0, 1], [18], np.array([[0]], np.int32), block_positions=b)
    with pytest.raises(ValueError, match="block_positions = -1 is out of range"):
        pool.resolve([7], [0, 1], [18], np.array([[0]], np.int32), block_positions=-1)
    with pool.resolve([7], [0, 1], [18], np.array([[0]], np.int32),
                      block_positions=kv.MAX_BLOCK_POSITIONS) as r:
        assert r.indices.shape == (1, kv.MAX_BLOCK_POSITIONS)
        assert r.valid_count.tolist() == [18]
    pool.check_invariants()


class FakeTensor:
    """Stands in for a torch tensor: exposes only the DLPack protocol."""

    def __init__(self, array, device=(1, 0)):
        self._a, self._device = array, device

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


def test_dlpack_cpu_tensors_are_taken_and_gpu_ones_refused():
    pool = small_pool()
    topk = FakeTensor(np.array([[0, 5, 19, -1]], dtype=np.int64))
    r = pool.resolve(FakeTensor(np.array([7], dtype=np.uint64)), [0, 1], [20], topk)
    assert r.valid_count.tolist() == [3]
    r.complete()
    with pytest.raises(ValueError, match="not the CPU"):
        pool.resolve([7], [0, 1], [20], FakeTensor(np.zeros((1, 4), np.int32), device=(2, 0)))


def test_torch_cpu_tensors_if_torch_is_installed():
    torch = pytest.importorskip("torch")
    from tierkit import experts
    c = experts.PickCounters(experts.Geometry(1, 8, 2))
    ids = torch.topk(torch.rand(4, 8), 2).indices  # int64 [4, 2]
    c.record_layer(0, ids)
    assert c.snapshot().sum() == 8
    pool = small_pool()
    r = pool.resolve(torch.tensor([7]), torch.tensor([0, 1]), torch.tensor([20]),
                     torch.tensor([[0, 5, 19, -1]], dtype=torch.int32))
    assert r.valid_count.tolist() == [3]


def test_reclaim_takes_back_lent_pages():
    pool = small_pool()
    lent = pool.pages()["history"]
    assert lent > 0
    assert pool.reclaim(lent + 5) == lent
    assert pool.pages()["history"] == 0
    pool.check_invariants()


def test_per_layer_picks_read_their_own_layer():
    """The reliability issue's reproducer: layers picking on their own (the default geometry,
    no layer groups declared) read their own layer's bytes (layer 1 used to read zeros)."""
    g = kv.Geometry(row_bytes=16, layers=2, page_rows=4, arena_pages=16, hot_rows=8, tail_rows=4)
    assert g.layer_groups == [1, 1] and g.group_of(1) == 1
    pool = kv.ElasticPool(g, elastic=False)
    pool.admit(1, np.concatenate([np.r_[np.full(16, t), np.full(16, 100 + t)] for t in range(40)]).astype(np.uint8))
    for layer in (0, 1):
        with pool.resolve([1], [0, 1], [40], np.array([[5]], np.int32), layer=layer) as r:
            assert bytes(pool.arena_row(layer, int(r.indices[0, 0]))) == bytes([5 + 100 * layer] * 16)
            assert r.stats["misses"] == 1 and r.plan.group == layer
    pool.check_invariants()
    # A plan replays only into its own group's layers.
    with pool.resolve([1], [0, 1], [40], np.array([[6]], np.int32), layer=0) as r:
        with pytest.raises(ValueError, match="outside the plan's layer group"):
            pool.replay(r, 1)


@pytest.mark.parametrize("groups, sizes", [
    (None, [1, 1, 1, 1]), ("per_layer", [1, 1, 1, 1]), ("one", [4]), (2, [2, 2]), (3, [3, 1]),
    ([1, 3], [1, 3]), ((2, 1, 1), [2, 1, 1]),
])
def test_layer_groups_forms(groups, sizes):
    g = kv.Geometry(16, 4, 4, 32, 8, 4, layer_groups=groups)
    assert g.layer_groups == sizes
    assert [g.group_of(layer) for layer in range(4)] == [i for i, n in enumerate(sizes) for _ in range(n)]


@pytest.mark.parametrize("groups, exc", [
    ([1, 1], ValueError), ([0, 4], ValueError), ([], ValueError), (0, ValueError), (-1, ValueError),
    ("two", ValueError), (2.5, TypeError), ([1.5, 2.5], TypeError), ({"a": 1}, TypeError),
])
def test_bad_layer_groups_are_refused(groups, exc):
    with pytest.raises(exc):
        kv.Geometry(16, 4, 4, 32, 8, 4, layer_groups=groups)


def test_paged_split_row_format_reads_back_value_then_scale():
    # DeepSeek-V4's paged split row, scaled down: 24 B value + 8 B scale, pages of 16 rows padded
    # to a multiple of 24 B (16 x 32 = 512 -> 528); a resolve at layer 1 returns rows whose bytes
    # are the token's value ‖ scale, as with contiguous rows.
    fmt = {"value": 24, "scale": 8, "page_bytes": 528}
    g = kv.Geometry(32, LAYERS, 16, 24, 32, 16, row_format=fmt)
    assert g.row_format == {**fmt, "page_rows": 16}
    assert g.page_bytes == 528 and g.token_bytes == LAYERS * 32
    assert kv.Geometry(32, LAYERS, 16, 24, 32, 16).row_format is None
    assert kv.Geometry(32, LAYERS, 16, 24, 32, 16, row_format="contiguous").page_bytes == 16 * 32
    pool = kv.ElasticPool(g)
    rng = np.random.default_rng(5)
    hist = rng.integers(0, 256, size=300 * LAYERS * 32, dtype=np.uint8)
    assert pool.admit(1, hist)["admitted"]
    topk = np.array([[0, 17, 150, 299, -1]], dtype=np.int32)
    with pool.resolve(np.array([1], dtype=np.uint64), np.array([0, 1], dtype=np.int32),
                      np.array([300], dtype=np.int32), topk, layer=1) as r:
        for c, p in enumerate(topk[0]):
            if p < 0:
                continue
            at = (int(p) * LAYERS + 1) * 32
            assert pool.arena_row(1, int(r.indices[0, c])) == hist[at:at + 32].tobytes()
    pool.close()
    # DeepSeek-V4 itself: 584-byte rows, 64 per 37,440-byte page; a budget holds padded pages.
    v4 = kv.Geometry.for_hbm_budget(1 << 26, 584, 2, 64, 128, 64, row_format="deepseek_v4")
    assert v4.row_format == {"value": 576, "scale": 8, "page_rows": 64, "page_bytes": 37440}
    assert v4.arena_pages == (1 << 26) // (2 * 37440)
    # Formats that do not fit the geometry are refused.
    for bad in ({"value": 24, "scale": 4, "page_bytes": 528},  # value + scale != row_bytes
                {"value": 24, "scale": 8, "page_bytes": 500},  # the page cannot hold its rows
                {"value": 24, "scale": 8, "page_bytes": 528, "page_rows": 8},
                {"value": 24, "scale": 8},
                {"value": 24, "scale": 8, "page_bytes": 528, "pages": 1},
                "deepseek_v3"):
        with pytest.raises(ValueError):
            kv.Geometry(32, LAYERS, 16, 24, 32, 16, row_format=bad)
    with pytest.raises(TypeError):
        kv.Geometry(32, LAYERS, 16, 24, 32, 16, row_format=[24, 8, 528])
