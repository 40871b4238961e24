"""The replay scoreboard from Python."""

import pytest

from tierkit import sim


def test_scoreboard_on_a_short_scenario():
    board = sim.scoreboard(steps=600, shift_at=300, policies=["static", "adaptive", "oracle"],
                           config={"drain_every": 16})
    labels = [r["label"] for r in board["rows"]]
    assert labels[:2] == ["static", "adaptive"] and "oracle" in labels
    rows = {r["label"]: r for r in board["rows"]}
    assert rows["adaptive"]["cold_share"] < rows["static"]["cold_share"]
    assert "adaptive" in board["table"] and board["scenario"] == "olmoe-github-to-book"
    with pytest.raises(ValueError, match="unknown policy"):
        sim.scoreboard(policies=["best"])
