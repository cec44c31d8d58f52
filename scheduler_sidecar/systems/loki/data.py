"""The Loki authors' traffic-analysis pipeline, as the project imported it (``profiles/loki/``, its README).

Detector (YOLOv5 n/s/m/l/x) -> {car classifier (EfficientNet b0-b6), face recogniser (VGG "genderNet")}, the
tree of §6.1 (Fig. 2). Latency is the artifact's simulator profile (p50 per batch size 1-64; its three device
labels are byte-identical, so the cluster is one kind); fan-out is the artifact's objects per frame times the
share of them per branch. ``serial`` is Fig. 1's two-task version (detector -> car classifier), where every
detection goes to the classifier (the artifact's MILP multiplies objects per frame by the car share; §4.2).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from scheduler_sidecar.core.profile import PROFILES_DIR, LatencyCurve
from scheduler_sidecar.systems.loki.pipeline import Pipeline, StageVariant, Task

DATA_DIR = PROFILES_DIR / "loki"
PROFILE_CSV = DATA_DIR / "traffic_analysis_profile.csv"
BRANCHING_CSV = DATA_DIR / "traffic_analysis_branching.csv"
SOURCE = "UMass-LIDS/Loki @ e6bb80cc, simulator profile and branching (comparison purposes only)"
SLO_MS = 250.0  # §6.2, the traffic-analysis SLO
DETECTOR, CARS, FACES = "object_detection", "car_classification", "facial_recognition"


def traffic_analysis(*, serial: bool = False, statistic: str = "p50_ms", path: Path = PROFILE_CSV,
                     branching: Path = BRANCHING_CSV) -> Pipeline:
    if statistic not in ("p50_ms", "p90_ms", "mean_ms"):
        raise ValueError(f"statistic must be p50_ms, p90_ms or mean_ms, got {statistic!r}")
    rows: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    accuracy: dict[str, float] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            rows[r["task"]][r["variant"]].append((int(r["batch_size"]), float(r[statistic])))
            accuracy[r["variant"]] = float(r["normalized_accuracy_pct"]) / 100
    with open(branching, newline="") as fh:
        split = {r["detector"]: (float(r["objects_per_frame"]), float(r[CARS]), float(r[FACES]))
                 for r in csv.DictReader(fh)}
    children = (CARS,) if serial else (CARS, FACES)

    def fanout(v: str) -> dict[str, float]:
        if v not in split:
            return {}
        objects, cars, faces = split[v]
        return {CARS: objects * cars} if serial else {CARS: objects * cars, FACES: objects * faces}

    def task(name: str, kids: tuple[str, ...]) -> Task:
        variants = []
        for v, points in rows[name].items():
            points.sort()
            ms = tuple(p for _, p in points)
            variants.append(StageVariant(v, accuracy[v], LatencyCurve(tuple(b for b, _ in points), ms, ms),
                                         fanout(v)))
        return Task(name, tuple(sorted(variants, key=lambda v: (-v.accuracy, v.id))), kids)

    tasks = [task(DETECTOR, children)] + [task(c, ()) for c in children]
    return Pipeline("traffic-analysis" + ("-serial" if serial else ""), tuple(tasks), SLO_MS, SOURCE)
