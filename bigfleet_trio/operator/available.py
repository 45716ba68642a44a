"""AvailableCapacityUpdate -> AvailableCapacity: the session's ``on_available_capacity`` handler.

One cluster-scoped object per ``supersedes_key`` (docs/rules.md#availablecapacity): the pure
mapping (:func:`spec_from_update`, :func:`available_capacity_name`) and a thin upsert
(:class:`AvailableCapacityHandler`). Differences from the Go reference (cost written, core
operators only, upsert retried): docs/deviations.md#4-availablecapacity-operatoravailablepy.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from bigfleet_trio.kube.api import KubeAPI
from bigfleet_trio.kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from bigfleet_trio.kube.mergepatch import merge_diff
from bigfleet_trio.kube.resources import AVAILABLE_CAPACITIES
from bigfleet_trio.kube.retry import RECONCILE_RETRIABLE, Replan, conflict_retrying
from bigfleet_trio.observability import metrics
from bigfleet_trio.operator.kubeevents import REASON_WRITE_REFUSED, EventRecorder, object_ref
from bigfleet_trio.proto import pb
from bigfleet_trio.quantity import Quantity, QuantityError

__all__ = [
    "AC_PREFIX",
    "SUPERSEDES_KEY_ANNOTATION",
    "AVAILABILITY_BY_CONFIDENCE",
    "AvailableCapacityHandler",
    "available_capacity_name",
    "availability_for_confidence",
    "cost_quantity",
    "requirements_to_spec",
    "spec_from_update",
]

log = logging.getLogger(__name__)

AC_PREFIX: Final = "ac-"
SUPERSEDES_KEY_ANNOTATION: Final = "bigfleet.lucy.sh/supersedes-key"

Conf = pb.AvailableCapacityUpdateConfidence
AVAILABILITY_BY_CONFIDENCE: Final[Mapping[int, str]] = {
    Conf.CONFIDENCE_UNSPECIFIED: "None",
    Conf.CONFIDENCE_NONE: "None",
    Conf.CONFIDENCE_LOW: "Low",
    Conf.CONFIDENCE_MEDIUM: "Medium",
    Conf.CONFIDENCE_HIGH: "High",
}

_STANDARD_OPERATORS: Final[Mapping[int, str]] = {
    pb.NodeSelectorRequirementOperator.OPERATOR_IN: "In",
    pb.NodeSelectorRequirementOperator.OPERATOR_NOT_IN: "NotIn",
    pb.NodeSelectorRequirementOperator.OPERATOR_EXISTS: "Exists",
    pb.NodeSelectorRequirementOperator.OPERATOR_DOES_NOT_EXIST: "DoesNotExist",
}


def available_capacity_name(supersedes_key: str) -> str:
    """``"ac-"`` + first 32 lowercase hex chars of sha256(supersedes_key, UTF-8) (35 chars)."""
    return AC_PREFIX + hashlib.sha256(supersedes_key.encode("utf-8")).hexdigest()[:32]


def availability_for_confidence(confidence: int) -> str:
    """Confidence enum value -> ``availability`` ("None" for NONE, UNSPECIFIED and unknown)."""
    return AVAILABILITY_BY_CONFIDENCE.get(int(confidence), "None")


def cost_quantity(cost_per_hour: float) -> str:
    """USD/hour double -> canonical Kubernetes quantity string.

    The shortest decimal that round-trips the double (Python ``repr``), rounded up to nano like
    Go's parser, in Go's canonical DecimalSI form. NaN, infinities and negative values are not
    prices: ``"0"`` with a log line (the Go reference never wrote cost at all).

    Examples: 0.0416 -> "41600u", 0.5 -> "500m", 3.0 -> "3", 1e-12 -> "1n", NaN -> "0".
    """
    if math.isnan(cost_per_hour) or math.isinf(cost_per_hour) or cost_per_hour < 0:
        log.warning("available: cost_per_hour=%r is not a price, writing 0", cost_per_hour)
        return "0"
    text = format(Decimal(repr(float(cost_per_hour))), "f")
    return str(Quantity.parse(text))


def _is_price(cost_per_hour: float) -> bool:
    """A positive, finite USD/hour (0 is "not sent" on the wire)."""
    if math.isnan(cost_per_hour) or math.isinf(cost_per_hour) or cost_per_hour < 0:
        log.warning("available: cost_per_hour=%r is not a price, leaving cost unset",
                    cost_per_hour)
        return False
    return cost_per_hour > 0


def requirements_to_spec(
    reqs: list[pb.NodeSelectorRequirement], where: str = ""
) -> list[dict[str, Any]]:
    """Wire requirements -> core-style ``[{key, operator, values?}]`` (standard operators only).

    Same and unspecified mean nothing in a core-style requirement (our CRD's enum has In, NotIn,
    Exists, DoesNotExist): dropped with a log line. ``values`` is omitted when empty.
    """
    out: list[dict[str, Any]] = []
    for r in reqs:
        op = _STANDARD_OPERATORS.get(int(r.operator))
        if op is None:
            log.info(
                "available: requirement dropped (operator not expressible) %s key=%s operator=%s",
                where,
                r.key,
                int(r.operator),
            )
            continue
        item: dict[str, Any] = {"key": r.key, "operator": op}
        if r.values:
            item["values"] = list(r.values)
        out.append(item)
    return out


def spec_from_update(u: pb.AvailableCapacityUpdate) -> dict[str, Any]:
    """Desired ``spec`` of the AvailableCapacity for ``u`` (pure).

    ``availability`` from the confidence (NONE, UNSPECIFIED, unknown -> "None"), canonical
    resources (malformed ones skipped with a log line), :func:`cost_quantity`,
    :func:`requirements_to_spec`.

    Returns:
        ``{"availability", "availableCount", "cost"?, "resources", "requirements"?}``;
        ``cost`` is omitted when the shard sent no price (0), ``requirements`` when none
        survive.
    """
    where = f"supersedes_key={u.supersedes_key!r}"
    resources: dict[str, str] = {}
    raw = u.resources.resources if u.resources is not None else {}
    for key, value in sorted(raw.items()):
        try:
            resources[key] = str(Quantity.parse(value))
        except QuantityError as exc:
            log.warning(
                "available: malformed quantity skipped %s resource=%s error=%s", where, key, exc
            )
    spec: dict[str, Any] = {
        "availability": availability_for_confidence(u.confidence),
        "availableCount": int(u.available_count),
        "resources": resources,
    }
    # proto3 cannot tell "no price" from 0: a zero (or a value that is not a price) means the
    # shard sent none, and an unknown price is left unset rather than shown as free
    # (docs/crds.md#availablecapacity).
    if _is_price(u.cost_per_hour):
        spec["cost"] = cost_quantity(u.cost_per_hour)
    reqs = requirements_to_spec(list(u.requirements), where)
    if reqs:
        spec["requirements"] = reqs
    return spec


def _spec_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    owned = ("availability", "availableCount", "cost", "resources", "requirements")
    old = {k: existing[k] for k in owned if k in existing}
    diff = merge_diff(old, desired)
    if "cost" in diff and "cost" in old and "cost" in desired:
        try:
            if Quantity.parse(old["cost"]) == Quantity.parse(desired["cost"]):
                del diff["cost"]
        except QuantityError:
            pass
    return diff


class AvailableCapacityHandler:
    """Upserts AvailableCapacity objects (the session's ``on_available_capacity``).

    Get; NotFound -> Create (AlreadyExists -> Get again and patch); found -> a JSON merge-patch of
    the changed spec fields only (removed resource keys become null; requirements are replaced
    wholesale), skipped when nothing changed. After a write of ours the next update of that
    object skips the Get: it diffs against what the write returned and patches with that
    resourceVersion as a precondition (a Conflict or NotFound, someone else wrote or deleted it
    since, goes on from a fresh Get in the same attempt). An update equal to our last write
    still reads, so a deleted object is created again. Conflict, 429, 5xx and transport errors
    are retried.

    Args:
        client: a KubeClient.
        attempts: tries per update for transient errors.
        events: where a permanent refusal is recorded (a ``WriteRefused`` Warning Event on the
            object), besides the log line and the counter.
    """

    def __init__(self, client: KubeAPI, *, attempts: int = 8,
                 events: EventRecorder | None = None) -> None:
        self._client = client
        self._events = events
        self._attempts = attempts
        # name -> (resourceVersion, spec) our last write of it returned: one entry per
        # AvailableCapacity this process wrote (the operator never deletes them, so no more
        # than the cluster holds; docs/rules.md#availablecapacity)
        self._written: dict[str, tuple[str, Mapping[str, Any]]] = {}
        # name -> the latest spec the shard sent this run (the outcome pass reads it)
        self._offers: dict[str, Mapping[str, Any]] = {}

    def offers(self) -> list[Mapping[str, Any]] | None:
        """The AvailableCapacity specs the shard sent since this handler was built, latest per
        object; None before the first (docs/rules.md#outcomes-conditions-and-pod-events)."""
        return list(self._offers.values()) if self._offers else None

    def _remember(self, name: str, obj: Mapping[str, Any]) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        spec = obj.get("spec")
        if isinstance(rv, str) and rv and isinstance(spec, Mapping):
            self._written[name] = (rv, spec)
        else:
            self._written.pop(name, None)

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        """Upsert for one update.

        Raises:
            Exception: one of :data:`~bigfleet_trio.kube.retry.RECONCILE_RETRIABLE` when the
                write did not land (the session retries it); a permanent refusal is logged
                and counted instead.
        """
        if not u.supersedes_key:
            log.info("available: update without supersedes_key ignored")
            return
        name = available_capacity_name(u.supersedes_key)
        spec = spec_from_update(u)
        self._offers[name] = spec  # what the shard says now, written or not (outcomes)
        try:
            # Re-plans only: a transient failure goes back to the session, which retries the
            # key with backoff while this is its latest update
            # (docs/rules.md#level-triggered-operator).
            async for attempt in conflict_retrying(self._attempts):
                with attempt:
                    await self._upsert_once(name, u.supersedes_key, spec)
        except (KubeError, Replan) as exc:
            if isinstance(exc, RECONCILE_RETRIABLE):
                raise
            metrics.RECONCILE_PERMANENT_ERRORS.labels("available_capacity").inc()
            if self._events is not None:
                self._events.record(
                    object_ref(AVAILABLE_CAPACITIES.api_version, AVAILABLE_CAPACITIES.kind, name),
                    reason=REASON_WRITE_REFUSED, type="Warning",
                    message=f"the apiserver refused the shard's update for {u.supersedes_key!r}: "
                            f"{exc}; waiting for the next update")
            log.error(
                "available: write refused, waiting for the next update name=%s "
                "supersedes_key=%r error=%s",
                name,
                u.supersedes_key,
                exc,
            )

    async def _upsert_once(self, name: str, key: str, spec: dict[str, Any]) -> None:
        known = self._written.get(name)
        if known is not None and (diff := _spec_patch(known[1], spec)):
            # Why no Get: each update held a dispatch slot for a read and a write, and
            # NodeStateUpdates wait for those slots; the precondition keeps a foreign edit from
            # being overwritten blind (docs/rules.md#availablecapacity).
            patch = {"metadata": {"resourceVersion": known[0]}, "spec": diff}
            try:
                written = await self._client.patch(AVAILABLE_CAPACITIES, name, patch)
            except (Conflict, NotFound):
                # someone else wrote or deleted it since: read it now, in this attempt (a Replan
                # would sleep out a backoff holding the slot)
                self._written.pop(name, None)
            else:
                self._remember(name, written)
                log.info("available: patched name=%s fields=%s", name, sorted(diff))
                return
        try:
            existing = await self._client.get(AVAILABLE_CAPACITIES, name)
        except NotFound:
            existing = None
        if existing is None:
            body = {
                "apiVersion": AVAILABLE_CAPACITIES.api_version,
                "kind": AVAILABLE_CAPACITIES.kind,
                "metadata": {"name": name, "annotations": {SUPERSEDES_KEY_ANNOTATION: key}},
                "spec": spec,
            }
            try:
                created = await self._client.create(AVAILABLE_CAPACITIES, body)
            except AlreadyExists:
                log.info("available: created concurrently, patching name=%s", name)
                existing = await self._client.get(AVAILABLE_CAPACITIES, name)
            else:
                self._remember(name, created)
                log.info(
                    "available: created name=%s availability=%s count=%s cost=%s",
                    name,
                    spec["availability"],
                    spec["availableCount"],
                    spec.get("cost", "unknown"),  # unset when the shard sent no price
                )
                return
        old_spec = existing.get("spec") if isinstance(existing.get("spec"), Mapping) else {}
        diff = _spec_patch(old_spec or {}, spec)
        if not diff:
            self._remember(name, existing)
            log.debug("available: no-op name=%s", name)
            return
        try:
            written = await self._client.patch(AVAILABLE_CAPACITIES, name, {"spec": diff})
        except NotFound as exc:
            self._written.pop(name, None)
            raise Replan(f"AvailableCapacity {name} deleted concurrently") from exc
        self._remember(name, written)
        log.info("available: patched name=%s fields=%s", name, sorted(diff))
