"""What became of a Pod's demand: CapacityRequest conditions and the Pod Events that report them.

The pure half (:func:`plan_conditions`, :func:`conditions_patch`, :func:`transition_events`)
turns one cached CR, the shard's offers (AvailableCapacity specs) and the UpcomingNodes into
three ``metav1.Condition`` entries (docs/rules.md#outcomes-conditions-and-pod-events):

- ``Sent``: True once the CR is Acknowledged (in a roll-up queued on the shard session; the
  shard's receipt is not awaited); False, reason ``Excluded``, naming the field, when the
  roll-up cannot carry it.
- ``CapacityOffered``: an AvailableCapacity compatible with the CR offers at least one machine.
- ``MachineComing``: an UpcomingNode whose labels meet the CR's requirements and whose
  resources hold its request; reason ``NothingCame`` (a Warning) once the CR was sent longer
  than the wait ago and none did.

:class:`OutcomeWriter` (the I/O half) applies the plan: one status merge-patch per CR whose
(type, status, reason) changed, at most ``budget`` per pass, and one Pod Event per transition
worth telling through the operator's :class:`~.kubeevents.EventRecorder`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import trio
from prometheus_client import Counter, Gauge

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import KubeError, NotFound
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS
from bigfleet_trio.quantity import Quantity, QuantityError

from .acknowledge import format_acknowledged_at
from .crview import POD_NAME_KEY
from .kubeevents import EventRecorder
from .rollup.errors import CapacityRequestError
from .rollup.profile import OP_DOES_NOT_EXIST, OP_EXISTS, OP_IN, OP_NOT_IN, Requirement
from .rollup.translate import Contribution, contribution_from_cr

__all__ = [
    "COND_CAPACITY_OFFERED",
    "COND_MACHINE_COMING",
    "COND_SENT",
    "DEFAULT_BUDGET",
    "DEFAULT_PERIOD",
    "DEFAULT_WAIT",
    "PodEvent",
    "OutcomeWriter",
    "conditions_patch",
    "describe_offer",
    "describe_upcoming",
    "upcoming_fits",
    "labels_satisfy",
    "offer_matches",
    "plan_conditions",
    "pod_of",
    "transition_events",
]

log = logging.getLogger(__name__)

COND_SENT: Final = "Sent"
COND_CAPACITY_OFFERED: Final = "CapacityOffered"
COND_MACHINE_COMING: Final = "MachineComing"
TYPES: Final = (COND_SENT, COND_CAPACITY_OFFERED, COND_MACHINE_COMING)

# reasons (CamelCase, as metav1.Condition wants)
R_IN_ROLLUP: Final = "InRollUp"
R_EXCLUDED: Final = "Excluded"
R_OFFERED: Final = "Offered"
R_NO_OFFER: Final = "NoOffer"
R_NO_HINTS: Final = "NoHints"
R_MACHINE: Final = "MachineFits"
R_NONE_YET: Final = "NoneFits"
R_NOTHING_CAME: Final = "NothingCame"

# Pod Event reasons (docs/rules.md#outcomes-conditions-and-pod-events)
EV_SENT: Final = "CapacityRequested"
EV_EXCLUDED: Final = "CapacityRequestExcluded"
EV_COMING: Final = "MachineComing"
EV_NO_OFFER: Final = "NoCapacityOffered"
EV_NOTHING_CAME: Final = "NoMachineCame"

DEFAULT_PERIOD: Final = 15.0
"""Seconds between two passes over the CR cache."""
DEFAULT_BUDGET: Final = 1000
"""Status patches (hence Pod Events) at most per pass."""
DEFAULT_WAIT: Final = 600.0
"""Seconds after Sent before "no machine came" is a Warning."""

#: Requirement operator numbers as the CRD spells them (explain prints them).
OPERATOR_NAMES: Final = {OP_IN: "In", OP_NOT_IN: "NotIn", OP_EXISTS: "Exists",
                         OP_DOES_NOT_EXIST: "DoesNotExist"}

#: UpcomingNode phases that will (or do) give the Pod a Node.
COMING_PHASES: Final = frozenset({"Provisioning", "Launched", "Registered", "Ready"})

OUTCOME_WRITES = Counter(
    "bigfleet_operator_outcome_writes",
    "CapacityRequest condition patches, by outcome (written|gone|failed|deferred).",
    ["outcome"],
)
OUTCOME_CRS = Gauge(
    "bigfleet_operator_capacityrequests_outcome",
    "CapacityRequests by condition, status and reason at the last outcome pass of the leader "
    "(e.g. condition=MachineComing,status=False,reason=NothingCame).",
    ["condition", "status", "reason"],
)


@dataclass(frozen=True, slots=True)
class PodEvent:
    """One Pod Event to write: ``type`` Normal or Warning, CamelCase ``reason``."""

    type: str
    reason: str
    message: str


# -------------------------------------------------------------------------------- matching


def _req_holds(req: Requirement, labels: Mapping[str, str]) -> bool:
    """Node-affinity semantics (as the scheduler and the translation read them)."""
    has = req.key in labels
    if req.operator == OP_IN:
        return has and labels[req.key] in req.values
    if req.operator == OP_NOT_IN:
        return not has or labels[req.key] not in req.values
    if req.operator == OP_EXISTS:
        return has
    if req.operator == OP_DOES_NOT_EXIST:
        return not has
    return True  # Same (co-location): the domain is the shard's to pick, not a label test


def labels_satisfy(reqs: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    """True when a machine with ``labels`` meets every requirement (AND)."""
    return all(_req_holds(r, labels) for r in reqs)


def _quantities(raw: object) -> dict[str, Quantity] | None:
    if not isinstance(raw, Mapping):
        return None
    out: dict[str, Quantity] = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            return None
        try:
            out[str(k)] = Quantity.parse(v)
        except QuantityError:
            return None  # a machine we cannot read holds nothing we can promise
    return out


def _holds(have: Mapping[str, Quantity] | None, need: Mapping[str, Quantity]) -> bool:
    if have is None:
        return False
    zero = Quantity.parse("0")
    return all(have.get(k, zero) >= q for k, q in need.items())


def _offer_compatible(reqs: Sequence[Requirement], offer_reqs: object) -> bool:
    """Could a machine of the offered profile meet ``reqs``? An offer's ``In`` pins a key to
    its values; a key the offer does not pin may carry any label (the shard labels machines)."""
    pinned: dict[str, tuple[str, ...]] = {}
    for r in offer_reqs if isinstance(offer_reqs, list) else ():
        if isinstance(r, Mapping) and r.get("operator") == "In" and isinstance(r.get("key"), str):
            values = r.get("values")
            pinned[r["key"]] = tuple(v for v in values or () if isinstance(v, str))
    for req in reqs:
        if req.key not in pinned:
            continue
        if not any(_req_holds(req, {req.key: v}) for v in pinned[req.key]):
            return False
    return True


def offer_matches(c: Contribution, spec: Mapping[str, Any]) -> bool:
    """An AvailableCapacity ``spec`` offers a machine for ``c``: count > 0, its pinned labels
    compatible with the requirements, its resources holding the request."""
    count = spec.get("availableCount")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return False
    if not _offer_compatible(c.profile.requirements, spec.get("requirements")):
        return False
    return _holds(_quantities(spec.get("resources")), c.resources)


def upcoming_fits(c: Contribution, un: Mapping[str, Any]) -> bool:
    """``un`` is on its way (or Ready), its labels meet ``c``'s requirements, its resources
    hold ``c``'s request."""
    status = un.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if phase not in COMING_PHASES:
        return False
    spec = un.get("spec")
    if not isinstance(spec, Mapping):
        return False
    labels = spec.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    if not labels_satisfy(c.profile.requirements, labels):
        return False
    return _holds(_quantities(spec.get("resources")), c.resources)


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def describe_upcoming(un: Mapping[str, Any]) -> str:
    """``UpcomingNode NAME (INSTANCE-TYPE in ZONE, PHASE)``."""
    md, spec, status = _obj(un.get("metadata")), _obj(un.get("spec")), _obj(un.get("status"))
    labels = _obj(spec.get("labels"))
    return (f"UpcomingNode {md.get('name', '?')} "
            f"({labels.get('node.kubernetes.io/instance-type', '?')} in "
            f"{labels.get('topology.kubernetes.io/zone', '?')}, {status.get('phase', '?')})")


def describe_offer(spec: Mapping[str, Any]) -> str:
    """``N machine(s) [requirements] availability A, COST USD/h`` of an AvailableCapacity."""
    kinds = [f"{r.get('key')}={','.join(r.get('values') or ())}"
             for r in spec.get("requirements") or () if isinstance(r, Mapping)]
    cost = f", {spec['cost']} USD/h" if spec.get("cost") else ""
    return (f"{spec.get('availableCount')} machine(s) [{'; '.join(kinds) or 'any'}] "
            f"availability {spec.get('availability', '?')}{cost}")


# -------------------------------------------------------------------------------- planning


def _existing(cr: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = cr.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    out: dict[str, Mapping[str, Any]] = {}
    for c in conds if isinstance(conds, (list, tuple)) else ():
        if isinstance(c, Mapping) and isinstance(c.get("type"), str):
            out[c["type"]] = c
    return out


def _phase(cr: Mapping[str, Any]) -> str:
    status = cr.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase if isinstance(phase, str) else ""


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def plan_conditions(
    cr: Mapping[str, Any],
    *,
    offers: Sequence[Mapping[str, Any]] | None,
    upcoming: Sequence[Mapping[str, Any]],
    now: datetime,
    wait: float = DEFAULT_WAIT,
    contribution: Contribution | CapacityRequestError | None = None,
) -> list[dict[str, Any]] | None:
    """The desired ``status.conditions`` of one CR, or None when it has none yet.

    Args:
        cr: the CR (full or :func:`~.crview.slim` view: ``status.conditions`` as cached).
        offers: AvailableCapacity specs the shard sent this run (None: none known yet).
        upcoming: UpcomingNode objects (any phase; only coming phases count).
        now: wall clock (aware).
        wait: seconds after Sent's transition before ``NothingCame``.
        contribution: :func:`contribution_from_cr` of ``cr`` if already computed (or its
            error); computed here otherwise.

    Returns:
        The three conditions (Sent, CapacityOffered, MachineComing) for a CR that is
        Acknowledged or excluded; only Sent for an excluded one; None for a Pending CR the
        roll-up can carry (it is about to be acknowledged: no write for it yet).
        ``lastTransitionTime`` is kept from the CR where the status did not change.
    """
    if contribution is None:
        try:
            contribution = contribution_from_cr(cr)
        except CapacityRequestError as exc:
            contribution = exc
    old = _existing(cr)
    stamp = format_acknowledged_at(now)

    def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        prev = old.get(kind)
        keep = prev is not None and prev.get("status") == status and prev.get(
            "lastTransitionTime")
        return {"type": kind, "status": status, "reason": reason, "message": message[:1024],
                "lastTransitionTime": prev["lastTransitionTime"] if keep and prev else stamp}

    if isinstance(contribution, CapacityRequestError):
        return [cond(COND_SENT, "False", R_EXCLUDED,
                     f"not in the roll-up: {contribution.field}: {contribution.message}")]
    if _phase(cr) != "Acknowledged":
        return None
    c = contribution
    # Acknowledged means queued, never received: docs/rules.md#acknowledgement
    sent = cond(COND_SENT, "True", R_IN_ROLLUP,
                "in a roll-up queued on the shard session (the shard's receipt is not awaited; "
                "every roll-up carries the request while it exists)"
                + (f"; co-location group {c.group}" if c.group else ""))
    if offers is None:
        offered = cond(COND_CAPACITY_OFFERED, "Unknown", R_NO_HINTS,
                       "the shard has sent no AvailableCapacity since the operator started")
    else:
        hit = next((o for o in offers if offer_matches(c, o)), None)
        offered = (cond(COND_CAPACITY_OFFERED, "True", R_OFFERED, describe_offer(hit))
                   if hit is not None else
                   cond(COND_CAPACITY_OFFERED, "False", R_NO_OFFER,
                        f"none of {len(offers)} AvailableCapacity profile(s) offers a machine "
                        f"that meets the requirements and holds {_fmt(c.resources)}"))
    un = next((u for u in upcoming if upcoming_fits(c, u)), None)
    if un is not None:
        coming = cond(COND_MACHINE_COMING, "True", R_MACHINE, describe_upcoming(un))
    else:
        since = _parse_time(sent["lastTransitionTime"]) or now
        late = now - since >= timedelta(seconds=wait)
        coming = cond(
            COND_MACHINE_COMING, "False", R_NOTHING_CAME if late else R_NONE_YET,
            f"no UpcomingNode meets the requirements and holds {_fmt(c.resources)}"
            + (f" after {int(wait)} s" if late else ""))
    return [sent, offered, coming]


def _fmt(resources: Mapping[str, Quantity]) -> str:
    return ", ".join(f"{k}={v}" for k, v in resources.items()) or "no resources"


def _sig(conds: Iterable[Mapping[str, Any]]) -> tuple[tuple[Any, Any, Any], ...]:
    return tuple(sorted((c.get("type"), c.get("status"), c.get("reason")) for c in conds))


def conditions_patch(
    cr: Mapping[str, Any], desired: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any] | None:
    """The status merge-patch that writes ``desired``, or None when the CR's conditions
    already have the same (type, status, reason) each: a message that alone changed (another
    machine, another count) is not worth a write. A list in a merge patch is replaced whole."""
    if desired is None:
        return None
    if _sig(_existing(cr).values()) == _sig(desired):
        return None
    return {"status": {"conditions": [dict(c) for c in desired]}}


def transition_events(
    cr: Mapping[str, Any], desired: Sequence[Mapping[str, Any]]
) -> list[PodEvent]:
    """Pod Events for the conditions whose (status, reason) changed, in the order they happen
    (sent, then offered, then coming). Only what the Pod's owner acts on: a Normal Event when
    the demand is sent and when a machine comes; a Warning when excluded, when nothing is
    offered, when nothing came in time."""
    old = _existing(cr)
    out: list[PodEvent] = []
    for c in desired:
        prev = old.get(c["type"])
        if prev is not None and (prev.get("status"), prev.get("reason")) == (c["status"],
                                                                              c["reason"]):
            continue
        kind, reason, msg = c["type"], c["reason"], c["message"]
        if kind == COND_SENT:
            out.append(PodEvent("Normal", EV_SENT, f"demand queued for the fleet: {msg}")
                       if reason == R_IN_ROLLUP else PodEvent("Warning", EV_EXCLUDED, msg))
        elif kind == COND_CAPACITY_OFFERED and reason == R_NO_OFFER:
            out.append(PodEvent("Warning", EV_NO_OFFER, msg))
        elif kind == COND_MACHINE_COMING and reason == R_MACHINE:
            out.append(PodEvent("Normal", EV_COMING, f"a machine that fits is coming: {msg}"))
        elif kind == COND_MACHINE_COMING and reason == R_NOTHING_CAME:
            out.append(PodEvent("Warning", EV_NOTHING_CAME, msg))
    return out


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def pod_of(cr: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``involvedObject`` of the CR's Pod, or None when the CR names none.

    From a full CR: its Pod ownerReference. From the slim view: ``metadata.podName``, and the
    uid from the CR's name, which the pod controller makes ``cr-<pod uid>`` for every uid the
    apiserver assigns (docs/crds.md#capacityrequest); a name of another form gives a reference
    without uid (``kubectl describe`` then does not list the Event, ``kubectl get events``
    does).
    """
    md = cr.get("metadata")
    if not isinstance(md, Mapping):
        return None
    name: object = md.get(POD_NAME_KEY)
    uid: object = None
    refs = md.get("ownerReferences")
    for ref in refs if isinstance(refs, (list, tuple)) else ():
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod":
            name, uid = ref.get("name"), ref.get("uid")
            break
    if not isinstance(name, str) or not name:
        return None
    if uid is None:
        cr_name = md.get("name")
        if isinstance(cr_name, str) and cr_name.startswith("cr-") and _UUID.match(cr_name[3:]):
            uid = cr_name[3:]
    meta: dict[str, Any] = {"name": name, "namespace": md.get("namespace")}
    if isinstance(uid, str) and uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


# -------------------------------------------------------------------------------- applying


class OutcomeWriter:
    """Level-triggered outcome pass over the CR cache every ``period`` seconds.

    Each pass plans every cached CR (once per distinct spec: the slim view shares equal specs),
    patches the ``status`` subresource of at most ``budget`` CRs whose conditions changed (the
    rest wait for the next pass: counted ``deferred``) and records one Pod Event per
    transition. A failed patch is logged and retried next pass (the cache still shows the old
    conditions); a CR gone is skipped. Never raises out of a pass.

    Args:
        client: a KubeClient (its ``patch``).
        crs: the CR cache's ``list`` (slim views with ``status.conditions``, ownerReferences).
        upcoming: the UpcomingNode cache's ``list``.
        offers: the AvailableCapacity specs known (None until the shard sent any).
        events: the operator's EventRecorder (Pod Events), or None for none.
        period / budget / wait: docs/rules.md#outcomes-conditions-and-pod-events.
        now: wall clock (aware datetime).
    """

    def __init__(
        self,
        client: KubeAPI,
        *,
        crs: Callable[[], Sequence[Mapping[str, Any]]],
        upcoming: Callable[[], Sequence[Mapping[str, Any]]],
        offers: Callable[[], Sequence[Mapping[str, Any]] | None],
        events: EventRecorder | None,
        period: float = DEFAULT_PERIOD,
        budget: int = DEFAULT_BUDGET,
        wait: float = DEFAULT_WAIT,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if period <= 0 or budget < 1 or wait < 0:
            raise ValueError(f"outcome period/budget/wait out of range: {period}/{budget}/{wait}")
        self._client = client
        self._crs, self._upcoming, self._offers = crs, upcoming, offers
        self._events = events
        self.period, self.budget, self.wait = period, budget, wait
        self._now = now
        self.written_total = 0
        self._gauged: set[tuple[str, str, str]] = set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pass, sleep ``period``, repeat until cancelled; then zero the gauge (a standby or a
        stopped operator reports no outcome, so alerts read the leader's)."""
        task_status.started()
        try:
            while True:
                await trio.sleep(self.period)
                await self.run_once()
        finally:
            self._report({})

    def _report(self, counts: Mapping[tuple[str, str, str], int]) -> None:
        for key in self._gauged - set(counts):
            OUTCOME_CRS.labels(*key).set(0)
        for key, n in counts.items():
            OUTCOME_CRS.labels(*key).set(n)
        self._gauged |= set(counts)

    def plan(self) -> list[tuple[Mapping[str, Any], list[dict[str, Any]], dict[str, Any]]]:
        """(cr, desired conditions, patch) for every cached CR whose conditions change (pure
        over the caches; also refreshes the ``bigfleet_operator_capacityrequests_outcome``
        gauge)."""
        now, offers = self._now(), self._offers()
        upcoming = [u for u in self._upcoming()
                    if isinstance(u.get("status"), Mapping)
                    and u["status"].get("phase") in COMING_PHASES]
        contributions: dict[int, Contribution | CapacityRequestError] = {}
        counts: dict[tuple[str, str, str], int] = {}
        out = []
        for cr in self._crs():
            spec = cr.get("spec")
            c = contributions.get(id(spec))
            if c is None:
                try:
                    c = contribution_from_cr(cr)
                except CapacityRequestError as exc:
                    c = exc
                if isinstance(spec, Mapping):  # shared spec objects: plan each once
                    contributions[id(spec)] = c
            desired = plan_conditions(cr, offers=offers, upcoming=upcoming, now=now,
                                      wait=self.wait, contribution=c)
            for d in desired or ():
                key = (d["type"], d["status"], d["reason"])
                counts[key] = counts.get(key, 0) + 1
            patch = conditions_patch(cr, desired)
            if patch is not None and desired is not None:
                out.append((cr, desired, patch))
        self._report(counts)
        return out

    async def run_once(self) -> int:
        """One pass; returns the patches written."""
        todo = self.plan()
        written = 0
        if len(todo) > self.budget:
            OUTCOME_WRITES.labels("deferred").inc(len(todo) - self.budget)
        for cr, desired, patch in todo[: self.budget]:
            md = cr.get("metadata") or {}
            ns, name = md.get("namespace"), md.get("name")
            if not isinstance(ns, str) or not isinstance(name, str):
                continue
            try:
                await self._client.patch(CAPACITY_REQUESTS, name, patch, ns,
                                         patch_type="merge", subresource="status")
            except NotFound:
                OUTCOME_WRITES.labels("gone").inc()
                continue
            except KubeError as exc:
                OUTCOME_WRITES.labels("failed").inc()
                log.warning("outcomes: condition patch failed, retry next pass "
                            "namespace=%s name=%s error=%s", ns, name, exc)
                continue
            OUTCOME_WRITES.labels("written").inc()
            written += 1
            self.written_total += 1
            pod = pod_of(cr)
            if self._events is not None and pod is not None:
                for ev in transition_events(cr, desired):
                    self._events.record(pod, reason=ev.reason, message=ev.message, type=ev.type)
        if written:
            log.info("outcomes: conditions written", extra={"crs": written,
                                                            "deferred": len(todo) - written})
        return written

