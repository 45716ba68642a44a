"""The fast suite's one path over the production keep-alive pool and streaming transport: the
real ``KubeClient`` against the sim apiserver serving HTTP on loopback (no in-process
transport). A LIST, a WATCH that delivers an event, a create and a merge patch."""

from __future__ import annotations

from pathlib import Path

import trio

from bigfleet_trio.kube.client import KubeClient
from bigfleet_trio.kube.config import load_kubeconfig
from bigfleet_trio.kube.resources import NAMESPACES as CRS
from bigfleet_trio.sim.apiserver import ApiServer, serve, write_kubeconfig


async def test_list_watch_create_and_merge_patch_over_loopback(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    url = await nursery.start(serve, ApiServer())
    kc = tmp_path / "kubeconfig"
    write_kubeconfig(url, str(kc))
    with trio.fail_after(20):  # a deadline for a hung test, not a timing assertion
        async with KubeClient(load_kubeconfig(str(kc), env={})) as client:
            listed = await client.list(CRS)
            assert "default" in {o["metadata"]["name"] for o in listed.items}
            assert "cm" not in {o["metadata"]["name"] for o in listed.items}
            async with client.watch(CRS,
                                    resource_version=listed.resource_version) as stream:
                created = await client.create(
                    CRS, {"metadata": {"name": "cm", "labels": {"a": "1"}}})
                assert created["metadata"]["name"] == "cm"
                async for event in stream:
                    if event.type == "BOOKMARK":
                        continue
                    assert event.type == "ADDED"
                    assert event.object["metadata"]["labels"]["a"] == "1"
                    break
            patched = await client.patch(CRS, "cm", {"metadata": {"labels": {"b": "2"}}})
            labels = patched["metadata"]["labels"]
            assert (labels["a"], labels["b"]) == ("1", "2")
            again = await client.list(CRS)
            pool = client._pool  # noqa: SLF001 - the production pool served it
            assert pool is not None and pool.opened >= 1
            assert [o["metadata"]["labels"].get("b") for o in again.items
                    if o["metadata"]["name"] == "cm"] == ["2"]
