"""Simulation: embedded Kubernetes API server, simulated shard, workloads and demo.

Not product code: nothing outside ``bigfleet_trio/sim`` imports it, and the production image
leaves it out. Its scope (the demo, the pieces path, the fast test suite; conformance and scale
belong to the real control plane) is docs/architecture.md#the-simulations-scope.
"""
