"""tierkit.torch on a GPU: the ops equal the Rust API's results, counts stay exact inside a CUDA
graph replayed many times with the controls changed between replays, the KV resolve is bit-exact
against the CPU pool (test_torch_gpu_kv.py), and bad input is an exception.

Skipped test by test (with the reason, so each counts once) without torch, without tierkit's CUDA
ops (a CPU build) or, for the tests that launch, without a CUDA device.
"""

from torch_gpu_helpers import *  # noqa: F401,F403 - the skips, torch, tt and the helpers
from torch_gpu_helpers import NOT_HERE  # noqa: F401


# ------------------------------------------------------------------------------- counting


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_count_op_equals_the_cpu_counters_on_strided_ids(dtype):
    tt.warmup()
    g = experts.Geometry(LAYERS, EXPERTS, HOT)
    dc = tt.DeviceCounters(g)
    rng = np.random.default_rng(1)
    want = np.zeros((LAYERS, EXPERTS), np.int64)
    rejected = 0
    for step in range(20):
        wide = rng.integers(-1, EXPERTS + 2, (33, TOP_K + 3))  # a few bad ids
        ids = torch.tensor(wide, dtype=dtype, device="cuda")[:, 1 : 1 + TOP_K]  # row stride 5
        layer = step % LAYERS
        dc.record(layer, ids)
        rejected += cpu_counts(wide[:, 1 : 1 + TOP_K], layer, want)
    assert (dc.drain().astype(np.int64) == want).all()
    assert dc.rejected_total() == rejected
    assert dc.drain().sum() == 0  # deltas since the last drain
    pc = experts.PickCounters(g)
    dc.record(0, torch.tensor([[1, 2]], dtype=dtype, device="cuda"))
    dc.drain_into(pc)
    assert pc.snapshot()[0].tolist()[1:3] == [1, 1]


@needs_gpu
def test_counts_are_exact_in_a_graph_replayed_many_times():
    tt.warmup()
    g = experts.Geometry(LAYERS, EXPERTS, HOT)
    dc = tt.DeviceCounters(g)
    tokens = 24
    static_ids = torch.zeros((tokens, TOP_K), dtype=torch.int64, device="cuda")
    valid = torch.full((1,), tokens, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as torch recommends
        dc.record(0, static_ids)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    dc.drain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dc.valid_tokens_from(valid)  # the unpadded count, read from a device scalar
        for layer in range(LAYERS):
            dc.record(layer, static_ids)
    rng = np.random.default_rng(2)
    want = np.zeros((LAYERS, EXPERTS), np.int64)
    rejected = 0
    for replay in range(200):
        ids = rng.integers(-1, EXPERTS + 1, (tokens, TOP_K))
        n_valid = int(rng.integers(0, tokens + 1))
        enabled = replay % 7 != 3  # warm-up / draft passes are not counted
        static_ids.copy_(torch.tensor(ids, device="cuda"))
        valid.fill_(n_valid)
        dc.set_enabled(enabled)
        graph.replay()
        for layer in range(LAYERS):
            rejected += cpu_counts(ids, layer, want, n_valid, enabled)
    torch.cuda.synchronize()
    assert (dc.drain().astype(np.int64) == want).all()
    assert dc.rejected_total() == rejected
    with pytest.raises(RuntimeError, match="capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            try:
                dc.drain()
            finally:
                dc.record(0, static_ids)  # something captured so the capture ends cleanly


@needs_gpu
def test_ops_pass_torch_opcheck():
    """Schema (declared mutations) and fake-tensor registration, as torch.compile relies on."""
    g = experts.Geometry(LAYERS, EXPERTS, HOT, 256)
    dc = tt.DeviceCounters(g)
    ids = torch.randint(0, EXPERTS, (8, TOP_K), device="cuda")
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.tierkit.count_topk.default,
                          (ids, dc.counts, dc.rejected, dc.control, 1), test_utils=utils)
    bank = tt.ExpertBank(experts.ResidencyMap.first_k("toy", g))
    out = torch.empty((LAYERS, EXPERTS), dtype=torch.int32, device="cuda")
    lay = bank.layout
    torch.library.opcheck(torch.ops.tierkit.expert_slot_ids.default,
                          (bank.table, out, lay["hbm_ptr"], 256, lay["slots_per_layer"]),
                          test_utils=utils)
    bank.close()


@needs_gpu
def test_count_op_runs_under_torch_compile():
    """The op traced by torch.compile (fake impl, functionalised mutation) counts as eager."""
    g = experts.Geometry(LAYERS, EXPERTS, HOT)
    dc = tt.DeviceCounters(g)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def route_and_count(logits, counts, rejected, control):
        ids = torch.topk(logits, TOP_K, dim=-1).indices
        torch.ops.tierkit.count_topk(ids, counts, rejected, control, 2)
        return ids

    logits = torch.randn((40, EXPERTS), device="cuda")
    ids = route_and_count(logits, dc.counts, dc.rejected, dc.control)
    want = np.zeros((LAYERS, EXPERTS), np.int64)
    cpu_counts(ids.cpu().numpy(), 2, want)
    assert (dc.drain().astype(np.int64) == want).all()


# ------------------------------------------------------------------------------- experts


def expert_bytes_pattern(layer, expert, nbytes):
    return ((np.arange(nbytes) * 7 + layer * 131 + expert * 17) % 251).astype(np.uint8)


@needs_gpu
def test_expert_bank_tables_and_live_swaps_read_the_right_bytes():
    nbytes = 4096
    g = experts.Geometry(LAYERS, EXPERTS, HOT, nbytes)
    boot = experts.ResidencyMap.first_k("toy", g)
    bank = tt.ExpertBank(boot)
    for layer in range(LAYERS):
        for e in range(EXPERTS):
            bank.host[layer, e].copy_(torch.from_numpy(expert_bytes_pattern(layer, e, nbytes)))
    bank.reload(boot)
    assert tt.is_tierkit_pinned(bank.host[1]) and not tt.is_tierkit_pinned(torch.zeros(4))

    def check(m):
        table = bank.table.cpu().numpy().view(np.uint64)
        slots = bank.slot_ids().cpu().numpy()
        lay = bank.layout
        for layer in range(LAYERS):
            hot = set(m.hot_experts(layer))
            for e in range(EXPERTS):
                s = int(slots[layer, e])  # a Python int: int32 arithmetic would overflow (NumPy 2 promotion)
                assert (s >= 0) == (e in hot) == bank.is_hot(layer, e)
                if s >= 0:
                    assert bank.slots_of(layer)[e] == s
                    assert table[layer, e] == lay["hbm_ptr"] + (layer * lay["slots_per_layer"] + s) * nbytes
                    got = bank.slots[layer, s].cpu().numpy()
                else:
                    assert table[layer, e] == lay["host_ptr"] + (layer * EXPERTS + e) * nbytes
                    got = bank.host[layer, e].cpu().numpy()
                assert (got == expert_bytes_pattern(layer, e, nbytes)).all()

    check(boot)
    # the controller swaps live: routing moves to experts 8..11
    dc = tt.DeviceCounters(g)
    pc = experts.PickCounters(g)
    ctl = experts.Controller(boot, {"policy": "ratio", "adaptive": None, "drain_every": 4,
                                   "half_life_steps": 16})
    rng = np.random.default_rng(3)
    for step in range(160):
        busy = 8 + rng.integers(0, 4, (16, TOP_K))
        ids = torch.tensor(busy, dtype=torch.int64, device="cuda")
        for layer in range(LAYERS):
            dc.record(layer, ids)
        dc.drain_into(pc)
        bank.step(ctl, pc)
    torch.cuda.synchronize()
    assert ctl.stats["applied"] > 0
    assert set(ctl.map.hot_experts(0)) == {8, 9, 10, 11}
    check(ctl.map)
    # during a capture the controller refuses a GPU bank however it is called (checked in Rust),
    # and so do reload and close
    tt.warmup()
    for call in (lambda: ctl.step(pc, bank), lambda: ctl.step(pc, bank._native),
                 lambda: bank._native.reload(boot), bank._native.close, bank.close):
        with pytest.raises(RuntimeError, match="capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                try:
                    call()
                finally:
                    dc.record(0, ids)  # something captured so the capture ends cleanly
    assert not bank.closed
    check(ctl.map)
    slots, want = bank.slots, bank.slots.cpu()
    bank.close()
    with pytest.raises(tierkit.ClosedError):
        bank.reload(boot)
    with pytest.raises(tierkit.ClosedError):
        bank.slots_of(0)
    # a view still alive after close() holds the memory: it reads the same bytes, not freed memory
    assert torch.equal(slots.cpu(), want)


@needs_gpu
def test_expert_bank_reload_refuses_swaps_in_flight_unless_cancelled():
    nbytes = 4096
    g = experts.Geometry(LAYERS, EXPERTS, HOT, nbytes)
    boot = experts.ResidencyMap.first_k("toy", g)
    bank = tt.ExpertBank(boot)
    for layer in range(LAYERS):
        for e in range(EXPERTS):
            bank.host[layer, e].copy_(torch.from_numpy(expert_bytes_pattern(layer, e, nbytes)))
    bank.reload(boot)
    dc, pc = tt.DeviceCounters(g), experts.PickCounters(g)
    ctl = experts.Controller(boot, {"policy": "ratio", "adaptive": None, "drain_every": 4,
                                   "half_life_steps": 16})
    rng = np.random.default_rng(5)
    begun = 0
    for _ in range(200):  # until a step leaves swaps in flight (committed at a later step)
        ids = torch.tensor(8 + rng.integers(0, 4, (16, TOP_K)), dtype=torch.int64, device="cuda")
        for layer in range(LAYERS):
            dc.record(layer, ids)
        dc.drain_into(pc)
        begun = bank.step(ctl, pc)["begun"]
        if begun:
            break
    assert begun > 0, "the controller began no swap"
    with pytest.raises(RuntimeError, match="in flight"):
        bank.reload(boot)
    bank.reload(boot, cancel_in_flight=True)
    # the boot map again, every expert's bytes where the table points
    table = bank.table.cpu().numpy().view(np.uint64)
    lay = bank.layout
    for layer in range(LAYERS):
        hot = set(boot.hot_experts(layer))
        for e in range(EXPERTS):
            assert bank.is_hot(layer, e) == (e in hot)
            if e not in hot:
                assert table[layer, e] == lay["host_ptr"] + (layer * EXPERTS + e) * nbytes
        for e, s in bank.slots_of(layer).items():
            assert (bank.slots[layer, s].cpu().numpy() == expert_bytes_pattern(layer, e, nbytes)).all()
    # a new controller on the loaded map drives the bank again
    ctl = experts.Controller(boot)
    bank.step(ctl, pc)
    bank.close()


# ------------------------------------------------------------------------------- engine memory


def callers_weights(nbytes, pin):
    """The experts as one host tensor the caller owns, ``uint8 [LAYERS, EXPERTS, nbytes]``."""
    w = torch.from_numpy(np.stack([np.stack([expert_bytes_pattern(l, e, nbytes)
                                             for e in range(EXPERTS)]) for l in range(LAYERS)]))
    return w.pin_memory() if pin else w.clone()


@needs_gpu
@pytest.mark.parametrize("pin", [True, False])
def test_expert_bank_reads_the_callers_pinned_weights_in_place(pin):
    """``host=``: a pinned tensor is used as it is, a pageable one is registered by tierkit (and
    listed by ``pinned_ranges`` until the bank goes); the table points into the caller's tensor,
    the boot map's slots hold its bytes, and a live swap copies the right bytes from it."""
    import gc

    nbytes = 4096
    g = experts.Geometry(LAYERS, EXPERTS, HOT, nbytes)
    boot = experts.ResidencyMap.first_k("toy", g)
    weights = callers_weights(nbytes, pin)
    slots = torch.empty(LAYERS * (HOT + 1) * nbytes + 16, dtype=torch.uint8, device="cuda")
    bank = tt.ExpertBank(boot, host=weights, slots=slots)
    lay = bank.layout
    base = weights.data_ptr()
    assert lay["host_ptr"] == base  # unified addressing: one address for host and device
    assert lay["hbm_ptr"] == slots.data_ptr()
    rng_ = (base, LAYERS * EXPERTS * nbytes)
    assert (rng_ in tt.pinned_ranges()) == (not pin)
    assert tt.is_tierkit_pinned(weights) == (not pin)

    def check(m):
        table = bank.table.cpu().numpy().view(np.uint64)
        for layer in range(LAYERS):
            hot = bank.slots_of(layer)
            for e in range(EXPERTS):
                if e in hot:
                    s = hot[e]
                    assert table[layer, e] == slots.data_ptr() + (layer * (HOT + 1) + s) * nbytes
                    got = slots.view(-1)[(layer * (HOT + 1) + s) * nbytes:][:nbytes].cpu().numpy()
                    assert (got == expert_bytes_pattern(layer, e, nbytes)).all()
                else:
                    assert table[layer, e] == base + (layer * EXPERTS + e) * nbytes
            assert set(hot) == set(m.hot_experts(layer))

    check(boot)
    dc, pc = tt.DeviceCounters(g), experts.PickCounters(g)
    ctl = experts.Controller(boot, {"policy": "ratio", "adaptive": None, "drain_every": 4,
                                   "half_life_steps": 16})
    rng = np.random.default_rng(5)
    for _ in range(160):
        ids = torch.tensor(8 + rng.integers(0, 4, (16, TOP_K)), dtype=torch.int64, device="cuda")
        for layer in range(LAYERS):
            dc.record(layer, ids)
        dc.drain_into(pc)
        bank.step(ctl, pc)
    torch.cuda.synchronize()
    assert ctl.stats["applied"] > 0 and set(ctl.map.hot_experts(0)) == {8, 9, 10, 11}
    check(ctl.map)
    # the caller's bytes were only read
    assert torch.equal(weights, callers_weights(nbytes, False))
    bank.close()
    bank = lay = None  # the last references: the native bank is freed here
    gc.collect()
    assert rng_ not in tt.pinned_ranges()
    # a registered range is unregistered with the bank: it can be registered again
    again = tt.ExpertBank(boot, host=weights)
    again.close()


@needs_gpu
def test_kv_pool_over_the_callers_arena_resolves_as_the_owned_pool():
    g = kv_geometry()
    need = g.layers * g.arena_rows * g.row_bytes
    mine = torch.full((need // 4 + 4,), 7, dtype=torch.int32, device="cuda")  # any dtype, by bytes
    owned = tt.KvPool(g, max_sessions=4, max_history=1024)
    ours = tt.KvPool(g, max_sessions=4, max_history=1024, arena=mine)
    assert ours.planes[0].data_ptr() == mine.data_ptr()
    for s in range(1, 4):
        hist = np.concatenate([token(s, t) for t in range(200 + 90 * s)])
        assert owned.admit(s, hist) == ours.admit(s, hist)
    sessions = [1, 2, 3]
    i32 = dict(dtype=torch.int32, device="cuda")
    rng = np.random.default_rng(9)
    for step in range(12):
        seq_np = np.array([200 + 90 * s + step for s in sessions], np.int32)
        tk = torch.tensor(np.stack([rng.choice(n, K, replace=False) for n in seq_np]), **i32)
        qsl = torch.arange(len(sessions) + 1, **i32)
        seq = torch.tensor(seq_np, **i32)
        outs = []
        for pool in (owned, ours):
            slot = torch.tensor([pool.slot_of(s) for s in sessions], **i32)
            idx, valid = torch.zeros(len(sessions) * K, **i32), torch.zeros(len(sessions), **i32)
            pool.resolve(tk, qsl, seq, slot, idx, valid, layer=0)
            pool.replay(len(sessions), 1, KV_LAYERS - 1)
            torch.cuda.synchronize()
            outs.append((idx.cpu(), valid.cpu(), [p.cpu() for p in pool.planes]))
        (i0, v0, p0), (i1, v1, p1) = outs
        assert torch.equal(i0, i1) and torch.equal(v0, v1), step
        for a, b in zip(p0, p1):
            assert torch.equal(a, b), step
        for s in sessions:
            t = token(s, int(seq_np[sessions.index(s)]))
            assert owned.append(s, t) == ours.append(s, t)
        assert owned.between_steps(8) == ours.between_steps(8)
    # the rows live in the caller's tensor, byte for byte the owned pool's arena; its tail beyond
    # what the geometry needs is untouched
    torch.cuda.synchronize()
    raw = mine.view(torch.uint8)
    assert torch.equal(raw[:need].cpu(), torch.cat([p.reshape(-1) for p in owned.planes]).cpu())
    assert (mine.view(torch.uint8)[need:].view(torch.int32) == 7).all()
    owned.close()
    ours.close()


def test_engine_memory_is_checked_before_any_device_work():
    """No GPU needed: caller tensors of the wrong kind, layout, alignment or size are refused."""
    g = experts.Geometry(LAYERS, EXPERTS, HOT, 256)
    boot = experts.ResidencyMap.first_k("toy", g)
    need = LAYERS * EXPERTS * 256
    dev = "cuda:0"
    with pytest.raises(TypeError, match="host must be a torch.Tensor"):
        tt.ExpertBank(boot, device=dev, host=np.zeros(need, np.uint8))
    with pytest.raises(ValueError, match="host has .* bytes, the geometry needs"):
        tt.ExpertBank(boot, device=dev, host=torch.zeros(need - 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        tt.ExpertBank(boot, device=dev, host=torch.zeros((need, 2), dtype=torch.uint8)[:, 0])
    with pytest.raises(ValueError, match="16-byte aligned"):
        tt.ExpertBank(boot, device=dev, host=torch.zeros(need + 16, dtype=torch.uint8)[1:])
    with pytest.raises(ValueError, match="slots must be a CUDA tensor"):
        tt.ExpertBank(boot, device=dev, slots=torch.zeros(1 << 16, dtype=torch.uint8))
    kg = kv_geometry()
    with pytest.raises(ValueError, match="arena must be a CUDA tensor"):
        tt.KvPool(kg, 2, 256, device=dev, arena=torch.zeros(16, dtype=torch.uint8))
    with pytest.raises(TypeError, match="arena must be a torch.Tensor"):
        tt.KvPool(kg, 2, 256, device=dev, arena=b"x" * 16)


@needs_gpu
def test_engine_memory_the_device_refuses_is_a_value_error():
    g = experts.Geometry(LAYERS, EXPERTS, HOT, 256)
    boot = experts.ResidencyMap.first_k("toy", g)
    with pytest.raises(ValueError, match="slots has .* bytes"):
        tt.ExpertBank(boot, slots=torch.zeros(256, dtype=torch.uint8, device="cuda"))
    kg = kv_geometry()
    with pytest.raises(ValueError, match="arena has .* bytes"):
        tt.KvPool(kg, 2, 256, arena=torch.zeros(64, dtype=torch.uint8, device="cuda"))
    # a CUDA tensor where host memory is needed
    with pytest.raises(ValueError, match="host must be a CPU tensor"):
        tt.ExpertBank(boot, host=torch.zeros(1 << 16, dtype=torch.uint8, device="cuda"))
    # a range overlapping one another tierkit object registered is refused (that registration
    # ends with that object); the driver's own refusal is tested in Rust (cuda-kernels gpu.rs)
    need = LAYERS * EXPERTS * 256
    w = torch.zeros(need + 4096, dtype=torch.uint8)
    first = tt.ExpertBank(boot, host=w)
    assert (w.data_ptr(), need) in tt.pinned_ranges()
    for t in (w, w[:need], w[1024:]):
        with pytest.raises(ValueError, match="another tierkit object"):
            tt.ExpertBank(boot, host=t)
    first.close()


@needs_gpu
def test_device_memory_another_object_uses_is_refused():
    """Engine memory lent to one object, and tierkit's own HBM (a bank's slots, a pool's arena),
    cannot be lent to a second object while the first is open; disjoint ranges of one tensor can;
    close() releases them."""
    import gc

    g = experts.Geometry(LAYERS, EXPERTS, HOT, 256)
    boot = experts.ResidencyMap.first_k("toy", g)
    need = LAYERS * (HOT + 1) * 256
    mine = torch.zeros(2 * need, dtype=torch.uint8, device="cuda")
    dev = torch.cuda.current_device()
    a = tt.ExpertBank(boot, slots=mine[:need])
    assert (dev, mine.data_ptr(), need) in tt.device_ranges()
    for t in (mine, mine[need - 16 :]):
        with pytest.raises(ValueError, match="another open tierkit object"):
            tt.ExpertBank(boot, slots=t)
    b = tt.ExpertBank(boot, slots=mine[need:])  # adjacent and disjoint
    owned = tt.ExpertBank(boot)
    with pytest.raises(ValueError, match="another open tierkit object"):
        tt.ExpertBank(boot, slots=owned.slots.reshape(-1))
    kg = kv_geometry()
    pool = tt.KvPool(kg, 2, 256)
    assert pool.arena is not None
    with pytest.raises(ValueError, match="another open tierkit object"):
        tt.KvPool(kg, 2, 256, arena=pool.arena.reshape(-1))
    # the storage is what tierkit keeps: re-pointing the caller's tensor frees nothing it uses
    spare = torch.zeros(need, dtype=torch.uint8, device="cuda")
    c = tt.ExpertBank(boot, slots=spare)
    ptr = spare.data_ptr()
    spare.set_(torch.zeros(16, dtype=torch.uint8, device="cuda"))
    gc.collect()
    assert (dev, ptr, need) in tt.device_ranges()
    assert c.slots.data_ptr() == ptr
    other = torch.empty(need, dtype=torch.uint8, device="cuda")  # would reuse a freed block
    assert other.data_ptr() != ptr
    c.reload(boot)
    torch.cuda.synchronize()
    # close() releases the ranges at once, while views of the object still live
    view = a.slots
    a.close()
    assert (dev, mine.data_ptr(), need) not in tt.device_ranges()
    a = tt.ExpertBank(boot, slots=mine[:need])  # rebinding after close() is allowed
    assert view.data_ptr() == mine.data_ptr()
    for o in (a, b, owned, pool, c):
        o.close()
    del a, b, owned, pool, c, o, view
    gc.collect()
    assert not [r for r in tt.device_ranges() if r[0] == dev and mine.data_ptr() <= r[1] < mine.data_ptr() + 2 * need]
    tt.ExpertBank(boot, slots=mine).close()


# ------------------------------------------------------------------------------- bad input


@needs_gpu
def test_bad_input_is_an_exception():
    g = experts.Geometry(LAYERS, EXPERTS, HOT)
    dc = tt.DeviceCounters(g)
    ids = torch.zeros((4, TOP_K), dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="dtype"):
        dc.record(0, ids.float())
    with pytest.raises(ValueError, match="CUDA"):
        dc.record(0, ids.cpu())
    with pytest.raises(TypeError, match="torch.Tensor"):
        dc.record(0, np.zeros((4, 2), np.int32))
    with pytest.raises(ValueError, match="dimension"):
        dc.record(0, ids.ravel())
    with pytest.raises(ValueError, match="column stride"):
        dc.record(0, torch.zeros((TOP_K, 4), dtype=torch.int32, device="cuda").t())
    with pytest.raises(ValueError, match="out of range"):
        dc.record(LAYERS, ids)
    with pytest.raises(ValueError, match="contiguous"):
        torch.ops.tierkit.count_topk(ids, dc.counts.t(), dc.rejected, dc.control, 0)
    with pytest.raises(ValueError, match="elements"):
        torch.ops.tierkit.count_topk(ids, dc.counts, dc.rejected, dc.control[:2], 0)
    with pytest.raises(ValueError, match="range"):
        dc.set_valid_tokens(-2)
    dc.close()
    with pytest.raises(tierkit.ClosedError):
        dc.record(0, ids)

    pool, (topk, qsl, seq, slot, out, valid) = small_kv_pool()
    i32 = dict(dtype=torch.int32, device="cuda")
    pool.resolve(topk, qsl, seq, slot, out, valid)
    torch.cuda.synchronize()
    with pytest.raises(TypeError):
        pool.resolve(topk.long(), qsl, seq, slot, out, valid)
    with pytest.raises(TypeError, match="torch.Tensor"):
        pool.resolve(topk, [0, 1], seq, slot, out, valid)
    with pytest.raises(ValueError, match="elements"):
        pool.resolve(topk, qsl, seq, slot, out[: K - 1], valid)
    with pytest.raises(ValueError, match="entries"):
        pool.resolve(topk, qsl, seq[:0], slot, out, valid)
    with pytest.raises(ValueError, match="max_sessions"):
        pool.resolve(topk, torch.zeros(5, **i32), seq, slot, out, valid)
    with pytest.raises(ValueError, match="CUDA"):
        pool.resolve(topk.cpu(), qsl, seq, slot, out, valid)
    with pytest.raises(ValueError, match="layer"):
        pool.resolve(topk, qsl, seq, slot, out, valid, layer=KV_LAYERS)
    with pytest.raises(ValueError):  # a session the pool does not know
        pool.slot_of(5)
    pool.close()


@needs_gpu
def test_kv_plan_outputs_and_replays_are_checked():
    """The resolve's plan / plan_count / stats outputs are checked like its other arguments, a
    replay names the pool's own plan by address (an aliasing view passes), covers at most the
    last resolve's sessions, and a hand-written plan entry outside the arena is skipped by the
    kernel and counted as stale_plan instead of written."""
    pool, (topk, qsl, seq, slot, out, valid) = small_kv_pool()
    i32 = dict(dtype=torch.int32, device="cuda")
    resolve = torch.ops.tierkit.kv_resolve
    args = lambda plan, count, stats: (pool._id, topk, qsl, seq, slot, out, valid, plan, count,
                                       stats, pool.planes, 0, False, None)
    with pytest.raises(TypeError, match="plan has dtype"):
        resolve(*args(pool.plan.long(), pool.plan_count, pool.stats))
    with pytest.raises(ValueError, match="plan has"):
        resolve(*args(pool.plan[:1], pool.plan_count, pool.stats))
    with pytest.raises(ValueError, match="CUDA"):
        resolve(*args(pool.plan, pool.plan_count.cpu(), pool.stats))
    with pytest.raises(ValueError, match="plan_count has"):
        resolve(*args(pool.plan, pool.plan_count[:0], pool.stats))
    with pytest.raises(ValueError, match="contiguous"):
        resolve(*args(pool.plan, pool.plan_count, pool.stats.t()))
    with pytest.raises(ValueError, match="stats has"):
        resolve(*args(pool.plan, pool.plan_count, pool.stats[0, :1]))
    with pytest.raises(ValueError, match="replay"):  # no resolve yet
        pool.replay(1, 1, 1)
    pool.plan_count[1] = 7  # a stale count past the resolve's sessions: the kernel zeroes it
    pool.resolve(topk, qsl, seq, slot, out, valid)
    torch.cuda.synchronize()
    assert int(pool.plan_count[1]) == 0
    with pytest.raises(ValueError, match="last resolve"):
        pool.replay(2, 1, 1)
    replay = torch.ops.tierkit.kv_replay
    with pytest.raises(ValueError, match="plan has"):
        replay(pool._id, pool.plan[:1], pool.plan_count, pool.planes, 1, 1, 1)
    with pytest.raises(ValueError, match="planes has"):
        replay(pool._id, pool.plan, pool.plan_count, pool.planes[:1], 1, 1, 1)
    with pytest.raises(ValueError, match="shape"):
        replay(pool._id, pool.plan, pool.plan_count, [p[:1] for p in pool.planes], 1, 1, 1)
    # another tensor holding the plan (as functionalization passes it) is accepted, and copies of
    # the planes (functionalization's clones) receive the op's result
    copies = [p.clone().zero_() for p in pool.planes]
    replay(pool._id, pool.plan.clone(), pool.plan_count.clone(), copies, 1, 1, 1)
    torch.cuda.synchronize()
    assert torch.equal(copies[1], pool.planes[1])
    assert pool.errors(clear=True)["stale_plan"] == 0
    before = [p.clone() for p in pool.planes]
    pool.plan[0, 0] = torch.tensor([7, 0, 1 << 30, 0], **i32)  # slot, position, dst_row: all out
    pool.plan[0, 1] = torch.tensor([0, 1 << 30, 0, 0], **i32)  # position out of range
    pool.plan_count[0] = 2
    pool.replay(1, 1, 1)
    torch.cuda.synchronize()
    assert pool.errors()["stale_plan"] == 2
    assert all(torch.equal(a, b) for a, b in zip(before, pool.planes))
    pool.close()


@needs_gpu
def test_kv_ops_pass_torch_opcheck():
    """Schema (declared mutations: the outputs and the arena planes) and fake registration."""
    pool, (topk, qsl, seq, slot, out, valid) = small_kv_pool()
    topk[0, :4] = torch.arange(4, dtype=torch.int32, device="cuda")
    args = (pool._id, topk, qsl, seq, slot, out, valid, pool.plan, pool.plan_count, pool.stats,
            pool.planes, 0, False, None)
    torch.library.opcheck(torch.ops.tierkit.kv_resolve.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    pool.resolve(topk, qsl, seq, slot, out, valid)
    torch.library.opcheck(torch.ops.tierkit.kv_replay.default,
                          (pool._id, pool.plan, pool.plan_count, pool.planes, 1, 1, 1),
                          test_utils=("test_schema", "test_faketensor"))
    torch.cuda.synchronize()
    assert pool.errors()["stale_plan"] == 0
    pool.close()


@needs_gpu
def test_kv_ops_run_under_torch_compile():
    """Resolve + replay traced by torch.compile (aot_eager: functionalised, mutated arguments
    cloned and copied back) give the eager indices, and a read of the arena inside the compiled
    function sees the op's writes (the planes are declared mutated)."""
    def fresh():
        pool, (topk, qsl, seq, slot, out, valid) = small_kv_pool()
        topk[0, :8] = torch.arange(8, 16, dtype=torch.int32, device="cuda")
        return pool, (topk, qsl, seq, slot, out, valid)

    pool, (topk, qsl, seq, slot, out, valid) = fresh()
    pool.resolve(topk, qsl, seq, slot, out, valid)
    pool.replay(1, 1, 1)
    want_out, want_planes = out.clone(), [p.clone() for p in pool.planes]
    pool.close()

    pool, (topk, qsl, seq, slot, out, valid) = fresh()
    pid = pool._id

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(topk, qsl, seq, slot, out, valid, plan, plan_count, stats, planes):
        torch.ops.tierkit.kv_resolve(pid, topk, qsl, seq, slot, out, valid, plan, plan_count,
                                     stats, planes, 0, False, None)
        torch.ops.tierkit.kv_replay(pid, plan, plan_count, planes, 1, 1, 1)
        return planes[0].to(torch.int64).sum(), planes[1].to(torch.int64).sum()

    s0, s1 = step(topk, qsl, seq, slot, out, valid, pool.plan, pool.plan_count, pool.stats,
                  pool.planes)
    torch.cuda.synchronize()
    assert torch.equal(out, want_out)
    assert all(torch.equal(a, b) for a, b in zip(pool.planes, want_planes))
    assert int(s0) == int(want_planes[0].to(torch.int64).sum()) > 0
    assert int(s1) == int(want_planes[1].to(torch.int64).sum()) > 0
    pool.close()


@needs_gpu
def test_pinned_ranges_follow_their_objects():
    """The KV pool's host store is tracked like the bank's; a range stays listed while its memory
    lives (after close(), views still hold it) and leaves the list when the memory is freed."""
    import gc

    pool, _ = small_kv_pool()
    store = (pool.layout["host_ptr"], pool.layout["host_bytes"])
    assert store in tt.pinned_ranges() and store[1] > 0
    pool.close()
    assert store in tt.pinned_ranges(), "the views still hold the memory"
    del pool, _
    gc.collect()
    assert store not in tt.pinned_ranges()
    g = experts.Geometry(LAYERS, EXPERTS, HOT, 256)
    bank = tt.ExpertBank(experts.ResidencyMap.first_k("toy", g))
    lay = bank.layout
    host = (lay["host_ptr"], LAYERS * EXPERTS * 256)
    assert host in tt.pinned_ranges()
    del bank, lay
    gc.collect()
    assert host not in tt.pinned_ranges()


def test_torch_module_loads_with_fake_impls():
    """No GPU needed: the ops are registered, and a bad argument is refused before any launch."""
    assert hasattr(torch.ops.tierkit, "count_topk")
    assert hasattr(torch.ops.tierkit, "kv_resolve")
    ids = torch.zeros((4, 2), dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        torch.ops.tierkit.count_topk(ids, ids, ids, ids, 0)
    with pytest.raises(ValueError, match="CUDA device"):
        tt.DeviceCounters(experts.Geometry(1, 2, 1), device="cpu")


def test_a_step_stream_of_another_device_is_refused():
    """No GPU needed: the step stream's device must be the object's."""
    from types import SimpleNamespace

    from tierkit._gpu.checks import _step_stream

    dev = torch.device("cuda", 0)
    other = SimpleNamespace(device=torch.device("cuda", 1))
    with pytest.raises(ValueError, match="stream is on cuda:1"):
        _step_stream(other, dev)
    same = SimpleNamespace(device=torch.device("cuda", 0))
    assert _step_stream(same, dev) is same
    with pytest.raises(ValueError, match="stream is on cpu"):
        _step_stream(SimpleNamespace(device=torch.device("cpu")), dev)
