"""RAMSIS's inputs: l_w(m, b) for every batch size 1..N_w and Accuracy(m) (§3.1.1, §4.3.3).

A :class:`ModelTable` is read from either source the generator accepts:

- the authors' summary CSV (``ramsis_cpu_latency_summary.csv``, or the trimmed copy in
  ``profiles/ramsis/``), columns ``profile_set,model,batch_size,...,p95_ms,...,accuracy_pct``;
- a project profile (``scheduler_sidecar/core/profile.py``), whose curves hold p50 and p99.

# Ambiguity (digest A7): which latency statistic. Chosen: p95 for the authors' CSV (the
# paper's, §7.3.1) and p99 for project profiles (their only tail percentile); both can be
# overridden (``stat``), because the paper only asks for a predictable tail.
# Ambiguity (digest A7): batch sizes that were not profiled. Chosen: a size between profiled
# ones costs the next profiled size up (the project's drivers run it padded, LatencyCurve.p50_at);
# sizes beyond the largest profiled one follow a least-squares line over all profiled sizes, and
# then latency is made non-decreasing in b by a backward running minimum, as the artifact does
# (it reproduces the digest's Z.3 rows, e.g. efficientnet_b4 at b=32: 3221.6 ms).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant, pareto_front
from scheduler_sidecar.errors import ProfileError

MAX_QUEUE = 32  # N_w (§4.2.3, §6): the paper's maximum modelled worker-queue length
CSV_COLUMNS = ("profile_set", "model", "batch_size", "accuracy_pct")
CSV_STATS = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms")


@dataclass(frozen=True)
class ModelTable:
    """Models with accuracy and a latency for every batch size 1..max_batch (ascending latency at b=1)."""

    name: str  # profile name, written into every policy file
    model_ids: tuple[str, ...]
    accuracy: np.ndarray  # [m] top-1 as a fraction in [0, 1]
    latency_ms: np.ndarray  # [m, b-1] tail latency of a batch of b, non-decreasing in b
    stat: str  # which statistic latency_ms holds, e.g. "p95_ms"

    @property
    def max_batch(self) -> int:
        return self.latency_ms.shape[1]

    def latency(self, model: int, batch: int) -> float:
        return float(self.latency_ms[model, batch - 1])

    def subset(self, indices: list[int] | tuple[int, ...]) -> ModelTable:
        idx = list(indices)
        return ModelTable(self.name, tuple(self.model_ids[i] for i in idx), self.accuracy[idx],
                          self.latency_ms[idx], self.stat)

    def pareto(self) -> ModelTable:
        """Only the models on the accuracy-latency Pareto front at batch 1 (§4.3.3, Fig. 3).

        # Ambiguity (digest §2.3): the paper prunes on Fig. 3's axes, batch-1 p95 latency
        # against accuracy. Chosen: the same; it keeps the artifact's 9 image models.
        """
        front = pareto_front([(float(lat), float(acc)) for lat, acc in zip(self.latency_ms[:, 0], self.accuracy)])
        return self.subset(front)

    def select(self, model_ids: list[str]) -> ModelTable:
        missing = [m for m in model_ids if m not in self.model_ids]
        if missing:
            raise ProfileError(f"{self.name}: no model {missing}; it has {list(self.model_ids)}")
        return self.subset([self.model_ids.index(m) for m in model_ids])


def fill_batches(sizes: list[int], values: list[float], max_batch: int) -> np.ndarray:
    """Latency for b = 1..max_batch from profiled (size, latency) points (see the module note)."""
    order = np.argsort(sizes)
    b = np.asarray(sizes, dtype=float)[order]
    lat = np.asarray(values, dtype=float)[order]
    out = np.empty(max_batch)
    line = np.polyfit(b, lat, 1) if len(b) > 1 else np.array([lat[0] / b[0], 0.0])
    for k in range(1, max_batch + 1):
        i = int(np.searchsorted(b, k))
        out[k - 1] = lat[i] if i < len(b) else np.polyval(line, k)
    return np.minimum.accumulate(out[::-1])[::-1]


def _table(name: str, points: dict[str, tuple[float, list[int], list[float]]], stat: str,
           max_batch: int) -> ModelTable:
    if not points:
        raise ProfileError(f"{name}: no models")
    curves = {m: fill_batches(sizes, values, max_batch) for m, (_, sizes, values) in points.items()}
    ids = sorted(points, key=lambda m: (curves[m][0], m))
    acc = np.array([points[m][0] for m in ids])
    lat = np.stack([curves[m] for m in ids])
    return ModelTable(name, tuple(ids), acc, lat, stat)


def load_summary_csv(path: Path | str, profile_set: str | None = None, stat: str = "p95_ms",
                     max_batch: int = MAX_QUEUE) -> ModelTable:
    """The authors' summary CSV (one row per model and batch size); accuracy_pct becomes a fraction."""
    path = Path(path)
    if stat not in CSV_STATS:
        raise ProfileError(f"{path}: latency statistic {stat!r} is not one of {CSV_STATS}")
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            rows = list(reader)
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such file") from None
    need = [c for c in (*CSV_COLUMNS, stat) if c not in header]
    if need:
        raise ProfileError(f"{path}: missing column(s) {need}; a RAMSIS summary CSV has {[*CSV_COLUMNS, stat]}")
    sets = sorted({r["profile_set"] for r in rows})
    if profile_set is None:
        if len(sets) != 1:
            raise ProfileError(f"{path}: holds profile sets {sets}; choose one (--profile-set)")
        profile_set = sets[0]
    elif profile_set not in sets:
        raise ProfileError(f"{path}: no profile_set {profile_set!r}; it has {sets}")
    points: dict[str, tuple[float, list[int], list[float]]] = {}
    for line, r in enumerate(rows, start=2):
        if r["profile_set"] != profile_set:
            continue
        try:
            b, lat, acc = int(r["batch_size"]), float(r[stat]), float(r["accuracy_pct"]) / 100.0
        except (TypeError, ValueError):
            raise ProfileError(f"{path}: line {line}: batch_size, {stat} or accuracy_pct is not a number") from None
        if b < 1 or not math.isfinite(lat) or lat <= 0 or not 0.0 <= acc <= 1.0:
            raise ProfileError(f"{path}: line {line}: batch_size must be >= 1, {stat} > 0 and accuracy_pct in [0, 100]")
        entry = points.setdefault(r["model"], (acc, [], []))
        if entry[0] != acc:
            raise ProfileError(f"{path}: line {line}: model {r['model']} has two accuracies")
        entry[1].append(b)
        entry[2].append(lat)
    return _table(f"{path.stem}:{profile_set}", points, stat, max_batch)


def from_profile(profile: Profile, device: str | None = None, stat: str = "p99_ms",
                 max_batch: int = MAX_QUEUE) -> ModelTable:
    """A project profile's variants on one device kind; ``stat`` is "p50_ms" or "p99_ms"."""
    device = device or profile.device_kinds[0]
    if device not in profile.device_kinds:
        raise ProfileError(f"profile {profile.name!r} has no device {device!r}; it has {list(profile.device_kinds)}")
    if stat not in ("p50_ms", "p99_ms"):
        raise ProfileError(f"profile {profile.name!r}: latency statistic {stat!r} is not p50_ms or p99_ms")
    points = {}
    for v in profile.variants:
        curve = v.latency[device]
        points[v.id] = (v.accuracy, list(curve.batch_sizes), list(getattr(curve, stat)))
    return _table(profile.name, points, stat, max_batch)


def load_table(path: Path | str, *, profile_set: str | None = None, device: str | None = None,
               stat: str | None = None, max_batch: int = MAX_QUEUE) -> ModelTable:
    """A RAMSIS summary CSV (by extension) or a project profile JSON."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return load_summary_csv(path, profile_set, stat or "p95_ms", max_batch)
    return from_profile(Profile.load(path), device, stat or "p99_ms", max_batch)


def to_profile(table: ModelTable, device: str = "cpu", source: str = "") -> Profile:
    """The table as a project profile (batch sizes 1..max_batch), so the simulator and sidecar can run it.

    # Ambiguity (digest A7): the authors publish p95 per batch size; a project profile holds
    # p50 and p99, and the simulator runs p50 (or lognormal noise up to p99). Chosen: both
    # fields hold the table's statistic (p95 for the authors' CSV), so the simulator runs the
    # deterministic p95, exactly what the paper's simulator does (§7.3.1, "latency is
    # deterministically the 95th percentile"), and the RAMSIS policy's MDP, which reads
    # either field, sees the same p95. --latency-noise tail then adds no noise (p99 = p50).
    """
    variants = tuple(
        Variant(m, float(table.accuracy[i]), Actuation("model", m),
                {device: LatencyCurve(tuple(range(1, table.max_batch + 1)), tuple(map(float, table.latency_ms[i])),
                                      tuple(map(float, table.latency_ms[i])))})
        for i, m in enumerate(table.model_ids))
    ordered = tuple(sorted(variants, key=lambda v: (v.accuracy, v.id)))
    return Profile(table.name, source or f"RAMSIS artifact summary ({table.stat}), dmmendo/RAMSIS @ 9b74967f",
                   ordered, {"latency_stat": table.stat, "p50_ms and p99_ms": f"both hold {table.stat}"})
