"""``--enable-profiling``: /debug/tasks and /debug/pprof/profile on the diagnostics listener
(docs/operate.md#profiling). The listener tests use real loopback sockets and trio.fail_after
(hypercorn and httpx do real I/O); the profiler's own timing runs on the autojump clock."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
import trio

from bigfleet_trio.config import OperatorConfig, PodControllerConfig
from bigfleet_trio.observability.authz import Decision
from bigfleet_trio.observability.profiling import Busy, Profiler, task_tree
from tests.support.diagnostics import diagnostics_server as _server


class _TokenAuth:
    """Allows the bearer token ``good``; 401 otherwise (as KubeAuthorizer answers no token)."""

    async def check(self, authorization: str | None, path: str, verb: str = "get") -> Decision:
        if authorization == "Bearer good":
            return Decision(200, "allowed", "tester")
        return Decision(401, "no bearer token")


async def test_task_tree_indents_children_by_depth() -> None:
    async def parked(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as inner:
            inner.start_soon(trio.sleep_forever, name="grandchild")
            task_status.started()
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(parked), name="child")
        me = trio.lowlevel.current_task()
        lines = task_tree(me).splitlines()
        assert lines[0] == me.name
        assert "  child" in lines
        assert "    grandchild" in lines
        whole = task_tree().splitlines()
        assert whole[0] == trio.lowlevel.current_root_task().name  # type: ignore[union-attr]
        assert any(line.strip() == "grandchild" for line in whole)
        nursery.cancel_scope.cancel()


async def test_profiler_one_at_a_time_and_bounded(autojump_clock: trio.abc.Clock) -> None:
    profiler = Profiler()
    results: list[str] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            results.append(await profiler.profile(5))

        nursery.start_soon(run)
        await trio.sleep(1)
        with pytest.raises(Busy):
            await profiler.profile(1)
    assert "cumulative" in results[0]
    for bad in (0, 61):
        with pytest.raises(ValueError):
            await profiler.profile(bad)
    start = trio.current_time()
    assert "function calls" in await profiler.profile(30)
    assert trio.current_time() - start == pytest.approx(30)


async def test_endpoints_answer_when_enabled() -> None:
    with trio.fail_after(20):
        async with _server(profiling=True) as addr, httpx.AsyncClient(timeout=10) as client:
            r = await client.get(f"http://{addr}/debug/tasks")
            assert r.status_code == 200
            assert r.text.splitlines()[0].strip() == r.text.splitlines()[0]
            assert any(line.startswith("  ") for line in r.text.splitlines())
            r = await client.get(f"http://{addr}/debug/pprof/profile", params={"seconds": "0"})
            assert r.status_code == 400
            answers: list[httpx.Response] = []

            async def profile() -> None:
                answers.append(await client.get(f"http://{addr}/debug/pprof/profile",
                                                params={"seconds": "1"}))

            async with trio.open_nursery() as nursery:  # two at once: one runs, one is refused
                nursery.start_soon(profile)
                nursery.start_soon(profile)
            assert sorted(r.status_code for r in answers) == [200, 409]
            done = next(r for r in answers if r.status_code == 200)
            assert "cumulative" in done.text


async def test_endpoints_404_when_disabled() -> None:
    with trio.fail_after(10):
        async with _server() as addr, httpx.AsyncClient() as client:
            for path in ("/debug/tasks", "/debug/pprof/profile?seconds=1"):
                r = await client.get(f"http://{addr}{path}")
                assert r.status_code == 404


async def test_unauthenticated_refused_like_metrics() -> None:
    with trio.fail_after(10):
        async with (_server(profiling=True, auth=_TokenAuth()) as addr,
                    httpx.AsyncClient() as client):
            metrics = await client.get(f"http://{addr}/metrics")
            assert metrics.status_code == 401
            for path in ("/debug/tasks", "/debug/pprof/profile?seconds=1"):
                r = await client.get(f"http://{addr}{path}")
                assert (r.status_code, r.text) == (metrics.status_code, metrics.text)
                assert r.headers["www-authenticate"] == metrics.headers["www-authenticate"]
            ok = await client.get(f"http://{addr}/debug/tasks",
                                  headers={"Authorization": "Bearer good"})
            assert ok.status_code == 200


def test_flag_off_by_default_on_both_binaries() -> None:
    from bigfleet_trio import cli

    for command, cls in (("operator", OperatorConfig), ("pod-controller", PodControllerConfig)):
        base = ["--cluster-id", "c"] if command == "operator" else []
        off = cli.parse_args([command, *base])
        on = cli.parse_args([command, *base, "--enable-profiling"])
        assert cli.settings_from(cls, off).enable_profiling is False
        assert cli.settings_from(cls, on).enable_profiling is True
