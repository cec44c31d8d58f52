"""The Loki demo pipeline, trained here: a detector with three variants, then a digit classifier (three widths)
and a shape classifier (two variants), a tree like the paper's detector -> {cars, faces}.

Detectors (LOGITS [3, 16, 16], :mod:`python_backend.pipeline`): ``cc``, threshold and connected components
(no training; touching objects merge, faint ones vanish); ``fcn_s`` and ``fcn_l``, fully convolutional nets
(8-16 and 32-64 channels) trained on the heatmap of object centres. Classifiers take 16x16 crops. All trained
on scenes from :mod:`export.scenes` (training digits), measured on held-out scenes (held-out digits):

- a detector's accuracy is the share of objects it finds with the right kind (within one cell), its fan-out
  the detections per frame of each kind, so a weaker detector creates fewer crops;
- a classifier's accuracy is on crops around the true centres;
- a path's accuracy Â(p) (the paper's profiled end-to-end accuracy, §2.1) is the share of the objects of its
  branch's kind that are found and labelled correctly, so a detector that finds fewer pays for it.

Every variant is its own Triton model, profiled with onnxruntime (one thread) at batch sizes 1-32. Built once
into ``folder``; ``loki.json`` there is the pipeline (:class:`~scheduler_sidecar.systems.loki.pipeline.Pipeline`)
and records the recipe, and a changed recipe rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export import repository, small_nets
from export.cache import exclusive
from export.profiler import percentile, time_rounds
from export.scenes import DIGIT, SHAPE, Scenes, generate, heatmap_targets
from export.small_nets import cnn, to_onnx
from python_backend.emulation import write_latency
from python_backend.pipeline import components, crops, decode
from python_backend.runners import MODEL_FILE, make_session

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DETECTORS = {"fcn_l": (32, 64), "fcn_s": (8, 16), "cc": None}  # most accurate first
DIGIT_WIDTHS = {"w16": (16, 32), "w8": (8, 16), "w4": (4, 8)}
SHAPE_MODELS = {"cnn": (4, 8), "linear": None}
SLO_MS = 200.0
MATCH_PX = 4  # a detection finds an object of its kind whose centre is within this many pixels (one cell)


@dataclass(frozen=True)
class Recipe:
    train_scenes: int = 3000
    heldout_scenes: int = 600
    detector_epochs: int = 12
    classifier_epochs: int = 8
    repeats: int = 20  # timed rounds per batch size

    def key(self) -> str:
        return hashlib.sha256(json.dumps({**self.__dict__, "version": 2}, sort_keys=True).encode()).hexdigest()


# small: a build in seconds rather than minutes, a few points less accurate (tests, a first look)
RECIPES = {"full": Recipe(),
           "small": Recipe(train_scenes=400, heldout_scenes=120, detector_epochs=3, classifier_epochs=2)}


# ---------------------------------------------------------------------- networks
def _detector(channels: tuple[int, int]):
    import torch.nn as nn  # lazy: torch

    a, b = channels
    return nn.Sequential(nn.Conv2d(1, a, 3, 2, 1), nn.ReLU(), nn.Conv2d(a, b, 3, 2, 1), nn.ReLU(),
                         nn.Conv2d(b, b, 3, 1, 1), nn.ReLU(), nn.Conv2d(b, 3, 1))


# ---------------------------------------------------------------------- data
def _object_crops(scenes: Scenes, kind: int, seed: int, jitter: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Crops around the objects of ``kind`` (centres jittered by up to ``jitter`` px, as a detector's cell is)."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for frame, objs in zip(scenes.frames, scenes.objects):
        mine = objs[objs[:, 2] == kind]
        if len(mine):
            centres = mine[:, :2] + rng.integers(-jitter, jitter + 1, size=(len(mine), 2))
            xs.append(crops(frame, centres))
            ys.append(mine[:, 3])
    return np.concatenate(xs), np.concatenate(ys)


def match(detections: np.ndarray, objects: np.ndarray) -> np.ndarray:
    """For each object, the index of the detection of its kind that finds it (greedy, nearest first), or -1."""
    found = np.full(len(objects), -1)
    taken: set[int] = set()
    for o, (r, c, kind, _) in enumerate(objects):
        best, dist = -1, MATCH_PX + 1
        for d, (dr, dc, dk) in enumerate(detections):
            gap = max(abs(int(dr) - int(r)), abs(int(dc) - int(c)))
            if dk == kind and d not in taken and gap < dist:
                best, dist = d, gap
        if best >= 0:
            found[o] = best
            taken.add(best)
    return found


# ---------------------------------------------------------------------- build
def build(folder: Path, recipe: Recipe = Recipe()) -> Path:
    """Train, export, measure and profile the pipeline into ``folder`` unless it is up to date; its ``loki.json``."""
    stamp = folder / "loki.json"
    with exclusive(folder):
        if not (stamp.exists() and json.loads(stamp.read_text()).get("recipe_key") == recipe.key()):
            _build(folder, recipe, stamp)
    return stamp


def copy_stage_models(folder: Path, repository: Path) -> list[str]:
    """Copy the stage models that :func:`build` trained into ``folder`` to another ``repository``, where a deployment
    writes a BLS model of its own beside them (two Tritons cannot share one BLS model's folder): their names."""
    names = sorted(json.loads((folder / "loki.json").read_text())["task_of"])
    for name in names:
        # not the bytecode a Triton serving the cache writes there meanwhile (a file may vanish mid-copy)
        shutil.copytree(folder / "repository" / name, repository / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return names


def _build(folder: Path, recipe: Recipe, stamp: Path) -> None:
    repo = folder / "repository"
    log.info("building the Loki pipeline's models into %s", folder)
    train, heldout = generate(recipe.train_scenes, "train", 1), generate(recipe.heldout_scenes, "heldout", 2)
    models: dict[str, dict] = {}
    detections: dict[str, list[np.ndarray]] = {}
    for name, channels in DETECTORS.items():
        model = f"loki_detect_{name}"
        if channels is None:
            model_dir = repository.write_model(repo, model, None, [1, 64, 64], [3, 16, 16], {"runner": "components"})
        else:
            net = small_nets.train(_detector(channels), train.frames, heatmap_targets(train), recipe.detector_epochs,
                         weight=[0.05, 1.0, 1.0])
            model_dir = repository.write_model(repo, model, to_onnx(net, (1, 64, 64), (3, 16, 16), model), [1, 64, 64],
                                               [3, 16, 16], {"runner": "static", "intra_op_threads": "1"})
        detections[name] = detect(model_dir, heldout.frames)
        models[model] = {"task": "detect", "dir": model_dir, "input": (1, 64, 64)}
    for task, kind, variants, classes in (("digits", DIGIT, DIGIT_WIDTHS, 10), ("shapes", SHAPE, SHAPE_MODELS, 2)):
        x, y = _object_crops(train, kind, seed=3)
        xh, yh = _object_crops(heldout, kind, seed=4, jitter=0)
        for name, channels in variants.items():
            model = f"loki_{task}_{name}"
            net = small_nets.train(cnn(channels, classes), x, y, recipe.classifier_epochs)
            model_dir = repository.write_model(repo, model, to_onnx(net, (1, 16, 16), (classes,), model), [1, 16, 16], [classes],
                                               {"runner": "static", "intra_op_threads": "1"})
            session = make_session(model_dir / "1" / MODEL_FILE, 1)
            accuracy = float((session.run(["LOGITS"], {"INPUT": xh})[0].argmax(axis=1) == yh).mean())
            models[model] = {"task": task, "dir": model_dir, "input": (1, 16, 16), "accuracy": accuracy,
                             "session": session}
    pipeline = _measure(heldout, detections, models)
    for m in models.values():
        m["latency"] = _profile(m, recipe.repeats)
    stamp.write_text(json.dumps({
        "recipe_key": recipe.key(), "recipe": recipe.__dict__, "slo_ms": SLO_MS,
        "tasks": {"detect": ["digits", "shapes"], "digits": [], "shapes": []},
        "task_of": {k: m["task"] for k, m in models.items()}, **pipeline,
        "latency_ms": {k: m["latency"] for k, m in models.items()}}, indent=1))


def _measure(heldout: Scenes, detections: dict[str, list[np.ndarray]], models: dict[str, dict]) -> dict:
    """Accuracy per variant and per path, and each detector's fan-out, on the held-out scenes."""
    accuracy, fanout, paths = {}, {}, {}
    totals = {kind: sum(int((o[:, 2] == kind).sum()) for o in heldout.objects) for kind in (DIGIT, SHAPE)}
    for name, dets in detections.items():
        det_model = f"loki_detect_{name}"
        matches = [match(d, o) for d, o in zip(dets, heldout.objects)]
        found = sum(int((m >= 0).sum()) for m in matches)
        accuracy[det_model] = found / max(1, sum(totals.values()))
        fanout[det_model] = {task: float(np.mean([(d[:, 2] == kind).sum() for d in dets]))
                             for task, kind in (("digits", DIGIT), ("shapes", SHAPE))}
        for model, m in models.items():
            if m["task"] == "detect":
                continue
            kind = DIGIT if m["task"] == "digits" else SHAPE
            right = 0
            for frame, d, o, hit in zip(heldout.frames, dets, heldout.objects, matches):
                mine = (o[:, 2] == kind) & (hit >= 0)
                if mine.any():
                    labels = m["session"].run(["LOGITS"], {"INPUT": crops(frame, d[hit[mine], :2])})[0].argmax(axis=1)
                    right += int((labels == o[mine, 3]).sum())
            paths[f"{det_model}|{model}"] = right / max(1, totals[kind])
    for model, m in models.items():
        if "accuracy" in m:
            accuracy[model] = m["accuracy"]
    return {"accuracy": accuracy, "fanout": fanout, "path_accuracy": paths,
            "objects_per_frame": {t: totals[k] / len(heldout) for t, k in (("digits", DIGIT), ("shapes", SHAPE))}}


def detect(model_dir: Path, frames: np.ndarray) -> list[np.ndarray]:
    """What the detector model in ``model_dir`` finds in each of ``frames``, decoded as the pipeline's BLS model
    decodes it: its ONNX graph on onnxruntime, or the classical detector (a model without a graph)."""
    graph = model_dir / "1" / MODEL_FILE
    heat = make_session(graph, 1).run(["LOGITS"], {"INPUT": frames})[0] if graph.exists() else components(frames)
    return [decode(h) for h in heat]


def frame_fanout(stamp: Path, frames: np.ndarray) -> dict[str, list[dict[str, int]]]:
    """Per detector of the pipeline built at ``stamp``, each frame's own fan-out: the digits and shapes it finds in
    it, the crops the BLS sends on (the simulator's ``Setup.frame_fanout``)."""
    data = json.loads(Path(stamp).read_text())
    repo = Path(stamp).parent / "repository"
    return {model: [{"digits": int((d[:, 2] == DIGIT).sum()), "shapes": int((d[:, 2] == SHAPE).sum())}
                    for d in detect(repo / model, frames)]
            for model, task in data["task_of"].items() if task == "detect"}


def _profile(m: dict, repeats: int) -> dict[str, list[float]]:
    """p50 and p99 per batch size of BATCH_SIZES: onnxruntime (one thread), or the classical detector in numpy."""
    if m.get("session") is None and (m["dir"] / "1" / MODEL_FILE).exists():
        m["session"] = make_session(m["dir"] / "1" / MODEL_FILE, 1)
    session = m.get("session")
    inputs = [np.random.default_rng(b).normal(0, 0.3, (b, *m["input"])).astype(np.float32) for b in BATCH_SIZES]
    calls = [(lambda x=x: session.run(["LOGITS"], {"INPUT": x})) if session is not None else
             (lambda x=x: components(x)) for x in inputs]
    samples = time_rounds(calls, repeats)
    p50 = [percentile(s, 50) for s in samples]
    write_latency(m["dir"] / "1", list(BATCH_SIZES), p50)
    return {"batch_sizes": list(BATCH_SIZES), "p50_ms": p50, "p99_ms": [percentile(s, 99) for s in samples]}
