"""Record kube-apiserver's protobuf answers for Pods and Nodes (``tests/fixtures/kube-protobuf``).

``python -m scripts.realkube.record_protobuf [OUT_DIR]`` (after ``python -m scripts.realkube
build``): starts a control plane with two kwok Nodes, creates a few Pods of different shapes and
saves, each as the raw body bytes:

* ``pods-list.pb`` / ``pods-list.json``: one LIST of the Pods, protobuf and JSON (the same
  resourceVersion), and ``nodes-list.pb`` / ``nodes-list.json`` the same for Nodes;
* ``pods-watch.pb`` / ``pods-watch.json``: a watch from that resourceVersion after one Pod was
  labelled and bound (kwok runs it) and another deleted (length-prefixed frames; JSON lines),
  ``pods-watchlist.pb``: a streaming list
  (``sendInitialEvents``) up to its end BOOKMARK;
* ``pod-notfound.pb``: the Status of a GET for a Pod that does not exist;
* ``answers.json``: what the server answered a CR LIST with protobuf asked for alone and with
  JSON as the second choice (status, Content-Type): the fallback the client relies on.

The fast suite decodes these (tests/kube/test_protowire.py); re-record after a Kubernetes
upgrade or a schema change that needs new fields in the fixtures.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import BUILD_HINT, ControlPlane, find_binaries

PB = "application/vnd.kubernetes.protobuf"
OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "kube-protobuf"
NS = "pb"

_PODS: list[dict[str, Any]] = [
    {"metadata": {"name": "plain", "labels": {"app": "web"},
                  "annotations": {"bigfleet.lucy.sh/interruption-penalty": "10",
                                  "unrelated": "x" * 200}},
     "spec": {"containers": [{"name": "c", "image": "busybox",
                              "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                            "limits": {"memory": "128Mi"}}}],
              "nodeSelector": {"bigfleet.lucy.sh/pool": "general"}}},
    {"metadata": {"name": "sidecar"},
     "spec": {"initContainers": [{"name": "i", "image": "busybox", "restartPolicy": "Always",
                                  "resources": {"requests": {"cpu": "100m"}}},
                                 {"name": "j", "image": "busybox",
                                  "resources": {"requests": {"cpu": "2"}}}],
              "containers": [{"name": "c", "image": "busybox",
                              "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
              "resources": {"requests": {"cpu": "3"}},
              "priorityClassName": "system-cluster-critical",
              "topologySpreadConstraints": [{
                  "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                  "whenUnsatisfiable": "DoNotSchedule",
                  "labelSelector": {"matchLabels": {"app": "db"}}}]}},
    {"metadata": {"name": "affine", "labels": {"app": "db"}},
     "spec": {"containers": [{"name": "c", "image": "busybox",
                              "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4"},
                                            "limits": {"nvidia.com/gpu": "1"}}}],
              "affinity": {
                  "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [{"matchExpressions": [
                          {"key": "bigfleet.lucy.sh/pool", "operator": "In",
                           "values": ["gpu", "general"]}]}]}},
                  "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                      "labelSelector": {"matchExpressions": [
                          {"key": "app", "operator": "In", "values": ["db"]}]},
                      "topologyKey": "kubernetes.io/hostname"}]}},
              "tolerations": [{"operator": "Exists"}]}},
]


def _pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", **json.loads(json.dumps(spec))}


def record(cp: ControlPlane, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cp.request("POST", "/api/v1/namespaces",
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for p in _PODS:
        r = cp.request("POST", f"/api/v1/namespaces/{NS}/pods", _pod(p))
        assert r.status_code == 201, r.text
    with cp.admin_client() as c:
        rv = c.get(f"/api/v1/namespaces/{NS}/pods").json()["metadata"]["resourceVersion"]
        for kind, path in (("pods", f"/api/v1/namespaces/{NS}/pods"), ("nodes", "/api/v1/nodes")):
            pb = c.get(path, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"},
                       headers={"Accept": PB})
            assert pb.headers["content-type"] == PB, pb.headers
            (out / f"{kind}-list.pb").write_bytes(pb.content)
            js = c.get(path, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
            (out / f"{kind}-list.json").write_bytes(js.content)
        missing = c.get(f"/api/v1/namespaces/{NS}/pods/missing", headers={"Accept": PB})
        assert missing.status_code == 404 and missing.headers["content-type"] == PB
        (out / "pod-notfound.pb").write_bytes(missing.content)
        answers = {}
        for accept in (PB, f"{PB}, application/json"):
            r = c.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                      headers={"Accept": accept})
            answers[f"builtin {accept}"] = [r.status_code, r.headers.get("content-type")]
            r = c.get("/apis/bigfleet.lucy.sh/v1alpha1/capacityrequests",
                      headers={"Accept": accept})
            answers[f"cr {accept}"] = [r.status_code, r.headers.get("content-type")]
        (out / "answers.json").write_text(json.dumps(answers, indent=2) + "\n")

        base = f"/api/v1/namespaces/{NS}/pods"
        cp.request("PATCH", f"{base}/plain", {"metadata": {"labels": {"tier": "1"}}},
                   content_type="application/merge-patch+json")
        cp.request("POST", f"{base}/plain/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "plain"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "kwok-node-0"}})
        cp.request("DELETE", f"{base}/sidecar",
                   {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
        time.sleep(3.0)  # kwok runs the bound Pod: its status updates are watch events too
        # the same events in both encodings: a watch from the list's resourceVersion replays
        # what happened since
        for suffix, accept in ((".pb", PB), (".json", "application/json")):
            with c.stream("GET", base, params={"watch": "1", "resourceVersion": rv,
                                               "timeoutSeconds": "2"},
                          headers={"Accept": accept}) as w:
                (out / f"pods-watch{suffix}").write_bytes(w.read())
        params = {"watch": "1", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
                  "resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "3"}
        with c.stream("GET", f"/api/v1/namespaces/{NS}/pods", params=params,
                      headers={"Accept": PB}) as w:
            (out / "pods-watchlist.pb").write_bytes(w.read())
    print(f"recorded into {out}")


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    binaries = find_binaries()
    if binaries is None:
        print(f"real control-plane binaries not built: run `{BUILD_HINT}`", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(binaries, Path(tmp), nodes=2) as cp:
        cp.install_crds()
        record(cp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
