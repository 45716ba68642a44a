"""One log line per cause per interval: :class:`CauseLimiter` (repeated failures, one line)."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import trio

__all__ = ["CauseLimiter"]


class CauseLimiter:
    """Decides whether a failure gets its log line: the first of each cause does, then at most
    one per ``every`` seconds, which says how many it stands for.

    A cause is any hashable the caller derives from the failure, e.g. ``("NotFound", 404,
    "capacityrequests")``, never the object it failed on: 500 Pods failing for one reason are one
    line, not 500. ``max_causes`` bounds the memory (the oldest cause is forgotten first).

    Args:
        every: seconds between two lines of one cause (Trio time by default).
        max_causes: causes remembered.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(self, every: float = 30.0, *, max_causes: int = 256,
                 clock: Callable[[], float] | None = None) -> None:
        self.every = every
        self.max_causes = max_causes
        self._clock = clock or trio.current_time
        self._causes: dict[Hashable, tuple[float, int]] = {}  # cause -> (last line, held back)

    def admit(self, cause: Hashable) -> int | None:
        """None: stay quiet (counted). Else log now; the int is how many of this cause were
        held back since its previous line (0 for the first)."""
        now = self._clock()
        seen = self._causes.get(cause)
        if seen is not None and now - seen[0] < self.every:
            self._causes[cause] = (seen[0], seen[1] + 1)
            return None
        self._causes.pop(cause, None)
        self._causes[cause] = (now, 0)
        while len(self._causes) > self.max_causes:
            del self._causes[next(iter(self._causes))]
        return 0 if seen is None else seen[1]

    def clear(self, cause: Hashable) -> None:
        """The cause has ended: its next failure logs at once."""
        self._causes.pop(cause, None)
