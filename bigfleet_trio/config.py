"""Settings of the two binaries: one :func:`~bigfleet_trio.knobs.knob` field per flag.

:class:`ProcessSettings` (kubeconfig, client rate, diagnostics listeners, leader election, sync
timeout, logging) is embedded in both :class:`OperatorConfig` and :class:`PodControllerConfig`;
the operator nests the shard agent's own settings (``operator.agent.AgentConfig``, with the
session's ``SessionConfig`` inside), the way kopf composes its settings: each component owns
its settings dataclass, this module only composes them. ``cli.py`` generates
every flag from these fields. Validation raises :class:`ConfigError` with one line naming the
flag; messages follow the Go binaries where those have one (``--cluster-id is required``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bigfleet_trio.knobs import (
    DURATION,
    ConfigError,
    ConfigFileError,
    Settings,
    at_least_one,
    default_of,
    dial_addr,
    knob,
    knob_specs,
    listen_addr,
    loopback_addr,
    nested,
    non_negative,
    positive,
    probe_addr,
    read_text,
    rebased,
)
from bigfleet_trio.kube import protowire
from bigfleet_trio.kube.labelselector import LabelSelectorError, parse_label_selector
from bigfleet_trio.kube.leader import leader_timing_problem
from bigfleet_trio.kube.names import is_dns1123_label
from bigfleet_trio.observability.tls import (
    DEFAULT_CERT_NAME,
    DEFAULT_KEY_NAME,
    TLSPlan,
    check_pair,
    plan_tls,
)
from bigfleet_trio.operator.agent import AgentConfig
from bigfleet_trio.operator.session.types import SessionConfig
from bigfleet_trio.podcontroller.scope import DEFAULT_UNMANAGED_NODE_SELECTORS, PodScope

__all__ = [
    "DEFAULT_NAMESPACE",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "OperatorConfig",
    "PodControllerConfig",
    "ProcessSettings",
    "validate_bootstrap_template",
]

LOG_FORMATS = ("text", "json")
KUBE_PROTOBUF = protowire.CONTENT_TYPE
KUBE_CONTENT_TYPES = (KUBE_PROTOBUF, "application/json")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_NAMESPACE = "bigfleet-system"


def _log_level(value: str) -> str | None:
    if value.lower() in LOG_LEVELS + ("warn",):
        return None
    return f"must be one of {', '.join(LOG_LEVELS)}"


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


def _label_selectors(value: str | tuple[str, ...]) -> str | None:
    """Check: each value is a label selector as ``kubectl -l`` takes it ("" allowed: none)."""
    for text in (value,) if isinstance(value, str) else value:
        try:
            parse_label_selector(text)
        except LabelSelectorError as exc:
            return f"is not a label selector: {exc}"
    return None


def _namespaces(value: tuple[str, ...]) -> str | None:
    """Check: each value is a namespace name (a DNS-1123 label)."""
    bad = [ns for ns in value if not is_dns1123_label(ns)]
    return f"must be namespace names (DNS-1123 labels): {', '.join(map(repr, bad))}" if (
        bad) else None


# ------------------------------------------------------------------------------ settings groups


@dataclass(init=False, eq=True)
class ProcessSettings(Settings):
    """Knobs every binary has: Kubernetes client, diagnostics, leader election, logging.

    Embedded (inherited) by :class:`OperatorConfig` and :class:`PodControllerConfig`, which
    may give a knob another default with :func:`rebased`.
    """

    knob_group = "process"

    kubeconfig: str | None = knob(
        None, "kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)", metavar="PATH"
    )
    # A guard against a runaway loop, above what a fleet ramp needs; API Priority and Fairness
    # paces the binaries against the server (docs/kube-api.md#rate-limits).
    qps: float = knob(500.0, "Kubernetes API requests per second (client-side limiter)",
                      check=positive)
    burst: int = knob(1000, "Kubernetes API request burst above --qps", check=at_least_one)
    metrics_addr: str = knob(
        "127.0.0.1:8770", "diagnostics listener (/metrics, /healthz, /readyz; the operator adds "
        "/events); loopback unless given (':8770' is every interface: add --metrics-auth); "
        "0 disables", metavar="ADDR",
        check=listen_addr,
    )
    metrics_auth: bool = knob(
        False, "serve /metrics and /events only to callers whose bearer token passes "
        "TokenReview and SubjectAccessReview (get on the path; docs/crds.md#diagnostics-access), "
        "over HTTPS",
    )
    metrics_cert_path: str | None = knob(
        None, "directory with the metrics listener's TLS certificate and key (a mounted "
        "kubernetes.io/tls Secret, e.g. cert-manager's), re-read when they change; serves "
        "HTTPS. Default with --metrics-auth: a self-signed certificate generated at start "
        "(docs/crds.md#diagnostics-tls)", metavar="DIR",
    )
    metrics_cert_name: str = knob(
        DEFAULT_CERT_NAME, "certificate (PEM, leaf first) file name in --metrics-cert-path",
        metavar="NAME")
    metrics_cert_key: str = knob(
        DEFAULT_KEY_NAME, "private key (PEM, unencrypted) file name in --metrics-cert-path",
        metavar="NAME")
    metrics_plain_http: bool = knob(
        False, "with --metrics-auth, serve plain HTTP anyway: only with a loopback "
        "--metrics-addr (a proxy in the same pod, kubectl port-forward), where no token "
        "crosses a network",
    )
    enable_profiling: bool = knob(
        False, "serve GET /debug/tasks (the live Trio task tree) and "
        "GET /debug/pprof/profile?seconds=N (a CPU profile, 1..60 s) on the diagnostics "
        "listener, behind --metrics-auth like /metrics (docs/operate.md#profiling)",
    )
    health_probe_addr: str | None = knob(
        None, "separate plain-HTTP listener for /healthz and /readyz only (default: the "
        "metrics listener)", metavar="HOST:PORT", check=probe_addr,
    )
    leader_elect: bool = knob(False, "hold a Lease; only the leader acts on the cluster")
    leader_election_namespace: str = knob(
        "", "Lease namespace (default: the pod's own, from $POD_NAMESPACE or the in-cluster "
        f"ServiceAccount namespace file, else {DEFAULT_NAMESPACE}; docs/crds.md#leader-election)",
        metavar="NS")
    leader_election_id: str = knob("bigfleet-operator", "Lease name", metavar="NAME")
    # client-go's and controller-runtime's defaults and flag names (docs/rules.md#leadership-loss)
    leader_elect_lease_duration: float = knob(
        15.0, "how long a follower waits after the Lease's last observed change before taking it",
        unit=DURATION, check=positive)
    leader_elect_renew_deadline: float = knob(
        10.0, "how long the leader keeps retrying a renewal before it stops acting",
        unit=DURATION, check=positive)
    leader_elect_retry_period: float = knob(
        2.0, "time between leader-election attempts (renewals and campaigns)",
        unit=DURATION, check=positive)
    watch_list: bool = knob(
        True, "fill informer caches from streaming lists (watches with sendInitialEvents) "
        "instead of paged LISTs; an apiserver that refuses gets paged LISTs "
        "(docs/kube-api.md#streaming-lists)",
    )
    # the client's protobuf switch (kube_protobuf); informers ask only for the kinds the schema
    # carries
    kube_api_content_type: str = knob(
        KUBE_PROTOBUF, "media type the informers of Pods and Nodes ask the apiserver for "
        "(kube-controller-manager's flag): protobuf where the server offers it, JSON "
        "otherwise and always for CRs (docs/kube-api.md#protobuf)",
        choices=KUBE_CONTENT_TYPES, metavar="TYPE",
    )
    disruption_annotations: bool = knob(
        True, "honour karpenter.sh/do-not-disrupt and cluster-autoscaler.kubernetes.io/"
        "safe-to-evict=false: the highest reclamation penalty on the Pod's CapacityRequest, "
        "evicted last and only at a drain's deadline (docs/rules.md#disruption-annotations)",
    )
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

    @property
    def kube_protobuf(self) -> bool:
        """``--kube-api-content-type`` is protobuf: the client's ``protobuf`` switch."""
        return self.kube_api_content_type == KUBE_PROTOBUF

    def validate_process(self) -> None:
        """Cross-knob rules of the process group (leader election names, diagnostics TLS) and
        the metrics certificate files.

        Raises:
            ConfigError: a usage problem (exit 2). ConfigFileError: a certificate or key file
                that is unreadable or not a pair (exit 1; docs/reference.md#exit-codes).
        """
        if self.leader_elect:
            if not self.leader_election_id:
                raise ConfigError("--leader-election-id must not be empty")
            problem = leader_timing_problem(self.leader_elect_lease_duration,
                                            self.leader_elect_renew_deadline,
                                            self.leader_elect_retry_period)
            if problem:
                raise ConfigError(problem)
        for flag, name in (("--metrics-cert-name", self.metrics_cert_name),
                           ("--metrics-cert-key", self.metrics_cert_key)):
            if not name:
                raise ConfigError(f"{flag} must not be empty")
        if self.metrics_plain_http:
            if self.metrics_cert_path:
                raise ConfigError("--metrics-plain-http contradicts --metrics-cert-path")
            if self.metrics_addr.strip() != "0" and not loopback_addr(self.metrics_addr):
                # The opt-out exists for a proxy in the pod's own network namespace; on any
                # other address a bearer token would cross the network in clear text.
                raise ConfigError(
                    f"--metrics-plain-http needs a loopback --metrics-addr (127.0.0.1:PORT or "
                    f"[::1]:PORT), got {self.metrics_addr!r}: elsewhere bearer tokens would "
                    "cross the network in clear text")
        plan = self.metrics_tls()
        if plan.mode == "files" and self.metrics_addr.strip() != "0":
            check_pair(plan.cert_file, plan.key_file)

    def metrics_tls(self) -> TLSPlan:
        """How the metrics listener speaks: files, self-signed or plain
        (:func:`~bigfleet_trio.observability.tls.plan_tls`; docs/crds.md#diagnostics-tls)."""
        return plan_tls(auth=self.metrics_auth, plain_http=self.metrics_plain_http,
                        cert_dir=self.metrics_cert_path, cert_name=self.metrics_cert_name,
                        key_name=self.metrics_cert_key)


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
    keepalive_time: float = knob(
        330.0,
        "HTTP/2 ping interval on the shard stream; 0 disables. Stay at or above the shard's "
        "keepalive enforcement (grpc-go's default: 5m)",
        unit=DURATION, check=non_negative,
    )
    keepalive_timeout: float = knob(20.0, "close the connection when a ping is not answered "
                                    "within this", unit=DURATION, check=positive)
    drain_shutdown_timeout: float = knob(
        30.0, "on SIGTERM, how long running drains may continue", unit=DURATION,
        check=non_negative,
    )
    failed_retention: float = knob(
        600.0, "delete an UpcomingNode once it has been Failed this long; 0 = keep forever",
        unit=DURATION, check=non_negative,
    )
    outcome_wait: float = knob(
        600.0, "a CapacityRequest sent this long with no machine coming for it gets "
        "MachineComing=False/NothingCame and a Warning Event on its Pod",
        unit=DURATION, check=non_negative,
    )
    agent: AgentConfig = nested(AgentConfig, title="reconnect")
    """The shard agent's own settings (its ``session`` nested), ``cluster_id`` left empty."""
    bootstrap_template: str | None = field(default=None, repr=False)
    """Contents of ``bootstrap_template_file`` after ``validate()`` (None = stub)."""

    def validate(self) -> None:
        """Check every knob, the cross-knob rules and the referenced files.

        Raises:
            ConfigError: the first problem found, as one line.
        """
        self.check_knobs()
        self.validate_process()
        if self.agent.session.rollup_interval == 0:
            self.agent.session.rollup_interval = default_of(SessionConfig, "rollup_interval")
        if self.ack_concurrency == 0:
            self.ack_concurrency = default_of(OperatorConfig, "ack_concurrency")
        self.agent_config()
        if self.agent.max_backoff < self.agent.initial_backoff:
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
                read_text(path, flag.lstrip("-"))
        if self.bootstrap_template_file:
            text = read_text(self.bootstrap_template_file, "bootstrap-template-file")
            validate_bootstrap_template(text, self.bootstrap_template_file, self.cluster_id)
            self.bootstrap_template = text
        else:
            self.bootstrap_template = None

    def agent_config(self) -> AgentConfig:
        """The agent's settings with ``cluster_id`` filled in, checked by the session's own
        rules (a zero roll-up interval means the default).

        Raises:
            ConfigError: the session refuses a value (``--send-timeout must be > 0, got 0``).
        """
        session = self.agent.session
        interval = session.rollup_interval or default_of(SessionConfig, "rollup_interval")
        try:
            session = replace(session, cluster_id=self.cluster_id, rollup_interval=interval)
        except ValueError as exc:
            raise _flag_error(self, ("agent", "session"), exc) from None
        return replace(self.agent, session=session)

    @property
    def tls_enabled(self) -> bool:
        """True when mTLS to the shard is configured (all three TLS paths set)."""
        return bool(self.tls_cert and self.tls_key and self.tls_ca)


def _flag_error(settings: Settings, group: tuple[str, ...], exc: ValueError) -> ConfigError:
    """``"<field> must be …"`` from a component's own validation as ``--<flag> must be …``."""
    msg = str(exc)
    for spec in knob_specs(settings):
        if spec.path[:-1] == group and msg.startswith(spec.path[-1] + " "):
            return ConfigError(spec.flag + msg[len(spec.path[-1]):])
    return ConfigError(msg)


@dataclass(init=False, eq=True)
class PodControllerConfig(ProcessSettings):
    """Settings of ``bigfleet-trio pod-controller``.

    The PriorityClass defaults file is checked for readability here; its content is parsed by
    the pod controller itself at start (``podcontroller.defaults``), one parser for one file.
    """

    metrics_addr: str = rebased(ProcessSettings, "metrics_addr", "127.0.0.1:8080")
    leader_election_id: str = rebased(
        ProcessSettings, "leader_election_id", "bigfleet-unschedulable-pod-controller"
    )
    priority_class_defaults: str | None = knob(
        None, "YAML: PriorityClass name -> {interruptionPenalty, reclamationPenalty}",
        metavar="PATH",
    )
    workers: int = knob(16, "concurrent reconciles (distinct Pods)", metavar="N",
                        check=at_least_one)
    # docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out
    unmanaged_node_selector: tuple[str, ...] = knob(
        DEFAULT_UNMANAGED_NODE_SELECTORS,
        "repeatable: a Node matching any of these label selectors is not BigFleet's, and a Pod "
        "bound to it gets no CapacityRequest; giving the flag replaces the defaults, '' = no "
        "Node is unmanaged (and Nodes are not watched)", metavar="SELECTOR",
        check=_label_selectors)
    exclude_namespace: tuple[str, ...] = knob(
        (), "repeatable: Pods of this namespace get no CapacityRequest (kube-system is not "
        "excluded unless named)", metavar="NS", check=_namespaces)
    exclude_pod_selector: str = knob(
        "", "Pods whose labels match this label selector get no CapacityRequest",
        metavar="SELECTOR", check=_label_selectors)

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
                raise ConfigFileError(
                    f"priority-class-defaults: read {self.priority_class_defaults}: {reason}"
                ) from exc

    def pod_scope(self) -> PodScope:
        """The opt-out settings, parsed (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out).

        Raises:
            ConfigError: a selector does not parse (``validate()`` says so first).
        """
        try:
            return PodScope.parse(self.unmanaged_node_selector, self.exclude_namespace,
                                  self.exclude_pod_selector,
                                  disruption_annotations=self.disruption_annotations)
        except LabelSelectorError as exc:
            raise ConfigError(f"is not a label selector: {exc}") from None


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
        raise ConfigFileError(
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
        raise ConfigFileError(f"{line} (test render at start-up)") from exc
