"""Requirement matching of the simulated shard (pure functions over labels and protobufs).

Kubernetes node-affinity semantics for one machine (:func:`requirement_matches`,
:func:`labels_match`), the Same rule over a set of machines (:func:`same_satisfied`), and the
identity of a need across roll-ups (:func:`profile_fingerprint`, :func:`need_key`). Used by the
planner (:mod:`.planning`) and the engine; re-exported by :mod:`.engine` and the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from bigfleet_trio.proto import pb

from .model import Op


def requirement_matches(req: pb.NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """Whether one machine's labels satisfy one requirement (Kubernetes node-affinity semantics).

    In: key present with a listed value. NotIn: key absent or value not listed. Exists: key
    present. DoesNotExist: key absent. Same: key present (the shared-value rule is a set rule,
    see :func:`same_keys`). UNSPECIFIED or unknown operators match nothing.
    """
    op = req.operator
    present = req.key in labels
    if op == Op.OPERATOR_IN:
        return present and labels[req.key] in req.values
    if op == Op.OPERATOR_NOT_IN:
        return not present or labels[req.key] not in req.values
    if op == Op.OPERATOR_EXISTS:
        return present
    if op == Op.OPERATOR_DOES_NOT_EXIST:
        return not present
    if op == Op.OPERATOR_SAME:
        return present
    return False


def labels_match(reqs: Iterable[pb.NodeSelectorRequirement], labels: Mapping[str, str]) -> bool:
    """All requirements hold for these labels (an empty list matches everything)."""
    return all(requirement_matches(r, labels) for r in reqs)


def same_keys(reqs: Iterable[pb.NodeSelectorRequirement]) -> list[str]:
    """The keys of the Same requirements, sorted and de-duplicated."""
    return sorted({r.key for r in reqs if r.operator == Op.OPERATOR_SAME})


def same_satisfied(
    reqs: Sequence[pb.NodeSelectorRequirement], machine_labels: Iterable[Mapping[str, str]]
) -> bool:
    """Whether a *set* of machines satisfies every Same requirement (one shared value per key)."""
    label_list = list(machine_labels)
    for key in same_keys(reqs):
        values = {lab.get(key) for lab in label_list}
        if None in values or len(values) > 1:
            return False
    return True


def profile_fingerprint(
    requirements: Iterable[pb.NodeSelectorRequirement],
    *,
    priority: int = 0,
    interruption_bucket: int = 0,
    reclamation_bucket: int = 0,
    spread: Iterable[pb.TopologySpread] = (),
) -> str:
    """The profile fingerprint (the shard's canonical text of a need's Profile).

    Example: ``p=0|ipb=0|rpb=0|reqs=node.kubernetes.io/instance-type:1:a;|spr=``.
    """
    reqs = sorted(
        ((r.key, int(r.operator), sorted(r.values)) for r in requirements),
        key=lambda t: (t[0], t[1]),
    )
    parts = [f"p={priority}|ipb={interruption_bucket}|rpb={reclamation_bucket}|reqs="]
    parts += [f"{k}:{op}:{','.join(vals)};" for k, op, vals in reqs]
    parts.append("|spr=")
    parts += [
        f"{s.topology_key}:{s.max_skew}:{int(s.when_unsatisfiable)};"
        for s in sorted(spread, key=lambda s: s.topology_key)
    ]
    return "".join(parts)


def need_key(need: pb.CapacityNeed) -> str:
    """Identity of a need across roll-ups: its profile fingerprint plus its co-location group."""
    fp = profile_fingerprint(
        need.requirements,
        priority=need.priority,
        interruption_bucket=int(need.interruption_penalty_bucket),
        reclamation_bucket=int(need.reclamation_penalty_bucket),
        spread=need.spread,
    )
    return f"{fp}|grp={need.group}"


_OP_NAMES = {
    Op.OPERATOR_IN: "In",
    Op.OPERATOR_NOT_IN: "NotIn",
    Op.OPERATOR_EXISTS: "Exists",
    Op.OPERATOR_DOES_NOT_EXIST: "DoesNotExist",
    Op.OPERATOR_SAME: "Same",
}


def req_tuple(r: pb.NodeSelectorRequirement) -> tuple[str, str, tuple[str, ...]]:
    """``(key, operator name, values)`` of a requirement, as :class:`NeedStatus` shows it."""
    return (r.key, _OP_NAMES.get(r.operator, "Unspecified"), tuple(r.values))

