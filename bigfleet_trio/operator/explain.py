"""``bigfleet-trio explain pod NS/NAME`` and ``explain cr NS/NAME``: one screen from a Pod to its
CapacityRequest, the roll-up need that carries it, the AvailableCapacity for its profile, the
UpcomingNodes that fit, and the last Events (docs/operate.md#explain-what-became-of-a-pod).

Read-only: GETs and LISTs through the kubeconfig, nothing written. :func:`gather` does the reads
into an :class:`Explained`; :func:`render` (pure) prints it, with the same matching rules the
operator's outcome pass uses (:mod:`.outcomes`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from bigfleet_trio.kube.errors import NotFound
from bigfleet_trio.kube.resources import (
    AVAILABLE_CAPACITIES,
    CAPACITY_REQUESTS,
    EVENTS,
    PODS,
    UPCOMING_NODES,
    Resource,
)
from bigfleet_trio.quantity import Quantity, sum_resources

from . import outcomes
from .rollup.errors import CapacityRequestError
from .rollup.translate import Contribution, contribution_from_cr

__all__ = ["Explained", "ExplainError", "explain", "gather", "render"]

#: The label the pod controller puts on each CR: the owner Pod's uid.
OWNED_BY_POD_LABEL = "bigfleet.lucy.sh/owned-by-pod"
#: Events printed, the latest.
LAST_EVENTS = 10
#: UpcomingNodes and offers listed, the first that fit.
LISTED = 5


class ExplainError(Exception):
    """The target cannot be explained (malformed name, no such object): one line for the user."""


class _Reader(Protocol):  # the read-only part of KubeClient explain uses
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Any: ...

    async def list(self, res: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int = 500, resource_version: str | None = None) -> Any: ...


@dataclass
class Explained:
    """What :func:`gather` read: the Pod (None when explaining a CR whose Pod is gone), its CR
    (None: the pod controller made none), the cluster's offers and UpcomingNodes, Events on the
    Pod and the CR (oldest first), and, with ``aggregate``, every CR's spec for the need total."""

    pod: dict[str, Any] | None
    cr: dict[str, Any] | None
    offers: list[dict[str, Any]] = field(default_factory=list)
    upcoming: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    peers: list[dict[str, Any]] | None = None


def _split(target: str) -> tuple[str, str]:
    ns, sep, name = target.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ExplainError(f"expected NAMESPACE/NAME, got {target!r}")
    return ns, name


def _uid(obj: Mapping[str, Any] | None) -> str:
    md = obj.get("metadata") if isinstance(obj, Mapping) else None
    uid = md.get("uid") if isinstance(md, Mapping) else None
    return uid if isinstance(uid, str) else ""


async def _events_of(client: _Reader, ns: str, obj: Mapping[str, Any] | None) -> list[Any]:
    uid = _uid(obj)
    if not uid:
        return []
    got = await client.list(EVENTS, ns, field_selector=f"involvedObject.uid={uid}")
    return list(got.items)


async def gather(client: _Reader, kind: str, target: str, *,
                 aggregate: bool = False) -> Explained:
    """Read what :func:`render` shows for ``kind`` ``pod`` or ``cr`` named ``NS/NAME``.

    Raises:
        ExplainError: a malformed target, an unknown kind, or no such Pod / CR.
        bigfleet_trio.kube.errors.KubeError: the apiserver refused a read (RBAC:
            docs/operate.md#explain-what-became-of-a-pod).
    """
    ns, name = _split(target)
    pod: dict[str, Any] | None = None
    cr: dict[str, Any] | None = None
    if kind == "pod":
        try:
            pod = await client.get(PODS, name, ns)
        except NotFound:
            raise ExplainError(f"pod {ns}/{name} not found") from None
        found = await client.list(CAPACITY_REQUESTS, ns,
                                  label_selector=f"{OWNED_BY_POD_LABEL}={_uid(pod)}")
        cr = next(iter(found.items), None)
    elif kind == "cr":
        try:
            cr = await client.get(CAPACITY_REQUESTS, name, ns)
        except NotFound:
            raise ExplainError(f"capacityrequest {ns}/{name} not found") from None
        ref = outcomes.pod_of(cr)
        if ref is not None:
            try:
                pod = await client.get(PODS, ref["metadata"]["name"], ns)
            except NotFound:
                pod = None
    else:
        raise ExplainError(f"explain pod|cr NAMESPACE/NAME, got kind {kind!r}")
    out = Explained(pod=pod, cr=cr)
    if cr is not None:
        out.offers = [o for o in (await client.list(AVAILABLE_CAPACITIES)).items]
        out.upcoming = [u for u in (await client.list(UPCOMING_NODES)).items]
        if aggregate:
            out.peers = list((await client.list(CAPACITY_REQUESTS)).items)
    events = await _events_of(client, ns, pod) + await _events_of(client, ns, cr)
    out.events = sorted(events, key=_event_order)
    return out


def _event_order(e: Mapping[str, Any]) -> tuple[str, int]:
    """By time, then by resourceVersion (Events of the same second, in write order)."""
    rv = _get(e, "metadata", "resourceVersion")
    return (_event_time(e), int(rv) if isinstance(rv, str) and rv.isdigit() else 0)


def _event_time(e: Mapping[str, Any]) -> str:
    for k in ("lastTimestamp", "eventTime", "firstTimestamp"):
        v = e.get(k)
        if isinstance(v, str) and v:
            return v
    md = e.get("metadata")
    ts = md.get("creationTimestamp") if isinstance(md, Mapping) else None
    return ts if isinstance(ts, str) else ""


# ------------------------------------------------------------------------------- rendering


def _get(obj: object, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _fmt(resources: Mapping[str, Quantity]) -> str:
    return ", ".join(f"{k}={v}" for k, v in resources.items()) or "-"


def _need_lines(c: Contribution, peers: Sequence[Mapping[str, Any]] | None) -> list[str]:
    p = c.profile
    reqs = "; ".join(
        f"{r.key} {outcomes.OPERATOR_NAMES.get(r.operator, r.operator)} {','.join(r.values)}"
        .rstrip() for r in p.requirements) or "none"
    lines = [
        f"  profile      {p.fingerprint}  priority {p.priority}, interruption bucket "
        f"{p.interruption_bucket}, reclamation bucket {p.reclamation_bucket}",
        f"  requirements {reqs}",
        f"  group        {c.group or '- (no co-location)'}",
        f"  per Pod      {_fmt(c.resources)}",
    ]
    if peers is None:
        lines.append("  aggregate    (--aggregate lists every CR to sum the need)")
        return lines
    total: dict[str, Quantity] = {}
    count = 0
    for other in peers:
        try:
            oc = contribution_from_cr(other)
        except CapacityRequestError:
            continue
        if oc.need_key == c.need_key:
            total = sum_resources(total, oc.resources)
            count += 1
    lines.append(f"  aggregate    {count} CR(s): {_fmt(total)}")
    return lines


def render(x: Explained) -> str:
    """The one screen (plain text, ends with a newline)."""
    lines: list[str] = []
    pod, cr = x.pod, x.cr
    if pod is not None:
        md = pod.get("metadata") or {}
        sched = next((c for c in _get(pod, "status", "conditions") or ()
                      if isinstance(c, Mapping) and c.get("type") == "PodScheduled"), None)
        node = _get(pod, "spec", "nodeName")
        lines += [f"Pod {md.get('namespace')}/{md.get('name')}",
                  f"  phase        {_get(pod, 'status', 'phase') or '?'}"
                  + (f" on Node {node}" if node else " (not bound to a Node)")]
        if sched is not None and sched.get("status") != "True":
            lines.append(f"  scheduler    {sched.get('reason', '')}: {sched.get('message', '')}")
    else:
        lines.append("Pod          gone (or never known)")
    if cr is None:
        lines += ["CapacityRequest",
                  "  none: the pod controller made none for this Pod (bound, terminal, excluded "
                  "by --exclude-pod-selector, or untranslatable: see the Events below)"]
    else:
        md = cr.get("metadata") or {}
        status = cr.get("status") or {}
        lines += [f"CapacityRequest {md.get('namespace')}/{md.get('name')}",
                  f"  phase        {status.get('phase') or '-'}"
                  + (f" since {status['acknowledgedAt']}" if status.get("acknowledgedAt")
                     else "")]
        for c in status.get("conditions") or ():
            if isinstance(c, Mapping):
                lines.append(f"  {c.get('type', '?'):<16} {c.get('status', '?'):<7} "
                             f"{c.get('reason', '')}: {c.get('message', '')}")
        try:
            contribution: Contribution | None = contribution_from_cr(cr)
        except CapacityRequestError as exc:
            contribution = None
            lines += ["Roll-up", f"  excluded     {exc.field}: {exc.message}"]
        if contribution is not None:
            lines += ["Roll-up need", *_need_lines(contribution, x.peers)]
            specs = [o.get("spec") or {} for o in x.offers]
            fit = [o for o, s in zip(x.offers, specs, strict=True)
                   if outcomes.offer_matches(contribution, s)]
            lines.append(f"AvailableCapacity  {len(fit)} of {len(x.offers)} offer(s) fit")
            for o in fit[:LISTED]:
                spec = o.get("spec") or {}
                lines.append(f"  {_get(o, 'metadata', 'name')}  "
                             f"{outcomes.describe_offer(spec)}")
            coming = [u for u in x.upcoming if outcomes.upcoming_fits(contribution, u)]
            lines.append(f"UpcomingNodes      {len(coming)} of {len(x.upcoming)} fit")
            for u in coming[:LISTED]:
                lines.append(f"  {outcomes.describe_upcoming(u)}")
    lines.append("Events (latest last)" if x.events else "Events       none")
    for e in x.events[-LAST_EVENTS:]:
        lines.append(f"  {_event_time(e):<20} {e.get('type', ''):<7} "
                     f"{_get(e, 'involvedObject', 'kind') or '':<15} "
                     f"{e.get('reason', '')}: {e.get('message', '')}")
    return "\n".join(lines) + "\n"


def explain(kind: str, target: str, kubeconfig: str | None, *, aggregate: bool = False,
            out: IO[str] | None = None) -> int:
    """The ``explain`` command: read, render, print. Returns 0; raises what :func:`gather`
    raises (the CLI prints it as one line, exit 1)."""
    import trio

    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import load_kubeconfig

    async def _run() -> Explained:
        async with KubeClient(load_kubeconfig(kubeconfig)) as client:
            return await gather(client, kind, target, aggregate=aggregate)

    (out or sys.stdout).write(render(trio.run(_run)))
    return 0
