"""Tests for bigfleet_trio.durations and bigfleet_trio.config (settings, defaults, validation)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bigfleet_trio.config import OperatorConfig, PodControllerConfig
from bigfleet_trio.durations import format_duration, parse_duration, parse_go_duration
from bigfleet_trio.knobs import ConfigError, split_host_port
from bigfleet_trio.sim.demo_options import DemoOptions

# ------------------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("1h2m3s", 3723.0),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("0", 0.0),
        ("0s", 0.0),
        ("10", 10.0),
        ("0.5", 0.5),
        (".5s", 0.5),
        ("1.s", 1.0),
        (" 3s ", 3.0),
        ("-1s", -1.0),
        ("+2m", 120.0),
        ("1m0.5s", 60.5),
    ],
)
def test_parse_duration_accepts_go_and_plain_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "text", ["", "  ", "s", "10x", "1d", "ten", "1s2", "--1s", "1 s", "-", "1e3s"]
)
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30m", 1800.0), ("1h30m", 5400.0), ("1.5h", 5400.0), (".5s", 0.5), ("1.s", 1.0),
    ("+5m", 300.0), ("-5m", -300.0), ("0", 0.0), ("+0", 0.0), ("-0", 0.0), ("0s", 0.0),
    ("300ms", 0.3), ("2562047h", 2562047 * 3600.0),  # under Go's int64 nanoseconds
])
def test_parse_go_duration_is_go_time_parse_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("text", [
    "10", "0.5", "-10",  # plain seconds: Go wants a unit on anything but 0
    " 5m", "5m ", "", "+", "5M", "1d", "true", "false", "5m-", "2562048h",  # the last: overflow
])
def test_parse_go_duration_refuses_what_go_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


def test_parse_duration_error_names_unit() -> None:
    with pytest.raises(ValueError, match="unknown unit 'd'"):
        parse_duration("3d")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (10.0, "10s"), (0.5, "500ms"), (90.0, "1m30s"), (7200.0, "2h0m0s"), (600, "10m0s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# ------------------------------------------------------------------------------ host:port


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        (":8770", ("", 8770)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("shard.example.com:443", ("shard.example.com", 443)),
        ("[::1]:80", ("::1", 80)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_split_host_port(addr: str, expected: tuple[str, int]) -> None:
    assert split_host_port(addr) == expected


@pytest.mark.parametrize(
    "addr", ["8770", "host", "host:", "host:x", "host:70000", "::1:80", "[::1]80"]
)
def test_split_host_port_rejects(addr: str) -> None:
    with pytest.raises(ConfigError):
        split_host_port(addr, flag="--metrics-addr")


# ------------------------------------------------------------------------------ OperatorConfig


def _op(**kw: object) -> OperatorConfig:
    base: dict[str, object] = {"cluster_id": "c1", "shard_addr": "shard:9000"}
    base.update(kw)
    return OperatorConfig(**base)  # type: ignore[arg-type]


def test_operator_defaults_match_reference() -> None:
    cfg = OperatorConfig()
    assert cfg.agent.session.rollup_interval == 10.0
    assert cfg.ack_concurrency == 16
    assert cfg.agent.session.dispatch_concurrency == 32
    assert cfg.qps == 500  # a runaway guard above the ramp rate: docs/kube-api.md#rate-limits
    assert cfg.burst == 1000
    assert cfg.bootstrap_ttl == 600
    assert cfg.sync_timeout == 600.0  # Go 30 s; ours outlives a 60 s apiserver outage
    assert cfg.agent.session.send_timeout == 30.0
    assert (cfg.agent.initial_backoff, cfg.agent.max_backoff) == (0.5, 30.0)
    assert cfg.metrics_addr == "127.0.0.1:8770"  # loopback unless exposed (docs/crds.md)
    assert cfg.metrics_auth is False
    assert cfg.leader_elect is False
    assert cfg.leader_election_namespace == ""  # the pod's own (docs/crds.md#leader-election)
    assert cfg.log_format == "text"
    assert cfg.log_level == "info"
    assert cfg.kubeconfig is None


def test_operator_minimal_valid() -> None:
    cfg = _op()
    cfg.validate()
    assert cfg.bootstrap_template is None
    assert cfg.tls_enabled is False


@pytest.mark.parametrize("flag", ["sync_timeout", "send_timeout"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_operator_timeouts_must_be_positive(flag: str, value: float) -> None:
    cfg = _op(**{flag: value})
    with pytest.raises(ConfigError, match=f"^--{flag.replace('_', '-')} must be > 0"):
        cfg.validate()


def test_operator_requires_cluster_id() -> None:
    with pytest.raises(ConfigError, match="^--cluster-id is required$"):
        OperatorConfig(shard_addr="s:1").validate()


def test_operator_requires_shard_addr() -> None:
    with pytest.raises(ConfigError, match="^--shard-addr is required$"):
        OperatorConfig(cluster_id="c").validate()


@pytest.mark.parametrize("addr", ["shard", ":9000", "shard:0", "shard:abc"])
def test_operator_rejects_bad_shard_addr(addr: str) -> None:
    with pytest.raises(ConfigError, match="--shard-addr"):
        _op(shard_addr=addr).validate()


def test_operator_zero_defaults_normalised_like_go() -> None:
    cfg = _op(rollup_interval=0.0, ack_concurrency=0)
    cfg.validate()
    assert cfg.agent.session.rollup_interval == 10.0
    assert cfg.ack_concurrency == 16


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"rollup_interval": -1.0}, "--rollup-interval"),
        ({"ack_concurrency": -1}, "--ack-concurrency"),
        ({"dispatch_concurrency": 0}, "--dispatch-concurrency"),
        ({"qps": 0.0}, "--qps"),
        ({"burst": 0}, "--burst"),
        ({"bootstrap_ttl": -1.0}, "--bootstrap-ttl"),
        ({"drain_shutdown_timeout": -1.0}, "--drain-shutdown-timeout"),
        ({"metrics_addr": "8770"}, "--metrics-addr"),
        ({"health_probe_addr": "nope"}, "--health-probe-addr"),
        ({"log_format": "xml"}, "--log-format"),
        ({"log_level": "loud"}, "--log-level"),
        ({"leader_elect": True, "leader_election_id": ""}, "--leader-election-id"),
        ({"reconnect_initial_backoff": 0.0}, "--reconnect-initial-backoff"),
        (
            {"reconnect_initial_backoff": 5.0, "reconnect_max_backoff": 1.0},
            "--reconnect-max-backoff",
        ),
    ],
)
def test_operator_rejects_bad_values(kw: dict[str, object], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        _op(**kw).validate()


def test_operator_metrics_addr_zero_disables(tmp_path: Path) -> None:
    # With a listener, missing certificate files and plain HTTP off loopback are errors;
    # with none ("0"), neither is looked at.
    missing = str(tmp_path / "absent")
    for kw in ({"metrics_cert_path": missing}, {"metrics_plain_http": True}):
        with pytest.raises(ConfigError):
            _op(metrics_addr="0.0.0.0:8443", **kw).validate()
        _op(metrics_addr="0", **kw).validate()
    assert _op(metrics_addr="0").metrics_addr == "0"


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"tls_cert": "c"}, "--tls-key, --tls-ca"),
        ({"tls_key": "k"}, "--tls-cert, --tls-ca"),
        ({"tls_ca": "a"}, "--tls-cert, --tls-key"),
        ({"tls_cert": "c", "tls_key": "k"}, "--tls-ca"),
        ({"tls_cert": "c", "tls_ca": "a"}, "--tls-key"),
    ],
)
def test_operator_partial_tls_is_an_error(given: dict[str, str], missing: str) -> None:
    with pytest.raises(ConfigError) as info:
        _op(**given).validate()
    assert str(info.value) == (
        f"--tls-cert, --tls-key and --tls-ca must be set together (missing {missing})"
    )


def test_operator_full_tls_needs_readable_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths = {}
    for name in ("cert", "key", "ca"):
        p = tmp_path / f"{name}.pem"
        p.write_text("x")
        paths[f"tls_{name}"] = str(p)
    cfg = _op(**paths)
    cfg.validate()
    assert cfg.tls_enabled
    paths["tls_ca"] = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"^read tls-ca: .*missing\.pem: No such file"):
        _op(**paths).validate()


def test_operator_server_name_without_tls() -> None:
    with pytest.raises(ConfigError, match="--tls-server-name"):
        _op(tls_server_name="shard").validate()


def test_operator_unreadable_template(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nope.j2"
    with pytest.raises(ConfigError) as info:
        _op(bootstrap_template_file=str(missing)).validate()
    assert str(info.value) == f"read bootstrap-template-file: {missing}: No such file or directory"


def test_operator_template_syntax_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.j2"
    p.write_text("#cloud-config\n{% for r in requirements %}\n")
    with pytest.raises(ConfigError, match=r"^parse bootstrap-template-file: line \d+: "):
        _op(bootstrap_template_file=str(p)).validate()


def test_operator_template_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "ok.j2"
    p.write_text("#cloud-config\n# {{ cluster_id }}\n")
    cfg = _op(bootstrap_template_file=str(p))
    cfg.validate()
    assert cfg.bootstrap_template == "#cloud-config\n# {{ cluster_id }}\n"
    assert "bootstrap_template=" not in repr(cfg)


# ------------------------------------------------------------------------------ PodControllerConfig


def test_pod_controller_defaults_match_reference() -> None:
    cfg = PodControllerConfig()
    assert cfg.metrics_addr == "127.0.0.1:8080"
    assert cfg.qps == 500  # a runaway guard above the ramp rate: docs/kube-api.md#rate-limits
    assert cfg.burst == 1000
    assert cfg.workers == 16
    assert cfg.sync_timeout == 600
    assert cfg.priority_class_defaults is None
    assert cfg.leader_election_id == "bigfleet-unschedulable-pod-controller"
    cfg.validate()


def test_pod_controller_priority_defaults_example(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bigfleet_trio.podcontroller.defaults import PenaltyDefaults, load_priority_class_defaults
    from bigfleet_trio.quantity import Quantity

    Q = Quantity.parse

    p = tmp_path / "pc.yaml"
    p.write_text(
        'ml-research: {interruptionPenalty: "8192", reclamationPenalty: "65536"}\n'
        'batch-best-effort: {interruptionPenalty: "16", reclamationPenalty: "0"}\n'
        'partial: {interruptionPenalty: "1"}\n'
    )
    cfg = PodControllerConfig(priority_class_defaults=str(p))
    cfg.validate()  # readable; the content is the pod controller's to parse (one parser)
    defaults = load_priority_class_defaults(cfg.priority_class_defaults)
    assert defaults.get("ml-research") == PenaltyDefaults(Q("8192"), Q("65536"))
    assert defaults.get("batch-best-effort") == PenaltyDefaults(Q("16"), Q("0"))
    assert defaults.get("partial") == PenaltyDefaults(Q("1"), None)


def test_pod_controller_unreadable_defaults(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "x.yaml"
    with pytest.raises(ConfigError) as info:
        PodControllerConfig(priority_class_defaults=str(missing)).validate()
    assert str(info.value) == f"priority-class-defaults: read {missing}: No such file or directory"


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"workers": 0}, "--workers"),
        ({"sync_timeout": 0.0}, "--sync-timeout"),
        ({"qps": -1.0}, "--qps"),
        ({"metrics_addr": "x"}, "--metrics-addr"),
    ],
)
def test_pod_controller_rejects_bad_values(kw: dict[str, object], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        PodControllerConfig(**kw).validate()  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ DemoOptions


def test_demo_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    DemoOptions().validate()
    DemoOptions(workloads_dir=str(tmp_path)).validate()
    with pytest.raises(ConfigError, match="^--workloads: .*: not a directory$"):
        DemoOptions(workloads_dir=str(tmp_path / "nope")).validate()
    with pytest.raises(ConfigError, match="--timeout"):
        DemoOptions(timeout=0).validate()


def test_pod_controller_bad_quantity_fails_startup(  # type: ignore[no-untyped-def]
    tmp_path, capsys
) -> None:
    from bigfleet_trio.cli import main

    p = tmp_path / "pc.yaml"
    p.write_text('ml: {interruptionPenalty: "lots"}\n')
    assert main(["pod-controller", "--priority-class-defaults", str(p)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert re.match(r"^pod-controller: priority-class-defaults: .*ml.*interruptionPenalty", line)


# ------------------------------------------------------------------------------ composed settings


def test_every_knob_has_one_flag_and_flat_keyword() -> None:
    from bigfleet_trio.knobs import knob_specs

    specs = knob_specs(OperatorConfig())
    flags = [s.flag for s in specs]
    assert len(flags) == len(set(flags))
    by_flag = {s.flag: s for s in specs}
    assert by_flag["--send-timeout"].path == ("agent", "session", "send_timeout")
    assert by_flag["--reconnect-max-backoff"].path == ("agent", "max_backoff")
    assert by_flag["--qps"].group == "process"
    cfg = OperatorConfig(send_timeout=7.5, reconnect_max_backoff=9.0, qps=3.0)
    assert (cfg.agent.session.send_timeout, cfg.agent.max_backoff, cfg.qps) == (7.5, 9.0, 3.0)
    with pytest.raises(TypeError, match="unknown setting 'send_timeot'"):
        OperatorConfig(send_timeot=1.0)


def test_a_new_knob_is_one_field() -> None:
    """A knob added to a settings class gets its flag, default, help and check with no other
    edit (what adding an operator flag costs)."""
    from dataclasses import dataclass

    from bigfleet_trio import cli
    from bigfleet_trio.knobs import DURATION, Settings, knob, positive

    @dataclass(init=False, eq=True)
    class Extra(Settings):
        grace_period: float = knob(5.0, "how long to wait", unit=DURATION, check=positive)

    import argparse

    parser = argparse.ArgumentParser()
    cli.add_settings_flags(parser, Extra())
    assert "how long to wait (default 5s)" in " ".join(parser.format_help().split())
    ns = parser.parse_args(["--grace-period", "1m30s"])
    assert cli.settings_from(Extra, ns) == Extra(grace_period=90.0)
    with pytest.raises(ConfigError, match=r"^--grace-period must be > 0 \(got 0s\)$"):
        Extra(grace_period=0.0).check_knobs()


def test_session_knobs_validated_by_the_session_config() -> None:
    from bigfleet_trio.operator.session.types import SessionConfig

    assert SessionConfig("c").send_timeout == OperatorConfig().agent.session.send_timeout
    with pytest.raises(ConfigError, match=r"^--dispatch-concurrency must be >= 1, got 0$"):
        _op(dispatch_concurrency=0).validate()
    cfg = _op(send_timeout=7.5, reconnect_initial_backoff=0.25)
    cfg.validate()
    agent = cfg.agent_config()
    assert (agent.session.send_timeout, agent.initial_backoff) == (7.5, 0.25)


@pytest.mark.parametrize("cluster_id", ["My Cluster", "east_1", "East-1", "-a", "a/b", "x" * 64])
def test_cluster_id_must_be_a_dns_label(cluster_id: str) -> None:
    with pytest.raises(ConfigError, match=r"^--cluster-id must be a DNS-1123 label.*\(got '"):
        _op(cluster_id=cluster_id).validate()


@pytest.mark.parametrize("cluster_id", ["c1", "east-1", "a", "x" * 63])
def test_cluster_id_accepted(cluster_id: str) -> None:
    cfg = _op(cluster_id=cluster_id)
    cfg.validate()
    assert cfg.cluster_id == cluster_id


def test_template_rendered_once_at_start_with_undefined_names_as_errors(  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    p = tmp_path / "t.j2"
    p.write_text("#cloud-config\n# {{ cluster_id }} {{ clusterID }}\n")
    with pytest.raises(ConfigError) as info:
        _op(bootstrap_template_file=str(p)).validate()
    line = str(info.value)
    assert line.startswith(f"render bootstrap-template-file {p}: UndefinedError: ")
    assert "'clusterID' is undefined" in line and "\n" not in line
    p.write_text(
        "#cloud-config\n# {{ cluster_id }} {{ request_id }}\n"
        "{% for r in requirements %}# {{ r.key }} {{ r.operator }} {{ r.values|join(',') }}\n"
        "{% endfor %}"
    )
    _op(bootstrap_template_file=str(p)).validate()


def test_yaml_errors_name_file_line_and_column(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from bigfleet_trio.cli import main
    from bigfleet_trio.knobs import yaml_error_line

    try:
        yaml.safe_load("a: 1\nb: [\n")
    except yaml.YAMLError as exc:
        line = yaml_error_line("f.yaml", exc)
    assert re.fullmatch(r"f\.yaml:3:1: invalid YAML: .+", line), line
    assert yaml_error_line("f.yaml", ValueError("bad\nthing")) == "f.yaml: bad thing"

    p = tmp_path / "pc.yaml"
    p.write_text('ml: {interruptionPenalty: "1"\nbatch: [\n')
    assert main(["pod-controller", "--priority-class-defaults", str(p)]) == 1
    (err,) = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"pod-controller: priority-class-defaults: {p}:2:1: invalid YAML: .+", err)


def test_template_syntax_error_names_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.j2"
    p.write_text("#cloud-config\n{% for r in requirements %}\n")
    with pytest.raises(ConfigError, match=rf"^parse bootstrap-template-file: line \d+: .* in {p}$"):
        _op(bootstrap_template_file=str(p)).validate()


def test_reconnect_max_backoff_nan_refused_at_start() -> None:
    with pytest.raises(ConfigError, match=r"^--reconnect-max-backoff must be > 0 \(got nans\)$"):
        _op(reconnect_max_backoff=float("nan")).validate()


@pytest.mark.parametrize(("lease", "renew", "retry", "wrong"), [
    (10.0, 10.0, 2.0, "--leader-elect-lease-duration must be greater than"),
    (15.0, 2.0, 2.0, "--leader-elect-renew-deadline must be greater than 1.2"),
])
def test_leader_election_timings_are_checked_together(
    lease: float, renew: float, retry: float, wrong: str
) -> None:
    from bigfleet_trio.config import PodControllerConfig
    from bigfleet_trio.knobs import ConfigError

    cfg = PodControllerConfig(leader_elect=True, leader_elect_lease_duration=lease,
                              leader_elect_renew_deadline=renew,
                              leader_elect_retry_period=retry)
    with pytest.raises(ConfigError, match=wrong):
        cfg.validate()
