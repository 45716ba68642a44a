"""The private internals of our dependencies that product code relies on, one test each.

Product code reaches into a few undocumented internals (trio's SSLStream, grpclib's client
stream, buffer and event processor, trio-asyncio's loop variable) for
speed or to free memory at once. Each is in ``INTERNALS`` below with the file of ours that
uses it; its test asserts the shape we rely on and, failing, names the distribution, its
installed version and that file. pyproject.toml caps each such distribution below its next
minor (0.x) or major release (``test_every_internal_dependency_is_capped``), and
``scripts/newest-deps`` runs the fast suite on the newest versions the caps allow.

A new private access in product code fails ``test_every_private_access_is_registered`` until it
is added here (a third party's) or to ``OWN_PRIVATE`` (stdlib's, or our own across modules).
"""

from __future__ import annotations

import ast
import inspect
import re
import ssl
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bigfleet_trio"


@dataclass(frozen=True)
class Internal:
    dist: str
    """The distribution (as pyproject.toml names it)."""
    user: str
    """Our file that uses it, relative to the repository."""
    names: tuple[str, ...]
    """The private attribute names this entry covers (for the registration walk)."""
    what: str


def _src(obj: object) -> str:
    return inspect.getsource(obj)  # type: ignore[arg-type]


def _trio_sslstream() -> object:
    import trio
    import trio.testing

    a, _ = trio.testing.memory_stream_pair()
    return trio.SSLStream(a, ssl.create_default_context(), server_hostname="example.invalid")


def check_trio_ssl_object() -> None:
    stream = _trio_sslstream()
    assert isinstance(stream._ssl_object, ssl.SSLObject)  # type: ignore[attr-defined]


def check_trio_handshook() -> None:
    stream = _trio_sslstream()
    assert "_handshook" in vars(stream), "SSLStream has no instance attribute _handshook"


def check_grpclib_client_stream() -> None:
    from grpclib.client import Stream

    src = _src(Stream)
    assert re.search(r"self\._stream\s*=", src), "grpclib.client.Stream sets no self._stream"
    assert re.search(r"self\._wrapper\s*=", src), "grpclib.client.Stream sets no self._wrapper"
    assert Stream._recv_initial_metadata_done is False
    assert callable(Stream.recv_initial_metadata)


def check_grpclib_buffer() -> None:
    from grpclib.protocol import Buffer, Stream, UnackedData

    src = _src(Buffer)
    assert re.search(r"self\._acked_size\s*=", src), "grpclib Buffer has no _acked_size"
    assert re.search(r"self\._unacked\b.*=\s*Queue\(\)", src), "grpclib Buffer._unacked no Queue"
    assert "data_size" in UnackedData._fields
    assert "self.buffer = Buffer(" in _src(Stream)
    assert "self.connection = connection" in _src(Stream)
    assert "last_message_received" in _src(__import__("grpclib.protocol").protocol.Connection)
    import asyncio

    queue: asyncio.Queue[int] = asyncio.Queue()
    assert hasattr(queue, "_queue"), "asyncio.Queue has no _queue"


def check_grpclib_channel_protocol() -> None:
    from grpclib.client import Channel
    from grpclib.protocol import EventsProcessor
    from h2.events import ConnectionTerminated

    assert ConnectionTerminated.__module__ == "h2.events"

    assert re.search(r"self\._protocol\s*=", _src(Channel)), "Channel sets no self._protocol"
    src = _src(EventsProcessor.__init__)
    assert "self.processors = {" in src and "ConnectionTerminated" in src


def check_trio_asyncio_current_loop() -> None:
    import contextvars

    import trio_asyncio  # type: ignore[import-untyped]

    assert isinstance(trio_asyncio.current_loop, contextvars.ContextVar)
    assert trio_asyncio.current_loop.get() is None


INTERNALS: dict[str, tuple[Internal, Callable[[], None]]] = {
    "trio-ssl-object": (
        Internal("trio", "bigfleet_trio/kube/transport.py", ("_ssl_object",),
                 "SSLStream._ssl_object, the ssl.SSLObject (httpcore's ssl_object info)"),
        check_trio_ssl_object),
    "trio-handshook": (
        Internal("trio", "bigfleet_trio/kube/transport.py", ("_handshook",),
                 "SSLStream's _handshook instance attribute (dropped to break its cycle)"),
        check_trio_handshook),
    "grpclib-client-stream": (
        Internal("grpclib", "bigfleet_trio/shard/downlink.py",
                 ("_stream", "_wrapper", "_recv_initial_metadata_done"),
                 "client Stream's _stream, _wrapper and _recv_initial_metadata_done"),
        check_grpclib_client_stream),
    "grpclib-buffer": (
        Internal("grpclib", "bigfleet_trio/shard/downlink.py",
                 ("_acked_size", "_unacked", "_queue"),
                 "protocol Stream.buffer's _acked_size and _unacked (an asyncio.Queue's _queue "
                 "of UnackedData), Stream.connection.last_message_received"),
        check_grpclib_buffer),
    "grpclib-channel-protocol": (
        Internal("grpclib", "bigfleet_trio/shard/grpc.py", ("_protocol",),
                 "Channel._protocol.processor.processors, keyed by h2 event classes"),
        check_grpclib_channel_protocol),
    "trio-asyncio-current-loop": (
        Internal("trio-asyncio", "bigfleet_trio/shard/bridge.py", (),
                 "trio_asyncio.current_loop, a ContextVar (None outside a loop)"),
        check_trio_asyncio_current_loop),
}

OWN_PRIVATE: dict[str, str] = {
    "_current_frames": "stdlib sys._current_frames (observability/looplag.py)",
    "_Environ": "stdlib os._Environ, a type (kube/leader.py)",
    "_actions": "stdlib argparse: a parser's actions, for its sub-command names (cli.py)",
    "_SubParsersAction": "stdlib argparse's sub-command action type (cli.py)",
    "_betterproto": "betterproto's class metadata (shard/codec.py); betterproto is pinned ==",
    "_bf_redacted": "our own marker on a LogRecord (observability/logs.py)",
    "_bf_pairs": "our own marker on a LogRecord (observability/logs.py)",
    "_bigfleet": "our own marker on a logging handler (observability/logs.py)",
}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


@pytest.mark.parametrize("key", sorted(INTERNALS))
def test_internal_has_the_shape_we_rely_on(key: str) -> None:
    internal, check = INTERNALS[key]
    try:
        check()
    except (AssertionError, AttributeError, ImportError, TypeError, ValueError) as exc:
        pytest.fail(
            f"{internal.dist} {_version(internal.dist)}: {internal.what} changed "
            f"({type(exc).__name__}: {exc}); used by {internal.user}",
            pytrace=False,
        )
    assert (ROOT / internal.user).is_file(), internal.user


def _private_accesses(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, name, reflective) of every private attribute read on something but self/cls."""
    out: list[tuple[int, str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = node.attr
            recv = node.value
            if not (isinstance(recv, ast.Name) and recv.id in ("self", "cls")):
                out.append((node.lineno, name, False))
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            literal = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
            if isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr") and literal:
                out.append((node.lineno, str(literal[0]), True))
            if (isinstance(fn, ast.Attribute) and fn.attr in ("pop", "get")
                    and isinstance(fn.value, ast.Call) and isinstance(fn.value.func, ast.Name)
                    and fn.value.func.id == "vars"
                    and isinstance(node.args[0], ast.Constant)):
                out.append((node.lineno, str(node.args[0].value), True))
    return [(ln, n, r) for ln, n, r in out if n.startswith("_") and not n.startswith("__")]


def _own_definitions(trees: list[ast.AST]) -> set[str]:
    """Private names our own code defines: functions, class attributes, self._x = ..."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    own.add(node.attr)
            elif isinstance(node, ast.Assign):
                own.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                pass
        for node in ast.walk(tree):  # __slots__ entries
            if (isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)):
                own.update(c.value for c in ast.walk(node.value)
                           if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return own


def _product_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if not {"sim", "proto"} & set(p.relative_to(PACKAGE).parts[:-1])]


def test_every_private_access_is_registered() -> None:
    files = _product_files()
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    own = _own_definitions(list(trees.values()))
    registered: dict[str, set[str]] = {}
    for internal, _ in INTERNALS.values():
        for name in internal.names:
            registered.setdefault(name, set()).add(internal.user)
    unknown = []
    for path, tree in trees.items():
        rel = str(path.relative_to(ROOT))
        for line, name, reflective in _private_accesses(tree):
            if rel in registered.get(name, ()) or name in OWN_PRIVATE:
                continue
            if not reflective and name in own:
                continue  # one of our own objects (a reflective read is a foreign one)
            unknown.append(f"{rel}:{line}: {name}")
    assert not unknown, (
        "private attributes read in product code but not registered in "
        "tests/test_dependency_internals.py (INTERNALS for a dependency's, with a test of its "
        "shape and an upper bound in pyproject.toml; OWN_PRIVATE otherwise):\n"
        + "\n".join(unknown))


def test_every_internal_is_used_where_registered() -> None:
    for key, (internal, _) in INTERNALS.items():
        text = (ROOT / internal.user).read_text()
        for name in internal.names:
            assert name in text, f"{key}: {internal.user} no longer uses {name}; drop it"


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {metadata.distribution(r.name).metadata["Name"].lower().replace("_", "-"): r
            for r in reqs}


def test_every_internal_dependency_is_capped() -> None:
    reqs = _requirements()
    for internal, _ in INTERNALS.values():
        req = reqs.get(internal.dist)
        assert req is not None, f"{internal.dist} is not a runtime dependency in pyproject.toml"
        ops = {spec.operator for spec in req.specifier}
        assert ops & {"<", "==", "~="}, (
            f"{internal.dist}: {internal.user} relies on its internals, so pyproject.toml "
            f"must cap it (<next minor for 0.x, <next major otherwise); it says {req}")
        assert req.specifier.contains(_version(internal.dist)), (
            f"{internal.dist} {_version(internal.dist)} is installed but {req} excludes it")
