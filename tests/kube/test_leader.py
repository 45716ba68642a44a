"""Lease leader election: acquire, renew, hand-over, expiry, release."""

from __future__ import annotations

import re

import httpx
import pytest
import trio
import trio.testing

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.leader import LeaderElector

from .fakekube import FakeKube

MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
KEY = ("leases", "sys", "bf")


def _elector(fake: FakeKube, who: str, **kw: object) -> LeaderElector:
    client = KubeClient(
        KubeConfig(server="http://kube.test"), transport=fake.transport(who), max_attempts=1
    )
    return LeaderElector(client, name="bf", namespace="sys", identity=who, rng=lambda: 0.0, **kw)  # type: ignore[arg-type]


def test_validation() -> None:
    fake = FakeKube()
    with pytest.raises(ValueError, match="lease-duration"):
        _elector(fake, "a", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="1.2"):
        _elector(fake, "a", renew_deadline=2.4, retry_period=2)
    with pytest.raises(ValueError):
        _elector(fake, "")


async def test_acquire_creates_lease_and_renews(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    a = _elector(fake, "a")
    async with a.leading() as lead:
        assert a.is_leader and not lead.lost
        spec = fake.objects[KEY]["spec"]
        assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 15
        assert spec["leaseTransitions"] == 0
        assert MICRO.match(spec["acquireTime"]) and MICRO.match(spec["renewTime"])
        rv0 = fake.objects[KEY]["metadata"]["resourceVersion"]
        await trio.sleep(10.5)
        puts = [r for r in fake.requests if r.method == "PUT"]
        assert len(puts) == 5  # renewals at 2, 4, 6, 8, 10 s
        assert fake.objects[KEY]["metadata"]["resourceVersion"] != rv0
        assert fake.objects[KEY]["spec"]["leaseTransitions"] == 0
    # clean exit released it
    spec = fake.objects[KEY]["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert not a.is_leader and not lead.lost


async def test_handover_between_two_electors(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    a, b = _elector(fake, "a"), _elector(fake, "b")
    timeline: list[tuple[str, str, float]] = []
    a_done = trio.Event()

    async def work(who: str, until: trio.Event | None) -> None:
        timeline.append((who, "start", trio.current_time()))
        try:
            if until is None:
                await trio.sleep_forever()
            await until.wait()
        finally:
            timeline.append((who, "stop", trio.current_time()))

    nursery.start_soon(a.run, lambda: work("a", a_done))
    await trio.testing.wait_all_tasks_blocked()
    await trio.sleep(1)  # b polls at odd seconds, a renews at even ones: no same-instant races
    nursery.start_soon(b.run, lambda: work("b", None))
    await trio.sleep(29)
    assert timeline == [("a", "start", 0.0)]
    assert fake.objects[KEY]["spec"]["holderIdentity"] == "a"
    assert b.leader == "a" and not b.is_leader
    a_done.set()  # a finishes its work at t=30 and releases the lease
    await trio.sleep(5)
    assert timeline[1] == ("a", "stop", 30.0)
    assert timeline[2] == ("b", "start", 31.0)  # b's next poll sees the released lease
    spec = fake.objects[KEY]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 15


async def test_takeover_on_expiry_cancels_old_leader(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    fake = FakeKube()
    a, b = _elector(fake, "a"), _elector(fake, "b")
    events: list[tuple[str, float]] = []
    a_lost = trio.Event()

    async def a_task() -> None:
        async with a.leading() as lead:
            events.append(("a-leads", trio.current_time()))
            try:
                await trio.sleep_forever()
            finally:
                events.append(("a-work-cancelled", trio.current_time()))
        assert lead.lost
        events.append(("a-lost", trio.current_time()))
        a_lost.set()

    async def b_task() -> None:
        async with b.leading():
            events.append(("b-leads", trio.current_time()))
            await trio.sleep_forever()

    nursery.start_soon(a_task)
    await trio.testing.wait_all_tasks_blocked()
    await trio.sleep(1)
    nursery.start_soon(b_task)  # b polls at 1, 3, 5, ...
    await trio.sleep(8)  # t=9: a renewed at 2,4,6,8
    fake.partition("a")  # a can no longer reach the apiserver (frozen network)
    await a_lost.wait()
    await trio.sleep(20)
    # a: last renew at 8; next attempt at 10 starts the 10 s renew deadline → steps down at 20.
    assert events[:3] == [("a-leads", 0.0), ("a-work-cancelled", 20.0), ("a-lost", 20.0)]
    # b first saw the t=8 renewal at its t=9 poll; 15 s later (24) it may take over, and it wakes
    # right then (plus the 10 ms expiry margin) instead of at its next regular poll (25).
    assert events[3] == ("b-leads", pytest.approx(24.01))
    spec = fake.objects[KEY]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.is_leader and b.is_leader


async def test_outer_cancellation_releases(autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeKube()
    a = _elector(fake, "a")
    with trio.move_on_after(5):
        async with a.leading():
            await trio.sleep_forever()
    assert fake.objects[KEY]["spec"]["holderIdentity"] == ""


async def test_simultaneous_candidates_exactly_one_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeKube()
    electors = [_elector(fake, w) for w in "abc"]
    leaders: list[str] = []
    async with trio.open_nursery() as n:
        for e in electors:

            async def go(e: LeaderElector = e) -> None:
                async with e.leading():
                    leaders.append(e.identity)
                    await trio.sleep_forever()

            n.start_soon(go)
        await trio.sleep(20)
        assert len(leaders) == 1
        assert fake.objects[KEY]["spec"]["holderIdentity"] == leaders[0]
        n.cancel_scope.cancel()


# ------------------------------------------------- the Lease namespace, and errors that need a fix


def test_lease_namespace_follows_the_pod(tmp_path: object) -> None:
    from pathlib import Path

    from bigfleet_trio.kube.leader import lease_namespace

    sa = Path(str(tmp_path))
    assert lease_namespace("", env={}, sa_dir=str(sa)) == ("bigfleet-system", "default")
    (sa / "namespace").write_text("from-file\n")
    assert lease_namespace("", env={}, sa_dir=str(sa)) == ("from-file", str(sa / "namespace"))
    assert lease_namespace("", env={"POD_NAMESPACE": "from-env"}, sa_dir=str(sa)) == (
        "from-env", "POD_NAMESPACE")
    assert lease_namespace("given", env={"POD_NAMESPACE": "from-env"}, sa_dir=str(sa)) == (
        "given", "flag")


@pytest.mark.parametrize(
    ("grant_namespace", "lease_ns", "reason", "shown", "fix"),
    [
        ("elsewhere", "ns1", "forbidden", "403 Forbidden on Lease ns1/bf",
         "grant get, create and update on leases.coordination.k8s.io in namespace ns1"),
        (None, "missing", "not_found", "404 NotFound on Lease missing/bf",
         "namespace missing does not exist"),
    ],
)
async def test_a_refused_lease_is_one_counted_error_naming_the_fix(
    grant_namespace: str | None, lease_ns: str, reason: str, shown: str, fix: str,
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """403 (no Role in the Lease namespace) and 404 (no such namespace), from the
    RBAC-enforcing sim: each attempt is counted, the ERROR names the fix once, /readyz says it."""
    import logging

    from bigfleet_trio.observability.metrics import LEASE_ERRORS
    from bigfleet_trio.operator.app import not_leader_reason
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer(authorization_mode="RBAC")
    res = {r.plural: r for r in server.resources.values()
           if r.group in ("", "rbac.authorization.k8s.io")}
    for ns in ("ns1", "elsewhere"):
        server.create(res["namespaces"], None, {"metadata": {"name": ns}})
    server.create(res["serviceaccounts"], "ns1", {"metadata": {"name": "op", "namespace": "ns1"}})
    if grant_namespace:  # a Role for the Lease, in the wrong namespace
        server.create(res["roles"], grant_namespace, {
            "metadata": {"name": "le", "namespace": grant_namespace},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["get", "create", "update"]}]})
        token = server.issue_token("ns1", "op")["status"]["token"]
    else:
        token = server.access.admin_token
    caplog.set_level(logging.INFO)
    before = LEASE_ERRORS.labels(reason)._value.get()
    async with trio.open_nursery() as nursery:
        client = KubeClient(KubeConfig(server="http://apiserver", token=token),
                            transport=InProcessTransport(server.app, nursery), max_attempts=1)
        elector = LeaderElector(client, name="bf", namespace=lease_ns, identity="me",
                                rng=lambda: 0.0)
        for _ in range(3):
            assert await elector.try_acquire_or_renew() is False
            await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert LEASE_ERRORS.labels(reason)._value.get() == before + 3
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert shown in errors[0] and fix in errors[0]
    assert elector.last_error == shown
    assert not_leader_reason(elector) == f"not the leader (leader: unknown; {shown})"


async def test_a_create_replayed_after_it_landed_is_our_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first Lease create lands but the connection drops before its answer, and the
    connection pool sends it again on a fresh one: the answer is AlreadyExists for the Lease
    this identity just wrote. That is our Lease, acquired at once. Before: read as a lost race,
    the leader started one retry period late."""
    fake = FakeKube()
    replay = [True]

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and "/leases" in request.url.path and replay[0]:
            replay[0] = False
            fake.handle(request)  # landed; its answer lost with the stale connection
        return fake.handle(request)

    client = KubeClient(
        KubeConfig(server="http://kube.test"), transport=httpx.MockTransport(handler),
        max_attempts=1,
    )
    a = LeaderElector(client, name="bf", namespace="sys", identity="a", rng=lambda: 0.0)
    assert await a.try_acquire_or_renew()
    assert [r.method for r in fake.requests].count("POST") == 2  # the replay: AlreadyExists
    assert fake.objects[KEY]["spec"]["holderIdentity"] == "a"


async def test_a_lease_created_by_another_is_still_a_lost_race(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """AlreadyExists for a Lease another identity created between our GET and create is a lost
    race, as before."""
    fake = FakeKube()
    other = [True]

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and "/leases" in request.url.path and other[0]:
            other[0] = False
            fake.handle(httpx.Request("POST", request.url, content=request.content.replace(
                b'"holderIdentity":"a"', b'"holderIdentity":"b"')))
        return fake.handle(request)

    client = KubeClient(
        KubeConfig(server="http://kube.test"), transport=httpx.MockTransport(handler),
        max_attempts=1,
    )
    a = LeaderElector(client, name="bf", namespace="sys", identity="a", rng=lambda: 0.0)
    assert not await a.try_acquire_or_renew()
    assert fake.objects[KEY]["spec"]["holderIdentity"] == "b"
