"""Simulated BigFleet shard: machine catalog, sans-IO engine, Trio session layer.

- :mod:`.catalog`: :class:`MachineShape`, :class:`Catalog`, :func:`default_catalog`,
  :func:`load_catalog` (YAML files; format in ``catalog.example.yaml``), :class:`CatalogError`.
- :mod:`.engine`: :class:`ShardEngine` (pure, deterministic, seeded) and its effects.
- :mod:`.fleet`: :class:`FleetEngine` (one pool, one engine per cluster), :class:`Move`.
- :mod:`.session`: :class:`SimShard` (serves ``ShardStream`` sessions on the Trio clock),
  :class:`NodeHooks` / :class:`NoopNodeHooks`, :class:`SessionRejected`.
- :mod:`.nodes`: :class:`KubeNodeHooks` (Nodes through the Kubernetes API), :func:`node_manifest`.
- :mod:`.noderetry`: :class:`NodeHookRunner` (failed node hooks retried with capped backoff).
- :mod:`.cli`: :func:`run_cli` for ``bigfleet-trio sim shard``.
"""

from . import engine
from .catalog import (
    EXAMPLE_CATALOG,
    Catalog,
    CatalogError,
    MachineShape,
    ShapeTaint,
    default_catalog,
    load_catalog,
    offer,
    parse_catalog,
)
from .cli import run_cli, serve_sim_shard
from .engine import *  # noqa: F403 - engine.__all__: ShardEngine, its model and effects
from .fleet import FleetEngine, Move
from .nodes import KubeNodeHooks, node_manifest
from .session import NodeHooks, NoopNodeHooks, SessionRejected, SimShard

__all__ = [
    "Catalog", "MachineShape", "ShapeTaint", "default_catalog", "offer",
    "CatalogError", "EXAMPLE_CATALOG", "load_catalog", "parse_catalog",
    "KubeNodeHooks", "node_manifest",
    "NodeHooks", "NoopNodeHooks", "SessionRejected", "SimShard",
    "run_cli", "serve_sim_shard", "FleetEngine", "Move",
]
__all__ += engine.__all__
