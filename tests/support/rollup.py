"""Roll-up stand-ins for tests that run an operator :class:`~bigfleet_trio.operator.session.Session`
without an operator behind it."""

from __future__ import annotations

from bigfleet_trio.proto import pb

__all__ = ["EmptyRollupSource"]


class EmptyRollupSource:
    """A roll-up Source with no demand: every roll-up is an empty ``ClusterCapacityNeeds``."""

    async def build(self) -> pb.ClusterCapacityNeeds:
        return pb.ClusterCapacityNeeds()

    async def after_enqueue(self) -> None:
        pass
