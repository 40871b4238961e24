"""Disaggregated prefill/decode through the region-backed host store, with real transfer agents.

Two pools stand for a prefill node and a decode node. Each registers its host store's region with
a transfer agent once; the prefill side admits a history and exports its rows, the decode side
reserves rows for the session, the prefill agent writes them into the decode store in place (NIXL
over UCX, or Mooncake's transfer engine over TCP, both on loopback), the decode side commits and
resolves, and the bytes attention reads equal the source. No mocks: the agents are the packages
`nixl-cu13` and `mooncake-transfer-engine-non-cuda` that `.ci/test` installs (a test says SKIP with
the reason where they cannot be imported).

The agent tests run in a child interpreter that leaves with `os._exit`: nixl-cu13 1.5.1 crashes the
interpreter at exit once an agent was made (a segfault after finalization; reproduced with a bare
`nixl_agent` and no tierkit, and not when Mooncake's engine is imported first), which would fail
the whole pytest run after every test passed.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tierkit import kv

ROW, LAYERS, PAGE = 64, 2, 16
TOKEN = ROW * LAYERS
TOKENS = 300  # a prefilled history: 300 tokens × 2 layers × 64 B


def geometry():
    return kv.Geometry(row_bytes=ROW, layers=LAYERS, page_rows=PAGE, arena_pages=64,
                       hot_rows=32, tail_rows=16)


def store_pool(**kw):
    return kv.ElasticPool(geometry(), max_sessions=4, max_history=1024, **kw)


def history(seed, tokens=TOKENS):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, tokens * TOKEN, dtype=np.uint8)


def assert_reads(pool, session, src):
    """Every position, every layer: the arena rows a resolve returns hold the source's bytes."""
    n = len(src) // TOKEN
    src = src.reshape(n, LAYERS, ROW)
    for layer in range(LAYERS):
        for lo in range(0, n, 16):
            picks = np.arange(lo, min(lo + 16, n), dtype=np.int32)[None, :]
            with pool.resolve([session], [0, 1], [n], picks, layer) as r:
                assert r.valid_count[0] == picks.shape[1]
                for p, row in zip(picks[0], r.indices[0]):
                    assert pool.arena_row(layer, int(row)) == src[p, layer].tobytes(), (p, layer)


SKIPPED = 77  # a child's exit code for "skipped"; the reason is its last line


def isolated(name):
    """Runs test body `name` of this module in a child interpreter that exits with `os._exit`
    (see the module docs), forwarding a skip and failing with the child's output."""
    code = (
        "import os, sys, traceback\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "import pytest, test_transfer as t\n"
        "rc = 0\n"
        "try:\n"
        f"    t.{name}()\n"
        "except pytest.skip.Exception as e:\n"
        "    print(e.msg); rc = 77\n"
        "except BaseException:\n"
        "    traceback.print_exc(); rc = 1\n"
        "sys.stdout.flush(); sys.stderr.flush(); os._exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    print(r.stdout)
    if r.returncode == SKIPPED:
        pytest.skip(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, f"{name} failed in the child (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"


def agent_module(name):
    try:
        return __import__(name)
    except Exception as e:  # ImportError, or a missing shared library (OSError)
        pytest.skip(f"SKIP: {name} cannot be imported here ({type(e).__name__}: {e}); "
                    f"`bash .ci/test` installs it")


# ---- the store without agents -------------------------------------------------------------

def test_regions_layout_and_view_describe_the_store():
    with store_pool() as p:
        [(addr, length, item_len, kind, numa)] = p.regions()
        assert (length, item_len, kind) == (4 * 1024 * TOKEN, TOKEN, "DRAM")
        assert addr % os.sysconf("SC_PAGE_SIZE") == 0 and numa >= -1
        assert p.store_layout() == {"max_slots": 4, "max_history": 1024, "layers": LAYERS,
                                    "row_bytes": ROW}
        h = history(1, 40)
        p.admit(1, h)
        view = p.store_view()
        assert view.shape == (4, 1024, LAYERS, ROW) and view.dtype == np.uint8
        slot = next(s for s in range(4) if view[s, :40].tobytes() == h.tobytes())
        assert view.__array_interface__["data"][0] == addr
        exp = p.export(1)
        assert (exp["slot"], exp["start"], exp["end"], exp["len"]) == (slot, 0, 40, 40 * TOKEN)
        assert exp["addr"] == addr + exp["offset"] == addr + slot * 1024 * TOKEN
        p.export_done(1)
        mem = p.host_memory()
        assert mem["store_bytes"] == length and mem["pinned_bytes"] == 0
        assert mem["allocated_bytes"] <= 1.02 * length
    assert view[slot, :40].tobytes() == h.tobytes(), "the view keeps the memory mapped"
    # The default store has no region.
    plain = kv.ElasticPool(geometry())
    assert plain.regions() == [] and plain.store_view() is None
    with pytest.raises(RuntimeError):
        plain.reserve(1, 0, 4)


def test_bad_transfer_input_raises_and_changes_nothing():
    with store_pool() as p:
        p.admit(1, history(1, 20))
        assert p.reserve(5, 0, 8)["reserved"]
        before = (p.pages(), p.counters(), p.imports(), p.active_sessions)
        for call in (lambda: p.commit(9), lambda: p.abort(9), lambda: p.reserve(5, 4, 12),
                     lambda: p.reserve(5, 8, 2000), lambda: p.reserve(1, 0, 4),
                     lambda: p.finish(5), lambda: p.export(5), lambda: p.export_done(1),
                     lambda: p.resolve([5], [0, 1], [1], np.zeros((1, 1), np.int32)),
                     lambda: p.set_import_timeout(0)):
            with pytest.raises(ValueError):
                call()
            assert (p.pages(), p.counters(), p.imports(), p.active_sessions) == before
        with pytest.raises(ValueError):
            kv.ElasticPool(geometry(), max_sessions=4)


def test_abort_and_timeout_leave_the_pool_as_before():
    with store_pool() as p:
        p.admit(1, history(1, 50))
        p.between_steps()
        before = (p.pages(), p.counters(), p.active_sessions)
        p.reserve(2, 0, 100)
        p.abort(2)
        assert (p.pages(), p.counters(), p.active_sessions) == before
        p.set_import_timeout(2)
        assert p.import_timeout == 2
        p.reserve(2, 0, 100)
        assert p.between_steps()["imports_expired"] == 0
        assert p.between_steps()["imports_expired"] == 1
        assert p.imports()[0]["expired"]
        assert (p.pages(), p.active_sessions) == (before[0], before[2])
        with pytest.raises(RuntimeError):  # a writer outliving its session
            p.commit(2)
        p.abort(2)
        assert p.transfer_counters()["expired"] == 1


# ---- real agents --------------------------------------------------------------------------

def prefill_and_decode():
    """A prefill pool holding session 7's history (exported) and a decode pool with rows
    reserved for it in two chunks (as a chunked prefill pushes them)."""
    src = history(7)
    prefill, decode = store_pool(), store_pool()
    prefill.admit(7, src)
    decode.admit(1, history(1, 64))  # a running decode session
    exp = prefill.export(7)
    half = TOKENS // 2
    lo, hi = decode.reserve(7, 0, half), decode.reserve(7, half, TOKENS)
    assert lo["reserved"] and hi["reserved"] and lo["addr"] + lo["len"] == hi["addr"]
    chunks = [(exp["addr"], lo["addr"], lo["len"]),
              (exp["addr"] + lo["len"], hi["addr"], hi["len"])]
    return src, prefill, decode, chunks


def finish_import(src, prefill, decode):
    before = decode.counters()["page_fill_tokens"]
    assert decode.commit(7)["admitted"]
    assert decode.counters()["page_fill_tokens"] > before, "pages filled from the imported rows"
    decode.check_invariants()
    assert_reads(decode, 7, src)
    assert_reads(decode, 1, history(1, 64))
    prefill.export_done(7)
    prefill.finish(7)


def test_nixl_writes_an_exported_history_into_reserved_rows():
    isolated("case_nixl_writes_an_exported_history_into_reserved_rows")


def case_nixl_writes_an_exported_history_into_reserved_rows():
    nixl = agent_module("nixl_cu13")
    cfg = nixl.nixl_agent_config(backends=["UCX"])
    src, prefill, decode, chunks = prefill_and_decode()
    a, b = nixl.nixl_agent("prefill", cfg), nixl.nixl_agent("decode", cfg)
    order = []
    for agent, pool, name in ((a, prefill, "prefill"), (b, decode, "decode")):
        reg = agent.register_memory([(addr, ln, 0, "") for addr, ln, *_ in pool.regions()],
                                    "DRAM")
        pool.on_teardown(lambda addr, ln, agent=agent, reg=reg, name=name: (
            agent.deregister_memory(reg), order.append(name)))
    remote = a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())
    local = a.get_xfer_descs([(s, ln, 0) for s, _, ln in chunks], "DRAM")
    dst = a.get_xfer_descs([(d, ln, 0) for _, d, ln in chunks], "DRAM")
    h = a.initialize_xfer("WRITE", local, dst, remote, b"kv:7")
    assert a.transfer(h) in ("PROC", "DONE")
    # The decode side keeps stepping while the write is in flight: nothing touches the rows.
    deadline = time.monotonic() + 30
    while (state := a.check_xfer_state(h)) != "DONE":
        assert state != "ERR" and time.monotonic() < deadline, state
        decode.between_steps()
        decode.reclaim(4)
    while not b.check_remote_xfer_done("prefill", b"kv:7"):  # the decode side's notification
        assert time.monotonic() < deadline
    a.release_xfer_handle(h)
    finish_import(src, prefill, decode)
    a.remove_remote_agent("decode")
    b.remove_remote_agent("prefill")
    decode.close()
    prefill.close()
    assert order == ["decode", "prefill"], "deregistered at teardown"


def test_mooncake_writes_an_exported_history_into_reserved_rows():
    isolated("case_mooncake_writes_an_exported_history_into_reserved_rows")


def case_mooncake_writes_an_exported_history_into_reserved_rows():
    engine = agent_module("mooncake.engine")
    TransferEngine = engine.engine.TransferEngine
    src, prefill, decode, chunks = prefill_and_decode()
    a, b = TransferEngine(), TransferEngine()
    for e in (a, b):
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    order = []
    for e, pool, name in ((a, prefill, "prefill"), (b, decode, "decode")):
        for addr, ln, *_ in pool.regions():
            assert e.register_memory(addr, ln) == 0
        pool.on_teardown(lambda addr, ln, e=e, name=name: (
            e.unregister_memory(addr), order.append(name)))
    peer = f"127.0.0.1:{b.get_rpc_port()}"
    rc = a.batch_transfer_sync_write(peer, [s for s, _, _ in chunks], [d for _, d, _ in chunks],
                                     [ln for _, _, ln in chunks])
    assert rc == 0
    finish_import(src, prefill, decode)
    decode.close()
    prefill.close()
    assert order == ["decode", "prefill"]


def vm_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def test_store_memory_with_both_agents_registered_is_within_2_percent():
    isolated("case_store_memory_with_both_agents_registered_is_within_2_percent")


def case_store_memory_with_both_agents_registered_is_within_2_percent():
    nixl = agent_module("nixl_cu13")
    mooncake = agent_module("mooncake.engine").engine
    if vm_kib("VmLck") is None:
        pytest.skip("SKIP: no VmLck in /proc/self/status on this platform")
    na = nixl.nixl_agent("store", nixl.nixl_agent_config(backends=["UCX"]))
    me = mooncake.TransferEngine()
    assert me.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    locked0 = vm_kib("VmLck") + (vm_kib("VmPin") or 0)
    try:
        pool = kv.ElasticPool(geometry(), max_sessions=16, max_history=4096, lock=True)
    except MemoryError as e:
        pytest.skip(f"SKIP: cannot lock the store here ({e})")
    [(addr, length, *_)] = pool.regions()
    reg = na.register_memory([(addr, length, 0, "")], "DRAM")
    assert me.register_memory(addr, length) == 0
    pool.on_teardown(lambda a, n: na.deregister_memory(reg))
    pool.on_teardown(lambda a, n: me.unregister_memory(a))
    mem = pool.host_memory()
    footprint = max(mem["allocated_bytes"], mem["pinned_bytes"])
    locked = vm_kib("VmLck") + (vm_kib("VmPin") or 0) - locked0
    print(f"store {length} B; tierkit: {mem}; locked + pinned grew {locked} B with NIXL and "
          f"Mooncake registered")
    assert mem["store_bytes"] == length == 16 * 4096 * TOKEN
    assert footprint <= 1.02 * length
    assert mem["pinned_bytes"] <= locked <= 1.02 * length, "pinned once, by tierkit alone"
    pool.close()
    assert vm_kib("VmLck") + (vm_kib("VmPin") or 0) - locked0 <= 0, "unlocked at teardown"
