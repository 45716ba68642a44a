"""CapacityRequest manifests for tests: :func:`cr` builds one as a user would apply it."""

from __future__ import annotations

from typing import Any

__all__ = ["API", "cr"]

API = "bigfleet.lucy.sh/v1alpha1"


def cr(name: str, priority: int, resources: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A CapacityRequest ``name`` in namespace ``default``: ``spec.priority``,
    ``spec.resources`` (quantity strings, e.g. ``{"cpu": "500m"}``) and any further ``spec``
    fields as keyword arguments (their camelCase names, e.g. ``interruptionPenalty``)."""
    return {
        "apiVersion": API,
        "kind": "CapacityRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "resources": resources, **spec},
    }
