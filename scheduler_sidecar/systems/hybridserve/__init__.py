"""HybridServe (Xue, Fu, Mai, Marina, arXiv 2505.12566): confidence cascades from small to large models, with
calibrated thresholds, model pruning and skip connections, and a replica planner. Its reproduction, the authors'
prototype data and the energy meters are in ``experiments/hybridserve``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from scheduler_sidecar.systems import PlannerContext, PlannerEntry, System
from scheduler_sidecar.systems.hybridserve.live import CascadeModel, HybridServeConfig, HybridServePlanner
from scheduler_sidecar.systems.hybridserve.planner import MODES

CONFIG_KEYS = frozenset(f.name for f in fields(HybridServeConfig))
# beside HybridServeConfig's: the path of a family's cascade.json; the operating point (ap, eo or largest);
# Algorithm 2 with skips where they pay (default true)
LIVE_KEYS = frozenset({"family", "mode", "prune"})


@dataclass(frozen=True)
class LiveSettings:
    family: Path
    mode: str
    prune: bool
    config: HybridServeConfig


def _check(options: Mapping[str, Any]) -> LiveSettings:
    """The options, checked; the planner itself searches for seconds, so it is built by the sidecar, once."""
    if "family" not in options:
        raise ValueError("hybridserve needs 'family', the path of a family's cascade.json "
                         "(export/cascade_models.py builds it)")
    family = Path(str(options["family"]))
    if not family.is_file():
        raise ValueError(f"hybridserve's family {str(family)!r} is not a file: `accscale demo hybridserve` (or `accscale "
                         "reproduce hybridserve`) builds it into build/hybridserve")
    mode, prune = options.get("mode", "ap"), options.get("prune", True)
    if mode not in MODES:
        raise ValueError(f"hybridserve's mode must be one of {list(MODES)}, got {mode!r}")
    if not isinstance(prune, bool):
        raise ValueError(f"hybridserve's prune must be true or false, got {prune!r}")
    return LiveSettings(family, mode, prune,
                        HybridServeConfig(**{k: v for k, v in options.items() if k in CONFIG_KEYS}))


def _build(s: LiveSettings, context: PlannerContext) -> HybridServePlanner:
    """Deploys through the BLS model of the one logical model's cascade; runs Algorithms 1 and 2: seconds."""
    (profile,) = context.profiles.values()
    return HybridServePlanner.from_family(s.family, s.mode, profile.variants[-1].actuation.model, s.config,
                                          prune=s.prune, server=context.server)


SYSTEM = System("hybridserve", (CascadeModel,), PlannerEntry(
    kind="hybridserve", policy=CascadeModel.name, keys=CONFIG_KEYS | LIVE_KEYS, check=_check, build=_build,
    bls_slots=True, one_model=True))
