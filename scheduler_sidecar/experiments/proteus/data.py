"""The Proteus authors' published data, as the project imported it (``profiles/proteus/``, its README).

``load_profiles`` gives one :class:`~scheduler_sidecar.core.profile.Profile` per model family (a
query type), with the device kinds ``cpu``, ``pascal`` and ``ampere``; accuracy is the paper's
normalised accuracy (§6.1.2). ``load_counts`` reads the per-second request counts of a trace and
``arrivals`` turns them into queries as §6.1.3 does.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler_sidecar.core.profile import PROFILES_DIR, Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.errors import ProfileError

DATA_DIR = PROFILES_DIR / "proteus"
PROFILE_CSV = DATA_DIR / "proteus_profiled.csv"
MEDIUM_NORMAL_LOAD = DATA_DIR / "medium-normal_load_counts.csv"
BURSTY = DATA_DIR / "zipf_exponential_bursty_counts.csv"  # Fig. 5 (§6.3)
FIG8_SLO_1X = DATA_DIR / "fig8_slo_1x.csv"  # each family's SLO at Fig. 8's multiple 1
SOURCE = "UMass-LIDS/Proteus @ 6967c932, profiling/aggregate_profiled.csv (comparison purposes only)"
# the batch sizes every variant has on every device kind (batch 16 is missing for some)
BATCH_SIZES = (1, 2, 4, 8)
# the paper's cluster (§6.1.5): 20 Xeon CPUs, 10 GTX 1080 Ti (Pascal), 10 V100 (the artifact's "ampere" rows)
PAPER_CLUSTER = {"cpu": 20, "pascal": 10, "ampere": 10}
TRACE_SLO_MS = 300.0  # every request of the medium-normal_load/300 trace carries a 300 ms SLO


def load_profiles(path: Path | str = PROFILE_CSV, *, statistic: str = "p50_ms",
                  batch_sizes: Sequence[int] = BATCH_SIZES) -> dict[str, Profile]:
    """Family -> its profile; ``statistic`` is the latency column the curves take (``p50_ms`` as the
    artifact's capacity rule, or ``mean_ms``, the paper's simulator's "average profiled latencies")."""
    if statistic not in ("p50_ms", "mean_ms"):
        raise ProfileError(f"statistic must be p50_ms or mean_ms, got {statistic!r}")
    rows: dict[str, dict[str, dict[str, dict[int, float]]]] = defaultdict(lambda: defaultdict(dict))
    accuracy: dict[str, float] = {}
    family: dict[str, str] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            v = r["variant"]
            rows[v][r["device"]].setdefault("stat", {})[int(r["batch_size"])] = float(r[statistic])
            family[v], accuracy[v] = r["family"], float(r["normalized_accuracy_pct"]) / 100
    by_family: dict[str, list[Variant]] = defaultdict(list)
    for v, devices in rows.items():
        curves = {}
        for device, stats in devices.items():
            table = stats["stat"]
            # Decision: a batch size the profile lacks (gpt2-xl on Pascal beyond batch 1) is run as that
            # many batches of one, the slowest way a worker can serve it; the artifact takes it as infinite.
            ms = tuple(table.get(b, b * table[1]) for b in batch_sizes)
            curves[device] = LatencyCurve(tuple(batch_sizes), ms, ms)  # no tail published: p99 = the statistic
        by_family[family[v]].append(Variant(v, accuracy[v], Actuation("model", v), curves))
    return {f: Profile(f"proteus-{f}", SOURCE, tuple(sorted(vs, key=lambda v: (v.accuracy, v.id))),
                       {"statistic": statistic})
            for f, vs in sorted(by_family.items())}


@dataclass(frozen=True)
class Counts:
    """Requests per second and family of a trace."""

    families: tuple[str, ...]
    per_second: np.ndarray  # (seconds, families) ints

    @property
    def total(self) -> int:
        return int(self.per_second.sum())

    def mean_mix(self) -> dict[str, float]:
        """Each family's share of all requests."""
        sums = self.per_second.sum(axis=0)
        return {f: float(s / sums.sum()) for f, s in zip(self.families, sums)}

    def scaled(self, factor: float) -> Counts:
        return Counts(self.families, np.round(self.per_second * factor).astype(np.int64))


def load_counts(path: Path | str = MEDIUM_NORMAL_LOAD) -> Counts:
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        data = np.array([[int(x) for x in row] for row in reader], dtype=np.int64)
    if header[0] != "second" or not np.array_equal(data[:, 0], np.arange(len(data))):
        raise ProfileError(f"{path}: expected a 'second' column counting from 0")
    return Counts(tuple(header[1:]), data[:, 1:])


def load_slo_1x(path: Path | str = FIG8_SLO_1X) -> dict[str, float]:
    """Family -> its SLO in ms at Fig. 8's SLO multiple 1 (the artifact's medium-normal_load/1x set)."""
    with open(path, newline="") as f:
        return {r["family"]: float(r["slo_1x_ms"]) for r in csv.DictReader(f)}


def arrivals(counts: Counts, slo_ms: float | Mapping[str, float] = TRACE_SLO_MS, *,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(arrival_us, deadline_us, family per query), in arrival order: each second's count of each family
    placed uniformly at random in that second, i.e. a Poisson process given the count (§6.1.3)."""
    rng = np.random.default_rng(seed)
    times, kinds = [], []
    for s in range(len(counts.per_second)):
        for j, n in enumerate(counts.per_second[s]):
            if n:
                times.append(rng.integers(s * 1_000_000, (s + 1) * 1_000_000, size=n))
                kinds.append(np.full(n, j))
    t = np.concatenate(times) if times else np.zeros(0, np.int64)
    k = np.concatenate(kinds) if kinds else np.zeros(0, np.int64)
    order = np.argsort(t, kind="stable")
    t, k = t[order], k[order]
    slo = {f: slo_ms if isinstance(slo_ms, (int, float)) else slo_ms[f] for f in counts.families}
    slo_us = np.array([round(slo[f] * 1000) for f in counts.families], dtype=np.int64)
    return t, t + slo_us[k], [counts.families[i] for i in k]
