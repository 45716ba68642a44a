"""What a contestant cost kube-apiserver, from its ``/metrics`` before and after (``--kube real``).

Pure functions over Prometheus text exposition: :func:`parse` keeps the counters the report
needs, :func:`per_pod` turns a before/after pair into requests (and watch events, response
bytes) per Pod, keyed ``"VERB resource[/subresource] code"``. The scrape itself is the
bench's (an admin GET of ``/metrics``). Private to the benches.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

# counter sample name -> the labels that key it in the report
_KEYS: dict[str, tuple[str, ...]] = {
    "apiserver_request_total": ("verb", "resource", "subresource", "code"),
    "apiserver_watch_events_total": ("resource",),
    "apiserver_watch_events_sizes_sum": ("resource",),
    "apiserver_response_sizes_sum": ("verb", "resource", "subresource"),
}

Sample = tuple[str, str]  # (counter, report key)


def _key(name: str, labels: Mapping[str, str]) -> str:
    if name == "apiserver_request_total":
        res = labels.get("resource", "")
        sub = labels.get("subresource", "")
        return f"{labels.get('verb', '')} {res}{'/' + sub if sub else ''} {labels.get('code', '')}"
    if name == "apiserver_response_sizes_sum":
        res = labels.get("resource", "")
        sub = labels.get("subresource", "")
        return f"{labels.get('verb', '')} {res}{'/' + sub if sub else ''}"
    # watch events: labelled by resource since Kubernetes 1.30 (by kind before)
    return labels.get("resource") or labels.get("kind") or "?"


def parse(text: str) -> dict[Sample, float]:
    """The counters of :data:`_KEYS` in ``text`` (Prometheus text format), summed per report key
    (other labels, e.g. ``group``, ``scope``, ``component``, are folded).

    Raises:
        ValueError: ``text`` is not Prometheus text exposition.
    """
    out: dict[Sample, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in _KEYS:
                k = (s.name, _key(s.name, s.labels))
                out[k] = out.get(k, 0.0) + float(s.value)
    return out


def per_pod(before: Mapping[Sample, float], after: Mapping[Sample, float],
            pods: int) -> dict[str, dict[str, float]]:
    """Per Pod, what happened between two :func:`parse` results.

    Returns ``{"requests": {"POST capacityrequests 201": 1.0, ...}, "watch_events": {resource: n},
    "watch_event_bytes": {kind: bytes}, "response_bytes": {"GET pods": bytes, ...}}``, each value
    ``(after - before) / pods``, zero deltas dropped; a counter that went down (apiserver
    restart) counts from 0. ``requests`` also has ``"total"`` and ``"409 conflicts"``.

    Raises:
        ValueError: ``pods`` < 1.
    """
    if pods < 1:
        raise ValueError(f"pods must be >= 1 (got {pods})")
    section = {"apiserver_request_total": "requests",
               "apiserver_watch_events_total": "watch_events",
               "apiserver_watch_events_sizes_sum": "watch_event_bytes",
               "apiserver_response_sizes_sum": "response_bytes"}
    out: dict[str, dict[str, float]] = {v: {} for v in section.values()}
    for (name, key), value in after.items():
        old = before.get((name, key), 0.0)
        delta = value - old if value >= old else value
        if delta:
            out[section[name]][key] = delta / pods
    req = out["requests"]
    if req:
        req["total"] = sum(req.values())
        conflicts = sum(v for k, v in req.items() if k.endswith(" 409"))
        if conflicts:
            req["409 conflicts"] = conflicts
    return out


def table(rows: Mapping[str, Mapping[str, float]], *, digits: int = 3,
          min_value: float = 0.0) -> list[str]:
    """Text lines: one row per key, one column per contestant (``rows``: contestant ->
    ``{key: per Pod}``), keys sorted, absent values shown as ``-``; a key below ``min_value``
    in every column is left out (background traffic: kube-controller-manager's watches)."""
    who = list(rows)
    keys = sorted({k for r in rows.values() for k, v in r.items() if v >= min_value})
    if not keys:
        return []
    width = max(len(k) for k in keys)
    lines = [f"{'':<{width}}  " + "  ".join(f"{w:>9}" for w in who)]
    for k in keys:
        cells = [f"{rows[w][k]:>9.{digits}f}" if k in rows[w] else f"{'-':>9}" for w in who]
        lines.append(f"{k:<{width}}  " + "  ".join(cells))
    return lines
