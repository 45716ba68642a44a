"""What became of my Pod, on the real control plane (tests/realkube/agent.py): a Pod the fleet
can serve gets ``CapacityRequested`` then ``MachineComing``, one asking for more than any
machine offers gets the ``NoCapacityOffered`` Warning, and ``kubectl describe pod`` shows them
(docs/rules.md#outcomes-conditions-and-pod-events).

Every wait is a bounded poll on what the cluster shows; no test asserts how long anything took.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.resources import EVENTS, PODS
from tests.realkube.agent import agent_in_namespace, container
from tests.support.realkube import RealKube


async def operator_events(kube: KubeClient, ns: str, pod: str) -> list[dict[str, Any]]:
    """The operator's Events on Pod ``pod``, in the order they were written (each is created
    once, so its resourceVersion, etcd's revision of that create, orders them)."""
    got = [e for e in (await kube.list(EVENTS, ns)).items
           if e["involvedObject"].get("kind") == "Pod" and e["involvedObject"]["name"] == pod
           and (e.get("source") or {}).get("component") == "bigfleet-operator"]
    return sorted(got, key=lambda e: int(e["metadata"]["resourceVersion"]))


def reasons(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in events]


def events_section(describe: str) -> str:
    return describe.split("\nEvents:", 1)[1]


async def test_a_served_pod_and_a_starved_one_tell_what_became_of_them(
    realkube: RealKube, tmp_path: Path
) -> None:
    async with agent_in_namespace(realkube, tmp_path, "outcome") as (a, ns):
        kube = a.admin
        # The starved Pod selects a label the served one does not: a profile of its own. In
        # one profile it would starve the served Pod too (the need's min_unit is its largest
        # Pod: docs/rules.md#demand-semantics).
        for name, memory, selector in (("served", "256Mi", {}),
                                       ("starved", "64Ti", {"kubernetes.io/os": "linux"})):
            body = container("1")
            body["resources"]["requests"]["memory"] = memory
            await kube.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                     "spec": {"containers": [body], "nodeSelector": selector}},
                              ns)

        async def served_told() -> bool:
            return {"CapacityRequested", "MachineComing"} <= {
                r for _, r in reasons(await operator_events(kube, ns, "served"))}

        async def starved_told() -> bool:
            return ("Warning", "NoCapacityOffered") in reasons(
                await operator_events(kube, ns, "starved"))

        await a.until("CapacityRequested and MachineComing on the served Pod", served_told)
        await a.until("NoCapacityOffered on the starved Pod", starved_told)
        served = reasons(await operator_events(kube, ns, "served"))
        assert served[:2] == [("Normal", "CapacityRequested"), ("Normal", "MachineComing")], (
            served)
        starved = reasons(await operator_events(kube, ns, "starved"))
        assert starved[0] == ("Normal", "CapacityRequested"), starved
        assert ("Normal", "MachineComing") not in starved, starved

        described = {name: await trio.to_thread.run_sync(
            lambda name=name: realkube.kubectl_run("describe", "pod", "-n", ns, name).stdout)
            for name in ("served", "starved")}
        served_out = events_section(described["served"])
        # (kubectl pads the Type column to the longest type shown)
        assert re.search(r"Normal +CapacityRequested .*demand queued for the fleet", served_out), (
            served_out)
        assert re.search(r"Normal +MachineComing ", served_out), served_out
        starved_out = events_section(described["starved"])
        assert re.search(r"Warning +NoCapacityOffered .*memory=64Ti", starved_out), starved_out
