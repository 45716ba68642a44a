"""Shared pytest configuration. Trio mode is on for every async test (pyproject: trio_mode)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

# The realkube tier's fixtures (`realkube`, `kube_backend`): tests/support/realkube.py; one line
# per tier that skipped for want of a built binary or an installed library: tests/support/tiers.py.
pytest_plugins = ["tests.support.realkube", "tests.support.tiers"]


@pytest.fixture(autouse=True)
def restore_root_logging() -> Iterator[None]:
    """Leave the root logger as found: ``cli.main`` installs a handler and sets the level.

    Autouse so no test depends on which tests ran before it (a handler left on stderr by one
    test would otherwise show up in another's ``capsys`` output, e.g. under ``-m "not slow"``).
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


# The fast loop (`pytest -m "not slow"`, see CONTRIBUTING.md) leaves these out; the full suite (CI)
# runs them. Keyed on paths so other areas' test files need no edits: fuzzing, tests that drive
# kubectl/kustomize or other real processes, the demo end to end, and tests measured at > ~2 s
# (`pytest --durations=50`). A test can also carry `@pytest.mark.slow` itself.
SLOW_PATHS: tuple[str, ...] = (
    "tests/fuzz/",
    "tests/test_bench_smoke.py",
    "tests/test_demo_cli.py",
    "tests/test_manifests.py",
    "tests/podcontroller/test_kubectl_flow.py",
    "tests/sim/test_apiserver_kubectl.py",
    "tests/sim/test_apiserver_serve.py",
    "tests/sim/test_apiserver_scale.py",
    "tests/sim/test_demo_e2e.py",
    "tests/sim/test_demo_page_chromium.py",
    "tests/sim/test_pieces_path.py",
    "tests/sim/test_reclaim_events_kubectl.py",
    "tests/shard/test_send_timeout_at_the_wire.py",
    "tests/security/test_rbac_flow.py",
    "tests/sim/test_demo_workloads.py",
    "tests/shard/test_bootstrap_first.py::test_bootstrap_request_behind_10k_node_state_updates",
    "tests/faults/test_shard_faults.py::test_shard_that_never_reads_outbox_bounded_memory_flat",
    "tests/operator/test_rollup_property.py::test_incremental_matches_from_scratch",
    "tests/faults/test_review_flood.py",
    "tests/faults/test_leader_flap_backlog.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test whose node id starts with an entry of :data:`SLOW_PATHS`.

    Entries are a directory, a file, or a ``file::test`` prefix (parametrized cases included).
    """
    for item in items:
        if item.nodeid.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)
        # The realkube tier: real processes, so slow too (`-m realkube` runs only the tier).
        if (item.nodeid.startswith("tests/realkube/") or item.get_closest_marker("realkube")
                or "realkube" in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.realkube)
            item.add_marker(pytest.mark.slow)
