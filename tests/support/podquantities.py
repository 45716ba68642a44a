"""The Pod quantity corpus: Pods and Deployments whose resource quantities kube-apiserver
accepts or refuses (docs/deviations.md#pod-quantities), each with the answer expected (201; 400
while decoding, no field named; 422 with the fields named). The embedded apiserver answers it in
the fast tier (tests/sim/test_apiserver_pod_quantities.py), kube-apiserver in the realkube tier
(tests/realkube/test_pod_quantities.py), both with ``dryRun=All`` so nothing is stored.

:func:`answer` is what the two are compared on: status code, reason, message and the causes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["CASES", "QuantityCase", "answer"]

PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
RES = "spec.containers[0].resources"


@dataclass(frozen=True)
class QuantityCase:
    """One manifest: ``body`` POSTed to ``path``; ``code`` and ``fields`` (the 422's causes,
    sorted) expected."""

    id: str
    path: str
    body: dict[str, Any] = field(repr=False)
    code: int
    fields: tuple[str, ...] = ()


def _pod(name: str, requests: Any = None, limits: Any = None, **spec: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": res}],
                     **spec}}


def _deployment(name: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": copy.deepcopy(pod["spec"])}}}


def _cases() -> list[QuantityCase]:
    out: list[QuantityCase] = []
    # unparsable: refused while decoding (400), whatever the field
    for i, raw in enumerate(["lots", "", "1 2", True, [1], "1Q", "1Gb", "1KK"]):
        out.append(QuantityCase(f"unparsable-{i}", PODS,
                                _pod(f"unparsable-{i}", {"cpu": "1", "memory": raw}), 400))
    # what Go parses (a null is no quantity; JSON numbers are quantities too)
    for i, raw in enumerate(["100m", " 1 ", "1.5", 2, 0.5, "1e3", "64Mi", None, "+1"]):
        out.append(QuantityCase(f"parses-{i}", PODS, _pod(f"parses-{i}", {"cpu": raw}), 201))
    init = _pod("init-unparsable")
    init["spec"]["initContainers"] = [{"name": "i", "image": "busybox",
                                       "resources": {"limits": {"cpu": "x"}}}]
    out.append(QuantityCase("init-unparsable", PODS, init, 400))
    out += [
        QuantityCase("negative", PODS, _pod("negative", {"cpu": "-500m"}), 422,
                     (f"{RES}.requests[cpu]",)),
        QuantityCase("above-limit", PODS, _pod("above-limit", {"cpu": "2"}, {"cpu": "1"}), 422,
                     (f"{RES}.requests",)),
        QuantityCase("below-limit", PODS, _pod("below-limit", {"cpu": "500m"}, {"cpu": "1"}),
                     201),
        QuantityCase("gpu-request-not-limit", PODS,
                     _pod("gpu-request-not-limit", {"nvidia.com/gpu": "1"},
                          {"nvidia.com/gpu": "2"}), 422, (f"{RES}.requests",)),
        QuantityCase("gpu-without-limit", PODS,
                     _pod("gpu-without-limit", {"nvidia.com/gpu": "1"}), 422,
                     (f"{RES}.limits",)),
        QuantityCase("gpu-limit-alone", PODS,
                     _pod("gpu-limit-alone", None, {"nvidia.com/gpu": "1", "cpu": "1"}), 201),
        QuantityCase("gpu-fraction", PODS,
                     _pod("gpu-fraction", None, {"nvidia.com/gpu": "500m"}), 422,
                     (f"{RES}.limits[nvidia.com/gpu]", f"{RES}.requests[nvidia.com/gpu]")),
        QuantityCase("deployment-unparsable", DEPLOYMENTS,
                     _deployment("deployment-unparsable", _pod("x", {"cpu": "lots"})), 400),
        QuantityCase("deployment-above-limit", DEPLOYMENTS,
                     _deployment("deployment-above-limit", _pod("x", {"cpu": "2"}, {"cpu": "1"})),
                     422, (f"spec.template.{RES}.requests",)),
        QuantityCase("deployment-fine", DEPLOYMENTS,
                     _deployment("deployment-fine", _pod("x", {"cpu": "100m"}, {"cpu": "1"})),
                     201),
    ]
    return out


CASES = _cases()


def answer(response: httpx.Response) -> tuple[int, str, str, list[tuple[str, str, str]]]:
    """``(code, reason, message, causes)`` of an answer; for a 201 only the code (the stored
    object is each server's own), the causes as sorted ``(field, reason, message)``."""
    if response.status_code == 201:
        return 201, "", "", []
    body = response.json()
    causes = sorted((str(c.get("field", "")), str(c.get("reason", "")),
                     str(c.get("message", "")))
                    for c in (body.get("details") or {}).get("causes") or [])
    return response.status_code, str(body.get("reason", "")), str(body.get("message", "")), causes
