"""Algorithm 2 (§IV-C): drop the models whose energy benefit is not positive, re-searching the thresholds after
each removal, then configure the skip connections.

Decisions where the paper is silent or self-contradictory:
- benefits are those of the operating point being deployed (AP or EO; the paper does not say which), in the
  chain without skips, which is what ``(ρ_i − ρ_{i+1}) e_{i+1}`` describes;
- one model per round, the smallest first ("scanned from small to large to preserve overall accuracy"); the
  largest model is never removed (it anchors accuracy and its benefit is undefined);
- skips: the uniform bins of the text (:mod:`python_backend.cascade`), not line 5's LogUniform draw; with skips on,
  the thresholds are searched again with the skip routing in the evaluation, since a skip changes who reaches
  whom and so which thresholds keep the accuracy;
- the paper configures skips without saying when they are worth it. Deployed where they pay (:meth:`Pruned.deployed`):
  where the skip front has a point at least as accurate as the chain's point of the mode and cheaper. That point
  keeps the mode's accuracy (AP's, the largest model's; EO's knee) and costs less, so the skips are a plain gain;
  a cheaper skip point that loses accuracy is not taken (that trade is a different operating point).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_sidecar.systems.hybridserve.cascade import Outcome, Predictions, energy_benefit
from scheduler_sidecar.systems.hybridserve.search import DEFAULT_SEARCH, SearchConfig, SearchResult, search

MODES = ("ap", "eo")


@dataclass(frozen=True)
class Removal:
    model: int  # index into the family
    benefit: float
    answered: float  # the share it answered at the point that removed it


@dataclass(frozen=True)
class Pruned:
    kept: tuple[int, ...]  # indices into the family, small to large
    removed: tuple[Removal, ...]
    before: Outcome  # the mode's point on the whole family
    chain: SearchResult  # the search on the kept models, no skips
    skips: SearchResult  # the same with skip connections

    def point(self, mode: str, skip: bool) -> Outcome:
        result = self.skips if skip else self.chain
        return result.ap if mode == "ap" else result.eo

    def deployed(self, mode: str) -> tuple[Outcome, bool]:
        """(the point of ``mode`` to deploy on the kept models, whether it uses skips): skips where they pay (module
        notes), the cheapest skip point at least as accurate as the chain's point."""
        chain = self.point(mode, skip=False)
        paying = [o for o in self.skips.front if o.accuracy >= chain.accuracy - 1e-12 and o.cost < chain.cost]
        return (min(paying, key=lambda o: o.cost), True) if paying else (chain, False)


def prune(preds: Predictions, costs: np.ndarray, mode: str = "ap", config: SearchConfig = DEFAULT_SEARCH,
          searched: SearchResult | None = None) -> Pruned:
    """``searched``: Algorithm 1's result on all of ``preds`` with ``config``, where the caller has it already (the
    first round's search, which is then not repeated)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    costs = np.asarray(costs, dtype=np.float64)
    kept = list(range(preds.models))
    removed: list[Removal] = []
    before, seeds = None, None
    while True:
        result = searched if before is None and searched is not None else search(
            preds.subset(kept), costs[kept], config=config, seeds=seeds)
        point = result.ap if mode == "ap" else result.eo
        if before is None:
            before = point
        benefits = energy_benefit(np.array(point.reach), costs[kept])
        bad = next((i for i, b in enumerate(benefits) if b <= 0), None)
        if bad is None or len(kept) == 1:
            break
        removed.append(Removal(kept[bad], float(benefits[bad]), point.answered[bad]))
        del kept[bad]
        seeds = np.delete(np.array([point.thresholds]), bad, axis=1) if bad < len(kept) else None
    skips = search(preds.subset(kept), costs[kept], skip=True, config=config)
    return Pruned(tuple(kept), tuple(removed), before, result, skips)
