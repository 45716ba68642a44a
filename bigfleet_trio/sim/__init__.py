"""Simulation: embedded Kubernetes API server, simulated shard, workloads and demo."""
