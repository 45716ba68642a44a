"""The embedded apiserver against kube-apiserver: one corpus of requests (corpus.yaml: what the
kube client, both binaries, the simulation's writers and kubectl for the demo send) goes to
each over HTTP, and the normalised answers must agree, except where docs/deviations.md lists
the difference ("The embedded API server against kube-apiserver", read by this test). The
``realkube`` fixture starts the real control plane, or skips the tier with one line.

The machinery is tests/support/kubediff.py. The report names the corpus size and the number of
differences, listed and unlisted; an unlisted one fails the test. A row of the allow-list that
no longer matches anything is reported as STALE (delete it from the table).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bigfleet_trio.install import load_crds
from tests.support.kubediff import (
    Runner,
    Target,
    classify,
    compare,
    load_corpus,
    parse_allowlist,
)
from tests.support.realkube import RealKube
from tests.support.simproc import sim_apiserver_process

HERE = Path(__file__).resolve().parent
DEVIATIONS = HERE.parents[1] / "docs" / "deviations.md"


def test_sim_apiserver_answers_the_corpus_like_kube_apiserver(
    realkube: RealKube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = load_corpus(HERE / "corpus.yaml", {c["metadata"]["name"]: c for c in load_crds()})
    allowed = parse_allowlist(DEVIATIONS.read_text(encoding="utf-8"))
    realkube.reset()
    real = Runner(Target.from_kubeconfig("kube-apiserver", str(realkube.kubeconfig))).run(cases)
    with sim_apiserver_process(tmp_path) as kubeconfig:
        sim = Runner(Target.from_kubeconfig("sim", kubeconfig)).run(cases)

    diffs = [d for c in cases if c.compare for d in compare(c.id, sim[c.id], real[c.id])]
    listed, unlisted, unused = classify(diffs, allowed)
    compared = sum(1 for c in cases if c.compare)
    report = [
        f"differential corpus: {len(cases)} requests ({compared} compared); "
        f"{len(diffs)} differences: {len(listed)} listed in docs/deviations.md, "
        f"{len(unlisted)} unlisted",
        *(f"  UNLISTED {d}" for d in unlisted),
        *(f"  STALE allow-list row (docs/deviations.md line {a.row}): {a.cases} {a.paths}"
          for a in unused),
    ]
    with capsys.disabled():  # the report is the test's output, also when it passes
        print("\n" + "\n".join(report))
    # A stale row is reported, not failed: a sim change elsewhere that closes a listed gap must
    # not turn the tier red; the report says which row to delete.
    assert not unlisted, "\n".join(report)
