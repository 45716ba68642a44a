"""End to end: the demo scenario headless, real sockets (apiserver over HTTP,
the shard stream over grpclib on loopback), real time with a generous bound, then the final
state checked against the specs:

- every live Pod has exactly one CapacityRequest (docs/rules.md#pod-translation, ADR-0039);
- the shard's last roll-up equals ``build_from_scratch`` over the CRs (docs/rules.md#roll-up);
- the machines serving the demand are Configured and their UpcomingNodes Ready (CONFIGURED -> Ready,
  docs/rules.md#upcomingnode-phases), one Ready Node per machine, every Pod bound; any other
  UpcomingNode is a Failed one of a machine whose bootstrap failed (kept for the retention);
- after the scale-down the shard reclaimed machines, the operator acknowledged every instruction,
  the machines walked back to the pool, their UpcomingNodes were deleted (Draining -> Launched is
  inferred Drained and deleted, same table) and their Nodes removed.

"Reclaimed" is a fact about one binding of a machine: the drains evict Pods whose controllers
recreate them, that demand comes back, and the cheapest machine for it is a warm one just
released, so a reclaimed machine may be bound again (a later binding, same node and UpcomingNode
names). How often depends on timing (which machines the shard keeps, where the binder put Pods),
so the checks hold for either outcome: the reclaimed binding ended, and its UpcomingNode and Node
were deleted (counted in the apiserver's event history, since the names repeat across bindings).
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import trio

from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, NODES, PODS, UPCOMING_NODES
from bigfleet_trio.operator.rollup.aggregate import build_from_scratch
from bigfleet_trio.sim.binder import is_terminal, node_ready
from bigfleet_trio.sim.demo import run_scenario
from bigfleet_trio.sim.demo_options import DemoOptions
from bigfleet_trio.sim.demo_world import DemoTiming

OWNED = "bigfleet.lucy.sh/owned-by-pod"


async def test_demo_scenario_end_to_end(tmp_path: Any) -> None:
    checked: dict[str, Any] = {}

    async def inspect(env: dict[str, Any]) -> None:
        # the scenario's own verdict first: after a timeout the state below is a half-way one,
        # and the failure line says what did not converge
        assert env["summary"].ok, f"{env['summary'].failure}\n{out.getvalue()}"
        client, shard = env["client"], env["shard"]
        pods = [p for p in (await client.list(PODS)).items if not is_terminal(p)]
        crs = (await client.list(CAPACITY_REQUESTS)).items
        upcoming = {u["metadata"]["name"]: u for u in (await client.list(UPCOMING_NODES)).items}
        nodes = {n["metadata"]["name"]: n for n in (await client.list(NODES)).items}

        # every Pod has exactly one CR, and every CR belongs to a live Pod
        owners = sorted(c["metadata"]["labels"][OWNED] for c in crs)
        assert owners == sorted(p["metadata"]["uid"] for p in pods)
        # the roll-up the shard holds is the one built from scratch over the CRs
        want = sorted(bytes(n) for n in build_from_scratch(crs))
        assert sorted(bytes(n) for n in shard.last_rollup.needs) == want
        assert not [n.key for n in shard.engine.needs if n.short]
        # machines serving the demand: Configured, UpcomingNode Ready, Node Ready
        machines = shard.engine.bound_machines()
        assert machines
        for m in machines:
            assert m.state.name == "CONFIGURED", m.machine_id
            un = upcoming[f"un-{m.machine_id}"]
            assert un["status"]["phase"] == "Ready"
            assert un["status"]["nodeRef"]["name"] == m.node_name
            assert node_ready(nodes[m.node_name])
        # the other records are Failed ones, kept for the retention period: a bootstrap pull the
        # operator did not answer within its deadline (a loaded machine) fails the binding and
        # the shard takes the machine back (docs/rules.md#upcomingnode-retention)
        failed = {n for n, u in upcoming.items() if u["status"]["phase"] == "Failed"}
        assert len(upcoming) - len(failed) == len(machines)
        for name in failed:
            m = shard.engine.machine(name.removeprefix("un-"))
            assert not m.bound and m.last_error.startswith("bootstrap: ")
        # every Pod bound to an existing Node
        assert all(p["spec"].get("nodeName") in nodes for p in pods)
        # the scale-down: reclaimed, acked, released, UpcomingNode and Node gone
        recs = shard.reclaims_issued
        assert recs
        for r in recs:
            assert r.acked_at is not None
            assert r.released_at is not None
            m = shard.engine.machine(r.machine_id)
            assert m.binding >= r.binding >= 1
            if m.binding == r.binding:  # not bound since: nothing of it is left
                assert not m.bound
                assert f"un-{r.machine_id}" not in upcoming
                assert r.node_name not in nodes
            # else a later binding, checked with the serving machines above
        # every reclaimed binding's UpcomingNode was deleted from a reclaim phase and its Node
        # deleted cordoned: one deletion each, whatever happened to the names afterwards
        server = env["server"]
        un_hist = server.store.bucket(server.find("upcomingnodes"))
        node_hist = server.store.bucket(server.find("nodes"))
        assert un_hist.dropped_rv == 0 and node_hist.dropped_rv == 0  # the history is whole
        un_drained = Counter(
            e.obj["metadata"]["name"] for e in un_hist.history
            if e.type == "DELETED" and (e.obj.get("status") or {}).get("phase")
            in ("Draining", "Drained"))
        node_cordoned = Counter(
            e.obj["metadata"]["name"] for e in node_hist.history
            if e.type == "DELETED" and (e.obj.get("spec") or {}).get("unschedulable"))
        assert un_drained == Counter(f"un-{r.machine_id}" for r in recs)
        assert node_cordoned == Counter(r.node_name for r in recs)
        stats = env["operator"].statistics()
        assert stats.drains_active == 0
        assert stats.drains_completed == len(recs)
        checked["ok"] = True

    out = io.StringIO()
    # A bound, not a speed claim: alone this takes ~20 s; on a CI machine at load ~15 (the process
    # gets a fraction of a core) phases take several times longer.
    opts = DemoOptions(timeout=240.0, seed=1, kubeconfig_out=str(tmp_path / "kubeconfig"))
    with trio.fail_after(270):
        summary = await run_scenario(opts, out=out, timing=DemoTiming(), inspect=inspect)
    assert summary.ok, f"{summary.failure}\n{out.getvalue()}"
    assert checked.get("ok"), out.getvalue()
    assert summary.pods_created == 62  # the bundled 61 and the fleet's fleet-idle
    assert summary.crs == 62
    assert summary.scaled_down
    assert summary.reclaims_issued == summary.reclaims_acked >= 1
    assert summary.upcoming_deleted == summary.reclaims_issued
    assert summary.drains_completed == summary.reclaims_issued
    # machines are conserved: reclaimed bindings leave, bindings started meanwhile (demand that
    # came back) join, failed ones leave
    assert (summary.final_machines_configured
            == summary.machines_configured - summary.reclaims_issued
            + summary.machines_bound_while_reclaiming
            - summary.machines_failed_while_reclaiming)
    text = out.getvalue()
    assert "converged:" in text and "scaling " in text
