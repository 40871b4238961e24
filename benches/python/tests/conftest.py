"""The `lab` marker (tests that need tierkit.sim, a wheel built with --features lab)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs tierkit.sim (a wheel built with --features lab)")
