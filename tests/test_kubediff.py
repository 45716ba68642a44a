"""The differential test's pure machinery (tests/support/kubediff.py), the corpus and the
allow-list in docs/deviations.md; and the corpus run against the embedded apiserver alone, so a
broken corpus shows without kube-apiserver binaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigfleet_trio.install import load_crds
from tests.support.kubediff import (
    ABSENT,
    Allowed,
    Difference,
    Runner,
    Target,
    classify,
    compare,
    load_corpus,
    normalise,
    parse_allowlist,
    project,
    protobuf_envelope,
    substitute,
)

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "realkube" / "corpus.yaml"
DEVIATIONS = ROOT / "docs" / "deviations.md"


def corpus() -> list:
    return load_corpus(CORPUS, {c["metadata"]["name"]: c for c in load_crds()})


# ---- normalise -----------------------------------------------------------------------------


def test_normalise_masks_server_minted_values_and_keeps_the_rest() -> None:
    answer = {
        "status": 201,
        "content_type": "application/json; charset=utf-8",
        "retry_after": None,
        "warnings": ['299 - "unknown field"'],
        "body": {
            "kind": "Pod",
            "metadata": {
                "name": "web-x7k2p",
                "generateName": "web-",
                "uid": "0f8fad5b-d9cb-469f-a165-70867728950e",
                "resourceVersion": "4711",
                "creationTimestamp": "2026-11-26T21:00:00Z",
                "labels": {"app": "web"},
                "ownerReferences": [{"uid": "0f8fad5b-d9cb-469f-a165-70867728950e",
                                     "name": "rs"}],
            },
            "spec": {"nodeName": "n1", "priority": 0},
            "status": {"startTime": "2026-11-26T21:00:00.123456Z"},
        },
    }
    out = normalise(answer)
    assert out == {
        "status": 201,
        "content_type": "application/json",
        "retry_after": False,
        "warnings": 1,
        "body": {
            "kind": "Pod",
            "metadata": {
                "name": "web-<generated>",
                "generateName": "web-",
                "uid": "<uid>",
                "resourceVersion": "<rv>",
                "creationTimestamp": "<time>",
                "labels": {"app": "web"},
                "ownerReferences": [{"uid": "<uid>", "name": "rs"}],
            },
            "spec": {"nodeName": "n1", "priority": 0},
            "status": {"startTime": "<time>"},
        },
    }


def test_normalise_status_keeps_reason_and_code_not_wording() -> None:
    body = {"kind": "Status", "status": "Failure", "message": 'pods "x" not found',
            "reason": "NotFound", "code": 404,
            "details": {"name": "x", "kind": "pods",
                        "causes": [{"reason": "FieldValueInvalid", "message": "bad",
                                    "field": "spec.x"}]}}
    out = normalise({"status": 404, "content_type": "application/json",
                     "retry_after": "10", "body": body})
    assert out["retry_after"] is True
    assert out["body"]["message"] == "<message>"
    assert out["body"]["reason"] == "NotFound" and out["body"]["code"] == 404
    assert out["body"]["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": "<message>", "field": "spec.x"}]


def test_normalise_watch_events_continue_tokens_and_hashes() -> None:
    out = normalise({
        "status": 200, "content_type": "application/json", "body": {
            "metadata": {"continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", "remainingItemCount": 2},
            "url": "/openapi/v3/apis/apps/v1?hash=E4032D35174A9040",
            "empty": {"resourceVersion": "", "token": ""},
        },
        "events": [{"type": "ADDED", "object": {"metadata": {"resourceVersion": "9"}}}],
    })
    assert out["body"] == {
        "metadata": {"continue": "<continue>", "remainingItemCount": 2},
        "url": "/openapi/v3/apis/apps/v1?hash=<hash>",
        "empty": {"resourceVersion": "", "token": ""},  # an empty value stays visible
    }
    assert out["events"] == [{"type": "ADDED", "object": {"metadata": {"resourceVersion": "<rv>"}}}]


def test_normalise_is_pure() -> None:
    answer = {"status": 200, "body": {"metadata": {"uid": "0f8fad5b-d9cb-469f-a165-70867728950e"}}}
    normalise(answer)
    assert answer["body"]["metadata"]["uid"] == "0f8fad5b-d9cb-469f-a165-70867728950e"


def test_protobuf_envelope_reads_type_meta() -> None:
    import base64

    ns = base64.b64decode("azhzAAoPCgJ2MRIJTmFtZXNwYWNlEiAKGAoIa2RpZmYtcGISABoAIgAqADIAOABCABIA"
                          "GgIKABoAIgA=")
    assert protobuf_envelope(ns) == {"apiVersion": "v1", "kind": "Namespace"}
    assert protobuf_envelope(b"not protobuf") == {"protobuf": "undecodable"}
    assert protobuf_envelope(b"k8s\x00\x0a\xff") == {"protobuf": "undecodable"}


# ---- project -------------------------------------------------------------------------------


def test_project_paths_and_keys() -> None:
    body = {"kind": "X", "items": [{"metadata": {"name": "a"}}], "spec": {"b": 1, "a": 2}}
    assert project("paths", body, ["kind", "items.0.metadata.name", "items.1"]) == {
        "kind": "X", "items.0.metadata.name": "a", "items.1": ABSENT}
    assert project("keys", body, ["spec"]) == {"spec": ["a", "b"]}
    assert project(None, body, []) is body
    with pytest.raises(ValueError):
        project("nope", body, [])


def test_project_discovery_picks_the_named_resources() -> None:
    body = {"items": [{"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [
        {"resource": "deployments", "scope": "Namespaced",
         "responseKind": {"kind": "Deployment"}, "verbs": ["list", "get"],
         "shortNames": ["deploy"],
         "subresources": [{"subresource": "scale", "verbs": ["patch", "get"]}]},
        {"resource": "daemonsets"}]}]}]}
    out = project("discovery", body, ["apps/v1/deployments", "apps/v1/nope"])
    assert out == {
        "apps/v1/deployments": {"scope": "Namespaced", "kind": "Deployment",
                                "verbs": ["get", "list"], "shortNames": ["deploy"],
                                "categories": [], "subresources": {"scale": ["get", "patch"]}},
        "apps/v1/nope": ABSENT,
    }


def test_project_table_masks_ages() -> None:
    body = {"kind": "Table", "columnDefinitions": [
        {"name": "Name", "type": "string", "format": "name", "description": "d"},
        {"name": "Age", "type": "string"}, {"name": "Created", "type": "date"}],
        "rows": [{"cells": ["a", "3s", "1m"], "object": {}}]}
    assert project("table", body, []) == {
        "kind": "Table",
        "columns": [("Name", "string", "name"), ("Age", "string", ""), ("Created", "date", "")],
        "rows": [["a", "<age>", "<age>"]]}
    assert "rows" not in project("table", body, ["columns"])


# ---- compare, allow-list, classify ---------------------------------------------------------


def test_compare_reports_the_shallowest_differing_paths() -> None:
    sim = {"status": 200, "body": {"spec": {"a": 1, "b": [1, 2]}, "same": {"x": 1}}}
    real = {"status": 200, "body": {"spec": {"a": 2, "b": [1], "c": {"d": 1}},
                                    "same": {"x": 1}}}
    assert compare("k", sim, real) == [
        Difference("k", "body.spec.a", 1, 2),
        Difference("k", "body.spec.b.1", 2, ABSENT),
        Difference("k", "body.spec.c", ABSENT, {"d": 1}),
    ]
    assert compare("k", sim, sim) == []


DOC = """# Title

## 12. The embedded API server against kube-apiserver

Prose.

| Cases | Paths | Sim / kube-apiserver | Why |
|---|---|---|---|
| `pod-*`, `kubectl-*` | `body.spec.dnsPolicy`, `body.*.terminationMessagePath` | - | Defaults. |
| `cr-watch-too-old` | `events` | replay / 410 | History by count. |

## 13. Next

| `x` | `y` | z |
"""


def test_parse_allowlist_reads_only_its_section() -> None:
    rows = parse_allowlist(DOC)
    assert [(r.cases, r.paths, r.reason) for r in rows] == [
        (("pod-*", "kubectl-*"), ("body.spec.dnsPolicy", "body.*.terminationMessagePath"),
         "Defaults."),
        (("cr-watch-too-old",), ("events",), "History by count."),
    ]
    with pytest.raises(ValueError, match="no section"):
        parse_allowlist("# nothing")
    with pytest.raises(ValueError, match="needs case globs"):
        parse_allowlist(DOC.replace("| `cr-watch-too-old` | `events` |", "| x | `events` |"))


def test_classify_splits_listed_unlisted_and_names_unused_rows() -> None:
    rows = parse_allowlist(DOC)
    diffs = [
        Difference("pod-get", "body.spec.dnsPolicy", ABSENT, "ClusterFirst"),
        Difference("kubectl-apply-create", "body.spec.template.spec.containers.0"
                   ".terminationMessagePath", ABSENT, "/dev/termination-log"),
        Difference("pod-get", "status", 200, 404),
    ]
    listed, unlisted, unused = classify(diffs, rows)
    assert listed == diffs[:2]
    assert unlisted == diffs[2:]
    assert [r.cases for r in unused] == [("cr-watch-too-old",)]
    assert Allowed(1, ("a",), ("b",), "r").matches(Difference("a", "b", 1, 2))


def test_substitute_fills_saved_values() -> None:
    saved = {"p": {"metadata": {"uid": "U", "resourceVersion": "7", "name": "p-x",
                                "continue": "C"}, "status": {"token": "T"}}}
    value = {"path": "/x/{name:p}", "q": ["{uid:p}", "{rv:p}"], "t": "Bearer {token:p}",
             "c": "{continue:p}", "n": 3}
    assert substitute(value, saved) == {"path": "/x/p-x", "q": ["U", "7"], "t": "Bearer T",
                                        "c": "C", "n": 3}
    with pytest.raises(KeyError):
        substitute("{uid:never}", saved)


# ---- the corpus and the document agree -----------------------------------------------------


def test_corpus_loads_and_every_case_says_who_sends_it() -> None:
    cases = corpus()
    assert len(cases) >= 100
    assert all(c.used_by for c in cases), [c.id for c in cases if not c.used_by]
    verbs = {c.method for c in cases}
    assert verbs == {"GET", "POST", "PUT", "PATCH", "DELETE"}
    ctypes = {c.content_type for c in cases if c.body is not None}
    assert {"application/merge-patch+json", "application/json-patch+json",
            "application/strategic-merge-patch+json", "application/apply-patch+yaml"} <= ctypes
    assert any(c.watch for c in cases)


def test_every_allow_list_row_names_corpus_cases() -> None:
    """A row whose case globs match no corpus case is stale (the doc drifted from the test)."""
    import fnmatch

    ids = [c.id for c in corpus()]
    rows = parse_allowlist(DEVIATIONS.read_text(encoding="utf-8"))
    stale = [r for r in rows if not any(fnmatch.filter(ids, g) for g in r.cases)]
    assert not stale, [f"docs/deviations.md line {r.row}: {r.cases}" for r in stale]


@pytest.mark.slow
def test_corpus_runs_against_the_embedded_apiserver(tmp_path: Path) -> None:
    """Every case gets an answer from the sim over real HTTP, none a 5xx (the sim's part of
    the differential test, which runs without kube-apiserver binaries)."""
    from tests.support.simproc import sim_apiserver_process

    cases = corpus()
    with sim_apiserver_process(tmp_path) as kubeconfig:
        seen = Runner(Target.from_kubeconfig("sim", kubeconfig)).run(cases)
    assert set(seen) == {c.id for c in cases}
    errors = {k: v["status"] for k, v in seen.items() if v["status"] >= 500}
    assert not errors
