"""The simulation's commands: ``bigfleet-trio sim apiserver|shard|cluster`` and ``demo``.

``bigfleet_trio.cli`` finds this module by path (product code never imports the sim) and calls
:func:`add_sim_command`, :func:`add_demo_command` and :func:`run_command`; flag helpers, the
one-line errors and exit codes are the product CLI's own. Each command's run function is
imported only when that command runs.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from bigfleet_trio.cli import (
    UsageError,
    add_log_flags,
    add_settings_flags,
    float_arg,
    int_arg,
    invoke,
    load_command,
    log_opts,
    port_arg,
    settings_from,
    setup_logging,
)

from .demo_options import DemoOptions


def add_sim_command(sub: Any) -> None:
    """Add ``sim`` and its components to the root parser's sub-parsers ``sub``."""
    sim = sub.add_parser("sim", command="sim", help="simulation components",
                         description="Run one simulated component on its own.")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="COMPONENT",
                                 parser_class=type(sim))
    api = sim_sub.add_parser(
        "apiserver", command="sim apiserver", help="embedded Kubernetes test apiserver",
        description="Serve the test apiserver (CRDs installed) until SIGINT/SIGTERM.",
    )
    api.add_argument("--port", type=port_arg, default=0,
                     help="listen port; 0 picks a free one (default 0)")
    api.add_argument("--kubeconfig-out", default=None, metavar="PATH",
                     help="write a kubeconfig for the server here (required)")
    api.add_argument("--authorization-mode", default="AlwaysAllow", choices=("AlwaysAllow", "RBAC"),
                     help="RBAC: authenticate bearer tokens and authorize every request with "
                     "the stored Roles/bindings; the kubeconfig gets the admin token "
                     "(default AlwaysAllow)")
    add_log_flags(api, suppress=True)
    shard = sim_sub.add_parser(
        "shard", command="sim shard", help="simulated BigFleet shard",
        description="Serve a simulated shard speaking the real protocol.",
    )
    shard.add_argument("--host", default="127.0.0.1", metavar="HOST",
                       help="listen address (default 127.0.0.1, loopback; 0.0.0.0 or :: for "
                       "every interface)")
    shard.add_argument("--port", type=port_arg, default=0,
                       help="gRPC listen port; 0 picks a free one (default 0)")
    shard.add_argument("--kubeconfig", default=None, metavar="PATH",
                       help="cluster where the shard registers Nodes (optional)")
    shard.add_argument("--catalog", default=None, metavar="FILE",
                       help="YAML machine catalog (default: the built-in one; format: "
                       "bigfleet_trio/sim/shard/catalog.example.yaml)")
    shard.add_argument("--seed", type=int_arg, default=None,
                       help="seed of machine ids and node names (default 0)")
    shard.add_argument("--reclaim-grace", type=int_arg, default=None, metavar="SECONDS",
                       help="grace period of every ReclaimInstruction (default 2; a fault test "
                       "sets a long one to keep a drain in flight)")
    shard.add_argument("--node-lease-duration", type=int_arg, default=None, metavar="SECONDS",
                       help="the simulated kubelets' Lease duration, renewed at a quarter of it "
                       "(default 40, kubelet's; a fleet-scale bench sets 200, as for kwok's "
                       "Nodes, with the node lifecycle controller's grace period to match)")
    shard.add_argument("--stats-addr", default=None, metavar="HOST:PORT",
                       help="serve shard-side timestamps as JSON at http://HOST:PORT/stats "
                       "(benchmarks)")
    add_log_flags(shard, suppress=True)
    clu = sim_sub.add_parser(
        "cluster", command="sim cluster",
        help="apiserver + workload controllers + scheduler (a small real cluster)",
        description="Serve the test apiserver with the Deployment/ReplicaSet/StatefulSet/Job "
        "controllers and a scheduler+kubelet stand-in beside it (--port/--kubeconfig-out), or "
        "run only the controllers and scheduler against a running apiserver (--kubeconfig).",
    )
    clu.add_argument("--port", type=port_arg, default=0,
                     help="apiserver listen port; 0 picks a free one (default 0)")
    clu.add_argument("--kubeconfig-out", default=None, metavar="PATH",
                     help="serve an apiserver and write its kubeconfig here")
    clu.add_argument("--kubeconfig", default=None, metavar="PATH",
                     help="use the apiserver of this kubeconfig instead of serving one")
    clu.add_argument("--job-run-seconds", type=float_arg, default=30.0, metavar="SECONDS",
                     help="how long a Job's Pod runs before it succeeds (default 30; per Pod: "
                     "annotation sim.bigfleet.lucy.sh/run-seconds)")
    add_log_flags(clu, suppress=True)


def add_demo_command(sub: Any) -> None:
    """Add ``demo`` (flags generated from :class:`DemoOptions`) to ``sub``."""
    demo = sub.add_parser(
        "demo", command="demo", help="run the whole loop on this machine",
        description="Embedded apiserver, simulated shard, pod controller and operator on real "
        "workloads; exits 0 with a summary.",
    )
    add_settings_flags(demo, DemoOptions())
    demo.add_argument("--catalog", default=None, metavar="FILE",
                      help="YAML machine catalog for the simulated shard (default: the demo's "
                      "built-in one)")


def demo_options(ns: argparse.Namespace) -> DemoOptions:
    """Build :class:`DemoOptions` from parsed ``demo`` flags (not validated)."""
    opts: DemoOptions = settings_from(DemoOptions, ns)
    return opts


def run_command(ns: argparse.Namespace) -> int:
    """Run a parsed ``sim …`` or ``demo`` command; returns the exit code.

    Raises:
        UsageError: a missing required flag (``--kubeconfig-out`` of ``sim apiserver``).
        ConfigError: invalid demo options.
    """
    if ns.command == "demo":
        return _run_demo(ns)
    fmt, level = log_opts(ns)
    if ns.sim_command == "apiserver":
        name = "sim apiserver"
        if not ns.kubeconfig_out:
            raise UsageError(name, "--kubeconfig-out is required")
        setup_logging(fmt, level)
        fn = load_command(name, "bigfleet_trio.sim.apiserver", "run_cli")
        if isinstance(fn, int):
            return fn
        if ns.authorization_mode != "AlwaysAllow":
            fn = partial(fn, authorization_mode=ns.authorization_mode)
        return invoke(name, fn, ns.port, ns.kubeconfig_out)
    if ns.sim_command == "cluster":
        name = "sim cluster"
        setup_logging(fmt, level)
        run = load_command(name, "bigfleet_trio.sim.cluster", "run_cli")
        if isinstance(run, int):
            return run
        return invoke(name, partial(run, kubeconfig=ns.kubeconfig, port=ns.port,
                                    kubeconfig_out=ns.kubeconfig_out,
                                    job_run_seconds=ns.job_run_seconds))
    name = "sim shard"
    setup_logging(fmt, level)
    fn = load_command(name, "bigfleet_trio.sim.shard", "run_cli")
    if isinstance(fn, int):
        return fn
    # --catalog/--seed are passed only when given: without them the call is unchanged.
    kw = {k: v for k, v in (("catalog_file", ns.catalog), ("seed", ns.seed),
                            ("stats_addr", ns.stats_addr), ("host", ns.host),
                            ("reclaim_grace", ns.reclaim_grace),
                            ("node_lease_duration", ns.node_lease_duration)) if v is not None}
    return invoke(name, partial(fn, **kw), ns.port, ns.kubeconfig or None)


def _run_demo(ns: argparse.Namespace) -> int:
    opts = demo_options(ns)
    opts.validate()
    setup_logging(opts.log_format, opts.log_level)
    fn = load_command("demo", "bigfleet_trio.sim.demo", "run_demo")
    if isinstance(fn, int):
        return fn
    if ns.catalog is not None:
        return invoke("demo", fn, opts, ns.catalog)
    return invoke("demo", fn, opts)
