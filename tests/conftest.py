"""Shared pytest configuration. Trio mode is on for every async test (pyproject: trio_mode)."""
