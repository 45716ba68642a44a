"""Leader election on a coordination.k8s.io/v1 Lease, client-go semantics (for HA replicas).

API::

    elector = LeaderElector(client, name="bigfleet-operator", namespace="bigfleet-system",
                            identity=pod_name)  # lease 15 s, renew deadline 10 s, retry 2 s

    # 1) guarded block: waits until leader, runs the body while renewing in the background.
    async with elector.leading() as leadership:
        await do_leader_work()          # cancelled if the lease is lost
    if leadership.lost: ...             # the block ended because leadership was lost

    # 2) or a loop that re-campaigns after a loss and returns when ``work`` returns:
    await elector.run(do_leader_work)   # also usable as ``await nursery.start(elector.run, work)``

Semantics (``k8s.io/client-go/tools/leaderelection``):

* Campaign: every ``retry_period`` (jittered up to ×1.5; client-go jitters up to ×2.2) GET the
  Lease, and once more right when the holder's record (as observed) expires; create it if
  absent; take it if its holder is empty or the record has not changed for
  ``leaseDurationSeconds`` *as observed on our own clock* (the remote renewTime is never compared
  with the local wall clock, so clock skew does not matter). Writes are PUTs carrying the read
  ``resourceVersion``; a Conflict/AlreadyExists means someone else won this round.
* Taking the lease sets ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime`` and
  ``renewTime`` (RFC 3339 with microseconds) and increments ``leaseTransitions`` (kept as is
  when renewing our own lease).
* Renewal: every ``retry_period`` after a successful renew; if no renewal succeeds within
  ``renew_deadline`` the lease counts as lost, ``leadership.lost`` becomes True and the guarded
  body is cancelled through the leadership cancel scope. Since renew_deadline + retry_period
  < lease_duration, we stop acting before any follower may take over.
* Clean exit (body returns, raises, or an outer cancellation) releases the lease (holder "",
  leaseDurationSeconds 1) so a follower takes over within one retry period.
* Stepping down (:meth:`LeaderElector.step_down`, e.g. on SIGTERM) cancels the *work*, not the
  elector: renewals go on until the work has returned (a shielded shutdown included), then the
  lease is released. Cancelling the elector instead would stop renewing at once and let a
  follower take the lease while the old leader's shutdown still writes the cluster.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from ..observability import metrics, stdmetrics
from .client import KubeClient, rfc3339_micro
from .config import SERVICE_ACCOUNT_DIR, KubeConfig
from .errors import AlreadyExists, ApiError, Conflict, Forbidden, KubeTransportError, NotFound
from .resources import LEASES

__all__ = ["LeaderElector", "lease_client", "leader_timing_problem", "Leadership",
           "lease_namespace", "FALLBACK_LEASE_NAMESPACE"]

FALLBACK_LEASE_NAMESPACE = "bigfleet-system"
"""Lease namespace outside a pod when no flag names one (the shipped manifests' namespace)."""

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2
# Followers poll every retry_period x [1, 1.5) (client-go: x [1, 2.2)), and wake right at the
# observed expiry, so a leader that dies without releasing is replaced within
# lease_duration + one poll (15 + 3 s) plus the new leader's start-up: under 20 s.
CAMPAIGN_JITTER = 0.5
_EXPIRY_MARGIN = 0.01  # seconds past the observed expiry before a takeover attempt


def lease_namespace(
    flag: str | None,
    *,
    env: dict[str, str] | os._Environ[str] | None = None,
    sa_dir: str = SERVICE_ACCOUNT_DIR,
) -> tuple[str, str]:
    """The namespace of the leader-election Lease, and where it came from.

    Order (docs/crds.md#leader-election): ``--leader-election-namespace`` when given; else the
    pod's own namespace, from ``$POD_NAMESPACE`` (downward API) or the in-cluster ServiceAccount
    ``namespace`` file; else :data:`FALLBACK_LEASE_NAMESPACE`. Following the pod is what lets a
    Kustomize overlay with ``namespace:`` move the Role and the Lease together.

    Returns:
        ``(namespace, source)``, source one of ``flag``, ``POD_NAMESPACE``, the file's path,
        ``default``.
    """
    if flag:
        return flag, "flag"
    env = os.environ if env is None else env
    pod_ns = (env.get("POD_NAMESPACE") or "").strip()
    if pod_ns:
        return pod_ns, "POD_NAMESPACE"
    path = os.path.join(sa_dir, "namespace")
    try:
        with open(path, encoding="utf-8") as fh:
            file_ns = fh.read().strip()
    except OSError:
        file_ns = ""
    if file_ns:
        return file_ns, path
    return FALLBACK_LEASE_NAMESPACE, "default"


def _lease_error_fix(exc: ApiError, namespace: str, name: str) -> tuple[str, str] | None:
    """``(reason label, what to fix)`` for a Lease error the campaign cannot outwait."""
    if isinstance(exc, Forbidden):
        return "forbidden", (
            f"grant get, create and update on leases.coordination.k8s.io in namespace "
            f"{namespace} to this ServiceAccount (a Role and RoleBinding there, like the shipped "
            f"*-leader-election ones), or run the Lease in the pod's own namespace (unset "
            f"--leader-election-namespace, set POD_NAMESPACE)"
        )
    details = (exc.body or {}).get("details") or {}
    if isinstance(exc, NotFound) and details.get("kind") == "namespaces":
        return "not_found", (
            f"namespace {namespace} does not exist: create it, or run the Lease in the pod's "
            f"own namespace (unset --leader-election-namespace, set POD_NAMESPACE)"
        )
    return None


# One ERROR per distinct problem, repeated at this interval while it lasts (each attempt is
# still counted): a campaign retries every 2 s, and a line per retry would bury the fix.
_ERROR_REPEAT_S = 60.0


@dataclass
class Leadership:
    """One tenure as leader.

    Attributes:
        identity: our holderIdentity.
        acquired_at: Trio time leadership started.
        lost: True if the tenure ended because renewal failed (not by a clean exit).
        cancel_scope: scope around the guarded body (cancel it to step down early).
    """

    identity: str
    acquired_at: float
    lost: bool = False
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)


def lease_client(config: KubeConfig, user_agent: str = "bigfleet-trio") -> KubeClient:
    """A client for leader election alone (``<user_agent>/leader-election``), as
    controller-runtime gives its resource lock one.

    Its own token bucket, 429 hold and connections: a Retry-After answered to any other request
    of the binary (a TokenReview flood, a write burst) never delays a renewal, and a renewal
    never waits behind the binary's queue of writes. A few requests per retry period at most,
    so a small bucket. docs/rules.md#leadership-loss.
    """
    return KubeClient(config, qps=5.0, burst=10, user_agent=f"{user_agent}/leader-election")


def leader_timing_problem(lease_duration: float, renew_deadline: float,
                          retry_period: float) -> str | None:
    """What is wrong with these timings (seconds), named by their flags, or None.

    The leader must give up before a follower may take over (renew deadline < lease duration),
    and have more than one jittered attempt within its renew deadline (client-go's rules).
    """
    if min(lease_duration, renew_deadline, retry_period) <= 0:
        return ("--leader-elect-lease-duration, --leader-elect-renew-deadline and "
                "--leader-elect-retry-period must be > 0")
    if lease_duration <= renew_deadline:
        return "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline"
    if renew_deadline <= JITTER_FACTOR * retry_period:
        return ("--leader-elect-renew-deadline must be greater than 1.2 × "
                "--leader-elect-retry-period")
    return None


class LeaderElector:
    """Lease-based leader election.

    Args:
        client: the KubeClient.
        name, namespace: the Lease object.
        identity: this candidate's holderIdentity (unique per process, e.g. the pod name).
        lease_duration: seconds a follower waits after the last observed change before
            taking over (15).
        renew_deadline: seconds the leader keeps retrying a renewal before stepping down (10).
        retry_period: seconds between attempts (2).
        release_on_exit: release the lease when the guarded block exits cleanly.
        rng: jitter source returning U[0,1) (tests pass ``lambda: 0.0``).
        wall_clock: returns the current UTC datetime for acquireTime/renewTime.

    Raises:
        ValueError: lease_duration <= renew_deadline, or renew_deadline <= 1.2 × retry_period,
            or a non-positive period.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_exit: bool = True,
        rng: Callable[[], float] | None = None,
        wall_clock: Callable[[], dt.datetime] | None = None,
    ):
        if not identity:
            raise ValueError("identity must not be empty")
        problem = leader_timing_problem(lease_duration, renew_deadline, retry_period)
        if problem:
            raise ValueError(problem)
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_exit = release_on_exit
        self._rng = rng or random.random
        self._wall = wall_clock or (lambda: dt.datetime.now(dt.UTC))
        self._observed: tuple[Any, ...] | None = None
        self._observed_time = 0.0
        self._other_expires_at: float | None = None
        self._lease: dict[str, Any] | None = None
        self.is_leader = False
        self._stepping_down = False
        self._on_lost: list[Callable[[], None]] = []
        self._leadership: Leadership | None = None
        self._campaign: trio.CancelScope | None = None
        self.last_error: str | None = None
        """The last Lease error that needs a fix (403, 404 on create), None once one succeeds."""
        self._logged: tuple[str, float] | None = None

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the Lease (``bigfleet_leader_election_is_leader``)."""
        return self._is_leader

    @is_leader.setter
    def is_leader(self, value: bool) -> None:
        self._is_leader = value
        metrics.LEADER.set(1.0 if value else 0.0)
        stdmetrics.set_leader(self.name, value)

    @property
    def leader(self) -> str | None:
        """holderIdentity last observed on the Lease (None/"" if none)."""
        return self._observed[0] if self._observed else None

    # -- one attempt ----------------------------------------------------------------------------

    def _observe(self, spec: dict[str, Any]) -> None:
        record = (
            spec.get("holderIdentity") or "",
            spec.get("leaseDurationSeconds"),
            spec.get("acquireTime"),
            spec.get("renewTime"),
            spec.get("leaseTransitions"),
        )
        if record != self._observed:
            if self._observed is None or record[0] != self._observed[0]:
                log.info(
                    "lease holder observed lease=%s/%s holder=%s me=%s",
                    self.namespace,
                    self.name,
                    record[0] or "<none>",
                    self.identity,
                )
            self._observed = record
            self._observed_time = trio.current_time()

    async def try_acquire_or_renew(self) -> bool:
        """One GET + create/PUT round (client-go ``tryAcquireOrRenew``).

        Returns:
            True if we hold the lease afterwards. API/transport errors return False (logged).
        """
        now = rfc3339_micro(self._wall())
        try:
            try:
                lease = await self.client.get(LEASES, self.name, self.namespace)
            except NotFound:
                return await self._create_lease(now)
            spec = dict(lease.get("spec") or {})
            self._observe(spec)
            holder = spec.get("holderIdentity") or ""
            duration = _num(spec.get("leaseDurationSeconds")) or self.lease_duration
            if (
                holder
                and holder != self.identity
                and self._observed_time + float(duration) > trio.current_time()
            ):
                self._other_expires_at = self._observed_time + float(duration)
                return False
            self._other_expires_at = None
            if holder == self.identity:
                spec["renewTime"] = now
            else:  # taking over (from another holder or a released lease)
                spec["acquireTime"] = now
                spec["renewTime"] = now
                spec["leaseTransitions"] = int(_num(spec.get("leaseTransitions"))) + 1
            spec["holderIdentity"] = self.identity
            spec["leaseDurationSeconds"] = int(self.lease_duration)
            lease["spec"] = spec
            updated = await self.client.update(LEASES, lease, self.namespace)
            self._lease = updated
            self._observe(updated.get("spec") or spec)
            self.last_error = None
            return True
        except (AlreadyExists, Conflict) as exc:
            log.info(
                "lease race lost lease=%s/%s me=%s: %s",
                self.namespace,
                self.name,
                self.identity,
                exc.reason,
            )
            return False
        except ApiError as exc:
            fix = _lease_error_fix(exc, self.namespace, self.name)
            if fix is None:
                log.warning(
                    "lease attempt failed lease=%s/%s me=%s err=%s",
                    self.namespace, self.name, self.identity, exc,
                )
                return False
            self._lease_error(exc, *fix)
            return False
        except KubeTransportError as exc:
            log.warning(
                "lease attempt failed lease=%s/%s me=%s err=%s",
                self.namespace,
                self.name,
                self.identity,
                exc,
            )
            return False

    async def _create_lease(self, now: str) -> bool:
        """Create the Lease held by this identity (there was none); returns True.

        Raises:
            AlreadyExists: another candidate created it first (the caller logs the lost race);
                AlreadyExists for the Lease this very call wrote (a replayed create) is ours.
        """
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        try:
            created = await self.client.create(
                LEASES,
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                },
                self.namespace,
            )
        except AlreadyExists:
            # A create replayed after it landed (its answer lost with a stale connection) finds
            # the Lease we wrote: ours if it carries this identity and this attempt's times.
            created = await self.client.get(LEASES, self.name, self.namespace)
            have = created.get("spec") or {}
            if (have.get("holderIdentity") != self.identity
                    or have.get("acquireTime") != now or have.get("renewTime") != now):
                raise
            log.info("lease create replayed after it landed: ours lease=%s/%s me=%s",
                     self.namespace, self.name, self.identity)
        self._lease = created
        self._observe(created.get("spec") or spec)
        self.last_error = None
        return True

    def _lease_error(self, exc: ApiError, reason: str, fix: str) -> None:
        """Count a Lease error that waiting cannot cure and say, at ERROR, how to fix it."""
        from bigfleet_trio.observability.metrics import LEASE_ERRORS

        LEASE_ERRORS.labels(reason).inc()
        self.last_error = f"{exc.status} {exc.reason} on Lease {self.namespace}/{self.name}"
        now = trio.current_time()
        if (self._logged is None or self._logged[0] != self.last_error
                or now - self._logged[1] >= _ERROR_REPEAT_S):
            self._logged = (self.last_error, now)
            log.error(
                "leader election cannot use its Lease: %s: %s; fix: %s",
                self.last_error, exc, fix,
                extra={"lease": f"{self.namespace}/{self.name}", "status": exc.status,
                       "reason": reason},
            )

    # -- loops ----------------------------------------------------------------------------------

    async def acquire(self) -> None:
        """Campaign until this identity holds the lease."""
        while True:
            if await self.try_acquire_or_renew():
                self.is_leader = True
                log.info(
                    "lease acquired lease=%s/%s me=%s", self.namespace, self.name, self.identity
                )
                return
            delay = self.retry_period * (1.0 + CAMPAIGN_JITTER * self._rng())
            expires_at = self._other_expires_at
            if expires_at is not None:
                # Wake right when the holder's lease runs out (as we observed it) instead of up to
                # one jittered retry period later: a killed leader is replaced within
                # lease_duration + one observation delay (<= 15 + 4.4 s with the defaults).
                until = expires_at - trio.current_time() + _EXPIRY_MARGIN
                delay = min(delay, max(until, _EXPIRY_MARGIN))
            await trio.sleep(delay)

    async def _renew_loop(self, leadership: Leadership) -> None:
        while True:
            await trio.sleep(self.retry_period)
            renewed = False
            with trio.move_on_after(self.renew_deadline):
                while True:
                    if await self.try_acquire_or_renew():
                        renewed = True
                        break
                    await trio.sleep(self.retry_period)
            if not renewed:
                log.error(
                    "lease lost (no renewal within %gs) lease=%s/%s me=%s",
                    self.renew_deadline,
                    self.namespace,
                    self.name,
                    self.identity,
                )
                self.is_leader = False
                leadership.lost = True
                # Before the cancel: work that outlives a cancellation (shielded drains with a
                # shutdown grace) stops now, not after its grace, since the Lease can expire
                # and another replica lead (docs/rules.md#leadership-loss).
                for stop in self._on_lost:
                    try:
                        stop()
                    except Exception:
                        log.exception("leadership-loss callback failed")
                leadership.cancel_scope.cancel()
                return

    async def release(self) -> bool:
        """Give the lease up if we hold it (holder "", duration 1 s). Returns True on success."""
        lease = self._lease
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return False
        now = rfc3339_micro(self._wall())
        spec = dict(lease.get("spec") or {})
        spec.update(
            {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now, "acquireTime": now}
        )
        body = {**lease, "spec": spec}
        try:
            self._lease = await self.client.update(LEASES, body, self.namespace)
        except (ApiError, KubeTransportError) as exc:
            log.warning(
                "lease release failed lease=%s/%s me=%s err=%s",
                self.namespace,
                self.name,
                self.identity,
                exc,
            )
            return False
        log.info("lease released lease=%s/%s me=%s", self.namespace, self.name, self.identity)
        return True

    def on_lost(self, stop: Callable[[], None]) -> None:
        """Call ``stop()`` (synchronously, before the guarded work is cancelled) whenever a
        tenure is lost because renewal failed: for work that would otherwise outlive the
        cancellation, such as drains given a shutdown grace. Not called on :meth:`step_down` or
        a clean exit, where the Lease is still held (docs/rules.md#leadership-loss)."""
        self._on_lost.append(stop)

    def step_down(self) -> None:
        """Stop leading for good: cancel the guarded work, keep renewing until it has returned,
        then release (docs/rules.md#leader-hand-over-on-sigterm). While campaigning, stop
        campaigning. :meth:`run` then returns. Idempotent; never blocks.
        """
        self._stepping_down = True
        if self._leadership is not None:
            self._leadership.cancel_scope.cancel()
        if self._campaign is not None:
            self._campaign.cancel()

    @asynccontextmanager
    async def leading(self) -> AsyncIterator[Leadership]:
        """Wait for leadership, then run the block while renewing.

        Yields:
            The :class:`Leadership`. If the lease is lost the block is cancelled and the
            ``async with`` exits normally with ``leadership.lost == True``. Exceptions from the
            block propagate. On any exit other than a loss the lease is released (shielded,
            bounded by ``renew_deadline``) when ``release_on_exit`` is set.
        """
        await self.acquire()
        async with self._tenure() as leadership:
            yield leadership

    @asynccontextmanager
    async def _tenure(self) -> AsyncIterator[Leadership]:
        """The leader's side of :meth:`leading`, entered once the lease is held."""
        leadership = Leadership(self.identity, trio.current_time())
        self._leadership = leadership
        if self._stepping_down:
            leadership.cancel_scope.cancel()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._renew_loop, leadership)
                # The renew loop is cancelled only after the body has returned (or was lost):
                # a body cancelled by step_down() may take a while to finish, and it is still
                # the leader's until then.
                with leadership.cancel_scope:
                    yield leadership
                nursery.cancel_scope.cancel()
        finally:
            self._leadership = None
            was_leader = self.is_leader
            self.is_leader = False
            if was_leader and not leadership.lost and self.release_on_exit:
                with trio.CancelScope(shield=True), trio.move_on_after(self.renew_deadline):
                    await self.release()

    async def run(
        self,
        work: Callable[[], Awaitable[object]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Campaign, run ``work()`` as leader, re-campaign after a loss; return when it returns
        or after :meth:`step_down` (once the work has returned and the lease is released)."""
        task_status.started()
        while not self._stepping_down:
            with trio.CancelScope() as campaign:
                self._campaign = campaign
                try:
                    await self.acquire()
                finally:
                    self._campaign = None
            if campaign.cancelled_caught:
                return  # stepped down while campaigning
            async with self._tenure() as leadership:
                await work()
            if not leadership.lost or self._stepping_down:
                return
            log.warning(
                "leadership lost, campaigning again lease=%s/%s me=%s",
                self.namespace,
                self.name,
                self.identity,
            )


def _num(value: object) -> float:
    """A numeric Lease field, 0 when absent or malformed."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value)) if value is not None else 0.0
    except ValueError:
        return 0.0
