"""The bench's CPU-per-stage classifier over py-spy's collapsed stacks
(scripts/bench/_profile_stages.py)."""

from __future__ import annotations

import pytest

from scripts.bench import _profile_stages as ps


def _stack(*paths: str) -> list[str]:
    return [f"fn{i} ({p}:{10 + i})" for i, p in enumerate(paths)]


@pytest.mark.parametrize(("paths", "stage"), [
    (("bigfleet_trio/cli.py", "trio/_core/_run.py", "httpcore/_async/http11.py", "trio/_ssl.py"),
     "TLS"),
    (("bigfleet_trio/cli.py", "httpx/_client.py", "h11/_connection.py"),
     "HTTP (httpx, httpcore, h11)"),
    (("trio/_core/_run.py", "bigfleet_trio/kube/informer.py", "bigfleet_trio/kube/protowire.py",
      "google/protobuf/internal/containers.py"), "decoding (JSON, protobuf)"),
    (("bigfleet_trio/kube/informer.py", "bigfleet_trio/podcontroller/projections.py"),
     "projection (slim_pod, slim_cr)"),
    (("bigfleet_trio/podcontroller/reconciler.py", "bigfleet_trio/podcontroller/translate.py"),
     "reconcile (plan, translate, queue)"),
    (("bigfleet_trio/podcontroller/apply.py", "bigfleet_trio/kube/client.py"),
     "writes (client, request bodies)"),
    (("bigfleet_trio/kube/informer.py",), "informer and store"),
    (("trio/_core/_run.py", "trio/_core/_io_epoll.py"), "trio scheduling"),
    (("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"),
     "start-up (imports)"),
    (("selectors.py",), "socket I/O"),
    (("bigfleet_trio/cli.py",), ps.OTHER),  # "trio/" is not a directory of bigfleet_trio/
    ((), ps.OTHER),
])
def test_a_stack_is_the_stage_of_its_innermost_known_frame(paths: tuple[str, ...],
                                                           stage: str) -> None:
    assert ps.stage_of(_stack(*paths)) == stage


def test_shares_sum_the_samples_of_each_stage() -> None:
    text = [
        "fn0 (bigfleet_trio/cli.py:1);fn1 (trio/_ssl.py:2) 6\n",
        "fn0 (bigfleet_trio/cli.py:1);fn1 (h11/_readers.py:2) 3\n",
        "fn0 (bigfleet_trio/cli.py:1) 1\n",
        "\n",
        "garbage without a count\n",
    ]
    shares = ps.stage_shares(ps.read(text))
    assert shares["TLS"] == pytest.approx(0.6)
    assert shares["HTTP (httpx, httpcore, h11)"] == pytest.approx(0.3)
    assert shares[ps.OTHER] == pytest.approx(0.1)
    assert set(shares) == {s for s, _ in ps.STAGES} | {ps.OTHER}
    assert sum(shares.values()) == pytest.approx(1.0)


def test_an_empty_profile_has_no_shares() -> None:
    assert set(ps.stage_shares([]).values()) == {0.0}


def test_a_frame_without_a_location_is_matched_on_its_text() -> None:
    assert ps.stage_of(["<frozen importlib._bootstrap>"]) == "start-up (imports)"
