"""Bad input from Python: wrong dtype, shape, stride, alignment; use after close(); a panic.
Each is an exception, never a crash, and the interpreter goes on."""

import importlib

import numpy as np
import pytest

import tierkit
from tierkit import experts, kv


@pytest.fixture
def counters():
    return experts.PickCounters(experts.Geometry(2, 8, 2))


def test_ids_dtype_shape_range(counters):
    with pytest.raises(TypeError, match="dtype float64"):
        counters.record_layer(0, np.zeros((2, 2)))
    with pytest.raises(TypeError, match="big-endian|dtype >i4|dtype"):
        counters.record_layer(0, np.zeros((2, 2), dtype=">i4"))
    with pytest.raises(ValueError, match="2-D"):
        counters.record_layer(0, np.zeros(4, dtype=np.int32))
    with pytest.raises(TypeError, match="numpy array"):
        counters.record_layer(0, [[1, 2]])
    with pytest.raises(ValueError, match=r"\[1, 0\]"):
        counters.record_layer(0, np.array([[1, 2], [8, 0]], dtype=np.int32))
    with pytest.raises(ValueError, match="-1"):
        counters.record_layer(0, np.array([[1, -1]], dtype=np.int64))
    with pytest.raises(ValueError, match="layer 2"):
        counters.record_layer(2, np.array([[1, 2]], dtype=np.int32))
    assert counters.snapshot().sum() == 0  # nothing counted by a failed call


def test_misaligned_input(counters):
    raw = np.zeros(4 * 4 + 1, dtype=np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.int32, count=4, offset=1).reshape(2, 2)
    assert not misaligned.flags.aligned
    with pytest.raises(ValueError, match="not aligned"):
        counters.record_layer(0, misaligned)


def test_buffer_protocol_input(counters):
    import array
    with pytest.raises(ValueError, match="2-D"):  # a 1-D buffer: taken, then its shape checked
        counters.record_layer(0, array.array("i", [1, 2]))
    counters.record_layer(0, memoryview(np.array([[1, 2]], dtype=np.int32)))
    assert counters.snapshot()[0, 1] == 1


def pool():
    p = kv.ElasticPool(kv.Geometry.for_hbm_budget(16 * 4 * 16 * 2, 16, 2, 4, 8, 4))
    p.admit(7, bytes(b for t in range(20) for b in [t] * 32))
    return p


def test_resolve_inputs_and_outputs():
    p = pool()
    ok = dict(sessions=[7], query_start_loc=[0, 1], seq_lens=[20])
    topk = np.array([[0, 5, 19, -1]], dtype=np.int32)
    with pytest.raises(ValueError, match="position 20"):
        p.resolve(**ok, topk=np.array([[0, 20, -1, -1]], dtype=np.int32))
    with pytest.raises(ValueError, match="unknown session 8"):
        p.resolve([8], [0, 1], [20], topk)
    with pytest.raises(TypeError, match="dtype float32"):
        p.resolve(**ok, topk=topk.astype(np.float32))
    with pytest.raises(TypeError, match="int32"):
        p.resolve(**ok, topk=topk, indices=np.zeros((1, 4), np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        p.resolve(**ok, topk=topk, indices=np.zeros((4, 2), np.int32).T)
    ro = np.zeros((1, 4), np.int32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        p.resolve(**ok, topk=topk, indices=ro)
    with pytest.raises(ValueError, match="elements"):
        p.resolve(**ok, topk=topk, valid_count=np.zeros(0, np.int32))
    with pytest.raises(TypeError, match="numpy int32 array"):
        p.resolve(**ok, topk=topk, indices=[0, 0, 0, 0])
    with pytest.raises(ValueError, match="k = 3"):
        p.resolve(**ok, topk=topk, k=3)
    with pytest.raises(ValueError, match="out of range"):
        p.resolve([7], [0, 1], [2**40], topk)
    with pytest.raises(ValueError, match="whole number"):
        p.admit(9, b"x" * 33)
    with pytest.raises(TypeError, match="uint8"):
        p.admit(9, np.zeros(32, np.int16))
    r = p.resolve(**ok, topk=topk)  # still works after every refusal
    assert r.valid_count.tolist() == [3]
    p.check_invariants()


def test_use_after_close():
    p = pool()
    p.close()
    assert p.closed
    with pytest.raises(tierkit.ClosedError, match="closed"):
        p.finish(7)
    p.close()  # idempotent
    g = experts.Geometry(2, 8, 2)
    with experts.PickCounters(g) as c:
        pass
    with pytest.raises(tierkit.ClosedError):
        c.record(0, 1)
    ctl = experts.Controller(experts.ResidencyMap.first_k("m", g))
    ex = experts.NullExecutor()
    ex.close()
    with pytest.raises(tierkit.ClosedError, match="NullExecutor"):
        ctl.step(experts.PickCounters(g), ex)
    with pytest.raises(TypeError, match="executor"):
        ctl.step(experts.PickCounters(g), object())


def test_config_errors():
    m = experts.ResidencyMap.first_k("m", experts.Geometry(2, 8, 2))
    with pytest.raises(ValueError, match="drain_evry"):
        experts.Controller(m, {"drain_evry": 4})
    with pytest.raises(ValueError, match="drain_every"):
        experts.Controller(m, {"drain_every": 0})
    with pytest.raises(ValueError, match="hot_per_layer"):
        experts.Geometry(2, 8, 9)
    with pytest.raises(ValueError):
        experts.ResidencyMap.from_json("{", experts.Geometry(2, 8, 2))


def test_panic_is_an_exception_and_the_interpreter_goes_on():
    with pytest.raises(tierkit.InternalError, match="test panic") as e:
        tierkit._native._test_panic()
    assert isinstance(e.value, RuntimeError)
    assert experts.Geometry(1, 2, 1).layers == 1


def test_torch_module_says_it_is_not_built():
    if tierkit._native.has_cuda_ops():
        pytest.skip("this build has the CUDA ops (tests in test_torch_gpu.py)")
    with pytest.raises(ImportError, match="without CUDA ops"):
        importlib.import_module("tierkit.torch")


def test_sequence_configs_and_executors_of_another_geometry_are_errors():
    g = experts.Geometry(2, 8, 2)
    m = experts.ResidencyMap.first_k("m", g)
    # a list used to bind drain_every and half_life_steps by position
    for bad in ([4, 500.0], "[4, 500.0]", {"cost": [2.0, 1.0]}):
        with pytest.raises(ValueError, match="object of named fields"):
            experts.Controller(m, bad)
    # an executor built for another geometry used to fail every swap behind OK steps
    ctl = experts.Controller(m, {"drain_every": 1})
    other = experts.ResidencyMap.first_k("m", experts.Geometry(2, 8, 3))
    ex = experts.MemoryExecutor(other, 16, 1)
    with pytest.raises(ValueError, match="geometry mismatch"):
        ctl.step(experts.PickCounters(g), ex)


@pytest.mark.skipif(tierkit.has_lab, reason="this wheel has the lab (built with --features lab)")
def test_sim_in_the_base_wheel_is_an_import_error_naming_the_feature():
    assert tierkit.has_lab is False and "sim" not in tierkit.__all__
    with pytest.raises(ImportError, match="--features lab"):
        importlib.import_module("tierkit.sim")
