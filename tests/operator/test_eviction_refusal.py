"""A refused eviction names the PodDisruptionBudget behind it: the pure reading of
kube-apiserver's refusals (the bodies as ``pkg/registry/core/pod/storage/eviction.go`` v1.37
shapes them) and the EvictionBlocked Event and ``lastError`` that carry the name
(docs/rules.md#disruption-annotations)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from bigfleet_trio.kube.errors import ApiError, KubeTransportError, error_from_status
from bigfleet_trio.kube.resources import UPCOMING_NODES
from bigfleet_trio.operator.reclaim.plan import BudgetRefusal, budget_refusal, refusal_text
from tests.operator.test_reclaim import instr
from tests.operator.test_reclaim_events import cluster, events, pdb_blocks, pod, reclaim, rig

REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
NEEDS = "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
LAGS = "The disruption budget web-pdb is still being processed by the server."
NEGATIVE = ("The disruption budget web-pdb does not allow evicting pods currently: pdb "
            "disruptions allowed is negative")


def status(code: int, reason: str, message: str, details: dict[str, Any] | None) -> ApiError:
    """The error the client raises for this ``Status`` body on the wire."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message, "reason": reason,
                            "code": code}
    if details is not None:
        body["details"] = details
    return error_from_status(code, json.dumps(body).encode())


def budget_cause(message: str) -> dict[str, Any]:
    return {"reason": "DisruptionBudget", "message": message}


@pytest.mark.parametrize(("exc", "expected"), [
    # disruptionsAllowed == 0 (retryAfterSeconds 0 is omitted on the wire)
    (status(429, "TooManyRequests", REFUSED, {"causes": [budget_cause(NEEDS)]}),
     BudgetRefusal("web-pdb", NEEDS)),
    # the budget's status lags its spec
    (status(429, "TooManyRequests", REFUSED,
            {"retryAfterSeconds": 10, "causes": [budget_cause(LAGS)]}),
     BudgetRefusal("web-pdb", LAGS)),
    # the other wordings of disruptionsAllowed == 0
    (status(429, "TooManyRequests", REFUSED, {"causes": [budget_cause(
        "The disruption budget web-pdb does not allow evicting pods currently")]}),
     BudgetRefusal("web-pdb", "The disruption budget web-pdb does not allow evicting pods "
                   "currently")),
    # disruptionsAllowed < 0: 403 whose details name the budget, and a cause
    (status(403, "Forbidden",
            'poddisruptionbudget.policy "web-pdb" is forbidden: pdb disruptions allowed is '
            "negative",
            {"name": "web-pdb", "group": "policy", "kind": "poddisruptionbudget",
             "causes": [budget_cause(NEGATIVE)]}),
     BudgetRefusal("web-pdb", NEGATIVE)),
    # an older apiserver's 403: the details only
    (status(403, "Forbidden",
            'poddisruptionbudget.policy "web-pdb" is forbidden: pdb disruptions allowed is '
            "negative",
            {"name": "web-pdb", "group": "policy", "kind": "poddisruptionbudget"}),
     BudgetRefusal("web-pdb", "")),
    # a cause of another kind first, then the budget's
    (status(429, "TooManyRequests", REFUSED,
            {"causes": [{"reason": "FieldValueInvalid", "message": "x"}, budget_cause(NEEDS)]}),
     BudgetRefusal("web-pdb", NEEDS)),
])
def test_the_budget_is_read_from_the_apiservers_refusal(
    exc: ApiError, expected: BudgetRefusal,
) -> None:
    assert budget_refusal(exc) == expected


@pytest.mark.parametrize("exc", [
    # API Priority and Fairness throttling: a 429 with no budget
    status(429, "TooManyRequests", "Too many requests, please try again later.",
           {"retryAfterSeconds": 1}),
    # a disruption webhook's 429 (Podseidon) names no budget
    status(429, "Forbidden", "PodProtector web is unavailable", None),
    # a budget cause whose message is not kube-apiserver's
    status(429, "TooManyRequests", REFUSED, {"causes": [budget_cause("no room")]}),
    status(429, "TooManyRequests", REFUSED, {"causes": [budget_cause(
        "The disruption budget  needs 1 healthy pods")]}),
    status(429, "TooManyRequests", REFUSED, {"causes": "not a list"}),
    status(429, "TooManyRequests", REFUSED, {"causes": ["not a map", {"reason": 7}]}),
    # the apiserver's 500 for two budgets names neither
    status(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
           "eviction subresource does not support.", None),
    # a 403 from RBAC, about another kind
    status(403, "Forbidden", 'pods "web" is forbidden: User cannot create pods/eviction',
           {"name": "web", "kind": "pods"}),
    error_from_status(429, b"plain text"),
    KubeTransportError("reset"),
    ValueError("?"),
])
def test_no_budget_when_the_refusal_names_none(exc: BaseException) -> None:
    assert budget_refusal(exc) is None


def test_the_text_names_the_budget_in_the_pods_namespace() -> None:
    needs = status(429, "TooManyRequests", REFUSED, {"causes": [budget_cause(NEEDS)]})
    assert refusal_text(needs, "prod") == (
        f"PodDisruptionBudget prod/web-pdb: {NEEDS} (429: {REFUSED})")
    old = status(403, "Forbidden", 'poddisruptionbudget.policy "web-pdb" is forbidden: x',
                 {"name": "web-pdb", "group": "policy", "kind": "poddisruptionbudget"})
    assert refusal_text(old, "prod") == (
        'PodDisruptionBudget prod/web-pdb (403: poddisruptionbudget.policy "web-pdb" is '
        "forbidden: x)")
    assert refusal_text(KubeTransportError("reset"), "prod") == "KubeTransportError: reset"


async def test_eviction_blocked_and_drain_failed_name_the_budget(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock,
) -> None:
    c = cluster(nursery)
    pod(c, "db", ns="prod")
    pdb_blocks(c, "db", ns="prod")
    await reclaim(rig(c), instr("r-1", "n-1", grace=10))
    blocked = [e for e in events(c) if e["reason"] == "EvictionBlocked"]
    assert [e["message"] for e in blocked] == [
        "Eviction to drain node n-1 refused by PodDisruptionBudget prod/db: The disruption "
        f"budget db needs 1 healthy pods and has 1 currently (429: {REFUSED})"]
    last_error = c.objects(UPCOMING_NODES)["un-m-1"]["status"]["lastError"]
    assert "prod/db (eviction blocked by PodDisruptionBudget prod/db: " in last_error
