"""The Twitter load curve RAMSIS replays (§7.1): average qps per 10 s interval, one ``t_s qps`` per line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler_sidecar.errors import ConfigError


@dataclass(frozen=True)
class LoadCurve:
    start_s: np.ndarray  # [i] start of interval i, ascending
    qps: np.ndarray  # [i] average load over it

    def at(self, t_s: float) -> float:
        """The load at ``t_s`` (the interval holding it; the last one beyond the end)."""
        i = int(np.searchsorted(self.start_s, t_s, side="right")) - 1
        return float(self.qps[max(i, 0)])


def load_curve(path: Path | str) -> LoadCurve:
    path = Path(path)
    try:
        lines = [ln.split() for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such load curve") from None
    try:
        t, q = zip(*((float(a), float(b)) for a, b in lines))
    except ValueError:
        raise ConfigError(f"{path}: every line must be 't_seconds rate_qps'") from None
    start, qps = np.array(t), np.array(q)
    if np.any(np.diff(start) <= 0) or np.any(qps < 0):
        raise ConfigError(f"{path}: times must ascend and rates be >= 0")
    return LoadCurve(start, qps)
