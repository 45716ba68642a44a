"""Finding the error that matters inside Trio's exception groups.

Trio nurseries wrap every exception that leaves them in a ``BaseExceptionGroup`` (strict groups),
so a start-up failure raised deep inside ``trio.run`` (a ``SyncTimeout``, a port already in use)
arrives at the CLI as nested groups. The binaries turn such a failure into the one line
``<command>: <what is wrong>`` and exit 1 (:mod:`bigfleet_trio.cli`); this module finds it.
"""

from __future__ import annotations

__all__ = ["find_in_group"]


def find_in_group(
    exc: BaseException, types: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of ``types`` in ``exc`` or its (nested) exception groups, depth first.

    Args:
        exc: an exception, possibly a ``BaseExceptionGroup``.
        types: the class or classes looked for (``isinstance`` semantics).

    Returns:
        ``exc`` itself when it matches, else the first matching leaf in group order, else None.
    """
    if isinstance(exc, types):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_in_group(inner, types)
            if found is not None:
                return found
    return None
