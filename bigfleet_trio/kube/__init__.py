"""BigFleet's Kubernetes layer on raw httpx (contract: docs/kube-api.md).

Config (:mod:`.config`), client (:mod:`.client`), errors (:mod:`.errors`), resource descriptors
(:mod:`.resources`), sans-IO watch helpers (:mod:`.watch`), informers (:mod:`.informer`) and
Lease leader election (:mod:`.leader`), the keyed work queue (:mod:`.workqueue`). Import
from the defining module.
"""
