"""Tests for bigfleet_trio.cli and bigfleet_trio.install: flags, dispatch, one-line errors."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from bigfleet_trio import cli
from bigfleet_trio.config import OperatorConfig, PodControllerConfig
from bigfleet_trio.install import apply_crds, load_crds
from bigfleet_trio.knobs import ConfigError
from bigfleet_trio.sim import cli as sim_cli
from bigfleet_trio.sim.demo_options import DemoOptions

pytestmark = pytest.mark.usefixtures("restore_root_logging")  # tests/conftest.py


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


# ------------------------------------------------------------------------------ parsing: operator


def test_operator_defaults() -> None:
    cfg = cli.operator_config(
        cli.parse_args(["operator", "--cluster-id", "c1", "--shard-addr", "s:1"])
    )
    assert cfg == OperatorConfig(cluster_id="c1", shard_addr="s:1")


def test_operator_every_flag() -> None:
    argv = [
        "operator",
        "--cluster-id=c1",
        "--shard-addr",
        "shard.example:443",
        "--kubeconfig",
        "/k",
        "--rollup-interval",
        "1m30s",
        "--ack-concurrency",
        "4",
        "--dispatch-concurrency",
        "8",
        "--qps",
        "12.5",
        "--burst",
        "25",
        "--bootstrap-template-file",
        "/t.j2",
        "--bootstrap-ttl",
        "5m",
        "--tls-cert",
        "/c",
        "--tls-key",
        "/k.pem",
        "--tls-ca",
        "/ca",
        "--tls-server-name",
        "shard",
        "--metrics-addr",
        "127.0.0.1:9000",
        "--health-probe-addr",
        ":8081",
        "--leader-elect",
        "--leader-election-namespace",
        "ns",
        "--leader-election-id",
        "lease",
        "--drain-shutdown-timeout",
        "45s",
        "--sync-timeout",
        "2m",
        "--send-timeout",
        "15s",
        "--reconnect-initial-backoff",
        "250ms",
        "--reconnect-max-backoff",
        "1m",
        "--log-format",
        "json",
        "--log-level",
        "debug",
    ]
    cfg = cli.operator_config(cli.parse_args(argv))
    assert cfg == OperatorConfig(
        cluster_id="c1",
        shard_addr="shard.example:443",
        kubeconfig="/k",
        rollup_interval=90.0,
        ack_concurrency=4,
        dispatch_concurrency=8,
        qps=12.5,
        burst=25,
        bootstrap_template_file="/t.j2",
        bootstrap_ttl=300.0,
        tls_cert="/c",
        tls_key="/k.pem",
        tls_ca="/ca",
        tls_server_name="shard",
        metrics_addr="127.0.0.1:9000",
        health_probe_addr=":8081",
        leader_elect=True,
        leader_election_namespace="ns",
        leader_election_id="lease",
        drain_shutdown_timeout=45.0,
        sync_timeout=120.0,
        send_timeout=15.0,
        reconnect_initial_backoff=0.25,
        reconnect_max_backoff=60.0,
        log_format="json",
        log_level="debug",
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("10s", 10.0), ("500ms", 0.5), ("2h", 7200.0), ("1.5s", 1.5), ("10", 10.0), ("0.5", 0.5)],
)
def test_duration_forms(value: str, seconds: float) -> None:
    ns = cli.parse_args(["operator", "--rollup-interval", value])
    assert ns.rollup_interval == seconds


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], False),
        (["--leader-elect"], True),
        (["--leader-elect=true"], True),
        (["--leader-elect=false"], False),
        (["-leader-elect"], True),
        (["--leader-elect", "--qps", "5"], True),
    ],
)
def test_go_style_bool(argv: list[str], expected: bool) -> None:
    assert cli.parse_args(["operator", *argv]).leader_elect is expected


def test_go_style_single_dash_flags() -> None:
    ns = cli.parse_args(["operator", "-cluster-id=c1", "-shard-addr", "s:1", "-qps=7"])
    assert (ns.cluster_id, ns.shard_addr, ns.qps) == ("c1", "s:1", 7.0)


def test_log_flags_before_or_after_command() -> None:
    ns = cli.parse_args(["--log-format", "json", "--log-level", "debug", "operator"])
    assert (ns.log_format, ns.log_level) == ("json", "debug")
    ns = cli.parse_args(["operator", "--log-format=json"])
    assert (ns.log_format, ns.log_level) == ("json", None)
    assert cli.operator_config(ns).log_level == "info"


@pytest.mark.parametrize("command", ["operator", "pod-controller"])
def test_logging_format_is_the_kubernetes_spelling_of_log_format(command: str) -> None:
    assert cli.parse_args([command, "--logging-format=json"]).log_format == "json"
    assert cli.parse_args(["--logging-format", "text", command]).log_format == "text"
    with pytest.raises(cli.UsageError, match="--logging-format"):
        cli.parse_args([command, "--logging-format=xml"])


# ------------------------------------------------------------------------------ parsing: others


def test_pod_controller_defaults_and_flags() -> None:
    assert cli.pod_controller_config(cli.parse_args(["pod-controller"])) == PodControllerConfig()
    cfg = cli.pod_controller_config(
        cli.parse_args(
            [
                "pod-controller",
                "--kubeconfig",
                "/k",
                "--priority-class-defaults",
                "/p.yaml",
                "--qps",
                "5",
                "--burst",
                "10",
                "--metrics-addr",
                "0",
                "--health-probe-addr",
                ":8081",
                "--metrics-auth",
                "--metrics-cert-path",
                "/certs",
                "--metrics-cert-name=c.pem",
                "--metrics-cert-key=k.pem",
                "--workers",
                "4",
                "--sync-timeout",
                "2m",
                "--leader-elect=true",
                "--leader-election-namespace",
                "ns",
                "--leader-election-id",
                "id",
                "--log-level",
                "warning",
            ]
        )
    )
    assert cfg == PodControllerConfig(
        kubeconfig="/k",
        priority_class_defaults="/p.yaml",
        qps=5.0,
        burst=10,
        metrics_addr="0",
        health_probe_addr=":8081",
        metrics_auth=True,
        metrics_cert_path="/certs",
        metrics_cert_name="c.pem",
        metrics_cert_key="k.pem",
        workers=4,
        sync_timeout=120.0,
        leader_elect=True,
        leader_election_namespace="ns",
        leader_election_id="id",
        log_level="warning",
    )


def test_demo_defaults_and_flags(tmp_path: Any) -> None:
    assert sim_cli.demo_options(cli.parse_args(["demo"])) == DemoOptions()
    opts = sim_cli.demo_options(
        cli.parse_args(
            [
                "demo",
                "--workloads",
                str(tmp_path),
                "--keep-running",
                "--timeout",
                "2m",
                "--quiet",
                "--json",
                "--kubeconfig-out",
                "/tmp/k",
                "--seed",
                "7",
            ]
        )
    )
    assert opts == DemoOptions(
        workloads_dir=str(tmp_path),
        keep_running=True,
        timeout=120.0,
        quiet=True,
        json_summary=True,
        kubeconfig_out="/tmp/k",
        seed=7,
    )


def test_sim_and_misc_parsing() -> None:
    ns = cli.parse_args(["sim", "apiserver", "--port", "0", "--kubeconfig-out", "/tmp/k"])
    assert (ns.command, ns.sim_command, ns.port, ns.kubeconfig_out) == (
        "sim",
        "apiserver",
        0,
        "/tmp/k",
    )
    ns = cli.parse_args(["sim", "shard", "--port", "9000", "--kubeconfig", "/k"])
    assert (ns.sim_command, ns.port, ns.kubeconfig) == ("shard", 9000, "/k")
    assert cli.parse_args(["install-crds"]).kubeconfig is None
    ns = cli.parse_args(
        ["events", "--addr", "h:1", "--kind", "a", "--kind", "b", "--max-events", "3"]
    )
    assert (ns.addr, ns.kind, ns.max_events) == ("h:1", ["a", "b"], 3)
    assert cli.parse_args(["events"]).addr == "127.0.0.1:8770"


# ------------------------------------------------------------------------------ startup errors


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["operator", "--shard-addr", "s:1"], "operator: --cluster-id is required"),
        (["operator", "--cluster-id", "c"], "operator: --shard-addr is required"),
        (
            ["operator", "--cluster-id", "c", "--shard-addr", "s:1", "--tls-cert", "/c"],
            "operator: --tls-cert, --tls-key and --tls-ca must be set together "
            "(missing --tls-key, --tls-ca)",
        ),
        (
            [
                "operator",
                "--cluster-id",
                "c",
                "--shard-addr",
                "s:1",
                "--bootstrap-template-file",
                "/nonexistent/bootstrap.j2",
            ],
            "operator: read bootstrap-template-file: /nonexistent/bootstrap.j2: "
            "No such file or directory",
        ),
        (
            ["operator", "--rollup-interval", "5x"],
            "operator: argument --rollup-interval: invalid duration '5x': unknown unit 'x' "
            "(use ns, us, ms, s, m, h)",
        ),
        (["operator", "--bogus"], "operator: unrecognized arguments: --bogus"),
        (["operator", "--qps", "lots"], "operator: argument --qps: invalid number 'lots'"),
        (
            ["operator", "--leader-elect=maybe"],
            "operator: argument --leader-elect: invalid boolean 'maybe' (use true or false)",
        ),
        (
            ["operator", "--cluster-id", "c", "--shard-addr", "s:1", "--log-level", "loud"],
            "operator: --log-level must be one of debug, info, warning, error (got 'loud')",
        ),
        (
            ["pod-controller", "--priority-class-defaults", "/nonexistent.yaml"],
            "pod-controller: priority-class-defaults: read /nonexistent.yaml: "
            "No such file or directory",
        ),
        (["pod-controller", "--workers", "0"], "pod-controller: --workers must be >= 1 (got 0)"),
        (["sim", "apiserver"], "sim apiserver: --kubeconfig-out is required"),
        (
            ["sim", "shard", "--port", "70000"],
            "sim shard: argument --port: invalid port '70000': must be 0..65535",
        ),
        (["sim"], "sim: a component is required (apiserver, shard or cluster)"),
        (
            ["demo", "--workloads", "/nonexistent-dir"],
            "demo: --workloads: /nonexistent-dir: not a directory",
        ),
        (["events", "--max-events", "-1"], "events: --max-events must be >= 0"),
        (
            ["events", "--kind", "rollup", "--kind", "acks"],
            "events: unknown --kind 'acks' (see events --help for the kinds)",
        ),
        (
            [],
            "bigfleet-trio: a command is required (operator, pod-controller, sim, install-crds, "
            "demo, events); see --help",
        ),
        (["frobnicate"], None),
    ],
)
def test_startup_errors_one_line_exit_2_or_1(
    argv: list[str], line: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error (the command line itself) exits 2, a file a flag names that cannot be used
    exits 1 (docs/reference.md#exit-codes); either way one line."""
    file_problem = line is not None and any(w in line for w in (
        "No such file", "not a directory"))
    assert cli.main(argv) == (1 if file_problem else 2)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    if line is None:
        assert lines[0].startswith("bigfleet-trio: argument COMMAND: invalid choice: 'frobnicate'")
    else:
        assert lines[0] == line
    assert captured.out == ""


def _sim_components() -> list[str]:
    import argparse

    root = cli.build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    sim = sub.choices["sim"]
    return list(next(a for a in sim._actions
                     if isinstance(a, argparse._SubParsersAction)).choices)


def test_sim_without_a_component_lists_every_component(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The usage line names each component the parser has, and the module docstring shows
    each one's command line."""
    components = _sim_components()
    assert cli.main(["sim"]) == 2
    err = capsys.readouterr().err
    listed = err.split("(", 1)[1].split(")", 1)[0].replace(" or ", ", ").split(", ")
    assert listed == components
    for name in components:
        assert f"bigfleet-trio sim {name} " in cli.__doc__


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["operator", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--cluster-id", "--shard-addr", "--rollup-interval", "--tls-ca", "--metrics-addr"):
        assert flag in out
    assert cli.main(["events", "--help"]) == 0
    out = capsys.readouterr().out
    for kind in ("cr_acknowledged", "upcoming_node_written", "drain_started", "drain_finished"):
        assert f"\n  {kind} " in out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "bigfleet-trio 0.1.0"


# ------------------------------------------------------------------------------ dispatch


def test_a_command_needing_an_extra_not_installed_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = cli.importlib.import_module

    def missing(name: str) -> Any:
        if name == "bigfleet_trio.operator.app":  # as if it imported kopf, not installed
            raise ModuleNotFoundError("No module named 'kopf'", name="kopf")
        return real(name)

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    assert cli.main(["operator", "--cluster-id", "c", "--shard-addr", "s:1"]) == 1
    (line,) = _err_lines(capsys)
    assert line == "operator: needs kopf, not installed: pip install 'bigfleet-trio[bench]'"


def test_a_broken_import_is_not_disguised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "bigfleet_trio.operator.app", None)
    with pytest.raises(ImportError, match="bigfleet_trio.operator.app"):
        cli.main(["operator", "--cluster-id", "c", "--shard-addr", "s:1"])
    assert "not available" not in capsys.readouterr().err


def test_operator_dispatch_gets_validated_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    tpl = tmp_path / "t.j2"
    tpl.write_text("#cloud-config {{ cluster_id }}\n")
    seen: list[OperatorConfig] = []

    def run_operator(cfg: OperatorConfig) -> int:
        seen.append(cfg)
        return 7

    _fake_module(monkeypatch, "bigfleet_trio.operator.app", run_operator=run_operator)
    rc = cli.main(
        [
            "operator",
            "--cluster-id",
            "c",
            "--shard-addr",
            "s:1",
            "--rollup-interval",
            "0",
            "--bootstrap-template-file",
            str(tpl),
        ]
    )
    assert rc == 7
    (cfg,) = seen
    assert cfg.agent.session.rollup_interval == 10.0  # Go: 0 means the default
    assert cfg.bootstrap_template == "#cloud-config {{ cluster_id }}\n"


def test_run_function_exception_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run_pod_controller(cfg: PodControllerConfig) -> int:
        raise FileNotFoundError("kubeconfig: no configuration found")

    _fake_module(
        monkeypatch, "bigfleet_trio.podcontroller.app", run_pod_controller=run_pod_controller
    )
    assert cli.main(["pod-controller"]) == 1
    assert _err_lines(capsys) == ["pod-controller: kubeconfig: no configuration found"]


def test_run_function_keyboard_interrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_demo(opts: DemoOptions) -> int:
        raise KeyboardInterrupt

    _fake_module(monkeypatch, "bigfleet_trio.sim.demo", run_demo=run_demo)
    assert cli.main(["demo"]) == 130


def test_sim_and_demo_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    _fake_module(
        monkeypatch,
        "bigfleet_trio.sim.apiserver",
        run_cli=lambda port, out: calls.append(("api", port, out)) or 0,
    )
    _fake_module(
        monkeypatch,
        "bigfleet_trio.sim.shard",
        run_cli=lambda port, kc, host: calls.append(("shard", port, kc)) or 0,
    )
    _fake_module(
        monkeypatch,
        "bigfleet_trio.sim.demo",
        run_demo=lambda opts: calls.append(("demo", opts)) or 0,
    )
    assert cli.main(["sim", "apiserver", "--port", "0", "--kubeconfig-out", "/tmp/x"]) == 0
    assert cli.main(["sim", "shard", "--port", "9000"]) == 0
    assert cli.main(["demo", "--quiet"]) == 0
    assert calls == [
        ("api", 0, "/tmp/x"),
        ("shard", 9000, None),
        ("demo", DemoOptions(quiet=True)),
    ]


def test_events_command_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(cli, "_run_events", lambda *a: seen.append(a) or 0)
    assert cli.main(["events", "--addr", "h:1", "--kind", "reclaim", "--max-events", "2"]) == 0
    assert seen == [("h:1", ["reclaim"], 2, None, None)]
    seen.clear()
    assert cli.main(["events", "--addr", "h:1", "--insecure-skip-tls-verify"]) == 0
    (args,) = seen
    assert args[4] is not None and args[4].check_hostname is False  # the TLS client context


def test_events_tls_flag_conflicts_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["events", "--insecure-skip-tls-verify", "--certificate-authority",
                     "/ca.pem"]) == 2
    assert "--insecure-skip-tls-verify contradicts --certificate-authority" in _err_lines(
        capsys)[-1]
    assert cli.main(["events", "--certificate-authority", "/nonexistent/ca.pem"]) == 1
    assert _err_lines(capsys)[-1] == ("events: --certificate-authority: read /nonexistent/ca.pem: "
                                      "No such file or directory")


def test_events_command_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["events", "--addr", "127.0.0.1:1"]) == 1
    lines = _err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("events: ")


def test_python_dash_m(monkeypatch: pytest.MonkeyPatch) -> None:
    import runpy

    monkeypatch.setattr(sys, "argv", ["bigfleet_trio", "--version"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("bigfleet_trio", run_name="__main__")
    assert info.value.code == 0


# ------------------------------------------------------------------------------ install-crds

CRD_YAML = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: capacityrequests.bigfleet.lucy.sh}
spec: {group: bigfleet.lucy.sh, v: 1}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: upcomingnodes.bigfleet.lucy.sh}
spec: {group: bigfleet.lucy.sh, v: 2}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: availablecapacities.bigfleet.lucy.sh}
spec: {group: bigfleet.lucy.sh, v: 3}
"""


def test_load_crds_rejects_non_crd() -> None:
    with pytest.raises(ValueError, match="expected CustomResourceDefinition, got ConfigMap"):
        load_crds("kind: ConfigMap\nmetadata: {name: x}\n")
    assert [d["metadata"]["name"] for d in load_crds(CRD_YAML)] == [
        "capacityrequests.bigfleet.lucy.sh",
        "upcomingnodes.bigfleet.lucy.sh",
        "availablecapacities.bigfleet.lucy.sh",
    ]


async def test_apply_crds_create_update_unchanged(nursery: Any) -> None:
    import copy

    from bigfleet_trio.kube.resources import CRDS
    from bigfleet_trio.sim.apiserver import ApiServer
    from tests.support.kube import RecordingKube

    crds = load_crds()  # the project's three CRDs
    kube = RecordingKube.over_sim(nursery, ApiServer(crd_paths=[]))
    older = copy.deepcopy(crds[1])  # upcomingnodes: an older spec is installed
    older["spec"]["names"]["shortNames"] = ["unold"]
    rv = kube.seed(CRDS, older)["metadata"]["resourceVersion"]
    kube.seed(CRDS, copy.deepcopy(crds[2]))  # availablecapacities: as in the files
    kube.server.faults.fail_next(code=409, verb="update", resource="customresourcedefinitions")
    result = await apply_crds(kube, crds, CRDS)
    assert result == [
        ("capacityrequests.bigfleet.lucy.sh", "created"),
        ("upcomingnodes.bigfleet.lucy.sh", "configured"),
        ("availablecapacities.bigfleet.lucy.sh", "unchanged"),
    ]
    updates = kube.of("update")
    assert [r.name for r in updates] == ["upcomingnodes.bigfleet.lucy.sh"] * 2  # one conflict
    body = updates[-1].body
    assert body["metadata"]["resourceVersion"] == rv
    assert body["spec"] == crds[1]["spec"]
    live = kube.objects(CRDS)
    assert live["upcomingnodes.bigfleet.lucy.sh"]["spec"] == crds[1]["spec"]
    assert live["capacityrequests.bigfleet.lucy.sh"]["spec"] == crds[0]["spec"]


def test_install_crds_bad_kubeconfig_one_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import bigfleet_trio.install as install

    monkeypatch.setattr(install, "load_crds", lambda text=None: load_crds(CRD_YAML))
    assert cli.main(["install-crds", "--kubeconfig", str(tmp_path / "missing")]) == 1
    lines = _err_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("install-crds: ")


def test_sim_apiserver_unwritable_kubeconfig_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    missing = tmp_path / "no-such-dir" / "kubeconfig"
    assert cli.main(["sim", "apiserver", "--port", "0", "--kubeconfig-out", str(missing)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sim apiserver: cannot write kubeconfig"), err


def test_sim_apiserver_port_in_use_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["sim", "apiserver", "--port", str(port), "--kubeconfig-out", str(tmp_path / "k")]
        assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    # as every other command says it (was: "sim apiserver: [Errno 98] Address already in use")
    assert len(err) == 1 and err[0].startswith(
        f"sim apiserver: cannot listen on 127.0.0.1:{port}: "), err


# ------------------------------------------------------------------------------ --catalog, --seed


def test_sim_shard_and_demo_catalog_flags_parse() -> None:
    ns = cli.parse_args(["sim", "shard"])
    assert (ns.catalog, ns.seed) == (None, None)
    ns = cli.parse_args(["sim", "shard", "--catalog", "c.yaml", "--seed", "42"])
    assert (ns.catalog, ns.seed) == ("c.yaml", 42)
    ns = cli.parse_args(["sim", "shard", "-catalog=c.yaml", "-seed=-3"])
    assert (ns.catalog, ns.seed) == ("c.yaml", -3)
    ns = cli.parse_args(["demo"])
    assert ns.catalog is None
    assert sim_cli.demo_options(ns) == DemoOptions()
    ns = cli.parse_args(["demo", "--catalog", "d.yaml", "--seed", "3"])
    assert ns.catalog == "d.yaml"
    assert sim_cli.demo_options(ns) == DemoOptions(seed=3)


def test_sim_shard_and_demo_catalog_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    _fake_module(
        monkeypatch,
        "bigfleet_trio.sim.shard",
        run_cli=lambda port, kc, **kw: calls.append(("shard", port, kc, kw)) or 0,
    )
    _fake_module(
        monkeypatch,
        "bigfleet_trio.sim.demo",
        run_demo=lambda opts, *rest: calls.append(("demo", opts, rest)) or 0,
    )
    assert cli.main(["sim", "shard", "--catalog", "c.yaml", "--seed", "5"]) == 0
    assert cli.main(["sim", "shard", "--seed", "0", "--kubeconfig", "kc"]) == 0
    assert cli.main(["sim", "shard"]) == 0
    assert cli.main(["demo", "--catalog", "d.yaml"]) == 0
    assert cli.main(["demo"]) == 0
    assert calls == [
        ("shard", 0, None, {"catalog_file": "c.yaml", "seed": 5, "host": "127.0.0.1"}),
        ("shard", 0, "kc", {"seed": 0, "host": "127.0.0.1"}),
        ("shard", 0, None, {"host": "127.0.0.1"}),
        ("demo", DemoOptions(), ("d.yaml",)),
        ("demo", DemoOptions(), ()),
    ]


def test_sim_shard_bad_seed_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sim", "shard", "--seed", "x"]) == 2  # a usage error
    assert _err_lines(capsys) == ["sim shard: argument --seed: invalid integer 'x'"]


@pytest.mark.parametrize("command", [["sim", "shard"], ["demo"]])
def test_bad_catalog_file_is_one_line_exit_1(
    command: list[str], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = " ".join(command)
    missing = str(tmp_path / "missing.yaml")
    assert cli.main([*command, "--catalog", missing]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"{name}: {missing}: cannot read: No such file or directory"
    ]
    assert captured.out == ""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "shapes:\n  - instanceType: t\n    zones: [z]\n    allocatable: {memory: 1GB}\n"
        "    pricePerHour: 1\n"
    )
    assert cli.main([*command, "--catalog", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"{name}: {bad}: shapes[0].allocatable.memory: invalid quantity '1GB': "
        "unexpected character 'B'"
    ]
    assert captured.out == ""


def test_readme_commands_parse_and_use_venv_paths() -> None:
    """Every ``bigfleet-trio`` command in the README's shell blocks is accepted by the parser as
    written, and commands after the first block call the virtualenv's binaries by path (the
    deploy section addresses a real cluster, with the user's own kubectl: not checked here)."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "../" + "shared" not in text  # specs outside the repository are never cited
    sections = re.split(r"^## ", text, flags=re.M)
    text = "".join(s for s in sections if not s.startswith("Deploy"))
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    commands: list[list[str]] = []
    for block in blocks[1:]:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and "=" in words[0]:
                words = words[1:]  # VAR=value prefixes
            if not words:
                continue
            if words[0] in ("bigfleet-trio", "kubectl"):
                raise AssertionError(f"README: use .venv/bin/{words[0]}: {line.strip()}")
            if words[0] == ".venv/bin/bigfleet-trio":
                commands.append(words[1:])
    assert len(commands) >= 5
    for argv in commands:
        cli.parse_args(argv)  # raises UsageError on an unknown flag or command


def test_ci_runs_the_readme_first_block_verbatim() -> None:
    """.ci/run runs the README's first two commands as written (set up + demo, then the
    tests), and refuses to run if the README's block no longer says what it runs."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    extract = ci.split("readarray -t FIRST < <(", 1)[1].split(")\n", 1)[0]
    readme = subprocess.run(
        ["bash", "-c", extract], cwd=root, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    setup = (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]'"
        " && .venv/bin/bigfleet-trio demo"
    )
    assert readme == [setup, ".venv/bin/python -m pytest -q"]
    lines = ci.splitlines()
    assert setup in lines and ".venv/bin/python -m pytest -q" in lines  # run as commands


def test_readme_development_commands() -> None:
    """The README's Development lines: the dev extra has the tools it names, and the bench's
    --help runs."""
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert ("`.venv/bin/pip install -e '.[dev]'` adds pyinstrument and pre-commit (the `test`"
            " extra\n  already brings ruff, mypy and import-linter)") in readme
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()
                for d in extras[extra]}

    assert {"pyinstrument", "pre-commit"} <= names("dev")
    assert {"ruff", "mypy", "import-linter"} <= names("test")
    assert not {"ruff", "mypy"} & names("dev")  # said once, in the extra CI installs
    assert "`.venv/bin/python -m scripts.bench --help`" in readme
    out = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "fleet" in out


def test_without_the_sim_the_binaries_parse_and_sim_commands_are_absent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The production image carries no bigfleet_trio/sim: the CLI finds the sim's commands by
    # module path and, without them, still serves both binaries.
    monkeypatch.setitem(sys.modules, cli.SIM_COMMANDS, None)
    assert cli.sim_commands() is None
    assert cli.parse_args(["operator", "--cluster-id", "c"]).command == "operator"
    assert cli.main(["demo"]) == 2  # not a command of this build: a usage error
    err = _err_lines(capsys)
    assert len(err) == 1 and "invalid choice: 'demo'" in err[0]
    helptext = cli.build_parser().format_help()
    assert "pod-controller" in helptext and "demo" not in helptext


@pytest.mark.parametrize("argv", [["operator"], ["pod-controller"], ["sim", "shard"], ["demo"],
                                  ["events"], ["install-crds"], ["sim", "apiserver"]])
def test_version_on_every_subcommand(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from bigfleet_trio import __version__

    assert cli.main([*argv, "--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bigfleet-trio {__version__}"


def test_both_binaries_fail_through_one_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator and the pod controller report a start-up failure the same way: the run
    function raises, the CLI prints one line and exits 1 (the pod controller printed and
    returned 1 itself)."""
    from bigfleet_trio.kube.errors import KubeConfigError
    from bigfleet_trio.podcontroller.app import run_pod_controller

    missing = str(tmp_path / "nope")
    with pytest.raises(KubeConfigError):
        run_pod_controller(PodControllerConfig(kubeconfig=missing, metrics_addr="0"))
    for argv in (["pod-controller", "--kubeconfig", missing],
                 ["operator", "--cluster-id", "c", "--shard-addr", "s:1", "--kubeconfig",
                  missing]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err.splitlines()
        assert err[-1].startswith(f"{argv[0]}: ") and missing in err[-1], err
        assert not any("Traceback" in ln for ln in err)


def test_ctrl_c_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*a: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_events", interrupted)
    assert cli.main(["events"]) == 130
    assert capsys.readouterr().err == "events: interrupted\n"


def test_shard_addr_takes_the_form_the_demo_prints() -> None:
    """The demo and ``sim shard`` print ``grpc://127.0.0.1:PORT``; --shard-addr takes it."""
    from bigfleet_trio.shard.grpc import parse_address

    cfg = cli.operator_config(cli.parse_args(
        ["operator", "--cluster-id", "c", "--shard-addr", "grpc://127.0.0.1:7443"]))
    cfg.validate()
    assert parse_address(cfg.shard_addr) == ("127.0.0.1", 7443)
    assert parse_address("grpc://[::1]:7443/") == ("::1", 7443)
    bad = cli.operator_config(cli.parse_args(
        ["operator", "--cluster-id", "c", "--shard-addr", "https://h:443"]))
    with pytest.raises(ConfigError, match="only the grpc:// scheme"):
        bad.validate()


def test_sim_shard_listens_on_loopback_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def run_cli(port: int, kubeconfig: str | None, **kw: Any) -> int:
        seen.append(kw)
        return 0

    _fake_module(monkeypatch, "bigfleet_trio.sim.shard", run_cli=run_cli)
    assert cli.main(["sim", "shard"]) == 0
    assert cli.main(["sim", "shard", "--host", "0.0.0.0"]) == 0
    assert [kw["host"] for kw in seen] == ["127.0.0.1", "0.0.0.0"]


async def test_install_crds_says_each_result_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stdout and stderr together name each CRD once (an INFO log line repeated each one)."""
    import trio

    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig

    api = ApiServer(crd_paths=[])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, api)
        kc = tmp_path / "kc.yaml"
        write_kubeconfig(url, str(kc), ca_pem=api.tls_ca_pem)
        rc = await trio.to_thread.run_sync(cli.main, ["install-crds", "--kubeconfig", str(kc)])
        nursery.cancel_scope.cancel()
    assert rc == 0
    both = capsys.readouterr()
    for crd in load_crds():
        name = crd["metadata"]["name"]
        assert (both.out + both.err).count(name) == 1, (both.out, both.err)


def test_watch_list_knob_reaches_both_binaries_informers() -> None:
    from bigfleet_trio.kube.client import KubeClient
    from bigfleet_trio.kube.config import KubeConfig
    from bigfleet_trio.podcontroller.controller import PodController

    for binary, make in (("operator", cli.operator_config),
                         ("pod-controller", cli.pod_controller_config)):
        extra = ["--cluster-id", "c1", "--shard-addr", "s:1"] if binary == "operator" else []
        assert make(cli.parse_args([binary, *extra])).watch_list is True
        assert make(cli.parse_args([binary, *extra, "--watch-list=false"])).watch_list is False
    client = KubeClient(KubeConfig(server="http://kube.test"))
    ctl = PodController(client, watch_list=True)
    assert ctl.pods.watch_list and ctl.crs.watch_list


def test_kube_api_content_type_knob_is_protobuf_by_default_in_both_binaries() -> None:
    for binary, make in (("operator", cli.operator_config),
                         ("pod-controller", cli.pod_controller_config)):
        extra = ["--cluster-id", "c1", "--shard-addr", "s:1"] if binary == "operator" else []
        assert make(cli.parse_args([binary, *extra])).kube_protobuf is True
        json_only = [binary, *extra, "--kube-api-content-type", "application/json"]
        assert make(cli.parse_args(json_only)).kube_protobuf is False
        with pytest.raises(cli.UsageError, match="invalid choice"):
            cli.parse_args([binary, *extra, "--kube-api-content-type", "application/yaml"])


# ---------------------------------------------------------------------- exit codes, as documented

DOCS_ROOT = Path(__file__).resolve().parents[1]
EXIT_EXAMPLES = {
    "--cluster-id is required": ["operator", "--shard-addr=s:1"],
    "--cluster-id must be a DNS-1123 label": ["operator", "--cluster-id=Prod_EU",
                                              "--shard-addr=s:1"],
    "read bootstrap-template-file: /nonexistent.j2: No such file or directory": [
        "operator", "--cluster-id=c", "--shard-addr=s:1",
        "--bootstrap-template-file=/nonexistent.j2"],
}
"""Each message docs/reference.md#exit-codes gives as an example -> a command line showing it."""


def exit_code_rows() -> dict[int, str]:
    """docs/reference.md's exit-code table: code -> its "when" cell."""
    text = (DOCS_ROOT / "docs" / "reference.md").read_text()
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    return {int(code): when for code, when in re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M)}


def test_the_exit_code_tables_examples_exit_with_their_rows_code(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = exit_code_rows()
    documented = {m for when in (rows[1], rows[2]) for m in re.findall(r"`([^`]+)`", when)
                  if " " in m and not m.startswith("--sync")}
    assert documented == set(EXIT_EXAMPLES), "an example the table gives has no command line here"
    for message, argv in EXIT_EXAMPLES.items():
        code = next(c for c, when in rows.items() if f"`{message}`" in when)
        assert cli.main(argv) == code, message
        assert message in capsys.readouterr().err


def test_the_readme_states_the_exit_codes_of_reference_md() -> None:
    """README's summary names the same codes, and for Ctrl-C the same split: a binary 0, the
    other commands 130 (the commands named alike)."""
    rows = exit_code_rows()
    readme = (DOCS_ROOT / "README.md").read_text()
    summary = " ".join(readme.split("Exit codes (both binaries", 1)[1].split("`--version`")[0]
                       .split())
    claims = dict(re.findall(r"(\d+) ((?:after|for|when)[^;]+)", summary))
    assert {int(c) for c in claims} == set(rows)
    assert "Ctrl-C" in claims["0"] and "SIGINT" in rows[0] and "a binary" in claims["0"]
    assert re.findall(r"`([a-z-]+)`", claims["130"]) == re.findall(r"`([a-z-]+)`", rows[130])


@pytest.mark.slow
async def test_a_binary_exits_0_after_ctrl_c(nursery: Any, tmp_path: Path) -> None:
    """docs/reference.md#exit-codes: SIGINT is an orderly shutdown for a binary, not 130."""
    import signal
    import subprocess

    import httpx
    import trio

    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
    from tests.support.ports import free_port

    url = await nursery.start(serve, ApiServer())
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(url, str(kc))
    port = free_port()
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bigfleet_trio", "pod-controller", "--kubeconfig", str(kc),
         "--metrics-addr", f"127.0.0.1:{port}", "--log-level", "warning"],
        stderr=subprocess.PIPE)
    try:
        with trio.fail_after(30):
            async with httpx.AsyncClient() as http:
                while True:
                    try:
                        if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
            assert "SIGINT" in exit_code_rows()[0]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
