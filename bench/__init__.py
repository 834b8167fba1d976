"""Benchmarks, run by hand from the checkout, each side by side with what a user does today:
`.venv/bin/python -m bench.NAME` (docs/explanation/performance.md has their tables). They stand up tfrun with the
tests' own real parts, imported as `tests.harness`."""
