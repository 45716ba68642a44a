"""The chart's values.schema.json refuses what the binaries refuse (docs/helm.md#values).

Every flag of ``operator`` and ``pod-controller`` (the parsers of bigfleet_trio/cli.py) is in
exactly one of three tables: :data:`MAPPED` (a chart value becomes the flag's value), :data:`FIXED`
(the chart passes a constant or a path it mounts) or :data:`EXTRA_ARGS_ONLY` (reachable only
through ``extraArgs``, checked by the binary at start). A new flag fails
:func:`test_every_flag_is_classified` until it is placed; a mapped flag carries values the binary
accepts and refuses, and the schema must agree on each. The schema checks run with the
``jsonschema`` library (no helm needed); that :data:`MAPPED`'s value -> argument functions are the
chart's own is checked against ``helm template`` where helm is built.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from bigfleet_trio.cli import (
    UsageError,
    build_parser,
    operator_config,
    parse_args,
    pod_controller_config,
)
from bigfleet_trio.knobs import ConfigError
from bigfleet_trio.podcontroller.defaults import (
    PriorityClassDefaultsError,
    parse_priority_class_defaults,
)
from tests.support.helm import CHART, template

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
REQUIRED_VALUES = {"clusterId": "prod-eu-1", "shardAddr": "shard.fleet.example.com:7443"}
REQUIRED_ARGS = {"operator": ["--cluster-id=prod-eu-1", "--shard-addr=shard.example.com:7443"],
                 "pod-controller": []}
COMMANDS = ("operator", "pod-controller")
CONTAINER = {"operator": ("bigfleet-operator", "operator"),
             "pod-controller": ("bigfleet-pod-controller", "pod-controller")}
"""Command -> (Deployment, container) the chart renders it in."""


def _one(flag: str) -> Callable[[Any], list[str]]:
    """A scalar value rendered as ``--flag=value`` (Go's formatting of booleans)."""
    def args(value: Any) -> list[str]:
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return [f"{flag}={text}"]
    return args


def _each(flag: str) -> Callable[[Any], list[str]]:
    """A list rendered as one ``--flag=item`` per item."""
    return lambda value: [f"{flag}={v}" for v in value]


def _unmanaged(value: Any) -> list[str]:
    """null: the binary's defaults (no flag); []: one empty flag (no Node unmanaged)."""
    if value is None:
        return []
    return [f"--unmanaged-node-selector={v}" for v in value] or ["--unmanaged-node-selector="]


def _profiling(value: Any) -> list[str]:
    """Off (the default): no flag, as config/manager renders; anything else as ``_one``."""
    return [] if value is False else _one("--enable-profiling")(value)


def _exclude_pods(value: Any) -> list[str]:
    return [f"--exclude-pod-selector={value}"] if value else []


@dataclass(frozen=True)
class Mapped:
    """A chart value that becomes a flag's value."""

    path: str
    """Dotted values path (``podController.excludeNamespaces``)."""
    args: Callable[[Any], list[str]]
    """The value as the chart renders it into the container's args."""
    accepted: tuple[Any, ...]
    """Values the binary accepts (so must the schema)."""
    refused: tuple[Any, ...]
    """Values the binary refuses (so must the schema)."""


BOOLS = (True, False)
NOT_BOOLS = ("maybe", "2")
LABEL_SELECTORS_OK = ("node-role.kubernetes.io/control-plane", "pool in (system, infra)",
                      "!spot", "tier!=web", "gpu>3", "a.example.com/b=c,d notin (e)",
                      "k==v", "k=")
LABEL_SELECTORS_BAD = ("a in ()", "a=b c", "=x", "a in (b", "Bad_/x=y", "a,,b", "k=v,", "a b",
                       "k>x", "-a=b", "a=" + "v" * 64)

MAPPED: dict[tuple[str, str], Mapped] = {
    ("operator", "--cluster-id"): Mapped(
        "clusterId", _one("--cluster-id"), ("prod-eu-1", "a", "a" * 63, "0-x-9"),
        ("Prod_EU", "prod_eu", "prod eu", "-prod", "prod-", "a" * 64, "prod.eu", "x/y")),
    ("operator", "--shard-addr"): Mapped(
        "shardAddr", _one("--shard-addr"),
        ("shard.example.com:7443", "10.0.0.1:1", "[::1]:443", "grpc://shard:7443",
         "grpc://shard:7443/", "shard:65535"),
        ("shard", "shard:0", ":7443", "shard:65536", "http://shard:1", "shard:port", "::1:443",
         "sh ard:1", "shard:7443/", "[::1:443")),
    ("operator", "--drain-shutdown-timeout"): Mapped(
        "operator.drainShutdownTimeoutSeconds", lambda v: [f"--drain-shutdown-timeout={v}s"],
        (0, 30, 3600), (-1, "30s", "soon")),
    ("operator", "--log-format"): Mapped(
        "logFormat", _one("--log-format"), ("json", "text"), ("xml", "JSON", "")),
    ("pod-controller", "--log-format"): Mapped(
        "logFormat", _one("--log-format"), ("json", "text"), ("xml", "JSON", "")),
    ("operator", "--leader-elect"): Mapped(
        "leaderElection", _one("--leader-elect"), BOOLS, NOT_BOOLS),
    ("pod-controller", "--leader-elect"): Mapped(
        "leaderElection", _one("--leader-elect"), BOOLS, NOT_BOOLS),
    ("operator", "--enable-profiling"): Mapped(
        "enableProfiling", _profiling, BOOLS, NOT_BOOLS),
    ("pod-controller", "--enable-profiling"): Mapped(
        "enableProfiling", _profiling, BOOLS, NOT_BOOLS),
    ("operator", "--metrics-auth"): Mapped(
        "metrics.auth", _one("--metrics-auth"), BOOLS, NOT_BOOLS),
    ("pod-controller", "--metrics-auth"): Mapped(
        "metrics.auth", _one("--metrics-auth"), BOOLS, NOT_BOOLS),
    ("pod-controller", "--unmanaged-node-selector"): Mapped(
        "podController.unmanagedNodeSelectors", _unmanaged,
        (None, [], list(LABEL_SELECTORS_OK)), tuple([s] for s in LABEL_SELECTORS_BAD)),
    ("pod-controller", "--exclude-namespace"): Mapped(
        "podController.excludeNamespaces", _each("--exclude-namespace"),
        ([], ["batch-ci"], ["a", "b" * 63]),
        (["Batch"], ["a.b"], ["b" * 64], ["-a"], ["a_b"])),
    ("pod-controller", "--exclude-pod-selector"): Mapped(
        "podController.excludePodSelector", _exclude_pods, ("", *LABEL_SELECTORS_OK),
        LABEL_SELECTORS_BAD),
}

FIXED: dict[str, frozenset[str]] = {
    "operator": frozenset({"--metrics-addr", "--metrics-cert-path", "--health-probe-addr",
                           "--bootstrap-template-file", "--tls-cert", "--tls-key", "--tls-ca"}),
    "pod-controller": frozenset({"--priority-class-defaults", "--metrics-addr",
                                 "--metrics-cert-path", "--health-probe-addr"}),
}
"""Flags the chart passes with a constant or the path of a volume it mounts."""

EXTRA_ARGS_ONLY: dict[str, frozenset[str]] = {
    "operator": frozenset({
        "--ack-concurrency", "--bootstrap-ttl", "--tls-server-name", "--keepalive-time",
        "--keepalive-timeout", "--failed-retention", "--outcome-wait", "--disruption-annotations",
        "--kubeconfig", "--qps",
        "--burst",
        "--metrics-cert-name", "--metrics-cert-key", "--metrics-plain-http",
        "--leader-election-namespace", "--leader-election-id", "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline", "--leader-elect-retry-period", "--watch-list",
        "--kube-api-content-type", "--sync-timeout", "--log-level", "--rollup-interval",
        "--dispatch-concurrency", "--send-timeout", "--reconnect-initial-backoff",
        "--reconnect-max-backoff", "--logging-format"}),
    "pod-controller": frozenset({
        "--workers", "--disruption-annotations", "--kubeconfig", "--qps", "--burst",
        "--metrics-cert-name",
        "--metrics-cert-key", "--metrics-plain-http", "--leader-election-namespace",
        "--leader-election-id", "--leader-elect-lease-duration", "--leader-elect-renew-deadline",
        "--leader-elect-retry-period", "--watch-list", "--kube-api-content-type",
        "--sync-timeout", "--log-level", "--logging-format"}),
}
"""Flags with no value of their own: ``operator.extraArgs`` / ``podController.extraArgs`` carry
them and the binary checks them at start (docs/helm.md#values)."""


def binary_flags(command: str) -> set[str]:
    """The long flags of one command, from the parser the binary itself builds."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings
            if s.startswith("--") and s not in ("--help", "--version")}


def binary_accepts(command: str, args: list[str]) -> bool:
    """Whether the binary's own parsing and per-flag checks take ``args`` (no files read)."""
    try:
        ns = parse_args([command, *REQUIRED_ARGS[command], *args])
        cfg = operator_config(ns) if command == "operator" else pod_controller_config(ns)
        cfg.check_knobs()
    except (UsageError, ConfigError):
        return False
    return True


def _set(values: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(values)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def schema_accepts(path: str, value: Any) -> bool:
    """Whether the schema takes the chart's defaults with the required values and ``value``
    at ``path`` (helm validates the merged values the same way)."""
    doc = _set({**DEFAULTS, **REQUIRED_VALUES}, path, value)
    return jsonschema.Draft7Validator(SCHEMA).is_valid(doc)


CASES = [pytest.param(cmd, flag, value, ok, id=f"{cmd} {flag}={value!r}"[:90])
         for (cmd, flag), row in MAPPED.items()
         for ok, values in ((True, row.accepted), (False, row.refused)) for value in values]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_is_classified(command: str) -> None:
    mapped = {flag for cmd, flag in MAPPED if cmd == command}
    tables = (mapped, FIXED[command], EXTRA_ARGS_ONLY[command])
    flags = binary_flags(command)
    unplaced = flags - set().union(*tables)
    assert not unplaced, (
        f"{command} flags in no table of {__name__}: {sorted(unplaced)}; a value the chart "
        "maps needs a schema rule and a MAPPED row")
    stale = set().union(*tables) - flags
    assert not stale, f"not {command} flags any more: {sorted(stale)}"
    assert sum(len(t) for t in tables) == len(flags), "a flag in two tables"


@pytest.mark.parametrize(("command", "flag", "value", "ok"), CASES)
def test_the_schema_refuses_what_the_binary_refuses(command: str, flag: str, value: Any,
                                                    ok: bool) -> None:
    row = MAPPED[(command, flag)]
    assert binary_accepts(command, row.args(value)) is ok, "the case's premise"
    assert schema_accepts(row.path, value) is ok


def test_the_refused_cluster_id_of_a_crash_loop() -> None:
    """``Prod_EU`` passed the schema and then crash-looped the operator."""
    assert not binary_accepts("operator", ["--cluster-id=Prod_EU"])
    assert not schema_accepts("clusterId", "Prod_EU")


@pytest.mark.parametrize(("penalty", "ok"), [
    ("8192", True), ("1k", True), ("0.5", True), ("", True),
    ("lots", False), ("8 192", False), ("1kk", False)])
def test_priority_class_penalties_are_quantities_as_the_pod_controller_parses_them(
        penalty: str, ok: bool) -> None:
    """``priorityClassDefaults`` becomes the file the pod controller parses at start."""
    entry = {"ml": {"interruptionPenalty": penalty}}
    try:
        parse_priority_class_defaults(yaml.safe_dump(entry))
        parsed = True
    except PriorityClassDefaultsError:
        parsed = False
    assert parsed is ok, "the case's premise"
    assert schema_accepts("priorityClassDefaults", entry) is ok


def _container_args(docs: list[dict[str, Any]], command: str) -> list[str]:
    deployment, container = CONTAINER[command]
    dep = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == deployment)
    spec = dep["spec"]["template"]["spec"]
    box = next(c for c in spec["containers"] if c["name"] == container)
    args: list[str] = box["args"]
    assert args[0] == command
    # $(VAR) as the kubelet expands it, from the ConfigMaps the chart renders
    maps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}
    env = {e["name"]: maps[ref["name"]][ref["key"]] for e in box.get("env") or []
           if (ref := (e.get("valueFrom") or {}).get("configMapKeyRef"))}
    out = []
    for arg in args[1:]:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("command", "flag", "value", "ok"), CASES)
def test_the_tables_value_to_argument_is_the_charts(command: str, flag: str, value: Any,
                                                    ok: bool) -> None:
    row = MAPPED[(command, flag)]
    skip = () if ok else ("--skip-schema-validation",)
    # --set-json, as a later one wins over an earlier one (a --set would win over all)
    docs = template("--set-json", 'clusterId="prod-eu-1"', "--set-json", 'shardAddr="shard:7443"',
                    "--set-json", f"{row.path}={json.dumps(value)}", *skip)
    got = [a for a in _container_args(docs, command) if a.split("=", 1)[0] == flag]
    assert got == row.args(value)


@pytest.mark.slow
@pytest.mark.parametrize("values", [(), ("--values", str(CHART / "ci" / "full-values.yaml"))],
                         ids=["required-only", "full"])
def test_the_chart_passes_only_mapped_and_fixed_flags(values: tuple[str, ...]) -> None:
    """Anything else in the rendered args came from ``extraArgs``."""
    docs = template("--set", "clusterId=prod-eu-1", "--set", "shardAddr=shard:7443", *values)
    chosen = yaml.safe_load(Path(values[1]).read_text()) if values else {}
    for command, key in (("operator", "operator"), ("pod-controller", "podController")):
        extra = set((chosen.get(key) or {}).get("extraArgs") or [])
        own = {flag for cmd, flag in MAPPED if cmd == command} | FIXED[command]
        for arg in _container_args(docs, command):
            assert arg.split("=", 1)[0] in own or arg in extra, (command, arg)
