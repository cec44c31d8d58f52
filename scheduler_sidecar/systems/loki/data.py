"""Pipelines for Loki: the authors' traffic-analysis and social-media pipelines, as the project imported them
(``profiles/loki/``, its README), and a pipeline trained and measured here (:mod:`export.loki_models`, its
``loki.json``).

Traffic analysis: detector (YOLOv5 n/s/m/l/x) -> {car classifier (EfficientNet b0-b6), face recogniser (VGG
"genderNet")}, the tree of §6.1 (Fig. 2). Latency is the artifact's simulator profile (p50 per batch size 1-64;
its three device labels are byte-identical, so the cluster is one kind); fan-out is the artifact's objects per
frame times the share of them per branch. ``serial`` is Fig. 1's two-task version (detector -> car classifier),
where every detection goes to the classifier (the artifact's MILP multiplies objects per frame by the car share;
§4.2).

Social media (Fig. 6): the artifact's app, source -> {detector (YOLOv5), captioner (CLIP-ViT)}, every image to
both. Decision (digest A19): the paper's text names a ResNet classifier, the artifact has none; we run the
artifact's graph, since its profile is the only one published. Its ``source`` is a task of its own with a
0.001 ms variant, as in the artifact, so it takes a worker of the cluster there too; the sink after both does
nothing and is left out.
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
SOCIAL_MEDIA_CSV = DATA_DIR / "social_media_profile.csv"
SOURCE = "UMass-LIDS/Loki @ e6bb80cc, simulator profile and branching (comparison purposes only)"
SLO_MS = 250.0  # §6.2, the traffic-analysis SLO
SOCIAL_MEDIA_SLO_MS = 250.0  # not stated in the paper (digest A8 of Loki's): the artifact's app uses 250 ms
DETECTOR, CARS, FACES = "object_detection", "car_classification", "facial_recognition"
SOURCE_TASK, CAPTIONS = "source", "image_captioning"


def traffic_analysis(*, serial: bool = False, statistic: str = "p50_ms", path: Path = PROFILE_CSV,
                     branching: Path = BRANCHING_CSV) -> Pipeline:
    with open(branching, newline="") as fh:
        split = {r["detector"]: (float(r["objects_per_frame"]), float(r[CARS]), float(r[FACES]))
                 for r in csv.DictReader(fh)}
    children = (CARS,) if serial else (CARS, FACES)

    def fanout(v: str) -> dict[str, float]:
        if v not in split:
            return {}
        objects, cars, faces = split[v]
        return {CARS: objects * cars} if serial else {CARS: objects * cars, FACES: objects * faces}

    task = _profiled(path, statistic, fanout)
    tasks = [task(DETECTOR, children)] + [task(c, ()) for c in children]
    return Pipeline("traffic-analysis" + ("-serial" if serial else ""), tuple(tasks), SLO_MS, SOURCE)


def social_media(*, statistic: str = "p50_ms", path: Path = SOCIAL_MEDIA_CSV) -> Pipeline:
    children = (DETECTOR, CAPTIONS)
    task = _profiled(path, statistic, lambda v: dict.fromkeys(children, 1.0) if v == SOURCE_TASK else {})
    tasks = [task(SOURCE_TASK, children)] + [task(c, ()) for c in children]
    return Pipeline("social-media", tuple(tasks), SOCIAL_MEDIA_SLO_MS, SOURCE)


def _profiled(path: Path, statistic: str, fanout):
    """A function building a task of the profile at ``path`` (task, variant, accuracy, batch size, latencies) by
    name and children, each variant's fan-out ``fanout(variant)``."""
    if statistic not in ("p50_ms", "p90_ms", "mean_ms"):
        raise ProfileError(f"statistic must be p50_ms, p90_ms or mean_ms, got {statistic!r}")
    rows: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    accuracy: dict[str, float] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            rows[r["task"]][r["variant"]].append((int(r["batch_size"]), float(r[statistic])))
            accuracy[r["variant"]] = float(r["normalized_accuracy_pct"]) / 100

    def task(name: str, kids: tuple[str, ...]) -> Task:
        variants = []
        for v, points in rows[name].items():
            points.sort()
            ms = tuple(p for _, p in points)
            variants.append(StageVariant(v, accuracy[v], LatencyCurve(tuple(b for b, _ in points), ms, ms),
                                         fanout(v)))
        return Task(name, tuple(sorted(variants, key=lambda v: (-v.accuracy, v.id))), kids)

    return task


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
        raise ProfileError(f"pipeline {name_or_path!r}: no such file. A pipeline is traffic-analysis (the authors' "
                           "profile) or a trained pipeline's loki.json: `accscale demo loki` trains one into "
                           "build/loki-demo")
    return trained(path)
