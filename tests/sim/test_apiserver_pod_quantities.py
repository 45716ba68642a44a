"""Resource quantities of Pods and Pod templates, refused where kube-apiserver refuses them:
an unparsable one while decoding (400), a negative, fractional-for-an-integer-resource or
above-its-limit one by validation (422, docs/deviations.md#pod-quantities). The corpus of
tests/support/podquantities.py gets the answers kube-apiserver gives it (the realkube tier
checks that: tests/realkube/test_pod_quantities.py)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from bigfleet_trio.sim.apiserver.podresources import (
    QUANTITY_FORMAT,
    decode_problem,
    pod_specs,
    quantity_causes,
)
from bigfleet_trio.sim.apiserver.testing import pod_body
from tests.support.podquantities import CASES, QuantityCase, answer

PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


def pod(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
        name: str = "hog") -> dict[str, Any]:
    body = pod_body(name)
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    body["spec"]["containers"][0]["resources"] = res
    return body


def deployment(template_pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": template_pod["spec"]}}}


@pytest.mark.parametrize(("raw", "error"), [
    ("lots", QUANTITY_FORMAT),
    ("", QUANTITY_FORMAT),
    ("1 2", QUANTITY_FORMAT),
    (True, QUANTITY_FORMAT),
    ([1], QUANTITY_FORMAT),
    ("1Q", QUANTITY_FORMAT),
    ("1Gb", QUANTITY_FORMAT),
    ("1KK", "unable to parse quantity's suffix"),
])
def test_an_unparsable_quantity_is_a_decode_problem_naming_the_field(raw: Any,
                                                                     error: str) -> None:
    assert decode_problem(pod({"cpu": "1", "memory": raw})) == (
        "spec.containers[0].resources.requests[memory]", error)


@pytest.mark.parametrize("raw", ["100m", " 1 ", "1.5", 2, 0.5, "1e3", "64Mi", None, "+1"])
def test_what_go_parses_decodes(raw: Any) -> None:
    assert decode_problem(pod({"cpu": raw})) is None
    assert quantity_causes(pod({"cpu": raw})) == []


def test_the_pod_spec_of_every_kind_that_carries_one() -> None:
    spec = pod({"cpu": "1"})["spec"]
    assert [p for p, _ in pod_specs({"kind": "Pod", "spec": spec})] == ["spec"]
    assert [p for p, _ in pod_specs(deployment(pod()))] == ["spec.template.spec"]
    cron = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}
    assert [p for p, _ in pod_specs(cron)] == ["spec.jobTemplate.spec.template.spec"]
    assert list(pod_specs({"kind": "ConfigMap", "data": {}})) == []
    assert list(pod_specs({"kind": "Pod", "spec": "x"})) == []
    init = pod()
    init["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"cpu": "x"}}}]
    assert decode_problem(init) == ("spec.initContainers[0].resources.limits[cpu]",
                                    QUANTITY_FORMAT)
    over = pod()
    over["spec"]["overhead"] = {"memory": "-1"}
    assert [c["field"] for c in quantity_causes(over)] == ["spec.overhead[memory]"]


def test_validation_causes_as_kube_apiserver_words_them() -> None:
    base = "spec.containers[0].resources"
    (neg,) = quantity_causes(pod({"cpu": "-500m"}))
    assert neg == {"reason": "FieldValueInvalid", "field": f"{base}.requests[cpu]",
                   "message": 'Invalid value: "-500m": must be greater than or equal to 0'}
    (above,) = quantity_causes(pod({"cpu": "2"}, {"cpu": "1"}))
    assert above["field"] == f"{base}.requests"
    assert above["message"] == 'Invalid value: "2": must be less than or equal to cpu limit of 1'
    (unequal,) = quantity_causes(pod({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}))
    assert unequal["message"] == ('Invalid value: "1": must be equal to nvidia.com/gpu limit '
                                  "of 2")
    (no_limit,) = quantity_causes(pod({"nvidia.com/gpu": "1"}))
    assert no_limit == {"reason": "FieldValueRequired", "field": f"{base}.limits",
                        "message": "Required value: Limit must be set for non overcommitable "
                                   "resources"}
    # a limit alone is also the request (kube-apiserver defaults requests from limits)
    assert quantity_causes(pod(None, {"nvidia.com/gpu": "1", "cpu": "1"})) == []
    assert quantity_causes(pod({"cpu": "500m"}, {"cpu": "1"})) == []
    fractions = quantity_causes(pod(None, {"nvidia.com/gpu": "500m"}))
    assert {c["message"] for c in fractions} == {'Invalid value: "500m": must be an integer'}
    assert {c["field"] for c in fractions} == {f"{base}.limits[nvidia.com/gpu]",
                                               f"{base}.requests[nvidia.com/gpu]"}


async def test_the_apiserver_refuses_an_unparsable_quantity_with_400(
        client: httpx.AsyncClient) -> None:
    r = await client.post(PODS, json=pod({"cpu": "lots"}))
    assert r.status_code == 400
    assert r.json()["reason"] == "BadRequest"
    assert r.json()["message"] == (
        f'Pod in version "v1" cannot be handled as a Pod: {QUANTITY_FORMAT}')
    d = await client.post(DEPLOYMENTS, json=deployment(pod({"cpu": "lots"})))
    assert d.status_code == 400
    assert d.json()["message"].startswith(
        'Deployment in version "v1" cannot be handled as a Deployment: quantities must match')
    assert (await client.get(f"{PODS}/hog")).status_code == 404


async def test_the_apiserver_refuses_invalid_quantities_with_422(
        client: httpx.AsyncClient) -> None:
    r = await client.post(PODS, json=pod({"cpu": "-1"}))
    assert r.status_code == 422
    assert r.json()["message"] == ('Pod "hog" is invalid: spec.containers[0].resources.'
                                   'requests[cpu]: Invalid value: "-1": must be greater than or '
                                   "equal to 0")
    d = await client.post(DEPLOYMENTS, json=deployment(pod({"cpu": "2"}, {"cpu": "1"})))
    assert d.status_code == 422
    assert d.json()["message"].startswith('Deployment.apps "web" is invalid: spec.template.spec.')
    ok = await client.post(PODS, json=pod({"cpu": "100m"}, {"cpu": "1"}))
    assert ok.status_code == 201
    # an update is checked as a create is
    body = copy.deepcopy(ok.json())
    body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    assert (await client.put(f"{PODS}/hog", json=body)).status_code == 400


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_the_quantity_corpus_is_answered_as_kube_apiserver_answers_it(
        client: httpx.AsyncClient, case: QuantityCase) -> None:
    r = await client.post(case.path, params={"dryRun": "All"}, json=case.body)
    code, reason, _, causes = answer(r)
    assert (code, tuple(f for f, _, _ in causes)) == (case.code, case.fields), r.text
    assert reason == {201: "", 400: "BadRequest", 422: "Invalid"}[case.code]
    name = case.body["metadata"]["name"]
    assert (await client.get(f"{case.path}/{name}")).status_code == 404  # a dry run stores none
