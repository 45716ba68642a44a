"""Developer scripts (benchmarks, code generation). Run from the repository root."""
