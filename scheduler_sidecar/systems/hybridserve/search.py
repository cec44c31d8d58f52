"""Algorithm 1, the confidence threshold search (§IV-B): random threshold vectors, refined locally where they are
accurate, scored on cached predictions; the accuracy-cost front ("threshold performance graph") and its two
operating points.

- **AP** (accuracy preserving): the cheapest point whose accuracy is at least the largest model's. Line 10 prints
  ``min_e(e_{m_n}, ...)``; read as the constraint ``a = a_{m_n}``, relaxed to ``a >= a_{m_n} - tolerance`` (a
  cascade can beat the largest model, and "equal" would throw those points away). Without such a point, the most
  accurate one, reported as such.
- **EO** (energy optimising): the knee of the front, the point where its second derivative e''(a) is largest
  (§IV-B), among points at least as accurate as the second-largest model (line 11) and no more accurate than AP
  (decision: EO is there to save more than AP; the front is monotone, so above AP it costs more).

Decisions where the paper is silent (its |K| and ε are unspecified): 256 uniform draws a round; around each draw at
least as accurate as the second-largest model, 16 draws within ±0.05 (line 5 also caps the accuracy at the largest
model's; that cap would stop refinement exactly where AP lies, so it is left out); the search ends after three
rounds that add nothing to the front ("until no new (a, e)") or 50 rounds. The front is binned at 0.1 accuracy
point for the second difference, which is otherwise dominated by single-sample steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_sidecar.systems.hybridserve.cascade import Outcome, Predictions, evaluate


@dataclass(frozen=True)
class SearchConfig:
    samples: int = 256  # |K|, uniform draws per round
    local_samples: int = 16  # draws around each promising draw (line 6)
    epsilon: float = 0.05  # ε, half-width of the local box
    patience: int = 3  # rounds without a new front point before stopping
    max_rounds: int = 50
    ap_tolerance: float = 0.0  # AP: accuracy >= the largest model's - this
    eo_bin: float = 0.001  # the front binned by 0.1 accuracy point for e''(a)
    seed: int = 0


DEFAULT_SEARCH = SearchConfig()


@dataclass(frozen=True)
class SearchResult:
    front: tuple[Outcome, ...]  # accuracy-cost Pareto front, least accurate first
    ap: Outcome
    eo: Outcome
    ap_exact: bool  # False: no point reached the largest model's accuracy, AP is the most accurate point
    evaluated: int
    rounds: int


def search(preds: Predictions, costs: np.ndarray, *, skip: bool = False, config: SearchConfig = DEFAULT_SEARCH,
           seeds: np.ndarray | None = None) -> SearchResult:
    """Algorithm 1 on ``preds`` (validation predictions) with per-model costs ``costs``; ``seeds`` are threshold
    vectors evaluated first (Algorithm 2 passes the previous search's choice, less the removed model's)."""
    rng = np.random.default_rng(config.seed)
    dims = preds.models - 1
    single = preds.accuracy()
    second = single[-2] if preds.models > 1 else single[-1]
    # every sample to the largest model (all thresholds at the top) anchors the front at the largest's accuracy
    start = np.ones((1, dims)) if seeds is None else np.vstack([np.ones((1, dims)), seeds])
    front: list[Outcome] = _merge([], evaluate(preds, start, costs, skip))
    evaluated, quiet, rounds = len(start), 0, 0
    while quiet < config.patience and rounds < config.max_rounds:
        rounds += 1
        draws = rng.uniform(0, 1, (config.samples, dims))
        outcomes = _evaluate(preds, draws, costs, skip)
        promising = draws[[o.accuracy >= second for o in outcomes]]
        if len(promising):
            local = promising[:, None, :] + rng.uniform(-config.epsilon, config.epsilon,
                                                         (len(promising), config.local_samples, dims))
            outcomes += _evaluate(preds, np.clip(local.reshape(-1, dims), 0, 1), costs, skip)
        evaluated += len(outcomes)
        merged = _merge(front, outcomes)
        quiet = quiet + 1 if merged == front else 0
        front = merged
    ap, exact = _ap(front, single[-1] - config.ap_tolerance)
    return SearchResult(tuple(front), ap, _eo(front, second, ap, config.eo_bin), exact, evaluated, rounds)


def _evaluate(preds: Predictions, thresholds: np.ndarray, costs: np.ndarray, skip: bool,
              chunk: int = 1024) -> list[Outcome]:
    return [o for start in range(0, len(thresholds), chunk)
            for o in evaluate(preds, thresholds[start:start + chunk], costs, skip)]


def _merge(front: list[Outcome], outcomes: list[Outcome]) -> list[Outcome]:
    """The Pareto front (higher accuracy, lower cost) of both, least accurate first; the first of equal points."""
    points = sorted([*front, *outcomes], key=lambda o: (-o.accuracy, o.cost))
    kept: list[Outcome] = []
    for o in points:
        if not kept or o.cost < kept[-1].cost:
            kept.append(o)
    return kept[::-1]


def _ap(front: list[Outcome], target: float) -> tuple[Outcome, bool]:
    reaching = [o for o in front if o.accuracy >= target - 1e-12]
    if not reaching:
        return front[-1], False
    return min(reaching, key=lambda o: o.cost), True


def _eo(front: list[Outcome], floor: float, ap: Outcome, bin_width: float) -> Outcome:
    """The knee: argmax of the second difference of cost over accuracy on the binned front in [floor, AP]."""
    candidates = [o for o in front if floor - 1e-12 <= o.accuracy <= ap.accuracy]
    if not candidates:
        return ap
    bins: dict[int, Outcome] = {}
    for o in candidates:  # cheapest per accuracy bin
        b = int(np.floor(o.accuracy / bin_width + 1e-9))
        if b not in bins or o.cost < bins[b].cost:
            bins[b] = o
    points = [bins[b] for b in sorted(bins)]
    if len(points) < 3:
        return points[0]
    a = np.array([o.accuracy for o in points])
    e = np.array([o.cost for o in points])
    slopes = np.diff(e) / np.diff(a)
    second = 2 * np.diff(slopes) / (a[2:] - a[:-2])
    return points[1 + int(np.argmax(second))]


def grid(preds: Predictions, costs: np.ndarray, steps: int = 100, skip: bool = False) -> list[Outcome]:
    """The front of an exhaustive grid of ``steps + 1`` values per threshold (what Algorithm 1 is tested against)."""
    axis = np.linspace(0, 1, steps + 1)
    points = np.stack(np.meshgrid(*[axis] * (preds.models - 1), indexing="ij"), -1).reshape(-1, preds.models - 1)
    return _merge([], _evaluate(preds, points, costs, skip))
