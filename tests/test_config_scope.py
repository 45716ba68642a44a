"""The pod controller's opt-out flags: --unmanaged-node-selector, --exclude-namespace,
--exclude-pod-selector (docs/rules.md#pod-translation-unmanaged-nodes-and-opt-out)."""

from __future__ import annotations

import pytest

from bigfleet_trio import cli
from bigfleet_trio.config import PodControllerConfig
from bigfleet_trio.knobs import ConfigError
from bigfleet_trio.podcontroller.scope import DEFAULT_UNMANAGED_NODE_SELECTORS, PodScope


def parse(*args: str) -> PodControllerConfig:
    cfg: PodControllerConfig = cli.pod_controller_config(cli.parse_args(["pod-controller", *args]))
    return cfg


def test_defaults() -> None:
    cfg = parse()
    assert cfg.unmanaged_node_selector == DEFAULT_UNMANAGED_NODE_SELECTORS
    assert cfg.exclude_namespace == ()
    assert cfg.exclude_pod_selector == ""
    cfg.validate()
    assert cfg.pod_scope() == PodScope.parse()


def test_the_flag_replaces_the_defaults_and_repeats() -> None:
    cfg = parse("--unmanaged-node-selector", "pool=system",
                "--unmanaged-node-selector=tier in (infra, ops)")
    assert cfg.unmanaged_node_selector == ("pool=system", "tier in (infra, ops)")
    scope = cfg.pod_scope()
    assert scope.node_unmanaged({"tier": "ops"})
    assert not scope.node_unmanaged({"node-role.kubernetes.io/control-plane": ""})


def test_an_empty_selector_means_no_node_is_unmanaged() -> None:
    cfg = parse("--unmanaged-node-selector=")
    cfg.validate()
    assert not cfg.pod_scope().watches_nodes


def test_exclusions() -> None:
    cfg = parse("--exclude-namespace", "batch", "--exclude-namespace=ci",
                "--exclude-pod-selector", "bigfleet.lucy.sh/exclude=true")
    cfg.validate()
    scope = cfg.pod_scope()
    assert scope.exclude_namespaces == frozenset({"batch", "ci"})
    assert scope.pod_labels_excluded({"bigfleet.lucy.sh/exclude": "true"})


@pytest.mark.parametrize(("args", "flag"), [
    (["--unmanaged-node-selector", "k in ()"], "--unmanaged-node-selector"),
    (["--unmanaged-node-selector", "ok", "--unmanaged-node-selector", "a=1,,b"],
     "--unmanaged-node-selector"),
    (["--exclude-pod-selector", "bad key!"], "--exclude-pod-selector"),
    (["--exclude-namespace", "Not_A_Namespace"], "--exclude-namespace"),
])
def test_bad_values_name_the_flag(args: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse(*args).validate()


def test_help_shows_the_default_selectors() -> None:
    text = cli.build_parser()._subparsers._group_actions[0].choices[  # type: ignore[union-attr]
        "pod-controller"].format_help()
    assert "node-role.kubernetes.io/control-plane" in "".join(text.split())
