"""The ``pods/eviction`` decision: PodDisruptionBudget evaluation as the Kubernetes eviction
REST handler orders it (pure; :meth:`.state.ApiState.evict` applies the plan).
"""

from __future__ import annotations

from typing import Any

from bigfleet_trio.kube.labelselector import match_labels

from . import errors as E
from .objects import to_int
from .selectors import label_selector_from_object

DELETE_ONLY = None  # plan value: delete the pod, write no PDB

_REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


def check_eviction_body(name: str, body: Any) -> None:
    """Reject an Eviction body that is not an object or names another pod (400)."""
    if body is None:
        return
    if not isinstance(body, dict):
        raise E.bad_request("eviction body must be an object")
    bmeta = body.get("metadata") or {}
    if not isinstance(bmeta, dict):
        raise E.bad_request("eviction metadata must be an object")
    bname = bmeta.get("name")
    if bname and bname != name:
        raise E.bad_request("name in URL does not match name in Eviction object")


def matching_pdbs(pod: dict[str, Any], pdbs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PDBs (of the pod's namespace) whose selector matches the pod's labels."""
    labels = pod["metadata"].get("labels") or {}
    out = []
    for pdb in pdbs:
        reqs = label_selector_from_object((pdb.get("spec") or {}).get("selector"))
        if reqs is not None and match_labels(reqs, labels):
            out.append(pdb)
    return out


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions")
    return isinstance(conds, list) and any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conds
    )


def _no_room(name: str, pst: dict[str, Any], cur_h: int, des_h: int) -> str:
    """The cause message of a budget with no disruption left, worded as kube-apiserver's
    ``checkAndDecrement`` words it (a failed sync first, then too few healthy Pods, then the
    ``DisruptionAllowed`` condition's own message)."""
    conds = pst.get("conditions")
    reason, said = "", ""
    for c in conds if isinstance(conds, list) else ():
        if (isinstance(c, dict) and c.get("type") == "DisruptionAllowed"
                and c.get("status") == "False"):
            reason, said = str(c.get("reason") or ""), str(c.get("message") or "")
    if said and reason == "SyncFailed":
        return (f"The disruption budget {name} does not allow evicting pods currently because "
                f"it failed sync: {said}")
    if cur_h <= des_h:
        return f"The disruption budget {name} needs {des_h} healthy pods and has {cur_h} currently"
    if said:
        return (f"The disruption budget {name} does not allow evicting pods currently "
                f"({reason}): {said}")
    return f"The disruption budget {name} does not allow evicting pods currently"


def plan_eviction(
    pod: dict[str, Any], pdbs: list[dict[str, Any]], now: str
) -> dict[str, Any] | None:
    """Decide one eviction.

    Order (as the upstream handler): a terminating or not-running pod is deleted without
    looking at budgets; more than one matching PDB is an error; no PDB deletes; an unready pod
    is deleted when the budget is already met; a budget whose status lags its spec, or that
    allows no disruption, refuses with 429.

    Args:
        pod: the stored pod.
        pdbs: the matching PDBs (see :func:`matching_pdbs`).
        now: RFC 3339 time recorded in ``disruptedPods``.

    Returns:
        ``DELETE_ONLY`` (None) to just delete the pod, or the PDB to store (its status with one
        disruption used) before deleting the pod.

    Raises:
        ApiError: 429 with a ``DisruptionBudget`` cause (no disruption left, or a status
            that lags the spec); 403 naming the PDB when ``disruptionsAllowed`` is negative;
            500 with more than one PDB.
    """
    phase = (pod.get("status") or {}).get("phase")
    if pod["metadata"].get("deletionTimestamp") or phase in ("Succeeded", "Failed", "Pending"):
        return DELETE_ONLY
    if len(pdbs) > 1:
        raise E.ApiError(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support.",
        )
    if not pdbs:
        return DELETE_ONLY
    pdb = pdbs[0]
    pst = pdb.get("status") or {}
    pname = pdb["metadata"]["name"]
    cur_h = to_int(pst.get("currentHealthy", 0))
    des_h = to_int(pst.get("desiredHealthy", 0))
    if not _ready(pod) and cur_h >= des_h > 0:
        return DELETE_ONLY
    if to_int(pst.get("observedGeneration", 0)) < to_int(pdb["metadata"].get("generation", 1), 1):
        raise E.too_many_requests(
            _REFUSED,
            [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {pname} is still being processed by the "
                    "server.",
                }
            ],
            retry_after=10,
        )
    allowed = to_int(pst.get("disruptionsAllowed", 0))
    if allowed < 0:
        raise E.ApiError(
            403,
            "Forbidden",
            f'poddisruptionbudget.policy "{pname}" is forbidden: pdb disruptions allowed is '
            "negative",
            {
                "name": pname,
                "group": "policy",
                "kind": "poddisruptionbudget",
                "causes": [
                    {
                        "reason": "DisruptionBudget",
                        "message": f"The disruption budget {pname} does not allow evicting pods "
                        "currently: pdb disruptions allowed is negative",
                    }
                ],
            },
        )
    if allowed == 0:
        raise E.too_many_requests(
            _REFUSED,
            [{"reason": "DisruptionBudget", "message": _no_room(pname, pst, cur_h, des_h)}],
        )
    disrupted = pst.get("disruptedPods")
    disrupted = disrupted if isinstance(disrupted, dict) else {}
    new_pst = dict(pst)
    new_pst["disruptionsAllowed"] = allowed - 1
    new_pst["disruptedPods"] = dict(disrupted, **{pod["metadata"]["name"]: now})
    new_pdb = dict(pdb)
    new_pdb["status"] = new_pst
    new_pdb["metadata"] = dict(pdb["metadata"])
    return new_pdb
