"""The sidecar behind both front ends: its logical models, its workers and what it says about them.

The front ends (``grpc_frontend``, ``http_frontend``) only translate the protocol; what a
logical model is (its tensors are the Triton model's, less the control tensor), its
metadata and config, readiness, the admin actions and metrics all live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from importlib import metadata as importlib_metadata

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from scheduler_sidecar.core.engine import TypeLimits
from scheduler_sidecar.core.plan import Planner, Scope
from scheduler_sidecar.core.policy import Policy
from scheduler_sidecar.core.profile import Profile
from scheduler_sidecar.errors import (
    ConfigError,
    InvalidRequest,
    PermissionDenied,
    RequestError,
    UnknownModel,
    WorkerError,
)
from scheduler_sidecar.live.driver import CONTROL_INPUT, Answer, LiveDriver, LiveModel, ModelOptions, Request
from scheduler_sidecar.live.membership import Membership
from scheduler_sidecar.live.pool import WorkerPool
from scheduler_sidecar.live.tensors import TensorSpec
from scheduler_sidecar.live.workers import Health, Worker
from scheduler_sidecar.server.config import ModelSpec, SidecarConfig
from scheduler_sidecar.server.discovery import Discovery, Resolver, dns_resolver
from scheduler_sidecar.server.loop_lag import LoopLag
from scheduler_sidecar.server.memory import trim_freed_memory
from scheduler_sidecar.server.metrics import Metrics, ModelMetrics
from scheduler_sidecar.server.protocol import InferRequest, ModelInfo, quote
from scheduler_sidecar.systems import (
    PlannerContext,
    make_policy,
    option_names,
    policy_class,
    routes_for_planner,
)
from scheduler_sidecar.systems.hybridserve.stages import StagedCascade

log = logging.getLogger(__name__)

SERVER_NAME = "accscale"
EXTENSIONS = ("binary_tensor_data", "parameters", "model_configuration")
PLATFORM = "accscale_sidecar"
MODEL_VERSION = "1"
WARM_UP_SLO_US = 1_000_000


class Sidecar:
    def __init__(self, config: SidecarConfig, connect: Callable[[str], Worker] | None = None) -> None:
        """``connect``: how a worker's URL becomes a :class:`Worker` (the native edge's sends batches from C++)."""
        self.config = config
        self.metrics = Metrics()
        self.profiles = {m.name: Profile.load(m.profile) for m in config.models}
        self.triton_models = tuple(sorted(self._triton_models(m.name for m in config.models)))
        # the unplanned models are on every worker, always; a planned worker holds only what its plan places there,
        # so its health is the server's alone
        self.unplanned = self._triton_models(m.name for m in config.unplanned)
        # which Tritons and slots there are, their health and owners: shared by the health checks and the driver
        self.membership = Membership()
        self.pool = WorkerPool(self.unplanned, interval_s=config.health_interval_s, membership=self.membership,
                               **({"connect": connect} if connect else {}))
        self.planners: list[Planner] = []  # one per config.planners entry, once built
        self.models: dict[str, LiveModel] = {}
        self.infos: dict[str, ModelInfo] = {}  # what the front ends see of each model
        self.driver: LiveDriver | None = None
        self.limits = config.limits
        self._trimmer: asyncio.Task | None = None
        self.loop_lag = LoopLag()  # what a request waited before its handler ran: counted against its deadline
        self._lag_probe: asyncio.Task | None = None
        self._admin = asyncio.Lock()  # one policy switch at a time: a RAMSIS one may generate MDPs for seconds
        self.discovery: Discovery | None = None
        self._discoverer: asyncio.Task | None = None

    async def start(self, resolve: Resolver | None = None) -> None:
        """Connect to every configured worker (they must be ready), or to those discovery finds (``resolve``: how,
        by default the DNS name of ``[discovery]``), then build the logical models."""
        for url in self.config.workers:
            await self.pool.add(url, wait_s=self.config.startup_wait_s, device=self.config.device_of(url))
        if not self.config.workers:
            await self._discover_first(resolve)
        for url in self.pool.urls:
            kind = self.config.device_of(url)
            for name in self._served_on(url) if kind is not None else ():
                profile = self.profiles[name]
                if kind not in profile.device_kinds:
                    raise ConfigError(f"worker {url} is of device kind {kind!r}, which model {name!r}'s profile has "
                                      f"no latency for (it has {list(profile.device_kinds)})")
        for member in list(self.membership.members.values()):
            member.loaded = await self._loaded(member.worker)
        pairs = []
        for spec in self.config.models:
            profile = self.profiles[spec.name]
            inputs, outputs = await self._tensors(profile)
            stats = ModelMetrics(self.metrics, spec.name)
            model = LiveModel(_options(spec), profile, inputs, outputs, stats)
            pairs.append((model, model_policy(spec, profile)))
            stats.policy(None, spec.policy)
        self.driver = LiveDriver(pairs, on_worker_lost=self.pool.mark_down, membership=self.membership)
        self.models = dict(self.driver.models)
        self._stage_cascades()
        self.infos = {m.name: ModelInfo(m.name, m.inputs, m.outputs, m.options.default_slo_us)
                      for m in self.models.values()}
        for worker in self.pool.workers:
            await self._add_slots(worker)
        if self.config.planners:
            await self._first_plans()
        await self._warm_up()
        self.pool.on_change(self._worker_changed)
        self.pool.start()
        if self.discovery is not None:
            self._discoverer = asyncio.get_running_loop().create_task(self.discovery.run())
        self._trimmer = asyncio.get_running_loop().create_task(trim_freed_memory())
        self._lag_probe = asyncio.get_running_loop().create_task(self.loop_lag.run())
        self.metrics.loop_lag.set_function(lambda: self.loop_lag.us / 1e6)
        log.info("serving %s over %d worker(s)", sorted(self.models), len(self.pool.workers))

    def _stage_cascades(self) -> None:
        """Each staged cascade (a model's ``cascade`` plan): its models' follow-up hooks, which escalate an answer
        to the next model's logical model."""
        served: dict[str, str] = {}  # Triton model -> the first logical model that runs it alone
        for spec in self.config.models:
            for v in self.profiles[spec.name].variants:
                if v.actuation.kind == "model":
                    served.setdefault(v.actuation.model, spec.name)
        for spec in self.config.models:
            if spec.cascade is None:
                continue
            cascade = StagedCascade.load(spec.cascade, served)
            if cascade.served[cascade.models[0]] != spec.name:
                raise ConfigError(f"model {spec.name!r}: its cascade starts at {cascade.models[0]!r}, which "
                                  f"{cascade.served[cascade.models[0]]!r} serves, not {spec.name!r}")
            cascade.check_tensors({name: (self.models[name].inputs, self.models[name].outputs)
                                   for name in cascade.served.values()})
            for name, hook in cascade.follow_ups().items():
                self.models[name].follow_up = hook
            log.info("model %s: a staged cascade over %s", spec.name, " -> ".join(cascade.served.values()))

    async def _warm_up(self) -> None:
        """Serve a few requests of zeros through every logical model before the ports open, so ready means ready.

        Right after start, a burst with a 30 ms SLO lost a third of its requests to DEADLINE_EXCEEDED
        and the same burst a moment later none (issue 14): first requests pay for what no profile
        shows (the policy building its option tables, the first RPCs on a channel, Triton's first
        executions). One request per worker slot, at once, each with an SLO of the model's default or
        WARM_UP_SLO_US if longer (not the longest allowed: a non-work-conserving policy such as Proteus'
        holds a lone query until its deadline nears); one that fails (a queue limit below the slot count,
        a deadline missed cold) is logged, and the sidecar starts all the same.
        """
        assert self.driver is not None
        slots = len(self.driver.slots)
        # /metrics counts clients only: every model's, as a warm-up request may end at another (a cascade's next)
        stats = {name: model.stats for name, model in self.models.items()}
        for model in self.models.values():
            model.stats = ModelMetrics(Metrics(), model.name)
        self.driver.engine.counting_demand = False  # nor the planners: no client sent them
        try:
            for model in self.models.values():
                rows = {t.name: bytes(t.row_bytes) for t in model.inputs.values()}
                slo_us = min(self.limits.max_slo_us, max(model.options.default_slo_us, WARM_UP_SLO_US))
                answers = await asyncio.gather(*(model.infer(rows, slo_us) for _ in range(slots)),
                                               return_exceptions=True)
                for error in {f"{type(a).__name__}: {a}" for a in answers if isinstance(a, Exception)}:
                    log.warning("model %s: a warm-up request failed: %s", model.name, error)
        finally:
            self.driver.engine.counting_demand = True
            for name, model in self.models.items():
                model.stats = stats[name]
        log.info("warmed up %s with %d request(s) each", sorted(self.models), slots)

    async def _discover_first(self, resolve: Resolver | None) -> None:
        """Add the workers discovery finds ready at start; at least one must be within ``startup_wait_s`` (the
        others are admitted by the rounds that follow, once ready)."""
        spec = self.config.discovery
        assert spec is not None  # a config has workers or discovery
        self.discovery = Discovery(resolve or dns_resolver(spec.service, spec.port),
                                   lambda: frozenset(w.url for w in self.pool.workers), self.add_worker,
                                   self.remove_worker, interval_s=spec.interval_s)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.config.startup_wait_s
        while True:
            for url in sorted((await self.discovery.lookup() or frozenset()) - set(self.pool.healthy)):
                with contextlib.suppress(ValueError):  # not ready (yet)
                    await self.pool.add(url, device=self.config.device_of(url))
            if self.pool.workers:
                return
            if loop.time() >= give_up:
                raise ConfigError(f"discovery: no Triton that {spec.service!r} resolves to was ready within "
                                  f"{self.config.startup_wait_s:g} s (found: {sorted(self.discovery.found or ())})")
            await asyncio.sleep(min(spec.interval_s, 1.0))

    async def close(self) -> None:
        for task in (self._trimmer, self._lag_probe, self._discoverer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.driver is not None:
            await self.driver.close()
        await self.pool.close()

    def _triton_models(self, names: Iterable[str]) -> frozenset[str]:
        """The Triton models the variants of these logical models run on."""
        return frozenset(v.actuation.model for name in names for v in self.profiles[name].variants)

    def _served_on(self, url: str) -> list[str]:
        """The logical models served on slots of the worker at ``url``."""
        return [m.name for m in self.config.models if (spec := self.config.planner_of(m.name)) is None
                or spec.owns(url)]

    async def _add_slots(self, worker: Worker) -> int:
        """The worker's slots: a group for the unplanned models, sharing the fewest instances of any of their
        Triton models, and a group per planner that has it, holding that planner's models."""
        assert self.driver is not None
        device = self.config.device_of(worker.url)
        member = self.membership.find(worker.url)
        assert member is not None and member.worker is worker  # the pool added it
        if member.loaded is None:
            member.loaded = await self._loaded(worker)
        added = 0
        if self.unplanned and self.config.slots == "per_model":  # each Triton model's instances its own slots
            for name in sorted(self.unplanned & member.loaded):
                slots = await _slots(worker, (name,))
                added += len(self.driver.add_worker(worker, slots, device=device, resident=frozenset({name})))
        elif self.unplanned:
            slots = await _slots(worker, tuple(sorted(self.unplanned)))
            # alone, the unplanned models hold every model; beside planners, only theirs
            resident = self.unplanned if self.config.planners else None
            added += len(self.driver.add_worker(worker, slots, device=device, resident=resident))
        for k, spec in enumerate(self.config.planners):
            if not spec.owns(worker.url):
                continue
            # a planned worker holds the planner's models that the plan put there
            resident = member.loaded & self._triton_models(self.config.planned_models(spec))
            # Proteus' worker is one device, one batch at a time; Loki's and HybridServe's is a Triton whose BLS
            # model (the pipeline, the cascade) holds a batch through every hop, one per instance at once, each
            # calling the stage models, whose instances the plan scales: its instances are the slots
            bls = spec.entry.bls_slots and resident
            slots = await _slots(worker, tuple(sorted(resident))) if bls else 1
            ids = self.driver.add_worker(worker, slots, device=device, resident=resident, owner=k)
            self._rescope(k)  # a worker added while serving: the planner owns its new slots too
            added += len(ids)
        self.metrics.worker_healthy.labels(worker.url).set(1)
        return added

    def _rescope(self, k: int) -> None:
        """Planner ``k``, once built, plans the slots it owns now (through the engine, which keeps planners apart)."""
        if k < len(self.planners):
            assert self.driver is not None
            self.driver.set_scope(self.planners[k], self.membership.owned(k))

    async def _loaded(self, worker: Worker) -> frozenset[str]:
        """The Triton models of our profiles that ``worker`` has ready."""
        states = await asyncio.gather(*(worker.ready([m], self.config.health_interval_s) for m in self.triton_models))
        return frozenset(m for m, state in zip(self.triton_models, states) if state is Health.READY)

    async def _tensors(self, profile: Profile) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """The tensors of a logical model, from the first worker that has one of its variants loaded."""
        for member in self.membership.members.values():
            for v in profile.variants:
                if member.loaded and v.actuation.model in member.loaded:
                    return await _tensors(member.worker, v.actuation.model)
        raise ConfigError(f"no worker has a variant of profile {profile.name!r} loaded; start Triton with them")

    async def _first_plans(self) -> None:
        """Build each planner over its models and the slots it owns, make the first plans and wait until their
        placements are carried out."""
        assert self.driver is not None
        engine, membership = self.driver.engine, self.membership
        slo_ms = {m.name: m.default_slo_us / 1000 for m in self.config.models}
        for k, spec in enumerate(self.config.planners):
            owned = membership.owned(k)
            models = self.config.planned_models(spec)
            context = PlannerContext({name: self.profiles[name] for name in models},
                                     {name: slo_ms[name] for name in models},
                                     [(w.id, w.device) for w in engine.workers if w.id in owned],
                                     lambda sid: membership.worker(sid).url)
            # a planner may search for seconds (HybridServe's Algorithms 1 and 2): off the event loop
            planner = await asyncio.get_running_loop().run_in_executor(None, spec.entry.build, spec.settings, context)
            planner.scope = Scope(frozenset(models), frozenset(owned))
            self.planners.append(planner)
            self.driver.use_planner(planner)
        deadline = asyncio.get_running_loop().time() + self.config.startup_wait_s
        while engine.placing and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        log.info("first plan placed: %s", {w.id: sorted(w.resident or ()) for w in engine.workers})

    def _worker_changed(self, worker: Worker, healthy: bool) -> None:
        self.metrics.worker_healthy.labels(worker.url).set(1 if healthy else 0)
        if not healthy:
            self.metrics.worker_failures.labels(worker.url).inc()
        assert self.driver is not None
        self.driver.worker_health(worker, healthy)

    # ---------------------------------------------------------------- lookups
    def model(self, name: str, version: str = "") -> ModelInfo:
        """A logical model the front ends may call; NOT_FOUND otherwise."""
        info = self.infos.get(name)
        if info is None:
            raise UnknownModel(f"Request for unknown model: {quote(name)} is not found")
        if version not in ("", MODEL_VERSION):
            raise UnknownModel(f"Request for unknown model: {quote(name)} version {quote(version)} is not found")
        return info

    async def infer(self, request: InferRequest, model: ModelInfo, budget_us: int | None = None,
                    waited_us: int | None = None) -> Answer:
        """Serve a checked request of a known model (see :meth:`model`), all its rows; raises a RequestError if it
        fails. ``waited_us``: how long it waited before its handler ran, where the front end measured it (the
        native edge); the event loop's lag otherwise."""
        answers = await self.models[model.name].infer_rows(request.rows(model), request.slo_us, budget_us,
                                                           self.loop_lag.us if waited_us is None else waited_us)
        return Answer.join(answers)

    def submit(self, request: InferRequest, model: ModelInfo, budget_us: int | None, waited_us: int,
               done: Callable[[Answer | None, RequestError | None], None]) -> Request:
        """:meth:`infer` without a coroutine: ``done`` gets the answer or the error (see ``LiveDriver.submit``); the
        returned request is what :meth:`withdraw` takes if the client leaves."""
        live = self.models[model.name]
        assert live.driver is not None
        return live.driver.submit(live, request.rows(model), request.slo_us, budget_us, waited_us,
                                  lambda answers, error: done(None if answers is None else Answer.join(answers),
                                                              error))

    def withdraw(self, request: Request) -> None:
        """The client of a submitted request left."""
        self.models[request.model].driver.withdraw(request)

    def ready(self) -> bool:
        return all(self.model_ready(name) for name in self.models)

    def model_ready(self, name: str) -> bool:
        model = self.models.get(name)
        return model is not None and self.driver is not None and self.driver.healthy_slots(name) > 0

    def server_metadata(self) -> pb.ServerMetadataResponse:
        try:
            version = importlib_metadata.version("accscale")
        except importlib_metadata.PackageNotFoundError:
            version = "0"
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=version, extensions=EXTENSIONS)

    def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        model = self.model(name, version)

        def tensors(specs: dict[str, TensorSpec]) -> list:
            return [pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=[-1, *t.dims])
                    for t in specs.values()]

        return pb.ModelMetadataResponse(name=name, versions=[MODEL_VERSION], platform=PLATFORM,
                                        inputs=tensors(model.inputs), outputs=tensors(model.outputs))

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        """A batching model's config: a request carries up to ``max_rows`` rows (perf_analyzer sends one by
        default)."""
        model = self.model(name, version)
        live = self.models[name]
        return mc.ModelConfig(
            name=name, platform=PLATFORM, max_batch_size=self.limits.max_rows,
            input=[mc.ModelInput(name=t.name, data_type=mc.DataType.Value(f"TYPE_{t.datatype}"), dims=list(t.dims))
                   for t in model.inputs.values()],
            output=[mc.ModelOutput(name=t.name, data_type=mc.DataType.Value(f"TYPE_{t.datatype}"), dims=list(t.dims))
                    for t in model.outputs.values()],
            parameters={"policy": mc.ModelParameter(string_value=live.policy.name),
                        "profile": mc.ModelParameter(string_value=live.profile.name)},
        )

    # ---------------------------------------------------------------- admin
    def check_admin(self, token: str | None) -> None:
        if not self.config.admin_token:
            raise PermissionDenied("admin endpoints are off (start with --admin-token)")
        if token != self.config.admin_token:
            raise PermissionDenied("wrong or missing admin token")

    async def set_policy(self, name: str, policy: str, options: object = None) -> dict[str, str]:
        """Switch a model's policy without a restart; its queue is kept.

        The new policy is checked as the config file's would be, and built off the event loop (building
        can take seconds: RAMSIS generates its MDP policies), so requests keep flowing meanwhile.
        """
        self.model(name)
        model = self.models[name]
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise InvalidRequest(f"'options' must be an object, got {quote(options)}")
        try:  # an unknown policy is refused here, as the config file's would be
            spec = replace(next(s for s in self.config.models if s.name == name), policy=policy,
                           policy_options=options)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        planner = self.config.planner_of(name)
        if planner is not None and policy != planner.policy:
            raise InvalidRequest(f"the {planner.kind} planner routes for its own policy; "
                                 f"{quote(policy)} cannot serve a planned model")
        if planner is None and routes_for_planner(policy):
            raise InvalidRequest(f"{quote(policy)} routes for a planner, and none plans {quote(name)}")
        files = sorted(set(options) & policy_class(policy).file_options)
        if files:
            raise InvalidRequest(f"options {files} name files on the sidecar's machine; set them in its config file")
        async with self._admin:
            try:
                new = await asyncio.get_running_loop().run_in_executor(None, model_policy, spec, model.profile)
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise InvalidRequest(f"policy {quote(policy)}: {exc}") from None
            assert self.driver is not None
            old = self.driver.set_policy(name, new).name
        model.stats.policy(old, policy)
        log.info("model %s: policy %s -> %s", name, old, policy)
        return {"model": name, "old": old, "policy": policy}

    async def add_worker(self, url: str) -> dict[str, object]:
        try:
            worker = await self.pool.add(url, wait_s=self.config.health_interval_s, device=self.config.device_of(url))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        try:
            return {"worker": url, "slots": await self._add_slots(worker)}
        except (ValueError, WorkerError) as exc:  # removed meanwhile, or it cannot be served: not added
            member = self.membership.find(url)
            if member is not None and member.worker is worker:  # half added: taken out again
                await self.remove_worker(url)
            raise InvalidRequest(f"worker {url} not added: {exc}") from None

    async def remove_worker(self, url: str) -> dict[str, object]:
        """Drain the worker at ``url`` and forget it: no new batch goes there, the batches it runs finish (or are
        retried elsewhere if it dies first), then its connection closes."""
        assert self.driver is not None
        try:
            worker = self.pool.remove(url)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        ids = self.driver.remove_worker(worker)
        for k in range(len(self.planners)):
            self._rescope(k)
        await self.driver.drained(ids)
        await worker.close()
        self.metrics.worker_healthy.remove(url)
        log.info("worker %s drained and removed (%d slot(s))", url, len(ids))
        return {"worker": url, "slots": len(ids)}

    def workers(self) -> list[dict[str, object]]:
        return [{"url": w.url, "healthy": self.pool.healthy[w.url]} for w in self.pool.workers]


def _options(spec: ModelSpec) -> ModelOptions:
    return ModelOptions(spec.name, spec.default_slo_us, TypeLimits(spec.queue_limit, spec.max_attempts, spec.admission),
                        spec.latency_calibration)


def model_policy(spec: ModelSpec, profile: Profile) -> Policy:
    """The policy a logical model is served by (a simulation of the sidecar builds the same)."""
    # a planned policy's routes name the logical model it serves
    routed = {"query_type": spec.name} if "query_type" in option_names(policy_class(spec.policy)) else {}
    return make_policy(spec.policy, profile, **{"overhead_us": spec.overhead_us, **routed, **spec.policy_options})


async def _tensors(worker: Worker, triton_model: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """A logical model's tensors: those of its Triton model without the batch dimension and the control input."""
    described = await worker.describe(triton_model)
    if described.max_batch_size < 1:
        raise ConfigError(f"Triton model {triton_model!r} has max_batch_size {described.max_batch_size}; "
                          "the sidecar batches requests and needs a batching model")
    return tuple(t for t in described.inputs if t.name != CONTROL_INPUT), described.outputs


async def _slots(worker: Worker, models: tuple[str, ...]) -> int:
    """Worker slots of a worker, shared by every logical model: the fewest instances of any Triton model used.

    A slot runs one batch at a time whichever logical model it serves, so two logical models never
    run two batches on one instance at once.
    """
    return min([(await worker.describe(name)).instances for name in models])
