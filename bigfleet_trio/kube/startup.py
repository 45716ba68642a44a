"""Start-up sync of a process's informers, raced against the apiserver refusing its credentials.

The operator and the pod controller both wait here before writing anything: every cache synced
within the deadline (:func:`~.informer.wait_all_synced`), or :class:`Unauthenticated` as soon as
the client's first 401 arrives.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from .informer import Informer, SyncTimeout, wait_all_synced
from .request import RequestCore

__all__ = ["Unauthenticated", "sync_or_refused"]


class Unauthenticated(SyncTimeout):
    """The apiserver answered 401 Unauthorized while the informers were syncing.

    A subclass of :class:`SyncTimeout` (callers that report a failed sync report this too), but
    raised as soon as the 401 is seen: credentials do not heal by waiting out the deadline.
    """


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
            exc = await client.wait_unauthorized()
            failed = Unauthenticated(
                f"401 Unauthorized: the apiserver refused this process's credentials "
                f"({exc.message or 'no message'}); check the kubeconfig's token or client "
                f"certificate"
            )
            race.cancel_scope.cancel()

        race.start_soon(synced)
        race.start_soon(refused)
    return failed
