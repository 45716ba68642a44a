"""Shared test harness (imported as ``tests.support``; pytest collects no tests here).

The one Kubernetes test seam: :mod:`tests.support.kube` (a real ``KubeClient`` over the
in-process sim apiserver, and :class:`~tests.support.kube.RecordingKube` around it). Wire-level
faults (resets, truncated bodies, slow headers) stay with ``tests/kube/fakekube.py``.
"""
