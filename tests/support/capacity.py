"""CapacityRequest manifests for tests: :func:`cr` builds one as a user would apply it, the one
builder the tests share (a test module wraps it for its own defaults)."""

from __future__ import annotations

from typing import Any

__all__ = ["API", "cr"]

API = "bigfleet.lucy.sh/v1alpha1"


def cr(name: str, priority: int = 0, resources: dict[str, str] | None = None, *,
       namespace: str = "default", resource_version: str | None = None,
       phase: str | None = None, **spec: Any) -> dict[str, Any]:
    """A CapacityRequest ``name`` in ``namespace``: ``spec.priority``, ``spec.resources``
    (quantity strings, e.g. ``{"cpu": "500m"}``; default ``{"cpu": "1"}``) and any further
    ``spec`` fields as keyword arguments (their camelCase names, e.g. ``interruptionPenalty``,
    ``requirements``); ``metadata.resourceVersion`` and ``status.phase`` when given."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    obj: dict[str, Any] = {
        "apiVersion": API,
        "kind": "CapacityRequest",
        "metadata": meta,
        "spec": {"priority": priority,
                 "resources": resources if resources is not None else {"cpu": "1"}, **spec},
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj
