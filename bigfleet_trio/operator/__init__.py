"""The per-cluster operator (seed 000): roll-up, acknowledgement, node state, reclaim, bootstrap."""
