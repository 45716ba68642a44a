"""Start-up sync of a process's informers, raced against the apiserver refusing its credentials.

The operator and the pod controller both wait here before writing anything: every cache synced
within the deadline (:func:`~.informer.wait_all_synced`), or :class:`Unauthenticated` as soon as
the client's first 401 arrives. Before that, :func:`check_reachable` ends the start of a
process whose apiserver does not take connections at all in about 30 s, with one line naming
the address and the fix, instead of retrying for the whole ``--sync-timeout``
(docs/operate.md#dead-apiserver-at-start).
"""

from __future__ import annotations

import errno
from collections.abc import Sequence

import httpcore
import httpx
import trio

from .config import KubeConfig
from .errors import ApiError, KubeTransportError, Unauthorized
from .informer import Informer, SyncTimeout, wait_all_synced
from .request import RequestCore

__all__ = ["REACH_ATTEMPTS", "REACH_BUDGET", "Unauthenticated", "Unreachable",
           "check_reachable", "sync_or_refused"]

REACH_ATTEMPTS = 4
"""Connection attempts of :func:`check_reachable` (1 s, 2 s, 4 s apart)."""
REACH_BUDGET = 30.0
"""Seconds :func:`check_reachable` may take in all."""


class Unauthenticated(SyncTimeout):
    """The apiserver answered 401 Unauthorized while the informers were syncing.

    A subclass of :class:`SyncTimeout` (callers that report a failed sync report this too), but
    raised as soon as the 401 is seen: credentials do not heal by waiting out the deadline.
    """


class Unreachable(SyncTimeout):
    """No connection to the apiserver at start (refused, no route, DNS, TLS handshake): the
    message is the one line ``cannot reach the Kubernetes API server at URL: why; check
    --kubeconfig and that the server is up``."""


def _unauthenticated(exc: Unauthorized) -> Unauthenticated:
    return Unauthenticated(
        f"401 Unauthorized: the apiserver refused this process's credentials "
        f"({exc.message or 'no message'}); check the kubeconfig's token or client "
        f"certificate"
    )


_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpcore.ConnectError,
                   httpcore.ConnectTimeout, OSError)


def _connect_failure(exc: BaseException) -> str | None:
    """Why ``exc`` is a connection-level failure (``"connection refused"``), or None when the
    connection was made (a slow or garbled answer: the server is alive)."""
    chain: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(chain) < 64:  # causes, contexts and group members (trio's connect)
        link = todo.pop(0)
        if any(link is seen for seen in chain):
            continue
        chain.append(link)
        if isinstance(link, BaseExceptionGroup):
            todo.extend(link.exceptions)
        todo.extend(e for e in (link.__cause__, link.__context__) if e is not None)
    if not any(isinstance(e, _CONNECT_ERRORS) for e in chain):
        return None
    if any(isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in chain):
        return "connection refused"
    for e in chain:
        if isinstance(e, OSError) and e.errno and e.strerror:
            return e.strerror[0].lower() + e.strerror[1:]
    root = chain[-1]
    return str(root) or type(root).__name__


async def check_reachable(
    config: KubeConfig, *, attempts: int = REACH_ATTEMPTS, budget: float = REACH_BUDGET,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Return once the apiserver at ``config.server`` answers ``GET /version`` at all.

    Any HTTP answer counts (a 403 or 404 too), and so does a slow one: only connection-level
    failures (refused, unreachable, DNS, TLS handshake) are retried, ``attempts`` times 1 s,
    2 s, 4 s apart, within ``budget`` seconds in all. A request still in flight when the
    budget ends counts as alive (the caches' ``--sync-timeout`` decides then).

    Args:
        config: the process's kubeconfig. attempts, budget: see above (seconds).
        transport: an httpx transport instead of sockets (tests).

    Raises:
        Unreachable: every attempt failed to connect. Unauthenticated: the server answered
            401 (the same message the informer sync gives).
    """
    failure: str | None = None
    delay = 1.0
    async with RequestCore(config, transport=transport, request_timeout=budget,
                           max_attempts=1) as client:
        with trio.move_on_after(budget):
            for attempt in range(max(1, attempts)):
                failure = None
                try:
                    await client.request("GET", "/version")
                    return
                except Unauthorized as exc:
                    raise _unauthenticated(exc) from None
                except ApiError:
                    return
                except KubeTransportError as exc:
                    failure = _connect_failure(exc)
                    if failure is None:
                        return
                if attempt + 1 < attempts:
                    await trio.sleep(delay)
                    delay *= 2
    if failure is not None:
        raise Unreachable(f"cannot reach the Kubernetes API server at {config.server}: "
                          f"{failure}; check --kubeconfig and that the server is up")


async def sync_or_refused(
    informers: Sequence[Informer], seconds: float, client: RequestCore, *, stale_401: bool = False
) -> SyncTimeout | None:
    """Wait for every informer to sync; None once they have, else why not.

    Args:
        informers: the caches to wait for.
        seconds: the deadline.
        client: the client the informers use (its first 401 ends the wait).
        stale_401: the client had its first 401 before this wait began: it remembers no later
            one, so only the deadline applies.

    Returns:
        None (all synced), the deadline's :class:`SyncTimeout`, or :class:`Unauthenticated`.
    """
    failed: SyncTimeout | None = None
    async with trio.open_nursery() as race:

        async def synced() -> None:
            nonlocal failed
            try:
                await wait_all_synced(informers, seconds)
            except SyncTimeout as exc:
                failed = exc
                conn = client.last_transport_error
                if conn is not None and "last error" not in str(exc):
                    # the client was still retrying the connection: say what it got
                    failed = SyncTimeout(f"{exc}; last error: {conn}")
            race.cancel_scope.cancel()

        async def refused() -> None:
            nonlocal failed
            if stale_401:
                await trio.sleep_forever()
            failed = _unauthenticated(await client.wait_unauthorized())
            race.cancel_scope.cancel()

        race.start_soon(synced)
        race.start_soon(refused)
    return failed
