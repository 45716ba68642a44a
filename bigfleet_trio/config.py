"""Settings of the two binaries, composed from small dataclasses whose fields carry their flags.

Each knob is one dataclass field made with :func:`knob`: its default, help text, unit and check
live there, and ``cli.py`` generates the command-line flag from it (name, ``--help`` line,
``(default …)``), so adding a knob is one edit. :class:`ProcessSettings` (kubeconfig, client
rate, diagnostics listeners, leader election, sync timeout, logging) is embedded in both
:class:`OperatorConfig` and :class:`PodControllerConfig`; the operator nests its shard-session
(:class:`SessionSettings`) and redial (:class:`ReconnectSettings`) knobs the way kopf nests its
settings. Validation raises :class:`ConfigError` with one line naming the flag; messages follow
the Go binaries where those have one (``--cluster-id is required``), so runbooks carry over.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

__all__ = [
    "ConfigError",
    "Knob",
    "KnobSpec",
    "OperatorConfig",
    "PodControllerConfig",
    "ProcessSettings",
    "ReconnectSettings",
    "SessionSettings",
    "Settings",
    "knob",
    "knob_specs",
    "nested",
    "split_host_port",
    "yaml_error_line",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "DEFAULT_NAMESPACE",
    "DURATION",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_NAMESPACE = "bigfleet-system"
DURATION = "duration"
"""Unit of a knob in seconds that the command line takes as a Go duration (``10s``, ``1m30s``)."""


class ConfigError(ValueError):
    """A startup configuration problem; ``str(err)`` is the one line shown to the user."""


# ------------------------------------------------------------------------------ knob machinery

Check = Callable[[Any], "str | None"]
"""A per-knob check: returns what is wrong (``"must be > 0"``) or None; may raise ConfigError
itself when it needs its own wording (addresses, files)."""


@dataclass(frozen=True)
class Knob:
    """Field metadata of one knob (see :func:`knob`)."""

    help: str
    flag: str | None = None
    metavar: str | None = None
    unit: str | None = None
    check: Check | None = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    global_flag: bool = False


_KNOB = "bigfleet.knob"
_NESTED = "bigfleet.nested"


def knob(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    unit: str | None = None,
    check: Check | None = None,
    choices: tuple[str, ...] | None = None,
    required: bool = False,
    global_flag: bool = False,
) -> Any:
    """A settings field that is also a command-line flag.

    Args:
        default: the one default (also shown in ``--help``).
        help: the help line, without the default (added automatically).
        flag: the flag name; default ``--`` + nesting prefix + the field name with ``-``.
        metavar: the value's name in ``--help``.
        unit: :data:`DURATION` for seconds given as Go durations; None otherwise.
        check: the knob's one validation (see :data:`Check`).
        choices: allowed values (checked by the parser and by ``validate()``).
        required: an empty value is ``<flag> is required``.
        global_flag: also accepted before the sub-command (the log flags).
    """
    meta = Knob(help, flag, metavar, unit, check, choices, required, global_flag)
    return field(default=default, metadata={_KNOB: meta})


def nested(cls: type[Settings], *, prefix: str = "", title: str = "") -> Any:
    """A field holding a nested settings group; its flags are ``--<prefix><name>``."""
    return field(default_factory=cls, metadata={_NESTED: (prefix, title)})


def rebased(owner: type[Settings], name: str, default: Any) -> Any:
    """Redeclare an embedded knob with another default (same flag, help and check)."""
    meta = owner.__dataclass_fields__[name].metadata
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class KnobSpec:
    """One knob of a settings tree, as the CLI and the validator see it.

    Attributes:
        path: attribute names from the root (``("session", "send_timeout")``).
        dest: the flat keyword / argparse destination (``send_timeout``).
        flag: ``--send-timeout``.
        knob: the field's :class:`Knob`.
        default: the default in this settings tree.
        group: title of the nested group ("" for the root's own knobs).
    """

    path: tuple[str, ...]
    dest: str
    flag: str
    knob: Knob
    default: Any
    group: str


def knob_specs(settings: Settings) -> list[KnobSpec]:
    """All knobs of ``settings`` (nested groups after the root's own knobs, in field order).

    Knobs a class inherits from :class:`ProcessSettings` form the group ``"process"``.
    """
    own: list[KnobSpec] = []
    groups: list[KnobSpec] = []
    for f, value, prefix, title, path in _walk(settings, "", "", ()):
        meta: Knob = f.metadata[_KNOB]
        flag = meta.flag or "--" + prefix + f.name.replace("_", "-")
        dest = flag.lstrip("-").replace("-", "_")
        spec = KnobSpec(path, dest, flag, meta, value, title)
        (groups if title else own).append(spec)
    return own + groups


def _walk(
    obj: Settings, prefix: str, title: str, path: tuple[str, ...]
) -> Iterator[tuple[Field[Any], Any, str, str, tuple[str, ...]]]:
    process = set(ProcessSettings.__dataclass_fields__)
    for f in fields(obj):
        value = getattr(obj, f.name)
        if _NESTED in f.metadata:
            sub_prefix, sub_title = f.metadata[_NESTED]
            yield from _walk(value, prefix + sub_prefix, sub_title, (*path, f.name))
        elif _KNOB in f.metadata:
            group = title or ("process" if f.name in process and not path else "")
            yield f, value, prefix, group, (*path, f.name)


def _show(value: Any, unit: str | None) -> str:
    if unit == DURATION and isinstance(value, (int, float)):
        return f"{value:g}s"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return repr(value)
    return str(value)


@dataclass(init=False)
class Settings:
    """Base of every settings group: a keyword constructor that also takes nested knobs flat.

    ``OperatorConfig(cluster_id="c", send_timeout=7.5)`` sets ``cfg.session.send_timeout``: a
    keyword is a field of this class, or the flat name (flag without dashes) of a nested knob.

    Raises:
        TypeError: an unknown keyword.
    """

    def __init__(self, **values: Any) -> None:
        for f in fields(self):
            if f.default is not MISSING:
                setattr(self, f.name, f.default)
            elif f.default_factory is not MISSING:
                setattr(self, f.name, f.default_factory())
        own = {f.name for f in fields(self)}
        flat = {s.dest: s.path for s in knob_specs(self)}
        for key, value in values.items():
            if key in own:
                setattr(self, key, value)
            elif key in flat:
                *parents, leaf = flat[key]
                target: Any = self
                for name in parents:
                    target = getattr(target, name)
                setattr(target, leaf, value)
            else:
                raise TypeError(f"{type(self).__name__}: unknown setting {key!r}")

    def check_knobs(self) -> None:
        """Run every knob's own check (required, choices, ``check``) in :func:`knob_specs` order.

        Raises:
            ConfigError: ``<flag> is required`` / ``<flag> <problem> (got <value>)``.
        """
        for spec in knob_specs(self):
            value = self.get(spec.path)
            meta = spec.knob
            if meta.required and not (value.strip() if isinstance(value, str) else value):
                raise ConfigError(f"{spec.flag} is required")
            problem: str | None = None
            if meta.choices is not None and value not in meta.choices:
                problem = f"must be one of {', '.join(meta.choices)}"
            elif meta.check is not None and value is not None:
                try:
                    problem = meta.check(value)
                except ConfigError as exc:
                    raise ConfigError(str(exc).replace("{flag}", spec.flag)) from None
            if problem:
                raise ConfigError(f"{spec.flag} {problem} (got {_show(value, meta.unit)})")

    def get(self, path: tuple[str, ...]) -> Any:
        """The value at ``path`` (see :attr:`KnobSpec.path`)."""
        target: Any = self
        for name in path:
            target = getattr(target, name)
        return target


def default_of(cls: type[Settings], name: str) -> Any:
    """The declared default of knob ``name`` of ``cls``."""
    return cls.__dataclass_fields__[name].default


# ------------------------------------------------------------------------------ checks


def positive(value: float) -> str | None:
    """Check: ``> 0`` (NaN fails)."""
    return None if value > 0 else "must be > 0"


def non_negative(value: float) -> str | None:
    """Check: ``>= 0`` (NaN fails)."""
    return None if value >= 0 else "must be >= 0"


def at_least_one(value: int) -> str | None:
    """Check: ``>= 1``."""
    return None if value >= 1 else "must be >= 1"


def _log_level(value: str) -> str | None:
    if value.lower() in LOG_LEVELS + ("warn",):
        return None
    return f"must be one of {', '.join(LOG_LEVELS)}"


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


def listen_addr(value: str) -> str | None:
    """Check: a listen ``HOST:PORT``, or ``"0"`` (listener disabled)."""
    if value != "0":
        split_host_port(value, flag="{flag}")
    return None


def probe_addr(value: str) -> str | None:
    """Check: a listen ``HOST:PORT`` (no disabling; unset means "the metrics listener")."""
    if value:
        split_host_port(value, flag="{flag}")
    return None


def dial_addr(value: str) -> str | None:
    """Check: ``HOST:PORT`` with a host and a non-zero port."""
    host, port = split_host_port(value, flag="{flag}")
    if not host:
        raise ConfigError(f"{{flag}}: invalid address {value!r}: missing host")
    if port == 0:
        raise ConfigError(f"{{flag}}: invalid address {value!r}: port 0")
    return None


def cluster_id_syntax(value: str) -> str | None:
    """Check: a DNS-1123 label (the id goes into the mTLS client certificate's URI SAN
    ``bigfleet://cluster/<id>`` and into Kubernetes label values, where spaces, capitals or
    slashes would make a different or invalid name)."""
    import re

    if len(value) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
        return None
    return (
        "must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending "
        "with a letter or digit, at most 63 characters"
    )


def yaml_error_line(path: str, exc: BaseException) -> str:
    """One line ``PATH:LINE:COLUMN: problem`` for a YAML parse error (1-based, where the
    parser noticed it), or ``PATH: <message>`` for anything else.

    PyYAML's own text spans several lines and names ``"<unicode string>"`` when it parsed a
    string, so it neither fits the one-line startup error nor says which file.
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        context = getattr(exc, "context", None)
        what = f"{problem} ({context})" if context else str(problem)
        return f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {what}"
    return f"{path}: {' '.join(str(exc).split())}"


def _read(path: str, what: str) -> str:
    """Read a text file or raise ``ConfigError("read <what>: <path>: <reason>")`` (Go wording)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"read {what}: {path}: {reason}") from exc


def _readable(what: str) -> Check:
    def check(path: str) -> str | None:
        if path:
            _read(path, what)
        return None

    return check


# ------------------------------------------------------------------------------ settings groups


@dataclass(init=False, eq=True)
class ProcessSettings(Settings):
    """Knobs every binary has: Kubernetes client, diagnostics, leader election, logging.

    Embedded (inherited) by :class:`OperatorConfig` and :class:`PodControllerConfig`, which
    may give a knob another default with :func:`rebased`.
    """

    kubeconfig: str | None = knob(
        None, "kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)", metavar="PATH"
    )
    qps: float = knob(50.0, "Kubernetes API requests per second (client-side limiter)",
                      check=positive)
    burst: int = knob(100, "Kubernetes API request burst above --qps", check=at_least_one)
    metrics_addr: str = knob(
        ":8770", "/metrics, /healthz, /readyz, /events listener; 0 disables", metavar="ADDR",
        check=listen_addr,
    )
    health_probe_addr: str | None = knob(
        None, "separate listener for /healthz and /readyz (default: the metrics listener)",
        metavar="HOST:PORT", check=probe_addr,
    )
    leader_elect: bool = knob(False, "hold a Lease; only the leader acts on the cluster")
    leader_election_namespace: str = knob(DEFAULT_NAMESPACE, "Lease namespace", metavar="NS")
    leader_election_id: str = knob("bigfleet-operator", "Lease name", metavar="NAME")
    sync_timeout: float = knob(
        600.0,
        # Go waits 30 s for the operator's caches; 10 min (the pod controller's Go value) lets an
        # apiserver outage of a minute at start recover in-process, while a missing RBAC grant
        # or CRD still ends in a visible exit and a crash-loop.
        "informer cache sync deadline at start, then exit 1", unit=DURATION, check=positive,
    )
    log_format: str = knob("text", "log line format", choices=LOG_FORMATS, global_flag=True)
    log_level: str = knob("info", "debug, info, warning or error", metavar="LEVEL",
                          check=_log_level, global_flag=True)

    def validate_process(self) -> None:
        """Cross-knob rules of the process group (leader election names)."""
        if self.leader_elect:
            if not self.leader_election_namespace:
                raise ConfigError("--leader-election-namespace must not be empty")
            if not self.leader_election_id:
                raise ConfigError("--leader-election-id must not be empty")


@dataclass(init=False, eq=True)
class SessionSettings(Settings):
    """The shard session's knobs; :meth:`OperatorConfig.session_config` builds the session's
    own ``SessionConfig`` from them, whose constructor is their one validation (the session
    takes its defaults from here)."""

    rollup_interval: float = knob(10.0, "time between roll-ups; 0 = default", unit=DURATION)
    dispatch_concurrency: int = knob(32, "parallel shard instructions", metavar="N")
    send_timeout: float = knob(
        30.0, "end the shard session when a frame is not accepted within this", unit=DURATION
    )


@dataclass(init=False, eq=True)
class ReconnectSettings(Settings):
    """Redial backoff after a session ends (the agent takes its defaults from here)."""

    initial_backoff: float = knob(0.5, "first redial delay", unit=DURATION, check=positive)
    max_backoff: float = knob(30.0, "redial delay cap", unit=DURATION)


@dataclass(init=False, eq=True)
class OperatorConfig(ProcessSettings):
    """Settings of ``bigfleet-trio operator``.

    ``validate()`` loads ``bootstrap_template`` from ``bootstrap_template_file`` and
    normalises Go's zero defaults (``--rollup-interval 0`` and ``--ack-concurrency 0`` mean
    the default).
    """

    cluster_id: str = knob(
        "", "this cluster's id as the shard knows it (required)", metavar="ID", required=True,
        check=cluster_id_syntax,
    )
    shard_addr: str = knob("", "the shard's gRPC endpoint (required)", metavar="HOST:PORT",
                           required=True, check=dial_addr)
    ack_concurrency: int = knob(16, "parallel CR acknowledgements; 0 = default", metavar="N",
                                check=non_negative)
    bootstrap_template_file: str | None = knob(
        None, "Jinja2 bootstrap template (default: stub cloud-config)", metavar="PATH"
    )
    bootstrap_ttl: float = knob(600.0, "validity of rendered bootstrap data", unit=DURATION,
                                check=non_negative)
    tls_cert: str | None = knob(
        None, "client certificate for mTLS to the shard (with --tls-key, --tls-ca)",
        metavar="PATH",
    )
    tls_key: str | None = knob(None, "client private key", metavar="PATH")
    tls_ca: str | None = knob(None, "CA bundle for the shard", metavar="PATH")
    tls_server_name: str | None = knob(
        None, "expected shard certificate name (default: the --shard-addr host)", metavar="NAME"
    )
    drain_shutdown_timeout: float = knob(
        30.0, "on SIGTERM, how long running drains may continue", unit=DURATION,
        check=non_negative,
    )
    session: SessionSettings = nested(SessionSettings, title="shard session")
    reconnect: ReconnectSettings = nested(ReconnectSettings, prefix="reconnect-",
                                          title="reconnect")
    bootstrap_template: str | None = field(default=None, repr=False)
    """Contents of ``bootstrap_template_file`` after ``validate()`` (None = stub)."""

    def validate(self) -> None:
        """Check every knob, the cross-knob rules and the referenced files.

        Raises:
            ConfigError: the first problem found, as one line.
        """
        self.check_knobs()
        self.validate_process()
        if self.session.rollup_interval == 0:
            self.session.rollup_interval = default_of(SessionSettings, "rollup_interval")
        if self.ack_concurrency == 0:
            self.ack_concurrency = default_of(OperatorConfig, "ack_concurrency")
        self.session_config()
        if self.reconnect.max_backoff < self.reconnect.initial_backoff:
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
                _read(path, flag.lstrip("-"))
        if self.bootstrap_template_file:
            text = _read(self.bootstrap_template_file, "bootstrap-template-file")
            validate_bootstrap_template(text, self.bootstrap_template_file, self.cluster_id)
            self.bootstrap_template = text
        else:
            self.bootstrap_template = None

    def session_config(self) -> Any:
        """The session's ``SessionConfig`` from :attr:`session` (a zero roll-up interval means
        the default).

        Raises:
            ConfigError: the session refuses a value (``--send-timeout must be > 0, got 0``).
        """
        from bigfleet_trio.operator.session import SessionConfig

        values = {f.name: getattr(self.session, f.name) for f in fields(self.session)}
        if not values["rollup_interval"]:
            values["rollup_interval"] = default_of(SessionSettings, "rollup_interval")
        try:
            return SessionConfig(self.cluster_id, **values)
        except ValueError as exc:
            raise _flag_error(self, "session", exc) from None

    def agent_config(self) -> Any:
        """The agent's ``AgentConfig``: :meth:`session_config` plus :attr:`reconnect`."""
        from bigfleet_trio.operator.agent import AgentConfig

        return AgentConfig(
            self.session_config(),
            initial_backoff=self.reconnect.initial_backoff,
            max_backoff=self.reconnect.max_backoff,
        )

    @property
    def tls_enabled(self) -> bool:
        """True when mTLS to the shard is configured (all three TLS paths set)."""
        return bool(self.tls_cert and self.tls_key and self.tls_ca)


def _flag_error(settings: Settings, group: str, exc: ValueError) -> ConfigError:
    """``"<field> must be …"`` from a component's own validation as ``--<flag> must be …``."""
    msg = str(exc)
    for spec in knob_specs(settings):
        if spec.path[:1] == (group,) and msg.startswith(spec.path[-1] + " "):
            return ConfigError(spec.flag + msg[len(spec.path[-1]):])
    return ConfigError(msg)


@dataclass(init=False, eq=True)
class PodControllerConfig(ProcessSettings):
    """Settings of ``bigfleet-trio pod-controller``.

    The PriorityClass defaults file is checked for readability here; its content is parsed by
    the pod controller itself at start (``podcontroller.defaults``), one parser for one file.
    """

    metrics_addr: str = rebased(ProcessSettings, "metrics_addr", ":8080")
    leader_election_id: str = rebased(
        ProcessSettings, "leader_election_id", "bigfleet-unschedulable-pod-controller"
    )
    priority_class_defaults: str | None = knob(
        None, "YAML: PriorityClass name -> {interruptionPenalty, reclamationPenalty}",
        metavar="PATH",
    )
    workers: int = knob(16, "concurrent reconciles (distinct Pods)", metavar="N",
                        check=at_least_one)

    def validate(self) -> None:
        """Check every knob, the leader-election names and that the defaults file is readable.

        Raises:
            ConfigError: the first problem found, as one line.
        """
        self.check_knobs()
        self.validate_process()
        if self.priority_class_defaults:
            try:
                with open(self.priority_class_defaults, encoding="utf-8") as fh:
                    fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ConfigError(
                    f"priority-class-defaults: read {self.priority_class_defaults}: {reason}"
                ) from exc


# ------------------------------------------------------------------------------ file checks


REPRESENTATIVE_REQUIREMENTS = (
    ("topology.kubernetes.io/zone", "In", ("zone-a",)),
    ("node.kubernetes.io/instance-type", "In", ("m5.large",)),
    ("bigfleet.io/spot", "DoesNotExist", ()),
)
"""Requirements of the start-up test render of the bootstrap template (a typical request)."""


def validate_bootstrap_template(text: str, name: str = "", cluster_id: str = "example") -> None:
    """Parse the bootstrap template and render it once against a representative request.

    An undefined variable is an error (the renderer uses ``StrictUndefined``), so a template
    that would fail every BootstrapRequest stops start-up instead of surfacing at provisioning
    time, when each failure only becomes a shortfall on the shard.

    Raises:
        ConfigError: ``parse bootstrap-template-file: line N: …`` on a syntax error, or
            ``render bootstrap-template-file <name>: …`` when the test render fails.
    """
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import SandboxedEnvironment

    try:
        SandboxedEnvironment().parse(text)
    except TemplateSyntaxError as exc:
        where = f" in {name}" if name else ""
        raise ConfigError(
            f"parse bootstrap-template-file: line {exc.lineno}: {exc.message}{where}"
        ) from exc
    from bigfleet_trio.operator.bootstrap import FileRenderer, Requirement

    renderer = FileRenderer(text, name=name or "<bootstrap template>")
    reqs = [Requirement(k, op, v) for k, op, v in REPRESENTATIVE_REQUIREMENTS]
    try:
        renderer.render(cluster_id or "example", "startup-check", reqs)
    except Exception as exc:
        line = " ".join(str(exc).split()).replace(
            "render bootstrap template", "render bootstrap-template-file", 1
        )
        raise ConfigError(f"{line} (test render at start-up)") from exc


def validate_priority_class_defaults(text: str) -> dict[str, dict[str, str | None]]:
    """Shape check of the PriorityClass defaults YAML, kept for callers of the old API.

    The pod controller parses the file with ``podcontroller.defaults`` (quantities included);
    prefer that. Returns ``{name: {"interruptionPenalty": str | None, "reclamationPenalty":
    str | None}}``.

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
        values: dict[str, str | None] = {}
        for key in ("interruptionPenalty", "reclamationPenalty"):
            value = entry.get(key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f"priority-class-defaults: parse: PriorityClass {str(name)!r} {key}: "
                    f"must be a quoted string, got {value!r}"
                )
            values[key] = value or None
        out[str(name)] = values
    return out


def __getattr__(name: str) -> Any:
    # The demo's options moved next to the demo (bigfleet_trio.sim.demo_options); this keeps
    # old imports working without config.py importing the simulation eagerly.
    if name == "DemoOptions":
        from bigfleet_trio.sim.demo_options import DemoOptions

        return DemoOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
