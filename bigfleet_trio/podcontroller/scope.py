"""Which Pods the pod controller leaves without a CR on purpose, decided from labels alone.

:class:`PodScope` holds the parsed ``--unmanaged-node-selector`` (a Node matching any one is not
BigFleet's), ``--exclude-namespace`` and ``--exclude-pod-selector`` settings; :class:`NodeView`
is all the controller keeps of a Node (its name and whether it is unmanaged). The rule:
docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from bigfleet_trio.kube.labelselector import Requirement, match_labels, parse_label_selector

__all__ = [
    "DEFAULT_UNMANAGED_NODE_SELECTORS",
    "EXCLUDED_KEY",
    "NODE_NAME_KEY",
    "UNMANAGED_LABEL",
    "cached_node_name",
    "NodeView",
    "PodScope",
]

UNMANAGED_LABEL = "bigfleet.lucy.sh/unmanaged"
"""The Node label a platform team sets (``"true"``) on a pool BigFleet does not manage."""
DEFAULT_UNMANAGED_NODE_SELECTORS = ("node-role.kubernetes.io/control-plane",
                                    f"{UNMANAGED_LABEL}=true")
"""``--unmanaged-node-selector``'s default: control-plane Nodes, and Nodes labelled unmanaged."""
NODE_NAME_KEY = "nodeName"
"""Key in a cached Pod's ``metadata`` (:func:`~.projections.slim_pod`): its ``spec.nodeName``
(in ``metadata``, not at the top: the top-level dict has 5 keys, and a 6th grows every cached
Pod by 88 bytes; ``metadata`` usually has 3)."""
EXCLUDED_KEY = "excluded"
"""Key in a cached Pod's ``metadata``: True when its labels match ``--exclude-pod-selector``."""


def cached_node_name(pod: Mapping[str, Any]) -> str | None:
    """The ``spec.nodeName`` a cached Pod keeps (None: pending, or not kept)."""
    name = (pod.get("metadata") or {}).get(NODE_NAME_KEY)
    return name if isinstance(name, str) else None


class NodeView(NamedTuple):
    """A Node as the pod controller caches it: name, and whether BigFleet does not manage it."""

    name: str
    unmanaged: bool


@dataclass(frozen=True)
class PodScope:
    """The parsed opt-out settings.

    Attributes:
        unmanaged_nodes: one requirement list per ``--unmanaged-node-selector`` (empty: no
            Node is unmanaged, and no Node is watched).
        exclude_namespaces: namespaces whose Pods get no CR.
        exclude_pods: requirements of ``--exclude-pod-selector`` (None: no Pod excluded).
        disruption_annotations: ``--disruption-annotations``: a Pod marked not to be disrupted
            gets the highest reclamation penalty (docs/rules.md#disruption-annotations).
    """

    unmanaged_nodes: tuple[tuple[Requirement, ...], ...] = ()
    exclude_namespaces: frozenset[str] = frozenset()
    exclude_pods: tuple[Requirement, ...] | None = None
    disruption_annotations: bool = True

    @classmethod
    def parse(cls, unmanaged_node_selectors: Iterable[str] = DEFAULT_UNMANAGED_NODE_SELECTORS,
              exclude_namespaces: Iterable[str] = (),
              exclude_pod_selector: str = "", *,
              disruption_annotations: bool = True) -> PodScope:
        """The scope from the flags' text. Blank selectors are dropped: ``""`` as the only
        ``--unmanaged-node-selector`` means no Node is unmanaged, a blank
        ``--exclude-pod-selector`` excludes no Pod (a blank label selector would match all).

        Raises:
            LabelSelectorError: a selector does not parse.
        """
        nodes = tuple(tuple(parse_label_selector(s))
                      for s in unmanaged_node_selectors if s.strip())
        pods = (tuple(parse_label_selector(exclude_pod_selector))
                if exclude_pod_selector.strip() else None)
        return cls(nodes, frozenset(ns for ns in exclude_namespaces if ns), pods,
                   disruption_annotations)

    @property
    def watches_nodes(self) -> bool:
        """Some Node may be unmanaged: the controller needs a Node cache."""
        return bool(self.unmanaged_nodes)

    def node_unmanaged(self, labels: Mapping[str, str] | None) -> bool:
        """A Node with ``labels`` matches one of the unmanaged-node selectors."""
        return any(match_labels(reqs, labels) for reqs in self.unmanaged_nodes)

    def node_view(self, node: Mapping[str, Any]) -> NodeView:
        """The Node informer's transform: ``metadata.name`` (interned: the cached Pods bound to
        it share the string) and :meth:`node_unmanaged` of its labels."""
        meta = node.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        labels = meta.get("labels")
        labels = labels if isinstance(labels, Mapping) else {}
        return NodeView(sys.intern(str(meta.get("name", ""))), self.node_unmanaged(labels))

    def pod_labels_excluded(self, labels: Mapping[str, str] | None) -> bool:
        """A Pod with ``labels`` matches ``--exclude-pod-selector``."""
        return self.exclude_pods is not None and match_labels(self.exclude_pods, labels)

    def pod_excluded(self, pod: Mapping[str, Any]) -> bool:
        """A cached Pod (:func:`~.projections.slim_pod`) is opted out: its namespace is
        excluded, or its labels matched the exclude selector when it was cached."""
        meta = pod.get("metadata") or {}
        return meta.get("namespace") in self.exclude_namespaces or meta.get(EXCLUDED_KEY) is True
