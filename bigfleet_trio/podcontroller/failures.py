"""What a failed reconcile logs, and when its key is tried again: :class:`FailedReconciles`."""

from __future__ import annotations

import logging

from bigfleet_trio.kube.errors import ApiError, KubeTransportError, NotFound
from bigfleet_trio.kube.informer import Informer
from bigfleet_trio.kube.workqueue import WorkQueue
from bigfleet_trio.observability.ratelog import CauseLimiter

from .keys import QueueKey

__all__ = ["FailedReconciles"]

log = logging.getLogger(__name__)

_NOT_SERVED = "not-served"


class FailedReconciles:
    """The failure path of the pod controller's workers (docs/crds.md#missing-crds).

    - While the CapacityRequest CRD is not served (its informer saw a 404 for the resource
      itself), a reconcile's 404 is that same cause: the key is parked, not retried on its
      growing backoff, with one WARNING per outage (the informer's ERROR names the fix). When
      the CRD is served again every parked key is queued at once.
    - Any other API or transport failure is retried on the key's backoff and logged once per
      cause (error class and status) per 30 s, saying how many it stands for; the rest go to
      DEBUG. 500 Pods failing for one reason are one line, not 500.

    Args:
        queue: the controller's work queue.
        crs: the CapacityRequest informer (its ``not_served`` and served-again signal).
        limiter: the per-cause limiter (tests inject a clock through it).
    """

    def __init__(self, queue: WorkQueue[QueueKey], crs: Informer,
                 limiter: CauseLimiter | None = None) -> None:
        self._queue = queue
        self._crs = crs
        self._limiter = limiter or CauseLimiter(30.0)
        self.parked: set[QueueKey] = set()
        crs.served_again.append(self._served_again)

    def failed(self, item: QueueKey, exc: ApiError | KubeTransportError) -> None:
        """Handle one failed reconcile of ``item``: park it or requeue it, and log (or not)."""
        if isinstance(exc, NotFound) and self._crs.not_served:
            self.parked.add(item)
            if self._limiter.admit(_NOT_SERVED) is not None:
                log.warning("pod controller: reconciles wait until %s is served again; they "
                            "run as soon as it is", self._crs.res.plural + "." +
                            self._crs.res.group, extra={"key": str(item)})
            return
        delay = self._queue.add_rate_limited(item)
        status = exc.status if isinstance(exc, ApiError) else 0
        held = self._limiter.admit((type(exc).__name__, status))
        line = "pod controller reconcile failed key=%s/%s retry_in=%.3fs err=%s"
        if held is None:
            log.debug(line, item.kind, item, delay, exc)
            return
        more = f" ({held} more like it since the last such line)" if held else ""
        log.warning(line + "%s", item.kind, item, delay, exc, more)

    def _served_again(self) -> None:
        self._limiter.clear(_NOT_SERVED)
        parked, self.parked = self.parked, set()
        for item in parked:
            self._queue.forget(item)
            self._queue.add(item)
        if parked:
            log.info("pod controller: %d parked reconciles queued again", len(parked))
