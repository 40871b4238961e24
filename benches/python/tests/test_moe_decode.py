"""benches/python/moe_decode.py on its CPU reference path (tiny shapes): the alternatives'
planners and placements, the exactness check (and that it catches a wrong placement), the
controller swapping on a shifting trace, tierkit's modes (copy-on-miss, auto), the batch
composition; the Triton kernels under Triton's CPU interpreter when Triton is installed; the GPU
path where a GPU is present."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    import numpy as np
    import torch
    import tierkit.sim  # noqa: F401 - the routing comes from the wheel's lab functions
except ImportError as e:  # the CI's virtual environment has no torch
    print(f"SKIP: moe_decode tests need torch and the tierkit wheel ({e})")
    pytest.skip(f"needs torch and tierkit: {e}", allow_module_level=True)

# Needs tierkit.sim: .ci/test runs it with the lab wheel (`pytest -m lab`).
pytestmark = pytest.mark.lab

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "moe_decode.py")
sys.path.insert(0, os.path.dirname(HERE))
import moe_decode as md  # noqa: E402

TINY = ["--device", "cpu", "--shapes", "custom", "--layers", "2", "--experts", "8", "--top-k",
        "2", "--hidden", "64", "--ffn", "32", "--profile-steps", "8", "--seed", "3"]


def run(capsys, *args) -> tuple[int, list[dict]]:
    rc = md.main(list(TINY) + list(args))
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rc, rows


def test_check_every_alternative_matches_all_hbm(capsys):
    rc, rows = run(capsys, "--check", "--batches", "1,4", "--budgets", "0.25,0.5",
                   "--check-steps", "6")
    checks = [r for r in rows if "check" in r]
    assert rc == 0 and checks and all(r["ok"] for r in checks), checks
    names = {r["check"] for r in checks}
    assert names == {"layer-uva", "shared-bank", "cpu-cold", "tierkit"}
    for r in checks:
        if r["check"] == "cpu-cold":  # another summation order: within tolerance, not equal
            assert not r["bit_identical"] and 0 < r["max_rel_err"] <= 2e-2
        else:
            assert r["bit_identical"] and r["max_rel_err"] == 0.0
    bank = [r for r in checks if r["check"] == "shared-bank"]
    assert all(r["copies"] > 0 for r in bank)  # copy-on-miss ran (the bank starts empty)


def test_check_catches_a_wrong_placement(capsys, monkeypatch):
    # the shared bank's planner sending one needed expert to another expert's bytes
    real = md.SharedBank.table

    def wrong(self, layer, ids_l, step):
        t = real(self, layer, ids_l, step)
        e = int(ids_l[0, 0])
        t[e] = self.ctx.model.addr("host", layer, (e + 1) % self.ctx.model.shape.experts)
        return t

    monkeypatch.setattr(md.SharedBank, "table", wrong)
    rc, rows = run(capsys, "--check", "--batches", "2", "--budgets", "0.5", "--alternatives",
                   "shared-bank", "--check-steps", "3")
    bad = [r for r in rows if r.get("check") == "shared-bank"]
    assert rc == 1 and bad and not bad[0]["ok"] and bad[0]["max_rel_err"] > 0.05


def shifting_trace(path, steps=60, layers=2, experts=8):
    """A logger trace of one token per step picking experts {0, 1} for 20 steps, then {6, 7}."""
    lines = [{"tierkit_trace": 1, "layers": layers, "experts_per_layer": experts, "top_k": 2,
              "name": "shift"}]
    for s in range(steps):
        pair = [0, 1] if s < 20 else [6, 7]
        for layer in range(layers):
            lines.append({"step": s, "layer": layer, "topk_ids": pair})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_tierkit_swaps_on_a_shifting_trace_and_stays_exact(capsys, tmp_path):
    trace = shifting_trace(tmp_path / "shift.jsonl")
    # 16 KiB experts would never pay a swap's fixed cost: 1.5 MiB ones do
    args = ["--trace", trace, "--hidden", "256", "--ffn", "1024", "--profile-steps", "16",
            "--budgets", "0.5", "--batches", "1", "--alternatives", "tierkit"]
    rc, rows = run(capsys, "--check", "--check-steps", "40", *args)
    tk = [r for r in rows if r.get("check") == "tierkit"]
    assert rc == 0 and tk[0]["ok"] and tk[0]["bit_identical"]
    assert tk[0]["swaps_applied"] > 0, tk
    # the same through the timed cells: the JSON row's fields
    rc, rows = run(capsys, "--steps", "30", "--warmup", "2", "--runs", "1", *args)
    cells = {r["alternative"]: r for r in rows if "alternative" in r}
    assert set(cells) == {"all-hbm", "tierkit"} and rc == 0
    t = cells["tierkit"]
    for key in ("tokens_per_s", "step_p50_us", "step_p99_us", "ratio_to_all_hbm",
                "link_read_bytes_per_step", "link_copy_bytes_per_step", "swaps_applied",
                "predicted_step_us", "hbm_expert_bytes"):
        assert key in t, key
    assert t["swaps_applied"] > 0 and t["link_copy_bytes_per_step"] > 0
    nb = 6 * 256 * 1024
    assert t["hbm_expert_bytes"] == 2 * (3 + 1) * nb  # hot 3 + the spare slot = half of 8
    assert cells["all-hbm"]["link_read_bytes_per_step"] == 0


def test_cells_account_the_bytes_each_alternative_moves(capsys):
    rc, rows = run(capsys, "--batches", "4", "--budgets", "0.5", "--steps", "4", "--warmup",
                   "1", "--runs", "1")
    cells = {r["alternative"]: r for r in rows if "alternative" in r}
    assert rc == 0 and set(cells) == {"all-hbm", "layer-uva", "shared-bank", "cpu-cold",
                                      "tierkit"}
    nb = 6 * 64 * 32
    for name, r in cells.items():
        assert r["budget"] == (1.0 if name == "all-hbm" else 0.5)
        if name != "all-hbm":
            assert r["hbm_expert_bytes"] == 8 * nb, name  # half of 2 × 8 experts
    assert cells["layer-uva"]["link_read_bytes_per_step"] > 0 and cells["layer-uva"]["hbm_layers"] == 1
    assert cells["cpu-cold"]["cpu_expert_bytes_per_step"] > 0
    assert cells["cpu-cold"]["link_read_bytes_per_step"] == 0
    assert cells["shared-bank"]["link_copy_bytes_per_step"] > 0
    routing = [r for r in rows if "routing" in r][0]["routing"]
    assert routing["streams"] == 4 and routing["source"].startswith("lab generator: Zipf")


def test_compose_batch_reuses_streams_at_offsets():
    S, L, T, k = 10, 2, 1, 2
    ids = np.arange(S * L * T * k, dtype=np.int32).reshape(S, L, T, k) % 8
    ids[3, 1, 0] = -1  # a missing (token, layer) row
    out, info = md.compose_batch(ids, batch=2, steps=4)
    assert info["rows_per_stream"] == 2 and info["stride"] == 5
    want = ids[0:4, :, 0].astype(np.int64)
    want[3, 1] = want[2, 1]  # the missing row takes the row's previous step's ids
    assert np.array_equal(out[:, :, 0], want)
    assert np.array_equal(out[:, :, 1], ids[5:9, :, 0])
    corr = md.correlation(ids, out, 8, 0)
    assert corr["touched_per_layer"] > 0 and corr["touched_independent_rows"] > 0


def interpreted(what, *args) -> list[dict]:
    """The script's ``--check`` on TINY under Triton's CPU interpreter (SKIP without Triton);
    its JSON rows, after asserting exit 0."""
    try:
        import triton  # noqa: F401
    except ImportError:
        print(f"SKIP: Triton is not installed ({what} under Triton's CPU interpreter)")
        pytest.skip("no Triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, SCRIPT, *TINY, "--check", "--batches", "3", *args],
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def test_kernels_under_the_triton_interpreter():
    rows = interpreted("the kernels", "--budgets", "0.25", "--check-steps", "2",
                       "--alternatives", "layer-uva,shared-bank,tierkit")
    checks = [r for r in rows if "check" in r]
    kernel = [r for r in checks if r["check"] == "kernel-vs-torch-reference"]
    assert kernel and kernel[0]["ok"] and kernel[0]["max_rel_err"] < 2e-2
    assert all(r["ok"] and r.get("bit_identical", True) for r in checks)


def test_copy_on_miss_kernels_under_the_triton_interpreter():
    # the staging copies through the fixed-grid Triton copy kernel, then the MoE kernels
    rows = interpreted("copy-on-miss", "--budgets", "0.5", "--check-steps", "3",
                       "--alternatives", "tierkit", "--tierkit-mode", "copy-on-miss")
    tk = [r for r in rows if r.get("check") == "tierkit"]
    assert tk and tk[0]["ok"] and tk[0]["bit_identical"] and tk[0]["copies"] > 0, tk


def test_gpu_check():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (the GPU path: Triton kernels in CUDA graphs, tierkit's bank)")
        pytest.skip("no CUDA device")
    p = subprocess.run([sys.executable, SCRIPT, "--check", "--shapes", "olmoe", "--layers", "2",
                        "--batches", "1,8", "--budgets", "0.25,0.5"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def reuse_trace(path, layers=2, experts=8):
    """One token per step picking expert 0 and a second expert that changes every 4 steps
    (1, 2, 3, 4, then 5, 6, 7, 1, ...): a cold expert reused over 4 steps, what copy-on-miss
    pays on."""
    lines = [{"tierkit_trace": 1, "layers": layers, "experts_per_layer": experts, "top_k": 2,
              "name": "reuse"}]
    for s in range(80):
        x = 1 + (s // 4) % (experts - 1)
        for layer in range(layers):
            lines.append({"step": s, "layer": layer, "topk_ids": [0, x]})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


BIG = ["--hidden", "256", "--ffn", "1024"]  # 1.5 MiB experts: a copy's fixed cost is small


@pytest.mark.parametrize("mode", ["copy-on-miss", "auto", "in-place"])
def test_tierkit_modes_are_bit_identical(capsys, tmp_path, mode):
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    rc, rows = run(capsys, "--check", "--check-steps", "30", "--trace", trace, *BIG,
                   "--profile-steps", "16", "--budgets", "0.5,0.75", "--batches", "1",
                   "--alternatives", "tierkit", "--tierkit-mode", mode)
    tk = [r for r in rows if r.get("check") == "tierkit"]
    assert rc == 0 and len(tk) == 2, rows
    for r in tk:
        assert r["ok"] and r["bit_identical"] and r["max_rel_err"] == 0.0
        if mode == "copy-on-miss":
            assert r["mode"] == "copy-on-miss" and r["stage_per_layer"] >= 1
            assert r["copies"] > 0  # misses were staged and read from HBM in the same step
        if mode == "auto":
            assert r["auto"]["mode"] == r["mode"]


def test_copy_on_miss_cells_keep_equal_hbm_and_count_copies(capsys, tmp_path):
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    rc, rows = run(capsys, "--trace", trace, *BIG, "--profile-steps", "16", "--budgets", "0.5",
                   "--batches", "1", "--steps", "20", "--warmup", "2", "--runs", "1",
                   "--alternatives", "shared-bank,tierkit", "--tierkit-mode", "copy-on-miss")
    cells = {r["alternative"]: r for r in rows if "alternative" in r}
    assert rc == 0 and set(cells) == {"all-hbm", "shared-bank", "tierkit"}
    t, nb = cells["tierkit"], 6 * 256 * 1024
    # 4 slots of 8 per layer: hot 2 + the bank's spare + 1 staging row, as the shared bank's 8 rows
    assert t["hbm_expert_bytes"] == cells["shared-bank"]["hbm_expert_bytes"] == 2 * 4 * nb
    assert t["mode"] == "copy-on-miss" and t["stage_per_layer"] == 1
    assert t["link_copy_bytes_per_step"] > 0
    # a staged expert is reused for up to 4 steps: fewer bytes read in place than in-place mode
    rc, rows = run(capsys, "--trace", trace, *BIG, "--profile-steps", "16", "--budgets", "0.5",
                   "--batches", "1", "--steps", "20", "--warmup", "2", "--runs", "1",
                   "--alternatives", "tierkit", "--tierkit-mode", "in-place")
    ip = [r for r in rows if r.get("alternative") == "tierkit"][0]
    assert t["link_read_bytes_per_step"] < ip["link_read_bytes_per_step"]


def test_simulate_counts_reads_copies_and_reuse():
    import moe_tierkit as mt

    # one layer, 8 experts, 1 token, top-1: expert 5 for 3 steps then 6 for 3 steps
    ids = np.array([5, 5, 5, 6, 6, 6], dtype=np.int64).reshape(6, 1, 1, 1)
    profile = np.array([[9, 8, 0, 0, 0, 3, 3, 0]])
    ip = mt.simulate(ids, profile, hot=2, stage=0, keep=0)
    assert ip == {"reads": 1.0, "copies": 0.0, "reuse": round(4 / 6, 3)}
    cm = mt.simulate(ids, profile, hot=2, stage=1, keep=4)  # 5 and 6 admitted: one copy each
    assert cm["reads"] == 0.0 and cm["copies"] == 2 / 6
    cm = mt.simulate(ids, profile, hot=2, stage=1, keep=3)  # 6 not admitted: read in place
    assert cm["reads"] == 0.5 and cm["copies"] == 1 / 6
    assert mt.stage_split(4) == (2, 1) and mt.stage_split(2) == (1, 0)
    assert mt.stage_split(32) == (16, 15)
    m = mt.admit_mask(np.array([[0.0, 2.0, 1.0, 2.0]]), 2)
    assert m.tolist() == [[False, True, False, True]]


def test_auto_prices_both_modes_and_picks_the_cheaper(capsys, tmp_path):
    import moe_tierkit as mt

    trace = reuse_trace(tmp_path / "reuse.jsonl")
    rc, rows = run(capsys, "--trace", trace, *BIG, "--profile-steps", "16", "--budgets",
                   "0.5", "--batches", "1", "--steps", "4", "--warmup", "1", "--runs", "1",
                   "--alternatives", "tierkit")
    t = [r for r in rows if r.get("alternative") == "tierkit"][0]
    a = t["auto"]
    assert rc == 0 and t["mode"] == a["mode"]
    cheaper = "copy-on-miss" if a["pred_copy_on_miss_us"] < a["pred_in_place_us"] else "in-place"
    assert a["mode"] == cheaper and 0 <= a["reuse"] <= 1
    # the rule on its own: a window of no reuse at all (a new cold expert every step) keeps
    # in-place, since a copy costs at least the read it replaces
    ids = (1 + np.arange(16) % 7).reshape(16, 1, 1, 1).astype(np.int64)
    profile = np.bincount(ids.ravel(), minlength=8)[None, :].astype(np.int64)
    profile[0, 0] = 100
    ctx = type("C", (), {})()
    ctx.model = type("M", (), {"shape": md.Shape("t", 1, 8, 1, 256, 1024, 256, 256)})()
    ctx.profile, ctx.profile_ids = profile, ids
    c = mt.choose(ctx, 0.5)
    assert c["reuse"] == 0.0 and c["mode"] == "in-place", c
