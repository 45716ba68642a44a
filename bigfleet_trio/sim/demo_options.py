"""Options of ``bigfleet-trio demo`` (a light module: ``cli.py`` builds the flags from it
without importing the simulation)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bigfleet_trio.config import ProcessSettings
from bigfleet_trio.knobs import (
    DURATION,
    ConfigFileError,
    Settings,
    at_least_one,
    knob,
    listen_addr,
    positive,
    rebased,
)

__all__ = ["DemoOptions", "MAX_CLUSTERS"]

MAX_CLUSTERS = 8
"""Each cluster is an apiserver, a pod controller and an operator in one process."""


@dataclass(init=False, eq=True)
class DemoOptions(Settings):
    """Options of the one-command laptop demo (flags generated from the fields)."""

    workloads_dir: str | None = knob(
        None, "apply these manifests instead of the bundled workloads", flag="--workloads",
        metavar="DIR",
    )
    keep_running: bool = knob(False, "keep serving after the scenario and print a kubeconfig")
    timeout: float = knob(90.0, "fail if the scenario takes longer", unit=DURATION,
                          check=positive)
    quiet: bool = knob(False, "no live progress, only the summary")
    json_summary: bool = knob(
        False, "print the summary as JSON on stdout (progress goes to stderr)", flag="--json"
    )
    kubeconfig_out: str | None = knob(
        None, "write the embedded apiserver's kubeconfig here", metavar="PATH"
    )
    seed: int = knob(1, "simulated shard seed")
    clusters: int = knob(3, "simulated clusters, each its own apiserver, pod controller and "
                         "operator, sharing the shard's pool (at most 8)", check=at_least_one)
    page_addr: str = knob(
        "127.0.0.1:0", "the live page (one HTML page fed over a WebSocket); port 0 picks a "
        "free one, 0 disables", metavar="ADDR", check=listen_addr,
    )
    metrics_addr: str = knob(
        "127.0.0.1:0", "/metrics, /healthz, /readyz, /events of the demo's operator and pod "
        "controller (one process); port 0 picks a free one, 0 disables", metavar="ADDR",
        check=listen_addr,
    )
    log_format: str = rebased(ProcessSettings, "log_format", "text")
    # The demo shows its own progress on stdout, so logs default to warnings.
    log_level: str = rebased(ProcessSettings, "log_level", "warning")

    def validate(self) -> None:
        """Check the options.

        Raises:
            ConfigError: a missing workloads directory, a non-positive timeout, a bad log flag,
                more than :data:`MAX_CLUSTERS` clusters.
        """
        if self.clusters > MAX_CLUSTERS:
            raise ConfigFileError(f"--clusters: {self.clusters}: at most {MAX_CLUSTERS}")
        if self.workloads_dir is not None and not os.path.isdir(self.workloads_dir):
            raise ConfigFileError(f"--workloads: {self.workloads_dir}: not a directory")
        self.check_knobs()
