"""NodeStateUpdate -> UpcomingNode: the engine's machine lifecycle made visible in the cluster.

One cluster-scoped ``UpcomingNode`` named ``un-<machine_id>`` per machine
(docs/rules.md#upcomingnode-phases). :mod:`.plan` decides (pure: naming, phases, spec, drain
memory, :func:`plan_node_state_update`); :mod:`.handler` reads, writes and retries
(:class:`UpcomingNodeHandler`). Import from the defining module.
"""
