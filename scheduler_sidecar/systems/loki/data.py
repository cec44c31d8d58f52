"""Pipelines for Loki: the authors' traffic-analysis pipeline, as the project imported it (``profiles/loki/``, its
README), and a pipeline trained and measured here (:mod:`export.loki_models`, its ``loki.json``).

Detector (YOLOv5 n/s/m/l/x) -> {car classifier (EfficientNet b0-b6), face recogniser (VGG "genderNet")}, the
tree of §6.1 (Fig. 2). Latency is the artifact's simulator profile (p50 per batch size 1-64; its three device
labels are byte-identical, so the cluster is one kind); fan-out is the artifact's objects per frame times the
share of them per branch. ``serial`` is Fig. 1's two-task version (detector -> car classifier), where every
detection goes to the classifier (the artifact's MILP multiplies objects per frame by the car share; §4.2).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from scheduler_sidecar.core.profile import PROFILES_DIR, LatencyCurve
from scheduler_sidecar.errors import ProfileError
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
        raise ProfileError(f"statistic must be p50_ms, p90_ms or mean_ms, got {statistic!r}")
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


def trained(path: Path) -> Pipeline:
    """A pipeline built by ``export.loki_models``: its measured accuracies, path accuracies, fan-outs, latencies."""
    data = json.loads(Path(path).read_text())
    tasks = []
    for name, children in data["tasks"].items():
        variants = []
        for model, task in data["task_of"].items():
            if task != name:
                continue
            lat = data["latency_ms"][model]
            variants.append(StageVariant(model, data["accuracy"][model], LatencyCurve(
                tuple(lat["batch_sizes"]), tuple(lat["p50_ms"]), tuple(lat["p99_ms"])), data["fanout"].get(model, {})))
        tasks.append(Task(name, tuple(sorted(variants, key=lambda v: (-v.accuracy, v.id))), tuple(children)))
    paths = {tuple(k.split("|")): v for k, v in data["path_accuracy"].items()}
    return Pipeline(f"trained ({Path(path).parent.name})", tuple(tasks), float(data["slo_ms"]),
                    f"export/loki_models.py, measured on this machine ({path})", paths)


def load_pipeline(name_or_path: str) -> Pipeline:
    """``traffic-analysis`` (its ``-serial`` form), or the path of a trained pipeline's ``loki.json``."""
    if name_or_path in ("traffic-analysis", "traffic-analysis-serial"):
        return traffic_analysis(serial=name_or_path.endswith("serial"))
    path = Path(name_or_path)
    if not path.is_file():
        raise ProfileError(f"--pipeline: {name_or_path!r} is neither traffic-analysis nor a pipeline's loki.json")
    return trained(path)
