"""``bigfleet-trio demo``: the whole BigFleet loop on one laptop.

One ``trio.run`` (with a trio-asyncio loop for grpclib) runs, in one nursery:

1. the embedded Kubernetes apiserver (loopback, port 0) and a kubeconfig for it;
2. the simulated shard (:class:`~bigfleet_trio.sim.shard.SimShard`) served over grpclib on
   loopback, registering a Node for each Configured machine through the Kubernetes API;
3. the pod controller (one CapacityRequest per Pod) and the operator (roll-ups every second,
   UpcomingNodes, bootstrap, reclaim), the operator dialling the shard over the real stream;
4. a minimal binder standing in for kube-scheduler (:mod:`bigfleet_trio.sim.binder`).

Then the scenario: apply the bundled real workloads (PriorityClasses/RuntimeClasses first;
Deployments, StatefulSets, Jobs expanded to the Pods their controllers would create), show live
progress, wait until every Pod has a CR, the roll-up matches the CRs, the machines for the demand
are Configured, their UpcomingNodes Ready and every Pod bound; then scale one workload down (the
one whose Pods sit alone on their nodes), and wait for the shard to reclaim the surplus machines
and the operator to cordon, acknowledge and drain them until their UpcomingNodes are deleted.
A summary table (or ``--json``) ends the run; exit 0, or 1 with what did not converge.

:func:`run_scenario` is the headless entry point the end-to-end test drives. This module is the
CLI entry (:func:`run_demo`); the parts live in :mod:`.demo_world` (inventory, timing, checks),
:mod:`.demo_render` (output) and :mod:`.demo_scenario` (the run), re-exported here.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import trio

from bigfleet_trio.knobs import yaml_error_line
from bigfleet_trio.sim.demo_options import DemoOptions
from bigfleet_trio.sim.shard.catalog import Catalog, CatalogError, load_catalog

from . import demo_world
from .demo_render import (
    failure_line,
    print_keep_running_banner,
    print_summary,
    progress_line,
    render_summary,
)
from .demo_scenario import Workloads, apply_workloads, run_scenario
from .demo_world import *  # noqa: F403 - every demo_world name, re-exported (see __all__)
from .demo_world import DemoSummary, bundled_workloads_dir, manifest_paths

__all__ = ["run_demo", "run_scenario", "check_workloads",
           # re-exported from the demo_* modules, where they live
           "Workloads", "apply_workloads", "failure_line", "print_keep_running_banner",
           "progress_line", "render_summary"]
__all__ += demo_world.__all__


def check_workloads(directory: str) -> str | None:
    """Parse every manifest of ``directory`` before anything starts; the problem as one line
    (``FILE:LINE:COLUMN: invalid YAML: …`` for a syntax error) or None."""
    import yaml

    from bigfleet_trio.sim.expand import ExpandError, load_manifests

    documents = 0
    for path in manifest_paths(directory):
        try:
            load_manifests([path])
        except ExpandError as exc:
            if isinstance(exc.__cause__, yaml.YAMLError):
                return yaml_error_line(str(path), exc.__cause__)
            return " ".join(str(exc).split())
        with open(path, encoding="utf-8") as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
        for number, doc in enumerate(docs, 1):
            problem = _not_a_manifest(doc)
            if problem:
                return f"{path}: document {number} of {len(docs)}: {problem}"
        documents += len(docs)
    if documents == 0:
        # nothing to apply means nothing to wait for: say so now, not after the timeout
        return (f"--workloads: {directory}: no Kubernetes manifests there (*.yaml, *.yml, "
                "*.json with apiVersion, kind and metadata.name)")
    return None


def _not_a_manifest(doc: dict[str, Any]) -> str | None:
    """What keeps ``doc`` from being a Kubernetes object the demo can apply, or None."""
    missing = [k for k in ("apiVersion", "kind") if not isinstance(doc.get(k), str) or not doc[k]]
    if missing:
        return (f"not a Kubernetes object (no {' or '.join(missing)}; top-level keys: "
                f"{', '.join(sorted(map(str, doc))[:6]) or 'none'})")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not (meta.get("name") or meta.get("generateName")):
        return f"{doc['kind']} without metadata.name"
    from bigfleet_trio.sim.apiserver.podresources import refusal

    refused = refusal(doc)  # refused now, not after the timeout with a Pod that never came
    if refused:
        return f"{doc['kind']} {meta.get('name') or meta.get('generateName')}: {refused}"
    return None


def run_demo(opts: DemoOptions, catalog_file: str | None = None) -> int:
    """``bigfleet-trio demo``: run the scenario, print the summary, return the exit code.

    With ``--keep-running`` the summary is printed with the kubeconfig path and kubectl commands,
    and everything keeps serving until SIGINT/SIGTERM. ``catalog_file`` (``--catalog``) replaces
    :func:`demo_catalog` with a YAML catalog (:func:`~bigfleet_trio.sim.shard.load_catalog`),
    read before anything starts.

    Returns:
        0 when the scenario converged, 1 otherwise (with what did not converge on stderr), or
        1 with one line ``demo: <file>: <what>`` when the catalog file is unusable; 130 (143)
        after SIGINT (SIGTERM) in any phase, with one line ``demo: interrupted by SIGINT; …``
        (0 with ``--keep-running`` once the summary is printed).
    """
    catalog: Catalog | None = None
    if catalog_file is not None:
        try:
            catalog = load_catalog(catalog_file)
        except CatalogError as exc:
            print(f"demo: {exc}", file=sys.stderr, flush=True)
            return 1

    problem = check_workloads(opts.workloads_dir or str(bundled_workloads_dir()))
    if problem:
        print(f"demo: {problem}", file=sys.stderr, flush=True)
        return 1

    # The summary goes to stdout; with --json that is the only thing there (pure JSON), so the
    # live progress and the --keep-running banner go to stderr.
    out = sys.stdout
    progress = sys.stderr if opts.json_summary else sys.stdout
    printed = False

    interrupted: list[str] = []

    async def wait_for_signal(summary: DemoSummary) -> None:
        nonlocal printed
        print_summary(summary, opts, out)
        printed = True
        print_keep_running_banner(summary, progress)
        await trio.sleep_forever()  # until main's signal watcher cancels everything

    async def main() -> DemoSummary | None:
        # SIGINT/SIGTERM in any phase cancel the whole scenario (its nurseries close in order)
        # instead of raising KeyboardInterrupt wherever the main thread happens to be, which
        # left half-closed clients raising over each other.
        result: DemoSummary | None = None
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            try:
                async with trio.open_nursery() as nursery:

                    async def watch() -> None:
                        async for signum in signals:
                            interrupted.append(signal.Signals(signum).name)
                            nursery.cancel_scope.cancel()
                            return

                    nursery.start_soon(watch)
                    result = await run_scenario(
                        opts, out=progress,
                        keep_running=wait_for_signal if opts.keep_running else None,
                        catalog=catalog)
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:  # the scenario's own error, as it raised it
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
        return result

    try:
        summary = trio.run(main)
    except KeyboardInterrupt:  # before the signal watcher was installed
        interrupted.append("SIGINT")
        summary = None
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        interrupted.append("SIGINT")
        summary = None
    if interrupted and printed:  # --keep-running: the summary is out; a signal ends it
        return 0
    if summary is not None and not opts.keep_running and not opts.kubeconfig_out:
        # the kubeconfig was in a temporary directory, removed at exit: do not point at it
        summary.kubeconfig = None
    if interrupted or summary is None:
        name = interrupted[0] if interrupted else "SIGINT"
        print(f"demo: interrupted by {name}; everything it started has stopped",
              file=sys.stderr, flush=True)
        return 143 if name == "SIGTERM" else 130
    if not printed:
        print_summary(summary, opts, out)
    if not summary.ok:
        print(f"demo: did not converge: {summary.failure}", file=sys.stderr, flush=True)
        return 1
    return 0
