"""Plots the reproductions share: line panels against a swept setting, timelines of each system over a trace, and
pyplot set up for files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display here or in CI)."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    return plt


def line_panels(path: Path, rows: Sequence[dict], x: str, panels: Sequence[tuple[str, str]], *, xlabel: str,
                title: str, series: str | None = None) -> None:
    """A panel per ``(key, label)`` of ``panels``: ``key`` against ``x``, a line per value of ``series`` (one line
    when None), the legend on the first panel."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False)
    names = list(dict.fromkeys(r[series] for r in rows)) if series else [None]
    for name in names:
        mine = [r for r in rows if series is None or r[series] == name]
        for ax, (key, _) in zip(axes[0], panels):
            ax.plot([r[x] for r in mine], [r[key] for r in mine], marker="o", label=name)
    for ax, (_, label) in zip(axes[0], panels):
        ax.set(xlabel=xlabel, ylabel=label)
        ax.grid(alpha=0.3)
    if series:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timelines(path: Path, series: Mapping[str, Mapping[str, Sequence[float]]], window_s: float,
              panels: Sequence[tuple[str, str]], demand: tuple[Sequence[float], Sequence[float], str], *, title: str,
              spans: Sequence[tuple[float, float]] = ()) -> None:
    """The demand ``(x, y, label)`` on top, then a panel per ``(key, label)`` of ``panels`` with a line per system of
    ``series`` (its ``key`` per window of ``window_s``); ``spans`` (e.g. bursts) shaded on every panel."""
    plt = pyplot()
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(9, 2.2 * (len(panels) + 1) + 0.4), sharex=True)
    x, y, label = demand
    axes[0].plot(x, y, "k-", lw=0.8)
    axes[0].set(ylabel=label, title=title)
    for ax, (key, ylabel) in zip(axes[1:], panels):
        for name, s in series.items():
            ax.plot([i * window_s for i in range(len(s[key]))], s[key], label=name)
        ax.set(ylabel=ylabel)
    for first, end in spans:
        for ax in axes:
            ax.axvspan(first, end, color="0.9", zorder=0)
    axes[1].legend(fontsize=7)
    axes[-1].set(xlabel="time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
