"""Shared pytest set-up: the `lab` marker.

A test marked ``@pytest.mark.lab`` needs ``tierkit.sim`` (a wheel built with ``--features
lab``). In the base wheel, which carries the tiers only, each such test is skipped on its own
with the reason, so the count shows how many lab tests did not run. ``pytest -m lab`` runs only
them (what .ci/test does after rebuilding the wheel with the lab).
"""

import pytest

import tierkit

LAB_SKIP = "needs the lab: tierkit built without --features lab (tierkit.has_lab is False)"


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs tierkit.sim (a wheel built with --features lab)")


def pytest_collection_modifyitems(config, items):
    if tierkit.has_lab:
        return
    skip = pytest.mark.skip(reason=LAB_SKIP)
    for item in items:
        if "lab" in item.keywords:
            item.add_marker(skip)
