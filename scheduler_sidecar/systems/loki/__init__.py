"""Loki (Ahmad, Guan, Sitaraman, HPDC '24): pipelines with data-dependent fan-out, hardware then accuracy scaling,
most-accurate-first routing, early dropping and opportunistic rerouting. Its reproduction and the systems it is
compared with are in ``experiments/loki``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from scheduler_sidecar.systems import PlannerContext, PlannerEntry, System
from scheduler_sidecar.systems.loki.data import load_pipeline
from scheduler_sidecar.systems.loki.live import LivePlanner, LokiPipeline
from scheduler_sidecar.systems.loki.pipeline import Pipeline
from scheduler_sidecar.systems.loki.planner import LokiConfig
from scheduler_sidecar.systems.loki.policy import BUDGETS, DEFAULT_BUDGET, DropMode

CONFIG_KEYS = frozenset(f.name for f in fields(LokiConfig) if f.name != "top_only")
# beside LokiConfig's: the path of a pipeline's loki.json, the replica budget S (of each Triton server), the dropping
# mode, the latency budget rule, and the emulated device's factor on the pipeline's profiled latencies
LIVE_KEYS = frozenset({"pipeline", "instances", "drop", "budget", "slowdown"})


@dataclass(frozen=True)
class LiveSettings:
    pipeline: Pipeline
    instances: int
    config: LokiConfig
    drop: DropMode
    budget: str


def _check(options: Mapping[str, Any]) -> LiveSettings:
    if "pipeline" not in options:
        raise ValueError("loki needs 'pipeline', the path of a pipeline's loki.json")
    budget = options.get("budget", DEFAULT_BUDGET)
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}, got {budget!r}")
    pipeline = load_pipeline(str(options["pipeline"])).scaled(float(options.get("slowdown", 1.0)))
    return LiveSettings(pipeline, int(options.get("instances", 8)),
                        LokiConfig(**{k: v for k, v in options.items() if k in CONFIG_KEYS}),
                        DropMode(options.get("drop", "rerouting")), budget)


def _build(s: LiveSettings, context: PlannerContext) -> LivePlanner:
    """Decision: the pipeline is planned for the SLO its logical model is served with (the model's
    ``default_slo_us``), not the one its ``loki.json`` was built for: a deployment at another SLO plans for its own
    (the simulation of the same deployment does)."""
    slos = set(context.slo_ms.values())
    if len(slos) > 1:
        raise ValueError(f"loki plans one pipeline: its models must share one SLO, got {dict(context.slo_ms)}")
    return LivePlanner(replace(s.pipeline, slo_ms=slos.pop()) if slos else s.pipeline, s.instances, s.config,
                       drop=s.drop, budget=s.budget, server=context.server)


SYSTEM = System("loki", (LokiPipeline,), PlannerEntry(
    kind="loki", policy=LokiPipeline.name, keys=CONFIG_KEYS | LIVE_KEYS, check=_check, build=_build, bls_slots=True))
