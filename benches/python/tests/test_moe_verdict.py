"""benches/python/moe_verdict.py: the issue-27 targets recomputed from moe_decode's JSON lines
(no torch, no GPU)."""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import moe_verdict as mv  # noqa: E402


def row(batch, budget, alt, tok_s, p50=1000.0, pred=None):
    return {"shape": "olmoe", "layers": 2, "batch": batch, "budget": budget, "alternative": alt,
            "tokens_per_s": tok_s, "step_p50_us": p50, "predicted_step_us": pred,
            "hidden": 64, "ffn": 32, "steps_timed": 20, "link_read_bytes_per_step": 0,
            "link_copy_bytes_per_step": 0, "cpu_expert_bytes_per_step": 0, "swaps_applied": 0}


def write(tmp_path, rows, name="cells.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in [{"env": {}}] + rows) + "\n")
    return str(p)


def test_verdicts_ties_wins_misses_and_the_geometric_mean(tmp_path):
    rows = [
        row(8, 1.0, "all-hbm", 1000.0),
        row(8, 0.25, "layer-uva", 100.0), row(8, 0.25, "shared-bank", 50.0),
        row(8, 0.25, "tierkit", 101.5, p50=1000.0, pred=1050.0),     # tie (within 2%)
        row(8, 0.5, "shared-bank", 200.0), row(8, 0.5, "tierkit", 180.0),  # miss
        row(1, 0.5, "shared-bank", 100.0), row(1, 0.5, "tierkit", 150.0),  # win, batch 1
    ]
    out = mv.verdicts(mv.read_rows([write(tmp_path, rows)]))
    by = {(r["batch"], r["budget"]): r for r in out}
    assert len(out) == 3  # the all-hbm ceiling is no cell of its own
    assert by[(8, 0.25)]["verdict"] == "tie" and by[(8, 0.25)]["best"] == "layer-uva"
    assert by[(8, 0.5)]["verdict"] == "miss" and by[(8, 0.5)]["vs_best"] == pytest.approx(0.9)
    assert by[(1, 0.5)]["verdict"] == "win"
    # the step-time model, not the row's stored prediction: all-HBM's 1000 µs + tierkit's
    # counting node in each of the 2 layers (no bytes off HBM in these rows)
    assert by[(8, 0.25)]["pred_vs_p50"] == pytest.approx((1000.0 + 2 * 3.2) / 1000.0)
    assert by[(8, 0.5)]["pred_vs_p50"] == pytest.approx(1.0064)
    g, n = mv.geomean_vs_shared_bank(out)  # batch >= 8 and budget <= 0.5: 2.03 and 0.9
    assert n == 2 and g == pytest.approx((101.5 / 50.0 * 0.9) ** 0.5)


def test_a_later_line_replaces_an_earlier_cell(tmp_path):
    a = write(tmp_path, [row(8, 0.5, "shared-bank", 100.0), row(8, 0.5, "tierkit", 90.0)], "a")
    b = write(tmp_path, [row(8, 0.5, "tierkit", 120.0)], "b")
    (r,) = mv.verdicts(mv.read_rows([a, b]))
    assert r["tierkit_tok_s"] == 120.0 and r["verdict"] == "win"


def test_bad_lines_name_the_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"env": {}}\nnot json\n')
    with pytest.raises(SystemExit, match="bad.jsonl:2"):
        mv.read_rows([str(p)])


def test_main_fails_without_cells(tmp_path, capsys):
    assert mv.main([write(tmp_path, [row(8, 1.0, "all-hbm", 1.0)])]) == 1
    assert "no cell" in capsys.readouterr().err


def test_main_prints_the_model_for_every_alternative(tmp_path, capsys):
    rows = [{"shape": "olmoe", "batch": 8, "routing": {"touched_per_layer": 4.0}},
            row(8, 1.0, "all-hbm", 8000.0, p50=1000.0),
            dict(row(8, 0.5, "layer-uva", 1000.0, p50=8000.0), link_read_bytes_per_step=354_200_000),
            dict(row(8, 0.5, "tierkit", 2000.0, p50=4000.0), link_read_bytes_per_step=101_200_000)]
    assert mv.main([write(tmp_path, rows)]) == 0
    out = capsys.readouterr().out
    # layer-uva: 1000 + 7000 µs of reads at 50.6 GB/s − 83 µs of its bytes at 4.27 TB/s
    assert "| olmoe | 2 | 8 | 0.5 | layer-uva | layer-uva | 8000.0 | 8000.0 | 7917.0 | 0.990 |" in out
    # tierkit: 1000 + 2000 µs of reads − the larger of its read bytes and 4 touched × 2 layers
    # × 12,288 B (the reads) at HBM + its counting node in 2 layers
    assert "| tierkit | in-place | 4000.0 | 4000.0 | 2982.7 | 0.746 |" in out
    assert "layer-uva: predicted step within 10% of the measured p50 in 1 of 1 cells" in out
    assert "tierkit: predicted step within 10% of the measured p50 in 0 of 1 cells" in out
    assert "outside 10% of the p50" in out and "olmoe L2 batch 8 budget 0.5 tierkit" in out


def test_the_committed_h200_cells_still_read():
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    files = [os.path.join(root, "docs", "h200", f) for f in
             ("moe-decode-quick.jsonl", "moe-decode-olmoe16.jsonl", "moe-decode-qwen3-8.jsonl")]
    out = mv.verdicts(mv.read_rows(files))
    assert len(out) == 28 and all(r["verdict"] in ("win", "tie", "miss") for r in out)
