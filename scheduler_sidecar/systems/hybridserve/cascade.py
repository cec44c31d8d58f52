"""A cascade evaluated on cached predictions: which model answers each sample, the share of samples reaching each
model (the paper's ρ_i), accuracy and cost, for many threshold vectors at once.

Cost (Alg. 1, line 4) is ``e = Σ_i ρ_i e_i``: ``e_i`` is model i's cost per request. The paper measures energy;
here it is the measured worker-seconds per request (and energy follows from a power model, :mod:`.planner`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from python_backend.cascade import ANSWER, confidence, route

MAX_MODELS = int(np.iinfo(np.int8).max)  # the walk keeps each sample's model in an int8


@dataclass(frozen=True)
class Predictions:
    """Every model's labels and calibrated confidences on one split, small model first."""

    labels: np.ndarray  # int [n, N]
    conf: np.ndarray  # float [n, N]
    truth: np.ndarray  # int [N]

    @classmethod
    def from_logits(cls, logits: list[np.ndarray], temperatures: list[float], truth: np.ndarray) -> Predictions:
        pairs = [confidence(z, t) for z, t in zip(logits, temperatures)]
        return cls(np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs]), np.asarray(truth))

    @property
    def models(self) -> int:
        return len(self.labels)

    def accuracy(self) -> np.ndarray:
        """Each model's accuracy alone (the paper's a_{m_i})."""
        return (self.labels == self.truth).mean(axis=1)

    def subset(self, keep: list[int]) -> Predictions:
        """The cascade of the models ``keep`` (indices, in order)."""
        return Predictions(self.labels[keep], self.conf[keep], self.truth)


@dataclass(frozen=True)
class Cascade:
    """A deployable cascade: models small to large (a subset of a family, in order) and their thresholds."""

    models: tuple[str, ...]
    thresholds: tuple[float, ...]  # one per model but the last
    skip: bool = False

    def __post_init__(self) -> None:
        if not self.models or len(self.thresholds) != len(self.models) - 1:
            raise ValueError(f"a cascade of {len(self.models)} models takes {len(self.models) - 1} thresholds")

    def plan(self, temperatures: dict[str, float], exec_ms: dict[str, float]) -> dict:
        """The BLS model's plan (:mod:`python_backend.cascade_bls`)."""
        return {"models": list(self.models), "thresholds": list(self.thresholds), "skip": self.skip,
                "temperatures": {m: temperatures[m] for m in self.models},
                "exec_ms": {m: exec_ms[m] for m in self.models}}


@dataclass(frozen=True)
class Outcome:
    """One threshold vector's result."""

    thresholds: tuple[float, ...]  # one per model but the last (whose threshold is 0: it always answers)
    accuracy: float
    reach: tuple[float, ...]  # ρ_i: the share of samples model i runs on
    answered: tuple[float, ...]  # q_i: the share model i answers
    cost: float  # Σ ρ_i e_i


def answered_by(preds: Predictions, thresholds: np.ndarray, skip: bool = False) -> np.ndarray:
    """The model that answers each sample, [K, N], for ``thresholds`` [K, n - 1]."""
    t = np.atleast_2d(np.asarray(thresholds, dtype=np.float64))
    by = np.full((len(t), preds.conf.shape[1]), ANSWER, dtype=np.int8)
    for i, here, nxt in _steps(preds, t, skip):
        np.copyto(by, i, where=here & (nxt == ANSWER))
    return by


def evaluate(preds: Predictions, thresholds: np.ndarray, costs: np.ndarray, skip: bool = False) -> list[Outcome]:
    """The outcome of each row of ``thresholds`` [K, n - 1] (vectorised over rows and samples): counted model by
    model as the walk goes, so no [K, N] array of answering models is built and gathered (the planner's search
    evaluates some hundred thousand rows)."""
    t = np.atleast_2d(np.asarray(thresholds, dtype=np.float64))
    samples = preds.conf.shape[1]
    right = preds.labels == preds.truth  # [n, N]: model i's answer to each sample is right
    reach, answered = np.empty((len(t), preds.models)), np.empty((len(t), preds.models))
    hits = np.zeros(len(t), dtype=np.int64)
    for i, here, nxt in _steps(preds, t, skip):
        reach[:, i] = np.count_nonzero(here, axis=1) / samples
        mine = here & (nxt == ANSWER)
        answered[:, i] = np.count_nonzero(mine, axis=1) / samples
        hits += np.count_nonzero(mine & right[i], axis=1)
    accuracy = hits / samples
    cost = reach @ np.asarray(costs, dtype=np.float64)
    # tolist() makes the Python floats in one call per array, not one per element
    return [Outcome(tuple(tk), ak, tuple(rk), tuple(qk), ck)
            for tk, ak, rk, qk, ck in zip(t.tolist(), accuracy.tolist(), reach.tolist(), answered.tolist(),
                                          cost.tolist())]


def forwarded(preds: Predictions, thresholds: np.ndarray, skip: bool = False) -> np.ndarray:
    """flow [n, n]: the share of samples model i forwards to model j > i at ``thresholds`` [n - 1] (the dataflow's
    edges, which the placement program weighs; with skips, not only j = i + 1)."""
    n, samples = preds.conf.shape
    flow = np.zeros((n, n))
    for i, here, nxt in _steps(preds, np.atleast_2d(np.asarray(thresholds, dtype=np.float64)), skip):
        onward = nxt[here]
        flow[i] = np.bincount(onward[onward != ANSWER], minlength=n) / samples
    return flow


def _steps(preds: Predictions, t: np.ndarray, skip: bool) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Every sample starts at model 0 and moves forward by :func:`route`: for each model i in turn, (i, the samples
    at it [K, N], where each sample would go from it [K, N]) for thresholds ``t`` [K, n - 1]."""
    n, samples = preds.conf.shape
    if t.shape[1] != n - 1:
        raise ValueError(f"a cascade of {n} models takes {n - 1} thresholds, got {t.shape[1]}")
    if n > MAX_MODELS:
        raise ValueError(f"a cascade of {n} models: at most {MAX_MODELS} (a sample's model is an int8 here)")
    # int8 and in-place updates: the walk is memory-bound over K x N, and a cascade has far fewer than 127 models
    at = np.zeros((len(t), samples), dtype=np.int8)  # the model each sample is at (ANSWER once answered)
    for i in range(n):
        here = at == i
        threshold = t[:, i, None] if i < n - 1 else np.zeros((len(t), 1))
        nxt = route(i, preds.conf[i], threshold, n - 1, skip)
        yield i, here, nxt
        np.copyto(at, nxt, where=here)


def cascade_cost(reach: np.ndarray, costs: np.ndarray) -> float:
    """e = Σ_i ρ_i e_i (Alg. 1, line 4)."""
    return float(np.dot(reach, costs))


def energy_benefit(reach: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """Alg. 2, line 1, for each model but the last: ``(ρ_i − ρ_{i+1}) e_{i+1} − ρ_i e_i``: what the samples model i
    answers save of the next model, less what running model i costs."""
    rho, e = np.asarray(reach, dtype=np.float64), np.asarray(costs, dtype=np.float64)
    return (rho[:-1] - rho[1:]) * e[1:] - rho[:-1] * e[:-1]
