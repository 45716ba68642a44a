"""``--enable-profiling``: the live Trio task tree and CPU profiles on the diagnostics listener.

Off by default. When on, :func:`~bigfleet_trio.observability.http.build_app` routes
``GET /debug/tasks`` (:func:`task_tree`) and ``GET /debug/pprof/profile?seconds=N``
(:class:`Profiler`), behind the same ``--metrics-auth`` check as ``/metrics``.
docs/operate.md#profiling.
"""

from __future__ import annotations

import cProfile
import io
import pstats

import trio

__all__ = ["MAX_SECONDS", "MIN_SECONDS", "DEFAULT_SECONDS", "Busy", "Profiler", "task_tree"]

MIN_SECONDS = 1
MAX_SECONDS = 60
DEFAULT_SECONDS = 30


def task_tree(root: trio.lowlevel.Task | None = None) -> str:
    """The live task tree as text: one task name a line, indented two spaces a depth.

    Args:
        root: the task to start from; default ``trio.lowlevel.current_root_task()``.

    Returns:
        Lines ending in ``\\n``; the root at depth 0. Must run inside ``trio.run``.
    """
    start = root if root is not None else trio.lowlevel.current_root_task()
    lines: list[str] = []
    stack: list[tuple[trio.lowlevel.Task, int]] = [(start, 0)] if start is not None else []
    while stack:
        task, depth = stack.pop()
        lines.append("  " * depth + task.name)
        children = [child for nursery in task.child_nurseries for child in nursery.child_tasks]
        children.sort(key=lambda t: t.name, reverse=True)
        stack.extend((child, depth + 1) for child in children)
    return "".join(line + "\n" for line in lines)


class Busy(Exception):
    """A profile is already running (the listener answers 409)."""


class Profiler:
    """One CPU profile at a time of the Trio thread (cProfile)."""

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def profile(self, seconds: float) -> str:
        """Profile the Trio thread for ``seconds`` (of ``trio.sleep``).

        Returns:
            ``pstats`` text, sorted by cumulative time.

        Raises:
            Busy: another profile is running. ValueError: ``seconds`` outside
                ``MIN_SECONDS..MAX_SECONDS``.
        """
        if not MIN_SECONDS <= seconds <= MAX_SECONDS:
            raise ValueError(f"seconds must be {MIN_SECONDS}..{MAX_SECONDS}, got {seconds:g}")
        if self._lock.locked():
            raise Busy("a profile is already running; retry when it ends")
        async with self._lock:
            prof = cProfile.Profile()
            prof.enable()
            try:
                await trio.sleep(seconds)
            finally:
                prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(pstats.SortKey.CUMULATIVE).print_stats()
        return out.getvalue()
