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
                   "--check-steps", "6", "--tierkit-mode", "in-place,copy-on-miss,auto")
    checks = [r for r in rows if "check" in r]
    assert rc == 0 and checks and all(r["ok"] for r in checks), checks
    names = {r["check"] for r in checks}
    assert names == {"layer-uva", "shared-bank", "cpu-cold", "tierkit"}
    assert {r["requested_mode"] for r in checks if r["check"] == "tierkit"} == {
        "in-place", "copy-on-miss", "auto"}
    for r in checks:
        if r["check"] == "cpu-cold":  # another summation order: within tolerance, not equal
            assert not r["bit_identical"] and 0 < r["max_rel_err"] <= 2e-2
        elif r.get("mode") == "split":  # auto may pick it: the CPU's columns within tolerance
            assert r["max_rel_err"] <= 2e-2
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
            "--budgets", "0.5", "--batches", "1", "--alternatives", "tierkit",
            "--tierkit-mode", "in-place"]
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


@pytest.mark.parametrize("swaps", ["on", "off"])
def test_copy_on_miss_swaps_only_when_asked(capsys, tmp_path, swaps):
    trace = shifting_trace(tmp_path / "shift.jsonl")
    rc, rows = run(capsys, "--check", "--check-steps", "40", "--trace", trace, "--hidden", "256",
                   "--ffn", "1024", "--profile-steps", "16", "--budgets", "0.75", "--batches", "1",
                   "--alternatives", "tierkit", "--tierkit-mode", "copy-on-miss", "--com-swaps",
                   swaps)
    tk = [r for r in rows if r.get("check") == "tierkit"][0]
    assert rc == 0 and tk["ok"] and tk["bit_identical"] and tk["mode"] == "copy-on-miss"
    assert (tk["swaps_applied"] > 0) == (swaps == "on"), tk


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


def test_copy_on_miss_and_split_kernels_under_the_triton_interpreter():
    # the staging copies through the fixed-grid Triton copy kernel, then the MoE kernels; split's
    # kernels (SPLIT on: FFN columns [kfrom, F) on the GPU) against all-HBM's
    rows = interpreted("copy-on-miss and split", "--budgets", "0.5", "--check-steps", "3",
                       "--alternatives", "tierkit", "--tierkit-mode", "copy-on-miss,split",
                       "--ffn", "128", "--split-cpu-share", "0.5", "--com-admit", "all")
    tk = {r["mode"]: r for r in rows if r.get("check") == "tierkit"}
    com, sp = tk["copy-on-miss"], tk["split"]
    assert com["ok"] and com["bit_identical"] and com["copies"] > 0, tk
    assert sp["ok"] and sp["split_cpu_columns"] == 64 and 0 < sp["max_rel_err"] <= 2e-2, tk


def test_gpu_check():
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (the GPU path: Triton kernels in CUDA graphs, tierkit's bank)")
        pytest.skip("no CUDA device")
    p = subprocess.run([sys.executable, SCRIPT, "--check", "--shapes", "olmoe", "--layers", "2",
                        "--batches", "1,8", "--budgets", "0.25,0.5"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def reuse_trace(path, layers=2, experts=8, steps=80, period=4):
    """One token per step picking expert 0 and a second expert that changes every ``period``
    steps (1, 2, 3, 4, then 5, 6, 7, 1, ...): a cold expert reused over ``period`` steps, what
    copy-on-miss pays on. Layer 1 picks only experts 0 and 1 (hot: it needs no staging row)."""
    lines = [{"tierkit_trace": 1, "layers": layers, "experts_per_layer": experts, "top_k": 2,
              "name": "reuse"}]
    for s in range(steps):
        x = 1 + (s // period) % (experts - 1)
        for layer in range(layers):
            lines.append({"step": s, "layer": layer, "topk_ids": [0, x] if layer == 0 else [0, 1]})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


# 6.3 MB experts: on the lab's h200-pcie prices a copy (55 GB/s + 26.2 µs) is at most a read's
# time (47 GB/s) x (1 + p) for an expert picked next step with chance p >= 0.05: tierkit admits
BIG = ["--hidden", "512", "--ffn", "2048"]
NB = 6 * 512 * 2048


@pytest.mark.parametrize("mode", ["copy-on-miss", "pooled", "split", "auto", "in-place"])
def test_tierkit_modes_match_all_hbm(capsys, tmp_path, mode):
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    rc, rows = run(capsys, "--check", "--check-steps", "24", "--trace", trace, *BIG,
                   "--profile-steps", "16", "--budgets", "0.5,0.75", "--batches", "1",
                   "--alternatives", "tierkit", "--tierkit-mode", mode, "--split-cpu-share",
                   "0.5", "--auto-steps", "3", "--auto-warmup", "1")
    tk = [r for r in rows if r.get("check") == "tierkit"]
    assert rc == 0 and len(tk) == 2, rows
    for r in tk:
        assert r["ok"]
        if r["mode"] == "split":  # the CPU's columns: another summation order, within bf16
            assert r["required"] == "<= 0.02" and 0 < r["max_rel_err"] <= 2e-2
            assert r["split_cpu_columns"] == 1024 and r["split_cpu_share"] == 0.5
        else:
            assert r["bit_identical"] and r["max_rel_err"] == 0.0
        if mode == "copy-on-miss":
            assert r["mode"] == "copy-on-miss" and r["stage_per_layer"] >= 1
            assert r["copies"] > 0  # misses were staged and read from HBM in the same step
        if mode == "pooled":  # one hot expert + the spare per layer, the rest pooled
            slots = int(r["budget"] * 8)
            assert r["mode"] == "pooled" and r["stage_per_layer"] == slots - 2
        if mode == "auto":
            a = r["auto"]
            assert r["mode"] == a["chosen"] == min(a["candidates_step_us"],
                                                   key=a["candidates_step_us"].get)
            assert set(a["candidates_step_us"]) == {"in-place", "copy-on-miss", "pooled", "split"}
            assert a["timed_steps"] == 3 and a["window"] == [12, 16] and a["boot_steps"] == 12


def com_cells(capsys, trace, *extra):
    rc, rows = run(capsys, "--trace", trace, *BIG, "--profile-steps", "16", "--budgets", "0.5",
                   "--batches", "1", "--steps", "20", "--warmup", "2", "--runs", "1", *extra)
    assert rc == 0
    return {r["alternative"]: r for r in rows if "alternative" in r}


def test_copy_on_miss_pools_staging_rows_across_layers(capsys, tmp_path):
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    cells = com_cells(capsys, trace, "--alternatives", "shared-bank,tierkit", "--tierkit-mode",
                      "copy-on-miss")
    assert set(cells) == {"all-hbm", "shared-bank", "tierkit"}
    t = cells["tierkit"]
    # 4 slots of 8 per layer: hot 2 + the bank's spare + 1 staging row, pooled over the 2 layers
    assert t["hbm_expert_bytes"] == cells["shared-bank"]["hbm_expert_bytes"] == 2 * 4 * NB
    assert t["mode"] == "copy-on-miss" and t["stage_per_layer"] == 1 and t["stage_rows"] == 2
    assert 0 < t["admitted_share"] <= 1.0 and t["link_copy_bytes_per_step"] > 0
    assert t["swaps_applied"] == 0 and t["swaps_planned"] == 0  # the boot map stays hot
    # layer 1 needs no row, layer 0 uses both pooled rows: its run's cold expert is copied once
    # (when admitted) and hit for the rest of the run; in-place mode reads it every step
    ip = com_cells(capsys, trace, "--alternatives", "tierkit", "--tierkit-mode", "in-place")
    assert 0 <= t["link_read_bytes_per_step"] < ip["tierkit"]["link_read_bytes_per_step"]
    assert t["link_copy_bytes_per_step"] < ip["tierkit"]["link_read_bytes_per_step"]


def test_copy_on_miss_reads_in_place_what_tierkit_does_not_admit(capsys, tmp_path):
    # 1.5 MB experts: a copy (27 + 26.2 µs) costs more than a read (32 µs) unless the expert is
    # picked again next step with chance >= 0.66: a one-off miss is read in place
    import moe_tierkit as mt

    read_us, copy_us = mt.link_prices(6 * 256 * 1024)
    rate = np.array([[0.0, 0.5, 1.5, 5.0]])
    assert mt.admit_mask(rate, read_us, copy_us).tolist() == [[False, False, True, True]]
    assert mt.admit_mask(rate, *mt.link_prices(NB)).tolist() == [[False, True, True, True]]
    assert mt.stage_split(4) == (2, 1) and mt.stage_split(2) == (1, 0)
    assert mt.stage_split(32) == (16, 15)
    trace = reuse_trace(tmp_path / "reuse.jsonl", period=1)  # a new cold expert every step
    rc, rows = run(capsys, "--trace", trace, "--hidden", "256", "--ffn", "1024",
                   "--profile-steps", "16", "--budgets", "0.5", "--batches", "1", "--steps", "10",
                   "--warmup", "2", "--runs", "1", "--alternatives", "tierkit", "--tierkit-mode",
                   "copy-on-miss")
    t = [r for r in rows if r.get("alternative") == "tierkit"][0]
    assert rc == 0 and t["link_read_bytes_per_step"] > 0
    assert t["admitted_share"] < 1.0


def test_admission_prices_a_miss_by_the_layers_reuse():
    import moe_tierkit as mt

    # layer 0: expert 0 every step, a second expert held for 4 steps; layer 1: {0, 1} always
    steps = 16
    ids = np.zeros((steps, 2, 1, 2), dtype=np.int64)
    ids[:, 0, 0, 1] = 1 + np.arange(steps) // 4
    ids[:, 1, 0, 1] = 1
    r = mt.layer_reuse(ids, 8)
    assert r[1] == 1.0 and abs(r[0] - (15 + 12) / 30) < 1e-12
    assert mt.layer_reuse(ids[:1], 8).tolist() == [0.0, 0.0]
    # a rare expert (0.02 picks a step): read in place on its share alone, copied at reuse 0.6
    rate = np.full((2, 8), 0.02)
    read, copy = 134.0, 140.4  # a 6.3 MB expert on h200-pcie: copy iff p >= 0.048
    assert not mt.admit_mask(rate, read, copy).any()
    adm = mt.admit_mask(rate, read, copy, np.array([0.6, 0.01]))
    assert adm[0].all() and not adm[1].any()


def test_split_moves_the_cpu_share_of_cold_bytes_to_the_cpu(capsys, tmp_path):
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    ip = com_cells(capsys, trace, "--alternatives", "tierkit", "--tierkit-mode", "in-place")
    sp = com_cells(capsys, trace, "--alternatives", "tierkit", "--tierkit-mode", "split",
                   "--split-cpu-share", "0.25")
    i, s = ip["tierkit"], sp["tierkit"]
    assert s["mode"] == "split" and s["split_cpu_columns"] == 512
    cold = i["link_read_bytes_per_step"]
    assert cold > 0 and i["hbm_expert_bytes"] == s["hbm_expert_bytes"]
    assert s["link_read_bytes_per_step"] == int(cold * 0.75)
    assert s["cpu_expert_bytes_per_step"] == int(cold * 0.25)
    assert s["predicted_step_us"] > 0
    # priced from the rates: link 47 x 0.970 against a CPU of 20 GB/s x 0.838 -> 0.27 of F
    sp = com_cells(capsys, trace, "--alternatives", "tierkit", "--tierkit-mode", "split",
                   "--split-cpu-gbps", "20")
    t = sp["tierkit"]
    assert t["split_priced_columns"] == 576 and t["split_cpu_rate"] == "--split-cpu-gbps"
    # then the feedback: each step's two channels timed, the rates learned, the cut re-priced
    import moe_split

    r = t["split_learned_gbps"]
    assert t["split_feedback_steps"] > 0 and r["link"] > 0 and r["cpu"] > 0
    assert t["split_cpu_columns"] == moe_split.cut_columns(2048, r["cpu"] / (r["link"] + r["cpu"]))


def test_auto_times_each_candidate_and_runs_the_fastest(capsys, tmp_path, monkeypatch):
    # the decision is measured: make copy-on-miss's steps slow and auto must not pick it
    import moe_engine
    import moe_tierkit as mt

    real = moe_engine.Engine.run_steps

    def slow(self, steps, *a, **k):
        t = real(self, steps, *a, **k)
        return [x + 1e6 for x in t] if isinstance(self.alt, mt.TierkitCopyOnMiss) else t

    monkeypatch.setattr(moe_engine.Engine, "run_steps", slow)
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    cells = com_cells(capsys, trace, "--alternatives", "tierkit", "--auto-candidates",
                      "in-place,copy-on-miss", "--auto-steps", "4")
    a = cells["tierkit"]["auto"]
    assert a["candidates_step_us"]["copy-on-miss"] > 1e6
    assert cells["tierkit"]["mode"] == a["chosen"] == "in-place"


def test_auto_boots_its_candidates_from_the_steps_before_their_window(capsys, tmp_path,
                                                                     monkeypatch):
    # a candidate timed on steps its seed map was fitted on would be flattered: the trials see
    # the profile's first steps only, the chosen mode the whole profile
    import moe_tierkit as mt

    seen = []
    real = mt.TierkitInPlace.__init__

    def spy(self, ctx, budget):
        seen.append((type(self).__name__, len(ctx.profile_ids), int(ctx.profile.sum())))
        real(self, ctx, budget)

    monkeypatch.setattr(mt.TierkitInPlace, "__init__", spy)
    trace = reuse_trace(tmp_path / "reuse.jsonl")
    cells = com_cells(capsys, trace, "--alternatives", "tierkit", "--auto-candidates",
                      "in-place,pooled", "--auto-steps", "3", "--auto-warmup", "1")
    a = cells["tierkit"]["auto"]
    assert a["window"] == [12, 16] and a["boot_steps"] == 12
    picks = 2 * 2  # the profile counts every (layer, pick) of a batch-1 step: 2 layers, top-2
    assert seen[:2] == [("TierkitInPlace", 12, 12 * picks), ("TierkitPooled", 12, 12 * picks)]
    assert seen[2][1:] == (16, 16 * picks)  # the chosen mode, rebuilt on the whole profile


def test_cli_refuses_bad_modes(capsys):
    for args in (["--tierkit-mode", "nope"], ["--tierkit-mode", "in-place,split"],
                 ["--auto-candidates", "auto"]):
        with pytest.raises(SystemExit):
            md.main(list(TINY) + args)


def test_swap_cost_forces_swaps_through_the_library_and_reports_per_swap(capsys):
    # tiny shape on the CPU reference path (NullExecutor): the baseline run of each pair swaps
    # nothing (the floor keeps the ratio policy still), the forced run swaps at the asked rate
    rc, rows = run(capsys, "--swap-cost", "--swap-rate", "1", "--batches", "2", "--budgets",
                   "0.5", "--runs", "3", "--steps", "6", "--warmup", "2")
    (sc,) = [r["swap_cost"] for r in rows if "swap_cost" in r]
    assert rc == 0 and sc["budget"] == 0.5 and sc["swap_rate_requested"] == 1
    assert len(sc["runs"]) == 3 and sc["expert_bytes"] == 6 * 64 * 32
    for pair in sc["runs"]:
        assert pair["without"]["swaps_per_step"] == 0
        assert 0 < pair["with"]["swaps_per_step"] <= 1
        assert isinstance(pair["added_us_per_swap"], float)
    ok = sorted(p["added_us_per_swap"] for p in sc["runs"])
    assert sc["added_us_per_swap"] == ok[1] and sc["met"] == (ok[1] <= 10.0)
    assert not any("alternative" in r for r in rows)  # no cells in this mode


def test_cpu_cold_rows_carry_the_measured_cpu_rate_for_the_model(capsys):
    rc, rows = run(capsys, "--batches", "2", "--budgets", "0.5", "--runs", "1", "--steps", "3",
                   "--warmup", "1", "--alternatives", "cpu-cold")
    c = [r for r in rows if r.get("alternative") == "cpu-cold"][0]
    assert rc == 0 and c["cpu_expert_gbps"] > 0 and c["cpu_rate_tokens"] >= 1
    terms = c["predicted_terms"]
    if c["cpu_expert_bytes_per_step"]:
        assert terms["cpu"] == pytest.approx(
            c["cpu_expert_bytes_per_step"] / (c["cpu_expert_gbps"] * 1e3), abs=0.1)
