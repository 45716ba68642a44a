"""Roll-up stand-ins for tests that run an operator :class:`~bigfleet_trio.operator.session.Session`
without an operator behind it."""

from __future__ import annotations

from bigfleet_trio.proto import pb

__all__ = ["EmptyRollupSource", "INSTANCE_TYPE", "cpu_rollup"]

INSTANCE_TYPE = "node.kubernetes.io/instance-type"


def cpu_rollup(cpu: str, cluster_id: str = "c1") -> pb.ClusterCapacityNeeds:
    """One need for ``cpu`` (a quantity) on any machine with an instance type, 1 cpu units."""
    need = pb.CapacityNeed(
        requirements=[pb.NodeSelectorRequirement(
            key=INSTANCE_TYPE, operator=pb.NodeSelectorRequirementOperator.OPERATOR_EXISTS)],
        aggregate_resources={"cpu": cpu}, min_unit={"cpu": "1"})
    return pb.ClusterCapacityNeeds(cluster_id=cluster_id, needs=[need])


class EmptyRollupSource:
    """A roll-up Source with no demand: every roll-up is an empty ``ClusterCapacityNeeds``."""

    async def build(self) -> pb.ClusterCapacityNeeds:
        return pb.ClusterCapacityNeeds()

    async def after_enqueue(self) -> None:
        pass
