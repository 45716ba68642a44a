"""Process configuration for the two binaries and the demo, with Go-compatible validation.

Implements the CLI contract of design.md "Fixed points" and the flag tables of
reference-behavior.md §1 (operator), §9 (bootstrap template), §11 (pod controller). Validation
messages follow the Go binaries (``--cluster-id is required``, ``read bootstrap-template-file: …``,
``priority-class-defaults: parse: …``) so that operators' habits and runbooks carry over.

The dataclasses are plain data: ``cli.py`` fills them from flags, ``validate()`` checks them
(reading the files they name) and raises :class:`ConfigError` with one clear line.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ConfigError",
    "OperatorConfig",
    "PodControllerConfig",
    "DemoOptions",
    "split_host_port",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "DEFAULT_NAMESPACE",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_NAMESPACE = "bigfleet-system"

LogFormat = Literal["text", "json"]


class ConfigError(ValueError):
    """A startup configuration problem; ``str(err)`` is the one line shown to the user."""


def split_host_port(addr: str, *, flag: str = "address") -> tuple[str, int]:
    """Split ``HOST:PORT`` (Go ``net.SplitHostPort`` style) into host and port.

    ``":8770"`` gives ``("", 8770)`` (all interfaces); ``"[::1]:80"`` gives ``("::1", 80)``;
    port 0 is allowed (pick a free port).

    Args:
        addr: the address text.
        flag: flag name used in the error message.

    Returns:
        ``(host, port)`` with host possibly empty.

    Raises:
        ConfigError: no port, a non-numeric port or a port outside 0..65535.
    """
    text = addr.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1 :].startswith(":"):
            raise ConfigError(f"{flag}: invalid address {addr!r} (want HOST:PORT)")
        host, port_text = text[1:end], text[end + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ConfigError(f"{flag}: invalid address {addr!r}: missing port (want HOST:PORT)")
        if ":" in host:
            raise ConfigError(
                f"{flag}: invalid address {addr!r}: IPv6 hosts need brackets ([::1]:PORT)"
            )
    if not port_text.isdigit():
        raise ConfigError(f"{flag}: invalid address {addr!r}: port must be a number")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"{flag}: invalid address {addr!r}: port out of range")
    if host and any(c.isspace() for c in host):
        raise ConfigError(f"{flag}: invalid address {addr!r}: bad host")
    if host.startswith("[") or host.endswith("]"):
        raise ConfigError(f"{flag}: invalid address {addr!r}: bad host")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ConfigError(f"{flag}: invalid address {addr!r}: bad IPv6 host") from exc
    return host, port


def _check_listen_addr(value: str, flag: str, *, allow_disable: bool) -> None:
    if allow_disable and value == "0":
        return
    split_host_port(value, flag=flag)


def _check_readable(path: str, what: str) -> str:
    """Read a text file or raise ``ConfigError("read <what>: <reason>")`` (Go wording)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"read {what}: {path}: {reason}") from exc


def _check_log(fmt: str, level: str) -> None:
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be one of text, json (got {fmt!r})")
    if level.lower() not in LOG_LEVELS + ("warn",):
        raise ConfigError(f"--log-level must be one of debug, info, warning, error (got {level!r})")


def _check_rate(qps: float, burst: int) -> None:
    if not qps > 0:
        raise ConfigError(f"--qps must be > 0 (got {qps:g})")
    if burst < 1:
        raise ConfigError(f"--burst must be >= 1 (got {burst})")


def _check_leader(ns: str, name: str) -> None:
    if not ns:
        raise ConfigError("--leader-election-namespace must not be empty")
    if not name:
        raise ConfigError("--leader-election-id must not be empty")


def validate_bootstrap_template(text: str) -> None:
    """Check that a bootstrap template parses as a sandboxed Jinja2 template.

    Reference §9: a parse error is fatal at startup (``parse bootstrap-template-file: …``).

    Raises:
        ConfigError: on a template syntax error.
    """
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import SandboxedEnvironment

    try:
        SandboxedEnvironment().parse(text)
    except TemplateSyntaxError as exc:
        raise ConfigError(
            f"parse bootstrap-template-file: line {exc.lineno}: {exc.message}"
        ) from exc


def validate_priority_class_defaults(text: str) -> dict[str, dict[str, str | None]]:
    """Parse the PriorityClass defaults YAML (reference §11) and check its shape.

    The top level maps PriorityClass name to ``{interruptionPenalty: "<quantity>",
    reclamationPenalty: "<quantity>"}``; both fields are strings (an unquoted number is an error,
    as in Go), empty/missing gives ``None``, unknown keys are ignored. Quantity syntax is checked
    by the pod controller when it loads the file.

    Returns:
        ``{name: {"interruptionPenalty": str | None, "reclamationPenalty": str | None}}``.

    Raises:
        ConfigError: ``priority-class-defaults: parse: …``.
    """
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        msg = " ".join(str(exc).split())
        raise ConfigError(f"priority-class-defaults: parse: {msg}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            "priority-class-defaults: parse: top level must be a map of PriorityClass name "
            "to {interruptionPenalty, reclamationPenalty}"
        )
    out: dict[str, dict[str, str | None]] = {}
    for name, entry in data.items():
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            raise ConfigError(
                f"priority-class-defaults: parse: PriorityClass {str(name)!r}: expected a map"
            )
        fields: dict[str, str | None] = {}
        for key in ("interruptionPenalty", "reclamationPenalty"):
            value = entry.get(key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f"priority-class-defaults: parse: PriorityClass {str(name)!r} {key}: "
                    f"must be a quoted string, got {value!r}"
                )
            fields[key] = value or None
        out[str(name)] = fields
    return out


@dataclass
class OperatorConfig:
    """Configuration of ``bigfleet-trio operator`` (reference §1 flags; seed 000 operator)."""

    cluster_id: str = ""
    """``--cluster-id``: this cluster's id as the shard knows it. Required."""

    shard_addr: str = ""
    """``--shard-addr``: ``HOST:PORT`` of the shard's gRPC endpoint. Required."""

    kubeconfig: str | None = None
    """``--kubeconfig``: explicit path; ``None`` uses $KUBECONFIG, ~/.kube/config, in-cluster."""

    rollup_interval: float = 10.0
    """``--rollup-interval``: seconds between roll-ups; 0 means the default 10 s (Go)."""

    ack_concurrency: int = 16
    """``--ack-concurrency``: parallel Pending→Acknowledged status patches; 0 means 16."""

    dispatch_concurrency: int = 32
    """``--dispatch-concurrency``: bound on concurrently handled shard instructions."""

    qps: float = 50.0
    """``--qps``: sustained Kubernetes API requests per second (client-side limiter)."""

    burst: int = 100
    """``--burst``: Kubernetes API request burst above ``qps``."""

    bootstrap_template_file: str | None = None
    """``--bootstrap-template-file``: Jinja2 (sandboxed) template; ``None`` selects the stub."""

    bootstrap_ttl: float = 600.0
    """``--bootstrap-ttl``: seconds the rendered bootstrap blob is valid (Go left 0; §18 #12)."""

    tls_cert: str | None = None
    """``--tls-cert``: client certificate (PEM) for mTLS to the shard; all three or none."""

    tls_key: str | None = None
    """``--tls-key``: client private key (PEM) for mTLS to the shard."""

    tls_ca: str | None = None
    """``--tls-ca``: CA bundle (PEM) that signs the shard's server certificate."""

    tls_server_name: str | None = None
    """``--tls-server-name``: SNI / verification name override; ``None`` uses the shard host."""

    metrics_addr: str = ":8770"
    """``--metrics-addr``: listen address for /metrics (and probes unless split); "0" disables."""

    health_probe_addr: str | None = None
    """``--health-probe-addr``: separate listener for /healthz and /readyz; ``None`` = metrics."""

    leader_elect: bool = False
    """``--leader-elect``: hold a Lease; only the leader runs the shard session."""

    leader_election_namespace: str = DEFAULT_NAMESPACE
    """``--leader-election-namespace``: namespace of the Lease."""

    leader_election_id: str = "bigfleet-operator"
    """``--leader-election-id``: name of the Lease."""

    drain_shutdown_timeout: float = 30.0
    """``--drain-shutdown-timeout``: on SIGINT/SIGTERM, seconds running drains may still take."""

    sync_timeout: float = 600.0
    """``--sync-timeout``: seconds to wait for the informer caches at start before exiting 1.
    Go waits 30 s (``cache: initial sync timed out``); ours is 10 min, as the pod controller's:
    an apiserver outage of a minute at start recovers in-process (issue 9), while a permanent
    failure (missing RBAC grant or CRD) still ends in a visible exit and crash-loop."""

    send_timeout: float = 30.0
    """``--send-timeout``: seconds one frame may wait for the shard stream to accept it before
    the session ends and the operator redials (a shard that stopped reading)."""

    reconnect_initial_backoff: float = 0.5
    """``--reconnect-initial-backoff``: first delay before redialling the shard (Go 500 ms)."""

    reconnect_max_backoff: float = 30.0
    """``--reconnect-max-backoff``: cap on the redial delay (Go 30 s)."""

    log_format: str = "text"
    """``--log-format``: ``text`` or ``json``."""

    log_level: str = "info"
    """``--log-level``: ``debug``, ``info``, ``warning`` or ``error``."""

    bootstrap_template: str | None = field(default=None, repr=False)
    """Contents of ``bootstrap_template_file`` after ``validate()`` (``None`` = stub)."""

    def validate(self) -> None:
        """Check required flags, TLS completeness, addresses and referenced files.

        Normalises Go-style zero defaults (``rollup_interval`` 0 → 10 s, ``ack_concurrency``
        0 → 16) and loads ``bootstrap_template`` from ``bootstrap_template_file``.

        Raises:
            ConfigError: the first problem found, as one line (Go wording where Go has one).
        """
        if not self.cluster_id.strip():
            raise ConfigError("--cluster-id is required")
        if not self.shard_addr.strip():
            raise ConfigError("--shard-addr is required")
        host, port = split_host_port(self.shard_addr, flag="--shard-addr")
        if not host:
            raise ConfigError(f"--shard-addr: invalid address {self.shard_addr!r}: missing host")
        if port == 0:
            raise ConfigError(f"--shard-addr: invalid address {self.shard_addr!r}: port 0")
        if self.rollup_interval < 0:
            raise ConfigError(f"--rollup-interval must be >= 0 (got {self.rollup_interval:g}s)")
        if self.rollup_interval == 0:
            self.rollup_interval = 10.0
        if self.ack_concurrency < 0:
            raise ConfigError(f"--ack-concurrency must be >= 0 (got {self.ack_concurrency})")
        if self.ack_concurrency == 0:
            self.ack_concurrency = 16
        if self.dispatch_concurrency < 1:
            raise ConfigError(
                f"--dispatch-concurrency must be >= 1 (got {self.dispatch_concurrency})"
            )
        _check_rate(self.qps, self.burst)
        if self.bootstrap_ttl < 0:
            raise ConfigError(f"--bootstrap-ttl must be >= 0 (got {self.bootstrap_ttl:g}s)")
        if self.drain_shutdown_timeout < 0:
            raise ConfigError(
                f"--drain-shutdown-timeout must be >= 0 (got {self.drain_shutdown_timeout:g}s)"
            )
        if not self.sync_timeout > 0:
            raise ConfigError(f"--sync-timeout must be > 0 (got {self.sync_timeout:g}s)")
        if not self.send_timeout > 0:
            raise ConfigError(f"--send-timeout must be > 0 (got {self.send_timeout:g}s)")
        if self.reconnect_initial_backoff <= 0:
            raise ConfigError("--reconnect-initial-backoff must be > 0")
        if self.reconnect_max_backoff < self.reconnect_initial_backoff:
            raise ConfigError("--reconnect-max-backoff must be >= --reconnect-initial-backoff")
        tls = {"--tls-cert": self.tls_cert, "--tls-key": self.tls_key, "--tls-ca": self.tls_ca}
        set_flags = [k for k, v in tls.items() if v]
        if set_flags and len(set_flags) != 3:
            missing = ", ".join(k for k, v in tls.items() if not v)
            raise ConfigError(
                f"--tls-cert, --tls-key and --tls-ca must be set together (missing {missing})"
            )
        if self.tls_server_name and not set_flags:
            raise ConfigError("--tls-server-name needs --tls-cert, --tls-key and --tls-ca")
        for flag, path in tls.items():
            if path:
                _check_readable(path, flag.lstrip("-"))
        _check_listen_addr(self.metrics_addr, "--metrics-addr", allow_disable=True)
        if self.health_probe_addr:
            _check_listen_addr(self.health_probe_addr, "--health-probe-addr", allow_disable=False)
        if self.leader_elect:
            _check_leader(self.leader_election_namespace, self.leader_election_id)
        _check_log(self.log_format, self.log_level)
        if self.bootstrap_template_file:
            text = _check_readable(self.bootstrap_template_file, "bootstrap-template-file")
            validate_bootstrap_template(text)
            self.bootstrap_template = text
        else:
            self.bootstrap_template = None

    @property
    def tls_enabled(self) -> bool:
        """True when mTLS to the shard is configured (all three TLS paths set)."""
        return bool(self.tls_cert and self.tls_key and self.tls_ca)


@dataclass
class PodControllerConfig:
    """Configuration of ``bigfleet-trio pod-controller`` (reference §10-§11; seed 000 UPC)."""

    kubeconfig: str | None = None
    """``--kubeconfig``: explicit path; ``None`` uses $KUBECONFIG, ~/.kube/config, in-cluster."""

    priority_class_defaults: str | None = None
    """``--priority-class-defaults``: per-PriorityClass penalty defaults YAML (``None``: none)."""

    qps: float = 50.0
    """``--qps``: sustained Kubernetes API requests per second (client-side limiter)."""

    burst: int = 100
    """``--burst``: Kubernetes API request burst above ``qps``."""

    metrics_addr: str = ":8080"
    """``--metrics-addr``: listen address for /metrics (and probes unless split); "0" disables."""

    health_probe_addr: str | None = None
    """``--health-probe-addr``: separate listener for /healthz and /readyz; ``None`` = metrics."""

    workers: int = 16
    """``--workers``: concurrent reconciles (distinct Pods)."""

    sync_timeout: float = 600.0
    """``--sync-timeout``: seconds to wait for informer caches at start (Go: 10 min)."""

    leader_elect: bool = False
    """``--leader-elect``: hold a Lease; only the leader writes CapacityRequests."""

    leader_election_namespace: str = DEFAULT_NAMESPACE
    """``--leader-election-namespace``: namespace of the Lease."""

    leader_election_id: str = "bigfleet-unschedulable-pod-controller"
    """``--leader-election-id``: name of the Lease."""

    log_format: str = "text"
    """``--log-format``: ``text`` or ``json``."""

    log_level: str = "info"
    """``--log-level``: ``debug``, ``info``, ``warning`` or ``error``."""

    priority_class_defaults_data: dict[str, dict[str, str | None]] = field(
        default_factory=dict, repr=False
    )
    """Parsed defaults after ``validate()``: name → {interruptionPenalty, reclamationPenalty}."""

    priority_class_defaults_parsed: Any = field(default=None, repr=False)
    """``podcontroller.defaults.PriorityClassDefaults`` after ``validate()`` (``None`` = none)."""

    def validate(self) -> None:
        """Check rates, addresses and the PriorityClass defaults file.

        Raises:
            ConfigError: the first problem found, as one line (Go wording where Go has one).
        """
        _check_rate(self.qps, self.burst)
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1 (got {self.workers})")
        if not self.sync_timeout > 0:
            raise ConfigError(f"--sync-timeout must be > 0 (got {self.sync_timeout:g}s)")
        _check_listen_addr(self.metrics_addr, "--metrics-addr", allow_disable=True)
        if self.health_probe_addr:
            _check_listen_addr(self.health_probe_addr, "--health-probe-addr", allow_disable=False)
        if self.leader_elect:
            _check_leader(self.leader_election_namespace, self.leader_election_id)
        _check_log(self.log_format, self.log_level)
        if self.priority_class_defaults:
            try:
                with open(self.priority_class_defaults, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ConfigError(
                    f"priority-class-defaults: read {self.priority_class_defaults}: {reason}"
                ) from exc
            self.priority_class_defaults_data = validate_priority_class_defaults(text)
            self.priority_class_defaults_parsed = _parse_quantities(text)
        else:
            self.priority_class_defaults_data = {}
            self.priority_class_defaults_parsed = None


def _parse_quantities(text: str) -> Any:
    """Full check with the pod controller's loader (quantities) when it is importable."""
    try:
        from bigfleet_trio.podcontroller.defaults import (
            PriorityClassDefaultsError,
            parse_priority_class_defaults,
        )
    except ImportError:  # pragma: no cover - the loader ships with the pod controller
        return None
    try:
        return parse_priority_class_defaults(text)
    except PriorityClassDefaultsError as exc:
        raise ConfigError(" ".join(str(exc).split())) from exc


@dataclass
class DemoOptions:
    """Options of ``bigfleet-trio demo`` (issue 7: the one-command laptop demo)."""

    workloads_dir: str | None = None
    """``--workloads DIR``: manifests to apply instead of the bundled real workloads."""

    keep_running: bool = False
    """``--keep-running``: after the scenario, keep serving and print a kubeconfig."""

    timeout: float = 90.0
    """``--timeout``: seconds the whole scenario may take before it fails (exit 1)."""

    quiet: bool = False
    """``--quiet``: no live progress; only the final summary."""

    json_summary: bool = False
    """``--json``: print the final summary as one JSON object instead of a table."""

    kubeconfig_out: str | None = None
    """``--kubeconfig-out``: where to write the embedded apiserver's kubeconfig."""

    seed: int = 1
    """``--seed``: seed of the simulated shard (deterministic inventory and timings)."""

    log_format: str = "text"
    """``--log-format``: ``text`` or ``json``."""

    log_level: str = "warning"
    """``--log-level``: the demo shows progress on stdout, so logs default to warnings."""

    def validate(self) -> None:
        """Check the options.

        Raises:
            ConfigError: a missing workloads directory or a non-positive timeout.
        """
        if self.workloads_dir is not None and not os.path.isdir(self.workloads_dir):
            raise ConfigError(f"--workloads: {self.workloads_dir}: not a directory")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be > 0 (got {self.timeout:g}s)")
        _check_log(self.log_format, self.log_level)


def as_dict(cfg: Any) -> dict[str, Any]:
    """A loggable view of a config: file contents dropped, paths kept (no secrets inside)."""
    from dataclasses import fields

    out: dict[str, Any] = {}
    for f in fields(cfg):
        if f.repr:
            out[f.name] = getattr(cfg, f.name)
    return out
