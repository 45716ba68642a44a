"""The kopf baseline of ``bench podcontroller``: what a Python team would write instead.

A kopf operator (``on.event`` on Pods, kopf's own watch machinery) that calls *our*
translation (:func:`translate_pod` + :func:`build_capacity_request`) and writes through
kubernetes_asyncio: POST the CapacityRequest, then merge-patch ``status.phase: Pending``
(AlreadyExists: the CR is there already, nothing more). kopf's defaults otherwise (no worker
limit, standalone: no peering). Run as a child process by the scenario::

    python -m scripts.bench._kopf_peer --kubeconfig FILE

Needs the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.rest import ApiException

from bigfleet_trio.podcontroller.translate import (
    TranslationError,
    build_capacity_request,
    is_terminal,
    translate_pod,
)

GROUP, VERSION, PLURAL = "bigfleet.lucy.sh", "v1alpha1", "capacityrequests"
_api: dict[str, Any] = {}


@kopf.on.login()  # type: ignore[misc]
def login(**kwargs: Any) -> Any:
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()  # type: ignore[misc]
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False  # no k8s Events about our own handlers
    await k8s_config.load_kube_config(config_file=_api["kubeconfig"])
    _api["custom"] = k8s.CustomObjectsApi(k8s.ApiClient())


@kopf.on.event("v1", "pods")  # type: ignore[misc]
async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
    if type == "DELETED":
        return
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": dict(body.metadata),
           "spec": dict(body.spec), "status": dict(body.status)}
    if is_terminal(pod):
        return
    try:
        cr = build_capacity_request(pod, translate_pod(pod, None))
    except TranslationError:
        return
    ns, name = cr["metadata"]["namespace"], cr["metadata"]["name"]
    custom: k8s.CustomObjectsApi = _api["custom"]
    try:
        await custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, cr)
    except ApiException as exc:
        if exc.status == 409:
            return
        raise
    await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, name, {"status": {"phase": "Pending"}},
        _content_type="application/merge-patch+json",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("kopf").setLevel(logging.ERROR)
    _api["kubeconfig"] = args.kubeconfig
    import os

    os.environ["KUBECONFIG"] = args.kubeconfig
    asyncio.run(kopf.operator(standalone=True, clusterwide=True))


if __name__ == "__main__":
    main()
