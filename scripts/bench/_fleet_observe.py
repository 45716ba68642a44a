"""Observation of the ``fleet`` bench: its own watches and the processes' stats and metrics.

:class:`Observed` collects, from the bench's informers (:func:`wire`), when Pods and CRs appeared,
the CRs' cpu/memory totals over time and UpcomingNode phase events; :func:`read_stats` and
:func:`read_metrics` read the shard's ``/stats`` and the operator's ``/metrics``. Private to
:mod:`scripts.bench.fleet` (the leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bigfleet_trio.podcontroller.translate import cr_name_for_pod
from bigfleet_trio.podcontroller.zonepin import ZONE_LABEL
from bigfleet_trio.quantity import Quantity, QuantityError

OWNED_BY_POD = "bigfleet.lucy.sh/owned-by-pod"


def _milli(q: Any) -> int:
    return int(Decimal(q.value) * 1000)


def _milli_cpu(q: Any) -> int:
    """A cpu quantity string in millicores; 0 for a missing or malformed one (a diagnostic)."""
    try:
        return _milli(Quantity.parse(q)) if q is not None else 0
    except (QuantityError, TypeError, ValueError):
        return 0


@dataclass
class Observed:
    phase: str = "start"
    pod_added: dict[str, tuple[float, str]] = field(default_factory=dict)   # uid -> t, phase
    cr_added: dict[str, float] = field(default_factory=dict)               # pod uid -> t
    # A Pod's CR is named after its UID, so a second on_add for one Pod UID is the same CR
    # deleted and created again; it is no Pod -> CR latency and is kept apart here.
    pod_deleted: dict[str, float] = field(default_factory=dict)            # uid -> t
    cr_deleted: dict[str, float] = field(default_factory=dict)             # pod uid -> last t
    # t, pod uid, phase, when the CR was last deleted before (None: no delete seen)
    cr_readds: list[tuple[float, str, str, float | None]] = field(default_factory=list)
    cpu: int = 0
    mem: int = 0
    contrib: dict[str, tuple[int, int]] = field(default_factory=dict)
    states: list[tuple[float, int, int, str]] = field(default_factory=list)
    un_events: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    phase_at: list[tuple[float, str]] = field(default_factory=list)

    def set_phase(self, name: str) -> None:
        self.phase = name
        self.phase_at.append((time.time(), name))

    def phase_of(self, t: float) -> str:
        cur = "start"
        for at, name in self.phase_at:
            if at <= t:
                cur = name
        return cur


def pod_view(pod: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of a Pod (its informer's transform)."""
    meta = pod.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "uid": meta.get("uid")},
            "node": (pod.get("spec") or {}).get("nodeName"),
            "job": any(r.get("kind") == "Job" for r in meta.get("ownerReferences") or ()),
            "phase": (pod.get("status") or {}).get("phase"),
            "unschedulable": unschedulable_message(pod),
            # the containers' cpu requests, millicores (init containers and overhead left out:
            # the fleet's workloads have none)
            "cpu_m": sum(_milli_cpu(((c.get("resources") or {}).get("requests") or {})
                                    .get("cpu"))
                         for c in (pod.get("spec") or {}).get("containers") or ())}


def node_view(node: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of a Node (its informer's transform): zone, allocatable cpu
    (millicores), cordoned."""
    meta = node.get("metadata") or {}
    return {"metadata": {"name": meta.get("name")},
            "zone": (meta.get("labels") or {}).get(ZONE_LABEL) or "",
            "cpu_m": _milli_cpu(((node.get("status") or {}).get("allocatable") or {}).get("cpu")),
            "cordoned": bool((node.get("spec") or {}).get("unschedulable"))}


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    """kube-scheduler's reason a Pod is not placed (its ``PodScheduled=False`` condition's
    message, at most 300 characters), or None."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "")[:300]
    return None


def node_use(pods: list[dict[str, Any]]) -> dict[str, int]:
    """Node name -> the cpu requests (millicores) of the Pods bound there."""
    used: dict[str, int] = defaultdict(int)
    for p in pods:
        if p["node"]:
            used[p["node"]] += p.get("cpu_m", 0)
    return used


def room(used: dict[str, int], nodes: list[dict[str, Any]],
         cpu_m: int) -> dict[str, dict[str, Any]]:
    """Per zone ("" for Nodes without one), over the Nodes not cordoned: how many, their free
    cpu (allocatable less ``used``, :func:`node_use`; cores) and how many have ``cpu_m``
    millicores free."""
    out: dict[str, dict[str, Any]] = {}
    for n in nodes:
        if n["cordoned"]:
            continue
        free = n["cpu_m"] - used.get(n["metadata"]["name"], 0)
        z = out.setdefault(n["zone"], {"nodes": 0, "free_cpu": 0, "fit": 0})
        z["nodes"] += 1
        z["free_cpu"] += free
        z["fit"] += free >= cpu_m
    for z in out.values():
        z["free_cpu"] = z["free_cpu"] / 1000
    return out


def pending_why(pods: list[dict[str, Any]], crs: Any,
                nodes: list[dict[str, Any]] | None = None,
                limit: int = 6) -> list[dict[str, Any]]:
    """Unbound Pods that are not a Job's, grouped by workload (the Pod name without its
    generated suffix): count, kube-scheduler's message, and the CR's requirements (a zone
    pin shows there), largest groups first. Given the Nodes (:func:`node_view`), each group
    also gets its first Pod's cpu request (``pod_cpu``, cores) and the :func:`room` for it:
    room in another zone than the pin is a zone gap, room nowhere is the fleet short."""
    groups: dict[str, dict[str, Any]] = {}
    for p in pods:
        if p["node"] or p["job"]:
            continue
        meta = p["metadata"]
        workload = meta["name"].rsplit("-", 2 if meta["name"].startswith("dep-") else 1)[0]
        g = groups.setdefault(f"{meta['namespace']}/{workload}", {"n": 0})
        g["n"] += 1
        if "scheduler" not in g and p.get("unschedulable"):
            g["scheduler"] = p["unschedulable"]
        if "cr_requirements" not in g:
            cr = crs.store.get(f"{meta['namespace']}/{cr_name_for_pod(meta['uid'])}")
            if cr is not None:
                g["cr_requirements"] = (cr.get("spec") or {}).get("requirements")
        if "pod_cpu" not in g:
            g["pod_cpu"] = p.get("cpu_m", 0) / 1000
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["n"])[:limit]
    if nodes is not None and ranked:
        # the Nodes' use summed once, room only for the groups reported: per pending group
        # over 50,000 Pods every 5 s it held the bench's loop, whose watch ends the latencies
        used = node_use(pods)
        for _k, g in ranked:
            g["room"] = room(used, nodes, round(g["pod_cpu"] * 1000))
    else:
        for _k, g in ranked:
            g.pop("pod_cpu", None)
    return [{"workload": k, **v} for k, v in ranked]


def cr_view(cr: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of a CapacityRequest (its informer's transform)."""
    meta = cr.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "labels": meta.get("labels") or {}},
            "spec": cr.get("spec") or {}}


def un_view(un: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of an UpcomingNode (its informer's transform)."""
    return {"metadata": {"name": (un.get("metadata") or {}).get("name")},
            "phase": (un.get("status") or {}).get("phase") or ""}


def wire(obs: Observed, pods: Any, crs: Any, uns: Any) -> None:
    """Record into ``obs`` from the Pod, CR and UpcomingNode informers' events."""
    from bigfleet_trio.operator.rollup.errors import CapacityRequestError
    from bigfleet_trio.operator.rollup.translate import contribution_from_cr

    def pod_add(p: dict[str, Any]) -> None:
        # first sighting only: a relist's add for a known Pod is not its creation
        obs.pod_added.setdefault(str(p["metadata"]["uid"]), (time.time(), obs.phase))

    def pod_delete(p: dict[str, Any]) -> None:
        obs.pod_deleted[str(p["metadata"]["uid"])] = time.time()

    def cr_change(key: str, cr: dict[str, Any] | None) -> None:
        old = obs.contrib.pop(key, (0, 0))
        new = (0, 0)
        if cr is not None:
            try:
                c = contribution_from_cr(cr)
                new = (_milli(c.resources["cpu"]) if "cpu" in c.resources else 0,
                       _milli(c.resources["memory"]) if "memory" in c.resources else 0)
                obs.contrib[key] = new
            except CapacityRequestError:
                pass
        if old != new:
            obs.cpu += new[0] - old[0]
            obs.mem += new[1] - old[1]
            obs.states.append((time.time(), obs.cpu, obs.mem, obs.phase))

    def cr_add(cr: dict[str, Any]) -> None:
        now = time.time()
        uid = cr["metadata"]["labels"].get(OWNED_BY_POD)
        if uid:
            if uid in obs.cr_added:  # the Pod's CR again: not a Pod -> CR latency
                obs.cr_readds.append((now, uid, obs.phase, obs.cr_deleted.get(uid)))
            else:
                obs.cr_added[uid] = now
        cr_change(_k(cr), cr)

    def cr_delete(cr: dict[str, Any]) -> None:
        uid = cr["metadata"]["labels"].get(OWNED_BY_POD)
        if uid:
            obs.cr_deleted[uid] = time.time()
        cr_change(_k(cr), None)

    def un_event(u: dict[str, Any]) -> None:
        obs.un_events[str(u["metadata"]["name"]).removeprefix("un-")].append(
            (time.time(), u["phase"]))

    pods.add_handler(on_add=pod_add, on_delete=pod_delete)
    crs.add_handler(on_add=cr_add, on_update=lambda _o, n: cr_change(_k(n), n),
                    on_delete=cr_delete)
    uns.add_handler(on_add=un_event, on_update=lambda o, n: un_event(n) if o["phase"] != n[
        "phase"] else None, on_delete=lambda o: un_event({**o, "phase": "Deleted"}))


def _k(obj: dict[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace')}/{obj['metadata'].get('name')}"


def read_stats(port: int, timeout: float = 30.0) -> dict[str, Any]:
    """The shard's ``/stats`` JSON on ``port``.

    Raises:
        OSError (TimeoutError, ConnectionRefusedError ...): no answer within ``timeout`` s.
        ValueError: an answer that is not JSON (e.g. cut short).
    """
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=timeout) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


class StatsPoller:
    """:func:`read_stats` for polls that may miss: a failed read is logged to stderr and
    counted (:attr:`failures`) and answers None, so one slow answer from a starved shard does
    not end a run that has been going for half an hour; the caller treats None as "not known
    yet" (a phase is not settled on it)."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.port = port
        self.timeout = timeout
        self.failures = 0

    def __call__(self) -> dict[str, Any] | None:
        try:
            return read_stats(self.port, self.timeout)
        except (OSError, ValueError) as exc:
            self.failures += 1
            print(f"shard /stats poll failed ({self.failures} so far): "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return None


def read_metrics(port: int) -> dict[str, float]:
    """The operator's ``/metrics`` on ``port``, summed per family name ({} when down)."""
    import urllib.request

    out: dict[str, float] = defaultdict(float)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            out[name] += float(line.rsplit(" ", 1)[1])
        except ValueError:
            pass
    return out


def read_histogram(port: int, name: str, having: str = "") -> dict[str, float]:
    """Cumulative bucket counts ``{le: count}`` of histogram ``name`` on ``port``'s ``/metrics``,
    summed over its other labels ({} when down or absent); ``having``: only the series whose
    line contains it (e.g. ``'waited_for="slot"'``)."""
    import re
    import urllib.request

    out: dict[str, float] = defaultdict(float)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    le = re.compile(r'le="([^"]+)"')
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{") or having not in line:
            continue
        m = le.search(line)
        if m:
            try:
                out[m.group(1)] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return dict(out)
