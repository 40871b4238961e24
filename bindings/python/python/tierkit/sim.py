"""The lab's expert replay scoreboard, on a synthetic OLMoE-shaped scenario.

``scoreboard(steps=3000, shift_at=1000)`` replays the scenario through every policy (static,
seed, adaptive, adaptive-shift-response, lru, oracle) and returns ``{"scenario", "rows",
"table"}``: the same rows and table as ``tierkit experts replay``.
"""

from tierkit._native import scoreboard

__all__ = ["scoreboard"]
