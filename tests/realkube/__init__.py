"""The realkube tier: the agent on a real control plane (tests/support/realkube.py)."""
