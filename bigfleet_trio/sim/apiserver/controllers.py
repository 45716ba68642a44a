"""Optional in-server controllers. Without them the server has no disruption controller and
tests set PodDisruptionBudget status through ``/status`` themselves.

:class:`PdbController` keeps every PodDisruptionBudget's status in step with the pods it
selects, synchronously after each pod or PDB-spec change, as kube-controller-manager's
disruption controller would (expectedPods = matching pods, currentHealthy = Running + Ready and
not terminating, desiredHealthy from minAvailable / maxUnavailable with percentages rounded up).
Enable with ``ApiServer(pdb_controller=True)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bigfleet_trio.kube.labelselector import match_labels

from .selectors import label_selector_from_object
from .store import Event

if TYPE_CHECKING:
    from .state import ApiState

log = logging.getLogger(__name__)


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = int(value[:-1])
        except ValueError:
            return 0
        return math.ceil(total * pct / 100)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _healthy(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    st = pod.get("status") or {}
    if st.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or ()
    )


def _expected_from_controllers(
    pods: list[dict[str, Any]], scale_of: Callable[[str], int | None]
) -> int | None:
    """Sum of the distinct controllers' ``spec.replicas``.

    None when a pod has no scalable controller.
    """
    seen: dict[str, int] = {}
    for p in pods:
        ref = next(
            (r for r in p["metadata"].get("ownerReferences") or () if r.get("controller")), None
        )
        if ref is None:
            return None
        uid = ref.get("uid", "")
        if uid not in seen:
            scale = scale_of(uid)
            if scale is None:
                return None
            seen[uid] = scale
    return sum(seen.values())


def pdb_status(
    pdb: dict[str, Any],
    pods: list[dict[str, Any]],
    old_status: dict[str, Any] | None,
    scale_of: Callable[[str], int | None] = lambda uid: None,
) -> dict[str, Any]:
    """Compute a PDB status from the pods in its namespace (pure).

    Like the disruption controller: an integer ``minAvailable`` counts the matching pods; a
    percentage or ``maxUnavailable`` scales against the pods' controllers' ``spec.replicas``
    (``scale_of(uid)``), falling back to the pod count when a pod has no such controller.

    Returns:
        The new ``status`` dict (keeps ``disruptedPods`` entries of pods that still exist).
    """
    spec = pdb.get("spec") or {}
    reqs = label_selector_from_object(spec.get("selector"))
    matching = [
        p for p in pods if reqs is not None and match_labels(reqs, p["metadata"].get("labels"))
    ]
    expected = len(matching)
    min_av = spec.get("minAvailable")
    if not (isinstance(min_av, int) and not isinstance(min_av, bool)):
        scaled = _expected_from_controllers(matching, scale_of)
        if scaled is not None:
            expected = scaled
    healthy = sum(1 for p in matching if _healthy(p))
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = expected
    allowed = max(0, healthy - desired)
    names = {p["metadata"]["name"] for p in matching}
    disrupted = {
        k: v for k, v in ((old_status or {}).get("disruptedPods") or {}).items() if k in names
    }
    status: dict[str, Any] = {
        "observedGeneration": int(pdb["metadata"].get("generation", 1)),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": "True" if allowed > 0 else "False",
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": int(pdb["metadata"].get("generation", 1)),
            }
        ],
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    return status


class PdbController:
    """Recomputes PDB statuses after pod events and PDB spec changes (synchronously)."""

    def __init__(self, server: ApiState) -> None:
        self.server = server
        self._busy = False

    def on_event(self, res_key: str, ev: Event) -> None:
        if self._busy:
            return
        srv = self.server
        if res_key == srv.pods.key:
            ns = ev.obj["metadata"].get("namespace", "")
        elif res_key == srv.pdbs.key:
            if ev.type == "DELETED":
                return
            old = ev.old
            if (
                old is not None
                and old.get("spec") == ev.obj.get("spec")
                and old["metadata"].get("generation") == ev.obj["metadata"].get("generation")
            ):
                return
            ns = ev.obj["metadata"].get("namespace", "")
        else:
            return
        self._busy = True
        try:
            self.sync_namespace(ns)
        finally:
            self._busy = False

    def sync_namespace(self, ns: str) -> None:
        srv = self.server
        pdbs = list(srv.store.items(srv.pdbs, ns))
        if not pdbs:
            return
        pods = list(srv.store.items(srv.pods, ns))

        def scale_of(uid: str) -> int | None:
            owner = srv.store.by_uid(uid)
            replicas = ((owner or {}).get("spec") or {}).get("replicas")
            return (
                replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None
            )

        for pdb in pdbs:
            status = pdb_status(pdb, pods, pdb.get("status"), scale_of)
            if status == pdb.get("status"):
                continue
            new = dict(pdb)
            new["metadata"] = dict(pdb["metadata"])
            new["status"] = status
            srv.store.put(srv.pdbs, new, pdb)
            log.debug(
                "pdb %s/%s: allowed=%d healthy=%d desired=%d",
                ns,
                pdb["metadata"]["name"],
                status["disruptionsAllowed"],
                status["currentHealthy"],
                status["desiredHealthy"],
            )
