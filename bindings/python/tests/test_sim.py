"""The lab from Python: the replay scoreboard, routing traces' ids, the link model. Every test
here needs a wheel built with ``--features lab`` and is skipped, one by one, in the base wheel
(conftest.py)."""

import json
import pathlib

import numpy as np
import pytest

import tierkit

if tierkit.has_lab:
    from tierkit import sim

pytestmark = pytest.mark.lab


def test_scoreboard_on_a_short_scenario():
    board = sim.scoreboard(steps=600, shift_at=300,
                           policies=["static", "adaptive", "static-by-picks", "best-static",
                                     "offline-optimum"],
                           config={"drain_every": 16})
    labels = [r["label"] for r in board["rows"]]
    assert labels == ["static", "adaptive", "static by picks", "static by picks after shift",
                      "best static", "best static after shift", "offline optimum"]
    rows = {r["label"]: r for r in board["rows"]}
    # every ratio is against the best static map after the shift (top-H by steps touched)
    assert rows["best static after shift"]["stall_vs_best_static"] == 1.0
    assert (rows["best static"]["stall_ms_per_step"]
            <= rows["static by picks"]["stall_ms_per_step"])
    # no row stalls less than the offline optimum over the whole trace
    assert rows["offline optimum"]["stall_vs_optimum"] == 1.0
    assert all(r["stall_vs_optimum"] >= 1.0 for r in board["rows"])
    rows = {r["label"]: r for r in board["rows"]}
    assert rows["adaptive"]["cold_share"] < rows["static"]["cold_share"]
    assert "adaptive" in board["table"] and board["scenario"] == "olmoe-github-to-book"
    with pytest.raises(ValueError, match="unknown policy"):
        sim.scoreboard(policies=["best"])


def test_synth_ids_olmoe_scenario_is_seeded_and_well_formed():
    t = sim.synth_ids(steps=30, tokens_per_step=4, seed=3)
    assert (t["layers"], t["experts_per_layer"], t["top_k"]) == (16, 64, 8)
    assert t["name"] == "olmoe-github-to-book" and t["shifts"] == []
    ids = t["ids"]
    assert ids.shape == (30, 16, 4, 8) and ids.dtype == np.int32
    assert t["steps"] == 30 and t["tokens"] == 4 and list(t["tokens_per_step"]) == [4] * 30
    assert ids.min() >= 0 and ids.max() < 64
    # a token's top-k ids are distinct
    assert all(len(set(row)) == 8 for row in ids.reshape(-1, 8).tolist())
    # the same arguments give the same ids; another seed (and the shift) other ones
    shifted = sim.synth_ids(steps=30, tokens_per_step=4, seed=4, shift_at=10, to_domain="arxiv")
    assert shifted["shifts"] == [10] and shifted["name"] == "olmoe-github-to-arxiv"
    assert not np.array_equal(ids[:10], shifted["ids"][:10])
    assert np.array_equal(ids, sim.synth_ids(steps=30, tokens_per_step=4, seed=3)["ids"])


def test_synth_ids_zipf_shape_has_the_stated_skew():
    t = sim.synth_ids(steps=200, tokens_per_step=16, shape=(2, 128, 8), zipf=1.0, reuse=0.2)
    assert t["name"] == "zipf1-2x128x8" and t["ids"].shape == (200, 2, 16, 8)
    counts = np.bincount(t["ids"][:, 0].ravel(), minlength=128)
    top = np.sort(counts)[::-1][:32].sum() / counts.sum()
    flat = np.bincount(sim.synth_ids(steps=200, tokens_per_step=16, shape=(2, 128, 8), zipf=0.0)
                       ["ids"][:, 0].ravel(), minlength=128)
    flat_top = np.sort(flat)[::-1][:32].sum() / flat.sum()
    # Zipf 1 over 128 experts: the busiest quarter holds ~70% of the shares (less in picks, as
    # top-8 draws without replacement cap each expert at one pick per token)
    assert top > 0.5 and flat_top < 0.35, (top, flat_top)
    with pytest.raises(ValueError, match="zipf exponent"):
        sim.synth_ids(steps=2, tokens_per_step=1, shape=(1, 8, 2), zipf=-1.0)
    with pytest.raises(ValueError, match="top-k"):
        sim.synth_ids(steps=2, tokens_per_step=1, shape=(1, 8, 9))


def test_trace_ids_reads_a_logger_trace_with_padding(tmp_path):
    lines = [
        {"tierkit_trace": 1, "layers": 2, "experts_per_layer": 4, "top_k": 2, "name": "t"},
        {"step": 0, "layer": 0, "topk_ids": [0, 1]},
        {"step": 0, "layer": 0, "topk_ids": [2, 3]},
        {"step": 0, "layer": 1, "topk_ids": [1, 2]},
        {"step": 0, "layer": 1, "topk_ids": [3, 0]},
        {"step": 1, "layer": 0, "topk_ids": [3, 1]},
        {"step": 1, "layer": 1, "topk_ids": [0, 2]},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    t = sim.trace_ids(str(p))
    assert (t["name"], t["layers"], t["experts_per_layer"], t["top_k"]) == ("t", 2, 4, 2)
    assert t["ids"].tolist() == [
        [[[0, 1], [2, 3]], [[1, 2], [3, 0]]],
        [[[3, 1], [-1, -1]], [[0, 2], [-1, -1]]],
    ]
    assert list(t["tokens_per_step"]) == [2, 1]
    # a list of paths joins them (each join a shift); warm-up steps dropped
    two = sim.trace_ids([p, p], skip_steps=1)
    assert two["steps"] == 2 and two["shifts"] == [1]
    with pytest.raises(ValueError, match="expert"):
        sim.trace_ids(str(p), experts=3)
    with pytest.raises(ValueError, match="unknown trace format"):
        sim.trace_ids(str(p), format="csv")
    with pytest.raises(OSError):
        sim.trace_ids(str(tmp_path / "missing.jsonl"), format="logger-jsonl")


def test_trace_ids_reads_the_real_mixtral_logs():
    d = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "moe" / "mixtral-decode"
    if not d.is_dir():
        print(f"SKIP: no Mixtral decode logs at {d}")
        pytest.skip("no ../shared Mixtral decode logs")
    t = sim.trace_ids(str(d))
    assert (t["layers"], t["experts_per_layer"], t["top_k"], t["tokens"]) == (32, 8, 2, 1)
    assert t["steps"] == 585  # 168 + 79 + 83 + 255 decode tokens of four problems
    ids = t["ids"]
    missing = (ids < 0).any(axis=-1).sum()
    assert missing == 585 * 32 - 18_668  # the public logs lack 52 (token, layer) rows


def test_link_stall_is_the_lab_model():
    d = sim.link_stall_us(47_000, 0, 0)
    assert d["stall_us"] == pytest.approx(1.0) and d["link"]["name"] == "h200-pcie"
    one = sim.link_stall_us(0, 1, 55_000)
    assert one["copy_us"] == pytest.approx(1.0)
    assert one["stall_us"] == pytest.approx(1.0 + d["link"]["copy_fixed_us"])
    c2c = sim.link_stall_us(340_000, 0, 0, link="gb300-c2c")
    assert c2c["stall_us"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown link preset"):
        sim.link_stall_us(0, 0, 0, link="nvlink9")
