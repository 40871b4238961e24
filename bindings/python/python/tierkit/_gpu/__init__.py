"""The modules behind ``tierkit.torch`` (import that, not these: it checks the build and
PyTorch first)."""
