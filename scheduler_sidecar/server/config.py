"""The sidecar's configuration: a TOML file, with flags for the common cases.

Example (``examples/sidecar.toml``; every key but ``models[].name``/``profile`` and one ``workers`` entry is
optional)::

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

    [[models]]
    name = "digits"            # the logical model clients address
    profile = "build/full/profile.json"
    policy = "slackfit"
    default_slo_us = 50000     # when a request has no slo_us parameter
    queue_limit = 1024         # queued requests beyond this are refused (UNAVAILABLE)
    max_attempts = 3           # tries per request when workers fail
    overhead_us = 300          # time per request the profile and the sidecar do not see (client, network, front
                               # end); policies subtract it from slack. A report's "unseen p90 ms" measures it
    latency_calibration = true # re-plan when batches run slower or faster than profiled
    admission = true           # refuse (RESOURCE_EXHAUSTED) a request the queue ahead makes infeasible
    [models.policy_options]
    num_buckets = 32

A cascade served staged (HybridServe as its paper serves it, ``systems/hybridserve/stages.py``): each of its models a
logical model on its own Triton model's instances, the first one's ``cascade`` naming the plan::

    slots = "per_model"       # default "shared": the unplanned models share the fewest instances of any of them
    [[models]]
    name = "digits-cascade"   # what clients call: the cascade's first model
    profile = "profile_cascade_xs.json"
    policy = "clipper"
    cascade = "cascade_plan.json"  # models, thresholds, temperatures, skip, exec_ms (the BLS model's format)
    [[models]]
    name = "cascade_m"        # the next model: an escalation is a query of this logical model
    profile = "profile_cascade_m.json"
    policy = "clipper"

Workers of several device kinds say which (a kind their profiles have; default: the profile's first)::

    [worker_devices]
    "127.0.0.1:8001" = "cpu"

A periodic planner (Proteus, Loki, HybridServe) places variants on workers; the models it plans use the policy it
routes for (proteus, loki, cascade)::

    [planner]
    kind = "proteus"          # its other keys are ProteusConfig's (period_s, burst_factor, headroom, ...);
    period_s = 30.0           # "loki" and "hybridserve" take their systems' keys (systems/<name>/__init__.py)

One deployment may serve several systems at once: a ``[[planners]]`` entry per planner, each owning the worker
slots it is given on its Tritons, beside models served by unplanned policies (SlackFit, RAMSIS, ...) on slots of
their own on every Triton (``examples/all.toml``)::

    [[planners]]
    kind = "proteus"
    models = ["digits"]       # the models it plans (default: every model of its policy)
    workers = ["127.0.0.1:8001"]  # the Tritons it has slots on (default: every one)

``examples/`` has a config for each planner, and one with all five systems.

On Kubernetes the Tritons come and go: ``[discovery]`` names a headless Service whose records are the ready Triton
pods, followed every ``interval_s`` (``deploy/helm``). ``workers`` may then be empty; the first workers are the
ones the name has when the sidecar starts::

    [discovery]
    service = "accscale-triton.default.svc.cluster.local"
    port = 8001               # the pods' gRPC port
    interval_s = 5.0
    device = "gpu-t4"         # the pods' device kind, one of the profiles' (default: the profile's first)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from scheduler_sidecar import systems
from scheduler_sidecar.core.engine import TypeLimits
from scheduler_sidecar.errors import ConfigError
from scheduler_sidecar.server.protocol import Limits
from scheduler_sidecar.systems import PlannerEntry

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
    queue_limit: int = TypeLimits.queue_limit  # the defaults are the engine's TypeLimits
    max_attempts: int = TypeLimits.max_attempts
    overhead_us: int = 300
    # re-plan with the profile's latencies scaled by how much slower (or faster) batches really run;
    # off for policies that are expensive to build (ramsis generates MDPs) or must follow the profile exactly
    latency_calibration: bool = True
    # shed at the door what the queue ahead already makes late (core.engine's admission); off: queue it anyway
    admission: bool = TypeLimits.admission
    # HybridServe staged: this model is a cascade's first, and its answers escalate to the models that follow by the
    # plan in this file (systems/hybridserve/stages.py); each of those is a logical model of this config
    cascade: Path | None = None

    def __post_init__(self) -> None:
        try:
            systems.policy_class(self.policy)
        except ConfigError as exc:
            raise ConfigError(f"model {self.name!r}: {exc}") from None
        for key in ("default_slo_us", "queue_limit", "max_attempts"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model {self.name!r}: {key} must be >= 1")
        if self.overhead_us < 0:
            raise ConfigError(f"model {self.name!r}: overhead_us must be >= 0")
        if self.cascade is not None and not isinstance(self.cascade, Path):
            raise ConfigError(f"model {self.name!r}: cascade must be the path of a plan file, got {self.cascade!r}")


@dataclass(frozen=True)
class PlannerSpec:
    """A periodic planner with its options: ``kind`` names a system's planner (``proteus``, ``loki``,
    ``hybridserve``; see each system package's ``SYSTEM.planner`` for its keys), checked when the config is
    read and built by the sidecar once its workers are known."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    models: tuple[str, ...] = ()  # the logical models it plans; empty: every model of its policy
    workers: tuple[str, ...] = ()  # the Tritons it owns slots on; empty: every one

    def __post_init__(self) -> None:
        self.settings  # noqa: B018  checks the options

    @cached_property
    def entry(self) -> PlannerEntry:
        return systems.planner(self.kind)

    @cached_property
    def settings(self) -> Any:
        return self.entry.settings(self.options)

    @property
    def policy(self) -> str:
        """The policy this planner routes for: every model's."""
        return self.entry.policy

    def owns(self, url: str) -> bool:
        """Whether it has slots on the Triton at ``url``: one it names, or any when it names none (a worker added
        while serving, by the admin API or by discovery, included)."""
        return not self.workers or url in self.workers


@dataclass(frozen=True)
class DiscoverySpec:
    """Workers found by name: every address ``service`` resolves to, at ``port``, checked every ``interval_s``;
    each of device kind ``device`` (default: the profile's first)."""

    service: str
    port: int = 8001
    interval_s: float = 5.0
    device: str | None = None

    def __post_init__(self) -> None:
        if not self.service or not 0 < self.port < 65536 or not self.interval_s > 0:
            raise ConfigError("discovery needs a service name, a port in 1-65535 and interval_s > 0")


SLOTS = ("shared", "per_model")


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
    planners: tuple[PlannerSpec, ...] = ()
    discovery: DiscoverySpec | None = None
    # the unplanned models' worker slots on a Triton: "shared", as many as the fewest instances of any of their
    # Triton models, each running any of them (one batch at a time per slot); or "per_model", each Triton model's
    # instances slots of its own (a cascade's models, which Triton runs side by side)
    slots: str = "shared"

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError("the sidecar needs at least one model (a [[models]] entry or --profile)")
        if not self.workers and self.discovery is None:
            raise ConfigError("the sidecar needs at least one Triton worker (workers = [...], --triton or "
                              "[discovery])")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ConfigError(f"model names must be unique: {names}")
        for key in ("max_request_bytes", "max_slo_us", "max_rows", "read_timeout_s", "idle_timeout_s",
                    "health_interval_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key} must be > 0")
        stray = sorted(set(self.worker_devices) - set(self.workers))
        if stray:
            raise ConfigError(f"worker_devices names workers that are not in workers: {stray}")
        if self.slots not in SLOTS:
            raise ConfigError(f"slots must be one of {list(SLOTS)}, got {self.slots!r}")
        self._check_planners()
        for spec in self.models:
            if spec.default_slo_us > self.max_slo_us:
                raise ConfigError(f"model {spec.name!r}: default_slo_us {spec.default_slo_us} is above max_slo_us "
                                 f"{self.max_slo_us}")

    def _check_planners(self) -> None:
        """Every model of a planned policy is planned by one planner of its kind, on workers of this config."""
        planned = {spec.policy for spec in self.planners}
        by_name = {m.name: m for m in self.models}
        owner: dict[str, str] = {}
        for spec in self.planners:
            for name in spec.models:
                model = by_name.get(name)
                if model is None or model.policy != spec.policy:
                    raise ConfigError(f"planner {spec.kind!r} plans models of policy {spec.policy!r}; {name!r} is "
                                      + ("not a model" if model is None else f"served by {model.policy!r}"))
            stray = sorted(set(spec.workers) - set(self.workers))
            if stray:
                raise ConfigError(f"planner {spec.kind!r} names workers that are not in workers: {stray}")
            if spec.workers and self.discovery is not None:
                raise ConfigError(f"planner {spec.kind!r} names its workers, and [discovery] finds them: a planner "
                                  "beside discovery owns every worker found (one planner per shard, see README)")
            if not self.planned_models(spec):
                raise ConfigError(f"planner {spec.kind!r} plans no model: none is served by its policy "
                                  f"{spec.policy!r}")
            for name in self.planned_models(spec):
                if name in owner:
                    raise ConfigError(f"model {name!r} is planned by two planners: give each its models")
                owner[name] = spec.kind
            if spec.entry.one_model and len(self.planned_models(spec)) != 1:
                raise ConfigError(f"planner {spec.kind!r} plans one model; it has {list(self.planned_models(spec))}")
        for m in self.models:
            if m.name not in owner and systems.routes_for_planner(m.policy):
                raise ConfigError(f"model {m.name!r}: policy {m.policy!r} routes for a planner; add one "
                                  f"([planner] or [[planners]])" + (" that plans it (models = [...])"
                                                                    if m.policy in planned else ""))

    def device_of(self, url: str) -> str | None:
        """The device kind of the worker at ``url``: ``worker_devices``' or discovery's; None: the profile's first."""
        return self.worker_devices.get(url) or (self.discovery.device if self.discovery is not None else None)

    def planner_of(self, model: str) -> PlannerSpec | None:
        """The planner that plans ``model``; None: it is unplanned."""
        return next((spec for spec in self.planners if model in self.planned_models(spec)), None)

    def planned_models(self, spec: PlannerSpec) -> tuple[str, ...]:
        """The logical models ``spec`` plans."""
        return spec.models or tuple(m.name for m in self.models if m.policy == spec.policy)

    @property
    def unplanned(self) -> tuple[ModelSpec, ...]:
        """The models no planner plans: served on slots of their own on every worker."""
        return tuple(m for m in self.models if self.planner_of(m.name) is None)

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
            raise ConfigError(f"{path}: {exc}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(SidecarConfig)} | {"planner"}  # [planner]: one planner, [[planners]]' shorthand
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path or 'config'}: unknown keys {unknown}; known: {sorted(known)}")
    model_keys = {f.name for f in fields(ModelSpec)}
    models = []
    for i, m in enumerate(raw.pop("models", [])):
        if not isinstance(m, dict) or not {"name", "profile"} <= set(m) or set(m) - model_keys:
            raise ConfigError(f"{path or 'config'}: models[{i}] needs 'name' and 'profile' and only keys of "
                             f"{sorted(model_keys)}")
        paths = {k: Path(m[k]) for k in ("profile", "cascade") if isinstance(m.get(k), str)}
        models.append(ModelSpec(**{**m, **paths}))
    if "planner" in raw and "planners" in raw:
        raise ConfigError(f"{path or 'config'}: [planner] or [[planners]], not both")
    entries = raw.pop("planners", None) or ([raw.pop("planner")] if "planner" in raw else [])
    discovery = raw.pop("discovery", None)
    if discovery is not None:
        keys = {f.name for f in fields(DiscoverySpec)}
        if not isinstance(discovery, dict) or "service" not in discovery or set(discovery) - keys:
            raise ConfigError(f"{path or 'config'}: [discovery] needs 'service' and only keys of {sorted(keys)}")
        discovery = DiscoverySpec(**discovery)
    planners = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "kind" not in entry:
            raise ConfigError(f"{path or 'config'}: planners[{i}] needs a 'kind'")
        entry = dict(entry)
        listed = {key: entry.pop(key, []) for key in ("models", "workers")}
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in listed.values()):
            raise ConfigError(f"{path or 'config'}: planners[{i}]: models and workers are lists of names")
        planners.append(PlannerSpec(entry.pop("kind"), entry, tuple(listed["models"]), tuple(listed["workers"])))
    return SidecarConfig(models=tuple(models), planners=tuple(planners), discovery=discovery,
                         **{**raw, "workers": tuple(raw.get("workers", ()))})
