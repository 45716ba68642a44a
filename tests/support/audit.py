"""kube-apiserver's audit log (scripts/realkube/controlplane.py, AUDIT_POLICY: every write) read
as plain records, and the checks the fault tests make from it: the server's own account of who
wrote what, not our logs."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Write", "evictions_by_pod", "read_writes"]


@dataclass(frozen=True)
class Write:
    """One audited write: when the server received it (RFC 3339, sortable), by whom, on what,
    and the answer's code."""

    at: str
    user: str
    user_agent: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int


def read_writes(path: Path, *, since: str = "") -> list[Write]:
    """Every write in the audit log at ``path`` received at or after ``since`` (RFC 3339;
    "" = all), in the log's order."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line being written
        ref = ev.get("objectRef") or {}
        at = ev.get("requestReceivedTimestamp", "")
        if at < since:
            continue
        out.append(Write(at, (ev.get("user") or {}).get("username", ""),
                         ev.get("userAgent", ""), ev.get("verb", ""), ref.get("resource", ""),
                         ref.get("subresource", ""), ref.get("namespace", ""),
                         ref.get("name", ""), int((ev.get("responseStatus") or {}).get("code", 0))))
    return out


def evictions_by_pod(writes: list[Write], namespace: str) -> Counter[str]:
    """Successful evictions (201) per Pod name in ``namespace``."""
    return Counter(w.name for w in writes
                   if w.resource == "pods" and w.subresource == "eviction"
                   and w.namespace == namespace and w.code == 201)
