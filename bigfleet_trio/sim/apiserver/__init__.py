"""Embedded Kubernetes API server for tests, the simulation and benchmarks (issue 3).

Public API::

    server = ApiServer()                 # project CRDs installed from manifests/crds.yaml
    url = await nursery.start(serve, server)
    write_kubeconfig(url, "kc.yaml")
    server.faults.fail_next(2, code=500, verb="patch", resource="capacityrequests")
    server.counters[("create", "capacityrequests")]

Modules: ``store`` (objects, RV counter, history, watchers), ``state`` (verbs, GC, eviction,
CRDs), ``app`` (ASGI routing, watch streaming), ``selectors``, ``patching``, ``validation``,
``discovery`` (discovery, OpenAPI, Tables), ``faults``, ``serving``, ``testing``.
"""

from .errors import ApiError
from .faults import Counters, Faults
from .serving import run_cli, serve, write_kubeconfig
from .state import ApiServer

__all__ = ["ApiServer", "ApiError", "Counters", "Faults", "serve", "write_kubeconfig", "run_cli"]
