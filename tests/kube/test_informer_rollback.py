"""Informer after a server rollback (an etcd restore, a restart with empty state).

A watch refused as "Too large resource version", or a resourceVersion older than the informer's
last, relists from scratch so the cache drops the objects that no longer exist
(docs/kube-api.md#relist-from-scratch).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from bigfleet_trio.kube import informer as informer_mod
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig
from bigfleet_trio.kube.errors import ApiError, Expired, ServerError, error_from_status
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.kube.retry import Backoff
from bigfleet_trio.sim.apiserver import ApiServer
from bigfleet_trio.sim.apiserver.testing import InProcessTransport

from .fakekube import FakeKube

CR = "capacityrequests"


def _cr(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": 1, "resources": {"cpu": "1"}},
    }


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


class Recorder:
    def __init__(self, inf: Informer):
        self.log: list[tuple[str, str]] = []
        inf.add_handler(
            on_add=lambda o: self.log.append(("add", o)),
            on_update=lambda old, new: self.log.append(("update", new)),
            on_delete=lambda o: self.log.append(("delete", o)),
        )

    def take(self) -> list[tuple[str, str]]:
        out, self.log = self.log, []
        return out


def _informer(client: KubeClient, watch_list: bool = False) -> Informer:
    return Informer(
        client,
        CAPACITY_REQUESTS,
        transform=_name,
        backoff=Backoff(rng=lambda: 0.0),
        rng=random.Random(7),
        watch_list=watch_list,
    )


def _relists(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "bigfleet_informer_relists_total", {"resource": CR, "reason": reason}
    )
    return value or 0.0


def _relist_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "bigfleet_trio.kube.informer" and hasattr(r, "dropped")
    ]


@pytest.mark.parametrize("watch_list", [False, True], ids=["paged-list", "watch-list"])
async def test_watch_refused_as_too_large_after_restore_relists_and_deletes_phantoms(
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    watch_list: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="bigfleet_trio.kube.informer")
    before = _relists("too_large_rv")
    old_server = ApiServer()
    transport = InProcessTransport(old_server.app, nursery)
    client = KubeClient(KubeConfig(server="http://apiserver"), transport=transport)
    for n in "abcd":
        await client.create(CAPACITY_REQUESTS, _cr(n))
    inf = _informer(client, watch_list)
    rec = Recorder(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await trio.testing.wait_all_tasks_blocked()
    assert rec.take() == [("add", "a"), ("add", "b"), ("add", "c"), ("add", "d")]
    old_rv = inf.resource_version

    # The apiserver restarts on the same address with empty state (an etcd restore): its
    # resourceVersion is behind the informer's, so the re-watch is refused as too large.
    restored = ApiServer()
    assert restored.store.rv < int(old_rv)
    transport.app = restored.app
    old_server.faults.drop_watches()
    await trio.sleep(5)

    assert len(inf.store) == 0
    assert rec.take() == [("delete", "a"), ("delete", "b"), ("delete", "c"), ("delete", "d")]
    assert inf.resource_version == str(restored.store.rv)
    [record] = _relist_records(caplog)
    assert record.levelno == logging.WARNING
    assert "relist" in record.getMessage()
    fields = {k: getattr(record, k) for k in ("resource", "reason", "old_rv", "new_rv", "dropped")}
    assert fields == {
        "resource": CR,
        "reason": "too_large_rv",
        "old_rv": old_rv,
        "new_rv": str(restored.store.rv),
        "dropped": 4,
    }
    assert _relists("too_large_rv") == before + 1

    # The new watch is live on the restored server.
    await client.create(CAPACITY_REQUESTS, _cr("e"))
    await trio.testing.wait_all_tasks_blocked()
    assert rec.take() == [("add", "e")]
    assert inf.store.keys() == ["default/e"]


@pytest.mark.parametrize("signal", ["event", "bookmark"])
async def test_watch_showing_an_older_resource_version_relists_from_scratch(
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    signal: str,
) -> None:
    # A server that does not refuse a too-new resourceVersion (it just waits) and then streams
    # versions from before the informer's: the rollback shows only in the versions.
    caplog.set_level(logging.INFO, logger="bigfleet_trio.kube.informer")
    before = _relists("rv_rollback")
    fake = FakeKube()
    for n in "abcd":
        fake.seed(CR, _cr(n))  # resourceVersions 101..104
    client = KubeClient(KubeConfig(server="http://kube.test"), transport=fake.transport())
    inf = _informer(client)
    rec = Recorder(inf)
    await nursery.start(inf.run)
    await inf.wait_synced()
    await trio.testing.wait_all_tasks_blocked()
    rec.take()
    assert inf.resource_version == "104"

    fake.objects.clear()  # restored from an old, empty backup at resourceVersion 10
    fake.history.clear()
    fake.rv = 10
    fake.end_watches()
    await trio.sleep(1)  # an empty watch that ended at once: one backoff step, then re-watch
    assert [w.url.params["resourceVersion"] for w in fake.watch_requests()] == ["104", "104"]
    if signal == "event":
        fake.seed(CR, _cr("e"))  # resourceVersion 11
        want_rv, want_keys, want_events = "11", ["default/e"], [("add", "e")]
    else:
        fake.bookmark()  # resourceVersion 10
        want_rv, want_keys, want_events = "10", [], []
    await trio.sleep(5)

    assert inf.store.keys() == want_keys
    deletes = [("delete", n) for n in "abcd"]
    assert rec.take() == want_events + deletes  # the list as it arrives, deletions last
    assert inf.resource_version == want_rv
    [record] = _relist_records(caplog)
    assert record.levelno == logging.WARNING
    assert (record.reason, record.old_rv, record.new_rv, record.dropped) == (  # type: ignore[attr-defined]
        "rv_rollback",
        "104",
        want_rv,
        4,
    )
    assert _relists("rv_rollback") == before + 1


# -- the pure decisions --------------------------------------------------------------------------

_TOO_LARGE_BODY = {
    "kind": "Status",
    "status": "Failure",
    "message": "Timeout: Too large resource version: 9, current: 3",
    "reason": "Timeout",
    "details": {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    },
    "code": 504,
}


@pytest.mark.parametrize(
    ("exc", "want"),
    [
        (error_from_status(504, _TOO_LARGE_BODY), True),
        # the cause alone, whatever the status (client-go HasStatusCause)
        (ServerError(500, "InternalError", "x", {"details": _TOO_LARGE_BODY["details"]}), True),
        # older apiservers: 504 Timeout with the message only (in a cause, or the Status message)
        (
            ServerError(
                504,
                "Timeout",
                "Timeout",
                {"details": {"causes": [{"message": "Too large resource version"}]}},
            ),
            True,
        ),
        (ServerError(504, "Timeout", "Too large resource version: 9, current: 3", None), True),
        (ServerError(504, "Timeout", "request timed out", {"details": {"causes": []}}), False),
        (ServerError(500, "InternalError", "Too large resource version: 9, current: 3"), False),
        (Expired(410, "Expired", "too old resource version: 1 (5)"), False),
        (ServerError(504, "Timeout", "x", {"details": "not a map"}), False),
        (ServerError(504, "Timeout", "x", {"details": {"causes": ["not a map", None]}}), False),
    ],
)
def test_is_too_large_resource_version(exc: ApiError, want: bool) -> None:
    assert informer_mod.is_too_large_resource_version(exc) is want


@pytest.mark.parametrize(
    ("new", "old", "want"),
    [
        ("5", "10", True),
        ("99", "100", True),
        ("10", "10", False),
        ("11", "10", False),
        ("", "10", False),  # no version: nothing to compare
        ("5", "", False),  # never listed
        ("abc", "10", False),  # opaque versions are not compared
        ("5", "x7", False),
        ("-1", "10", False),
        ("٣", "10", False),  # a non-ASCII digit is not a decimal resourceVersion
    ],
)
def test_rv_rolled_back(new: str, old: str, want: bool) -> None:
    assert informer_mod.rv_rolled_back(new, old) is want
