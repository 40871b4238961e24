"""The expert tier from Python: the engine loop of examples/experts_engine_loop.rs, seed maps."""

import numpy as np
import pytest

from tierkit import experts

LAYERS, EXPERTS, HOT, TOP_K, TOKENS = 4, 16, 4, 2, 8


def route(step):
    """A toy router: three picks in four go to 4 busy experts (0..4, then 8..12 from step 200).
    Returns int32 [layers, tokens, top_k]."""
    rng = np.random.default_rng(step)
    busy = 0 if step < 200 else 8
    ids = np.where(rng.random((LAYERS, TOKENS, TOP_K)) < 0.75,
                   busy + rng.integers(0, 4, (LAYERS, TOKENS, TOP_K)),
                   rng.integers(0, EXPERTS, (LAYERS, TOKENS, TOP_K)))
    ids[..., 1] = np.where(ids[..., 1] == ids[..., 0], (ids[..., 0] + 1) % EXPERTS, ids[..., 1])
    return ids.astype(np.int32)


def test_engine_loop_follows_the_shift_and_moves_bytes_losslessly():
    g = experts.Geometry(LAYERS, EXPERTS, HOT, 4096)
    boot = experts.ResidencyMap.first_k("toy-moe", g)
    with experts.MemoryExecutor(boot, 4096, seed=7) as ex, experts.PickCounters(g) as counters, \
            experts.Controller(boot, {"policy": "ratio", "adaptive": None, "drain_every": 8,
                                      "half_life_steps": 32}) as ctl:
        digest = ex.read_digest()
        drains = 0
        for step in range(400):
            ids = route(step)
            for layer in range(LAYERS):
                for e in np.unique(ids[layer]):
                    assert len(ex.read(layer, int(e))) == 4096  # the expert GEMM reads these
                counters.record_layer(layer, ids[layer])
            report = ctl.step(counters, ex)
            assert report["step"] == step + 1
            drains += report["drain"] is not None
        assert drains == 50
        now = ctl.map
        ex.verify(now)
        assert ex.read_digest() == digest
        assert ex.verified_moves > 0 and ctl.stats["applied"] == ex.verified_moves
        assert set(now.hot_experts(0)) == {8, 9, 10, 11}
        assert ctl.ema().shape == (LAYERS, EXPERTS)
        assert counters.snapshot().sum() == 400 * LAYERS * TOKENS * TOP_K


def test_geometry_states_the_hbm_slots_an_executor_lays_out():
    # the hot experts' slots and one spare per layer: the library's rule, asked, not restated
    g = experts.Geometry(3, 8, 2, 64)
    assert g.slots_per_layer == 3
    assert g.hbm_bytes == 3 * 3 * 64
    with pytest.raises(OverflowError):
        experts.Geometry(1, 1, 1, 1 << 63).hbm_bytes  # the bank fits a u64, its slots do not


def test_controller_configs_of_both_shapes():
    # the flat shape of older configs (policy a name, its knobs at the top level) and the policy
    # object read the same; the config is given back in the new shape; mixing them is refused
    g = experts.Geometry(2, 8, 2, 64)
    m = experts.ResidencyMap.first_k("m", g)
    flat = experts.Controller(m, {"policy": "ratio", "ratio": 1.25, "adaptive": None})
    new = experts.Controller(m, {"policy": {"kind": "ratio", "ratio": 1.25}, "adaptive": None})
    assert flat.config == new.config
    assert flat.config["policy"] == {"kind": "ratio", "ratio": 1.25}
    assert experts.Controller(m, new.config).config == new.config
    assert experts.Controller(m).config["policy"]["kind"] == "cost"
    with pytest.raises(ValueError, match='"kind": "ratio"'):
        experts.Controller(m, {"policy": {"kind": "ratio"}, "ratio": 1.25})
    with pytest.raises(ValueError, match="ratio must be finite"):
        experts.Controller(m, {"policy": {"kind": "ratio", "ratio": 0.5}})


def test_strided_int64_and_torch_style_views_count_the_same():
    g = experts.Geometry(2, 8, 2)
    wide = np.array([[1, 2, 7], [3, 4, 7]], dtype=np.int64)
    a, b = experts.PickCounters(g), experts.PickCounters(g)
    a.record_layer(0, wide[:, :2])  # a strided view: row stride 3
    b.record_layer(0, np.ascontiguousarray(wide[:, :2]).astype(np.int32))
    assert (a.snapshot() == b.snapshot()).all()
    assert a.snapshot()[0].tolist() == [0, 1, 1, 1, 1, 0, 0, 0]
    c = experts.PickCounters(g)
    c.record_layer(1, wide[::-1, 1::-1])  # negative strides
    assert c.snapshot()[1].tolist() == [0, 1, 1, 1, 1, 0, 0, 0]


def test_seed_map_json_round_trip_and_coverage():
    g = experts.Geometry(2, 8, 2, 64)
    counts = np.zeros((2, 8))
    counts[0, [5, 6]] = [10, 20]
    counts[1, [1, 2]] = [7, 3]
    m = experts.fit_seed_map("m", g, counts)
    assert m.hot_experts(0) == [6, 5] and m.hot_experts(1) == [1, 2]
    back = experts.ResidencyMap.from_json(m.to_json(), g)
    assert back.hot_sets() == m.hot_sets()
    cov = experts.seed_coverage(m, counts)
    assert cov["overall"] == pytest.approx(1.0) and cov["cold_share"] == pytest.approx(0.0)
    ctl = experts.Controller(m, '{"drain_every": 4}')
    assert ctl.config["drain_every"] == 4 and ctl.map.hot_sets() == m.hot_sets()
    ctl.apply_control({"freeze": True})
    assert ctl.frozen
