"""Bootstrap blob rendering: ``BootstrapRequest`` in, ``BootstrapBlobResponse`` out.

The operator renders the kubelet bootstrap blob the shard pulls with the configured
:class:`Renderer` (:class:`FileRenderer`, a sandboxed Jinja2 template, or :class:`StubRenderer`)
and answers echoing ``request_id`` (docs/rules.md#bootstrap-template). Rendering is CPU-only, so
the session dispatches bootstrap requests outside the apiserver semaphore
(docs/rules.md#bootstrap-unbounded-path); nothing here awaits I/O. Differences from the Go
reference (Jinja2, ``request_id`` in the context, the TTL):
docs/deviations.md#6-bootstrap-operatorbootstrappy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from bigfleet_trio.proto import pb

__all__ = [
    "DEFAULT_BOOTSTRAP_TTL_SECONDS",
    "MAX_USER_DATA_BYTES",
    "BootstrapTemplateError",
    "BootstrapRenderError",
    "Requirement",
    "Renderer",
    "FileRenderer",
    "StubRenderer",
    "BootstrapHandler",
    "make_renderer",
    "requirements_from_proto",
    "operator_string",
]

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_TTL_SECONDS = 600
"""Default ``ttl_seconds`` of every blob (``--bootstrap-ttl``)."""

MAX_USER_DATA_BYTES = 1 << 20
"""Rendered blobs larger than this (1 MiB) are refused as a render error: no cloud accepts them."""

_OPERATOR_STRINGS: Mapping[int, str] = {
    pb.NodeSelectorRequirementOperator.OPERATOR_UNSPECIFIED: "",
    pb.NodeSelectorRequirementOperator.OPERATOR_IN: "In",
    pb.NodeSelectorRequirementOperator.OPERATOR_NOT_IN: "NotIn",
    pb.NodeSelectorRequirementOperator.OPERATOR_EXISTS: "Exists",
    pb.NodeSelectorRequirementOperator.OPERATOR_DOES_NOT_EXIST: "DoesNotExist",
    pb.NodeSelectorRequirementOperator.OPERATOR_SAME: "Same",
}


class BootstrapTemplateError(Exception):
    """The bootstrap template file cannot be read or does not parse (fatal at start-up)."""


class BootstrapRenderError(Exception):
    """Rendering failed for one request (goes back in ``BootstrapBlobResponse.error``)."""


@dataclass(frozen=True)
class Requirement:
    """One node-selector requirement as the template sees it.

    Attributes:
        key: label key.
        operator: "In", "NotIn", "Exists", "DoesNotExist", "Same" or "" (unspecified).
        values: label values (may be empty).
    """

    key: str
    operator: str
    values: tuple[str, ...] = field(default_factory=tuple)


def operator_string(op: int) -> str:
    """Wire operator enum value -> its string form ("" for unspecified or unknown values)."""
    return _OPERATOR_STRINGS.get(int(op), "")


def requirements_from_proto(reqs: Sequence[pb.NodeSelectorRequirement]) -> list[Requirement]:
    """Convert wire requirements to :class:`Requirement` values (order kept, values copied)."""
    return [Requirement(r.key, operator_string(r.operator), tuple(r.values)) for r in reqs]


class Renderer(Protocol):
    """Renders the bootstrap user data for one request. Must be CPU-only (no I/O, no awaits)."""

    def render(
        self, cluster_id: str, request_id: str, requirements: Sequence[Requirement]
    ) -> bytes:
        """Return the user-data bytes.

        Raises:
            BootstrapRenderError: the blob cannot be produced for this request.
        """
        ...


class StubRenderer:
    """Placeholder renderer used when no template file is configured."""

    def render(
        self, cluster_id: str, request_id: str, requirements: Sequence[Requirement]
    ) -> bytes:
        """Return ``b"#cloud-config\\n# bigfleet stub bootstrap for <cluster_id>\\n"``."""
        return f"#cloud-config\n# bigfleet stub bootstrap for {cluster_id}\n".encode()


_MAX_POWER_EXPONENT = 256
"""Largest integer exponent ``**`` may use in a template (10**256 is already absurd)."""


class _BoundedSandbox(SandboxedEnvironment):
    """The Jinja2 sandbox plus bounds on ``*`` and ``**`` (hostile templates).

    The stock sandbox stops attribute escapes, but ``{{ 'x' * 10**10 }}`` still allocates
    10 GB before our output-size check runs, and ``{{ 10**10**10 }}`` spins forever (even at
    parse time, through constant folding). Intercepting the two operators makes both a
    ``SecurityError`` (reported as a :class:`BootstrapRenderError`) before any allocation:
    repeating a sequence may not produce more than :data:`MAX_USER_DATA_BYTES` items, and an
    integer power may not use an exponent above :data:`_MAX_POWER_EXPONENT`.
    """

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        if operator == "**":
            if isinstance(right, int) and abs(right) > _MAX_POWER_EXPONENT and not (
                isinstance(left, int) and abs(left) <= 1
            ):
                raise SecurityError(f"exponent {right} is larger than {_MAX_POWER_EXPONENT}")
        elif operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int):
                    size = len(seq) * times
                    if size > MAX_USER_DATA_BYTES:
                        raise SecurityError(
                            f"repeating a sequence would make {size} items, more than "
                            f"{MAX_USER_DATA_BYTES}"
                        )
        return super().call_binop(context, operator, left, right)


def _sandbox() -> SandboxedEnvironment:
    env = _BoundedSandbox(
        loader=None,  # no {% include %} / {% import %} / {% extends %}: nothing can be read
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    # The default globals (range (sandbox-bounded), dict, lipsum, cycler, joiner, namespace) are
    # pure helpers; none touches files or runs code.
    return env


class FileRenderer:
    """Jinja2 template renderer, parsed once at start-up (docs/rules.md#bootstrap-template).

    The environment is a :class:`jinja2.sandbox.SandboxedEnvironment` with ``StrictUndefined``
    and no loader: templates cannot reach Python internals (``''.__class__`` ...), cannot include
    or read files, and an undefined name is an error rather than an empty string. Context
    (snake_case, since this is Jinja2 rather than Go text/template): ``cluster_id`` (the
    operator's configured cluster id), ``request_id``, and ``requirements``, a list of
    :class:`Requirement` (``r.key``, ``r.operator``, ``r.values``).

    Args:
        source: the template text.
        name: a label for error messages (the file path).

    Raises:
        BootstrapTemplateError: the template has a syntax error (message names file and line).
    """

    def __init__(self, source: str, *, name: str = "<bootstrap template>") -> None:
        self.name = name
        self._env = _sandbox()
        try:
            self._template = self._env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise BootstrapTemplateError(
                f"parse bootstrap-template-file {name}: line {exc.lineno}: {exc.message}"
            ) from exc

    @classmethod
    def from_path(cls, path: str | Path) -> FileRenderer:
        """Read and parse the template file at ``path``.

        Raises:
            BootstrapTemplateError: unreadable file (``read bootstrap-template-file …``) or a
                syntax error (``parse bootstrap-template-file …``).
        """
        try:
            source = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BootstrapTemplateError(f"read bootstrap-template-file {path}: {exc}") from exc
        return cls(source, name=str(path))

    def render(
        self, cluster_id: str, request_id: str, requirements: Sequence[Requirement]
    ) -> bytes:
        """Render with context ``cluster_id``, ``request_id``, ``requirements``.

        Raises:
            BootstrapRenderError: any template error (undefined name, sandbox violation, a
                filter failing, output larger than :data:`MAX_USER_DATA_BYTES`).
        """
        context = {
            "cluster_id": cluster_id,
            "request_id": request_id,
            "requirements": list(requirements),
        }
        try:
            out = self._template.render(context)
        except Exception as exc:  # sandbox SecurityError, UndefinedError, filter errors, ...
            raise BootstrapRenderError(
                f"render bootstrap template {self.name}: {type(exc).__name__}: {exc}"
            ) from exc
        data = out.encode("utf-8")
        if len(data) > MAX_USER_DATA_BYTES:
            raise BootstrapRenderError(
                f"render bootstrap template {self.name}: output is {len(data)} bytes, "
                f"more than {MAX_USER_DATA_BYTES}"
            )
        return data


def make_renderer(template_path: str | Path | None) -> Renderer:
    """Renderer for ``--bootstrap-template-file``: a :class:`FileRenderer`, or the stub if empty.

    Raises:
        BootstrapTemplateError: the file cannot be read or parsed (stop start-up).
    """
    if template_path is None or str(template_path) == "":
        log.info("bootstrap: no template file configured, using the stub renderer")
        return StubRenderer()
    renderer = FileRenderer.from_path(template_path)
    log.info("bootstrap: template parsed path=%s", template_path)
    return renderer


class BootstrapHandler:
    """Answers ``BootstrapRequest`` frames (docs/rules.md#bootstrap-template).

    Args:
        renderer: the configured renderer.
        cluster_id: the operator's cluster id (passed to the renderer, like the reference).
        ttl_seconds: ``ttl_seconds`` of successful responses (``--bootstrap-ttl``).
    """

    def __init__(
        self,
        renderer: Renderer,
        cluster_id: str,
        *,
        ttl_seconds: int = DEFAULT_BOOTSTRAP_TTL_SECONDS,
    ) -> None:
        if ttl_seconds < 0:
            raise ValueError(f"bootstrap ttl must be >= 0 seconds, got {ttl_seconds}")
        self.renderer = renderer
        self.cluster_id = cluster_id
        self.ttl_seconds = ttl_seconds

    def respond(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        """Render one request synchronously (pure CPU).

        Returns:
            ``BootstrapBlobResponse{request_id, user_data, ttl_seconds}`` or, on a render
            error, ``BootstrapBlobResponse{request_id, error}`` (empty user data, ttl 0).
        """
        if req.cluster_id and self.cluster_id and req.cluster_id != self.cluster_id:
            log.warning(
                "bootstrap: request for another cluster request_id=%s request_cluster=%s ours=%s",
                req.request_id,
                req.cluster_id,
                self.cluster_id,
            )
        try:
            data = self.renderer.render(
                self.cluster_id, req.request_id, requirements_from_proto(req.requirements)
            )
        except Exception as exc:
            log.warning("bootstrap: render failed request_id=%s error=%s", req.request_id, exc)
            return pb.BootstrapBlobResponse(request_id=req.request_id, error=str(exc) or repr(exc))
        log.info("bootstrap: rendered request_id=%s bytes=%d", req.request_id, len(data))
        return pb.BootstrapBlobResponse(
            request_id=req.request_id, user_data=data, ttl_seconds=self.ttl_seconds
        )

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        """Session handler: same as :meth:`respond` (never awaits I/O or the semaphore)."""
        return self.respond(req)
