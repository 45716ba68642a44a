"""Reclaim planning: the pure rules of cordon-then-drain (docs/rules.md#reclaim-drain).

Which Pods a drain evicts (:func:`skip_reason`), with which grace
(:func:`eviction_grace_seconds`), what a failed eviction means (:func:`classify_eviction_error`),
the drain deadline (:func:`effective_grace`) and the ``lastError`` of a drain that ran out of
time (:func:`drain_failure_message`). No I/O: :mod:`.drain` and :mod:`.handler` apply them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal

from bigfleet_trio.kube.errors import ApiError, KubeTransportError

__all__ = [
    "BudgetRefusal",
    "budget_refusal",
    "protected_wait",
    "refusal_text",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "FAST_POLL_SECONDS",
    "FINAL_CHECK_TIMEOUT",
    "RETRY_INTERVAL_SECONDS",
    "STATUS_WRITE_TIMEOUT",
    "DrainOutcome",
    "DrainResult",
    "EvictionOutcome",
    "classify_eviction_error",
    "drain_failure_message",
    "effective_grace",
    "error_text",
    "eviction_grace_seconds",
    "eviction_result_label",
    "pod_key",
    "skip_reason",
]

DEFAULT_GRACE_SECONDS: Final = 30.0
"""Drain deadline when the instruction's grace_period_seconds is 0 or negative."""
RETRY_INTERVAL_SECONDS: Final = 2.0
"""Nominal pause between eviction rounds (jittered by +-25 %)."""
FAST_POLL_SECONDS: Final = 0.25
"""First re-check after an admitted eviction while only Terminating Pods remain (doubles up to
the retry interval)."""
FINAL_CHECK_TIMEOUT: Final = 5.0
"""Upper bound on the last Pod listing made at the drain deadline before declaring Failed."""
DEFAULT_SHUTDOWN_TIMEOUT: Final = 20.0
"""How long running drains may continue after the operator is asked to stop."""
STATUS_WRITE_TIMEOUT: Final = 10.0
"""Upper bound on the final Drained/Failed write of a drain (it runs after its deadline)."""
MAX_LAST_ERROR: Final = 2000
"""Longest ``lastError`` written (longer messages are cut with ``...``)."""
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
"""Marks a static Pod's mirror: the kubelet owns it, an eviction cannot remove it."""
DEFAULT_POD_GRACE: Final = 30
"""A Pod's terminationGracePeriodSeconds when its spec leaves it unset (the Kubernetes default)."""


class EvictionOutcome(Enum):
    """What an eviction answer means for the drain."""

    GONE = "gone"
    RETRY = "retry"
    STOP = "stop"


_EVICTION_RESULT: Final[Mapping[EvictionOutcome, str]] = {
    EvictionOutcome.GONE: "gone",
    EvictionOutcome.RETRY: "blocked",
    EvictionOutcome.STOP: "refused",
}
"""``result`` label of ``bigfleet_operator_evictions_total`` for a failed eviction."""


def classify_eviction_error(exc: BaseException) -> EvictionOutcome:
    """Classify a failed eviction by HTTP status, never by ``Status.reason``.

    404 -> GONE; 429, 409, 5xx, transport errors -> RETRY; 403 and other 4xx (and anything
    unexpected) -> STOP. By status because the reason varies by who refused: a
    PodDisruptionBudget answers 429 TooManyRequests, a disruption webhook (such as Podseidon's)
    may answer 429 with reason Forbidden, or 409 while its admission buffer is full; all of those
    clear up with time. A 403 or other 4xx will not, so that Pod is not evicted again (it still
    blocks completion). The reference retried every error but a timeout, 403 and 404 included
    (docs/reference.md#drain-deadline-shared-and-detached).
    """
    if isinstance(exc, ApiError):
        if exc.status == 404:
            return EvictionOutcome.GONE
        if exc.status in (429, 409) or exc.status >= 500:
            return EvictionOutcome.RETRY
        return EvictionOutcome.STOP
    if isinstance(exc, KubeTransportError):
        return EvictionOutcome.RETRY
    return EvictionOutcome.STOP


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a Pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def skip_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a Pod is not evicted: "daemonset", "mirror", "terminal", or None (evict it).

    DaemonSet Pods would be recreated on the cordoned node at once, mirror Pods belong to the
    kubelet, and Succeeded/Failed Pods hold nothing: none of them may block a drain.
    """
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("kind") == "DaemonSet":
            return "daemonset"
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "terminal"
    return None


def protected_wait(pod: Mapping[str, Any], remaining: float, interval: float) -> bool:
    """A Pod whose disruption annotations protect it waits while the drain has more time left
    than the Pod's own grace plus two rounds: it is evicted last, at the deadline, with just
    the time to stop cleanly (docs/rules.md#disruption-annotations).

    Args:
        pod: the Pod (its ``spec.terminationGracePeriodSeconds``; 30 s if unset).
        remaining: seconds left before the drain's deadline.
        interval: seconds between eviction rounds.
    """
    own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    own_s = int(own) if isinstance(own, int) and own >= 0 else DEFAULT_POD_GRACE
    return remaining > own_s + 2 * interval


def effective_grace(grace_period_seconds: int) -> float:
    """Instruction grace -> drain deadline in seconds (<= 0 -> 30 s)."""
    return float(grace_period_seconds) if grace_period_seconds > 0 else DEFAULT_GRACE_SECONDS


def eviction_grace_seconds(pod: Mapping[str, Any], remaining: float) -> int:
    """``deleteOptions.gracePeriodSeconds`` for an eviction: the Pod's own grace (30 s if unset)
    bounded by the whole seconds left before the drain deadline, and at least 1 (0 would mean
    "delete now")."""
    own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    own_s = int(own) if isinstance(own, int) and own >= 0 else DEFAULT_POD_GRACE
    return max(1, min(own_s, math.floor(remaining)))


def drain_failure_message(node: str, grace: float, pods_left: Mapping[str, str]) -> str:
    """``lastError`` of a drain that hit its deadline; names every Pod left and why."""
    parts = [f"{key} ({why})" for key, why in sorted(pods_left.items())]
    msg = f"drain of node {node} did not finish within {grace:g}s; pods left: " + (
        ", ".join(parts) if parts else "none listed"
    )
    if len(msg) > MAX_LAST_ERROR:
        msg = msg[: MAX_LAST_ERROR - 3] + "..."
    return msg


def eviction_result_label(outcome: EvictionOutcome) -> str:
    """``result`` label of ``bigfleet_operator_evictions_total`` for a failed eviction."""
    return _EVICTION_RESULT[outcome]


def error_text(exc: BaseException) -> str:
    """Short text of a failed call for ``lastError`` and log lines (``"429: message"``)."""
    if isinstance(exc, ApiError):
        return f"{exc.status}: {exc.message or exc.reason}"
    return f"{type(exc).__name__}: {exc}"


_BUDGET_CAUSE: Final = re.compile(r"The disruption budget (\S+) ")
"""How every kube-apiserver ``DisruptionBudget`` cause message begins (``The disruption budget
NAME needs 2 healthy pods and has 2 currently``, ``... is still being processed by the server.``,
``... does not allow evicting pods currently``)."""


@dataclass(frozen=True)
class BudgetRefusal:
    """The PodDisruptionBudget an eviction was refused for.

    Attributes:
        name: the budget's name (it lives in the Pod's namespace).
        cause: the apiserver's ``DisruptionBudget`` cause message ("" when it sent none).
    """

    name: str
    cause: str


def budget_refusal(exc: BaseException) -> BudgetRefusal | None:
    """The PodDisruptionBudget named by kube-apiserver's refusal of an eviction, or None.

    kube-apiserver answers a budget with no room 429 (``disruptionsAllowed`` 0, or a status
    that lags the spec) and a budget with ``disruptionsAllowed`` below 0 403; both carry a
    ``details.causes[]`` entry of reason ``DisruptionBudget`` whose message begins ``The
    disruption budget NAME ``, and the 403 names it in ``details`` (``kind``
    ``poddisruptionbudget``). Anything else (throttling, a disruption webhook, two budgets'
    500, RBAC) names no budget: None. Karpenter's ``DisruptionBlocked`` names the budget
    the same way (docs/rules.md#disruption-annotations).
    """
    if not isinstance(exc, ApiError) or not isinstance(exc.body, Mapping):
        return None
    details = exc.body.get("details")
    if not isinstance(details, Mapping):
        return None
    causes = details.get("causes")
    for cause in causes if isinstance(causes, list) else ():
        if not isinstance(cause, Mapping) or cause.get("reason") != "DisruptionBudget":
            continue
        message = str(cause.get("message") or "")
        found = _BUDGET_CAUSE.match(message)
        if found is not None:
            return BudgetRefusal(found.group(1), message)
    name = details.get("name")
    if details.get("kind") == "poddisruptionbudget" and isinstance(name, str) and name:
        return BudgetRefusal(name, "")
    return None


def refusal_text(exc: BaseException, namespace: str) -> str:
    """:func:`error_text` of a refused eviction, led by the budget when it names one:
    ``"PodDisruptionBudget prod/web: The disruption budget web needs ... (429: Cannot evict
    pod ...)"`` (the Event's and ``lastError``'s text)."""
    text = error_text(exc)
    refusal = budget_refusal(exc)
    if refusal is None:
        return text
    lead = f"PodDisruptionBudget {namespace}/{refusal.name}"
    return f"{lead}: {refusal.cause} ({text})" if refusal.cause else f"{lead} ({text})"


DrainOutcome = Literal["drained", "failed", "abandoned"]


@dataclass
class DrainResult:
    """How one node's drain ended.

    Attributes:
        node: Node name.
        outcome: "drained", "failed" (deadline) or "abandoned" (operator shut down).
        pods_left: ``namespace/name`` -> why it is still there (empty when drained).
        message: the ``lastError`` written for a failed drain.
    """

    node: str
    outcome: DrainOutcome
    pods_left: dict[str, str] = field(default_factory=dict)
    message: str = ""
