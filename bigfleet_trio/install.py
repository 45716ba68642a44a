"""``bigfleet-trio install-crds``: create or update the project's CRDs in a cluster.

``bigfleet-trio install-crds [--kubeconfig PATH]``. The CRDs' one copy is
``bigfleet_trio/manifests/crds.yaml``: package data (so ``pip install`` users have it), read here
and by the simulated apiserver, and the Kustomize base of ``config/crd``
(docs/crds.md#deploying-with-kustomize). Talks to Kubernetes through
:class:`bigfleet_trio.kube.KubeClient` (docs/kube-api.md).
"""

from __future__ import annotations

import logging
import sys
from importlib import resources
from typing import IO, Any, Protocol

import yaml

__all__ = ["install_crds", "load_crds", "apply_crds", "CRD_MANIFEST"]

log = logging.getLogger(__name__)

CRD_MANIFEST = "crds.yaml"


class _CrdClient(Protocol):  # the part of KubeClient this module uses
    async def create(self, res: Any, body: dict[str, Any], namespace: str | None = None) -> Any: ...

    async def get(self, res: Any, name: str, namespace: str | None = None) -> Any: ...

    async def update(self, res: Any, body: dict[str, Any], namespace: str | None = None) -> Any: ...


def load_crds(text: str | None = None) -> list[dict[str, Any]]:
    """Parse the CRD manifest (multi-document YAML) into CustomResourceDefinition objects.

    Args:
        text: YAML text; ``None`` reads the packaged ``manifests/crds.yaml``.

    Returns:
        The CRD documents in file order (empty documents skipped).

    Raises:
        FileNotFoundError: the packaged manifest is missing.
        ValueError: a document is not a CustomResourceDefinition or has no name.
    """
    if text is None:
        text = (
            resources.files("bigfleet_trio").joinpath("manifests", CRD_MANIFEST).read_text("utf-8")
        )
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"{CRD_MANIFEST}: expected CustomResourceDefinition, got {kind}")
        if not (doc.get("metadata") or {}).get("name"):
            raise ValueError(f"{CRD_MANIFEST}: a CustomResourceDefinition has no metadata.name")
    return docs


async def apply_crds(
    client: _CrdClient, crds: list[dict[str, Any]], res: Any
) -> list[tuple[str, str]]:
    """Create each CRD, or replace it (keeping its resourceVersion) when it already exists.

    Args:
        client: a KubeClient (or anything with async ``create``/``get``/``update``).
        crds: CRD documents from :func:`load_crds`.
        res: the CRD ``Resource`` (``bigfleet_trio.kube.CRDS``).

    Returns:
        ``[(name, "created" | "configured" | "unchanged")]`` in input order.

    Raises:
        bigfleet_trio.kube.errors.ApiError: anything but AlreadyExists on create, or a failed
            update.
    """
    from bigfleet_trio.kube.errors import AlreadyExists, Conflict

    results: list[tuple[str, str]] = []
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            await client.create(res, crd)
            action = "created"
        except AlreadyExists:
            action = await _update(client, res, crd, Conflict)
        # DEBUG: install_crds prints each result on stdout; an INFO line on stderr said it twice
        log.debug("crd applied", extra={"crd": name, "action": action})
        results.append((name, action))
    return results


async def _update(
    client: _CrdClient, res: Any, crd: dict[str, Any], conflict: type[BaseException]
) -> str:
    name = crd["metadata"]["name"]
    for _attempt in range(5):
        live = await client.get(res, name)
        if live.get("spec") == crd.get("spec") and _labels(live) == _labels(crd):
            return "unchanged"
        body = dict(crd)
        meta = dict(crd.get("metadata") or {})
        meta["resourceVersion"] = (live.get("metadata") or {}).get("resourceVersion")
        body["metadata"] = meta
        try:
            await client.update(res, body)
            return "configured"
        except conflict:
            continue
    raise RuntimeError(f"customresourcedefinition {name}: kept conflicting on update")


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def install_crds(kubeconfig: str | None, *, out: IO[str] | None = None) -> int:
    """Apply ``manifests/crds.yaml`` to the cluster named by the kubeconfig chain.

    Prints one ``customresourcedefinition.apiextensions.k8s.io/<name> <action>`` line per CRD
    (kubectl style) to ``out`` (stdout).

    Args:
        kubeconfig: explicit path, or ``None`` for $KUBECONFIG, ~/.kube/config, in-cluster.
        out: where to print progress.

    Returns:
        0 on success, 1 after printing ``install-crds: <error>`` to stderr.
    """
    import trio

    stream = out if out is not None else sys.stdout

    async def _run() -> list[tuple[str, str]]:
        from bigfleet_trio.kube.client import KubeClient
        from bigfleet_trio.kube.config import load_kubeconfig
        from bigfleet_trio.kube.resources import CRDS

        crds = load_crds()
        cfg = load_kubeconfig(kubeconfig)
        async with KubeClient(cfg) as client:
            return await apply_crds(client, crds, CRDS)

    try:
        results = trio.run(_run)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one clear line, the traceback only at debug
        log.debug("install-crds failed", exc_info=True)
        print(f"install-crds: {_one_line(exc)}", file=sys.stderr)
        return 1
    for name, action in results:
        print(f"customresourcedefinition.apiextensions.k8s.io/{name} {action}", file=stream)
    return 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text
