"""The paper systems, one package each; their online policies by name, the registry the CLI, config files and
the admin switch share."""

from __future__ import annotations

from scheduler_sidecar.core.policy import LateQueries, Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.systems.hybridserve.live import CascadeModel
from scheduler_sidecar.systems.loki.live import LokiPipeline
from scheduler_sidecar.systems.proteus.policy import Proteus
from scheduler_sidecar.systems.ramsis.policy import JellyfishPlus, ModelSwitching, Ramsis
from scheduler_sidecar.systems.superserve.baselines import ClipperPlus, Infaas
from scheduler_sidecar.systems.superserve.greedy import MaxAcc, MaxBatch
from scheduler_sidecar.systems.superserve.slackfit import SlackFit

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (SlackFit, MaxAcc, MaxBatch, ClipperPlus, Infaas, Ramsis,
                                                    JellyfishPlus, ModelSwitching, Proteus, LokiPipeline,
                                                    CascadeModel)}


def make_policy(name: str, profile: Profile, **options: object) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name](profile, **options)


__all__ = ["POLICIES", "LateQueries", "Policy", "make_policy"]
