"""Tests for bigfleet_trio/manifests (issue 7: manifests in one folder; ref §11, §12 RBAC).

Every file parses; Deployments run the CLI with arguments it accepts, probe /healthz and /readyz on
the metrics port, and use a restricted securityContext; RBAC is exactly the least privilege the
code needs; ConfigMaps hold a bootstrap template that renders and PriorityClass defaults that load.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from bigfleet_trio import cli
from bigfleet_trio.config import split_host_port, validate_priority_class_defaults

MANIFESTS = Path(str(resources.files("bigfleet_trio").joinpath("manifests")))
NAMESPACE = "bigfleet-system"


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            if doc:
                out.append((path.name, doc))
    return out


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in _docs() if d["kind"] == kind}


def test_folder_is_package_data() -> None:
    names = {p.name for p in MANIFESTS.glob("*.yaml")}
    assert {
        "00-namespace.yaml",
        "10-operator-rbac.yaml",
        "11-pod-controller-rbac.yaml",
        "20-operator-deployment.yaml",
        "21-pod-controller-deployment.yaml",
        "30-bootstrap-template.yaml",
        "31-priority-class-defaults.yaml",
    } <= names
    # kubectl apply -f <folder> goes in name order: the namespace comes first.
    assert sorted(names)[0] == "00-namespace.yaml"


def test_every_document_is_a_kubernetes_object() -> None:
    docs = _docs()
    assert docs
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    }
    for fname, doc in docs:
        assert isinstance(doc, dict), fname
        assert doc.get("apiVersion") and doc.get("kind"), fname
        assert doc["metadata"].get("name"), fname
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == NAMESPACE, (fname, doc["metadata"]["name"])


def _deployment(name: str) -> dict[str, Any]:
    return _by_kind("Deployment")[name]


def _container(name: str) -> dict[str, Any]:
    (c,) = _deployment(name)["spec"]["template"]["spec"]["containers"]
    return c


DEPLOYMENTS = ["bigfleet-operator", "bigfleet-pod-controller"]


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_deployment_args_are_accepted_by_the_cli(name: str) -> None:
    c = _container(name)
    assert c["image"] == "bigfleet-trio:0.1.0"
    assert "command" not in c  # the image's ENTRYPOINT is bigfleet-trio
    ns = cli.parse_args(c["args"])
    if ns.command == "operator":
        cfg = cli.operator_config(ns)
        assert cfg.cluster_id and cfg.shard_addr
        assert cfg.leader_elect is True
        metrics_addr = cfg.metrics_addr
    else:
        assert ns.command == "pod-controller"
        pcfg = cli.pod_controller_config(ns)
        assert pcfg.leader_elect is True
        metrics_addr = pcfg.metrics_addr
    _, port = split_host_port(metrics_addr)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_deployment_security_and_resources(name: str) -> None:
    dep = _deployment(name)
    spec = dep["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = _container(name)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc or sc["privileged"] is False
    for key in ("requests", "limits"):
        assert set(c["resources"][key]) == {"cpu", "memory"}
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert dep["spec"]["selector"]["matchLabels"].items() <= (
        dep["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["serviceAccountName"] in _by_kind("ServiceAccount")


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("bigfleet-operator", "--bootstrap-template-file"),
        ("bigfleet-pod-controller", "--priority-class-defaults"),
    ],
)
def test_configmap_files_are_where_the_flags_point(name: str, flag: str) -> None:
    c = _container(name)
    (path,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith(flag + "=")]
    volumes = {v["name"]: v for v in _deployment(name)["spec"]["template"]["spec"]["volumes"]}
    configmaps = _by_kind("ConfigMap")
    found = False
    for m in c["volumeMounts"]:
        vol = volumes[m["name"]]
        if "configMap" in vol and path.startswith(m["mountPath"].rstrip("/") + "/"):
            key = path[len(m["mountPath"].rstrip("/")) + 1 :]
            assert key in configmaps[vol["configMap"]["name"]]["data"]
            assert m.get("readOnly") is True
            found = True
    assert found, path


def _rules(kind: str, name: str) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in _by_kind(kind)[name]["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


B = "bigfleet.lucy.sh"


def test_operator_rbac_is_exactly_what_the_code_needs() -> None:
    assert _rules("ClusterRole", "bigfleet-operator") == {
        (B, "capacityrequests"): {"list", "watch"},
        (B, "capacityrequests/status"): {"patch"},
        (B, "upcomingnodes"): {"get", "list", "watch", "create", "patch", "delete"},
        (B, "upcomingnodes/status"): {"patch"},
        (B, "availablecapacities"): {"get", "create", "patch"},
        ("", "nodes"): {"get", "list", "watch", "patch"},
        ("", "pods"): {"list"},
        ("", "pods/eviction"): {"create"},
        ("", "events"): {"create"},
    }
    assert _rules("Role", "bigfleet-operator-leader-election") == {
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    }


def test_pod_controller_rbac_is_exactly_what_the_code_needs() -> None:
    assert _rules("ClusterRole", "bigfleet-pod-controller") == {
        ("", "pods"): {"get", "list", "watch"},
        (B, "capacityrequests"): {
            "get",
            "list",
            "watch",
            "create",
            "patch",
            "delete",
            "deletecollection",
        },
        (B, "capacityrequests/status"): {"patch"},
        ("", "events"): {"create"},
    }
    assert _rules("Role", "bigfleet-pod-controller-leader-election") == {
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    }


def test_no_wildcards_anywhere() -> None:
    for kind in ("ClusterRole", "Role"):
        for role in _by_kind(kind).values():
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], role["metadata"]["name"]


@pytest.mark.parametrize(
    ("kind", "role_kind"), [("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")]
)
def test_bindings_point_at_existing_roles_and_accounts(kind: str, role_kind: str) -> None:
    roles = _by_kind(role_kind)
    accounts = _by_kind("ServiceAccount")
    bindings = _by_kind(kind)
    assert bindings
    for b in bindings.values():
        assert b["roleRef"]["kind"] == role_kind
        assert b["roleRef"]["name"] in roles
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount"
            assert s["name"] in accounts and s["namespace"] == NAMESPACE


def test_bootstrap_template_renders_to_cloud_config() -> None:
    from bigfleet_trio.operator.bootstrap import FileRenderer, Requirement

    text = _by_kind("ConfigMap")["bigfleet-bootstrap-template"]["data"]["bootstrap.yaml.j2"]
    renderer = FileRenderer(text, name="bootstrap.yaml.j2")
    out = renderer.render(
        "prod-eu",
        "req-1",
        [
            Requirement("topology.kubernetes.io/zone", "In", ("eu-1a", "eu-1b")),
            Requirement("gpu", "Exists", ()),
        ],
    ).decode()
    assert out.startswith("#cloud-config\n")
    doc = yaml.safe_load(out)
    (wf,) = doc["write_files"]
    content = yaml.safe_load(wf["content"])
    assert content == {
        "clusterID": "prod-eu",
        "requestID": "req-1",
        "requirements": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-1a", "eu-1b"]},
            {"key": "gpu", "operator": "Exists", "values": []},
        ],
    }
    empty = yaml.safe_load(
        yaml.safe_load(renderer.render("c", "r", []).decode())["write_files"][0]["content"]
    )
    assert empty["requirements"] == []


def test_priority_class_defaults_configmap_loads() -> None:
    text = _by_kind("ConfigMap")["bigfleet-priority-class-defaults"]["data"][
        "priority-class-defaults.yaml"
    ]
    assert validate_priority_class_defaults(text) == {
        "ml-research": {"interruptionPenalty": "8192", "reclamationPenalty": "65536"},
        "batch-best-effort": {"interruptionPenalty": "16", "reclamationPenalty": "0"},
    }
    from bigfleet_trio.podcontroller.defaults import parse_priority_class_defaults

    parse_priority_class_defaults(text)  # quantities valid for the real loader


ROOT = Path(__file__).resolve().parent.parent


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) == 2 and froms[0].endswith(" AS builder")
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines
    final = lines[lines.index(froms[1]) :]
    assert "COPY --from=builder /opt/venv /opt/venv" in final
    assert "USER 65532:65532" in final
    assert 'ENTRYPOINT ["bigfleet-trio"]' in final
    assert not any(ln.startswith(("RUN apt", "RUN pip install")) for ln in final)


def test_dockerignore_keeps_build_inputs() -> None:
    ignored = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert not ignored & {"pyproject.toml", "README.md", "bigfleet_trio", "bigfleet_trio/"}
    assert {".git", ".venv", "tests"} <= ignored
