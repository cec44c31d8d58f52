"""The HybridServe authors' earlier cascade prototype, as the project imported it (``profiles/hybridserve/``, its
README): drunkcoding/model-inference @ 02d2240b (MIT, Leyang Xue). It has ViT, T5 and GPT cascades, each
model's accuracy and cost alone, and two chosen threshold vectors per cascade: "preserved" (the paper's AP mode)
and "optimized" (EO), each with the share of requests reaching every model (ρ_i).

This module reproduces the prototype's cascade cost ``e = Σ ρ_i e_i`` (Alg. 1, line 4) and gives Alg. 2's energy
benefit per model, with the functions our planner uses (:mod:`.cascade`), so the dump checks them. The costs are
GPU energy per request, but the dump states no unit: only ratios such as :meth:`Family.relative_cost` mean anything.
Known mismatch: gpt-5's dumped cascade costs do not follow from its per-model costs (see the README).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scheduler_sidecar.core.profile import PROFILES_DIR
from scheduler_sidecar.errors import ProfileError
from scheduler_sidecar.systems.hybridserve.cascade import cascade_cost, energy_benefit

DATA_DIR = PROFILES_DIR / "hybridserve"
MODELS_CSV = DATA_DIR / "prototype_models.csv"
DECISIONS_CSV = DATA_DIR / "prototype_decisions.csv"


@dataclass(frozen=True)
class PrototypeModel:
    name: str
    accuracy: float  # alone, on the prototype's test split
    cost: float  # e_i per request, unit not stated upstream


@dataclass(frozen=True)
class PrototypeMode:
    """One threshold vector the prototype chose, with what it reported for it."""

    name: str  # "ap" (upstream "preserved") or "eo" ("optimized")
    accuracy: float
    cost: float  # as dumped
    thresholds: tuple[float, ...]  # one per model but the last
    reach: tuple[float, ...]  # ρ_i (upstream "propotion")


@dataclass(frozen=True)
class Family:
    name: str
    models: tuple[PrototypeModel, ...]  # small to large
    modes: Mapping[str, PrototypeMode]  # "ap", "eo"

    @property
    def costs(self) -> np.ndarray:
        return np.array([m.cost for m in self.models])

    def cost(self, mode: str) -> float:
        """e = Σ ρ_i e_i, recomputed from the mode's reach and the models' costs."""
        return cascade_cost(np.array(self.modes[mode].reach), self.costs)

    def relative_cost(self, mode: str) -> float:
        """The cascade's cost over the largest model's alone (e / e_n): what the cascade saves."""
        return self.cost(mode) / self.models[-1].cost

    def energy_benefit(self, mode: str) -> np.ndarray:
        """Alg. 2's benefit of each model but the last; Alg. 2 would prune a model whose benefit is ≤ 0."""
        return energy_benefit(np.array(self.modes[mode].reach), self.costs)


def families() -> list[str]:
    with open(MODELS_CSV, newline="") as fh:
        return list(dict.fromkeys(r["family"] for r in csv.DictReader(fh)))


def load(family: str) -> Family:
    with open(MODELS_CSV, newline="") as fh:
        rows = sorted((r for r in csv.DictReader(fh) if r["family"] == family), key=lambda r: int(r["order"]))
    if not rows:
        raise KeyError(f"no prototype family {family!r}; there are {families()}")
    models = tuple(PrototypeModel(r["model"], float(r["accuracy"]), float(r["cost"])) for r in rows)
    with open(DECISIONS_CSV, newline="") as fh:
        modes = {r["mode"]: PrototypeMode(r["mode"], float(r["accuracy"]), float(r["cost"]),
                                          _floats(r["thresholds"]), _floats(r["reach"]))
                 for r in csv.DictReader(fh) if r["family"] == family}
    for m in modes.values():
        if len(m.reach) != len(models) or len(m.thresholds) != len(models) - 1:
            raise ProfileError(f"{family}/{m.name}: {len(models)} models but {len(m.reach)} reach values and "
                             f"{len(m.thresholds)} thresholds")
    return Family(family, models, modes)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split())
