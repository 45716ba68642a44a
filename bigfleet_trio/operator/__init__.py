"""The per-cluster operator: roll-up, acknowledgement, node state, reclaim, bootstrap."""
