"""benches/python/moe_stepmodel.py: the MoE decode bench's step-time model on synthetic rows (no
torch, no GPU), each term checked against the arithmetic of its docstring."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import moe_stepmodel as sm  # noqa: E402

H, F, L = 2048, 1024, 4
NB = 6 * H * F  # 12,582,912 bytes: an OLMoE expert


def row(alt, **kw):
    r = {"shape": "olmoe", "layers": L, "batch": 8, "budget": 0.5, "alternative": alt,
         "hidden": H, "ffn": F, "steps_timed": 20, "step_p50_us": 1.0, "tokens_per_s": 8e6,
         "link_read_bytes_per_step": 0, "link_copy_bytes_per_step": 0,
         "cpu_expert_bytes_per_step": 0, "swaps_applied": 0}
    r.update(kw)
    return r


CEIL = {"step_p50_us": 2000.0}


def test_in_place_reads_swaps_credit_and_counting_nodes():
    # 10 experts read in place a step, 40 swaps over 20 timed steps (2 a step), 6 touched a layer
    r = row("tierkit", mode="in-place", link_read_bytes_per_step=10 * NB, swaps_applied=40,
            link_copy_bytes_per_step=2 * NB)
    p = sm.predict(r, CEIL, touched=6.0)
    t = p["terms"]
    assert t["link_read"] == pytest.approx(10 * NB / 50.6e3, abs=0.05)   # 2486.8 µs
    assert t["swaps"] == pytest.approx(2 * (NB / 55.6e3 + 26.2), abs=0.05)  # 505.0 µs
    # one launch over hot and cold experts: all 6 × 4 touched experts' HBM time hides
    assert t["hbm_credit"] == pytest.approx(-6 * L * NB / 4270e3, abs=0.05)
    assert t["nodes"] == pytest.approx(L * 1 * 3.2)
    assert "copy_kernel" not in t  # the swaps' bytes are not the copy kernel's
    assert p["predicted_us"] == pytest.approx(sum(t.values()), abs=0.1)
    assert p["predicted_us"] == pytest.approx(2000 + 2486.8 + 505.0 - 70.7 + 12.8, abs=0.3)
    # a measured swap cost replaces the micro-bench's 26.2 µs
    q = sm.predict(r, CEIL, touched=6.0, swap_fixed_us=4.0)
    assert q["terms"]["swaps"] == pytest.approx(2 * (NB / 55.6e3 + 4.0), abs=0.05)
    # without the routing line the credit is the cold bytes only
    assert sm.predict(r, CEIL)["terms"]["hbm_credit"] == pytest.approx(-10 * NB / 4270e3, abs=0.05)


def test_the_shared_bank_copies_at_the_link_rate_and_pays_its_planner():
    r = row("shared-bank", link_copy_bytes_per_step=5 * NB)
    t = sm.predict(r, CEIL, touched=6.0)["terms"]
    assert t["copy_kernel"] == pytest.approx(5 * NB / 50.6e3, abs=0.05)
    assert t["nodes"] == pytest.approx(L * 50 * 3.2)
    assert "hbm_credit" not in t and "swaps" not in t  # its GEMM reads the copied rows from HBM


def test_layer_uva_credits_only_its_offloaded_bytes():
    r = row("layer-uva", link_read_bytes_per_step=2 * 6 * NB)
    t = sm.predict(r, CEIL, touched=6.0)["terms"]
    assert t["hbm_credit"] == pytest.approx(-12 * NB / 4270e3, abs=0.05)
    assert "nodes" not in t


def test_the_cpu_channel_uses_the_measured_rate_and_split_overlaps_the_channels():
    cold = row("cpu-cold", cpu_expert_bytes_per_step=8 * NB, cpu_expert_gbps=20.0)
    t = sm.predict(cold, CEIL, touched=6.0)["terms"]
    assert t["cpu"] == pytest.approx(8 * NB / 20e3, abs=0.05)
    # no measured rate in the row: the channel bench's 50.7 GB/s
    del cold["cpu_expert_gbps"]
    assert sm.predict(cold, CEIL)["terms"]["cpu"] == pytest.approx(8 * NB / 50.7e3, abs=0.05)
    # split: the two channels at once, the longer one counts, at their together-rates
    sp = row("tierkit", mode="split", link_read_bytes_per_step=6 * NB,
             cpu_expert_bytes_per_step=4 * NB, split_cpu_gbps=30.0)
    t = sm.predict(sp, CEIL, touched=6.0)["terms"]
    link, cpu = 6 * NB / (50.6 * 0.970 * 1e3), 4 * NB / (30.0 * 0.838 * 1e3)
    assert t["cold"] == pytest.approx(max(link, cpu), abs=0.05)
    assert "link_read" not in t and "cpu" not in t


def test_all_hbm_is_its_own_step_and_the_mean_step_comes_from_tokens():
    p = sm.predict(row("all-hbm"), CEIL)
    assert p["predicted_us"] == 2000.0 and p["terms"] == {"allhbm": 2000.0}
    assert sm.mean_step_us(row("layer-uva", batch=8, tokens_per_s=4000.0)) == 2000.0
