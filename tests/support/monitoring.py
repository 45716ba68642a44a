"""What the shipped dashboard and alerts query (config/monitoring/, docs/operate.md), as metric
family names, and the families a running binary exports, read from its /metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

MONITORING = Path(__file__).resolve().parents[2] / "config" / "monitoring"
_NAME = re.compile(r"\b((?:bigfleet|process|workqueue|python)_[a-z0-9_]+)")
_SUFFIX = re.compile(r"_(total|bucket|count|sum|created)$")


def family(sample_name: str) -> str:
    """A sample's family: ``x_total``, ``x_bucket``, ``x_count``, ``x_sum`` -> ``x``."""
    return _SUFFIX.sub("", sample_name)


def queried_families() -> set[str]:
    """Every metric family a dashboard panel or an alert rule names."""
    exprs = [r["expr"] for g in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
             for r in g["rules"]]
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    exprs += [v.get("query", "") for v in dash["templating"]["list"]]
    return {family(m) for e in exprs for m in _NAME.findall(e)}


def exported_families(exposition: str) -> set[str]:
    """Families in a /metrics answer (``# TYPE`` lines: a labelled family with no sample yet
    counts, as Prometheus would see it once the first sample comes)."""
    out = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            out.add(family(line.split()[2]))
        elif line and not line.startswith("#"):
            out.add(family(line.split("{", 1)[0].split(" ", 1)[0]))
    return out
