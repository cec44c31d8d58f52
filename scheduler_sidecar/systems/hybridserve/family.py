"""A model family built and measured here (:mod:`export.cascade_models`), as the cascade code reads it: its
models small to large, their temperatures, latency and cost per request, and their cached predictions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from python_backend.runners import MODEL_FILE
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant
from scheduler_sidecar.systems.hybridserve.cascade import Predictions

DEVICE = "cpu"
RUNTIME_MB = 60.0  # an instance's memory beyond its ONNX file: the runtime and its buffers


@dataclass(frozen=True)
class FamilyModel:
    name: str
    temperature: float
    cost_s: float  # worker-seconds per request at a full batch (e_i)
    latency: LatencyCurve
    accuracy: dict  # split -> {"all": ..., per difficulty}


@dataclass(frozen=True)
class Family:
    models: tuple[FamilyModel, ...]  # small to large
    folder: Path
    cost_batch: int  # the batch size a model's cost per request is measured at

    @classmethod
    def load(cls, stamp: Path) -> Family:
        """The family whose ``cascade.json`` is ``stamp``."""
        raw = json.loads(Path(stamp).read_text())
        models = tuple(FamilyModel(name, m["temperature"], m["cost_s"],
                                   LatencyCurve(tuple(m["latency"]["batch_sizes"]), tuple(m["latency"]["p50_ms"]),
                                                tuple(m["latency"]["p99_ms"])), m["accuracy"])
                       for name, m in raw["models"].items())
        return cls(models, Path(stamp).parent, raw["cost_batch"])

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    @property
    def costs(self) -> np.ndarray:
        return np.array([m.cost_s for m in self.models])

    @cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        """predictions.npz, read once."""
        with np.load(self.folder / "predictions.npz") as z:
            return dict(z)

    def predictions(self, split: str) -> Predictions:
        """Every model's calibrated predictions on ``split`` (calibration, search or test)."""
        z = self._arrays
        return Predictions.from_logits([z[f"{split}_logits_{n}"] for n in self.names],
                                       [m.temperature for m in self.models], z[f"{split}_labels"])

    def images(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(images [N, 1, 16, 16], labels) of the search or test split."""
        z = self._arrays
        return z[f"{split}_images"], z[f"{split}_labels"]

    def memory_mb(self, name: str) -> float:
        """The memory an instance of model ``name`` holds (the placement program's ω): its ONNX file and RUNTIME_MB."""
        return RUNTIME_MB + (self.folder / "repository" / name / "1" / MODEL_FILE).stat().st_size / 2**20

    def difficulty(self, split: str) -> np.ndarray:
        return self._arrays[f"{split}_difficulty"]

    def profile(self, name: str, slowdown: float = 1.0) -> Profile:
        """The engine's profile of one model (a query type of its own in a cascade), its latency times
        ``slowdown`` (an emulated slower device, as the live demo runs it)."""
        m = next(m for m in self.models if m.name == name)
        return Profile(name, "export.cascade_models, measured here with onnxruntime (one thread)",
                       (Variant(name, m.accuracy["test"]["all"], Actuation("model", name),
                                {DEVICE: m.latency.scaled(slowdown)}),))
