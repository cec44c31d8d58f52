"""Proteus (Ahmad et al., ASPLOS '24): the MILP that selects and places variants every period and on a burst,
and adaptive batching on each worker. Its reproduction and the systems it is compared with are in
``experiments/proteus``."""

from __future__ import annotations

from dataclasses import fields

from scheduler_sidecar.systems import PlannerContext, PlannerEntry, System
from scheduler_sidecar.systems.proteus.planner import ProteusConfig, ProteusPlanner
from scheduler_sidecar.systems.proteus.policy import Proteus


def _build(config: ProteusConfig, context: PlannerContext) -> ProteusPlanner:
    return ProteusPlanner(context.profiles, context.workers, context.slo_ms, config)


SYSTEM = System("proteus", (Proteus,), PlannerEntry(
    kind="proteus", policy=Proteus.name, build=_build,
    keys=frozenset(f.name for f in fields(ProteusConfig) if f.name != "capacity"),
    check=lambda options: ProteusConfig(**options)))
