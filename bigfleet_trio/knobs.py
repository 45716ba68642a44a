"""Settings as dataclasses whose fields are also command-line flags ("knobs").

A knob is one dataclass field made with :func:`knob`: its default, help text, unit and check
live there, so the command line (``cli.py``) can generate the flag and :meth:`Settings.check_knobs`
the validation from it; adding a knob is one edit. Groups nest (:func:`nested`) and embed
(subclassing, :func:`rebased` for another default), the way kopf composes its settings. Also the
generic checks (positive numbers, ``HOST:PORT``) and one-line error helpers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

__all__ = [
    "DURATION",
    "Check",
    "ConfigError",
    "Knob",
    "KnobSpec",
    "Settings",
    "at_least_one",
    "default_of",
    "dial_addr",
    "knob",
    "knob_specs",
    "listen_addr",
    "loopback_addr",
    "nested",
    "non_negative",
    "positive",
    "probe_addr",
    "read_text",
    "rebased",
    "split_host_port",
    "yaml_error_line",
]

DURATION = "duration"
"""Unit of a knob in seconds that the command line takes as a Go duration (``10s``, ``1m30s``)."""


class ConfigError(ValueError):
    """A startup configuration problem; ``str(err)`` is the one line shown to the user.

    A problem with the command line itself (a missing, malformed or conflicting flag) is a
    usage error: exit 2. :class:`ConfigFileError` is the other kind."""


class ConfigFileError(ConfigError):
    """A flag names a file that cannot be read or used: exit 1, not 2 (the command line is
    fine; the world is not)."""


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

    Knobs inherited from a class with a ``knob_group`` attribute form that group.
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
    for f in fields(obj):
        value = getattr(obj, f.name)
        if _NESTED in f.metadata:
            sub_prefix, sub_title = f.metadata[_NESTED]
            yield from _walk(value, prefix + sub_prefix, sub_title, (*path, f.name))
        elif _KNOB in f.metadata:
            group = title or _embedded_group(type(obj), f)
            yield f, value, prefix, group, (*path, f.name)


def _embedded_group(cls: type, f: Field[Any]) -> str:
    """The ``knob_group`` of the embedded class that declared knob ``f`` ("" for the class's
    own knobs); a :func:`rebased` redeclaration keeps the embedded class's group."""
    for base in cls.__mro__[1:]:
        group = base.__dict__.get("knob_group")
        declared = getattr(base, "__dataclass_fields__", {}).get(f.name)
        if group and declared is not None and declared.metadata.get(_KNOB) is f.metadata[_KNOB]:
            return str(group)
    return ""


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

    ``OperatorConfig(cluster_id="c", send_timeout=7.5)`` sets ``cfg.agent.session.send_timeout``: a
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


def loopback_addr(addr: str) -> bool:
    """True for a listen ``HOST:PORT`` on 127.0.0.0/8, ``[::1]`` or ``localhost`` (an empty
    host is every interface: False). Malformed: False."""
    try:
        host, _ = split_host_port(addr, flag="address")
    except ConfigError:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


GRPC_SCHEME = "grpc://"
"""The plaintext gRPC URL scheme a dial address may carry (what ``demo`` and ``sim shard``
print); TLS comes from the --tls-* flags, not from a scheme."""


def strip_grpc_scheme(value: str) -> str:
    """``grpc://HOST:PORT[/]`` -> ``HOST:PORT``; anything else unchanged."""
    if value.startswith(GRPC_SCHEME):
        return value[len(GRPC_SCHEME):].rstrip("/")
    return value


def dial_addr(value: str) -> str | None:
    """Check: ``HOST:PORT`` (or ``grpc://HOST:PORT``) with a host and a non-zero port."""
    if "://" in value and not value.startswith(GRPC_SCHEME):
        raise ConfigError(f"{{flag}}: invalid address {value!r}: only the grpc:// scheme is "
                          "accepted (HOST:PORT; mTLS comes from --tls-cert/--tls-key/--tls-ca)")
    value = strip_grpc_scheme(value)
    host, port = split_host_port(value, flag="{flag}")
    if not host:
        raise ConfigError(f"{{flag}}: invalid address {value!r}: missing host")
    if port == 0:
        raise ConfigError(f"{{flag}}: invalid address {value!r}: port 0")
    return None


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


def read_text(path: str, what: str) -> str:
    """Read a text file or raise ``ConfigError("read <what>: <path>: <reason>")`` (Go wording)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigFileError(f"read {what}: {path}: {reason}") from exc


def _readable(what: str) -> Check:
    def check(path: str) -> str | None:
        if path:
            read_text(path, what)
        return None

    return check
