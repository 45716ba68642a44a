"""Pod -> CapacityRequest translation, rule by rule.

Every expected value is worked out by hand in the table.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bigfleet_trio.podcontroller.defaults import parse_priority_class_defaults
from bigfleet_trio.podcontroller.translate import (
    INTERRUPTION_PENALTY_ANNOTATION as IP,
)
from bigfleet_trio.podcontroller.translate import (
    RECLAMATION_PENALTY_ANNOTATION as RP,
)
from bigfleet_trio.podcontroller.translate import (
    Translation,
    TranslationError,
    build_capacity_request,
    cr_name_for_pod,
    is_terminal,
    translate_pod,
)

EXISTS = {"key": "node.kubernetes.io/instance-type", "operator": "Exists"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def ctr(
    requests: dict[str, Any] | None = None,
    *,
    limits: dict[str, Any] | None = None,
    sidecar: bool = False,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "x"}
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    if res:
        c["resources"] = res
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(
    spec: dict[str, Any] | None = None, annotations: dict[str, Any] | None = None, **meta: Any
) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": [ctr()]}
    s.update(spec or {})
    m: dict[str, Any] = {
        "name": "p",
        "namespace": "ns",
        "uid": "0d1c6c1e-3b0f-4c47-9a55-1b2a3c4d5e6f",
    }
    m.update(meta)
    if annotations is not None:
        m["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": s}


def spec_of(p: dict[str, Any], defaults_yaml: str | None = None) -> dict[str, Any]:
    d = parse_priority_class_defaults(defaults_yaml) if defaults_yaml is not None else None
    return translate_pod(p, d).spec


# ---------------------------------------------------------------------------------------------
# resources


RESOURCE_CASES = [
    pytest.param({"containers": [ctr()]}, {}, id="no-requests-empty-map"),
    pytest.param(
        {
            "containers": [
                ctr({"cpu": "100m", "memory": "64Mi"}),
                ctr({"cpu": "1", "memory": "64Mi"}),
            ]
        },
        {"cpu": "1100m", "memory": "128Mi"},
        id="containers-summed",
    ),
    pytest.param(
        {"containers": [ctr({"cpu": "100m"}, limits={"cpu": "4", "memory": "8Gi"})]},
        {"cpu": "100m"},
        id="limits-ignored",
    ),
    pytest.param(
        {"containers": [ctr({"cpu": "2", "nvidia.com/gpu": "0"})]},
        {"cpu": "2", "nvidia.com/gpu": "0"},
        id="zero-valued-key-kept",
    ),
    pytest.param(
        {"containers": [ctr({"cpu": "0.5", "memory": "1024Mi", "example.com/dongle": 3})]},
        {"cpu": "500m", "memory": "1Gi", "example.com/dongle": "3"},
        id="canonical-strings-and-bare-int",
    ),
    pytest.param(
        # Plain init containers run one at a time before the main ones: the peak, not the sum.
        {
            "initContainers": [
                ctr({"cpu": "2", "memory": "1Gi"}),
                ctr({"cpu": "500m", "memory": "3Gi"}),
            ],
            "containers": [ctr({"cpu": "1", "memory": "2Gi"})],
        },
        {"cpu": "2", "memory": "3Gi"},
        id="init-peak-per-dimension",
    ),
    pytest.param(
        {"initContainers": [ctr({"cpu": "100m"})], "containers": [ctr({"cpu": "1"})]},
        {"cpu": "1"},
        id="init-smaller-than-run",
    ),
    pytest.param(
        {"initContainers": [ctr({"ephemeral-storage": "5Gi"})], "containers": [ctr({"cpu": "1"})]},
        {"cpu": "1", "ephemeral-storage": "5Gi"},
        id="init-only-key-kept",
    ),
    pytest.param(
        # Sidecar joins the running set for the Pod's lifetime.
        {
            "initContainers": [ctr({"cpu": "50m", "memory": "64Mi"}, sidecar=True)],
            "containers": [ctr({"cpu": "300m", "memory": "128Mi"})],
        },
        {"cpu": "350m", "memory": "192Mi"},
        id="sidecar-added-to-run",
    ),
    pytest.param(
        # Init BEFORE the sidecar: its stage does not include the sidecar.
        # run = 100m + 200m = 300m; stages: init 1 -> 1; sidecar -> 200m. max(300m, 1) = 1.
        {
            "initContainers": [ctr({"cpu": "1"}), ctr({"cpu": "200m"}, sidecar=True)],
            "containers": [ctr({"cpu": "100m"})],
        },
        {"cpu": "1"},
        id="init-before-sidecar",
    ),
    pytest.param(
        # Init AFTER the sidecar: stage = sidecar + init = 1200m > run 300m.
        {
            "initContainers": [ctr({"cpu": "200m"}, sidecar=True), ctr({"cpu": "1"})],
            "containers": [ctr({"cpu": "100m"})],
        },
        {"cpu": "1200m"},
        id="init-after-sidecar",
    ),
    pytest.param(
        # Two sidecars then an init: stage = 100m + 200m + 1 = 1300m; run = 50m+100m+200m = 350m.
        {
            "initContainers": [
                ctr({"cpu": "100m"}, sidecar=True),
                ctr({"cpu": "200m"}, sidecar=True),
                ctr({"cpu": "1"}),
            ],
            "containers": [ctr({"cpu": "50m"})],
        },
        {"cpu": "1300m"},
        id="init-after-two-sidecars",
    ),
    pytest.param(
        # restartPolicy other than Always is a plain init container.
        {
            "initContainers": [dict(ctr({"cpu": "300m"}), restartPolicy="OnFailure")],
            "containers": [ctr({"cpu": "100m"})],
        },
        {"cpu": "300m"},
        id="non-always-restart-policy-is-plain-init",
    ),
    pytest.param(
        {
            "containers": [ctr({"cpu": "700m", "memory": "600Mi"})],
            "overhead": {"cpu": "250m", "memory": "160Mi"},
        },
        {"cpu": "950m", "memory": "760Mi"},
        id="overhead-added",
    ),
    pytest.param(
        {"containers": [ctr({"cpu": "1"})], "overhead": {"memory": "160Mi"}},
        {"cpu": "1", "memory": "160Mi"},
        id="overhead-only-key",
    ),
    pytest.param(
        # Overhead after the init peak: max(100m, 2) + 250m.
        {
            "initContainers": [ctr({"cpu": "2"})],
            "containers": [ctr({"cpu": "100m"})],
            "overhead": {"cpu": "250m"},
        },
        {"cpu": "2250m"},
        id="overhead-after-init-peak",
    ),
    pytest.param(
        {
            "containers": [ctr()],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "overhead": {"cpu": "250m", "memory": "160Mi"},
        },
        {"cpu": "750m", "memory": "1184Mi"},
        id="pod-level-plus-overhead",
    ),
    pytest.param(
        # Pod-level cpu replaces the aggregate cpu; memory (not named at pod level) and GPUs keep
        # the container aggregate.
        {
            "containers": [ctr({"cpu": "3", "memory": "2Gi", "nvidia.com/gpu": "1"})],
            "resources": {"requests": {"cpu": "4"}},
        },
        {"cpu": "4", "memory": "2Gi", "nvidia.com/gpu": "1"},
        id="pod-level-partial",
    ),
    pytest.param(
        # Pod-level can be smaller than the containers' sum; kube-scheduler uses it as given.
        {"containers": [ctr({"cpu": "3"})], "resources": {"requests": {"cpu": "1"}}},
        {"cpu": "1"},
        id="pod-level-wins-even-if-smaller",
    ),
    pytest.param(
        # ephemeral-storage is not a pod-level resource: ignored there, container value kept.
        {
            "containers": [ctr({"ephemeral-storage": "1Gi"})],
            "resources": {"requests": {"ephemeral-storage": "9Gi", "memory": "1Gi"}},
        },
        {"ephemeral-storage": "1Gi", "memory": "1Gi"},
        id="pod-level-unsupported-key-ignored",
    ),
    pytest.param(
        {"containers": [ctr()], "resources": {"requests": {"hugepages-2Mi": "4Mi"}}},
        {"hugepages-2Mi": "4Mi"},
        id="pod-level-hugepages",
    ),
    pytest.param(
        {"containers": [ctr({"cpu": "1"})], "resources": {"limits": {"cpu": "2"}}},
        {"cpu": "1"},
        id="pod-level-limits-ignored",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), RESOURCE_CASES)
def test_resources(spec: dict[str, Any], expected: dict[str, str]) -> None:
    assert spec_of(pod(spec))["resources"] == expected


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"containers": [ctr({"cpu": "lots"})]}, id="bad-container-request"),
        pytest.param({"containers": [ctr({"cpu": True})]}, id="bool-request"),
        pytest.param({"containers": [ctr()], "overhead": {"cpu": "1x"}}, id="bad-overhead"),
        pytest.param({"containers": "nope"}, id="containers-not-list"),
        pytest.param({"priority": "high"}, id="priority-not-int"),
        pytest.param({"priority": 2**31}, id="priority-out-of-int32"),
        pytest.param({"nodeSelector": {"a": True}}, id="nodeselector-non-string"),
        pytest.param(
            {"topologySpreadConstraints": [{"topologyKey": "zone"}]}, id="spread-without-maxskew"
        ),
        pytest.param({"topologySpreadConstraints": [{"maxSkew": 1}]}, id="spread-without-key"),
    ],
)
def test_malformed_pod_raises(spec: dict[str, Any]) -> None:
    with pytest.raises(TranslationError):
        translate_pod(pod(spec), None)


def test_pod_without_spec_raises() -> None:
    with pytest.raises(TranslationError):
        translate_pod({"metadata": {"name": "x"}, "spec": []}, None)


# ---------------------------------------------------------------------------------------------
# requirements


def node_affinity(required: Any = None, preferred: Any = None) -> dict[str, Any]:
    na: dict[str, Any] = {}
    if required is not None:
        na[REQUIRED] = required
    if preferred is not None:
        na[PREFERRED] = preferred
    return {"affinity": {"nodeAffinity": na}}


def term(*exprs: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"matchExpressions": list(exprs)}
    if fields:
        t["matchFields"] = fields
    return t


A_IN = {"key": "a", "operator": "In", "values": ["1", "2"]}
B_EXISTS = {"key": "b", "operator": "Exists"}
C_GT = {"key": "c", "operator": "Gt", "values": ["5"]}
D_LT = {"key": "d", "operator": "Lt", "values": ["9"]}
MF = [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]

REQUIREMENT_CASES = [
    pytest.param({}, [EXISTS], id="nothing-synthesised-exists"),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term(A_IN, B_EXISTS)]}),
        [A_IN, B_EXISTS],
        id="first-term-copied",
    ),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term(A_IN), term(B_EXISTS)]}),
        [A_IN],
        id="only-first-term",
    ),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term(C_GT, D_LT)]}),
        [C_GT, D_LT],
        id="gt-lt-copied-verbatim",
    ),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term(A_IN, fields=MF)]}),
        [A_IN],
        id="matchfields-ignored",
    ),
    pytest.param(
        {"nodeSelector": {"zeta": "z", "alpha": "a"}},
        [
            {"key": "alpha", "operator": "In", "values": ["a"]},
            {"key": "zeta", "operator": "In", "values": ["z"]},
        ],
        id="nodeselector-sorted",
    ),
    pytest.param(
        dict(node_affinity({"nodeSelectorTerms": [term(C_GT)]}), nodeSelector={"b": "x", "a": "y"}),
        [
            C_GT,
            {"key": "a", "operator": "In", "values": ["y"]},
            {"key": "b", "operator": "In", "values": ["x"]},
        ],
        id="affinity-then-nodeselector",
    ),
    pytest.param(node_affinity({"nodeSelectorTerms": []}), [], id="required-no-terms-none"),
    pytest.param(node_affinity({}), [], id="required-empty-object-none"),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term()]}), [], id="required-empty-expressions-none"
    ),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term(fields=MF)]}),
        [],
        id="daemonset-matchfields-only-none",
    ),
    pytest.param(
        dict(node_affinity({"nodeSelectorTerms": [term(fields=MF)]}), nodeSelector={"os": "linux"}),
        [{"key": "os", "operator": "In", "values": ["linux"]}],
        id="daemonset-matchfields-plus-nodeselector",
    ),
    pytest.param(
        node_affinity(preferred=[{"weight": 1, "preference": term(A_IN)}]),
        [EXISTS],
        id="preferred-only-synthesised",
    ),
    pytest.param(
        node_affinity({"nodeSelectorTerms": [term({"key": "k", "operator": "In", "values": []})]}),
        [{"key": "k", "operator": "In"}],
        id="empty-values-omitted",
    ),
    pytest.param(
        {"affinity": {"nodeAffinity": {REQUIRED: None}}}, [EXISTS], id="null-required-is-absent"
    ),
]


@pytest.mark.parametrize(("spec", "expected"), REQUIREMENT_CASES)
def test_requirements(spec: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    out = spec_of(pod(spec))
    if expected:
        assert out["requirements"] == expected
    else:
        assert "requirements" not in out


# ---------------------------------------------------------------------------------------------
# co-location


SEL = {
    "matchLabels": {"app": "db"},
    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x"]}],
}


def pod_affinity(required: Any = None, preferred: Any = None, anti: Any = None) -> dict[str, Any]:
    aff: dict[str, Any] = {}
    pa: dict[str, Any] = {}
    if required is not None:
        pa[REQUIRED] = required
    if preferred is not None:
        pa[PREFERRED] = preferred
    if pa:
        aff["podAffinity"] = pa
    if anti is not None:
        aff["podAntiAffinity"] = {REQUIRED: anti}
    return {"affinity": aff}


CO_LOCATION_CASES = [
    pytest.param({}, None, id="none"),
    pytest.param(
        pod_affinity([{"labelSelector": SEL, "topologyKey": "zone"}]),
        {"labelSelector": SEL, "topologyKey": "zone"},
        id="required-term",
    ),
    pytest.param(
        pod_affinity(
            [
                {"labelSelector": SEL, "topologyKey": "zone"},
                {"labelSelector": {"matchLabels": {"b": "c"}}, "topologyKey": "host"},
            ]
        ),
        {"labelSelector": SEL, "topologyKey": "zone"},
        id="first-term-only",
    ),
    pytest.param(
        pod_affinity([{"topologyKey": "zone"}]), {"topologyKey": "zone"}, id="selector-absent"
    ),
    pytest.param(
        pod_affinity(
            [
                {
                    "labelSelector": SEL,
                    "topologyKey": "zone",
                    "namespaces": ["x"],
                    "matchLabelKeys": ["y"],
                }
            ]
        ),
        {"labelSelector": SEL, "topologyKey": "zone"},
        id="other-fields-dropped",
    ),
    pytest.param(
        pod_affinity(
            preferred=[{"weight": 5, "podAffinityTerm": {"labelSelector": SEL, "topologyKey": "z"}}]
        ),
        None,
        id="preferred-ignored",
    ),
    pytest.param(
        pod_affinity(anti=[{"labelSelector": SEL, "topologyKey": "host"}]), None, id="anti-ignored"
    ),
    pytest.param(pod_affinity([]), None, id="empty-required-list"),
]


@pytest.mark.parametrize(("spec", "expected"), CO_LOCATION_CASES)
def test_co_location(spec: dict[str, Any], expected: dict[str, Any] | None) -> None:
    out = spec_of(pod(spec))
    if expected is None:
        assert "coLocation" not in out
    else:
        assert out["coLocation"] == expected


def test_co_location_selector_is_deep_copy() -> None:
    p = pod(pod_affinity([{"labelSelector": copy.deepcopy(SEL), "topologyKey": "zone"}]))
    out = translate_pod(p, None).spec
    out["coLocation"]["labelSelector"]["matchLabels"]["app"] = "changed"
    assert p["spec"]["affinity"]["podAffinity"][REQUIRED][0]["labelSelector"] == SEL


def test_co_location_without_topology_key_warns() -> None:
    t = translate_pod(pod(pod_affinity([{"labelSelector": SEL}])), None)
    assert "coLocation" not in t.spec
    assert len(t.warnings) == 1 and "topologyKey" in t.warnings[0]


# ---------------------------------------------------------------------------------------------
# priority and spread


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, 0, id="unset-zero"),
        pytest.param({"priority": 1000000}, 1000000, id="set"),
        pytest.param({"priority": -5}, -5, id="negative"),
        pytest.param({"priority": 7, "priorityClassName": "ignored-name"}, 7, id="value-not-name"),
    ],
)
def test_priority(spec: dict[str, Any], expected: int) -> None:
    assert spec_of(pod(spec))["priority"] == expected


def tsc(skew: int, key: str, when: str | None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "maxSkew": skew,
        "topologyKey": key,
        "labelSelector": {"matchLabels": {"a": "b"}},
        "minDomains": 2,
    }
    if when is not None:
        c["whenUnsatisfiable"] = when
    return c


SPREAD_CASES = [
    pytest.param([], [], id="none"),
    pytest.param(
        [tsc(1, "zone", "DoNotSchedule")],
        [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
        id="dns-kept",
    ),
    pytest.param([tsc(1, "host", "ScheduleAnyway")], [], id="scheduleanyway-dropped"),
    pytest.param(
        [tsc(2, "host", "ScheduleAnyway"), tsc(5, "zone", "DoNotSchedule"), tsc(3, "rack", None)],
        [
            {"maxSkew": 5, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
            {"maxSkew": 3, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"},
        ],
        id="mixed-order-kept-unset-defaults-dns",
    ),
]


@pytest.mark.parametrize(("constraints", "expected"), SPREAD_CASES)
def test_topology_spread(constraints: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    out = spec_of(pod({"topologySpreadConstraints": constraints}))
    if expected:
        assert out["topologySpread"] == expected
    else:
        assert "topologySpread" not in out


def test_unknown_when_unsatisfiable_dropped_with_warning() -> None:
    t = translate_pod(pod({"topologySpreadConstraints": [tsc(1, "zone", "Sometimes")]}), None)
    assert "topologySpread" not in t.spec
    assert len(t.warnings) == 1 and "Sometimes" in t.warnings[0]


# ---------------------------------------------------------------------------------------------
# penalties


DEFAULTS = (
    'gold: {interruptionPenalty: "8000", reclamationPenalty: "65536"}\n'
    'silver: {interruptionPenalty: "16"}\n'
    "bronze:\n"
)

PENALTY_CASES = [
    # (annotations, priorityClassName, defaults yaml, interruption, reclamation, warning count)
    pytest.param(None, None, None, None, None, 0, id="nothing-absent"),
    pytest.param(None, "gold", DEFAULTS, "8k", "65536", 0, id="class-defaults-canonical"),
    pytest.param(None, "gold", None, None, None, 0, id="no-defaults-file"),
    pytest.param(None, "platinum", DEFAULTS, None, None, 0, id="unknown-class"),
    pytest.param(None, "bronze", DEFAULTS, None, None, 0, id="class-entry-without-values"),
    pytest.param(
        {IP: "100", RP: "2500m"}, "gold", DEFAULTS, "100", "2500m", 0, id="annotations-win"
    ),
    pytest.param({IP: "3000"}, "gold", DEFAULTS, "3k", "65536", 0, id="independent-mix"),
    pytest.param({RP: "1"}, "silver", DEFAULTS, "16", "1", 0, id="independent-mix-other-way"),
    pytest.param({RP: "7"}, "silver", None, None, "7", 0, id="annotation-without-defaults"),
    pytest.param(
        {IP: "not-money"}, "gold", DEFAULTS, "8k", "65536", 1, id="unparseable-falls-to-default"
    ),
    pytest.param({IP: "x", RP: "y"}, None, None, None, None, 2, id="unparseable-falls-to-absent"),
    pytest.param({IP: ""}, "gold", DEFAULTS, "8k", "65536", 0, id="empty-annotation-not-set"),
    pytest.param(
        {IP: "-1.5", RP: "0"}, None, None, "-1500m", "0", 0, id="negative-fractional-zero"
    ),
    pytest.param(
        {"bigfleet.lucy.sh/other": "5"}, None, None, None, None, 0, id="other-annotations-ignored"
    ),
]


@pytest.mark.parametrize(
    ("annotations", "class_name", "defaults", "ip", "rp", "n_warnings"), PENALTY_CASES
)
def test_penalties(
    annotations: dict[str, str] | None,
    class_name: str | None,
    defaults: str | None,
    ip: str | None,
    rp: str | None,
    n_warnings: int,
) -> None:
    spec: dict[str, Any] = {"priorityClassName": class_name} if class_name else {}
    d = parse_priority_class_defaults(defaults) if defaults is not None else None
    t = translate_pod(pod(spec, annotations=annotations), d)
    assert t.spec.get("interruptionPenalty") == ip
    assert t.spec.get("reclamationPenalty") == rp
    assert ("interruptionPenalty" in t.spec) == (ip is not None)
    assert ("reclamationPenalty" in t.spec) == (rp is not None)
    assert len(t.warnings) == n_warnings


def test_unparseable_annotation_warning_names_annotation_and_value() -> None:
    t = translate_pod(pod(annotations={RP: "a lot"}), None)
    assert t.warnings and RP in t.warnings[0] and "'a lot'" in t.warnings[0]


# ---------------------------------------------------------------------------------------------
# whole spec shape


def test_full_spec_shape() -> None:
    p = pod(
        {
            "priority": 30,
            "priorityClassName": "gold",
            "containers": [ctr({"cpu": "1", "memory": "1Gi"})],
            "nodeSelector": {"gpu": "l4"},
            "affinity": {
                "podAffinity": {
                    REQUIRED: [
                        {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"}
                    ]
                }
            },
            "topologySpreadConstraints": [tsc(1, "zone", "DoNotSchedule")],
        },
        annotations={RP: "5"},
    )
    t = translate_pod(p, parse_priority_class_defaults(DEFAULTS))
    assert t == Translation(
        spec={
            "priority": 30,
            "resources": {"cpu": "1", "memory": "1Gi"},
            "requirements": [{"key": "gpu", "operator": "In", "values": ["l4"]}],
            "coLocation": {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"},
            "topologySpread": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
            ],
            "interruptionPenalty": "8k",
            "reclamationPenalty": "5",
        },
        warnings=(),
    )


def test_minimal_spec_shape() -> None:
    assert translate_pod(pod(), None) == Translation(
        spec={"priority": 0, "resources": {}, "requirements": [EXISTS]}, warnings=()
    )


def test_input_not_mutated() -> None:
    p = pod(
        {
            "initContainers": [ctr({"cpu": "1"}, sidecar=True)],
            "overhead": {"cpu": "1"},
            "nodeSelector": {"a": "b"},
        }
    )
    before = copy.deepcopy(p)
    translate_pod(p, None)
    assert p == before


# ---------------------------------------------------------------------------------------------
# terminal, name, full object


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(None, False, id="no-status"),
        pytest.param({}, False, id="empty-status"),
        pytest.param({"phase": "Pending"}, False, id="pending"),
        pytest.param({"phase": "Running"}, False, id="running"),
        pytest.param({"phase": "Unknown"}, False, id="unknown"),
        pytest.param({"phase": "Succeeded"}, True, id="succeeded"),
        pytest.param({"phase": "Failed"}, True, id="failed"),
    ],
)
def test_is_terminal(status: dict[str, Any] | None, expected: bool) -> None:
    p = pod()
    if status is not None:
        p["status"] = status
    assert is_terminal(p) is expected


@pytest.mark.parametrize(
    ("uid", "expected"),
    [
        pytest.param(
            "0d1c6c1e-3b0f-4c47-9a55-1b2a3c4d5e6f",
            "cr-0d1c6c1e-3b0f-4c47-9a55-1b2a3c4d5e6f",
            id="uuid",
        ),
        pytest.param("policy-pod-uid", "cr-policy-pod-uid", id="dns-safe-custom"),
        # sha256("ABC") = b5d4045c3f466fa91fe2cc6abe79232a1a57cdf104f7a26e716e0a1e2789df78
        pytest.param(
            "ABC",
            "cr-b5d4045c3f466fa91fe2cc6abe79232a1a57cdf104f7a26e716e0a1e2789df78",
            id="uppercase-hashed",
        ),
    ],
)
def test_cr_name(uid: str, expected: str) -> None:
    assert cr_name_for_pod(uid) == expected


@pytest.mark.parametrize("uid", ["a_b", "trailing-", "x/y", "a..b"])
def test_cr_name_invalid_uid_chars_hashed(uid: str) -> None:
    name = cr_name_for_pod(uid)
    assert name.startswith("cr-") and len(name) == 67
    assert all(ch in "0123456789abcdef" for ch in name[3:])
    assert name == cr_name_for_pod(uid)


def test_cr_name_long_uid_hashed() -> None:
    name = cr_name_for_pod("a" * 251)
    assert len(name) == 67 and name.startswith("cr-")
    assert cr_name_for_pod("a" * 250) == "cr-" + "a" * 250  # exactly 253


def test_cr_name_empty_uid() -> None:
    with pytest.raises(TranslationError):
        cr_name_for_pod("")


def test_build_capacity_request() -> None:
    p = pod(name="web-1", namespace="shop", uid="11111111-2222-4333-8444-555555555555")
    t = translate_pod(p, None)
    cr = build_capacity_request(p, t)
    assert cr == {
        "apiVersion": "bigfleet.lucy.sh/v1alpha1",
        "kind": "CapacityRequest",
        "metadata": {
            "name": "cr-11111111-2222-4333-8444-555555555555",
            "namespace": "shop",
            "labels": {"bigfleet.lucy.sh/owned-by-pod": "11111111-2222-4333-8444-555555555555"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "web-1",
                    "uid": "11111111-2222-4333-8444-555555555555",
                    "controller": True,
                }
            ],
        },
        "spec": {"priority": 0, "resources": {}, "requirements": [EXISTS]},
    }
    assert "status" not in cr
    cr["spec"]["requirements"].append("x")
    assert t.spec["requirements"] == [EXISTS]  # deep copy


@pytest.mark.parametrize("missing", ["name", "namespace", "uid"])
def test_build_capacity_request_needs_identity(missing: str) -> None:
    p = pod()
    del p["metadata"][missing]
    with pytest.raises(TranslationError, match=missing):
        build_capacity_request(p, translate_pod(p, None))


# --------------------------------------------------------------------------------------------
# the operators a CR carries, and what the shipped CRD accepts (the controller checks first)


def test_requirement_operators_are_the_core_ones_and_the_crd_takes_any() -> None:
    from pathlib import Path

    import yaml

    import bigfleet_trio
    from bigfleet_trio.podcontroller.translate import CRD_REQUIREMENT_OPERATORS

    text = (Path(bigfleet_trio.__file__).parent / "manifests" / "crds.yaml").read_text()
    crds = {d["spec"]["names"]["kind"]: d for d in yaml.safe_load_all(text) if d}
    schema = crds["CapacityRequest"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    req = schema["properties"]["spec"]["properties"]["requirements"]["items"]
    # a plain string, as upstream's (core NodeSelectorRequirement): the CRD refuses nothing
    assert req["properties"]["operator"] == {**req["properties"]["operator"], "type": "string"}
    assert "enum" not in req["properties"]["operator"]
    assert CRD_REQUIREMENT_OPERATORS == {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}


@pytest.mark.parametrize(
    ("requirements", "expected"),
    [
        pytest.param(None, (), id="no-requirements"),
        pytest.param([EXISTS, A_IN, B_EXISTS], (), id="all-supported"),
        pytest.param(
            [{"key": "x", "operator": "NotIn", "values": ["1"]},
             {"key": "y", "operator": "DoesNotExist"}],
            (),
            id="notin-doesnotexist",
        ),
        pytest.param([A_IN, C_GT, B_EXISTS, D_LT], (), id="gt-lt-carried"),
        pytest.param(
            [A_IN, {"key": "e", "operator": "Near"}, C_GT, {"key": "f", "operator": "Far"}],
            ({"key": "e", "operator": "Near"}, {"key": "f", "operator": "Far"}),
            id="unknown-operators-in-order",
        ),
        pytest.param([{"key": "z", "operator": "in"}], ({"key": "z", "operator": "in"},),
                     id="case-matters"),
    ],
)
def test_unsupported_requirements(
    requirements: list[dict[str, Any]] | None, expected: tuple[dict[str, Any], ...]
) -> None:
    from bigfleet_trio.podcontroller.translate import unsupported_requirements

    spec: dict[str, Any] = {"priority": 0, "resources": {}}
    if requirements is not None:
        spec["requirements"] = requirements
    assert unsupported_requirements(spec) == expected


def test_gt_lt_pod_translation_is_carried_verbatim() -> None:
    from bigfleet_trio.podcontroller.translate import unsupported_requirements

    t = translate_pod(pod(node_affinity({"nodeSelectorTerms": [term(A_IN, C_GT, D_LT)]})), None)
    assert t.spec["requirements"] == [A_IN, C_GT, D_LT]
    assert unsupported_requirements(t.spec) == ()
