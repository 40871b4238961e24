"""Host memory the input or the geometry sizes, under an address-space limit (as a container's
memory limit): MemoryError, and the objects go on working — never an abort of the interpreter.

The calls run in a child interpreter whose address space is capped (`resource.setrlimit
(RLIMIT_AS)`) at what it maps after its setup plus HEADROOM; the big inputs are lazily zeroed
numpy arrays, never touched, so nothing large is ever written.
"""

import os
import subprocess
import sys

import pytest

HEADROOM = 64 << 20

CHILD = r"""
import resource, sys
import numpy as np
from tierkit import experts, kv

pool = kv.ElasticPool(kv.Geometry.for_hbm_budget(64 * 16 * 64, 64, 1, 16, 16, 16))
big = np.zeros(256 << 20, np.uint8)  # the caller's history: calloc'd, never touched
small = np.zeros(64 * 40, np.uint8)

pages = int(open("/proc/self/statm").read().split()[0])
cap = pages * resource.getpagesize() + int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
if hard != resource.RLIM_INFINITY and hard < cap:
    print(f"SKIP: the hard RLIMIT_AS {hard} is below the cap {cap}")
    sys.exit(0)
resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def memory_error(what, call, needle):
    try:
        call()
    except MemoryError as e:
        assert needle in str(e), (what, str(e))
        print("ok", what, "->", e)
        return
    raise AssertionError(f"{what}: no MemoryError")


memory_error("admit", lambda: pool.admit(1, big), "history")
assert pool.admit(1, small)["admitted"]  # the pool goes on
memory_error("append", lambda: pool.append(1, big), "history")
assert pool.committed_len(1) == 40
memory_error("strided history (the bindings' copy)", lambda: pool.admit(2, big[::2]), "strided")
memory_error("counters", lambda: experts.PickCounters(experts.Geometry(16, 1 << 20, 4)),
             "pick counters")
pool.check_invariants()
print("child done")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux")
def test_allocations_past_an_address_space_limit_raise_memory_error():
    env = dict(os.environ, MALLOC_ARENA_MAX="1", MALLOC_MMAP_THRESHOLD_="131072")
    r = subprocess.run([sys.executable, "-c", CHILD, str(HEADROOM)], capture_output=True,
                       text=True, env=env, timeout=300)
    out = f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    if r.stdout.startswith("SKIP"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, out  # -6: an allocation failure aborted the interpreter
    assert "child done" in r.stdout, out
    assert r.stdout.count("ok ") == 4, out
