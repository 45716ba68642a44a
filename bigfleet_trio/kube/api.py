"""``KubeAPI``: the part of :class:`~bigfleet_trio.kube.client.KubeClient` the handlers use.

The UpcomingNode, AvailableCapacity, reclaim/drain and acknowledgement handlers take a
``KubeAPI`` instead of the concrete client, so tests can hand them a small in-memory fake. Every
signature is copied from :class:`~bigfleet_trio.kube.client.KubeClient` (a ``KubeClient`` is a
``KubeAPI``); the semantics, errors and retries are the client's (docs/kube-api.md#retries).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .client import ObjectList, PatchType
from .resources import Resource

__all__ = ["KubeAPI"]


class KubeAPI(Protocol):
    """get / list / create / patch / delete / evict, exactly as :class:`KubeClient` has them."""

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        """GET one object. Raises NotFound if absent."""
        ...

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
    ) -> ObjectList:
        """LIST all objects (all pages)."""
        ...

    async def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object. Raises AlreadyExists, Invalid, NotFound (namespace missing)."""
        ...

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PATCH an object (``merge`` by default), or its ``subresource``."""
        ...

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any] | None:
        """DELETE one object; the server's answer, or None if empty."""
        ...

    async def evict(
        self,
        name: str,
        namespace: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> None:
        """POST a policy/v1 Eviction (never retried: its 429 is a disruption budget's verdict);
        with ``uid``, of that Pod only (409 if the name now belongs to another)."""
        ...
