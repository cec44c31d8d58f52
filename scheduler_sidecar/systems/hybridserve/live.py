"""HybridServe live: the sidecar in front of the cascade's BLS model (:mod:`python_backend.cascade_bls`).

A cascade is a logical model with an SLO. The sidecar holds its queue and sends each free Triton the head
batch, earliest deadline first, with the time the first request has left (``budget_ms``): where that cannot pay
for the next model, the BLS answers with the model at hand and says so (an extension: the paper has no SLO).

:class:`HybridServePlanner` deploys a mode (AP, EO, or the largest model alone): the cascade Algorithm 2 leaves,
with skip connections where they pay (:func:`.planner.pruned_point`), whose plan (models, thresholds, temperatures,
skips) :class:`CascadeModel` sends with every batch; each model's replicas R ∝ ρl within an instance budget as its
Triton instance count; and, with the workers on more than one Triton server, the placement program (Algorithm 3,
Eqs. 2-4, :func:`.placement.plan`) over those servers at the demand the engine observed. Decisions:

- A model the cascade leaves out keeps one instance, Triton's least (there is no count of 0). Unloading it is not
  a plan's to say: ``Plan.placement`` names the models the engine's query types run (the BLS), not the models a BLS
  calls. One idle instance holds memory and no compute, and the BLS's deployed ``plan.json``, which a request
  without a plan follows, may still name it.
- The engine's workers are a server's BLS instance slots (a BLS instance holds its batch through every hop, so the
  cascade's concurrency is its instance count), so the sidecar tells the planner each slot's server (``server``).
  The placement program's devices are the servers: each its own (requests between them cross the network), at its
  device kind's speed (``device_speeds``), with ``server_memory_mb``.
- A BLS calls only its own server's models. The plan carries the placement program's servers: those it placed
  instances on serve (at a low demand, fewer), and servers it leaves out drop the BLS. Each serving server runs the
  instances the program placed on it (``Plan.server_instances``), at least one of each cascade model, since its
  BLS escalates only to its own server's. Where no placement fits the demand, every server serves, each with the
  replicas R ∝ ρl (``Plan.instances``). The placement, instance by instance, is in the plan's detail.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_sidecar.core.plan import Demand, Plan, Planner
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.core.records import Query, WorkerState
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.systems.bls import BlsPolicy
from scheduler_sidecar.systems.hybridserve import placement, pruning
from scheduler_sidecar.systems.hybridserve.family import Family
from scheduler_sidecar.systems.hybridserve.planner import (
    MODES,
    OperatingPoint,
    operating_points,
    pruned_point,
)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class HybridServeConfig:
    instances: int = 16  # the instance budget of each Triton server (the replicas R ∝ ρl within it)
    rounding: str = placement.NEAREST  # how the replicas are rounded (placement.replicas)
    slowdown: float = 1.0  # the family's measured latencies times this: an emulated slower device
    # decision: the paper plans once, offline; live, the placement follows the demand, re-planned as often as
    # Loki's controller does (§4.2 there)
    period_s: float = 10.0
    # decision: the placement is planned for at least this rate, so that a pool that went quiet keeps a server
    min_demand_qps: float = 1.0
    server_memory_mb: float = 16384.0  # ω^g of a server, a 16 GB device (the paper's T4s)
    # device kind -> speed, relative to the family's measured latencies times ``slowdown``; kinds not named: 1
    device_speeds: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) or self.instances < 1:
            raise ValueError(f"hybridserve: instances must be a whole number >= 1, got {self.instances!r}")
        if self.rounding not in (placement.NEAREST, placement.BALANCED):
            raise ValueError(f"hybridserve: rounding must be {placement.NEAREST!r} or {placement.BALANCED!r}, "
                             f"got {self.rounding!r}")
        for key in ("slowdown", "period_s", "server_memory_mb"):
            if not _number(getattr(self, key)) or not getattr(self, key) > 0:
                raise ValueError(f"hybridserve: {key} must be > 0, got {getattr(self, key)!r}")
        if not _number(self.min_demand_qps) or self.min_demand_qps < 0:
            raise ValueError(f"hybridserve: min_demand_qps must be >= 0, got {self.min_demand_qps!r}")
        if not isinstance(self.device_speeds, Mapping) or not all(
                isinstance(k, str) and _number(v) and v > 0 for k, v in self.device_speeds.items()):
            raise ValueError(f"hybridserve: device_speeds must map device kinds to speeds > 0, "
                             f"got {self.device_speeds!r}")


DEFAULT_CONFIG = HybridServeConfig()


@dataclass(frozen=True)
class CascadePlan:
    """A plan's detail: what the policy sends and what was decided."""

    point: OperatingPoint  # the cascade deployed, with its shares ρ on the search split
    bls: dict  # its plan in the BLS model's format (python_backend.cascade_bls), sent with every batch
    replicas: Mapping[str, int]  # instances of each of its models on every server that serves it
    rate_qps: float  # the demand planned for
    placement: placement.Placement | None = None  # the placement program's, with more than one server


class HybridServePlanner(Planner):
    """Deploys ``point`` (see the module notes) as the Triton model ``bls``, a cascade BLS model over ``family``.
    ``server`` names the Triton server of an engine worker (default: each worker its own server)."""

    def __init__(self, family: Family, point: OperatingPoint, bls: str, config: HybridServeConfig = DEFAULT_CONFIG,
                 *, server: Callable[[int], str] = str) -> None:
        self.point, self.bls, self.config, self.server = point, bls, config, server
        self.period_us = round(config.period_s * 1e6)
        models = point.cascade.models
        self.replicas = dict(zip(models, point.replicas(family, config.instances, rounding=config.rounding)))
        self.instances = {m: self.replicas.get(m, 1) for m in family.names}
        exec_ms = {m.name: m.latency.p50_ms[0] * config.slowdown for m in family.models}
        self.bls_plan = point.cascade.plan({m.name: m.temperature for m in family.models}, exec_ms)
        # what the placement program needs, computed once: the cascade does not change between plans
        self.service_s = point.service_s(family) * config.slowdown
        self.memory_mb = [family.memory_mb(m) for m in models]
        self.flow = point.flow(family)

    @classmethod
    def from_family(cls, stamp: Path | str, mode: str, bls: str, config: HybridServeConfig = DEFAULT_CONFIG, *,
                    prune: bool = True, server: Callable[[int], str] = str) -> HybridServePlanner:
        """The planner of ``mode`` on the family whose ``cascade.json`` is ``stamp``: Algorithm 1, and 2 unless
        ``prune`` is false (the whole family's point, for comparison); seconds of search."""
        if mode not in MODES:
            raise ValueError(f"hybridserve: mode must be one of {list(MODES)}, got {mode!r}")
        family = Family.load(Path(stamp))
        if prune and mode != "largest":  # the largest model alone has nothing to prune
            point = pruned_point(family, pruning.prune(family.predictions("search"), family.costs, mode), mode)
        else:
            point = operating_points(family)[mode]
        return cls(family, point, bls, config, server=server)

    def plan(self, now_us: int, demand: Demand) -> Plan:
        rate_qps = max(self.config.min_demand_qps, sum(demand.rate_qps(t) for t in demand.arrivals))
        servers: dict[str, list[WorkerState]] = {}
        for w in demand.workers:
            if w.healthy:
                servers.setdefault(self.server(w.id), []).append(w)
        placed, where, own = None, {}, {}
        if len(servers) > 1:
            placed = self._place(servers, rate_qps)
            serving = set(placed.devices) if placed.feasible else set(servers)
            where = {w.id: frozenset({self.bls} if name in serving else ()) for name, ws in servers.items() for w in ws}
            if placed.feasible:  # each server runs the instances the placement put on it
                own = {w.id: counts for name, counts in self._per_server(placed).items() for w in servers[name]}
        return Plan(now_us, where, CascadePlan(self.point, self.bls_plan, self.replicas, rate_qps, placed),
                    self.instances, own)

    def _per_server(self, placed: placement.Placement) -> dict[str, dict[str, int]]:
        """The instances of each cascade model on each server that serves. Decision: at least one of each, since a
        server's BLS calls its own server's models (Triton runs no fewer than one instance of a loaded model), so a
        server the placement gave no instance of a model escalates to a single one."""
        models = self.point.cascade.models
        placed_on = Counter((models[i.model], device) for i, device in zip(placed.instances, placed.devices))
        return {device: {m: max(1, placed_on[m, device]) for m in models} for device in dict.fromkeys(placed.devices)}

    def _place(self, servers: dict[str, list[WorkerState]], rate_qps: float) -> placement.Placement:
        """Algorithm 3 over the servers, each one device (kernels one at a time, Σu <= 1, as the paper's GPUs),
        with up to the instance budget times the servers to place."""
        devices = [placement.Device(name, name, self.config.server_memory_mb,
                                    self.config.device_speeds.get(ws[0].device, 1.0)) for name, ws in servers.items()]
        return placement.plan(self.point.validation.reach, self.service_s, self.memory_mb, self.flow, devices,
                              rate_qps, max_instances=self.config.instances * len(devices))


class CascadeModel(BlsPolicy):
    """The sidecar's policy for a cascade. Options: ``max_batch`` (requests per call to the BLS, default 32) and
    ``plan`` (a JSON plan file sent with every batch; default: the BLS's deployed plan). Under a
    :class:`HybridServePlanner`, each plan's cascade is sent instead. A batch also carries the time its first
    request has left, in milliseconds, as ``budget_ms``."""

    name = "cascade"
    file_options = frozenset({"plan"})

    def __init__(self, profile: Profile, *, max_batch: int = 32, plan: str | None = None, **options) -> None:
        super().__init__(profile, max_batch=max_batch, **options)
        self.params: tuple[tuple[str, object], ...] = ()  # the plan sent with every batch
        if plan is not None:
            try:
                self.params = (("cascade_plan", json.dumps(json.loads(Path(plan).read_text()))),)
            except (OSError, ValueError, RecursionError) as exc:
                raise ConfigError(f"cascade: cannot read the plan {plan!r}: {exc}") from exc

    def observe_plan(self, now_us: int, plan: Plan) -> None:
        if isinstance(plan.detail, CascadePlan):
            self.params = (("cascade_plan", json.dumps(plan.detail.bls)),)

    def batch_params(self, now_us: int, batch: Sequence[Query], worker: WorkerState) -> tuple[tuple[str, object], ...]:
        return (*self.params, ("budget_ms", self.slack_us(now_us, batch[0]) / 1000))
