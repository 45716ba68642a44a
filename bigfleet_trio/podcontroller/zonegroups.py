"""The zones each co-location group runs in, kept up to date from the Pod events
(:class:`GroupZones`; rule: docs/rules.md#pod-translation-co-location-zone-pin).

The pin needs, for a Pod's zone group, the set of zones its bound Pods run in. Scanning the
namespace's bound Pods for it on every reconcile made the pod controller quadratic in the Pods of
a namespace: in a 200-machine soak on kube-apiserver that scan was 56 % of its CPU. Here each
group in use keeps a count of its bound, non-terminal Pods per zone, adjusted by every store
change the informer dispatches, so a reconcile reads the zones in O(zones) and a Pod event costs
one lookup per label of the Pod.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from bigfleet_trio.kube.informer import Store

from .translate import is_terminal
from .zonepin import (
    BOUND_ZONE_INDEX,
    ZONE_LABEL,
    first_pair,
    selector_matches,
    term_namespaces,
    zone_term,
)

__all__ = ["GroupId", "GroupZones", "group_id"]

GroupId = tuple[tuple[str, ...], str]
"""A zone group: the namespaces its term looks in (sorted) and its label selector as canonical
JSON."""


def group_id(pod: Mapping[str, Any] | None) -> GroupId | None:
    """The zone group ``pod``'s first required pod-affinity term names, or None (no such term,
    or one with a ``namespaceSelector``, which is never pinned)."""
    term = zone_term(pod) if pod is not None else None
    if term is None or pod is None or term.get("namespaceSelector") is not None:
        return None
    try:
        selector = json.dumps(term.get("labelSelector"), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON: a cache object is; never raise in a handler
        selector = repr(term.get("labelSelector"))
    return tuple(sorted(set(term_namespaces(pod, term)))), selector


def _running(pod: Mapping[str, Any] | None) -> tuple[str, str, Mapping[str, Any]] | None:
    """``(namespace, zone, labels)`` of a bound, non-terminal Pod whose labels carry its zone;
    None for any other (it runs nowhere a group can count)."""
    if pod is None:
        return None
    meta = pod.get("metadata") or {}
    labels = meta.get("labels")
    if not isinstance(labels, Mapping):
        return None
    zone = labels.get(ZONE_LABEL)
    if not isinstance(zone, str) or not zone or is_terminal(pod):
        return None
    return str(meta.get("namespace", "")), zone, labels


class _Group:
    __slots__ = ("gid", "namespaces", "pairs", "selector", "users", "zones")

    def __init__(self, gid: GroupId, selector: Any) -> None:
        self.gid = gid
        self.namespaces = gid[0]
        self.selector = selector
        self.users = 0  # cached Pods whose term names this group
        self.zones: Counter[str] = Counter()  # zone -> running member Pods (only counts > 0)
        # every member carries the selector's first matchLabels pair: look it up by that
        self.pairs = tuple(f"{ns}/{first_pair(selector)}" for ns in self.namespaces)

    def add(self, zone: str, delta: int) -> bool:
        """Count one member Pod in or out of ``zone``; True when the set of zones changed."""
        count = self.zones.get(zone, 0) + delta
        if count > 0:
            self.zones[zone] = count
            return count == 1 and delta > 0
        return self.zones.pop(zone, None) is not None


class GroupZones:
    """Per zone group in use, how many bound, non-terminal Pods run in each zone.

    It observes every change of the Pod cache, right after the store applied it, with the
    exact objects replaced (:meth:`observe`, one of the store's ``observers``: a DELETED
    handler is given the watch event's object, which may differ from the one counted). Read a
    Pod's group zones with :meth:`zones`; whether a change moved some group's zones with
    :meth:`take_moved`. A group is created when the first Pod whose term names it is observed
    (counted once from the cache) and forgotten with the last one.

    Args:
        store: the Pod informer's store (slim Pods, :data:`~.zonepin.BOUND_ZONE_INDEX` indexed).
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._groups: dict[GroupId, _Group] = {}
        self._by_pair: dict[str, set[GroupId]] = {}
        self._moved = False
        store.observers.append(self.observe)

    def take_moved(self) -> bool:
        """True when a change observed since the last call moved some group's set of zones (its
        Pods must be planned again); resets."""
        moved, self._moved = self._moved, False
        return moved

    def tracked(self) -> int:
        """How many groups are tracked."""
        return len(self._groups)

    def zones(self, pod: Mapping[str, Any]) -> tuple[str, ...] | None:
        """The zones ``pod``'s group runs in (sorted; ``()`` for none), or None when the Pod has
        no zone group (:func:`group_id`). A group never observed is counted from the cache."""
        gid = group_id(pod)
        if gid is None:
            return None
        group = self._groups.get(gid)
        if group is None:
            group = self._count(gid, pod)
        return tuple(sorted(group.zones))

    def observe(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
        """One store change of a Pod: ``old`` replaced by ``new`` (None for an add's old or a
        delete's new). Returns True when the set of zones of some group changed (its Pods must
        be planned again); a group created here is not a change (no other Pod names it yet)."""
        changed = False
        ran, runs = _running(old), _running(new)
        if ran is not None:
            for member in self._matching(ran[0], ran[2]):
                changed |= member.add(ran[1], -1)
        created: GroupId | None = None
        gid_new = group_id(new)
        if gid_new is not None and new is not None:
            named = self._groups.get(gid_new)
            if named is None:
                named = self._count(gid_new, new)  # counts ``new`` too: the store holds it
                self._track(gid_new, named)
                created = gid_new
            named.users += 1
        gid_old = group_id(old)
        if gid_old is not None and (left := self._groups.get(gid_old)) is not None:
            left.users -= 1
            if left.users <= 0:
                self._forget(gid_old, left)
        if runs is not None:
            for member in self._matching(runs[0], runs[2]):
                if member.gid != created:
                    changed |= member.add(runs[1], +1)
        self._moved |= changed
        return changed

    # -- internals ---------------------------------------------------------------------------

    def _count(self, gid: GroupId, pod: Mapping[str, Any]) -> _Group:
        term = zone_term(pod) or {}
        group = _Group(gid, term.get("labelSelector"))
        for ns in group.namespaces:
            for other in self._store.by_index(BOUND_ZONE_INDEX, ns):
                running = _running(other)
                if running is not None and selector_matches(group.selector, running[2]):
                    group.zones[running[1]] += 1
        return group

    def _track(self, gid: GroupId, group: _Group) -> None:
        self._groups[gid] = group
        for pair in group.pairs:
            self._by_pair.setdefault(pair, set()).add(gid)

    def _forget(self, gid: GroupId, group: _Group) -> None:
        del self._groups[gid]
        for pair in group.pairs:
            ids = self._by_pair.get(pair)
            if ids is not None:
                ids.discard(gid)
                if not ids:
                    del self._by_pair[pair]

    def _matching(self, ns: str, labels: Mapping[str, Any]) -> Iterable[_Group]:
        """The tracked groups a Pod in ``ns`` with ``labels`` is a member of."""
        ids: set[GroupId] = set(self._by_pair.get(f"{ns}/", ()))
        for key, value in labels.items():
            ids.update(self._by_pair.get(f"{ns}/{key}={value}", ()))
        for gid in ids:
            group = self._groups[gid]
            if selector_matches(group.selector, labels):
                yield group
