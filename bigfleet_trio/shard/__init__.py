"""The shard stream: transport seam (protocol classes), the in-memory pair, the grpclib transport.

The agent dials and holds exactly one bidirectional
``Shard.Session`` stream. Everything above this package talks to :class:`OperatorStream` (agent
side) or :class:`ShardStream` (shard side), never to grpclib directly, so tests and the simulation
can drive a session over :func:`memory_stream_pair`.
"""

from .transport import (
    Connector,
    MemoryConnector,
    OperatorStream,
    PriorityReceive,
    ShardStream,
    StreamClosed,
    memory_stream_pair,
)

__all__ = [
    "Connector",
    "MemoryConnector",
    "OperatorStream",
    "PriorityReceive",
    "ShardStream",
    "StreamClosed",
    "memory_stream_pair",
]
