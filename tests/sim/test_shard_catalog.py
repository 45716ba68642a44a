"""Tests of the simulated shard's catalog files (a configurable catalog of shapes).

Covers :func:`load_catalog` (happy path, defaults, one-line errors naming file and field), the
shipped example (== :func:`default_catalog`, and shipped as package data), and how
``run_cli`` (``sim shard --catalog/--seed``) and ``run_demo`` (``demo --catalog``) use it.
Expected shapes and messages are written out by hand from the format in catalog.example.yaml.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from bigfleet_trio.sim import demo
from bigfleet_trio.sim.shard import EXAMPLE_CATALOG
from bigfleet_trio.sim.shard import cli as shard_cli
from bigfleet_trio.sim.shard.catalog import (
    Catalog,
    CatalogError,
    MachineShape,
    ShapeTaint,
    default_catalog,
    load_catalog,
    parse_catalog,
)
from bigfleet_trio.sim.shard.engine import EngineConfig

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str, name: str = "cat.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# ------------------------------------------------------------------------------ happy path

SMALL = """\
zones: [z-a, z-b]
shapes:
  - instanceType: s4
    allocatable: {cpu: 4, memory: 16Gi, pods: "110"}
    pricePerHour: 0.25
    count: 3
    warm: 1
    labels: {pool: general}
  - instanceType: gpu-1
    zones: [z-c]
    region: r-2
    allocatable: {cpu: "8", memory: 32Gi, nvidia.com/gpu: 1, scratch: 0.5}
    pricePerHour: 2
    taints:
      - {key: nvidia.com/gpu, value: present}
      - {key: dedicated, effect: NoExecute}
"""


def test_load_small_catalog(tmp_path: Path) -> None:
    cat = load_catalog(_write(tmp_path, SMALL))
    s4 = {"cpu": "4", "memory": "16Gi", "pods": "110"}
    assert list(cat) == [
        MachineShape("s4", "z-a", s4, 0.25, count=3, warm=1, extra_labels={"pool": "general"}),
        MachineShape("s4", "z-b", s4, 0.25, count=3, warm=1, extra_labels={"pool": "general"}),
        MachineShape(
            "gpu-1", "z-c", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1", "scratch": "0.5"},
            2.0, count=8, warm=0, region="r-2",
            taints=(ShapeTaint("nvidia.com/gpu", "present", "NoSchedule"),
                    ShapeTaint("dedicated", "", "NoExecute")),
        ),
    ]
    assert cat.get("gpu-1/z-c") is not None and cat.get("gpu-1/z-a") is None
    assert cat.shapes[0].labels()["topology.kubernetes.io/region"] == "sim-region-1"
    assert cat.shapes[2].labels()["topology.kubernetes.io/region"] == "r-2"


def test_load_accepts_path_objects_and_count_zero(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: 1}, "
                 "pricePerHour: 0, count: 0}]\n")
    assert load_catalog(p) == Catalog([MachineShape("t", "z", {"cpu": "1"}, 0.0, count=0)])


def test_catalog_equality() -> None:
    a = Catalog([MachineShape("t", "z", {"cpu": "1"}, 1.0)])
    assert a == Catalog([MachineShape("t", "z", {"cpu": "1"}, 1.0)])
    assert a != Catalog([MachineShape("t", "z", {"cpu": "2"}, 1.0)])
    assert a != "not a catalog"


def test_example_file_is_the_default_catalog() -> None:
    assert EXAMPLE_CATALOG.is_file()
    assert load_catalog(EXAMPLE_CATALOG) == default_catalog()


def test_example_file_ships_as_package_data() -> None:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]["bigfleet_trio"]
    rel = EXAMPLE_CATALOG.relative_to(REPO / "bigfleet_trio").as_posix()
    assert any(Path(rel).match(g) for g in globs), globs


# ------------------------------------------------------------------------------ errors

SHAPE = "instanceType: t, zones: [z], allocatable: {cpu: '1'}, pricePerHour: 1"
NAME_RULE = ("is not a valid name (at most 63 alphanumerics, '-', '_' or '.', starting and "
             "ending alphanumeric, after an optional DNS prefix and '/')")
VALUE_RULE = ("is not a valid label value (at most 63 alphanumerics, '-', '_' or '.', starting "
              "and ending alphanumeric)")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file (expected a mapping with a 'shapes' list)"),
        ("- a\n", "must be of type object, got a list"),
        ("zones: [z]\n", "'shapes' is a required property"),
        ("shape: []\n", "unknown field shape (known: zones, shapes)"),
        ("shapes: []\n", "shapes: must not be empty"),
        ("shapes: {a: 1}\n", "shapes: must be of type array, got a mapping"),
        ("shapes: [{zones: [z], allocatable: {cpu: '1'}, pricePerHour: 1}]\n",
         "shapes[0]: 'instanceType' is a required property"),
        (f"shapes: [{{{SHAPE}}}, {{{SHAPE.replace('pricePerHour', 'pricePerhour')}}}]\n",
         "shapes[1]: unknown field pricePerhour (known: instanceType, zones, allocatable, "
         "pricePerHour, count, warm, region, labels, taints)"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {memory: 16GB}, pricePerHour: 1}]",
         "shapes[0].allocatable.memory: invalid quantity '16GB': unexpected character 'B'"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: '-1'}, pricePerHour: 1}]",
         "shapes[0].allocatable.cpu: quantity '-1' must not be negative"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: '+'}, pricePerHour: 1}]",
         "shapes[0].allocatable.cpu: invalid quantity '+'"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: .inf}, pricePerHour: 1}]",
         "shapes[0].allocatable.cpu: invalid quantity 'inf': unexpected character 'f'"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: true}, pricePerHour: 1}]",
         "shapes[0].allocatable.cpu: must be of type string or integer or number, got a boolean"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {a b: '1'}, pricePerHour: 1}]",
         f"shapes[0].allocatable[\"a b\"]: resource 'a b' {NAME_RULE}"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {1: '1'}, pricePerHour: 1}]",
         "shapes[0].allocatable: key 1 must be a string (quote it in YAML)"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {}, pricePerHour: 1}]",
         "shapes[0].allocatable: must not be empty"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: '1'}, pricePerHour: -1}]",
         "shapes[0].pricePerHour: -1 is less than the minimum of 0"),
        ("shapes: [{instanceType: t, zones: [z], allocatable: {cpu: '1'}, pricePerHour: cheap}]",
         "shapes[0].pricePerHour: must be of type number, got a string"),
        (f"shapes: [{{{SHAPE}, count: 1.5}}]",
         "shapes[0].count: must be of type integer, got a number"),
        (f"shapes: [{{{SHAPE}, count: 2, warm: 3}}]", "shapes[0].warm: 3 is more than count (2)"),
        (f"shapes: [{{{SHAPE}, warm: 9}}]", "shapes[0].warm: 9 is more than count (8)"),
        ("shapes: [{instanceType: t, allocatable: {cpu: '1'}, pricePerHour: 1}]",
         "shapes[0]: 'zones' is required (here or at the top level)"),
        ("shapes: [{instanceType: t, zones: [], allocatable: {cpu: '1'}, pricePerHour: 1}]",
         "shapes[0].zones: must not be empty"),
        ("shapes: [{instanceType: t, zones: [zone a], allocatable: {cpu: '1'}, pricePerHour: 1}]",
         f"shapes[0].zones[0]: 'zone a' {VALUE_RULE}"),
        ("zones: [ok, -bad]\nshapes: [{instanceType: t, allocatable: {cpu: '1'}, "
         "pricePerHour: 1}]", f"zones[1]: '-bad' {VALUE_RULE}"),
        ("shapes: [{instanceType: 't/1', zones: [z], allocatable: {cpu: '1'}, pricePerHour: 1}]",
         f"shapes[0].instanceType: 't/1' {VALUE_RULE}"),
        (f"shapes: [{{{SHAPE}, region: r_}}]", f"shapes[0].region: 'r_' {VALUE_RULE}"),
        (f"shapes: [{{{SHAPE}}}, {{{SHAPE.replace('[z]', '[y, z]')}}}]",
         "shapes[1].zones[1]: duplicate machine shape t/z (also shapes[0].zones[0])"),
        ("zones: [z]\nshapes: [{instanceType: t, allocatable: {cpu: '1'}, pricePerHour: 1}, "
         "{instanceType: t, allocatable: {cpu: '2'}, pricePerHour: 2}]",
         "shapes[1]: duplicate machine shape t/z (also shapes[0])"),
        (f"shapes: [{{{SHAPE}, labels: {{topology.kubernetes.io/zone: z}}}}]",
         'shapes[0].labels["topology.kubernetes.io/zone"]: label topology.kubernetes.io/zone '
         "comes from instanceType, zones or region"),
        (f"shapes: [{{{SHAPE}, labels: {{kubernetes.io/hostname: h}}}}]",
         'shapes[0].labels["kubernetes.io/hostname"]: label kubernetes.io/hostname is set per '
         "machine by the shard"),
        (f"shapes: [{{{SHAPE}, labels: {{gpu: yes}}}}]",
         "shapes[0].labels.gpu: must be of type string, got a boolean (quote it in YAML)"),
        (f"shapes: [{{{SHAPE}, labels: {{Example.com/x: v}}}}]",
         "shapes[0].labels[\"Example.com/x\"]: label key 'Example.com/x' is not a valid name "
         "(bad prefix 'Example.com')"),
        (f"shapes: [{{{SHAPE}, labels: {{pool: 'a b'}}}}]",
         f"shapes[0].labels.pool: 'a b' {VALUE_RULE}"),
        (f"shapes: [{{{SHAPE}, taints: [{{key: k, effect: NoSchedul}}]}}]",
         "shapes[0].taints[0].effect: 'NoSchedul' is not one of ['NoSchedule', "
         "'PreferNoSchedule', 'NoExecute']"),
        (f"shapes: [{{{SHAPE}, taints: [{{value: v}}]}}]",
         "shapes[0].taints[0]: 'key' is a required property"),
        (f"shapes: [{{{SHAPE}, taints: [{{key: -k}}]}}]",
         f"shapes[0].taints[0].key: taint key '-k' {NAME_RULE}"),
        (f"shapes: [{{{SHAPE}, taints: [{{key: k, value: v v}}]}}]",
         f"shapes[0].taints[0].value: 'v v' {VALUE_RULE}"),
    ],
)
def test_invalid_catalog_is_one_line_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert str(info.value) == f"{path}: {message}"


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    # Line 2 is "  a: b: c"; the second ':' (column 7, 1-based) is where PyYAML gives up.
    path = _write(tmp_path, "shapes:\n  a: b: c\n")
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert str(info.value) == f"{path}:2:7: invalid YAML: mapping values are not allowed here"


def test_unreadable_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(CatalogError) as info:
        load_catalog(missing)
    assert str(info.value) == f"{missing}: cannot read: No such file or directory"
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path)
    assert str(info.value) == f"{tmp_path}: cannot read: Is a directory"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CatalogError) as info:
        load_catalog(binary)
    assert str(info.value).startswith(f"{binary}: cannot read: 'utf-8' codec can't decode")
    assert "\n" not in str(info.value)


def test_parse_catalog_default_source_name() -> None:
    with pytest.raises(CatalogError, match=r"^<catalog>: shapes: must not be empty$"):
        parse_catalog({"shapes": []})
    assert parse_catalog({"zones": ["z"], "shapes": [
        {"instanceType": "t", "allocatable": {"cpu": "1"}, "pricePerHour": 1}]}) == Catalog(
        [MachineShape("t", "z", {"cpu": "1"}, 1.0)])


# ------------------------------------------------------------------------------ run_cli / run_demo


def _capture_main(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []

    async def fake_main(*args: Any) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(shard_cli, "_main", fake_main)
    return seen


def test_run_cli_catalog_file_and_seed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _capture_main(monkeypatch)
    path = _write(tmp_path, SMALL)
    assert shard_cli.run_cli(0, None, catalog_file=path, seed=42) == 0
    ((port, kubeconfig, host, catalog, config),) = seen
    assert (port, kubeconfig, host) == (0, None, "127.0.0.1")  # loopback unless --host
    assert catalog == load_catalog(path) and len(catalog) == 3
    # every process numbers its reclaims under a prefix of its own
    # (docs/rules.md#reclaim-instruction-ids)
    assert config.instruction_prefix.startswith("reclaim-")
    assert config == EngineConfig(seed=42, instruction_prefix=config.instruction_prefix)


def test_run_cli_seed_keeps_other_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture_main(monkeypatch)
    assert shard_cli.run_cli(0, None, config=EngineConfig(create_delay=5.0), seed=3) == 0
    assert shard_cli.run_cli(0, None) == 0
    assert seen[0][3] == default_catalog()
    first, second = seen[0][4], seen[1][4]
    assert first == EngineConfig(create_delay=5.0, seed=3,
                                 instruction_prefix=first.instruction_prefix)
    # no --seed: the engine's defaults (seed 0), but a prefix of this process's own
    assert second == EngineConfig(instruction_prefix=second.instruction_prefix)
    assert first.instruction_prefix != second.instruction_prefix


def test_run_cli_bad_catalog_is_one_line_exit_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _capture_main(monkeypatch)
    path = _write(tmp_path, "shapes: []\n")
    assert shard_cli.run_cli(0, None, catalog_file=path) == 1
    assert capsys.readouterr().err.splitlines() == [f"sim shard: {path}: shapes: must not be empty"]
    assert seen == []  # nothing started


def test_run_demo_catalog_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from bigfleet_trio.sim.demo_options import DemoOptions

    seen: list[Any] = []

    class Stop(Exception):
        pass

    async def fake_run_scenario(opts: DemoOptions, **kw: Any) -> Any:
        seen.append(kw.get("catalog"))
        raise Stop

    monkeypatch.setattr(demo, "run_scenario", fake_run_scenario)
    path = _write(tmp_path, SMALL)
    with pytest.raises(Stop):
        demo.run_demo(DemoOptions(quiet=True), path)
    with pytest.raises(Stop):
        demo.run_demo(DemoOptions(quiet=True))
    assert seen == [load_catalog(path), None]  # None: run_scenario uses demo_catalog()

    bad = _write(tmp_path, "shapes: [{instanceType: t}]\n", "bad.yaml")
    assert demo.run_demo(DemoOptions(quiet=True), bad) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"demo: {bad}: shapes[0]: 'allocatable' is a required property"]
    assert len(seen) == 2


def test_run_cli_node_lease_duration_reaches_the_node_hooks_or_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bigfleet_trio.sim.shard.heartbeat import HeartbeatTiming

    timings: list[Any] = []

    async def fake_main(*args: Any, **kwargs: Any) -> int:
        timings.append(kwargs.get("timing"))
        return 0

    monkeypatch.setattr(shard_cli, "_main", fake_main)
    assert shard_cli.run_cli(0, None, node_lease_duration=200) == 0
    assert shard_cli.run_cli(0, None) == 0
    assert timings == [HeartbeatTiming(lease_duration=200), None]  # None: kubelet's 40 s
    assert shard_cli.run_cli(0, None, node_lease_duration=3) == 1
    assert capsys.readouterr().err == "sim shard: --node-lease-duration 3 must be >= 4\n"
