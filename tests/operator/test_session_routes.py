"""The session's route table (bigfleet_trio/operator/session/types.py ROUTES) against the wire and
the handlers: every downlink frame kind has a route, and every route's handler exists with the
arguments its dispatch policy passes (CONTRIBUTING.md, "How to add ...": "A shard frame kind")."""

from __future__ import annotations

import inspect

import pytest

from bigfleet_trio.operator.session.types import ROUTES, Dispatch, Handlers
from bigfleet_trio.operator.wiring import OperatorHandlers
from bigfleet_trio.proto import pb


def test_every_shard_message_kind_has_a_route() -> None:
    kinds = {f.name for f in pb.ShardMessage._betterproto.oneof_field_by_group["payload"]}
    assert set(ROUTES) == kinds


@pytest.mark.parametrize("kind", sorted(ROUTES))
def test_each_route_names_a_handler_its_policy_can_call(kind: str) -> None:
    route = ROUTES[kind]
    if route.dispatch is Dispatch.INLINE:
        assert route.inline is not None and route.handler is None
        return
    assert route.handler is not None
    if route.dispatch in (Dispatch.MACHINE_POOL, Dispatch.KEYED_WRITER):
        assert route.key is not None  # the payload field coalescing is keyed by
    # (payload) or (payload, reply): the same on the protocol and on the operator's handlers
    arity = 2 if route.reply else 1
    for owner in (Handlers, OperatorHandlers):
        fn = getattr(owner, route.handler)
        assert inspect.iscoroutinefunction(fn), (owner, route.handler)
        params = list(inspect.signature(fn).parameters)[1:]  # without self
        assert len(params) == arity, (owner, route.handler, params)


def test_one_machine_pool_route_at_most() -> None:
    assert sum(r.dispatch is Dispatch.MACHINE_POOL for r in ROUTES.values()) <= 1
