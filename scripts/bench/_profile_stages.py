"""CPU per stage from a py-spy profile (``--format raw``: collapsed stacks, one
``frame;frame;...;frame COUNT`` line per distinct stack, root first).

Pure functions, private to the benches: :func:`stage_of` names the stage of one stack by its
innermost frame that belongs to a known layer, :func:`stage_shares` sums a profile's samples per
stage, :func:`read` parses the file. ``bench podcontroller --profile DIR`` reports the shares
and the CPU per Pod they make.
"""

from __future__ import annotations

from collections.abc import Iterable

# (stage, substrings of a frame's file path): the first stage with a match, from the innermost
# frame outwards, wins, so a stack in TLS called from the HTTP layer is TLS, and our
# reconciler building a request body is "writes" only while the client code runs.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("TLS", ("ssl.py", "trio/_ssl.py")),
    ("socket I/O", ("trio/_socket.py", "trio/_highlevel_socket.py", "socket.py",
                    "selectors.py")),
    ("HTTP (httpx, httpcore, h11)", ("h11/", "httpcore/", "httpx/", "anyio/")),
    ("decoding (JSON, protobuf)", ("bigfleet_trio/kube/protowire.py", "bigfleet_trio/kube/watch.py",
                                   "bigfleet_trio/kube/watchstream.py", "json/",
                                   "google/protobuf/")),
    ("projection (slim_pod, slim_cr)", ("bigfleet_trio/podcontroller/projections.py",)),
    ("informer and store", ("bigfleet_trio/kube/informer.py", "bigfleet_trio/kube/store.py")),
    ("writes (client, request bodies)", ("bigfleet_trio/kube/client.py",
                                         "bigfleet_trio/kube/transport.py",
                                         "bigfleet_trio/kube/retry.py",
                                         "bigfleet_trio/kube/ratelimit.py", "tenacity/")),
    ("reconcile (plan, translate, queue)", ("bigfleet_trio/podcontroller/",
                                            "bigfleet_trio/kube/workqueue.py",
                                            "bigfleet_trio/kube/quantity.py")),
    ("metrics and logging", ("prometheus_client/", "logging/", "bigfleet_trio/observability/")),
    ("trio scheduling", ("trio/",)),
    ("start-up (imports)", ("<frozen importlib", "importlib/")),
)
OTHER = "other"


def _file(frame: str) -> str:
    """``name (path:line)`` -> ``path`` (the whole frame when it has no parenthesis)."""
    start = frame.rfind(" (")
    if start < 0 or not frame.endswith(")"):
        return frame
    return frame[start + 2:-1].rsplit(":", 1)[0]


def _in(path: str, part: str) -> bool:
    """``part`` starts the path or one of its directories (``trio/`` is not in
    ``bigfleet_trio/``)."""
    return path.startswith(part) or f"/{part}" in path


def stage_of(frames: list[str]) -> str:
    """The stage of one stack (``frames`` root first), :data:`OTHER` when none matches."""
    for frame in reversed(frames):
        path = _file(frame)
        for stage, parts in STAGES:
            if any(_in(path, p) for p in parts):
                return stage
    return OTHER


def read(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """Parse collapsed stacks; lines that are blank or end without a count are skipped."""
    out: list[tuple[list[str], int]] = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out.append((stack.split(";"), int(count)))
    return out


def stage_shares(stacks: Iterable[tuple[list[str], int]]) -> dict[str, float]:
    """Share (0..1) of the samples per stage, every stage of :data:`STAGES` and
    :data:`OTHER` present (0.0 when unseen); all 0.0 for an empty profile."""
    counts = dict.fromkeys([s for s, _ in STAGES] + [OTHER], 0)
    for frames, n in stacks:
        counts[stage_of(frames)] += n
    total = sum(counts.values())
    return {k: (v / total if total else 0.0) for k, v in counts.items()}
