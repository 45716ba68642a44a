"""The shard stream: transport seam (protocol classes), the in-memory pair, the grpclib transport.

The agent dials and holds exactly one bidirectional
``Shard.Session`` stream. Everything above this package talks to :class:`OperatorStream` (agent
side) or :class:`ShardStream` (shard side), never to grpclib directly, so tests and the simulation
can drive a session over :func:`.transport.memory_stream_pair`. Import from the defining module.
"""
