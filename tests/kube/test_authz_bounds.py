"""``KubeAuthorizer``'s bounds (docs/crds.md#diagnostics-access): an LRU decision cache in
which unseen tokens never push out a known caller, a cap on reviews in flight with a counted
refusal beyond it, and a review client of its own (``review_client``)."""

from __future__ import annotations

from typing import Any

import trio

from bigfleet_trio.kube.authz import KubeAuthorizer, review_client
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.resources import Resource
from bigfleet_trio.observability.metrics import DIAGNOSTICS_AUTH

GOOD = "good-token"


class FakeReviews:
    """``create`` as the apiserver answers TokenReview and SubjectAccessReview: GOOD and
    ``ok-*`` tokens are a user allowed everything; any other token is not authenticated.
    ``gate`` (when set) holds every review until it is set."""

    def __init__(self) -> None:
        self.reviews: list[str] = []
        self.gate: trio.Event | None = None

    async def create(self, res: Resource, body: dict[str, Any]) -> dict[str, Any]:
        if res.plural == "tokenreviews":
            token = body["spec"]["token"]
            self.reviews.append(token)
            if self.gate is not None:
                await self.gate.wait()
            ok = token == GOOD or token.startswith("ok-")
            return {"status": {"authenticated": ok, "user": {"username": f"u-{token}"}}}
        return {"status": {"allowed": True}}


def _auth(fake: FakeReviews, **kw: Any) -> KubeAuthorizer:
    return KubeAuthorizer(fake, **kw)  # type: ignore[arg-type]


async def test_a_cached_decision_is_reused_within_ttl(autojump_clock: trio.abc.Clock) -> None:
    fake = FakeReviews()
    auth = _auth(fake, ttl=10.0)
    assert (await auth.check(f"Bearer {GOOD}", "/metrics")).status == 200
    await trio.sleep(9)
    assert (await auth.check(f"Bearer {GOOD}", "/metrics")).status == 200
    assert fake.reviews == [GOOD]
    await trio.sleep(2)
    await auth.check(f"Bearer {GOOD}", "/metrics")
    assert fake.reviews == [GOOD, GOOD]


async def test_unseen_tokens_never_evict_a_known_caller(autojump_clock: trio.abc.Clock) -> None:
    fake = FakeReviews()
    auth = _auth(fake, ttl=60.0, max_entries=4)
    assert (await auth.check(f"Bearer {GOOD}", "/metrics")).status == 200
    for i in range(100):  # a flood of random tokens: each one is reviewed once and refused
        assert (await auth.check(f"Bearer bad-{i}", "/metrics")).status == 401
    assert (await auth.check(f"Bearer {GOOD}", "/metrics")).status == 200
    assert fake.reviews.count(GOOD) == 1  # still cached


async def test_the_cache_is_lru_not_fifo(autojump_clock: trio.abc.Clock) -> None:
    fake = FakeReviews()
    auth = _auth(fake, ttl=60.0, max_entries=3)
    await auth.check(f"Bearer {GOOD}", "/metrics")
    for i in range(10):  # other allowed callers come and go; GOOD is used between them
        await auth.check(f"Bearer ok-{i}", "/metrics")
        await auth.check(f"Bearer {GOOD}", "/metrics")
    assert fake.reviews.count(GOOD) == 1


async def test_reviews_in_flight_are_capped_and_the_rest_refused_and_counted(
    autojump_clock: trio.abc.Clock,
) -> None:
    fake = FakeReviews()
    fake.gate = trio.Event()
    auth = _auth(fake, max_in_flight=2)
    refused_before = DIAGNOSTICS_AUTH.labels("refused")._value.get()
    results: list[int] = []

    async def one(token: str) -> None:
        results.append((await auth.check(f"Bearer {token}", "/metrics")).status)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(one, f"ok-{i}")
        await trio.sleep(1)
        assert len(fake.reviews) == 2  # two in flight, three refused without a review
        assert sorted(results) == [429, 429, 429]
        fake.gate.set()
    assert sorted(results) == [200, 200, 429, 429, 429]
    assert DIAGNOSTICS_AUTH.labels("refused")._value.get() - refused_before == 3


async def test_the_review_client_is_its_own() -> None:
    cfg = KubeConfig(server="http://127.0.0.1:1")
    async with review_client(cfg, "bigfleet-trio/x") as a, review_client(cfg) as b:
        assert a is not b
        assert a._limiter is not b._limiter
        assert a.max_attempts == 1  # a failed review is that request's 500, not a retry storm
