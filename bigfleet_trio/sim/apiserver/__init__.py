"""Embedded Kubernetes API server for tests, the simulation and benchmarks.

Public API::

    server = ApiServer()                      # project CRDs installed
    url = await nursery.start(serve, server)  # hypercorn's Trio worker; "http://127.0.0.1:PORT"
    url = await nursery.start(
        lambda task_status: serve(server, engine="fast", task_status=task_status)
    )
    write_kubeconfig(url, "kc.yaml")          # context/cluster/user "bigfleet-sim", plain HTTP
    run_cli(port, kubeconfig_out)             # `bigfleet-trio sim apiserver` (SIGINT/SIGTERM stop)

    server.faults.fail_next(2, code=500, verb="patch", resource="capacityrequests")
    server.faults.add_latency(0.05, verb="list")
    server.faults.drop_watches(); server.faults.compact()
    server.counters[("create", "capacityrequests")]; server.counters.total(verb="watch")

    # In-process helpers (no HTTP, no faults/counters): same semantics as the REST verbs.
    cr = server.find("cr")                    # plural / singular / kind / short name
    server.create(cr, "default", body); server.get(cr, "default", "x")
    server.patch(cr, "default", "x", {...}, "application/merge-patch+json", subresource="status")
    server.list(cr, None, label_selector="a=b").items; server.delete(cr, "default", "x")
    server.store.items(cr, "default")         # stored dicts (never mutate them)

    # Tests without sockets (works with autojump_clock):
    from bigfleet_trio.sim.apiserver.testing import open_client, InProcessTransport

Options: ``ApiServer(crd_paths=None, history=50_000, bookmark_interval=5.0, gc_dangling=True,
pdb_controller=False)``.

Modules: ``store`` (objects, global RV, event history, watchers); ``state`` (registry and verbs)
with ``objects`` (pure write helpers), ``gc``, ``eviction``, ``crds``, ``scale`` (``/scale``);
``access`` (tokens, TokenRequest, authentication) and ``rbac`` (the pure RBAC authorizer);
``server`` (ApiServer = state + ASGI app); ``app`` (ASGI glue) with ``routes`` (route tables),
``httpio``, ``watchstream``; ``fasthttp`` and ``serving``; ``selectors``, ``patching``,
``validation``, ``discovery`` (discovery, Tables), ``openapi`` (OpenAPI v3 schemas; data from
``openapi_gen``), ``controllers`` (optional PDB status), ``protobuf`` (kubectl's protobuf
bodies), ``faults``, ``testing``.

RBAC: ``ApiServer(authorization_mode="RBAC")`` authenticates bearer tokens
(``server.access.admin_token`` is system:masters; ``server.issue_token(ns, sa)`` or
``kubectl create token``) and authorizes every request; ``serve`` then uses HTTPS
(``server.tls_ca_pem``) because kubectl sends tokens only over TLS.

Known limits: TLS only in RBAC mode (hypercorn engine); no ClusterRole aggregation; Strict
field validation only detects unknown fields on custom resources (built-in writes are not
checked against their schemas); protobuf request bodies only for Namespace, ConfigMap,
PriorityClass and TokenRequest (other imperative ``kubectl create <kind>`` commands get 415;
use ``-f``); watch history is retained by count, not time; no server-side-apply field
ownership (apply-patch is create-or-merge).
"""

from .errors import ApiError
from .faults import Counters, Faults
from .server import ApiServer
from .serving import run_cli, serve, write_kubeconfig

__all__ = ["ApiServer", "ApiError", "Counters", "Faults", "serve", "write_kubeconfig", "run_cli"]
