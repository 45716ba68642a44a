"""Benchmarks (not tests): ``python -m scripts.bench <scenario> [--quick] [--json]``.

Each public module here is one scenario defining ``register(subparsers)``; modules whose names
start with ``_`` are shared helpers and workload generators. Results go in ``BENCHMARKS.md`` (the
current figure per scenario) and ``docs/benchmarks/`` (each dated run).
"""
