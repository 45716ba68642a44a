"""Operator wiring units (CapacityRequestRollup, OperatorHandlers, informer helpers) and the
operator process over real loopback sockets (embedded apiserver + simulated shard over grpclib,
diagnostics HTTP, leader election, SIGTERM)."""

from __future__ import annotations

import logging
import os
import signal
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from bigfleet_trio.config import OperatorConfig
from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import KubeConfig, load_kubeconfig
from bigfleet_trio.kube.errors import KubeConfigError
from bigfleet_trio.kube.resources import CAPACITY_REQUESTS, LEASES
from bigfleet_trio.observability.events import EventFeed
from bigfleet_trio.operator.app import Operator, run_operator, serve_operator
from bigfleet_trio.operator.rollup.errors import CapacityRequestError
from bigfleet_trio.operator.wiring import (
    CapacityRequestRollup,
    OperatorHandlers,
    node_ref_index,
    provider_id_index,
    slim_node,
)
from bigfleet_trio.proto import pb
from bigfleet_trio.shard.transport import MemoryConnector
from tests.support import capacity


def cr(name: str, rv: str, *, cpu: str = "1", op: str | None = None,
       phase: str | None = None) -> dict[str, Any]:
    extra = {"requirements": [{"key": "k", "operator": op, "values": ["1"]}]} if op else {}
    return capacity.cr(name, 5, {"cpu": cpu}, namespace="ns", resource_version=rv,
                       phase=phase, **extra)


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    async def create_event(self, involved: Any, *, reason: str, message: str,
                           type: str = "Normal", component: str = "x") -> None:  # noqa: A002
        self.calls.append((involved["metadata"]["name"], reason, type))


class Ack:
    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []

    def submit_keys(self, keys: Any) -> int:
        keys = list(keys)
        self.keys.extend(keys)
        return len(keys)


class Store:
    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}

    def items(self) -> Any:
        return iter(list(self.objs.items()))


def source(**kw: Any) -> tuple[CapacityRequestRollup, Events, Ack, Store]:
    events, ack, store = Events(), Ack(), Store()
    src = CapacityRequestRollup("c1", events=events, acknowledger=ack, store=store,
                                now_ns=lambda: 42, **kw)
    return src, events, ack, store


def feed_add(src: CapacityRequestRollup, store: Store, obj: dict[str, Any]) -> None:
    key = f"ns/{obj['metadata']['name']}"
    old = store.objs.get(key)
    store.objs[key] = obj
    if old is None:
        src.on_add(obj)
    else:
        src.on_update(old, obj)


# ------------------------------------------------------------------ CapacityRequestRollup


async def test_build_aggregates_and_acknowledges_only_pending_contributors() -> None:
    src, _, ack, store = source()
    feed_add(src, store, cr("a", "1", cpu="1"))
    feed_add(src, store, cr("b", "2", cpu="500m", phase="Pending"))
    feed_add(src, store, cr("c", "3", cpu="2", phase="Acknowledged"))
    feed_add(src, store, cr("g", "4", op="Gt"))
    msg = await src.build()
    assert msg.cluster_id == "c1" and msg.timestamp_unix_nanos == 42
    # one profile (priority 5, no requirements): 1 + 0.5 + 2 = 3.5 cpu, max unit 2
    assert [(dict(n.aggregate_resources), dict(n.min_unit)) for n in msg.needs] == [
        ({"cpu": "3500m"}, {"cpu": "2"})
    ]
    await src.after_enqueue()
    assert sorted(ack.keys) == [("ns", "a"), ("ns", "b")]  # c acknowledged, g excluded
    await src.after_enqueue()  # nothing new since the last build
    assert len(ack.keys) == 2
    stats = src.statistics()
    assert (stats.rollups_built, stats.needs_last_rollup, stats.crs_contributing,
            stats.crs_excluded, stats.acks_submitted) == (1, 1, 3, 1, 2)


async def test_exclusion_reported_once_per_version_and_cleared() -> None:
    feed = EventFeed()
    src, events, _, store = source(feed=feed)
    async with feed.subscribe() as sub, trio.open_nursery() as n:
        await n.start(src.run)
        feed_add(src, store, cr("g", "1", op="Gt"))
        feed_add(src, store, cr("g", "1", op="Gt"))  # relist replay, same version
        feed_add(src, store, cr("n", "2", cpu="-1"))
        await trio.testing.wait_all_tasks_blocked()
        assert events.calls == [("g", "UnsupportedRequirement", "Warning"),
                                ("n", "InvalidCapacityRequest", "Warning")]
        feed_add(src, store, cr("g", "3", op="Lt"))  # new version, still excluded
        await trio.testing.wait_all_tasks_blocked()
        assert events.calls[-1] == ("g", "UnsupportedRequirement", "Warning")
        assert len(events.calls) == 3
        feed_add(src, store, cr("g", "4", op="In"))  # fixed: included, nothing reported
        src.on_delete(store.objs.pop("ns/n"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(events.calls) == 3
        assert src.statistics().crs_excluded == 0
        assert src.statistics().exclusions_reported == 3
        kinds = [sub.receive_nowait() for _ in range(3)]
        assert [e["kind"] for e in kinds] == ["capacityrequest_excluded"] * 3
        assert kinds[0]["cr"] == "ns/g" and kinds[0]["reason"] == "UnsupportedRequirement"
        n.cancel_scope.cancel()


def _excluded(reason: str) -> float:
    return REGISTRY.get_sample_value(
        "bigfleet_operator_capacityrequests_excluded_total", {"reason": reason}
    ) or 0.0


def _excluded_current() -> float | None:
    return REGISTRY.get_sample_value("bigfleet_operator_capacityrequests_excluded_current")


async def test_exclusion_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bigfleet_trio.operator.wiring")
    unsupported, invalid = _excluded("UnsupportedRequirement"), _excluded("InvalidCapacityRequest")
    src, _, _, store = source()  # run() not started: the Event queue just fills, unread

    def exclusion_lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "excluded from the roll-up" in r.getMessage()]

    feed_add(src, store, cr("g", "1", op="Gt"))
    [rec] = exclusion_lines()
    assert rec.levelno == logging.WARNING and rec.name == "bigfleet_trio.operator.wiring"
    msg = rec.getMessage()
    assert "cr=ns/g" in msg and "resourceVersion=1" in msg
    assert "reason=UnsupportedRequirement" in msg and "'Gt'" in msg
    assert "field=spec.requirements[0].operator" in msg
    assert _excluded("UnsupportedRequirement") == unsupported + 1
    assert _excluded_current() == 1.0  # a gauge set from this source's own count

    feed_add(src, store, cr("g", "1", op="Gt"))  # relist replay of the same version: silent
    assert len(exclusion_lines()) == 1
    assert _excluded("UnsupportedRequirement") == unsupported + 1

    feed_add(src, store, cr("l", "2", op="Lt"))
    feed_add(src, store, cr("g", "3", op="Lt"))  # new version of g, still excluded
    lines = exclusion_lines()
    assert len(lines) == 3
    assert "cr=ns/l" in lines[1].getMessage() and "'Lt'" in lines[1].getMessage()
    assert "cr=ns/g" in lines[2].getMessage() and "resourceVersion=3" in lines[2].getMessage()
    assert _excluded("UnsupportedRequirement") == unsupported + 3
    assert _excluded("InvalidCapacityRequest") == invalid  # other reasons untouched
    assert _excluded_current() == 2.0  # g and l (g counted once across versions)

    feed_add(src, store, cr("g", "4", op="In"))  # fixed: back in the roll-up
    assert any(r.levelno == logging.INFO and "included again cr=ns/g" in r.getMessage()
               for r in caplog.records)
    assert _excluded_current() == 1.0
    src.on_delete(store.objs.pop("ns/l"))
    assert _excluded_current() == 0.0
    assert _excluded("UnsupportedRequirement") == unsupported + 3  # a counter never goes down
    assert len(exclusion_lines()) == 3


async def test_consistency_check_detects_and_repairs(autojump_clock: trio.abc.Clock) -> None:
    src, _, _, store = source(consistency_interval=30.0)
    feed_add(src, store, cr("a", "1", cpu="1"))
    feed_add(src, store, cr("b", "2", cpu="1"))
    assert await src.check_consistency()
    # a lost DELETE: the store forgot b but the aggregate still counts it
    del store.objs["ns/b"]
    async with trio.open_nursery() as n:
        await n.start(src.run)
        await trio.sleep(31)
        n.cancel_scope.cancel()
    stats = src.statistics()
    assert (stats.consistency_checks, stats.consistency_mismatches) == (2, 1)
    msg = await src.build()
    assert [dict(n.aggregate_resources) for n in msg.needs] == [{"cpu": "1"}]
    assert await src.check_consistency()


async def test_no_store_and_bad_arguments() -> None:
    src = CapacityRequestRollup("c1", events=None, acknowledger=None)
    assert await src.check_consistency()
    src.on_add(cr("g", "1", op="Gt"))  # no Event sink: log + metric only
    await src.after_enqueue()
    with pytest.raises(ValueError):
        CapacityRequestRollup("", events=None, acknowledger=None)
    with pytest.raises(ValueError):
        CapacityRequestRollup("c", events=None, acknowledger=None, consistency_interval=0)
    assert issubclass(CapacityRequestError, ValueError)


# ------------------------------------------------------------------ OperatorHandlers


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_bootstrap_request(self, req: pb.BootstrapRequest) -> pb.BootstrapBlobResponse:
        self.calls.append("bootstrap")
        return pb.BootstrapBlobResponse(request_id=req.request_id, user_data=b"abc")

    async def on_reclaim_instruction(self, instr: pb.ReclaimInstruction, reply: Any) -> None:
        self.calls.append("reclaim")
        reply(pb.OperatorMessage(reclaim_ack=pb.ReclaimAck(instr.instruction_id, 2)))

    async def on_node_state_update(self, u: pb.NodeStateUpdate) -> None:
        self.calls.append("node")

    async def on_available_capacity(self, u: pb.AvailableCapacityUpdate) -> None:
        self.calls.append("available")


async def test_handlers_forward_and_publish() -> None:
    feed, rec = EventFeed(), Recorder()
    h = OperatorHandlers(bootstrap=rec, reclaim=rec, upcoming=rec, available=rec, feed=feed)
    replies: list[pb.OperatorMessage] = []
    async with feed.subscribe() as sub:
        resp = await h.on_bootstrap_request(pb.BootstrapRequest(request_id="r1"))
        assert resp.user_data == b"abc"
        await h.on_reclaim_instruction(
            pb.ReclaimInstruction(instruction_id="i1", nodes=["n1", "n2"]),
            lambda m: replies.append(m) is None,
        )
        await h.on_node_state_update(
            pb.NodeStateUpdate(machine_id="m1", state=pb.MachineState.CONFIGURED))
        await h.on_available_capacity(pb.AvailableCapacityUpdate(supersedes_key="k"))
        got = [sub.receive_nowait() for _ in range(5)]
        with pytest.raises(trio.WouldBlock):
            sub.receive_nowait()
    assert rec.calls == ["bootstrap", "reclaim", "node", "available"]
    assert replies[0].reclaim_ack.nodes_started == 2
    assert [e["kind"] for e in got] == ["bootstrap", "reclaim", "reclaim_ack", "node_state",
                                        "available_capacity"]
    assert got[0]["request_id"] == "r1" and got[0]["bytes"] == 3
    assert got[1]["nodes"] == ["n1", "n2"] and got[2]["nodes_started"] == 2
    assert got[3]["state"] == "CONFIGURED" and got[3]["machine_id"] == "m1"


def test_informer_helpers() -> None:
    assert node_ref_index({"status": {"nodeRef": {"name": "n1"}}}) == ["n1"]
    assert node_ref_index({"status": {}}) == []
    assert node_ref_index({}) == []
    assert provider_id_index({"spec": {"providerID": "sim://1"}}) == ["sim://1"]
    assert provider_id_index({"spec": {"providerID": ""}}) == []
    assert provider_id_index({"spec": {"providerID": 7}}) == []  # hand-edited junk: not indexed
    assert provider_id_index({"spec": "junk"}) == []
    assert provider_id_index({}) == []
    node = {
        "metadata": {"name": "n1", "uid": "u", "resourceVersion": "3", "labels": {"a": "b"},
                     "annotations": {"big": "x" * 100}},
        "spec": {"unschedulable": True, "providerID": "sim://1", "podCIDR": "10.0.0.0/24"},
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                  {"type": "Ready", "status": "True"}],
                   "images": [1, 2, 3]},
    }
    assert slim_node(node) == {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "uid": "u", "resourceVersion": "3", "labels": {"a": "b"}},
        "spec": {"unschedulable": True, "providerID": "sim://1"},
        "status": {"ready": "True"},
    }


# ------------------------------------------------------------------ Operator construction


def test_operator_renderer_from_config(tmp_path: Path) -> None:
    from bigfleet_trio.operator.bootstrap import BootstrapTemplateError, FileRenderer, StubRenderer

    conn = MemoryConnector()
    cfg = OperatorConfig(cluster_id="c1", shard_addr="h:1")
    op = Operator(cfg, client=None, connector=conn)  # type: ignore[arg-type]
    assert isinstance(op.renderer, StubRenderer)
    assert op.statistics().session_up is False
    assert op.ready() == (False, ["operator not running"])
    assert op.parts is None
    cfg = OperatorConfig(cluster_id="c1", shard_addr="h:1",
                         bootstrap_template="#x {{ cluster_id }}")
    op = Operator(cfg, client=None, connector=conn)  # type: ignore[arg-type]
    assert isinstance(op.renderer, FileRenderer)
    assert op.renderer.render("c9", "r", []) == b"#x c9"
    bad = tmp_path / "t.j2"
    bad.write_text("{% if %}")
    with pytest.raises(BootstrapTemplateError):
        Operator(OperatorConfig(cluster_id="c1", shard_addr="h:1",
                                bootstrap_template_file=str(bad)),
                 client=None, connector=conn)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Operator(OperatorConfig(shard_addr="h:1"), client=None,  # type: ignore[arg-type]
                 connector=conn)


def test_run_operator_bad_kubeconfig_raises(tmp_path: Path) -> None:
    cfg = OperatorConfig(cluster_id="c1", shard_addr="127.0.0.1:1",
                         kubeconfig=str(tmp_path / "missing"))
    with pytest.raises(KubeConfigError):
        run_operator(cfg)


def test_cli_operator_bad_kubeconfig_exits_1(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from bigfleet_trio.cli import main

    rc = main(["operator", "--cluster-id", "c1", "--shard-addr", "127.0.0.1:1",
               "--kubeconfig", str(tmp_path / "missing")])
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("operator: ")


# ------------------------------------------------------------------ the process, real sockets


async def test_process_over_sockets_with_leader_election_and_sigterm(tmp_path: Path) -> None:
    from bigfleet_trio.shard import grpc
    from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig
    from bigfleet_trio.sim.shard.cli import serve_sim_shard
    from bigfleet_trio.sim.shard.engine import EngineConfig
    from bigfleet_trio.sim.shard.session import SimShard

    server = ApiServer()
    shard = SimShard(config=EngineConfig(seed=1))
    ops: list[Operator] = []
    with trio.fail_after(30):
        async with grpc.open_loop(), trio.open_nursery() as nursery:
            url = await nursery.start(serve, server)
            kc = tmp_path / "kubeconfig"
            write_kubeconfig(url, str(kc))
            port = await nursery.start(partial(serve_sim_shard, shard, port=0))
            cfg = OperatorConfig(
                cluster_id="c1", shard_addr=f"127.0.0.1:{port}", kubeconfig=str(kc),
                rollup_interval=0.2, metrics_addr="127.0.0.1:0",
                health_probe_addr="127.0.0.1:0", leader_elect=True,
                leader_election_namespace="default", drain_shutdown_timeout=1.0,
            )
            cfg.validate()
            done = trio.Event()

            async def run_it(task_status: trio.TaskStatus[list[str | None]]) -> None:
                await serve_operator(cfg, on_operator=ops.append, task_status=task_status)
                done.set()

            bound = await nursery.start(run_it)
            assert len(bound) == 2 and all(bound)
            kcfg = load_kubeconfig(str(kc), env={})
            async with httpx.AsyncClient() as http, KubeClient(kcfg) as kube:
                await kube.create(CAPACITY_REQUESTS, {
                    "apiVersion": "bigfleet.lucy.sh/v1alpha1", "kind": "CapacityRequest",
                    "metadata": {"name": "a", "namespace": "default"},
                    "spec": {"priority": 1, "resources": {"cpu": "1"}},
                }, "default")
                # real sockets, real time: poll the other process-like parts (no shared event)
                for addr in bound:
                    while (await http.get(f"http://{addr}/readyz")).status_code != 200:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                ready = (await http.get(f"http://{bound[0]}/readyz")).json()
                assert ready["detail"] == ["leader", "informers synced", "shard session up"]
                r = await http.get(f"http://{bound[0]}/metrics")
                assert "bigfleet_operator_session_up 1.0" in r.text
                assert "bigfleet_unschedulable_pod_controller" not in r.text
                await shard.wait_until(lambda s: bool(s.last_rollup and s.last_rollup.needs))
                assert shard.last_rollup is not None
                assert dict(shard.last_rollup.needs[0].aggregate_resources) == {"cpu": "1"}
                async def phase() -> str:
                    obj = await kube.get(CAPACITY_REQUESTS, "a", "default")
                    return str((obj.get("status") or {}).get("phase", ""))

                while await phase() != "Acknowledged":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                lease = await kube.get(LEASES, "bigfleet-operator", "default")
                assert lease["spec"]["holderIdentity"]
                os.kill(os.getpid(), signal.SIGTERM)
                await done.wait()
                lease = await kube.get(LEASES, "bigfleet-operator", "default")
                assert not lease["spec"].get("holderIdentity")  # released on the way out
            assert ops and not ops[0].ready()[0]
            nursery.cancel_scope.cancel()


async def _reachable(*_a: Any, **_k: Any) -> None:
    """``check_reachable`` passing (these tests fake the server behind it)."""


def test_run_operator_unwraps_sync_timeout_for_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve_operator runs inside nurseries, so a SyncTimeout leaves trio.run wrapped in
    # exception groups; the CLI must get the bare error to print `operator: <message>`.
    from bigfleet_trio.kube.informer import SyncTimeout
    from bigfleet_trio.operator import app

    async def fake_serve(*_a: Any, **_k: Any) -> None:
        async with trio.open_nursery() as outer:
            async with trio.open_nursery():
                raise SyncTimeout("timed out after 30s waiting for informer caches to sync (x)")
            outer.cancel_scope.cancel()

    kc = tmp_path / "kc"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setattr(app, "serve_operator", fake_serve)
    monkeypatch.setattr(app, "check_reachable", _reachable)
    cfg = OperatorConfig(cluster_id="c1", shard_addr="s:1", kubeconfig=str(kc))
    with pytest.raises(SyncTimeout, match=r"^timed out after 30s .*\(x\)$"):
        run_operator(cfg)


def test_cli_operator_401_at_start_exits_1_with_one_line_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The apiserver refuses the credentials: the process must end with one line naming the 401
    # as soon as it is seen, not "timed out after 3s ..." once --sync-timeout has passed.
    from bigfleet_trio.cli import main
    from bigfleet_trio.operator import app

    seen: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(401, json={"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                         "message": "Unauthorized", "reason": "Unauthorized",
                                         "code": 401})

    def refusing_client(cfg: KubeConfig, **kw: Any) -> KubeClient:
        return KubeClient(cfg, transport=httpx.MockTransport(refuse), **kw)

    monkeypatch.setattr(app, "KubeClient", refusing_client)
    monkeypatch.setattr(app, "check_reachable", _reachable)  # the informers meet the 401
    kc = tmp_path / "kc"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: wrong}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    rc = main(["operator", "--cluster-id", "c1", "--shard-addr", "127.0.0.1:1",
               "--kubeconfig", str(kc), "--metrics-addr", "127.0.0.1:0",
               "--sync-timeout", "3", "--log-level", "error"])
    assert rc == 1
    assert seen  # the informers did ask
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("operator: 401 Unauthorized: "), err[-3:]


async def test_send_timeout_reaches_the_session_config() -> None:

    cfg = OperatorConfig(cluster_id="c1", shard_addr="s:1", send_timeout=7.5)
    client = KubeClient(
        KubeConfig(server="http://k"), transport=httpx.MockTransport(lambda r: httpx.Response(404))
    )
    op = Operator(cfg, client=client, connector=MemoryConnector(), feed=EventFeed())
    assert op.build().agent.config.session.send_timeout == 7.5
    await client.aclose()


async def test_runtime_render_failures_are_counted_and_surface_in_readiness() -> None:
    from bigfleet_trio.operator.bootstrap import FileRenderer

    # renders the start-up check, fails on a request whose requirement has no values
    tpl = "{% for r in requirements %}{{ r.values[0] }}{% endfor %}"
    cfg = OperatorConfig(cluster_id="c1", shard_addr="s:1")
    client = KubeClient(
        KubeConfig(server="http://k"), transport=httpx.MockTransport(lambda r: httpx.Response(404))
    )
    op = Operator(cfg, client=client, connector=MemoryConnector(), feed=EventFeed(),
                  renderer=FileRenderer(tpl, name="t.j2"))
    op._rt = op.build()
    op._running = True
    before = REGISTRY.get_sample_value("bigfleet_operator_bootstrap_render_failures_total") or 0
    reply = op._rt.handlers.bootstrap.respond(pb.BootstrapRequest(
        request_id="r1", requirements=[pb.NodeSelectorRequirement(key="k")]))
    assert reply.error and not reply.user_data
    assert REGISTRY.get_sample_value("bigfleet_operator_bootstrap_render_failures_total") == (
        before + 1)
    ok, reasons = op.ready()
    assert not ok
    assert reasons[-1].startswith("bootstrap template render failing (1 failures): render ")
    ok_reply = op._rt.handlers.bootstrap.respond(pb.BootstrapRequest(request_id="r3"))
    assert ok_reply.error == "" and op.watched_renderer.last_error == ""
    assert not any("bootstrap" in r for r in op.ready()[1])
    await client.aclose()


async def test_the_consistency_check_yields_to_the_loop_while_it_rebuilds() -> None:
    """A from-scratch rebuild of 150,000 CRs must not hold the event loop (docs/kube-api.md
    #relist-apply's rule for long synchronous stretches): it yields every ``chunk`` CRs."""
    src, _, _, store = source(consistency_interval=30.0)
    for i in range(10):
        feed_add(src, store, cr(f"c{i}", str(i + 1), cpu="1"))
    ticks, done = 0, False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            await trio.lowlevel.checkpoint()
            ticks += 1

    async with trio.open_nursery() as n:
        n.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        before = ticks
        assert await src.check_consistency(chunk=2)
        during = ticks - before
        done = True
    assert during >= 5, during


async def test_the_upcoming_node_overlay_empties_as_the_informer_catches_up(
    nursery: trio.Nursery, autojump_clock: trio.abc.Clock
) -> None:
    """The wiring of docs/deviations.md UpcomingNode 6: the handler's last-write overlay is
    attached to the operator's UpcomingNode informer, so an entry lives only as long as the
    watch lags the write (it stayed for every machine ever written)."""
    from bigfleet_trio.sim.apiserver import ApiServer
    from bigfleet_trio.sim.apiserver.testing import InProcessTransport

    server = ApiServer()
    client = KubeClient(KubeConfig(server="http://apiserver"),
                        transport=InProcessTransport(server.app, nursery))
    cfg = OperatorConfig(cluster_id="c1", shard_addr="s:1")
    op = Operator(cfg, client=client, connector=MemoryConnector(), feed=EventFeed())
    parts = op.build()
    await nursery.start(parts.un_informer.run)
    await parts.un_informer.wait_synced()
    upcoming = parts.handlers.upcoming
    for i in range(10):
        await upcoming.on_node_state_update(pb.NodeStateUpdate(
            supersedes_key=f"node:m-{i}", machine_id=f"m-{i}", state=pb.MachineState.CREATING))
    await trio.sleep(1)
    assert len(parts.un_informer.store) == 10
    assert upcoming.overlay_entries == 0
