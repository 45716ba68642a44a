"""Node hooks of the simulated shard, retried as a kubelet retries its registration.

:func:`retry_delay` and :func:`node_hook_due` are the pure plan (backoff, and whether a retry is
still wanted given the machine's engine state); :class:`NodeHookRunner` applies it: one attempt
inline, then one retry task per Node name in a nursery it owns. Rule: docs/deviations.md
("Simulated shard: Node registration retried").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import trio

from bigfleet_trio.proto import pb

if TYPE_CHECKING:
    from .engine import MachineInfo
    from .model import Machine
    from .session import NodeHooks

log = logging.getLogger(__name__)

HookKind = Literal["register", "deregister"]

# kubelet's registerWithAPIServer: 100 ms, doubled after each failed attempt, capped at 7 s,
# forever. The sim stands in for the kubelet, so it keeps the same schedule.
BACKOFF_INITIAL = 0.1
BACKOFF_CAP = 7.0

_HOOK_METHOD: dict[HookKind, str] = {
    "register": "on_machine_configured",
    "deregister": "on_machine_released",
}
# States in which the machine's Node should exist: Configured until drained back to Idle.
_NODE_STATES = frozenset({pb.MachineState.CONFIGURED, pb.MachineState.DRAINING})


def retry_delay(failures: int) -> float:
    """Seconds to wait before the next attempt after ``failures`` (>= 1) failed attempts in a
    row: 0.1, 0.2, 0.4, ... capped at :data:`BACKOFF_CAP` (7 s).

    Raises:
        ValueError: ``failures`` < 1.
    """
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    # 2**7 * 0.1 > 7: stop doubling there, so a day-long outage does not overflow a float
    return min(BACKOFF_INITIAL * float(2 ** min(failures - 1, 7)), BACKOFF_CAP)


def node_hook_due(kind: HookKind, machine: Machine | None, cluster_id: str = "") -> bool:
    """Whether a pending ``kind`` retry still matches the machine (the engine's current view).

    ``register`` is due while the machine is bound and CONFIGURED or DRAINING (its Node should
    exist); ``deregister`` while it is not (unbound, back in the pool, or bound again but not
    Configured yet). ``machine`` None (unknown id) counts as not bound. ``cluster_id``: the
    cluster the Node belongs to; a machine since bound to another cluster has no Node here.
    """
    has_node = (machine is not None and machine.bound and machine.cluster == cluster_id
                and machine.state in _NODE_STATES)
    return has_node if kind == "register" else not has_node


def _node_key(machine: MachineInfo) -> str:
    # One Node per cluster and name: a machine that moved has a Node to delete in one cluster
    # and one to create in another, and neither call may cancel the other.
    return f"{machine.cluster_id}/{machine.node_name}"


@dataclass
class _Pending:
    kind: HookKind
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)


class NodeHookRunner:
    """Runs node hooks: the first attempt inline (so the Node exists before the frames that
    follow it, when the apiserver answers), failures retried in the background.

    Args:
        hooks: the :class:`~.session.NodeHooks` to call.
        due: ``due(kind, machine)``: whether a retry is still wanted (see :func:`node_hook_due`).
        timeout: seconds one attempt may take before it is cancelled and counted as failed.
        on_change: called after each retry task ends (for waiters on the shard).

    Counters (the shard's snapshot shows them): ``errors`` failed attempts, ``retries``
    attempts after the first; ``pending`` Nodes with a retry waiting.
    """

    def __init__(self, hooks: NodeHooks, due: Callable[[HookKind, MachineInfo], bool], *,
                 timeout: float, on_change: Callable[[], None] = lambda: None) -> None:
        self.hooks = hooks
        self.due = due
        self.timeout = timeout
        self.on_change = on_change
        self.errors = 0
        self.retries = 0
        self._pending: dict[str, _Pending] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def pending(self) -> int:
        """Nodes with a retry task alive."""
        return len(self._pending)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the retry tasks until cancelled (cancelling ends them all)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    async def call(self, kind: HookKind, machine: MachineInfo) -> None:
        """Run the ``kind`` hook for ``machine`` once; on failure start a retry task.

        A retry still pending for the same Node is cancelled first, and waited for, so its
        in-flight request cannot land after this one (a late create after the delete).

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        if self._nursery is None:
            raise RuntimeError("NodeHookRunner.run() must be running")
        old = self._pending.get(_node_key(machine))
        if old is not None:
            old.scope.cancel()
            await old.done.wait()
        if await self._attempt(kind, machine, failures=0):
            return
        pending = _Pending(kind)
        self._pending[_node_key(machine)] = pending
        self._nursery.start_soon(self._retry, kind, machine, pending)

    async def _attempt(self, kind: HookKind, machine: MachineInfo, failures: int) -> bool:
        """One call of the hook; True on success. Logs one WARNING per failure streak."""
        try:
            with trio.fail_after(self.timeout):
                await getattr(self.hooks, _HOOK_METHOD[kind])(machine)
        except Exception as exc:
            self.errors += 1
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if failures == 0:
                log.warning("node %s failed node=%s machine=%s: %s; retrying with backoff "
                            "(%g s doubling to %g s) until it succeeds or the machine leaves "
                            "the state", kind, machine.node_name, machine.machine_id, what,
                            BACKOFF_INITIAL, BACKOFF_CAP)
                log.debug("node %s failure", kind, exc_info=True)
            else:
                log.debug("node %s failed again node=%s (%d in a row): %s", kind,
                          machine.node_name, failures + 1, what)
            return False
        if failures:
            log.info("node %s succeeded node=%s machine=%s after %d failed attempts", kind,
                     machine.node_name, machine.machine_id, failures)
        return True

    async def _retry(self, kind: HookKind, machine: MachineInfo, pending: _Pending) -> None:
        failures = 1
        try:
            with pending.scope:
                while True:
                    await trio.sleep(retry_delay(failures))
                    if not self.due(kind, machine):
                        log.info("node %s retry dropped node=%s machine=%s: the machine left "
                                 "that state", kind, machine.node_name, machine.machine_id)
                        return
                    self.retries += 1
                    if await self._attempt(kind, machine, failures):
                        return
                    failures += 1
        finally:
            if self._pending.get(_node_key(machine)) is pending:
                del self._pending[_node_key(machine)]
            pending.done.set()
            self.on_change()
