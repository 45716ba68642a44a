"""``bigfleet-trio`` command line: argument parsing only; builds configs and calls ``run``.

Flag names and defaults match the Go binaries, so charts and habits carry over (``-flag`` and
``--flag``, ``--flag=value`` and ``--flag value``, ``--leader-elect`` and ``--leader-elect=true``
are all accepted); the binaries' and the demo's flags are generated from their settings fields
(:mod:`bigfleet_trio.config`). Durations take Go style (``10s``, ``500ms``) or plain seconds.

Sub-commands (``sim`` and ``demo`` only where the simulation is installed: they live in
:mod:`bigfleet_trio.sim.cli`, found by module path)::

    bigfleet-trio operator --cluster-id ID --shard-addr HOST:PORT [...]
    bigfleet-trio pod-controller [--kubeconfig PATH] [--priority-class-defaults PATH] [...]
    bigfleet-trio sim apiserver --port PORT --kubeconfig-out PATH
    bigfleet-trio sim shard --port PORT [--kubeconfig PATH] [--catalog FILE] [--seed N]
    bigfleet-trio sim cluster (--port PORT --kubeconfig-out PATH | --kubeconfig PATH)
    bigfleet-trio install-crds [--kubeconfig PATH]
    bigfleet-trio demo [--workloads DIR] [--catalog FILE] [--keep-running] [...]
    bigfleet-trio events --addr HOST:PORT [--kind KIND ...]

Every failure prints exactly one line ``<command>: <what is wrong>`` on stderr: a usage error
(unknown flag, bad value) exits 2, a file a flag names or a runtime failure 1; SIGINT ends
``demo``, ``events`` and ``install-crds`` with 130, the binaries (which handle it as SIGTERM,
shutting down in order) with 0 (docs/reference.md#exit-codes). The run functions are imported
lazily per command.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__
from .config import OperatorConfig, PodControllerConfig
from .durations import format_duration, parse_duration
from .knobs import DURATION, ConfigError, ConfigFileError, KnobSpec, Settings, knob_specs

if TYPE_CHECKING:
    import ssl

__all__ = ["main", "build_parser", "parse_args", "UsageError", "PROG"]

PROG = "bigfleet-trio"

log = logging.getLogger(__name__)

# Exceptions whose message is a complete user-facing explanation (no traceback needed).
_EXPECTED_ERRORS = {"ConfigError", "KubeConfigError", "SyncTimeout", "OSError", "FileNotFoundError",
                    "PermissionError", "ConnectionRefusedError", "HandshakeError",
                    "ExplainError"}


# The simulation's commands (``sim``, ``demo``) live in the sim package and are found by module
# path: product code never imports the sim (an import-linter contract in pyproject.toml;
# docs/architecture.md#layers), and the production image has no sim, so there they are absent.
SIM_COMMANDS = "bigfleet_trio.sim.cli"
# Distributions only the simulation imports: pyproject.toml's `sim` extra, absent from the image.
SIM_ONLY = ("jsonpatch", "jsonpointer", "jsonschema")
SIM_EXTRA_HINT = "the simulation needs the sim extra: pip install -e '.[sim]' ({} is missing)"
_sim_missing: list[str] = []


def sim_commands() -> ModuleType | None:
    """The sim's command module (``add_sim_command``, ``add_demo_command``, ``run_command``), or
    None when this install has no simulation (the production image)."""
    try:
        return importlib.import_module(SIM_COMMANDS)
    except ModuleNotFoundError as exc:
        if exc.name in ("bigfleet_trio.sim", SIM_COMMANDS):
            return None
        if exc.name and exc.name.partition(".")[0] in SIM_ONLY:
            _sim_missing[:] = [exc.name]
            return None
        raise


class UsageError(Exception):
    """A command-line problem; ``command`` names the sub-command (``operator``, ``sim shard``…)."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(message)
        self.command = command
        self.message = message


class _Parser(argparse.ArgumentParser):
    """ArgumentParser that raises :class:`UsageError` instead of printing usage and exiting 2."""

    def __init__(self, *args: Any, command: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.command = command or PROG
        # on every (sub-)command, as users try it where they are
        self.add_argument("--version", action="version", version=f"{PROG} {__version__}")

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.command, message)


# ---------------------------------------------------------------------------------- flag types


def _duration(text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must not be negative")
    return value


def int_arg(text: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def float_arg(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}")
    return value


def port_arg(text: str) -> int:
    value = int_arg(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: must be 0..65535")
    return value


_TRUE = {"1", "t", "true", "yes", "y", "on"}
_FALSE = {"0", "f", "false", "no", "n", "off"}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


class _Repeated(argparse.Action):
    """A repeatable flag of a tuple-valued knob: the first use replaces the default, each
    further use adds one value (``--exclude-namespace a --exclude-namespace b``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest, None)
        if current is None or current is self.default:
            current = ()
        setattr(namespace, self.dest, (*current, values))


def add_log_flags(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The log flags on the root parser (``suppress=False``: default None, so a command's own
    default applies) and on commands without settings (sim, install-crds, events)."""
    for spec in knob_specs(OperatorConfig()):
        if spec.knob.global_flag:
            _add_knob(p, spec, suppress=suppress, root=not suppress)


def _help(spec: KnobSpec) -> str:
    text = spec.knob.help
    value = spec.default
    if value is None or value == "" or value == () or isinstance(value, bool):
        return text
    if isinstance(value, tuple):
        return f"{text} (default {', '.join(repr(v) for v in value)})"
    shown = format_duration(value) if spec.knob.unit == DURATION else f"{value:g}" if isinstance(
        value, float) else str(value)
    return f"{text} (default {shown})"


def _add_knob(p: Any, spec: KnobSpec, *, suppress: bool = False, root: bool = False) -> None:
    """Add the flag of one settings knob (type, metavar, default and help from the field).

    ``suppress`` (the global log flags on a sub-command): no default in the namespace, so a
    value given before the sub-command is kept.
    """
    meta = spec.knob
    default: Any = argparse.SUPPRESS if suppress else None if root else spec.default
    if isinstance(spec.default, bool):
        p.add_argument(spec.flag, dest=spec.dest, nargs="?", const=True, default=default,
                       type=_bool, metavar="BOOL", help=_help(spec))
        return
    kwargs: dict[str, Any] = {"dest": spec.dest, "default": default,
                              "help": _help(spec)}
    if isinstance(spec.default, tuple):
        kwargs["action"] = _Repeated
    elif meta.choices is not None:
        kwargs["choices"] = meta.choices
    elif meta.unit == DURATION:
        kwargs["type"] = _duration
        kwargs["metavar"] = meta.metavar or "DUR"
    elif isinstance(spec.default, float):
        kwargs["type"] = float_arg
    elif isinstance(spec.default, int):
        kwargs["type"] = int_arg
    if meta.metavar and "metavar" not in kwargs:
        kwargs["metavar"] = meta.metavar
    p.add_argument(spec.flag, *_ALIASES.get(spec.dest, ()), **kwargs)


# Kubernetes components' spelling of a flag, accepted as well (docs/reference.md#log-format)
_ALIASES: dict[str, tuple[str, ...]] = {"log_format": ("--logging-format",)}


def add_settings_flags(p: argparse.ArgumentParser, defaults: Settings) -> None:
    """Every knob of ``defaults`` as a flag; nested and embedded groups get a help section."""
    groups: dict[str, Any] = {}
    for spec in knob_specs(defaults):
        if spec.knob.global_flag:
            _add_knob(p, spec, suppress=True)
            continue
        target: Any = p
        if spec.group:
            if spec.group not in groups:
                groups[spec.group] = p.add_argument_group(f"{spec.group} settings")
            target = groups[spec.group]
        _add_knob(target, spec)


def settings_from(cls: type[Settings], ns: argparse.Namespace) -> Any:
    """Build settings of ``cls`` from parsed flags (an empty path flag means "not set")."""
    values: dict[str, Any] = {}
    for spec in knob_specs(cls()):
        value = getattr(ns, spec.dest, None)
        if value is None:
            continue  # a global log flag not given: the class default applies
        if spec.default is None and value == "":
            value = None
        values[spec.dest] = value
    return cls(**values)


# ---------------------------------------------------------------------------------- parser


def add_explain_command(sub: Any) -> None:
    """``explain pod|cr NAMESPACE/NAME`` (read-only: :mod:`bigfleet_trio.operator.explain`)."""
    ex = sub.add_parser(
        "explain", command="explain", help="what became of a Pod's demand (read-only)",
        description="One screen from a Pod (or CapacityRequest) to its CapacityRequest, the "
        "roll-up need, the AvailableCapacity for its profile, the UpcomingNodes that fit and "
        "the last Events. Reads only (docs/operate.md#explain-what-became-of-a-pod).",
    )
    ex.add_argument("kind", choices=["pod", "cr"], help="pod or cr")
    ex.add_argument("target", metavar="NAMESPACE/NAME", help="the Pod or CapacityRequest")
    ex.add_argument("--kubeconfig", default=None, metavar="PATH",
                    help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    ex.add_argument("--aggregate", action="store_true",
                    help="list every CapacityRequest to sum the roll-up need (slow on a big "
                    "cluster)")
    add_log_flags(ex, suppress=True)


def build_parser() -> argparse.ArgumentParser:
    """Build the full ``bigfleet-trio`` parser (all sub-commands).

    Returns:
        A parser whose ``error()`` raises :class:`UsageError` (never exits by itself, except for
        ``--help``/``--version``).
    """
    op_d = OperatorConfig()
    pc_d = PodControllerConfig()

    root = _Parser(
        prog=PROG,
        description="BigFleet's per-cluster agent (operator + pod controller) on Trio, "
        "and a one-laptop simulation.",
        command=PROG,
    )
    add_log_flags(root, suppress=False)
    sub = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    # operator ------------------------------------------------------------------------------
    op = sub.add_parser(
        "operator", command="operator", help="run the per-cluster operator",
        description="Roll CapacityRequests up to a BigFleet shard and act on its instructions.",
    )
    add_settings_flags(op, op_d)

    # pod-controller ------------------------------------------------------------------------
    pc = sub.add_parser(
        "pod-controller", command="pod-controller", help="run the unschedulable-pod controller",
        description="Keep one CapacityRequest per Pod, translated as kube-scheduler sees it.",
    )
    add_settings_flags(pc, pc_d)

    # sim (its components, one at a time) -------------------------------------------------
    sim_cli = sim_commands()
    if sim_cli is not None:
        sim_cli.add_sim_command(sub)

    # install-crds --------------------------------------------------------------------------
    inst = sub.add_parser(
        "install-crds", command="install-crds", help="create or update the CRDs in a cluster",
        description="Apply the bundled CustomResourceDefinitions.",
    )
    inst.add_argument("--kubeconfig", default=None, metavar="PATH",
                      help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    add_log_flags(inst, suppress=True)

    # demo --------------------------------------------------------------------------------
    if sim_cli is not None:
        sim_cli.add_demo_command(sub)

    # events --------------------------------------------------------------------------------
    from .observability.events import KINDS

    ev = sub.add_parser(
        "events", command="events", help="follow a running agent's /events feed",
        description="Print the agent's decision events as JSON lines.",
        epilog="event kinds:\n" + "\n".join(f"  {k:<26} {v}" for k, v in KINDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("--addr", default="127.0.0.1:8770", metavar="HOST:PORT",
                    help="the agent's --metrics-addr (default 127.0.0.1:8770); https://HOST:PORT "
                    "for an agent serving TLS (--metrics-auth; implied by the TLS flags below)")
    ev.add_argument("--certificate-authority", default=None, metavar="PATH",
                    help="PEM CA bundle that signed the agent's certificate (default: the "
                    "system's CAs; docs/crds.md#diagnostics-tls)")
    ev.add_argument("--insecure-skip-tls-verify", action="store_true",
                    help="do not verify the agent's certificate (a self-signed one): encrypted, "
                    "but the peer is unproven")
    ev.add_argument("--tls-server-name", default=None, metavar="NAME",
                    help="verify the certificate against this name, not the --addr host (a "
                    "port-forward to a certificate issued for the Service's DNS name)")
    ev.add_argument("--kind", action="append", default=[], metavar="KIND",
                    help="only this event kind (repeatable)")
    ev.add_argument("--max-events", type=int_arg, default=0, metavar="N",
                    help="exit after N events (default 0: until the feed ends)")
    ev.add_argument("--kubeconfig", default=None, metavar="PATH",
                    help="send this kubeconfig's bearer token (an agent with --metrics-auth "
                    "checks it; default: $KUBECONFIG or ~/.kube/config when present)")
    add_log_flags(ev, suppress=True)

    add_explain_command(sub)

    return root


def _normalize_argv(argv: Sequence[str]) -> list[str]:
    """Accept Go's single-dash long flags (``-cluster-id=x`` → ``--cluster-id=x``)."""
    out: list[str] = []
    rest = False
    for tok in argv:
        if rest or tok == "--":
            rest = True
            out.append(tok)
            continue
        if len(tok) > 2 and tok[0] == "-" and tok[1] != "-" and tok[1].isalpha():
            tok = "-" + tok
        out.append(tok)
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command line (without the program name).

    Raises:
        UsageError: unknown flag, bad value, missing sub-command.
        SystemExit: only for ``--help`` / ``--version`` (code 0).
    """
    ns, extras = build_parser().parse_known_args(_normalize_argv(argv))
    if extras:
        command = ns.command or PROG
        if command == "sim" and getattr(ns, "sim_command", None):
            command = f"sim {ns.sim_command}"
        raise UsageError(command, f"unrecognized arguments: {' '.join(extras)}")
    if ns.command is None:
        raise UsageError(PROG, "a command is required (operator, pod-controller, sim, "
                         "install-crds, demo, events); see --help")
    if ns.command == "sim" and getattr(ns, "sim_command", None) is None:
        *first, last = _subcommands(_subcommands(build_parser())["sim"])
        raise UsageError("sim", f"a component is required ({', '.join(first)} or {last})")
    return ns


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's sub-command parsers by name, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


# ---------------------------------------------------------------------------------- configs


def log_opts(ns: argparse.Namespace, default_level: str = "info") -> tuple[str, str]:
    return (ns.log_format or "text", ns.log_level or default_level)


def operator_config(ns: argparse.Namespace) -> OperatorConfig:
    """Build an :class:`OperatorConfig` from parsed ``operator`` flags (not validated)."""
    cfg: OperatorConfig = settings_from(OperatorConfig, ns)
    return cfg


def pod_controller_config(ns: argparse.Namespace) -> PodControllerConfig:
    """Build a :class:`PodControllerConfig` from parsed ``pod-controller`` flags."""
    cfg: PodControllerConfig = settings_from(PodControllerConfig, ns)
    return cfg


# ---------------------------------------------------------------------------------- running


USAGE_EXIT = 2
"""Exit code of a command-line problem (argparse's and Go's flag package's convention)."""
FAILURE_EXIT = 1
"""Exit code of a failure at start-up or while running."""
INTERRUPTED_EXIT = 130
"""Exit code after SIGINT (128 + 2, the shell's convention)."""


def _fail(command: str, message: str, code: int = FAILURE_EXIT) -> int:
    line = " ".join(str(message).split())
    print(f"{command}: {line}", file=sys.stderr)
    return code


def _interrupted(command: str) -> int:
    print(f"{command}: interrupted", file=sys.stderr)
    return INTERRUPTED_EXIT


def setup_logging(fmt: str, level: str) -> None:
    from .observability import logs

    try:
        logs.setup_logging(fmt, level)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("invalid log level", "--log-level: invalid level"))\
            from None


# Third-party modules that only an extra installs, and the extra.
_OPTIONAL_MODULES = {"kopf": "bench", "matplotlib": "bench", "kubernetes_asyncio": "bench"}


def load_command(command: str, module: str, attr: str) -> Callable[..., Any] | int:
    """Import ``module.attr`` lazily. A module only an extra installs, missing, is one line
    naming what to install; any other import error is a bug and propagates."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        extra = _OPTIONAL_MODULES.get(top)
        if extra is None:
            raise
        return _fail(command, f"needs {top}, not installed: pip install 'bigfleet-trio[{extra}]'")
    return getattr(mod, attr)  # type: ignore[no-any-return]


def invoke(command: str, fn: Callable[..., Any], *args: Any) -> int:
    try:
        rc = fn(*args)
    except KeyboardInterrupt:
        return _interrupted(command)
    except Exception as exc:
        names = {c.__name__ for c in type(exc).__mro__}
        if names & _EXPECTED_ERRORS:
            log.debug("%s failed", command, exc_info=True)
        else:
            log.error("%s failed", command, exc_info=True)
        return _fail(command, str(exc) or type(exc).__name__)
    if rc is None:
        return 0
    return int(rc)


def _run_command(ns: argparse.Namespace) -> int:
    command: str = ns.command
    if command == "operator":
        cfg = operator_config(ns)
        cfg.validate()
        setup_logging(cfg.log_format, cfg.log_level)
        fn = load_command(command, "bigfleet_trio.operator.app", "run_operator")
        return fn if isinstance(fn, int) else invoke(command, fn, cfg)
    if command == "pod-controller":
        pcfg = pod_controller_config(ns)
        pcfg.validate()
        setup_logging(pcfg.log_format, pcfg.log_level)
        fn = load_command(command, "bigfleet_trio.podcontroller.app", "run_pod_controller")
        return fn if isinstance(fn, int) else invoke(command, fn, pcfg)
    if command in ("sim", "demo"):
        sim_cli = sim_commands()
        if sim_cli is None:  # parse_args only offers them when the sim is installed
            raise UsageError(command, "not in this build: the simulation is not installed")
        rc: int = sim_cli.run_command(ns)
        return rc
    if command == "install-crds":
        fmt, level = log_opts(ns)
        setup_logging(fmt, level)
        from .install import install_crds

        return invoke(command, install_crds, ns.kubeconfig or None)
    if command == "events":
        fmt, level = log_opts(ns, "warning")
        setup_logging(fmt, level)
        if ns.max_events < 0:
            raise UsageError(command, "--max-events must be >= 0")
        from .observability.events import unknown_kinds

        unknown = unknown_kinds(ns.kind)
        if unknown:
            raise UsageError(command, f"unknown --kind {', '.join(map(repr, unknown))} "
                             "(see events --help for the kinds)")
        if ns.insecure_skip_tls_verify and (ns.certificate_authority or ns.tls_server_name):
            raise UsageError(command, "--insecure-skip-tls-verify contradicts "
                             "--certificate-authority and --tls-server-name")
        return invoke(command, _run_events, ns.addr, list(ns.kind), ns.max_events,
                      ns.kubeconfig, events_tls(ns.certificate_authority,
                                                ns.insecure_skip_tls_verify, ns.tls_server_name))
    if command == "explain":
        fmt, level = log_opts(ns, "warning")
        setup_logging(fmt, level)
        if "/" not in ns.target:
            raise UsageError(command, f"expected NAMESPACE/NAME, got {ns.target!r}")
        from functools import partial

        from .operator.explain import explain

        return invoke(command, partial(explain, aggregate=ns.aggregate), ns.kind, ns.target,
                      ns.kubeconfig or None)
    raise UsageError(PROG, f"unknown command {command!r}")  # pragma: no cover


def events_token(kubeconfig: str | None) -> str | None:
    """The bearer token ``events`` sends: from ``--kubeconfig`` (which must load), else from
    $KUBECONFIG / ~/.kube/config / in-cluster when one loads, else None (a loopback agent
    without --metrics-auth needs none).

    Raises:
        KubeConfigError: ``--kubeconfig`` given and unusable.
    """
    from bigfleet_trio.kube.config import load_kubeconfig

    from .kube.errors import KubeConfigError

    try:
        kcfg = load_kubeconfig(kubeconfig)
    except KubeConfigError:
        if kubeconfig:
            raise
        return None
    return kcfg.bearer_token()


def events_tls(ca_file: str | None, insecure: bool,
               server_name: str | None) -> ssl.SSLContext | None:
    """The client TLS context of ``events`` from its kubectl-style flags; None when none is
    given (then only an ``https://`` ``--addr`` means TLS, verified by the system's CAs).

    Raises:
        ConfigFileError: ``--certificate-authority`` unreadable or not PEM (exit 1).
    """
    if not (ca_file or insecure or server_name):
        return None
    from .observability.tls import client_context

    return client_context(ca_file, insecure=insecure, server_name=server_name)


def _run_events(addr: str, kinds: list[str], max_events: int,
                kubeconfig: str | None = None, tls: ssl.SSLContext | None = None) -> int:
    import trio

    from .observability.events import follow_events

    token = events_token(kubeconfig)

    async def _follow() -> int:
        return await follow_events(addr, sys.stdout, kinds=kinds, max_events=max_events,
                                   token=token, notice=sys.stderr, tls=tls)

    trio.run(_follow)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``bigfleet-trio`` (console script) and ``python -m bigfleet_trio``.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The process exit code (docs/reference.md#exit-codes): the run function's code; 2 on a
        usage error and 1 on a start-up or runtime failure, each after one line
        ``<command>: <what is wrong>`` on stderr; 130 after a SIGINT the command does not
        handle itself (``<command>: interrupted``; the binaries shut down and return 0); 0 for
        ``--help`` and ``--version``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["sim"], ["demo"]) and sim_commands() is None and _sim_missing:
        return _fail(args[0], SIM_EXTRA_HINT.format(_sim_missing[0]), USAGE_EXIT)
    try:
        ns = parse_args(args)
    except UsageError as exc:
        return _fail(exc.command, exc.message, USAGE_EXIT)
    except SystemExit as exc:  # --help / --version
        code = exc.code
        return code if isinstance(code, int) else 0
    name = ns.command if ns.command != "sim" else f"sim {ns.sim_command}"
    try:
        return _run_command(ns)
    except UsageError as exc:
        return _fail(exc.command, exc.message, USAGE_EXIT)
    except ConfigError as exc:  # a flag's value (2) or the file it names (1)
        return _fail(name, str(exc),
                     FAILURE_EXIT if isinstance(exc, ConfigFileError) else USAGE_EXIT)
    except KeyboardInterrupt:
        return _interrupted(name)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
