"""The ``fleet`` bench's picture of a run (``--plot PNG``): latency percentiles over time, per
matched latency, with the phases shaded; CPU (cores) and RSS (MB) per process below.

Needs matplotlib (the ``bench`` extra); without it :func:`plot` says so in one line and returns.
Private to :mod:`scripts.bench.fleet` (the leading underscore keeps it out of scenario discovery).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from scripts.bench._fleet_analysis import Window, pct

BIN_SECONDS = 15.0


def binned(windows: list[Window], t0: float, width: float = BIN_SECONDS
           ) -> list[tuple[float, float, float, float]]:
    """``(bin middle (s since t0), p50, p99, max)`` of the latencies starting in each bin."""
    bins: dict[int, list[float]] = {}
    for _names, start, end in windows:
        bins.setdefault(int((start - t0) // width), []).append(end - start)
    return [((k + 0.5) * width, pct(v, 0.5), pct(v, 0.99), max(v))
            for k, v in sorted(bins.items())]


def rates(samples: list[tuple[float, float, float]], t0: float) -> list[tuple[float, float]]:
    """Cores used between consecutive ``(t, rss, cpu seconds)`` samples, at the later one."""
    out = []
    for (ta, _ra, ca), (tb, _rb, cb) in zip(samples, samples[1:], strict=False):
        if tb > ta:
            out.append((tb - t0, (cb - ca) / (tb - ta)))
    return out


def plot(path: Path, series: dict[str, list[Window]], procs: dict[str, list[Any]],
         phase_at: list[tuple[float, str]], title: str) -> None:
    """Write the PNG to ``path``.

    Args:
        series: latency name -> its matched windows (all phases).
        procs: process name -> ``(t, rss MB, cpu s)`` samples.
        phase_at: ``(wall time, phase)`` where each phase began.
        title: the figure's title (the run's parameters).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fleet: no plot (matplotlib not installed: pip install -e '.[bench]')",
              file=sys.stderr)
        return
    t0 = phase_at[0][0] if phase_at else 0.0
    fig, axes = plt.subplots(len(series) + 2, 1, figsize=(11, 3 * (len(series) + 2)),
                             sharex=True)
    ends = [t for t, _ in phase_at[1:]] + [max((s[-1][0] for s in procs.values() if s),
                                               default=t0)]
    for ax in axes:
        for k, ((start, name), end) in enumerate(zip(phase_at, ends, strict=False)):
            ax.axvspan(start - t0, end - t0, alpha=0.08 if k % 2 else 0.0, color="grey")
            if ax is axes[0]:
                ax.text(start - t0, 1.02, name, transform=ax.get_xaxis_transform(), fontsize=8)
    for ax, (name, windows) in zip(axes, series.items(), strict=False):
        pts = binned(windows, t0)
        if pts:
            xs = [p[0] for p in pts]
            for i, label in ((1, "p50"), (2, "p99"), (3, "max")):
                ax.plot(xs, [p[i] for p in pts], label=label, marker=".", linewidth=1)
            ax.set_yscale("log")
        ax.set_ylabel("seconds")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    cpu_ax, rss_ax = axes[-2], axes[-1]
    for name, samples in sorted(procs.items()):
        if len(samples) < 2:
            continue
        r = rates(samples, t0)
        cpu_ax.plot([x for x, _ in r], [y for _, y in r], label=name, linewidth=1)
        rss_ax.plot([s[0] - t0 for s in samples], [s[1] for s in samples], label=name,
                    linewidth=1)
    cpu_ax.set_ylabel("cores")
    cpu_ax.set_title("CPU per process", fontsize=9)
    rss_ax.set_ylabel("MB")
    rss_ax.set_title("RSS per process", fontsize=9)
    rss_ax.set_xlabel("seconds since the ramp began")
    for ax in (cpu_ax, rss_ax):
        ax.legend(fontsize=7, loc="upper left", ncol=3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
