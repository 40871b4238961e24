"""tierkit.torch's GPU KV pool on a GPU: per-layer picks read their own layer, the resolve is
bit-exact against the CPU pool in a CUDA graph, block ids resolve as the CPU pool's. Skipped test
by test, with the reason, where torch, the CUDA ops or a device are missing (torch_gpu_helpers)."""

from torch_gpu_helpers import *  # noqa: F401,F403 - the skips, torch, tt and the helpers
from torch_gpu_helpers import NOT_HERE  # noqa: F401


# ------------------------------------------------------------------------------- KV

@needs_gpu
def test_kv_per_layer_picks_read_their_own_layer_on_the_gpu():
    """The reliability issue's reproducer on the device: the default geometry (one layer group per
    layer), layers resolving on their own: each reads its own layer's bytes; a replay across
    groups is refused."""
    g = kv_geometry(None)
    assert g.layer_groups == [1] * KV_LAYERS
    pool = tt.KvPool(g, max_sessions=2, max_history=256)
    assert pool.layout["layer_groups"] == [1] * KV_LAYERS and pool.layout["hot_table_bytes"] > 0
    pool.admit(1, np.concatenate([token(1, t) for t in range(40)]))
    i32 = dict(dtype=torch.int32, device="cuda")
    topk, qsl = torch.full((1, K), -1, **i32), torch.tensor([0, 1], **i32)
    topk[0, 0] = 5
    seq, slot = torch.tensor([40], **i32), torch.tensor([pool.slot_of(1)], **i32)
    for layer in range(KV_LAYERS):
        out, valid = torch.zeros(K, **i32), torch.zeros(1, **i32)
        pool.resolve(topk, qsl, seq, slot, out, valid, layer=layer)
        torch.cuda.synchronize()
        row = pool.planes[layer][int(out[0])].cpu().numpy()
        assert row.tobytes() == token(1, 5)[layer * ROW:(layer + 1) * ROW].tobytes(), layer
    with pytest.raises(ValueError, match="cross layer groups"):
        pool.replay(1, 0, KV_LAYERS)
    assert pool.errors()["stale_plan"] == 0


@needs_gpu
@needs_test_hooks
def test_kv_resolve_is_bit_exact_against_the_cpu_pool_in_a_graph():
    g = kv_geometry()
    cpu = kv.ElasticPool(g)
    gpu = tt.KvPool(g, max_sessions=8, max_history=2048, settle_readers=True)
    tt.warmup()
    length = {}
    for s in range(1, 5):
        n = 300 + 150 * s
        hist = np.concatenate([token(s, t) for t in range(n)])
        assert cpu.admit(s, hist) == gpu.admit(s, hist)
        length[s] = n
    sessions = sorted(length)
    reqs = len(sessions)
    topk = torch.full((reqs, K), -1, dtype=torch.int32, device="cuda")
    qsl = torch.arange(reqs + 1, dtype=torch.int32, device="cuda")
    seq = torch.zeros(reqs, dtype=torch.int32, device="cuda")
    slot = torch.zeros(reqs, dtype=torch.int32, device="cuda")
    indices = torch.zeros(reqs * K + 8, dtype=torch.int32, device="cuda")  # padded buffer
    valid = torch.zeros(reqs + 2, dtype=torch.int32, device="cuda")

    def step_inputs(step):
        rng = np.random.default_rng(100 + step)
        seq_np = np.array([length[s] for s in sessions], np.int32)
        tk = np.stack([rng.choice(n, K, replace=False) for n in seq_np]).astype(np.int32)
        tk[:, -1] = -1
        return seq_np, tk

    def run_eager_once():
        gpu.resolve(topk, qsl, seq, slot, indices, valid, layer=0)
        gpu.replay(reqs, 1, KV_LAYERS - 1)

    # warm-up on a side stream, then capture
    seq_np, tk = step_inputs(-1)
    seq.copy_(torch.tensor(seq_np))
    slot.copy_(torch.tensor([gpu.slot_of(s) for s in sessions], dtype=torch.int32))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_eager_once()
    for step in range(48):
        seq_np, tk = step_inputs(step)
        seq.copy_(torch.tensor(seq_np))
        topk.copy_(torch.tensor(tk))
        slot.copy_(torch.tensor([gpu.slot_of(s) for s in sessions], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        with cpu.resolve(np.array(sessions, np.uint64), np.arange(reqs + 1, dtype=np.int32),
                         seq_np, tk, layer=0) as r:
            cpu.replay(r, 1)
            got_idx = indices.cpu().numpy()
            assert (got_idx[: reqs * K] == r.indices.ravel()).all(), step
            assert (got_idx[reqs * K:] == -1).all()
            assert (valid.cpu().numpy()[:reqs] == r.valid_count).all()
            assert (valid.cpu().numpy()[reqs:] == 0).all()
            planes = [p.cpu().numpy() for p in gpu.planes]
            for i, s in enumerate(sessions):
                for c in range(K):
                    row = int(r.indices[i, c])
                    if row < 0:
                        continue
                    want = token(s, int(tk[i, c]))
                    for layer in range(KV_LAYERS):
                        assert (planes[layer][row] == want[layer * ROW:(layer + 1) * ROW]).all()
                        assert cpu.arena_row(layer, row) == planes[layer][row].tobytes()
        for s in sessions:
            t = token(s, length[s])
            assert cpu.append(s, t) == gpu.append(s, t)
            length[s] += 1
        if step == 20:  # reclaim lent pages under load, then let them grow back
            assert cpu.reclaim(4) == gpu.reclaim(4)
        assert cpu.between_steps(8) == gpu.between_steps(8)
    assert gpu.errors() == {"bad_session": 0, "bad_position": 0, "overflow": 0, "bad_qsl": 0,
                            "stale_plan": 0}
    with pytest.raises(RuntimeError, match="capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            try:
                gpu.admit(99, token(99, 0))
            finally:
                run_eager_once()
    # the native object refuses on its own (checked in Rust on the step stream and torch's
    # current stream), and so does close(); the pool stays usable after
    for call in (lambda: gpu._native.admit(99, token(99, 0)), lambda: gpu._native.reclaim(1),
                 lambda: gpu._native.errors(False), gpu._native.close, gpu.close):
        with pytest.raises(RuntimeError, match="capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                try:
                    call()
                finally:
                    run_eager_once()
    assert not gpu.closed and gpu.slot_of(sessions[0]) >= 0
    gpu.close()
    with pytest.raises(tierkit.ClosedError):
        gpu.resolve(topk, qsl, seq, slot, indices, valid)


@needs_gpu
@needs_test_hooks
def test_kv_block_ids_in_a_graph_equal_the_cpu_pool():
    """Block-id top-k (MiniMax-M3 style, blocks of 8 positions) through the torch op in a CUDA
    graph: the same indices, valid counts and bytes as the CPU pool's resolve of the same ids."""
    B, KB = 8, 4  # 4 block ids per row: 32 output columns
    g = kv_geometry()
    cpu = kv.ElasticPool(g)
    gpu = tt.KvPool(g, max_sessions=4, max_history=1024, settle_readers=True)
    tt.warmup()
    sessions, n = [1, 2], [301, 517]  # lengths ending inside a block
    for s, m in zip(sessions, n):
        hist = np.concatenate([token(s, t) for t in range(m)])
        assert cpu.admit(s, hist) == gpu.admit(s, hist)
    i32 = dict(dtype=torch.int32, device="cuda")
    reqs = len(sessions)
    topk, qsl = torch.full((reqs, KB), -1, **i32), torch.arange(reqs + 1, **i32)
    seq = torch.tensor(n, **i32)
    slot = torch.tensor([gpu.slot_of(s) for s in sessions], **i32)
    indices, valid = torch.zeros(reqs * KB * B, **i32), torch.zeros(reqs, **i32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.resolve(topk, qsl, seq, slot, indices, valid, layer=0, block_positions=B)
    served = 0
    for step in range(8):
        rng = np.random.default_rng(7 + step)
        # the blocks overlapping each length (the last straddles it), one wholly past it, and -1
        tk = np.stack([rng.integers(-1, -(-m // B) + 1, KB) for m in n]).astype(np.int32)
        topk.copy_(torch.tensor(tk))
        graph.replay()
        torch.cuda.synchronize()
        with cpu.resolve(np.array(sessions, np.uint64), np.arange(reqs + 1, dtype=np.int32),
                         np.array(n, np.int32), tk, layer=0, block_positions=B) as r:
            assert (indices.cpu().numpy() == r.indices.ravel()).all(), step
            assert (valid.cpu().numpy() == r.valid_count).all(), step
            planes = [p.cpu().numpy() for p in gpu.planes]
            for i, s in enumerate(sessions):
                for c in range(KB * B):
                    row, p = int(r.indices[i, c]), int(tk[i, c // B]) * B + c % B
                    if row < 0:
                        continue
                    assert tk[i, c // B] >= 0 and p < n[i]
                    want = token(s, p)
                    served += 1
                    for layer in range(KV_LAYERS):
                        assert (planes[layer][row] == want[layer * ROW:(layer + 1) * ROW]).all()
    assert served > 0 and gpu.errors()["bad_position"] == 0
    gpu.close()
