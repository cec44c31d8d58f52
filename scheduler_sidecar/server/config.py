"""The sidecar's configuration: a TOML file, with flags for the common cases.

Example (every key but ``models[].name``/``profile`` and one ``workers`` entry is optional)::

    host = "127.0.0.1"        # bind address of both ports
    http_port = 8100
    grpc_port = 8101
    workers = ["127.0.0.1:8001"]  # Triton gRPC endpoints
    health_interval_s = 0.5
    admin_token = ""          # empty: the admin endpoints are off
    max_request_bytes = 67108864  # larger HTTP bodies / gRPC messages are refused unread (64 MiB)
    max_slo_us = 60000000     # a larger slo_us is refused (INVALID_ARGUMENT)
    max_rows = 64             # rows (batch dimension) one request may carry; each is a query of its own
    read_timeout_s = 10.0     # an HTTP request body must arrive within this once its headers have
    idle_timeout_s = 60.0     # an HTTP connection idle this long, or stuck in its headers, is closed

    [worker_devices]          # device kind per worker (a kind its profiles have); default: the profile's first
    "127.0.0.1:8001" = "cpu"

    [planner]                 # a periodic planner places variants on workers (proteus: each worker one device, one
                              # slot; loki, hybridserve: a BLS model whose instances are the worker's slots)
    kind = "proteus"          # its other keys are ProteusConfig's (period_s, burst_factor, headroom, ...)
    period_s = 30.0           # (kinds "loki" and "hybridserve": see PlannerSpec)

    [[models]]
    name = "digits"            # the logical model clients address
    profile = "build/full/profile.json"
    policy = "slackfit"
    default_slo_us = 50000     # when a request has no slo_us parameter
    queue_limit = 1024         # queued requests beyond this are refused (UNAVAILABLE)
    max_attempts = 3           # tries per request when workers fail
    overhead_us = 300          # time per request the profile and the sidecar do not see (client, network, front
                               # end); policies subtract it from slack. A report's "unseen p90 ms" measures it
    latency_calibration = true # re-plan when batches run slower or faster than profiled (see live.py)
    admission = true          # refuse (RESOURCE_EXHAUSTED) a request the queue ahead makes infeasible
    [models.policy_options]
    num_buckets = 32
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from scheduler_sidecar.server.protocol import Limits
from scheduler_sidecar.systems import POLICIES
from scheduler_sidecar.systems.hybridserve.live import HybridServeConfig, HybridServePlanner
from scheduler_sidecar.systems.hybridserve.planner import MODES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; `tomli` is the package it came from (a dependency there, see pyproject.toml)
    import tomli as tomllib


@dataclass(frozen=True)
class ModelSpec:
    """One logical model: a profile's variants, served under ``name`` by one policy."""

    name: str
    profile: Path
    policy: str = "slackfit"
    policy_options: dict[str, Any] = field(default_factory=dict)
    default_slo_us: int = 50_000
    queue_limit: int = 1024
    max_attempts: int = 3
    overhead_us: int = 300
    # re-plan with the profile's latencies scaled by how much slower (or faster) batches really run;
    # off for policies that are expensive to build (ramsis generates MDPs) or must follow the profile exactly
    latency_calibration: bool = True
    # shed at the door what the queue ahead already makes late (core.engine's admission); off: queue it anyway
    admission: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"model {self.name!r}: unknown policy {self.policy!r}; choose one of {sorted(POLICIES)}")
        for key in ("default_slo_us", "queue_limit", "max_attempts"):
            if getattr(self, key) < 1:
                raise ValueError(f"model {self.name!r}: {key} must be >= 1")
        if self.overhead_us < 0:
            raise ValueError(f"model {self.name!r}: overhead_us must be >= 0")


# planner kind -> the policy it routes for (its models' policy)
PLANNERS = {"proteus": "proteus", "loki": "loki", "hybridserve": "cascade"}
LOKI_LIVE_OPTIONS = {"pipeline", "instances", "drop", "budget", "slowdown"}  # beside LokiConfig's
HYBRIDSERVE_LIVE_OPTIONS = {"family", "mode", "prune"}  # beside HybridServeConfig's


@dataclass(frozen=True)
class PlannerSpec:
    """A periodic planner with its options: ``proteus`` (the MILP of ``systems/proteus``; ProteusConfig's options),
    ``loki`` (``systems/loki``'s live controller: ``pipeline``, the path of a pipeline's loki.json;
    ``instances``, the replica budget; ``drop``; ``budget``; ``slowdown``, the emulated device's factor on the
    pipeline's profiled latencies; and LokiConfig's options) or ``hybridserve`` (``systems/hybridserve``'s planner
    of one cascade model: ``family``, the path of a family's cascade.json; ``mode``, ap (default), eo or largest;
    ``prune``, Algorithm 2 with skips where they pay (default true); and HybridServeConfig's options: ``instances``,
    the instance budget of each server, ``rounding``, ``slowdown``, ``period_s``, ``min_demand_qps``,
    ``server_memory_mb``, ``device_speeds``, a table of device kind = speed)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in PLANNERS:
            raise ValueError(f"planner: unknown kind {self.kind!r}; choose one of {list(PLANNERS)}")
        if self.kind == "proteus":
            self.proteus_config()  # checks the options
        elif self.kind == "loki":
            self.loki_planner()
        else:
            self.hybridserve_options()  # the planner itself searches for seconds: built by the sidecar, once

    @property
    def policy(self) -> str:
        """The policy this planner routes for: every model's."""
        return PLANNERS[self.kind]

    def loki_planner(self):
        """The live Loki planner these options describe (it reads the pipeline's loki.json)."""
        from scheduler_sidecar.systems.loki.data import load_pipeline
        from scheduler_sidecar.systems.loki.live import LivePlanner
        from scheduler_sidecar.systems.loki.planner import LokiConfig

        known = {f.name for f in fields(LokiConfig) if f.name != "top_only"}
        unknown = sorted(set(self.options) - known - LOKI_LIVE_OPTIONS)
        if unknown:
            raise ValueError(f"planner: unknown options {unknown}; known: {sorted(known | LOKI_LIVE_OPTIONS)}")
        if "pipeline" not in self.options:
            raise ValueError("planner: loki needs 'pipeline', the path of a pipeline's loki.json")
        live = {k: v for k, v in self.options.items() if k in LOKI_LIVE_OPTIONS}
        try:
            pipeline = load_pipeline(str(live["pipeline"])).scaled(float(live.get("slowdown", 1.0)))
            return LivePlanner(pipeline, int(live.get("instances", 8)),
                               LokiConfig(**{k: v for k, v in self.options.items() if k in known}),
                               drop=live.get("drop", "rerouting"), budget=live.get("budget", "proportional"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"planner: {exc}") from None

    def hybridserve_options(self) -> tuple[Path, str, bool, HybridServeConfig]:
        """(the family's cascade.json, mode, prune, the planner's settings), checked."""
        known = {f.name for f in fields(HybridServeConfig)}
        unknown = sorted(set(self.options) - known - HYBRIDSERVE_LIVE_OPTIONS)
        if unknown:
            raise ValueError(f"planner: unknown options {unknown}; known: {sorted(known | HYBRIDSERVE_LIVE_OPTIONS)}")
        if "family" not in self.options:
            raise ValueError("planner: hybridserve needs 'family', the path of a family's cascade.json "
                             "(export/cascade_models.py builds it)")
        family = Path(str(self.options["family"]))
        if not family.is_file():
            raise ValueError(f"planner: hybridserve's family {str(family)!r} is not a file")
        mode, prune = self.options.get("mode", "ap"), self.options.get("prune", True)
        if mode not in MODES:
            raise ValueError(f"planner: hybridserve's mode must be one of {list(MODES)}, got {mode!r}")
        if not isinstance(prune, bool):
            raise ValueError(f"planner: hybridserve's prune must be true or false, got {prune!r}")
        try:
            config = HybridServeConfig(**{k: v for k, v in self.options.items() if k in known})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"planner: {exc}") from None
        return family, mode, prune, config

    def hybridserve_planner(self, bls: str, server: Callable[[int], str] = str) -> HybridServePlanner:
        """The HybridServe planner these options describe, deploying through the BLS model ``bls``; ``server``
        names each engine worker's Triton server. Runs Algorithms 1 and 2: seconds."""
        family, mode, prune, config = self.hybridserve_options()
        try:
            return HybridServePlanner.from_family(family, mode, bls, config, prune=prune, server=server)
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"planner: hybridserve: {exc}") from None

    def proteus_config(self):
        """The options as a ProteusConfig (imported here: it brings the MILP solver)."""
        from scheduler_sidecar.systems.proteus.planner import ProteusConfig

        known = {f.name for f in fields(ProteusConfig) if f.name != "capacity"}
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"planner: unknown options {unknown}; known: {sorted(known)}")
        try:
            return ProteusConfig(**self.options)
        except TypeError as exc:
            raise ValueError(f"planner: {exc}") from None


@dataclass(frozen=True)
class SidecarConfig:
    models: tuple[ModelSpec, ...]
    workers: tuple[str, ...]
    host: str = "127.0.0.1"
    http_port: int = 8100
    grpc_port: int = 8101
    health_interval_s: float = 0.5
    admin_token: str = ""  # empty: admin endpoints answer 403
    startup_wait_s: float = 30.0  # how long to wait for the configured workers to be ready
    max_request_bytes: int = Limits.max_request_bytes
    max_slo_us: int = Limits.max_slo_us
    max_rows: int = Limits.max_rows
    # slow clients: a body that trickles in, or headers that never end, must not hold a connection for ever
    read_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    worker_devices: dict[str, str] = field(default_factory=dict)  # worker url -> its device kind
    planner: PlannerSpec | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("the sidecar needs at least one model (a [[models]] entry or --profile)")
        if not self.workers:
            raise ValueError("the sidecar needs at least one Triton worker (workers = [...] or --triton)")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        for key in ("max_request_bytes", "max_slo_us", "max_rows", "read_timeout_s", "idle_timeout_s",
                    "health_interval_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0")
        stray = sorted(set(self.worker_devices) - set(self.workers))
        if stray:
            raise ValueError(f"worker_devices names workers that are not in workers: {stray}")
        if self.planner is not None:
            others = sorted({m.policy for m in self.models} - {self.planner.policy})
            if others:
                raise ValueError(f"planner {self.planner.kind!r} routes for its own policy "
                                 f"({self.planner.policy!r}); models use {others}")
            if self.planner.kind == "hybridserve" and len(self.models) != 1:
                raise ValueError(f"planner 'hybridserve' plans one cascade, the only model; there are "
                                 f"{len(self.models)}")
        for spec in self.models:
            if spec.default_slo_us > self.max_slo_us:
                raise ValueError(f"model {spec.name!r}: default_slo_us {spec.default_slo_us} is above max_slo_us "
                                 f"{self.max_slo_us}")

    @property
    def limits(self) -> Limits:
        return Limits(self.max_request_bytes, self.max_slo_us, self.max_rows)


def load(path: Path | None, **overrides: Any) -> SidecarConfig:
    """Read ``path`` (TOML) if given, then apply the non-None ``overrides`` (from flags)."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: {exc}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(SidecarConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path or 'config'}: unknown keys {unknown}; known: {sorted(known)}")
    model_keys = {f.name for f in fields(ModelSpec)}
    models = []
    for i, m in enumerate(raw.pop("models", [])):
        if not isinstance(m, dict) or not {"name", "profile"} <= set(m) or set(m) - model_keys:
            raise ValueError(f"{path or 'config'}: models[{i}] needs 'name' and 'profile' and only keys of "
                             f"{sorted(model_keys)}")
        models.append(ModelSpec(**{**m, "profile": Path(m["profile"])}))
    planner = raw.pop("planner", None)
    if planner is not None:
        if not isinstance(planner, dict) or "kind" not in planner:
            raise ValueError(f"{path or 'config'}: [planner] needs a 'kind'")
        planner = PlannerSpec(planner.pop("kind"), planner)
    return SidecarConfig(models=tuple(models), planner=planner,
                         **{**raw, "workers": tuple(raw.get("workers", ()))})
