"""The two SubNetAct families behind one interface: what `accscale profile`, `bench subnetact` and `demo` need.

``cnn`` is the digits ResNet supernet (:mod:`export.artifacts`), ``transformer`` the movie-review encoder
(:mod:`export.text_artifacts`); each builds (or reuses) its cached weights, calibration and Pareto profile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export import data, profiler, text_artifacts, transformer
from export.artifacts import Artifacts
from export.presets import FAMILIES, PROFILE_REPEATS, get_preset
from export.profiler import Calibration, Candidate
from scheduler_sidecar.core.profile import Profile


@dataclass(frozen=True)
class BuiltSupernet:
    family: str
    model_name: str  # the supernet's Triton model
    logical_name: str  # what clients call it through the sidecar
    profile: Profile | None  # None: built without profiling (every searched subnet is "pareto")
    profile_path: Path
    calibration: Calibration  # every searched subnet
    pareto: list[Candidate]  # the profile's subnets, in its order
    samples: np.ndarray  # held-out inputs (images or token ids) and their labels
    labels: np.ndarray
    export_supernet: Callable[..., Path]  # (candidates, repository, **config) -> model folder
    export_static: Callable[..., Path]  # (candidate, repository, **config) -> model folder

    def chosen(self, spread: int) -> list[Candidate]:
        """``spread`` Pareto subnets uniformly spaced in accuracy (without a profile: spaced in accuracy rank)."""
        if self.profile is None:
            ranked = sorted(self.pareto, key=lambda c: c.accuracy)
            k = min(spread, len(ranked))
            return [ranked[round(i * (len(ranked) - 1) / max(1, k - 1))] for i in range(k)]
        return self.calibration.select([v.id for v in self.profile.spread(spread)])


def build(family: str, preset: str, build_dir: Path, *, mode: str = "triton", repeats: int = PROFILE_REPEATS,
          rebuild: bool = False, out: Path | None = None, profiled: bool = True) -> BuiltSupernet:
    """``family``'s supernet of ``preset``: trained, calibrated and profiled, each step cached unless stale (the
    profile also when ``rebuild``; at ``out`` if given). Without ``profiled``, no profile: every searched subnet
    stands for the Pareto set (what needs only the models, not their latencies)."""
    if family == "cnn":
        artifacts = Artifacts(get_preset(preset), build_dir)
        act = artifacts.supernet()
        calibration = artifacts.calibration(act)
        profile, kept = (artifacts.profiled(act, calibration, mode=mode, repeats=repeats, rebuild=rebuild, out=out)
                         if profiled else (None, list(calibration.candidates)))
        heldout = data.load(act.spec.image_size)["heldout"]
        return BuiltSupernet(family, profiler.SUPERNET_MODEL, "digits", profile, out or artifacts.profile_path,
                             calibration, kept, heldout.images, heldout.labels,
                             functools.partial(profiler.export_supernet, act),
                             functools.partial(profiler.export_static, act))
    if family == "transformer":
        texts = text_artifacts.TextArtifacts(transformer.get_preset(preset), build_dir)
        model, tokenizer = texts.encoder(), texts.tokenizer
        calibration = texts.calibration(model)
        profile, kept = (texts.profiled(model, calibration, mode=mode, repeats=repeats, rebuild=rebuild, out=out)
                         if profiled else (None, list(calibration.candidates)))
        samples, labels = texts.split("heldout")
        return BuiltSupernet(family, text_artifacts.TEXT_MODEL, text_artifacts.LOGICAL_MODEL, profile,
                             out or texts.profile_path, calibration, kept, samples, labels,
                             functools.partial(text_artifacts.export_supernet, model, tokenizer),
                             functools.partial(text_artifacts.export_static, model, tokenizer))
    raise ValueError(f"unknown family {family!r}; choose one of {FAMILIES}")
