"""The simulation as a small real cluster: kube-controller-manager's workload controllers
(Deployment -> ReplicaSet -> Pod, StatefulSet, Job) and a kube-scheduler + kubelet stand-in, all
Kubernetes clients over HTTP, so they run beside any apiserver (``bigfleet-trio sim cluster``).

- :mod:`.workloads`: pure plans and statuses; :mod:`.controllers`: :class:`WorkloadControllers`;
- :mod:`.scheduler`: :class:`PodScheduler` (binding, Running/Ready, podgc);
- :mod:`.jobpods`: :class:`JobPodFinisher` (Job Pods succeed after their run time);
- :mod:`.queue`: the work queue; :mod:`.service`: :func:`run_cluster_services`, :func:`run_cli`.
"""

from .controllers import WorkloadControllers
from .jobpods import RUN_SECONDS_ANNOTATION, JobPodFinisher
from .scheduler import PodScheduler
from .service import ClusterServices, run_cli, run_cluster_services

__all__ = ["ClusterServices", "JobPodFinisher", "PodScheduler", "RUN_SECONDS_ANNOTATION",
           "WorkloadControllers",
           "run_cli", "run_cluster_services"]
