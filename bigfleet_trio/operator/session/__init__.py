"""One ``Shard.Session`` stream's life (docs/wire.md#the-session): ``Session`` in :mod:`.core`,
composed of the send side (:mod:`.send`), the frame router (:mod:`.router`) and the worker pool
(:mod:`.work`), over the queues and coalescers of :mod:`.queues`; the route table, the handler
protocol and the settings in :mod:`.types`. Import from the defining module.
"""
